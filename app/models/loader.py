"""Loading targets (through mlx-lm's loader) and DFlash drafters, and checking that they fit.

Only safetensors are read and ``trust_remote_code`` is never turned on. On the CPU, weights
stored as float16/bfloat16 are computed in float32 (MLX's fast CPU matmul path is float32);
on Apple GPUs the checkpoint's dtype is kept.

Quantized targets on the CPU: MLX's CPU quantized matmul does not batch (a 16-row 4-bit
matmul costs ~16 one-row ones, against ~1.6 in float32 with OpenBLAS), so a verify pass of a
block costs ~16 steps and DFlash cannot win. :func:`load_target` therefore dequantizes the
quantized layers to float32 on the CPU when the float32 copy fits in memory
(:func:`dequantize_model`), and says so in ``LoadedTarget.weights_note``; plain and DFlash
decoding both run on those weights, so they stay token-for-token identical.
``keep_quantized=True`` (CLI ``--keep-quantized``) keeps the quantized layers.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.errors import (
    DrafterAsTargetError,
    EngineError,
    IntegerWeightsError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
)
from app.engine.modes import drafter_mode
from app.engine.threads import check_engine_thread
from app.models.catalog import (  # noqa: F401 (re-exported for callers of the loader)
    check_pair_configs,
    read_config,
    text_config,
    trained_chat_length,
)

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def resolve_model_path(path_or_repo: str | Path) -> Path:
    """A local folder for a path or a Hugging Face repo id already in the local cache.

    Raises:
        ModelNotFoundError: the path does not exist, or the repo is not in the cache (the
            message names the repo; nothing is downloaded here).
    """
    p = Path(path_or_repo).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ModelNotFoundError(f"{p} is a file; expected a model folder")
        return p
    text = str(path_or_repo)
    if _REPO_ID.match(text) and not text.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, local_files_only=True))
        except Exception as exc:  # LocalEntryNotFoundError and friends
            raise ModelNotFoundError(
                f"{text} is not in the local Hugging Face cache; download it first "
                f"(Models window, or `hf download {text}`) or give a local folder"
            ) from exc
    raise ModelNotFoundError(f"no model folder at {p}")


def _on_cpu() -> bool:
    """True when MLX computes on the CPU (Metal and CUDA are both ``mx.gpu``)."""
    import mlx.core as mx

    return mx.default_device() == mx.cpu


def _upcast_for_cpu(model) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    params = tree_flatten(model.parameters())
    changed = [(k, v.astype(mx.float32)) for k, v in params if v.dtype in (mx.float16, mx.bfloat16)]
    if changed:
        model.update(tree_unflatten(changed))


#: Dequantize only when the float32 copy's extra bytes are at most this share of the memory
#: available at load time (the rest is left for the caches, the drafter and everything else).
DEQUANTIZE_MEMORY_SHARE = 0.6


def _quantized_modules(model) -> list[tuple[str, Any]]:
    """``(path, module)`` of every quantized leaf module (it has ``scales`` and ``bits``)."""
    return [(name, m) for name, m in model.named_modules()
            if hasattr(m, "scales") and hasattr(m, "bits") and hasattr(m, "group_size")]


QUANTIZED_INTEGER_PARAMETERS = ("weight", "scales")
"""Parameters of a quantized layer that may be integer typed: its packed weight (``uint32``)
and, in the ``mxfp4``/``nvfp4`` modes, its scales (``uint8``)."""


def dtype_name(dtype) -> str:
    """An MLX dtype as its short name (``mlx.core.int32`` -> ``"int32"``)."""
    return str(dtype).removeprefix("mlx.core.")


def check_floating_weights(named_arrays, folder: Path, quantized: set[str] = frozenset()) -> None:
    """Refuse weights that are integer (or boolean) typed where the model computes in floating
    point. ``named_arrays``: ``(name, mx.array)`` pairs; ``quantized``: the paths of the
    quantized layers, whose :data:`QUANTIZED_INTEGER_PARAMETERS` may be integer.

    Raises:
        IntegerWeightsError: naming ``folder``, the first such tensor and its dtype.
    """
    import mlx.core as mx

    bad = []
    for name, a in named_arrays:
        if mx.issubdtype(a.dtype, mx.floating):
            continue
        owner, _, leaf = name.rpartition(".")
        if owner in quantized and leaf in QUANTIZED_INTEGER_PARAMETERS:
            continue
        bad.append((name, a.dtype))
    if bad:
        raise IntegerWeightsError(folder, dtype_name(bad[0][1]), bad[0][0], len(bad))


def _check_target_weights(model, folder: Path) -> None:
    """:func:`check_floating_weights` over a loaded target's parameters."""
    from mlx.utils import tree_flatten

    check_floating_weights(tree_flatten(model.parameters()), folder,
                           {name for name, _ in _quantized_modules(model)})


def _logical_size(m) -> int:
    """Elements of a quantized module's weight once dequantized."""
    shape = list(m.weight.shape)
    shape[-1] = shape[-1] * 32 // m.bits
    n = 1
    for d in shape:
        n *= int(d)
    return n


def dequantized_bytes(model, dtype=None) -> tuple[int, int]:
    """``(quantized_bytes, dequantized_bytes)`` of the model's quantized modules' weights
    (packed weight + scales + biases, against the dequantized weight in ``dtype``, default
    float32), without computing anything. ``(0, 0)`` for an unquantized model."""
    import mlx.core as mx

    size = (dtype or mx.float32).size
    quant = deq = 0
    for _, m in _quantized_modules(model):
        quant += sum(a.nbytes for a in (m.weight, m.scales, getattr(m, "biases", None))
                     if a is not None)
        deq += _logical_size(m) * size
    return quant, deq


def available_memory_bytes() -> int | None:
    """Memory the system could give this process now (Linux ``MemAvailable``; elsewhere
    free physical pages), in bytes; None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def dequantize_model(model, dtype=None) -> int:
    """Replace every quantized ``Linear``, ``Embedding`` and mlx-lm ``SwitchLinear`` of
    ``model`` by its unquantized form, in place, with weights
    ``mx.dequantize(weight, scales, biases, group_size, bits, mode, dtype=dtype)`` (``dtype``
    default float32; biases of a Linear cast to it). Each new weight is evaluated as it is
    made. Other quantized module types are left as they are.

    Returns:
        the number of modules replaced.
    """
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_map_with_path

    dtype = dtype or mx.float32
    try:
        from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear
    except ImportError:  # pragma: no cover - mlx-lm is pinned
        QuantizedSwitchLinear = SwitchLinear = None
    replaced = 0

    def weight_of(m):
        extra = {}
        if getattr(m, "global_scale", None) is not None:
            extra["global_scale"] = m.global_scale
        w = mx.dequantize(m.weight, m.scales, getattr(m, "biases", None), m.group_size,
                          m.bits, mode=getattr(m, "mode", "affine"), dtype=dtype, **extra)
        mx.eval(w)
        return w

    def swap(_path, m):
        nonlocal replaced
        bias = m["bias"].astype(dtype) if "bias" in m else None
        if isinstance(m, nn.QuantizedLinear):
            new = nn.Linear(1, 1, bias=bias is not None)
        elif isinstance(m, nn.QuantizedEmbedding):
            new = nn.Embedding(1, 1)
        elif QuantizedSwitchLinear is not None and isinstance(m, QuantizedSwitchLinear):
            new = SwitchLinear(1, 1, 1, bias=bias is not None)
        else:
            return m
        new.weight = weight_of(m)
        if bias is not None:
            new.bias = bias
        replaced += 1
        return new

    leaves = tree_map_with_path(swap, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    return replaced


def _size_text(n: int) -> str:
    """``n`` bytes as ``1.2 GiB`` or ``35 MiB``."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _bits_text(model) -> str:
    bits = sorted({int(m.bits) for _, m in _quantized_modules(model)})
    return "/".join(str(b) for b in bits) + "-bit" if bits else "quantized"


def _dequantize_for_cpu(model, keep_quantized: bool | None) -> str:
    """Dequantize a quantized target when allowed and it fits (``keep_quantized`` as in
    :func:`load_target`); the note to show (empty for an unquantized model)."""
    quant, deq = dequantized_bytes(model)
    if not deq:
        return ""
    bits = _bits_text(model)
    if keep_quantized:
        return f"{bits} weights kept quantized (--keep-quantized): verify passes are slow on the CPU"
    avail = available_memory_bytes()
    if keep_quantized is None and avail is not None and deq - quant > DEQUANTIZE_MEMORY_SHARE * avail:
        note = (f"{bits} weights kept quantized: their float32 copy ({_size_text(deq)}) does "
                f"not fit in the {_size_text(avail)} available; DFlash verify passes are slow "
                "on the CPU with quantized weights")
        log.warning(note)
        return note
    n = dequantize_model(model)
    where = " for the CPU" if _on_cpu() else ""
    note = (f"{bits} weights dequantized to float32{where} ({n} layers, {_size_text(deq)}; "
            "--keep-quantized keeps them quantized)")
    log.info(note)
    return note


@dataclass
class LoadedTarget:
    """A target model ready to generate.

    Attributes:
        model: the mlx-lm ``nn.Module``.
        tokenizer: mlx-lm's ``TokenizerWrapper`` (streaming detokenizer, chat template,
            tool-parser inference).
        path: the local folder; name: a display name (repo id or folder name).
        model_type: config ``model_type``; config: the full config dict.
        eos_token_ids: ids that end generation; context_length: ``max_position_embeddings``.
        trained_chat_length: the longest chat example it was trained on, in tokens, when its
            folder states one (``app.models.catalog.trained_chat_length``); else None.
        weights_note: how a quantized checkpoint's weights are used here (dequantized to
            float32 for the CPU, or kept quantized and why); empty otherwise.
        dequantized: True when the quantized layers were dequantized at load.
        shard: for a target sharded over a group of processes, rank 0's
            :class:`~app.engine.distributed.DistributedRunner` (the model then holds only
            rank 0's layers); None for a target in one process.
    """

    model: Any
    tokenizer: Any
    path: Path
    name: str
    model_type: str
    config: dict[str, Any]
    eos_token_ids: set[int] = field(default_factory=set)
    context_length: int = 4096
    trained_chat_length: int | None = None
    weights_note: str = ""
    dequantized: bool = False
    shard: Any = None

    @property
    def num_layers(self) -> int:
        """Decoder layers of the target."""
        return len(self.model.layers)

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding table."""
        return int(self.model.model.embed_tokens.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        """Residual stream width: the final norm's weight width (a quantized embedding's
        weight is packed, 32 / bits values per column, so its width is not the model's);
        the embedding's width for a family without a final ``norm``."""
        inner = self.model.model
        norm = getattr(inner, "norm", None)
        if norm is not None and hasattr(norm, "weight"):
            return int(norm.weight.shape[-1])
        return int(inner.embed_tokens.weight.shape[1])


@dataclass
class LoadedDrafter:
    """A DFlash or DFlash2 drafter: ``model`` (:class:`~app.engine.drafter.DFlashDrafter` or
    :class:`~app.engine.dflash2.DFlash2Drafter`), its ``config``
    (:class:`~app.engine.drafter.DrafterConfig` or :class:`~app.engine.dflash2.DFlash2Config`;
    ``config.kind`` is ``"dflash"`` or ``"dflash2"`` and decides which draft the engine runs),
    ``path`` and display ``name``."""

    model: Any
    config: Any
    path: Path
    name: str

    @property
    def kind(self) -> str:
        """The mode this drafter drafts in: ``Mode.DFLASH`` or ``Mode.DFLASH2``."""
        return drafter_mode(self.config)


TOKENIZER_NO_LIMIT = int(1e30)
"""The ``model_max_length`` transformers itself gives a tokenizer that names none."""


def keep_file_tokenizer(tokenizer, folder: Path) -> bool:
    """Make ``tokenizer`` split text exactly as the folder's ``tokenizer.json`` does, when its
    ``tokenizer_config.json`` names the generic ``PreTrainedTokenizerFast`` class.

    transformers 5 loads a tokenizer by the model type of ``config.json`` and, for types it
    knows (``qwen3_5``: ``Qwen3_5Tokenizer``), rebuilds the normalizer and pre-tokenizer from
    that class's own rules, whatever ``tokenizer.json`` holds. A model trained on the file's
    rules (the bundled demo pair: digits split one by one, GPT-2 byte-level splitting, no
    normalizer) then reads prompts split in ways it never saw, e.g. ``"\n\n"`` as one token.
    Here the file's tokenizer replaces the rebuilt one when their normalizer, pre-tokenizer or
    decoder differ. ``tokenizer``: mlx-lm's ``TokenizerWrapper`` (its ``_tokenizer`` is the
    transformers tokenizer) or a transformers fast tokenizer. Returns True when it replaced
    it; a folder without those files, another class, or a tokenizer without a backend is left
    alone (False).
    """
    config, file = folder / "tokenizer_config.json", folder / "tokenizer.json"
    try:
        named = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return False
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(inner, "_tokenizer", None)
    if named != "PreTrainedTokenizerFast" or backend is None or not file.is_file():
        return False
    from tokenizers import Tokenizer

    own = Tokenizer.from_file(str(file))
    loaded, saved = json.loads(backend.to_str()), json.loads(own.to_str())
    if all(loaded.get(k) == saved.get(k) for k in ("normalizer", "pre_tokenizer", "decoder")):
        return False
    log.info("%s: using tokenizer.json's own splitting (transformers rebuilt it as %s)",
             folder.name, type(inner).__name__)
    inner._tokenizer = own
    return True


def load_tokenizer(folder: str | Path):
    """mlx-lm's ``TokenizerWrapper`` for the model folder ``folder``, splitting text as the
    app's loaded targets do (:func:`keep_file_tokenizer`); for tools and tests that need a
    target's tokenizer without its weights.

    Raises:
        OSError, ValueError: from mlx-lm / transformers for a folder without a tokenizer.
    """
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    folder = Path(folder)
    tokenizer = mlx_load_tokenizer(folder)
    keep_file_tokenizer(tokenizer, folder)
    lift_tokenizer_length_limit(tokenizer)
    return tokenizer


def lift_tokenizer_length_limit(tokenizer) -> None:
    """Stop transformers warning "Token indices sequence length is longer than the specified
    maximum sequence length for this model" on stderr for every long prompt.

    The app checks a prompt against the model's context itself (``LoadedTarget.context_length``,
    ``app.chat.history`` fits the history into it and says what it left out; the engine raises
    ``PromptTooLongError``), so the tokenizer's ``model_max_length`` (a value from
    ``tokenizer_config.json``, often smaller than the context, e.g. the demo's 4,096 or a
    Qwen tokenizer's 131,072 under a larger RoPE-scaled context) only produced that warning:
    the app never asks the tokenizer to truncate. ``tokenizer``: mlx-lm's
    ``TokenizerWrapper`` (its ``_tokenizer`` is the transformers tokenizer) or a transformers
    tokenizer; anything without ``model_max_length`` is left alone."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    if hasattr(inner, "model_max_length"):
        try:
            inner.model_max_length = TOKENIZER_NO_LIMIT
        except (AttributeError, TypeError):  # a read-only attribute: keep the warning
            pass


def start_kernel_build(target: str | Path, *drafters: str | Path | None) -> bool:
    """On MLX's CUDA backend, start compiling the kernels a pair will need in background
    processes before it is loaded (:func:`app.engine.kernels.kernel_prebuild.start_early`,
    from the checkpoints' file headers), so that loading the target (and the ``transformers``
    import inside it) overlaps the build, and every drafter's kernels (a DFlash2 drafter's
    candidate walk too) are built by the time the warm-up's own in-process work ends.
    ``drafters``: the pair's drafter folders (None entries skipped). Returns whether
    children were started; never raises (a folder that cannot be found is the load's to
    report)."""
    from app.engine.device import backend
    from app.engine.kernels import kernel_prebuild

    if backend() != "CUDA" or not kernel_prebuild.enabled():
        return False
    try:
        folders = [resolve_model_path(p) for p in (target, *drafters) if p]
    except EngineError:
        return False
    return kernel_prebuild.start_early(folders[0], folders[1:]) is not None


def load_target(path_or_repo: str | Path, keep_dtype: bool | None = None,
                keep_quantized: bool | None = None, layers: tuple[int, int] | None = None,
                ends: bool = True) -> LoadedTarget:
    """Load a target with mlx-lm's loader from a folder or a cached Hugging Face repo id.

    Float16/bfloat16 weights of an unquantized checkpoint are upcast to float32 on the CPU
    (MLX's CPU half-precision matmuls are slow); on a GPU backend (Metal, CUDA) the checkpoint
    dtype is kept. ``keep_dtype`` overrides that (True: never upcast; False: always).

    A quantized checkpoint on the CPU (``keep_dtype`` not True) has its quantized layers
    dequantized to float32 (:func:`dequantize_model`) and its other weights upcast, when the
    float32 copy's extra bytes are at most :data:`DEQUANTIZE_MEMORY_SHARE` of the available
    memory; otherwise it stays quantized with a logged warning. ``keep_quantized``: None
    decides so; True never dequantizes; False dequantizes without the memory check (and on
    any backend). ``LoadedTarget.weights_note`` says what happened.

    ``layers`` ``(first, end)``: load only the decoder layers ``first .. end - 1`` (one rank of
    a sharded target, :mod:`app.models.distributed`); the others become weightless stand-ins
    that keep their ``is_linear`` flag, and their weights are never read. ``ends=False`` also
    leaves out the embedding, the final norm and the LM head (a rank other than 0).

    Raises:
        ModelNotFoundError, ModelLoadError (missing/corrupt files, wrong tensor shapes),
        IntegerWeightsError (a ModelLoadError: integer weights outside quantized layers,
            :func:`check_floating_weights`),
        UnsupportedArchitectureError (a ``model_type`` mlx-lm does not know).
    """
    check_engine_thread()
    folder = resolve_model_path(path_or_repo)
    cfg = read_config(folder)
    if {"DFlashDraftModel", "DFlash2DraftModel"} & set(cfg.get("architectures") or []):
        raise DrafterAsTargetError(
            folder,
            f"{folder.name} is a DFlash drafter, not a target model: give it as the drafter "
            "(--draft-model) and a target model as --model",
        )
    if "model_type" not in cfg:
        raise ModelLoadError(f"{folder / 'config.json'} has no model_type")
    if not any(folder.glob("*.safetensors")):
        raise ModelLoadError(f"{folder} has no .safetensors weights")
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model",
                                                 "vocab.json", "tiktoken.model")):
        raise ModelLoadError(f"{folder} has no tokenizer files (tokenizer.json)")
    import mlx_lm.utils
    from mlx_lm.utils import load as mlx_load

    classes = getattr(mlx_lm.utils, "_get_classes", None)  # mlx-lm's model-type lookup
    if classes is not None:  # checked before the weights are read: a type mlx-lm lacks
        try:                 # is named as such even when the weights are broken too
            classes(cfg)
        except ValueError as exc:
            raise UnsupportedArchitectureError(
                f"model type {cfg.get('model_type')!r} is not supported by mlx-lm: {exc}"
            ) from exc
    try:
        model, tokenizer = mlx_load(str(folder), trust_remote_code=False,
                                    lazy=layers is not None)
        if layers is not None:
            keep_layers(model, layers, ends)
    except EngineError:
        raise
    except ValueError as exc:
        msg = str(exc)
        misfit = re.match(r"(Received|Missing) (\d+) parameters? (not in model|in the model)?",
                          msg.strip())
        if misfit:
            names = [n.strip(" ,.\n") for n in msg.split(":", 1)[-1].split(",") if n.strip(" ,.\n")]
            extra = "the checkpoint has" if misfit.group(1) == "Received" else "the model lacks"
            raise ModelLoadError(
                f"{folder.name}: the weights do not fit model_type "
                f"{cfg.get('model_type')!r} ({misfit.group(2)} tensors {extra}, e.g. "
                f"{names[0] if names else '?'}); check config.json's model_type"
            ) from exc
        if "not supported" in msg.lower() or "model type" in msg.lower():
            raise UnsupportedArchitectureError(
                f"model type {cfg.get('model_type')!r} is not supported by mlx-lm: {msg}"
            ) from exc
        raise ModelLoadError(f"could not load {folder.name}: {msg}") from exc
    except Exception as exc:  # mlx-lm raises many kinds for bad files; all are load errors
        msg = str(exc)
        if isinstance(exc, RuntimeError) and any(
                k in msg for k in ("[load_safetensors]", "[read]", "Unable to read")):
            files = sorted(folder.glob("*.safetensors"))
            which = files[0].name if len(files) == 1 else "a weights file"
            detail = msg.replace(" Perhaps an incomplete download or corrupt file?", "")
            raise ModelLoadError(
                f"the model folder {folder.name}: {which} is damaged or incomplete (cut short "
                f"by an interrupted download or copy?), MLX could not read it: {detail}") from exc
        raise ModelLoadError(f"could not load {folder.name}: {type(exc).__name__}: {exc}") from exc
    from app.engine.device import configure_cuda_attention, configure_cuda_kernel_cache

    _check_target_weights(model, folder)  # before anything is dequantized or upcast
    configure_cuda_attention()  # before the first attention pass (its docstring says why)
    configure_cuda_kernel_cache()  # before MLX's first kernel compile (likewise)
    if keep_dtype is None:
        keep_dtype = not _on_cpu()
    note = ""
    if keep_quantized is False or not keep_dtype:
        note = _dequantize_for_cpu(model, keep_quantized)
    quantized = bool(_quantized_modules(model))
    if not keep_dtype and not quantized:
        _upcast_for_cpu(model)
    _eval_parameters(model)
    from app.engine.kernels.row_products import use_row_stable_products

    use_row_stable_products(model)  # CUDA: plain steps and verify passes multiply alike
    tcfg = text_config(cfg)
    eos = set(getattr(tokenizer, "eos_token_ids", None) or [])
    keep_file_tokenizer(tokenizer, folder)
    lift_tokenizer_length_limit(tokenizer)
    return LoadedTarget(
        model=model,
        tokenizer=tokenizer,
        path=folder,
        name=str(path_or_repo) if not Path(path_or_repo).exists() else folder.name,
        model_type=str(cfg.get("model_type", "")),
        config=cfg,
        eos_token_ids=eos,
        context_length=int(tcfg.get("max_position_embeddings") or 4096),
        trained_chat_length=trained_chat_length(folder),
        weights_note=note,
        dequantized=bool(note) and not quantized,
    )


def keep_layers(model, layers: tuple[int, int], ends: bool = True) -> None:
    """Replace the decoder layers of ``model`` outside ``layers`` ``(first, end)`` by
    weightless modules that keep the layer's plain attributes (``is_linear``, ``use_sliding``:
    what ``make_cache`` reads); without ``ends``, also the embedding, the
    final norm and the LM head. Called on a lazily loaded model, before its weights are read.

    Raises:
        ModelLoadError: a range outside the model's layers, or a model whose layer list
            cannot be reached.
    """
    import mlx.nn as nn

    inner = getattr(model, "model", None)
    owned = getattr(inner, "layers", None)
    if not isinstance(owned, list):
        raise ModelLoadError("this model's layers cannot be split between processes")
    first, end = layers
    if not 0 <= first < end <= len(owned):
        raise ModelLoadError(f"layers {first}..{end - 1} are outside the model's {len(owned)}")
    for i, layer in enumerate(owned):
        if not first <= i < end:
            stub = nn.Module()  # the layer's flags (is_linear, use_sliding), none of its weights
            for key, value in vars(layer).items():
                if isinstance(value, (bool, int, float, str)) and not key.startswith("_"):
                    setattr(stub, key, value)
            stub.is_linear = bool(getattr(layer, "is_linear", False))
            owned[i] = stub
    if not ends:
        inner.embed_tokens = nn.Module()
        inner.norm = nn.Module()
        head_owner = getattr(model, "language_model", model)
        if "lm_head" in head_owner:
            head_owner.lm_head = nn.Module()


def _eval_parameters(model) -> None:
    """Evaluate a model's parameters (after an upcast or dequantization)."""
    import mlx.core as mx

    mx.eval(model.parameters())


def load_drafter(path_or_repo: str | Path, keep_dtype: bool | None = None) -> LoadedDrafter:
    """Load a z-lab DFlash or DFlash2 drafter (``config.json`` + ``model.safetensors``).

    ``architectures: ["DFlash2DraftModel"]`` loads :class:`~app.engine.dflash2.DFlash2Drafter`
    (config checked by :meth:`~app.engine.dflash2.DFlash2Config.from_dict`; its tensors include
    the per-layer ``attention_conv``/``mlp_conv`` and the ``candidate_selector``); anything else
    goes through :class:`~app.engine.drafter.DrafterConfig` exactly as before.

    Weights are float32 on the CPU and keep the checkpoint dtype on a GPU backend;
    ``keep_dtype`` overrides that as for :func:`load_target`.

    Extra ``embed_tokens``/``lm_head`` tensors (one preview checkpoint shipped them) are
    ignored; every other tensor must be present with the shape the config implies.

    A config with ``"dflash_backbone": FOLDER`` is an adapter (:mod:`app.models.adapter`):
    the tensors it lacks are read from that folder (relative to the drafter's).

    Raises:
        ModelNotFoundError, UnsupportedArchitectureError (another drafter architecture, or a
            DFlash2 variant this engine does not run),
        ModelLoadError (missing file or field, corrupt safetensors, wrong tensor shape; an
            adapter's backbone folder missing or misfit, named with the tensor),
        IntegerWeightsError (a ModelLoadError: integer typed weights, named with the dtype).
    """
    check_engine_thread()
    import mlx.core as mx

    from app.engine import dflash2
    from app.engine.drafter import DFlashDrafter, DrafterConfig, expected_shapes
    from app.models.adapter import merge_backbone, read_tensors

    folder = resolve_model_path(path_or_repo)
    raw = read_config(folder)
    if dflash2.ARCHITECTURE in (raw.get("architectures") or []):
        cfg = dflash2.DFlash2Config.from_dict(raw)
        model_class, shapes = dflash2.DFlash2Drafter, dflash2.expected_shapes(cfg)
    else:
        cfg = DrafterConfig.from_dict(raw)
        model_class, shapes = DFlashDrafter, expected_shapes(cfg)
    weights = {
        k.removeprefix("model."): v
        for k, v in read_tensors(folder).items()
        if not k.endswith(("embed_tokens.weight", "lm_head.weight"))
    }
    weights = merge_backbone(folder, raw, weights, shapes)  # an adapter: + its backbone's
    for name, shape in shapes.items():
        if name not in weights:
            raise ModelLoadError(f"drafter weights lack the tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ModelLoadError(
                f"drafter tensor {name} has shape {tuple(weights[name].shape)}, "
                f"expected {shape} from config.json"
            )
    check_floating_weights(((k, weights[k]) for k in shapes), folder)  # none is quantized
    extra = sorted(set(weights) - set(shapes))
    if extra:
        log.warning("ignoring %d unexpected drafter tensors (e.g. %s)", len(extra), extra[0])
    model = model_class(cfg)
    if keep_dtype is None:
        keep_dtype = not _on_cpu()
    dtype = next(iter(weights.values())).dtype if keep_dtype else mx.float32
    model.load_weights([(k, weights[k].astype(dtype)) for k in shapes], strict=True)
    mx.eval(model.parameters())
    return LoadedDrafter(model=model, config=cfg, path=folder, name=folder.name)


def check_pair(target: LoadedTarget, drafter: LoadedDrafter) -> None:
    """Check a loaded pair fits before generating (the loaded tensors, not only configs).

    Raises:
        PairMismatchError: naming ``vocab_size``, ``hidden_size``, ``num_target_layers``,
            ``target_layer_ids`` or ``mask_token_id``.
        UnsupportedArchitectureError: the target family has no tap capture for DFlash.
    """
    from app.engine.target import TAP_FAMILIES

    d = drafter.config
    # the loaded tensors' sizes, checked by the one pair rule (catalog.check_pair_configs)
    check_pair_configs(
        {"vocab_size": target.vocab_size, "hidden_size": target.hidden_size,
         "num_hidden_layers": target.num_layers},
        {"vocab_size": d.vocab_size, "hidden_size": d.hidden_size,
         "num_target_layers": d.num_target_layers,
         "dflash_config": {"target_layer_ids": list(d.target_layer_ids),
                           "mask_token_id": d.mask_token_id}},
    )
    if target.model_type not in TAP_FAMILIES:
        raise UnsupportedArchitectureError(
            f"DFlash is not available for {target.model_type!r} targets; plain decoding works"
        )
