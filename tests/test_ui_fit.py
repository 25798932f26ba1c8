"""The window as a new user meets it at small sizes and after a reload (offscreen, pytest-qt,
scripted backends): the composer fits down to the window's minimum width, long figure values
are shown whole, a reloaded reply's footer says what it said live, Compare does not widen the
window, and a reopened chat shows its end.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from test_ui_window import ScriptedBackend  # noqa: E402

from app.engine.events import Summary  # noqa: E402
from app.ui.panels import LiveStats  # noqa: E402

# ``qs`` and the autouse ``_allow_engine_after`` are conftest.py fixtures.

THREE_MODES = {"target_name": "scripted", "drafter_name": "scripted-d",
               "drafter2_name": "scripted-d2", "context_length": 262_144, "memory_bytes": 0}
"""A pair with a DFlash and a DFlash2 drafter: the composer shows all three mode buttons."""


def loaded(qtbot, qs, backend=None, store=None):
    """A shown window with the scripted pair loaded (DFlash2 offered)."""
    from app.ui.window import MainWindow

    backend = backend or ScriptedBackend(info=dict(THREE_MODES))
    win = MainWindow(backend=backend, store=store, qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.show()
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
    return win, backend


def rect_in(win, w) -> QRect:
    """``w``'s rectangle in ``win``'s coordinates."""
    return QRect(w.mapTo(win, QPoint(0, 0)), w.size())


def settle(qtbot, ms=60):
    qtbot.wait(ms)


# ------------------------------------------------------------------ 1: the composer fits
@pytest.mark.parametrize("width", [None, 700, 1000])
def test_composer_is_whole_down_to_the_minimum_width(qtbot, qs, width):
    win, _ = loaded(qtbot, qs)
    try:
        assert 640 <= win.minimumWidth() <= 720  # a sensible minimum, set on purpose
        # the window's content fits in that minimum
        assert win.minimumSizeHint().width() <= win.minimumWidth()
        width = width or win.minimumWidth()
        win.resize(width, 600)
        settle(qtbot)
        assert win.width() == width
        c = win.composer
        assert c.dflash2_btn.isVisible()
        window = win.rect()
        centre = rect_in(win, c.parentWidget())
        assert window.contains(rect_in(win, c)) and centre.contains(rect_in(win, c))
        widgets = (c.plain_btn, c.dflash_btn, c.dflash2_btn, c.colour_box, c.compare_btn,
                   c.send_btn, c.edit, c.note)
        for w in widgets:
            assert w.isVisible(), w.text() if hasattr(w, "text") else w
            name = w.text() if hasattr(w, "text") and callable(w.text) else type(w).__name__
            if w not in (c.edit, c.note):
                assert w.width() >= w.sizeHint().width(), (width, name, w.width(),
                                                           w.sizeHint().width())
                assert w.height() >= w.sizeHint().height(), (width, name)
            r = rect_in(win, w)
            assert window.contains(r), (width, name, r, window)
            assert rect_in(win, c).contains(r), (width, name, r, rect_in(win, c))
        # the buttons do not overlap each other
        row = [c.plain_btn, c.dflash_btn, c.dflash2_btn, c.colour_box, c.compare_btn,
               c.send_btn]
        for i, a in enumerate(row):
            for b in row[i + 1:]:
                assert not rect_in(win, a).intersects(rect_in(win, b)), (width, a.text(),
                                                                         b.text())
        # the settings line is whole (wrapped when narrow)
        text_rect = c.note.fontMetrics().boundingRect(
            QRect(0, 0, c.note.contentsRect().width(), 10_000), Qt.TextWordWrap,
            c.note.text())
        assert text_rect.width() <= c.note.contentsRect().width()
        assert text_rect.height() <= c.note.contentsRect().height()
        # Send became Stop in the same place and the same size
        send = rect_in(win, c.send_btn)
        c.set_busy(True)
        settle(qtbot, 20)
        assert rect_in(win, c.stop_btn) == send
        c.set_busy(False)
    finally:
        win.shutdown()


# ------------------------------------------------------------------ 2: figure values whole
def _whole(label) -> bool:
    """True when ``label``'s text is drawn in full inside it (wrapped lines included)."""
    box = label.contentsRect()
    flags = Qt.TextWordWrap if label.wordWrap() else Qt.TextSingleLine
    need = label.fontMetrics().boundingRect(QRect(0, 0, box.width(), 10_000),
                                            int(flags | Qt.AlignLeft | Qt.AlignTop),
                                            label.text())
    return need.width() <= box.width() and need.height() <= box.height()


@pytest.mark.parametrize("width", [700, 1280])
def test_long_figure_values_are_shown_whole(qtbot, qs, width):
    win, _ = loaded(qtbot, qs)
    try:
        win.resize(width, 700)
        settle(qtbot)
        for reused, read in ((584, 34), (120_000, 3_456)):
            s = Summary(mode="dflash", prompt_tokens=reused + read, generated_tokens=98_765,
                        ttft_s=1.5, tok_per_s=1234.5, cycles=54_321, drafted=99_999,
                        accepted=88_888, acceptance_rate=0.889, tau=15.99, replays=12_345,
                        rollback_share=0.5, reused_tokens=reused)
            st = LiveStats(context_limit=262_144)
            st.apply_summary(s)
            win.live.show_stats(st, 16)
            settle(qtbot)
            assert win.live.labels["prompt"].text() == f"{reused:,} reused + {read:,}"
            for key, label in win.live.labels.items():
                if label.isVisible():
                    assert _whole(label), (width, key, label.text(), label.contentsRect())
    finally:
        win.shutdown()
