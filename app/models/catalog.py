"""The model manager core: find targets and DFlash drafters, pair them, estimate memory.

Qt-free and MLX-free: this module only reads ``config.json`` files, file sizes and the
Hugging Face cache index (``huggingface_hub.scan_cache_dir``), so the GUI thread may call it.
Models come from three sources:

* ``bundled``: the demo pair shipped in ``resources/models`` (:func:`app.paths.demo_pair_dirs`);
* ``folder``: folders the user added, persisted as JSON in
  ``app.paths.default_data_dir() / "model_folders.json"``; a folder is either a model itself
  (it holds ``config.json``) or holds model folders one level down;
* ``cache``: every model repo in the local Hugging Face cache (``HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, read at call time).

A folder is a *drafter* when ``config.json`` has ``architectures`` containing
``DFlashDraftModel`` or ``DFlash2DraftModel`` (:func:`drafter_kind`: ``"dflash"`` /
``"dflash2"``; a DFlash2 adapter whose ``dflash_backbone`` folder is missing is skipped); it is a *target* when its ``model_type`` has a model module in the
installed mlx-lm (``mlx_lm/models/<type>.py``, after mlx-lm's ``MODEL_REMAPPING``). Both need at
least one ``*.safetensors`` file. Anything else is reported in :attr:`CatalogScan.skipped`.

``python -m app models [--json]`` prints the scan (see :func:`register`).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from app.engine.errors import EngineError, ModelLoadError, ModelNotFoundError, PairMismatchError

log = logging.getLogger(__name__)

Source = Literal["bundled", "folder", "cache"]
Kind = Literal["target", "drafter"]

DRAFTER_ARCHITECTURE = "DFlashDraftModel"
"""The ``architectures`` entry of z-lab DFlash drafters (``shared/DFLASH_NOTES.md``)."""

DRAFTER2_ARCHITECTURE = "DFlash2DraftModel"
"""The ``architectures`` entry of z-lab DFlash2 drafters (``app.engine.dflash2``)."""

MEMORY_WARN_FRACTION = 0.75
"""Warn before loading when the estimate exceeds this share of the machine's memory."""

FOLDERS_FILE = "model_folders.json"
FOLDER_GONE = "folder no longer exists"
"""The skipped reason of an added folder that was deleted since (still in the list)."""


# --------------------------------------------------------------------------------------------
# Known pairs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownPair:
    """A published target + DFlash drafter pair.

    Attributes:
        target_repo, drafter_repo: Hugging Face repo ids.
        download_gb: approximate download of both repos together, in GB (10^9 bytes); estimated
            from parameter counts (4-bit target, bf16 drafter). The exact figure comes from the
            hub's file list when a download is planned (:func:`app.models.download.plan_download`).
        block_size: recommended DFlash block size (the drafter's trained block size).
        thinking: chat-template thinking setting the drafter was trained with (Qwen3.5/3.6
            drafters: on; Qwen3 ``-b16`` drafters: off), per ``shared/DFLASH_NOTES.md``.
    """

    target_repo: str
    drafter_repo: str
    download_gb: float
    block_size: int
    thinking: bool

    @property
    def label(self) -> str:
        """Short display name, e.g. ``Qwen3.5-4B``."""
        return self.drafter_repo.split("/", 1)[1].replace("-DFlash-b16", "").replace("-DFlash", "")


KNOWN_PAIRS: tuple[KnownPair, ...] = (
    KnownPair("mlx-community/Qwen3.5-4B-4bit", "z-lab/Qwen3.5-4B-DFlash", 4.2, 16, True),
    KnownPair("mlx-community/Qwen3.5-9B-4bit", "z-lab/Qwen3.5-9B-DFlash", 7.5, 16, True),
    KnownPair("mlx-community/Qwen3.5-27B-4bit", "z-lab/Qwen3.5-27B-DFlash", 18.5, 16, True),
    KnownPair("mlx-community/Qwen3.5-35B-A3B-4bit", "z-lab/Qwen3.5-35B-A3B-DFlash", 21.0, 16, True),
    KnownPair("mlx-community/Qwen3.6-35B-A3B-4bit", "z-lab/Qwen3.6-35B-A3B-DFlash", 21.0, 16, True),
    KnownPair("mlx-community/Qwen3-4B-4bit", "z-lab/Qwen3-4B-DFlash-b16", 3.3, 16, False),
    KnownPair("mlx-community/Qwen3-8B-4bit", "z-lab/Qwen3-8B-DFlash-b16", 6.7, 16, False),
)
"""Published pairs (target repo names as on mlx-community, drafters as on z-lab)."""


def known_pair_for(repo_id: str | None) -> KnownPair | None:
    """The known pair whose target or drafter repo is ``repo_id`` (case-insensitive), or None."""
    if not repo_id:
        return None
    low = repo_id.lower()
    for pair in KNOWN_PAIRS:
        if low in (pair.target_repo.lower(), pair.drafter_repo.lower()):
            return pair
    return None


# --------------------------------------------------------------------------------------------
# Config reading
# --------------------------------------------------------------------------------------------


def read_config(folder: Path) -> dict:
    """``folder/config.json`` as a dict (the one reader: the loader and the catalog use it).

    Raises:
        ModelNotFoundError: the folder does not exist.
        ModelLoadError: it has no ``config.json``, or that is not a readable JSON object.
    """
    path = Path(folder) / "config.json"
    if not Path(folder).is_dir():
        raise ModelNotFoundError(f"{folder} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"{folder} has no config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def text_config(config: dict) -> dict:
    """The language-model fields of a target config.

    Multimodal configs (Qwen3.5/3.6 as published) keep them under ``text_config``; its keys win
    over the top level, as in mlx-lm's ``qwen3_5.ModelArgs.from_dict``.
    """
    inner = config.get("text_config")
    if isinstance(inner, dict):
        return {**config, **inner}
    return config


def is_drafter_config(config: dict) -> bool:
    """True when ``architectures`` names ``DFlashDraftModel`` or ``DFlash2DraftModel``."""
    return drafter_kind(config) is not None


def drafter_kind(config: dict) -> str | None:
    """``"dflash2"`` when ``architectures`` names ``DFlash2DraftModel``, ``"dflash"`` when it
    names ``DFlashDraftModel``, else None."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        return None
    if DRAFTER2_ARCHITECTURE in archs:
        return "dflash2"
    return "dflash" if DRAFTER_ARCHITECTURE in archs else None


def drafter_fields(config: dict) -> dict:
    """The DFlash fields of a drafter config, wherever the checkpoint stored them.

    Returns a dict with ``block_size``, ``mask_token_id``, ``target_layer_ids`` (list of int or
    None), ``num_target_layers``, ``vocab_size``, ``hidden_size`` (None when absent). Newer
    configs keep the first three under ``dflash_config``; older ones at the top level
    (``shared/DFLASH_NOTES.md``, "Checkpoint format").
    """
    inner = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}

    def pick(key: str):
        return inner.get(key, config.get(key))

    taps = pick("target_layer_ids")
    return {
        "block_size": pick("block_size"),
        "mask_token_id": pick("mask_token_id"),
        "target_layer_ids": list(taps) if isinstance(taps, list) else None,
        "num_target_layers": pick("num_target_layers"),
        "vocab_size": config.get("vocab_size"),
        "hidden_size": config.get("hidden_size"),
    }


DRAFTER_DEFAULTS = {"block_size": 16, "rope_theta": 1_000_000.0}
"""What a DFlash drafter config gets when it leaves a field out (``app.engine.drafter``)."""


def drafter_defaults_used(config: dict) -> list[str]:
    """One sentence per :data:`DRAFTER_DEFAULTS` field the drafter ``config`` lacks, naming the
    default the loader uses instead (``rope_theta`` may also sit in ``rope_parameters``)."""
    out = []
    if drafter_fields(config)["block_size"] is None:
        out.append(f"the drafter config has no block_size; the default "
                   f"{DRAFTER_DEFAULTS['block_size']} is used")
    rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) \
        else {}
    if "rope_theta" not in config and "rope_theta" not in rope:
        out.append(f"the drafter config has no rope_theta; the default "
                   f"{DRAFTER_DEFAULTS['rope_theta']:g} is used")
    return out


def warn_drafter_defaults(folder: Path | str) -> list[str]:
    """Log a warning for each default :func:`drafter_defaults_used` finds in
    ``folder/config.json`` (nothing when the file cannot be read: loading reports that);
    returns the sentences."""
    try:
        notes = drafter_defaults_used(read_config(Path(folder)))
    except (ModelNotFoundError, ModelLoadError):
        return []
    for note in notes:
        log.warning("%s (%s)", note, folder)
    return notes


def check_pair_configs(target_config: dict, drafter_config: dict) -> None:
    """Config-level check that a DFlash drafter was made for a target.

    Compares, in this order: ``vocab_size``, ``hidden_size`` (the drafter embeds with the
    target's table and reads its hidden states), ``num_target_layers`` (when the drafter
    states it), ``target_layer_ids`` (every tap in ``0..num_hidden_layers-1``), and
    ``mask_token_id`` (inside the vocabulary). A field missing from either side is skipped.

    Raises:
        PairMismatchError: naming the first field that differs, with both values.
    """
    tc = text_config(target_config)
    d = drafter_fields(drafter_config)
    n_layers = tc.get("num_hidden_layers")
    for name in ("vocab_size", "hidden_size"):
        tv, dv = tc.get(name), d[name]
        if tv is not None and dv is not None and tv != dv:
            raise PairMismatchError(name, tv, dv)
    if n_layers is not None and d["num_target_layers"] is not None:
        if d["num_target_layers"] != n_layers:
            raise PairMismatchError("num_target_layers", n_layers, d["num_target_layers"])
    taps = d["target_layer_ids"]
    if n_layers is not None and taps is not None:
        bad = [t for t in taps if not isinstance(t, int) or t < 0 or t >= n_layers]
        if bad:
            raise PairMismatchError(
                "target_layer_ids",
                n_layers,
                taps,
                f"drafter does not fit the target: it taps target layer {bad[0]} "
                f"(target_layer_ids {taps}), outside the target's {n_layers} layers "
                f"(0..{n_layers - 1})",
            )
    vocab = tc.get("vocab_size")
    mask = d["mask_token_id"]
    if vocab is not None and isinstance(mask, int) and not 0 <= mask < vocab:
        raise PairMismatchError(
            "mask_token_id",
            vocab,
            mask,
            f"drafter does not fit the target: mask_token_id {mask} is outside the "
            f"target's vocabulary of {vocab}",
        )


@lru_cache(maxsize=1)
def _mlx_lm_models() -> tuple[frozenset[str], dict[str, str]]:
    """Model types with a module in the installed mlx-lm, and its ``MODEL_REMAPPING``.

    Found without importing mlx-lm (which imports mlx): the package is located with
    ``importlib.util.find_spec`` and ``MODEL_REMAPPING`` is read from ``utils.py`` with ``ast``.
    """
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return frozenset(), {}
    root = Path(next(iter(spec.submodule_search_locations)))
    types = frozenset(p.stem for p in (root / "models").glob("*.py") if not p.stem.startswith("_"))
    remap: dict[str, str] = {}
    try:
        tree = ast.parse((root / "utils.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "MODEL_REMAPPING" for t in node.targets)
            ):
                value = ast.literal_eval(node.value)
                if isinstance(value, dict):
                    remap = {str(k): str(v) for k, v in value.items()}
    except (OSError, SyntaxError, ValueError):
        pass
    return types, remap


def mlx_lm_supports(model_type: str) -> bool:
    """True when the installed mlx-lm has a model module for ``model_type``."""
    types, remap = _mlx_lm_models()
    return remap.get(model_type, model_type) in types


# --------------------------------------------------------------------------------------------
# Entries and scanning
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelEntry:
    """One target or drafter found on disk.

    Attributes:
        kind: ``"target"`` or ``"drafter"``.
        name: repo id (cache), folder name (folder) or ``demo-target``/``demo-dflash`` (bundled).
        path: the folder to load (for the cache: the snapshot folder).
        source: ``"bundled"``, ``"folder"`` or ``"cache"``.
        size_bytes: size on disk in bytes (cache: ``huggingface_hub``'s ``size_on_disk``).
        model_type: ``config.json``'s ``model_type``.
        config: the parsed ``config.json``.
        repo_id, revision: the Hugging Face repo and commit (cache only).
    """

    kind: Kind
    name: str
    path: Path
    source: Source
    size_bytes: int
    model_type: str
    config: dict = field(repr=False, compare=False, hash=False)
    repo_id: str | None = None
    revision: str | None = None

    @property
    def drafter_kind(self) -> str | None:
        """``"dflash"`` or ``"dflash2"`` for a drafter (:func:`drafter_kind`), None for a
        target."""
        return drafter_kind(self.config) if self.kind == "drafter" else None

    @property
    def key(self) -> str:
        """A stable identifier: the resolved path as a string."""
        return str(self.path)

    def to_dict(self) -> dict:
        """JSON-ready summary (no config)."""
        out = {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "model_type": self.model_type,
        }
        if self.repo_id:
            out["repo_id"] = self.repo_id
            out["revision"] = self.revision
        if self.kind == "drafter":
            d = drafter_fields(self.config)
            out["block_size"] = d["block_size"]
            out["drafter_kind"] = self.drafter_kind
        else:
            out["context_length"] = context_length(self.config)
        return out


@dataclass(frozen=True)
class PairCheck:
    """Whether one drafter fits one target; ``field``/``reason`` say why not."""

    drafter: ModelEntry
    fits: bool
    field: str | None = None
    reason: str | None = None


@dataclass
class CatalogScan:
    """The result of one scan: targets, drafters and what was skipped (path, reason)."""

    targets: list[ModelEntry] = field(default_factory=list)
    drafters: list[ModelEntry] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    cache_dir: Path | None = None


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (not at import).

    ``HF_HUB_CACHE`` if set, else ``$HF_HOME/hub``, else ``huggingface_hub``'s default
    (``~/.cache/huggingface/hub``).
    """
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def folder_size(folder: Path) -> int:
    """Bytes on disk of every file under ``folder`` (symlinks followed, each target once)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if ident not in seen:
                seen.add(ident)
                total += st.st_size
    return total


def weights_size(folder: Path) -> int:
    """Bytes of the ``*.safetensors`` files in ``folder`` (symlinks followed)."""
    total = 0
    for p in Path(folder).glob("*.safetensors"):
        try:
            total += p.stat().st_size
        except OSError:
            continue
    return total


def classify(folder: Path) -> tuple[Kind | None, dict | None, str | None]:
    """Classify a model folder: ``(kind, config, None)`` or ``(None, config_or_None, reason)``."""
    try:
        config = read_config(folder)
    except (ModelNotFoundError, ModelLoadError) as exc:
        return None, None, str(exc)
    if not any(Path(folder).glob("*.safetensors")):
        return None, config, "no *.safetensors weights"
    archs = config.get("architectures") or []
    if is_drafter_config(config):
        from app.models.adapter import backbone_folder

        try:
            backbone_folder(Path(folder), config)
        except ModelLoadError as exc:
            return None, config, str(exc)
        return "drafter", config, None
    if any(isinstance(a, str) and "DFlash" in a for a in archs):
        return None, config, f"unsupported drafter architecture {archs}"
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return None, config, "config.json has no model_type"
    if not mlx_lm_supports(model_type):
        return None, config, f"model_type {model_type!r} is not supported by mlx-lm"
    return "target", config, None


def _entry(folder: Path, source: Source, name: str, size: int | None = None, **extra) -> tuple:
    kind, config, reason = classify(folder)
    if kind is None:
        return None, reason
    entry = ModelEntry(
        kind=kind,
        name=name,
        path=Path(folder),
        source=source,
        size_bytes=folder_size(folder) if size is None else size,
        model_type=str(config.get("model_type", "")),
        config=config,
        **extra,
    )
    return entry, None


def _model_dirs(folder: Path) -> list[Path]:
    """``folder`` itself when it holds config.json, else its subfolders that do (sorted)."""
    if (folder / "config.json").is_file():
        return [folder]
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and (p / "config.json").is_file())
    except OSError:
        return []


def _pick_revision(repo) -> Any:
    """The cached revision to use: the one ``main`` points at, else the newest."""
    revisions = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
    for rev in revisions:
        if "main" in rev.refs:
            return rev
    return revisions[0] if revisions else None


class Catalog:
    """Finds models from the bundled pair, user folders and the HF cache; pairs them.

    Args:
        data_dir: where ``model_folders.json`` lives (default :func:`app.paths.default_data_dir`).
        cache_dir: the HF hub cache (default :func:`hf_cache_dir`, read at each scan).
        bundled: ``(target_dir, drafter_dir, ...)`` (default :func:`app.paths.demo_pair_dirs`
            and :func:`app.paths.demo_dflash2_dir`);
            ``()`` for none.

    Not thread-safe; use from one thread (the GUI thread is fine: no MLX).
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        cache_dir: Path | None = None,
        bundled: Iterable[Path] | None = None,
    ):
        from app import paths

        self.data_dir = Path(data_dir) if data_dir is not None else paths.default_data_dir()
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._bundled = list(bundled) if bundled is not None else [
            *paths.demo_pair_dirs(), paths.demo_dflash2_dir()]
        self._folders: list[Path] | None = None
        self.folders_error: str | None = None
        self._scan: CatalogScan | None = None

    # ---- folders -------------------------------------------------------------------------

    @property
    def folders_file(self) -> Path:
        """The JSON file holding the user's folders: ``{"folders": [path, ...]}``."""
        return self.data_dir / FOLDERS_FILE

    def folders(self) -> list[Path]:
        """The user's folders, in the order added. A corrupt file reads as empty and sets
        :attr:`folders_error`; it is kept as ``model_folders.json.bad`` on the next save."""
        if self._folders is None:
            self._folders = []
            path = self.folders_file
            if path.exists():
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    items = data.get("folders") if isinstance(data, dict) else None
                    if not isinstance(items, list):
                        raise ValueError("no 'folders' list")
                    self._folders = [Path(str(p)) for p in items]
                except (OSError, UnicodeDecodeError, ValueError) as exc:
                    self.folders_error = f"could not read {path}: {exc}"
        return list(self._folders)

    def _save_folders(self, folders: list[Path]) -> None:
        path = self.folders_file
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.folders_error and path.exists():
            os.replace(path, path.with_suffix(".json.bad"))
            self.folders_error = None
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"folders": [str(p) for p in folders]}, indent=2), "utf-8")
        os.replace(tmp, path)
        self._folders = list(folders)
        self._scan = None

    def add_folder(self, folder: str | Path) -> list[ModelEntry]:
        """Add a folder (a model, or a folder of models) and return the models found in it.

        Raises:
            ModelNotFoundError: the path is not an existing folder.
            ModelLoadError: no target or drafter was found in it (the message says why).
        """
        folder = Path(folder).expanduser().resolve()
        if not folder.is_dir():
            raise ModelNotFoundError(f"not a folder: {folder}")
        found, reasons = [], []
        for d in _model_dirs(folder):
            entry, reason = _entry(d, "folder", d.name)
            if entry is not None:
                found.append(entry)
            else:
                reasons.append(f"{d.name}: {reason}")
        if not found:
            detail = "; ".join(reasons) if reasons else "no config.json in it or its subfolders"
            raise ModelLoadError(f"no MLX model or DFlash drafter in {folder} ({detail})")
        current = self.folders()
        if folder not in current:
            self._save_folders([*current, folder])
        self._scan = None
        return found

    def remove_folder(self, folder: str | Path) -> bool:
        """Forget a folder (its files stay; it need not exist). ``folder`` is matched as the
        list stores it first (so a row's path always removes that row's folder), else
        expanded and resolved. Returns True when it was in the list."""
        current = self.folders()
        folder = Path(folder)
        if folder not in current:
            folder = folder.expanduser().resolve()
            if folder not in current:
                return False
        self._save_folders([p for p in current if p != folder])
        return True

    def missing_folders(self) -> list[Path]:
        """The user's folders (in the order added) that are not folders on disk now: deleted,
        or on a drive that is not connected. The scan skips them ("folder no longer
        exists"); they stay in the list until removed."""
        return [folder for folder in self.folders() if not folder.is_dir()]

    def folders_holding(self, entry: ModelEntry) -> list[Path]:
        """The user's folders (in the order added) that hold ``entry``'s model, compared by
        real path: also when the scan lists that model from another source (the bundled
        pair, another folder: a path found twice is listed once) or through a link."""
        real = entry.path.resolve()
        return [folder for folder in self.folders() if folder.is_dir()
                and any(d.resolve() == real for d in _model_dirs(folder))]

    # ---- scanning ------------------------------------------------------------------------

    @property
    def cache_dir(self) -> Path:
        """The HF hub cache this catalog scans."""
        return self._cache_dir if self._cache_dir is not None else hf_cache_dir()

    def scan(self, refresh: bool = False) -> CatalogScan:
        """Every target and drafter, bundled first, then folders, then the cache.

        The result is cached until :meth:`refresh`, a folder change or ``refresh=True``.
        A path found twice is listed once (first source wins).
        """
        if self._scan is not None and not refresh:
            return self._scan
        result = CatalogScan(cache_dir=self.cache_dir)
        seen: set[Path] = set()

        def add(entry: ModelEntry | None, where: str, reason: str | None) -> None:
            if entry is None:
                result.skipped.append((where, reason or "unknown"))
                return
            real = entry.path.resolve()
            if real in seen:
                return
            seen.add(real)
            (result.targets if entry.kind == "target" else result.drafters).append(entry)

        for d in self._bundled:
            d = Path(d)
            if (d / "config.json").is_file():
                entry, reason = _entry(d, "bundled", d.name)
                add(entry, str(d), reason)
        for folder in self.folders():
            if not folder.is_dir():
                result.skipped.append((str(folder), FOLDER_GONE))
                continue
            for d in _model_dirs(folder):
                entry, reason = _entry(d, "folder", d.name)
                add(entry, str(d), reason)
        self._scan_cache(result, add)
        self._scan = result
        return result

    def _scan_cache(self, result: CatalogScan, add) -> None:
        cache = self.cache_dir
        if not cache.is_dir():
            return
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound

        try:
            info = scan_cache_dir(cache)
        except (CacheNotFound, OSError) as exc:
            result.skipped.append((str(cache), f"cannot scan the cache: {exc}"))
            return
        for warning in info.warnings:
            result.skipped.append((str(cache), f"corrupted cache entry: {warning}"))
        for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
            if repo.repo_type != "model":
                continue
            rev = _pick_revision(repo)
            if rev is None:
                continue
            if not (rev.snapshot_path / "config.json").exists() and not rev.refs:
                result.skipped.append(
                    (repo.repo_id, "incomplete download (no config.json yet); download it "
                     "again to resume")
                )
                continue
            entry, reason = _entry(
                rev.snapshot_path,
                "cache",
                repo.repo_id,
                size=repo.size_on_disk,
                repo_id=repo.repo_id,
                revision=rev.commit_hash,
            )
            add(entry, repo.repo_id, reason)

    def refresh(self) -> CatalogScan:
        """Scan again (after a download, a deletion or a change on disk)."""
        return self.scan(refresh=True)

    # ---- lookups and pairing ------------------------------------------------------------

    def find(self, name_or_path: str) -> ModelEntry | None:
        """The entry whose name, repo id or path equals ``name_or_path``, else None."""
        scan = self.scan()
        for entry in [*scan.targets, *scan.drafters]:
            if name_or_path in (entry.name, entry.repo_id, str(entry.path)):
                return entry
        try:
            resolved = Path(name_or_path).expanduser().resolve()
        except OSError:
            return None
        for entry in [*scan.targets, *scan.drafters]:
            if entry.path.resolve() == resolved:
                return entry
        return None

    def pair_checks(self, target: ModelEntry) -> list[PairCheck]:
        """Every drafter checked against ``target``: fitting ones first, then the others."""
        check = check_pair_configs
        out = []
        for drafter in self.scan().drafters:
            try:
                check(target.config, drafter.config)
            except PairMismatchError as exc:
                out.append(PairCheck(drafter, False, exc.field, str(exc)))
            except EngineError as exc:  # an unreadable drafter config
                out.append(PairCheck(drafter, False, None, str(exc)))
            else:
                out.append(PairCheck(drafter, True))
        out.sort(key=lambda c: (not c.fits, _preference(target, c.drafter)))
        return out

    def drafters_for(self, target: ModelEntry) -> list[ModelEntry]:
        """Drafters that pass the pair check for ``target``, best guess first (the known
        pair's drafter, then the same source, then by name)."""
        return [c.drafter for c in self.pair_checks(target) if c.fits]

    def dflash_unavailable_reason(self, target: ModelEntry) -> str | None:
        """None when some drafter fits ``target``; else a sentence saying why DFlash is off."""
        checks = self.pair_checks(target)
        if any(c.fits for c in checks):
            return None
        if not checks:
            pair = known_pair_for(target.repo_id)
            hint = f" (its drafter is {pair.drafter_repo})" if pair else ""
            return f"no DFlash drafter found for {target.name}{hint}; plain decoding only"
        first = checks[0]
        return (
            f"no drafter fits {target.name}: {first.drafter.name}: {first.reason}; "
            "plain decoding only"
        )


def _preference(target: ModelEntry, drafter: ModelEntry) -> tuple:
    pair = known_pair_for(target.repo_id)
    known = pair is not None and drafter.repo_id is not None and (
        drafter.repo_id.lower() == pair.drafter_repo.lower()
    )
    return (not known, drafter.source != target.source, drafter.name.lower())


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


CHAT_LIMITS_FILE = "dflash_chat.json"
"""An optional file in a target's folder with what its model card states about chat length:
``{"trained_chat_tokens": int}``, the longest example (prompt + reply, in tokens) of the chats
it was trained on. The bundled demo target has one (``tools/demo_pair/chat_lengths.py``
measures it); the app keeps prompts within it (``app.chat.history.fit_history``'s
``trained``)."""


def trained_chat_length(folder: str | Path) -> int | None:
    """The trained chat length in tokens that ``folder``'s :data:`CHAT_LIMITS_FILE` states,
    or None when there is no such file or it holds no positive int ``trained_chat_tokens``
    (a damaged file is logged and ignored: the context alone limits prompts then)."""
    path = Path(folder) / CHAT_LIMITS_FILE
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("trained_chat_tokens")
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        log.warning("ignoring %s: trained_chat_tokens is not a positive int", path)
        return None
    return value


def context_length(config: dict) -> int | None:
    """The target's context limit in tokens (``max_position_embeddings``), or None."""
    tc = text_config(config)
    value = tc.get("max_position_embeddings") or tc.get("max_seq_len")
    return int(value) if isinstance(value, int) and value > 0 else None


def _dtype_bytes(config: dict) -> int:
    tc = text_config(config)
    name = tc.get("torch_dtype") or tc.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return _DTYPE_BYTES.get(str(name), 2)


def _layer_kinds(tc: dict) -> list[str]:
    """One of ``full``, ``sliding``, ``linear`` per decoder layer.

    ``layer_types`` when present; otherwise Qwen3.5/3.6/Qwen3-Next put full attention on every
    ``full_attention_interval``-th layer (default 4; mlx-lm ``qwen3_5.DecoderLayer.is_linear``)
    and Gated DeltaNet elsewhere; other models are all full attention.
    """
    n = int(tc.get("num_hidden_layers") or 0)
    types = tc.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        kinds = []
        for t in types:
            t = str(t)
            kinds.append("linear" if "linear" in t else "sliding" if "sliding" in t else "full")
        return kinds
    if str(tc.get("model_type", "")).startswith(("qwen3_5", "qwen3_next")):
        interval = int(tc.get("full_attention_interval") or 4)
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(n)]
    return ["full"] * n


def cache_bytes(config: dict, context: int) -> tuple[int, int]:
    """(attention K/V bytes, recurrent-state bytes) for ``context`` tokens of one sequence.

    K/V: per attention layer ``2 x kv_heads x head_dim x tokens x bytes`` (tokens capped at
    ``sliding_window`` on sliding layers; bytes from the config's dtype, 2 for bf16/fp16).
    Recurrent (Gated DeltaNet) state: per linear layer ``Hv x Dv x Dk x 4`` (float32) plus the
    conv state ``(kernel-1) x conv_dim x bytes`` (mlx-lm 0.32.2 ``qwen3_5.GatedDeltaNet``).
    """
    tc = text_config(config)
    heads = int(tc.get("num_attention_heads") or 1)
    kv_heads = int(tc.get("num_key_value_heads") or heads)
    head_dim = int(tc.get("head_dim") or int(tc.get("hidden_size") or 0) // heads)
    nbytes = _dtype_bytes(config)
    window = tc.get("sliding_window")
    kv = state = 0
    for kind in _layer_kinds(tc):
        if kind == "linear":
            hv = int(tc.get("linear_num_value_heads") or 0)
            hk = int(tc.get("linear_num_key_heads") or 0)
            dk = int(tc.get("linear_key_head_dim") or 0)
            dv = int(tc.get("linear_value_head_dim") or 0)
            kernel = int(tc.get("linear_conv_kernel_dim") or 4)
            conv_dim = 2 * hk * dk + hv * dv
            state += hv * dv * dk * 4 + (kernel - 1) * conv_dim * nbytes
        else:
            tokens = context
            if kind == "sliding" and isinstance(window, int) and window > 0:
                tokens = min(context, window)
            kv += 2 * kv_heads * head_dim * tokens * nbytes
    return kv, state


def machine_memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (``sysctl hw.memsize`` on macOS, else
    ``os.sysconf``); None when it cannot be read."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=5
            )
            return int(out.stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory a pair would need, in bytes, against the machine's memory.

    ``total_bytes = weights_bytes + kv_bytes + state_bytes + drafter_bytes``; the drafter part
    is its weights plus its context K/V. ``fraction`` is total / machine (None when unknown);
    ``warn`` is True above :data:`MEMORY_WARN_FRACTION`.
    """

    weights_bytes: int
    kv_bytes: int
    state_bytes: int
    drafter_bytes: int
    context_tokens: int
    machine_bytes: int | None

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.state_bytes + self.drafter_bytes

    @property
    def fraction(self) -> float | None:
        if not self.machine_bytes:
            return None
        return self.total_bytes / self.machine_bytes

    @property
    def warn(self) -> bool:
        return self.fraction is not None and self.fraction > MEMORY_WARN_FRACTION

    def message(self) -> str:
        """One line for the UI, e.g. ``needs about 6.1 GB of 16.0 GB (38%) ...``."""
        text = (
            f"needs about {format_bytes(self.total_bytes)} (weights "
            f"{format_bytes(self.weights_bytes)}, K/V at {self.context_tokens} tokens "
            f"{format_bytes(self.kv_bytes + self.state_bytes)}"
        )
        if self.drafter_bytes:  # weights (an adapter's backbone too) and K/V at that context
            text += f", drafter weights and K/V {format_bytes(self.drafter_bytes)}"
        text += ")"
        if self.machine_bytes:
            text += f" of {format_bytes(self.machine_bytes)} ({self.fraction:.0%})"
        if self.warn:
            text += (
                f": above {MEMORY_WARN_FRACTION:.0%} of this machine's memory; "
                "lower the context limit or pick a smaller model"
            )
        return text

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(total_bytes=self.total_bytes, fraction=self.fraction, warn=self.warn,
                   message=self.message())
        return out


def drafter_weights_size(drafter: ModelEntry) -> int:
    """Bytes of a drafter's weights as loaded: its safetensors plus, for a DFlash2 adapter
    (``dflash_backbone``), its backbone folder's (the loaded drafter holds both)."""
    from app.models.adapter import backbone_folder

    total = weights_size(drafter.path)
    try:
        backbone = backbone_folder(drafter.path, drafter.config)
    except ModelLoadError:
        backbone = None
    return total + (weights_size(backbone) if backbone is not None else 0)


def estimate_memory(
    target: ModelEntry,
    drafter: ModelEntry | None = None,
    context: int | None = None,
    machine_bytes: int | None = None,
    drafter2: ModelEntry | None = None,
) -> MemoryEstimate:
    """Estimate memory for ``target`` (+ ``drafter``, + a second drafter ``drafter2`` loaded
    beside it, e.g. the DFlash2 one) at ``context`` tokens.

    ``context`` defaults to the target's ``max_position_embeddings`` (4096 when absent);
    ``machine_bytes`` to :func:`machine_memory_bytes`. Weights are the safetensors sizes on disk
    (an adapter's backbone included: :func:`drafter_weights_size`).
    """
    ctx = int(context or context_length(target.config) or 4096)
    kv, state = cache_bytes(target.config, ctx)
    d_bytes = 0
    for d in (drafter, drafter2):
        if d is not None:
            dkv, _ = cache_bytes(d.config, ctx)
            d_bytes += drafter_weights_size(d) + dkv
    return MemoryEstimate(
        weights_bytes=weights_size(target.path),
        kv_bytes=kv,
        state_bytes=state,
        drafter_bytes=d_bytes,
        context_tokens=ctx,
        machine_bytes=machine_bytes if machine_bytes is not None else machine_memory_bytes(),
    )


def format_bytes(n: float | None) -> str:
    """``n`` bytes as text in decimal units (``1.5 GB``, ``820 MB``, ``12 KB``, ``0 B``)."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# --------------------------------------------------------------------------------------------
# CLI: python -m app models [--json]
# --------------------------------------------------------------------------------------------


def catalog_report(catalog: Catalog) -> dict:
    """The JSON document printed by ``python -m app models --json``.

    Keys: ``cache_dir``, ``folders``, ``targets`` (each with ``drafters``: names that fit,
    ``not_fitting``: ``{name, field, reason}``, and ``memory``: :class:`MemoryEstimate` as a
    dict for the target with its first fitting drafter; ``drafter_probes``: empty here,
    the fit probes of its pairs with ``models --probe``), ``drafters``, ``known_pairs`` (with whether
    each repo is in the cache), ``skipped`` (``{path, reason}``).
    """
    scan = catalog.scan()
    cached = {e.repo_id.lower() for e in [*scan.targets, *scan.drafters] if e.repo_id}
    targets = []
    for t in scan.targets:
        checks = catalog.pair_checks(t)
        item = t.to_dict()
        item["drafters"] = [c.drafter.name for c in checks if c.fits]
        best = next((c.drafter for c in checks if c.fits), None)
        item["memory"] = estimate_memory(t, best).to_dict()
        item["not_fitting"] = [
            {"name": c.drafter.name, "field": c.field, "reason": c.reason}
            for c in checks
            if not c.fits
        ]
        item["drafter_probes"] = []  # filled by `models --probe` (app.commands.models)
        targets.append(item)
    return {
        "cache_dir": str(scan.cache_dir) if scan.cache_dir else None,
        "folders": [str(p) for p in catalog.folders()],
        "targets": targets,
        "drafters": [d.to_dict() for d in scan.drafters],
        "known_pairs": [
            {
                **asdict(p),
                "target_cached": p.target_repo.lower() in cached,
                "drafter_cached": p.drafter_repo.lower() in cached,
            }
            for p in KNOWN_PAIRS
        ],
        "skipped": [{"path": p, "reason": r} for p, r in scan.skipped],
    }
