"""Build MLX's CUDA kernels for a loaded pair in parallel processes, before its warm-up.

Why: MLX's CUDA backend compiles some kernels with NVRTC the first time they run and keeps
them on disk (``ptx_cache_dir`` in MLX 0.32's ``mlx/backend/cuda/jit_module.cpp``:
``MLX_PTX_CACHE_DIR``, else ``<temp dir>/mlx/<version>/ptx``), one after another. For the
bundled pair in float16 these are seven modules: four fused element-wise kernels of mlx-lm's
``mx.compile`` functions (``nn.silu``, ``swiglu``, ``precise_swiglu``, ``compute_g``; about
4.5 s each on an H200 host) and three gathers (embedding look-ups; about 2 s each); a DFlash2
drafter's candidate walk adds five more. NVRTC runs on one CPU core; compiling the modules
side by side in separate processes, each writing to the shared disk cache, leaves the
warm-up's own run only cache reads (load and warm-up times: docs/performance.md, "Figures").

What: :func:`recipes_for` lists, from a loaded pair's dtypes, small MLX programs
(:data:`RECIPES`) that build exactly those modules: the same mlx-lm functions on tiny arrays
of the same dtypes (a fused module is named after its graph and dtypes, not its shapes; a
gather after its source and index dtypes). :func:`start` runs them in child processes
(``python -m app.engine.kernels.kernel_prebuild RECIPES_JSON``) and :meth:`Prebuild.wait`
waits for them. A recipe that fails or builds a module the pair does not use costs only its process:
whatever the recipes miss, the warm-up builds itself, and no computed value depends on
which process compiled a kernel. A drafted run whose kernels children are still building in
the background waits for them (:func:`wait_background_for`). Each child compiles into a
private folder and then publishes its modules whole into the cache folder (:func:`publish`) and records its recipes
there (:data:`MARKER`), so that a later start skips them (:func:`built_before`), also those
of children left running in the background (:func:`start_background`).
Modules that MLX does not cache on disk (``mx.fast``'s custom kernels, such as
:mod:`app.engine.kernels.gdn_kernel`) must be built in the process that runs them.

Switch: ``DFLASH_KERNEL_PREBUILD=0`` turns it off (:func:`enabled`), for measurements.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

#: A recipe: (kind, dtype names); kinds are the keys of :data:`RECIPES`.
Recipe = tuple[str, tuple[str, ...]]

#: What each kind builds and which dtypes it takes (names of ``mlx.core`` dtypes).
RECIPES = {
    "gather": "x[idx]: MLX's gather module for (source dtype, index dtype)",
    "gather2": "x[i, j]: the gather module with two index arrays, (source, index) dtypes",
    "gather_axis": "mx.take_along_axis: MLX's gather_axis module, (source, index) dtypes",
    "silu": "mlx.nn.silu (compiled) on one dtype",
    "swiglu": "mlx_lm.models.activations.swiglu on one dtype",
    "precise_swiglu": "mlx_lm.models.activations.precise_swiglu on one dtype",
    "compute_g": "mlx_lm.models.gated_delta.compute_g on (A_log, a, dt_bias) dtypes",
    "rows": "the row products' kernel (row_products), (activation dtype, bits, group size); "
            "bits 0: dense",
    "rows_attention": "the row mode's attention kernel (row_attention), (dtype, head size)",
    "gdn": "the Gated DeltaNet kernel (gdn_kernel), (activation dtype, Dk, Dv, Hk, Hv)",
}

#: Kinds that build one of the project's ``mx.fast.cuda_kernel`` kernels, which MLX keeps in
#: memory only: a child compiles it into the disk cache itself
#: (:mod:`app.engine.kernels.custom_cache`), and the process that runs the model loads it
#: from there instead of compiling it (each took 1-3 s on an H100 host, one after another).
CUSTOM = {"rows", "rows_attention", "gdn"}

#: Kinds that took about twice as long as a gather to compile (4-4.5 s against about 2 s on
#: the H200 host, NVRTC 13): the fused ones and ``gather_axis``.
_SLOW = {"silu", "swiglu", "precise_swiglu", "compute_g", "gather_axis"} | CUSTOM


#: The folder, inside MLX's kernel cache folder, that records the recipes built there: one
#: empty file per recipe and MLX version (created whole, so concurrent writers never clash).
MARKER = "dflash-prebuilt"


def ptx_cache_dir() -> Path:
    """Where MLX's CUDA backend keeps the kernels it compiles: ``MLX_PTX_CACHE_DIR``, else
    ``<temp dir>/mlx/<MLX version>/ptx`` (``ptx_cache_dir`` in MLX 0.32's
    ``mlx/backend/cuda/jit_module.cpp``). Not created here."""
    import tempfile

    import mlx.core as mx

    env = os.environ.get("MLX_PTX_CACHE_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "mlx" / mx.__version__ / "ptx"


def _record_name(recipe: Recipe) -> str:
    import mlx.core as mx

    kind, dtypes = recipe
    name = f"{mx.__version__}--{kind}--{'-'.join(dtypes)}"
    return f"{name}--{_sources_digest()}" if kind in CUSTOM else name


_DIGEST: list[str] = []


#: The files that hold the custom kernels' source text and how a call is made.
_CUSTOM_FILES = ("row_products.py", "row_attention.py", "gdn_kernel.py", "cuda_source.py")


def _sources_digest() -> str:
    """A short digest of the files that define the project's custom kernels
    (:data:`_CUSTOM_FILES`, read as bytes: nothing imported, so no mlx-lm import before the
    load's children start): a :data:`CUSTOM` recipe's record counts only for the files it was
    built from (a changed kernel gets a new module name in MLX's cache, and must be built
    again). An unreadable file gives a digest that matches no record."""
    if not _DIGEST:
        import hashlib

        digest = hashlib.sha256()
        for name in _CUSTOM_FILES:
            try:
                digest.update((Path(__file__).parent / name).read_bytes())
            except OSError:
                digest.update(os.urandom(16))
        _DIGEST.append(digest.hexdigest()[:12])
    return _DIGEST[0]


def built_before(folder: Path | None = None) -> set[Recipe]:
    """The recipes :func:`mark_built` recorded in ``folder`` (default :func:`ptx_cache_dir`)
    for this MLX version; empty when there is no record (a fresh or emptied cache)."""
    import mlx.core as mx

    try:
        names = [f.name for f in ((folder or ptx_cache_dir()) / MARKER).iterdir()]
    except OSError:
        return set()
    out = set()
    for name in names:
        parts = name.split("--")
        if parts[0] != mx.__version__ or len(parts) < 3 or parts[1] not in RECIPES:
            continue
        if len(parts) == (4 if parts[1] in CUSTOM else 3) and (
                len(parts) == 3 or parts[3] == _sources_digest()):
            out.add((parts[1], tuple(parts[2].split("-"))))
    return out


def mark_built(recipes: list[Recipe], folder: Path | None = None) -> None:
    """Record ``recipes`` in ``folder`` (default :func:`ptx_cache_dir`), so a later process
    skips them (:func:`built_before`). Never raises: a cache folder that cannot be written
    only means the next start builds them again."""
    record = (folder or ptx_cache_dir()) / MARKER
    try:
        record.mkdir(parents=True, exist_ok=True)
        for r in recipes:
            (record / _record_name(r)).touch()
    except OSError:
        pass


def publish(private: Path, shared: Path) -> int:
    """Move the kernel files MLX wrote to ``private`` into ``shared`` (same file system), so
    that each module appears whole: its ``.txt`` (kernel names) and ``.cu`` first, its
    ``.ptx`` last, each by an atomic rename. MLX reads a module only when its ``.ptx`` exists
    (``read_cached_ptx``), so a reader never sees one half written. Returns the modules
    moved.

    Raises:
        OSError: a file could not be moved.
    """
    moved = 0
    for ptx in private.glob("*.ptx"):
        for ext in (".txt", ".cu"):
            side = ptx.with_suffix(ext)
            if side.exists():
                os.replace(side, shared / side.name)
        os.replace(ptx, shared / ptx.name)
        moved += 1
    return moved


def enabled() -> bool:
    """True unless ``DFLASH_KERNEL_PREBUILD`` is ``"0"``, and not in a frozen bundle (whose
    executable cannot run ``-m``)."""
    return os.environ.get("DFLASH_KERNEL_PREBUILD", "1") != "0" and not getattr(
        sys, "frozen", False)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1]  # "mlx.core.float16" -> "float16"


def _inner(model: Any) -> Any:
    return model.model if hasattr(model, "model") else model


def _embedding(model: Any) -> Any | None:
    return getattr(_inner(model), "embed_tokens", None)


def activation_dtype(model: Any) -> Any:
    """The dtype an mlx-lm ``model`` computes in (an ``mlx.core.Dtype``): its final norm's
    weight dtype (a norm is never quantized), else its embedding's, else its first floating
    parameter's; float32 when it has none."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    norm = getattr(getattr(_inner(model), "norm", None), "weight", None)
    if norm is not None:
        return norm.dtype
    embed = _embedding(model)
    if embed is not None and getattr(embed, "scales", None) is None:
        return embed.weight.dtype
    floats = [v.dtype for _, v in tree_flatten(model.parameters())
              if mx.issubdtype(v.dtype, mx.floating)]
    return floats[0] if floats else mx.float32


def first_gdn_layer(model: Any) -> Any | None:
    """The ``linear_attn`` module of ``model``'s first Gated DeltaNet layer, or None."""
    return next((layer.linear_attn for layer in getattr(model, "layers", [])
                 if hasattr(getattr(layer, "linear_attn", None), "A_log")), None)


def recipes_for(target: Any, drafters: list | tuple = ()) -> list[Recipe]:
    """The recipes that build the JIT modules a reply on ``target`` (a ``LoadedTarget``) with
    ``drafters`` (``LoadedDrafter``; None entries skipped) compiles on MLX's CUDA backend,
    in no particular order, without repeats.

    Gathers: the target's embedding (its weight, and its scales when quantized) indexed by
    int32 ids (the prompt) and uint32 ids (argmax output fed back), and a uint32 array by
    uint32 indices. Fused: ``silu`` and ``swiglu`` in each model's dtype; for a Gated DeltaNet
    target also ``precise_swiglu`` (its gated norm) and ``compute_g`` in its layers' dtypes.
    A DFlash2 drafter's candidate walk (``app.engine.dflash2.CandidateSelector.walk``):
    ``take_along_axis`` on float32 logits and uint32 top-k ids (uint32 and int32 indices)
    and on its int32 table of choices (int32 indices: the composed walk), a float32 gather by
    uint32 ids, ``cand[i, j]`` (int32, two indices), and its codebooks indexed by uint32 and
    int32 ids: the modules fresh H200 and H100 hosts compiled for it.
    """
    embed = _embedding(target.model)
    sources = []
    if embed is not None:
        sources.append(_dtype_name(embed.weight.dtype))
        if getattr(embed, "scales", None) is not None:
            sources.append(_dtype_name(embed.scales.dtype))
    models = [target.model] + [d.model for d in drafters if d is not None]
    selectors = [getattr(getattr(d, "model", None), "candidate_selector", None)
                 for d in drafters]
    gdn = first_gdn_layer(target.model)
    return _recipes(
        sources, [_dtype_name(activation_dtype(m)) for m in models],
        [_dtype_name(s.predecessor_codebook.dtype) for s in selectors if s is not None],
        None if gdn is None else (_dtype_name(gdn.A_log.dtype),
                                  _dtype_name(activation_dtype(target.model)),
                                  _dtype_name(gdn.dt_bias.dtype))) + custom_recipes(target.model)


_HALF = ("float16", "bfloat16")


def _custom_on() -> tuple[str, bool]:
    """The row mode (``row_products.mode()``; ``"0"`` where the row kernels do not run here:
    ``row_products.on_cuda``) and whether the GDN kernel is active, where the custom-kernel
    cache is :func:`~app.engine.kernels.custom_cache.enabled`; ``("0", False)`` where it is
    not (no custom recipes then)."""
    from app.engine.kernels import custom_cache

    if not custom_cache.enabled():  # before importing the kernel modules (mlx-lm's package)
        return "0", False
    from app.engine.kernels import gdn_kernel, row_products

    return (row_products.mode() if row_products.on_cuda() else "0"), gdn_kernel.kernel_active()


def custom_recipes(model: Any) -> list[Recipe]:
    """The :data:`CUSTOM` recipes of a loaded ``model`` (an mlx-lm model), without repeats:
    a ``rows`` instance per (activation dtype, bits, group size) of its layers that
    ``row_products.use_row_stable_products`` switched and whose products the kernel takes in
    the current ``DFLASH_ROW_PRODUCTS`` mode (the switch happens only on MLX's CUDA backend,
    so elsewhere there are none); ``rows_attention`` per head size of its attention layers
    in the ``all`` mode; ``gdn`` for its first Gated DeltaNet layer's shapes where the GDN
    kernel is active and takes them. Nothing where the custom-kernel cache is off
    (``DFLASH_CUSTOM_KERNEL_CACHE`` not ``1``: :func:`~app.engine.kernels.custom_cache.enabled`)."""
    from app.engine.kernels import row_products as rp

    way, gdn_on = _custom_on()
    out: list[Recipe] = []
    switched = False
    act = _dtype_name(activation_dtype(model))
    for _, m in model.named_modules():
        if isinstance(m, (rp.RowStableQuantizedLinear, rp.RowStableQuantizedEmbedding)):
            switched = True
            scales = _dtype_name(m["scales"].dtype)
            if (way != "0" and getattr(m, "mode", "affine") == "affine" and m.bits in (4, 8)
                    and m.group_size in (32, 64, 128) and scales in _HALF
                    and m.get("biases") is not None):
                out.append(("rows", (scales, str(m.bits), str(m.group_size))))
        elif isinstance(m, (rp.RowStableLinear, rp.RowStableEmbedding)):
            switched = True
            weight = _dtype_name(m["weight"].dtype)
            if way == "all" and weight in _HALF:
                out.append(("rows", (weight, "0", "32")))
    if switched and way == "all" and act in _HALF:
        for _, m in model.named_modules():
            d = getattr(m, "head_dim", None)
            if isinstance(d, int) and hasattr(m, "q_proj") and d % 32 == 0 and d <= 256:
                out.append(("rows_attention", (act, str(d))))
    gdn = first_gdn_layer(model)
    if gdn_on and gdn is not None:
        out += _gdn_recipe(act, gdn.head_k_dim, gdn.head_v_dim, gdn.num_k_heads,
                           gdn.num_v_heads)
    return list(dict.fromkeys(out))


def _gdn_recipe(act: str, dk: int, dv: int, hk: int, hv: int) -> list[Recipe]:
    """The ``gdn`` recipe for these shapes, or none where the kernel does not take them."""
    if dk % 32 or hv % hk:
        return []
    return [("gdn", (act, str(dk), str(dv), str(hk), str(hv)))]


def _linear_name(module: str) -> bool:
    """Whether a checkpoint's module name (its last part) is one of a linear layer or an
    embedding in mlx-lm's models: ``*proj*`` (``q_proj``, ``in_proj_qkv``, ``down_proj``...),
    ``embed_tokens``, ``lm_head``."""
    return "proj" in module or module in ("embed_tokens", "lm_head")


def custom_recipes_from_files(target_folder: str | Path,
                              dtypes: dict[str, str] | None = None) -> list[Recipe]:
    """:func:`custom_recipes` predicted from a target checkpoint's files before it is loaded,
    for a GPU load that switches its layers to the row kernels (MLX's CUDA backend): its
    ``config.json`` (the text config, nested or not: head sizes and counts, the
    ``quantization`` section's bits and group sizes, per layer where given) and its tensors'
    dtypes (``dtypes`` if given, else :func:`tensor_dtypes`: quantized layers have
    ``scales``). A wrong prediction
    costs a child's time only. Never raises (an unreadable folder gives none)."""
    way, gdn_on = _custom_on()
    if way == "0" and not gdn_on:
        return []
    try:
        config = json.loads((Path(target_folder) / "config.json").read_text())
        text = config.get("text_config") or config
        dtypes = tensor_dtypes(target_folder) if dtypes is None else dtypes
        act = _files_activation_dtype(dtypes)
        quant = config.get("quantization") or config.get("quantization_config") or {}
        out: list[Recipe] = []
        for name, dtype in sorted(dtypes.items()):
            if not name.endswith(".scales") or dtype not in _HALF or way == "0":
                continue
            layer = name[: -len(".scales")]
            spec = next((v for k, v in quant.items() if isinstance(v, dict)
                         and (layer == k or layer.endswith("." + k) or k.endswith("." + layer))),
                        quant)
            bits, group = spec.get("bits"), spec.get("group_size")
            if bits in (4, 8) and group in (32, 64, 128) and spec.get("mode", "affine") == "affine":
                out.append(("rows", (dtype, str(bits), str(group))))
        if way == "all":
            dense = [dtypes[n] for n in dtypes if n.endswith(".weight")
                     and _linear_name(n[: -len(".weight")].rsplit(".", 1)[-1])
                     and n[: -len("weight")] + "scales" not in dtypes]
            out += [("rows", (d, "0", "32")) for d in dict.fromkeys(dense) if d in _HALF]
            heads = text.get("num_attention_heads")
            d = text.get("head_dim") or (text["hidden_size"] // heads if heads else None)
            if act in _HALF and isinstance(d, int) and d % 32 == 0 and d <= 256 and any(
                    "self_attn.q_proj" in n for n in dtypes):
                out.append(("rows_attention", (act, str(d))))
        if gdn_on and any(n.endswith("linear_attn.A_log") for n in dtypes):
            out += _gdn_recipe(act, int(text["linear_key_head_dim"]),
                               int(text["linear_value_head_dim"]),
                               int(text["linear_num_key_heads"]),
                               int(text["linear_num_value_heads"]))
        return list(dict.fromkeys(out))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return []


def _recipes(sources: list[str], activations: list[str], books: list[str],
             gdn: tuple[str, str, str] | None) -> list[Recipe]:
    """The recipes (:func:`recipes_for`) from a pair's dtype names: ``sources`` the target
    embedding's arrays (weight, then scales), ``activations`` each model's activation dtype
    (the target's first), ``books`` each DFlash2 drafter's codebook dtype, ``gdn`` the
    target's first Gated DeltaNet layer's ``(A_log, activation, dt_bias)`` dtypes or None."""
    out: list[Recipe] = []
    for src in sources:
        out += [("gather", (src, "int32")), ("gather", (src, "uint32"))]
    out.append(("gather", ("uint32", "uint32")))
    for dt in activations:
        out += [("silu", (dt,)), ("swiglu", (dt,))]
    for book in books:
        out += [("gather_axis", ("float32", "uint32")), ("gather_axis", ("uint32", "uint32")),
                ("gather_axis", ("float32", "int32")), ("gather_axis", ("int32", "int32")),
                ("gather", ("float32", "uint32")),
                ("gather2", ("int32", "uint32")), ("gather", (book, "uint32")),
                ("gather", (book, "int32"))]
    if gdn is not None:
        out.append(("precise_swiglu", (gdn[1],)))
        out.append(("compute_g", gdn))
    return list(dict.fromkeys(out))


_SAFETENSORS_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32",
                       "F64": "float64", "U8": "uint8", "U16": "uint16", "U32": "uint32",
                       "U64": "uint64", "I8": "int8", "I16": "int16", "I32": "int32",
                       "I64": "int64", "BOOL": "bool_"}
"""Safetensors header dtype codes -> ``mlx.core`` dtype names."""


def tensor_dtypes(folder: str | Path, _backbone: bool = False) -> dict[str, str]:
    """Tensor name -> ``mlx.core`` dtype name of every ``*.safetensors`` file in ``folder``,
    read from the files' JSON headers only (the first 8 bytes give the header's length, a
    little-endian u64; format: huggingface/safetensors). Also the weights of a DFlash2
    adapter's backbone (``config.json``'s ``dflash_backbone``), the folder's own first.
    Unreadable files and unknown codes are skipped: never raises."""
    folder = Path(folder)
    out: dict[str, str] = {}
    for f in sorted(folder.glob("*.safetensors")):
        try:
            with open(f, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(size)) if 0 < size < 1 << 27 else {}
        except (OSError, ValueError):
            continue
        for name, meta in header.items():
            code = meta.get("dtype") if isinstance(meta, dict) else None
            if code in _SAFETENSORS_DTYPES:
                out.setdefault(name, _SAFETENSORS_DTYPES[code])
    try:
        backbone = json.loads((folder / "config.json").read_text()).get("dflash_backbone")
    except (OSError, ValueError, AttributeError):
        backbone = None
    if isinstance(backbone, str) and backbone and not _backbone:  # one level, as the loader
        for name, dtype in tensor_dtypes(folder / backbone, _backbone=True).items():
            out.setdefault(name, dtype)
    return out


def _files_activation_dtype(dtypes: dict[str, str]) -> str:
    """:func:`activation_dtype` read from a checkpoint's tensor dtypes: the final norm's
    (``norm.weight`` outside the layers), else an unquantized embedding's, else the first
    floating tensor's (by name), else float32."""
    norms = sorted((n for n in dtypes if (n == "norm.weight" or n.endswith(".norm.weight"))
                    and ".layers." not in n and not n.startswith("layers.")), key=len)
    if norms:
        return dtypes[norms[0]]
    embeds = sorted((n for n in dtypes if n.endswith("embed_tokens.weight")), key=len)
    if embeds and not any(n.endswith("embed_tokens.scales") for n in dtypes):
        return dtypes[embeds[0]]
    floats = [dtypes[n] for n in sorted(dtypes) if dtypes[n].startswith(("float", "bfloat"))]
    return floats[0] if floats else "float32"


def recipes_from_files(target_folder: str | Path, drafter_folders: list | tuple = ()
                       ) -> list[Recipe]:
    """:func:`recipes_for` predicted from the checkpoints' files, before anything is loaded
    (their ``safetensors`` headers: :func:`tensor_dtypes`), for a GPU load that keeps the
    checkpoint dtypes. What :func:`start_early` starts building while the target loads
    (from the same headers, each read once there); a wrong prediction only costs a child's
    time, since the warm-up builds whatever the recipes missed. Never raises (unreadable
    folders give fewer recipes)."""
    return _recipes_from_dtypes(tensor_dtypes(target_folder),
                                [tensor_dtypes(f) for f in drafter_folders if f])


def _recipes_from_dtypes(dtypes: dict[str, str], drafters: list[dict[str, str] | None]
                         ) -> list[Recipe]:
    """:func:`recipes_from_files` from headers already read (:func:`tensor_dtypes`):
    ``dtypes`` the target's, ``drafters`` each drafter's (None entries skipped)."""
    drafters = [d for d in drafters if d is not None]
    embeds = sorted((n for n in dtypes if n.endswith("embed_tokens.weight")), key=len)
    sources = []
    if embeds:
        scales = embeds[0][: -len("weight")] + "scales"
        sources = [dtypes[n] for n in (embeds[0], scales) if n in dtypes]
    books = [d["candidate_selector.predecessor_codebook"] for d in drafters
             if "candidate_selector.predecessor_codebook" in d]

    def layer_of(name: str) -> int:
        digits = name.split(".layers.", 1)[-1].split(".", 1)[0]
        return int(digits) if digits.isdigit() else 1 << 30

    logs = sorted((n for n in dtypes if n.endswith("linear_attn.A_log")), key=layer_of)
    act = _files_activation_dtype(dtypes)
    gdn = None
    if logs:
        bias = logs[0][: -len("A_log")] + "dt_bias"
        gdn = (dtypes[logs[0]], act, dtypes.get(bias, dtypes[logs[0]]))
    return _recipes(sources, [act] + [_files_activation_dtype(d) for d in drafters], books,
                    gdn)


def _mlx_lm_file(name: str) -> ModuleType:
    """``mlx_lm/models/<name>.py`` loaded by path: the two files used here import only
    ``mlx``, and importing them as ``mlx_lm.models.<name>`` would first run ``mlx_lm``'s
    ``__init__`` (which imports transformers: about 2 s)."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mlx_lm is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / f"{name}.py"
    mod_spec = importlib.util.spec_from_file_location(f"_dflash_prebuild_{name}", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def models_without_package_init() -> None:
    """Make ``mlx_lm.models.<file>`` importable without running ``mlx_lm``'s ``__init__``
    (which imports transformers, and with it PyTorch where installed: 15-20 s a child on a GPU
    host): empty stand-ins for the packages ``mlx_lm`` and ``mlx_lm.models`` whose search
    paths are the real folders, so that a model file (``cache``, ``gated_delta``: they import
    only ``mlx`` and each other) loads as itself. For the child processes only (the project's
    kernel modules import those files); does nothing where ``mlx_lm`` is imported already or
    not installed."""
    import types

    if "mlx_lm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return
    root = Path(list(spec.submodule_search_locations)[0])
    for name, folder in (("mlx_lm", root), ("mlx_lm.models", root / "models")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        package.__spec__.submodule_search_locations = [str(folder)]
        sys.modules[name] = package


def run_recipe(kind: str, dtypes: tuple[str, ...] | list[str]) -> None:
    """Run one recipe on MLX's default device and wait for it (in a child process).

    Raises:
        KeyError: an unknown kind; AttributeError: an unknown dtype name.
    """
    import mlx.core as mx
    import mlx.nn as nn

    if kind in CUSTOM:
        _build_custom(kind, dtypes)
        return
    dt = [getattr(mx, d) for d in dtypes]

    def arr(shape, dtype):
        return mx.ones(shape, dtype=dtype)

    if kind == "gather":
        out = [arr((8, 4), dt[0])[mx.array([[1, 2]], dtype=dt[1])]]
    elif kind == "gather2":
        i, j = mx.array([0, 1], dtype=dt[1]), mx.array([1, 2], dtype=dt[1])
        out = [arr((4, 4), dt[0])[i, j]]
    elif kind == "gather_axis":
        out = [mx.take_along_axis(arr((2, 8), dt[0]), mx.zeros((2, 4), dtype=dt[1]), axis=-1)]
    elif kind == "silu":
        out = [nn.silu(arr((1, 2, 8), dt[0]))]
    elif kind == "swiglu":
        out = [_mlx_lm_file("activations").swiglu(arr((1, 2, 8), dt[0]), arr((1, 2, 8), dt[0]))]
    elif kind == "precise_swiglu":
        x = [arr((1, 2, 2, 8), dt[0]) for _ in range(3)]
        out = [_mlx_lm_file("activations").precise_swiglu(*x)]
    elif kind == "compute_g":
        out = [_mlx_lm_file("gated_delta").compute_g(arr((4,), dt[0]), arr((1, 2, 4), dt[1]),
                                                     arr((4,), dt[2]))]
    else:
        raise KeyError(f"unknown kernel recipe {kind!r}; known: {', '.join(RECIPES)}")
    mx.eval(out)


def _build_custom(kind: str, args: tuple[str, ...] | list[str]) -> None:
    """Compile a :data:`CUSTOM` recipe's kernel instance into MLX's cache folder
    (:func:`app.engine.kernels.custom_cache.build`; nothing runs on the GPU).

    Raises:
        CompileError: the instance could not be built that way (MLX then compiles it where
            it runs); KeyError, AttributeError, ValueError: a malformed recipe.
    """
    import mlx.core as mx

    from app.engine.kernels import custom_cache, gdn_kernel, row_attention, row_products

    dtype = getattr(mx, args[0])
    ints = [int(a) for a in args[1:]]
    if kind == "rows":
        kernel, call = row_products.instance_call(dtype, *ints)
    elif kind == "rows_attention":
        kernel, call = row_attention.instance_call(dtype, *ints)
    elif kind == "gdn":
        kernel, call = gdn_kernel.instance_call(dtype, *ints)
    else:
        raise KeyError(f"unknown custom kernel recipe {kind!r}")
    custom_cache.build(kernel, ptx_cache_dir(), **call)


@dataclass
class PrebuildReport:
    """What a prebuild did: wall seconds from :func:`start` to the end of :meth:`Prebuild.
    wait`, the processes run, the recipes given, and ``failed``: one line per process that
    exited non-zero or timed out (with the end of its stderr), and per error of the build's
    own part of the warm-up (``app.engine.warmup``)."""

    seconds: float
    processes: int
    recipes: list[Recipe]
    failed: list[str] = field(default_factory=list)
    #: recipes handed to :func:`start_background` afterwards (not waited for)
    background: list[Recipe] = field(default_factory=list)


@dataclass
class Prebuild:
    """Child processes started by :func:`start`; :meth:`wait` collects them."""

    started: float
    groups: list[list[Recipe]]
    procs: list[subprocess.Popen]

    def wait(self, timeout_s: float = 180.0) -> PrebuildReport:
        """Wait for every child (killing those still running after ``timeout_s`` seconds
        from the start; a killed child has published nothing). Never raises for a failed
        child: it is listed in ``failed``."""
        failed = []
        for group, proc in zip(self.groups, self.procs):
            left = max(0.1, timeout_s - (time.perf_counter() - self.started))
            try:
                _, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                failed.append(f"{group}: timed out after {timeout_s:.0f} s")
                continue
            if proc.returncode:
                tail = (err or b"").decode(errors="replace").strip().splitlines()[-1:]
                failed.append(f"{group}: exit {proc.returncode} {' '.join(tail)}")
        recipes = [r for g in self.groups for r in g]
        return PrebuildReport(time.perf_counter() - self.started, len(self.procs), recipes,
                              failed)

    def children_for(self, recipes: list[Recipe] | set[Recipe]) -> list[subprocess.Popen]:
        """The children still running whose group holds one of ``recipes``."""
        wanted = set(recipes)
        return [proc for group, proc in zip(self.groups, self.procs)
                if proc.poll() is None and wanted & set(group)]

    def running(self) -> set[Recipe]:
        """The recipes of the children still running."""
        return {r for group, proc in zip(self.groups, self.procs) if proc.poll() is None
                for r in group}


def split(recipes: list[Recipe], workers: int) -> list[list[Recipe]]:
    """Deal ``recipes`` to at most ``workers`` groups, slow (fused) kinds first, each to the
    group with the least estimated work (fused 2, gather 1). Empty groups are dropped."""
    groups: list[list[Recipe]] = [[] for _ in range(max(1, workers))]
    load = [0] * len(groups)
    for r in sorted(recipes, key=lambda r: r[0] not in _SLOW):
        i = load.index(min(load))
        groups[i].append(r)
        load[i] += 2 if r[0] in _SLOW else 1
    return [g for g in groups if g]


def default_workers() -> int:
    """How many children :func:`start` runs at most: the cores this process may use less
    one (for its own work meanwhile), at most 12 (each child holds a CUDA context, a few
    hundred MB of GPU memory, until it exits), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 2
    return max(1, min(12, cpus - 1))


def start(recipes: list[Recipe], workers: int | None = None, stderr: Any = subprocess.PIPE
          ) -> Prebuild:
    """Start child processes that run ``recipes`` (see :func:`split`; ``workers`` defaults
    to :func:`default_workers`). They inherit the environment, so they write to the same
    kernel cache as this process. Returns at once.

    Raises:
        OSError: the interpreter could not be started.
    """
    groups = split(recipes, workers or default_workers())
    t0 = time.perf_counter()
    procs: list[subprocess.Popen] = []
    try:
        for g in groups:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "app.engine.kernels.kernel_prebuild", json.dumps(g)],
                stdout=subprocess.DEVNULL, stderr=stderr, env=os.environ.copy()))
    except OSError:
        for proc in procs:  # none left behind unwaited
            proc.kill()
            proc.communicate()
        raise
    return Prebuild(t0, groups, procs)


#: Jobs started by :func:`start_background` whose children may still run.
_BACKGROUND: list[Prebuild] = []


def start_background(recipes: list[Recipe], workers: int | None = None) -> Prebuild:
    """:func:`start`, without waiting and with the children's stderr discarded (nothing
    reads it): the job is kept until :func:`reap_background` (called here and by the warm-up)
    finds all its children done. Returns the job.

    Raises:
        OSError: the interpreter could not be started.
    """
    reap_background()
    job = start(recipes, workers, stderr=subprocess.DEVNULL)
    _BACKGROUND.append(job)
    return job


def background_running() -> bool:
    """True while children of :func:`start_background` still run (their cores are busy)."""
    reap_background()
    return bool(_BACKGROUND)


BACKGROUND_WAIT_S = 30.0
"""Seconds :func:`wait_background_for` waits at most for children still building (about 8 s
on a fresh H100 host); past that they are stopped and the run builds what they left."""


def wait_background_for(recipes: list[Recipe], most_s: float = BACKGROUND_WAIT_S) -> float:
    """Wait for the background children (:func:`start_background`) building one of
    ``recipes``, and only those (the other children of their jobs go on): a run that needs
    those kernels would otherwise compile them itself, one after another, while the children
    compile them side by side (on a fresh H100 the first DFlash2 reply after the warm-up took
    12.7-13.4 s that way, 8.4-9.4 s waiting). Children still running after ``most_s`` seconds
    are stopped (what they had not published, the run builds). Returns the seconds waited
    (0.0 when no such child runs). Never raises."""
    children = children_building(recipes)
    t0 = time.perf_counter()
    for proc in children:
        try:
            proc.communicate(timeout=max(0.0, most_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    reap_background()
    return time.perf_counter() - t0 if children else 0.0


def children_building(recipes: list[Recipe]) -> list[subprocess.Popen]:
    """The background children (:func:`start_background`) still running that build one of
    ``recipes``."""
    reap_background()
    return [proc for job in _BACKGROUND for proc in job.children_for(recipes)]


def building() -> set[Recipe]:
    """The recipes of background children (:func:`start_background`) still running (a
    finished child has recorded its own: :func:`built_before`)."""
    reap_background()
    return {r for job in _BACKGROUND for r in job.running()}


def start_early(target_folder: str | Path, drafter_folders: list | tuple = ()
                ) -> Prebuild | None:
    """Start building, in background children, the kernels the checkpoints in these folders
    will need (:func:`recipes_from_files`) and that no earlier start recorded, before the
    target is loaded: the load (and the ``transformers`` import inside it, ~3 s on a fresh
    H100 host) then runs while they compile, and the warm-up (``app.engine.warmup``) waits
    for them instead of starting its own. The first drafter's recipes (and the target's) go
    to children of their own, with two thirds of the workers, the other drafters' to the
    rest: the warm-up, which needs only the first, then waits for none of the others'
    children (:func:`wait_background_for` waits child by child). Only on MLX's CUDA backend
    with the prebuild :func:`enabled`; sets the kernel cache folder first
    (:func:`app.engine.device.configure_cuda_kernel_cache`). Returns the first job started,
    or None where nothing was started. Never raises."""
    try:
        from app.engine.device import backend, configure_cuda_kernel_cache

        if backend() != "CUDA" or not enabled():
            return None
        configure_cuda_kernel_cache()
        done = building() | built_before()
        target = tensor_dtypes(target_folder)  # each folder's headers read once
        drafters = [tensor_dtypes(f) if f else None for f in drafter_folders]
        first = [r for r in _recipes_from_dtypes(target, drafters[:1]) if r not in done]
        rest = [r for r in _recipes_from_dtypes(target, drafters)
                if r not in done and r not in first]
        workers = default_workers()
        later = min(len(rest), max(1, workers // 3))
        job = start_background(first, max(1, workers - later)) if first else None
        if rest:
            other = start_background(rest, later)
            job = job or other
        # then the custom kernels, one child each (the warm-up's first passes wait for
        # them): asking which are on imports mlx-lm, and with it transformers (~3 s), which
        # the load imports next anyway, so only after the others have started
        custom = [r for r in custom_recipes_from_files(target_folder, target) if r not in done]
        if custom:
            mine = start_background(custom, len(custom))
            job = job or mine
        return job
    except Exception:  # an aid only: the warm-up builds what this did not start
        return None


def reap_background() -> None:
    """Forget the background jobs whose children have all exited (``poll`` reaps them)."""
    _BACKGROUND[:] = [job for job in _BACKGROUND if any(p.poll() is None for p in job.procs)]


def main(argv: list[str] | None = None) -> int:
    """Child entry: run the recipes given as one JSON list of ``[kind, [dtype, ...]]``.

    MLX writes what it compiles to a private folder inside the shared cache folder (set
    before its first compile in this process); the modules are then published whole
    (:func:`publish`) and the recipes recorded (:func:`mark_built`), so that no reader, and
    no later start, ever sees a module half written by a child that was killed or is still
    writing."""
    argv = sys.argv[1:] if argv is None else argv
    recipes = [(kind, tuple(dtypes)) for kind, dtypes in json.loads(argv[0])]
    shared = ptx_cache_dir()
    private = shared / f".prebuild-{os.getpid()}"
    private.mkdir(parents=True, exist_ok=True)
    os.environ["MLX_PTX_CACHE_DIR"] = str(private)
    models_without_package_init()
    try:
        for kind, dtypes in recipes:
            run_recipe(kind, dtypes)
        publish(private, shared)
        mark_built(recipes, shared)
    finally:
        for f in private.iterdir():
            f.unlink()
        private.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
