"""Guard: MLX work never runs on the GUI thread.

MLX arrays are bound to the thread (stream) that made them, and a GUI thread that computes
freezes the window. The window marks its thread with :func:`forbid_engine_on_current_thread`;
the engine's entry points (loading and generation) call :func:`check_engine_thread`, which
raises :class:`~app.engine.errors.WrongThreadError` on the marked thread.
"""

from __future__ import annotations

import threading

from app.engine.errors import WrongThreadError

_forbidden: set[int] = set()


def forbid_engine_on_current_thread() -> None:
    """Mark the calling thread (the GUI thread) as one that must not run engine work."""
    _forbidden.add(threading.get_ident())


def allow_engine_on_current_thread() -> None:
    """Undo :func:`forbid_engine_on_current_thread` (tests)."""
    _forbidden.discard(threading.get_ident())


def check_engine_thread() -> None:
    """Raise :class:`WrongThreadError` when called on a thread marked as forbidden."""
    if threading.get_ident() in _forbidden:
        raise WrongThreadError(
            f"engine called on {threading.current_thread().name}, which must not run MLX"
        )
