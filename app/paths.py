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
    backbone: ``app.engine.adapter``); existence is not checked."""
    return resource_path("models", "demo-dflash2")


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


def cache_dir() -> Path:
    """Per-user cache folder (e.g. the tiny fallback pair); ``DFLASH_CACHE_DIR`` overrides."""
    override = os.environ.get("DFLASH_CACHE_DIR")
    if override:
        return Path(override)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "DFlash Chat"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dflash-chat"
