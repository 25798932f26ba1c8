"""Where the app finds its bundled resources and keeps its data, frozen or not.

``resources/`` sits beside the ``app`` package in a checkout and in ``sys._MEIPASS`` in a
PyInstaller build; both are found the same way through :func:`resource_path`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def resources_dir() -> Path:
    """The ``resources/`` folder (bundled demo pair, data files, icons)."""
    override = os.environ.get("DFLASH_RESOURCES")
    if override:
        return Path(override)
    base = getattr(sys, "_MEIPASS", None)
    if base:
        return Path(base) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def resource_path(*parts: str) -> Path:
    """A path inside ``resources/``; existence is not checked."""
    return resources_dir().joinpath(*parts)


def demo_pair_dirs() -> tuple[Path, Path]:
    """(target folder, drafter folder) of the bundled demo pair."""
    return resource_path("models", "demo-target"), resource_path("models", "demo-dflash")


def demo_dflash2_dir() -> Path:
    """The bundled demo target's DFlash2 drafter folder (an adapter on the DFlash drafter's
    backbone: ``app.models.adapter``); existence is not checked."""
    return resource_path("models", "demo-dflash2")


def bundled_pair() -> tuple[Path, Path, Path | None] | None:
    """The bundled demo pair as it is in this install: (target, DFlash drafter, DFlash2
    drafter or None when it is missing), or None when the target or the DFlash drafter is
    missing (a folder counts when it has a ``config.json``). The window's default pair and
    the CLI's both come from here."""
    target, drafter = demo_pair_dirs()
    if not ((target / "config.json").is_file() and (drafter / "config.json").is_file()):
        return None
    v2 = demo_dflash2_dir()
    return target, drafter, v2 if (v2 / "config.json").is_file() else None


def is_bundled_target(folder: str | Path) -> bool:
    """True when ``folder`` is the bundled demo target's folder (compared resolved)."""
    try:
        return Path(folder).expanduser().resolve() == demo_pair_dirs()[0].resolve()
    except OSError:
        return False


def default_data_dir() -> Path:
    """The platform's per-user app-data folder for DFlash Chat (not created here).

    macOS: ``~/Library/Application Support/DFlash Chat``; Linux: ``$XDG_DATA_HOME/dflash-chat``
    (default ``~/.local/share/dflash-chat``); Windows: ``%APPDATA%/DFlash Chat``.
    ``DFLASH_DATA_DIR`` overrides it (as does the CLI's global ``--data-dir``).
    """
    override = os.environ.get("DFLASH_DATA_DIR")
    if override:
        return Path(override)
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "DFlash Chat"
    if sys.platform.startswith("win"):
        return Path(os.environ.get("APPDATA", home)) / "DFlash Chat"
    return Path(os.environ.get("XDG_DATA_HOME", home / ".local" / "share")) / "dflash-chat"


def data_dir_problem(path: Path | str, name: str) -> str | None:
    """Make sure the data folder ``path`` is a usable folder, creating it when missing; the
    one-line problem otherwise (``name`` says where it was set: ``--data-dir``,
    ``DFLASH_DATA_DIR``, "the app-data folder"), or None when it is usable."""
    path = str(path)
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{name} {path} is a file, not a folder"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"{name} {path} cannot be created: {exc.strerror or exc}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{name} {path} is not writable"
    return None


def data_dir_source() -> str:
    """Where :func:`default_data_dir` comes from, as a message names it: ``DFLASH_DATA_DIR``
    when that is set, else "the app-data folder"."""
    return "DFLASH_DATA_DIR" if os.environ.get("DFLASH_DATA_DIR") else "the app-data folder"


def cache_dir() -> Path:
    """Per-user cache folder (e.g. the tiny fallback pair); ``DFLASH_CACHE_DIR`` overrides."""
    override = os.environ.get("DFLASH_CACHE_DIR")
    if override:
        return Path(override)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "DFlash Chat"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dflash-chat"
