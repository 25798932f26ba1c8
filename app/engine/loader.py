"""Loading targets (through mlx-lm's loader) and DFlash drafters, and checking that they fit.

Only safetensors are read and ``trust_remote_code`` is never turned on. On the CPU, weights
stored as float16/bfloat16 are computed in float32 (MLX's fast CPU matmul path is float32);
on Apple GPUs the checkpoint's dtype is kept.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.catalog import (  # noqa: F401 (re-exported for callers of the loader)
    check_pair_configs,
    read_config,
    text_config,
)
from app.engine.errors import (
    EngineError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
)
from app.engine.threads import check_engine_thread

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
    """

    model: Any
    tokenizer: Any
    path: Path
    name: str
    model_type: str
    config: dict[str, Any]
    eos_token_ids: set[int] = field(default_factory=set)
    context_length: int = 4096

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
        """Residual stream width."""
        return int(self.model.model.embed_tokens.weight.shape[1])


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
        """``"dflash"`` or ``"dflash2"`` (``config.kind``)."""
        return getattr(self.config, "kind", "dflash")


def load_target(path_or_repo: str | Path, keep_dtype: bool | None = None) -> LoadedTarget:
    """Load a target with mlx-lm's loader from a folder or a cached Hugging Face repo id.

    Float16/bfloat16 weights of an unquantized checkpoint are upcast to float32 on the CPU
    (MLX's CPU half-precision matmuls are slow); on a GPU backend (Metal, CUDA) the checkpoint
    dtype is kept. ``keep_dtype`` overrides that (True: never upcast; False: always).
    Quantized checkpoints are never upcast.

    Raises:
        ModelNotFoundError, ModelLoadError (missing/corrupt files, wrong tensor shapes),
        UnsupportedArchitectureError (a ``model_type`` mlx-lm does not know).
    """
    check_engine_thread()
    folder = resolve_model_path(path_or_repo)
    cfg = read_config(folder)
    if {"DFlashDraftModel", "DFlash2DraftModel"} & set(cfg.get("architectures") or []):
        raise ModelLoadError(
            f"{folder.name} is a DFlash drafter, not a target model: give it as the drafter "
            "(--draft-model) and a target model as --model"
        )
    if "model_type" not in cfg:
        raise ModelLoadError(f"{folder / 'config.json'} has no model_type")
    if not any(folder.glob("*.safetensors")):
        raise ModelLoadError(f"{folder} has no .safetensors weights")
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model",
                                                 "vocab.json", "tiktoken.model")):
        raise ModelLoadError(f"{folder} has no tokenizer files (tokenizer.json)")
    from mlx_lm.utils import load as mlx_load

    try:
        model, tokenizer = mlx_load(str(folder), trust_remote_code=False)
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
        raise ModelLoadError(f"could not load {folder.name}: {type(exc).__name__}: {exc}") from exc
    if keep_dtype is None:
        keep_dtype = not _on_cpu()
    if not keep_dtype and "quantization" not in cfg:
        _upcast_for_cpu(model)
    tcfg = text_config(cfg)
    eos = set(getattr(tokenizer, "eos_token_ids", None) or [])
    return LoadedTarget(
        model=model,
        tokenizer=tokenizer,
        path=folder,
        name=str(path_or_repo) if not Path(path_or_repo).exists() else folder.name,
        model_type=str(cfg.get("model_type", "")),
        config=cfg,
        eos_token_ids=eos,
        context_length=int(tcfg.get("max_position_embeddings") or 4096),
    )


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

    A config with ``"dflash_backbone": FOLDER`` is an adapter (:mod:`app.engine.adapter`):
    the tensors it lacks are read from that folder (relative to the drafter's).

    Raises:
        ModelNotFoundError, UnsupportedArchitectureError (another drafter architecture, or a
            DFlash2 variant this engine does not run),
        ModelLoadError (missing file or field, corrupt safetensors, wrong tensor shape; an
            adapter's backbone folder missing or misfit, named with the tensor).
    """
    check_engine_thread()
    import mlx.core as mx

    from app.engine import dflash2
    from app.engine.adapter import merge_backbone, read_tensors
    from app.engine.drafter import DFlashDrafter, DrafterConfig, expected_shapes

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
