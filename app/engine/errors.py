"""Typed errors raised by the engine.

Every error a user can cause (a wrong path, a drafter for another target, corrupt weights)
is an :class:`EngineError` subclass with a message that can be shown as is. The CLI maps
them to exit code 2; the window shows them in a message and keeps running.
"""


class EngineError(Exception):
    """Base class for every error the engine raises on purpose."""


class ModelNotFoundError(EngineError):
    """A model path does not exist, or a Hugging Face repo id is not in the local cache
    while offline. The message names the path or repo."""


class ModelLoadError(EngineError):
    """Model files exist but cannot be used: missing ``config.json``/weights, corrupt
    safetensors, a tensor of the wrong shape, or a config field that cannot be read."""


class IntegerWeightsError(ModelLoadError):
    """A checkpoint's weights are integer typed where the model computes in floating point
    (an ``int32`` copy of a float model, say): loaded as they are, the model would write
    nothing but end tokens. The packed weights (and ``mxfp4``/``nvfp4`` scales) of a
    quantized layer are integer by design and are not refused. ``folder`` is the model
    folder, ``dtype`` the first such tensor's dtype name (``"int32"``), ``tensor`` its name
    and ``count`` how many tensors are integer typed."""

    def __init__(self, folder, dtype: str, tensor: str, count: int):
        self.folder, self.dtype, self.tensor, self.count = folder, dtype, tensor, count
        super().__init__(
            f"the model folder {folder} holds {dtype} weights ({tensor}"
            + (f" and {count - 1} more" if count > 1 else "")
            + "), not floating point ones, in layers that are not quantized: the model "
            "would write nothing but end tokens. Convert the checkpoint again with float "
            "weights (float16, bfloat16 or float32) or download it again")


class DrafterAsTargetError(ModelLoadError):
    """A drafter's folder was given where the target model belongs. ``folder`` is that
    folder; the message says what to do on the command line (the window says it in its own
    words, ``app.ui.worker.load_error_text``)."""

    def __init__(self, folder, message: str):
        self.folder = folder
        super().__init__(message)


class UnsupportedArchitectureError(EngineError):
    """The checkpoint's architecture is not one this engine can run for the requested
    purpose (e.g. ``DFlash2DraftModel`` as a drafter, or DFlash on a target family
    without tap capture). The message names the architecture."""


class PairMismatchError(EngineError):
    """The drafter was made for another target. ``field`` names the first field that
    differs (``vocab_size``, ``hidden_size``, ``num_target_layers``, ``target_layer_ids``);
    ``target_value`` and ``drafter_value`` hold the two values."""

    def __init__(self, field: str, target_value, drafter_value, message: str | None = None):
        self.field = field
        self.target_value = target_value
        self.drafter_value = drafter_value
        super().__init__(
            message
            or f"drafter does not fit the target: {field} is {drafter_value!r} for the drafter "
            f"but {target_value!r} for the target"
        )


class GenerationError(EngineError):
    """Generation failed for a reason other than bad model files (e.g. an invalid
    setting such as a block size outside 1..drafter block size)."""


class PromptTooLongError(GenerationError):
    """The prompt does not fit the model's context even without earlier turns, so no reply
    was started (the message says by how much and what to change)."""


class WrongThreadError(EngineError):
    """An MLX entry point was called on the GUI thread (see ``app.engine.threads``)."""


class PeerLostError(GenerationError):
    """A process of the group a sharded target runs on (:mod:`app.engine.distributed`) died,
    or did not answer within the network timeout: the reply stops there. The group cannot be
    used again; the message names what was being exchanged."""
