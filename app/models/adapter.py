"""DFlash2 drafters stored as an adapter on a DFlash drafter's backbone (an app-side extension
of z-lab's ``DFlash2DraftModel`` layout).

A DFlash2 drafter is the DFlash backbone (``fc``, ``hidden_norm``, the decoder layers, ``norm``)
plus the per-layer convolutions and the ``candidate_selector``. When the backbone was kept frozen
at a DFlash drafter's weights during training, those tensors are byte for byte the DFlash
drafter's, and storing them twice costs the whole backbone. An **adapter** folder holds the
DFlash2 ``config.json`` with one extra key, :data:`BACKBONE_KEY`::

    "dflash_backbone": "../demo-dflash"

(a folder path, relative to the adapter folder unless absolute) and a ``model.safetensors``
with only the tensors that differ from that folder's (the convolutions and the selector). The
loader (:func:`app.models.loader.load_drafter`) reads the backbone folder's ``*.safetensors``
and fills in every tensor the adapter lacks (:func:`merge_backbone`); a full checkpoint (no such
key) loads as before. :func:`write_adapter` makes an adapter from a full export.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from app.engine.errors import ModelLoadError

BACKBONE_KEY = "dflash_backbone"
"""The ``config.json`` key naming the folder whose tensors supply the backbone."""


def backbone_folder(folder: Path, config: dict) -> Path | None:
    """The backbone folder an adapter's ``config`` names (resolved against ``folder``), or
    None for a full checkpoint.

    Raises:
        ModelLoadError: the key is not a non-empty string, or names no folder (the message
            names the path).
    """
    ref = config.get(BACKBONE_KEY)
    if ref is None:
        return None
    if not isinstance(ref, str) or not ref.strip():
        raise ModelLoadError(
            f"{Path(folder) / 'config.json'}: {BACKBONE_KEY} is {ref!r}, not a folder path"
        )
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = Path(folder) / path
    path = path.resolve()
    if not path.is_dir():
        raise ModelLoadError(
            f"{Path(folder).name}: the backbone folder {path} named by {BACKBONE_KEY} "
            "does not exist"
        )
    return path


def read_tensors(folder: Path) -> dict[str, Any]:
    """Every tensor of ``folder``'s ``*.safetensors`` files (``mlx.core.load``), ``model.``
    prefixes kept.

    Raises:
        ModelLoadError: no safetensors file, or one that cannot be read (named).
    """
    import mlx.core as mx

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no model.safetensors")
    weights: dict[str, Any] = {}
    for f in files:
        try:
            weights.update(mx.load(str(f)))
        except Exception as exc:
            raise ModelLoadError(f"{f} is not a readable safetensors file: {exc}") from exc
    return weights


def merge_backbone(folder: Path, config: dict, weights: dict[str, Any],
                   shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The adapter's ``weights`` completed from its backbone folder (unchanged for a full
    checkpoint).

    Args:
        folder: the adapter folder; config: its parsed ``config.json``.
        weights: its tensors, ``model.`` prefixes already removed.
        shapes: every tensor the config implies, name -> shape
            (:func:`app.engine.dflash2.expected_shapes`).

    Each expected tensor the adapter lacks comes from the backbone; the adapter's own tensors
    win. A backbone tensor of the wrong shape is refused here, naming the backbone folder.

    Raises:
        ModelLoadError: the backbone folder is missing or unreadable, a needed tensor is in
            neither folder, or a backbone tensor does not fit the adapter's config.
    """
    backbone = backbone_folder(folder, config)
    if backbone is None:
        return weights
    if backbone == Path(folder).resolve():
        raise ModelLoadError(f"{Path(folder).name}: {BACKBONE_KEY} names the adapter itself")
    base = {k.removeprefix("model."): v for k, v in read_tensors(backbone).items()}
    merged = dict(weights)
    for name, shape in shapes.items():
        if name in merged:
            continue
        if name not in base:
            raise ModelLoadError(
                f"{Path(folder).name}: the tensor {name} is neither in the adapter nor in its "
                f"backbone folder {backbone}"
            )
        if tuple(base[name].shape) != shape:
            raise ModelLoadError(
                f"{Path(folder).name}: the backbone folder {backbone} does not fit: its tensor "
                f"{name} has shape {tuple(base[name].shape)}, the adapter's config.json "
                f"expects {shape}"
            )
        merged[name] = base[name]
    return merged


def write_adapter(full: Path, backbone: Path, out: Path, ref: str | None = None) -> dict:
    """Write an adapter of the full DFlash2 export ``full`` on ``backbone`` into ``out``.

    The adapter keeps every tensor of ``full`` that ``backbone`` lacks or holds with other
    bytes (dtype, shape or value), so the merge gives back ``full``'s tensors exactly; its
    ``config.json`` is ``full``'s plus ``"dflash_backbone": ref`` (default: ``backbone``
    relative to ``out``). Other files of ``full`` (e.g. ``train_log.json``) are copied.

    Returns ``{"kept": [names], "shared": n, "bytes": size of the adapter's safetensors}``.

    Raises:
        ModelLoadError: a folder lacks config.json or safetensors.
    """
    import os

    import numpy as np
    from safetensors.numpy import load_file, save_file

    full, backbone, out = Path(full), Path(backbone), Path(out)
    cfg_path = full / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{full} has no config.json")

    def load(folder: Path) -> dict[str, np.ndarray]:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{folder} has no model.safetensors")
        d: dict[str, np.ndarray] = {}
        for f in files:
            d.update(load_file(str(f)))
        return d

    mine, base = load(full), load(backbone)
    kept = {k: v for k, v in mine.items()
            if k not in base or base[k].dtype != v.dtype or base[k].shape != v.shape
            or base[k].tobytes() != v.tobytes()}
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg[BACKBONE_KEY] = ref if ref is not None else os.path.relpath(backbone.resolve(),
                                                                    out.resolve())
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    for f in full.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copyfile(f, out / f.name)
    return {"kept": sorted(kept), "shared": len(mine) - len(kept),
            "bytes": (out / "model.safetensors").stat().st_size}
