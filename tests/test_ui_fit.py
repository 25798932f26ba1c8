"""The window as a new user meets it at small sizes and after a reload (offscreen, pytest-qt,
scripted backends): the composer fits down to the window's minimum width, long figure values
are shown whole, a reloaded reply's footer says what it said live, Compare does not widen the
window, a reopened chat shows its end, and the Context card of a chat reopened on launch gets
the context length once the model loads.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from test_ui_window import PROMPT, ScriptedBackend, send_and_wait  # noqa: E402

from app.chat.scripted import ScriptedTurn  # noqa: E402
from app.chat.turns import TurnStore  # noqa: E402
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


def _whole(label) -> bool:
    """True when ``label``'s text is drawn in full inside it (wrapped lines included)."""
    box = label.contentsRect()
    flags = Qt.TextWordWrap if label.wordWrap() else Qt.TextSingleLine
    need = label.fontMetrics().boundingRect(QRect(0, 0, box.width(), 10_000),
                                            int(flags | Qt.AlignLeft | Qt.AlignTop),
                                            label.text())
    return need.width() <= box.width() and need.height() <= box.height()


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
        # the settings line is whole (wrapped when narrow), and so is the mode note
        assert _whole(c.note)
        if width >= 1000:  # with room for it, on one line
            assert c.note.height() < 2 * c.note.fontMetrics().lineSpacing()
        assert not c.mode_note.isVisible()  # empty: no line of its own
        c.mode_note.setText("DFlash2 applies to the next reply; this one stays DFlash.")
        settle(qtbot, 20)
        assert c.mode_note.isVisible() and _whole(c.mode_note)
        for label in (c.note, c.mode_note):
            assert rect_in(win, c).contains(rect_in(win, label))
        assert not rect_in(win, c.note).intersects(rect_in(win, c.mode_note))
        c.mode_note.setText("")
        settle(qtbot, 20)
        # Send became Stop in the same place and the same size
        send = rect_in(win, c.send_btn)
        c.set_busy(True)
        settle(qtbot, 20)
        assert rect_in(win, c.stop_btn) == send
        c.set_busy(False)
    finally:
        win.shutdown()


# ------------------------------------------------------------------ 2: figure values whole
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


# ------------------------------------------------------------------ 3: the reloaded footer
def _footer(win) -> str:
    """The last reply's figures line as the chat shows it."""
    lines = [ln for ln in win.chat.toPlainText().splitlines() if "tok/s" in ln]
    return lines[-1]


def _speed(backend, tok_per_s):
    backend.figures = dict(backend.figures, tok_per_s=tok_per_s, prompt_tokens=42)


def test_a_reloaded_reply_keeps_its_speedup_against_plain(qtbot, qs, tmp_path):
    path = tmp_path / "chats.db"
    win, backend = loaded(qtbot, qs, store=TurnStore(path))
    win.defaults["block_size"] = 4  # the scripted pair has no drafter to store its block from
    try:
        _speed(backend, 20.0)
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        _speed(backend, 38.0)
        send_and_wait(qtbot, win, "And of Spain?", mode="dflash")
        live = _footer(win)
        assert "~1.9x plain" in live
        live_tip = win.chat.tooltip_of("~1.9x plain")
        assert "Baseline: 20.0 tok/s plain" in live_tip
        # a Compare turn in another chat: its DFlash side against its own plain side
        other = win.conv.id
        win.new_chat()
        _speed(backend, 25.0)
        send_and_wait(qtbot, win, PROMPT, compare=True)
        live_compare = _footer(win)
        assert "x plain" in live_compare
        compare_id = win.conv.id
        # reopened from the list
        win.conv_side.selected.emit(other)
        assert win.conv.id == other
        assert _footer(win) == live
        assert win.chat.tooltip_of("~1.9x plain") == live_tip
        win.conv_side.selected.emit(compare_id)
        assert _footer(win) == live_compare
    finally:
        win.shutdown()
    # the app restarted: the same footers from the stored rows
    win2, _ = loaded(qtbot, qs, store=TurnStore(path))
    try:
        assert win2.conv.id == compare_id
        assert _footer(win2) == live_compare
        win2.conv_side.selected.emit(other)
        assert _footer(win2) == live
        assert win2.chat.tooltip_of("~1.9x plain") == live_tip
    finally:
        win2.shutdown()


def test_a_speedup_round_trips_through_its_stored_record():
    from app.chat.baseline import PlainSample, SpeedUp

    up = SpeedUp(38.0 / 20.0, PlainSample("t|d", "bfloat16", 12, 42, 20.0, "plain reply"))
    back = SpeedUp.from_dict(json.loads(json.dumps(up.to_dict())))
    assert back == up and back.label() == up.label() and back.tooltip() == up.tooltip()
    for bad in (None, {}, {"ratio": 2.0}, {"ratio": "x", "baseline": {}}, [1]):
        assert SpeedUp.from_dict(bad) is None


def test_a_reloaded_reply_without_a_baseline_still_says_so(qtbot, qs, tmp_path):
    path = tmp_path / "chats.db"
    win, _ = loaded(qtbot, qs, store=TurnStore(path))
    win.defaults["block_size"] = 4
    try:
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        live = _footer(win)
        assert "no plain baseline yet" in live
        conv_id = win.conv.id
    finally:
        win.shutdown()
    win2, _ = loaded(qtbot, qs, store=TurnStore(path))
    try:
        assert win2.conv.id == conv_id and _footer(win2) == live
    finally:
        win2.shutdown()


# ------------------------------------------------------------------ 4: Compare keeps the width
@pytest.mark.parametrize("width", [None, 700, 1000, 1280])
def test_compare_does_not_change_the_window_width(qtbot, qs, width):
    for three in (False, True):
        info = dict(THREE_MODES)
        if not three:
            info.pop("drafter2_name")
        win, _ = loaded(qtbot, qs, ScriptedBackend(info=info))
        try:
            w = width or win.minimumWidth()
            win.resize(w, 700)
            settle(qtbot)
            assert win.width() == w
            send_and_wait(qtbot, win, PROMPT, compare=True)
            settle(qtbot)
            view = win.compare_view
            assert view.isVisible()
            assert win.width() == w, (three, w, win.width())
            # nothing squeezed below its minimum: the content fits the window as it is
            assert win.minimumSizeHint().width() <= w
            assert rect_in(win.centralWidget(), view).right() < win.width()
            # every side's button is whole, and inside the view (scrolled to it in a low one)
            shown = [k for k in view.sides if view.buttons[k].isVisible()]
            assert shown
            for key in shown:
                btn = view.buttons[key]
                assert btn.width() >= btn.sizeHint().width(), (three, w, key)
                view.scroll.ensureWidgetVisible(btn, 0, 0)
                assert rect_in(win, view).contains(rect_in(win, btn)), (three, w, key)
            win.compare_view.hide()
            settle(qtbot)
            assert win.width() == w
        finally:
            win.shutdown()


# ------------------------------------------------------------------ 5: a reopened chat's end
LONG = "\n\n".join(f"Paragraph {i}: " + "word " * 40 for i in range(6))


def _at_end(win) -> bool:
    sb = win.chat.verticalScrollBar()
    return sb.maximum() > 0 and sb.value() == sb.maximum()


def test_a_reopened_long_chat_is_scrolled_to_its_end(qtbot, qs, tmp_path):
    path = tmp_path / "chats.db"
    backend = ScriptedBackend(turns=[ScriptedTurn("", LONG)], info=dict(THREE_MODES))
    win, _ = loaded(qtbot, qs, backend, store=TurnStore(path))
    try:
        for i in range(4):
            send_and_wait(qtbot, win, f"Question {i}?", mode="dflash")
        long_id = win.conv.id
        win.chat.verticalScrollBar().setValue(0)  # the user scrolled up to read
        win.new_chat()
        send_and_wait(qtbot, win, "A short one", mode="dflash")
        win.conv_side.selected.emit(long_id)  # reopened from the list
        settle(qtbot, 100)
        assert win.conv.id == long_id and _at_end(win)
    finally:
        win.shutdown()
    # the app restarted on that chat: its end shows, after the window is shown
    win3, _ = loaded(qtbot, qs, store=TurnStore(path))
    try:
        assert win3.conv.id == long_id
        settle(qtbot, 100)
        assert _at_end(win3), (win3.chat.verticalScrollBar().value(),
                               win3.chat.verticalScrollBar().maximum())
    finally:
        win3.shutdown()


# ------------------------------------------------------------------ 6: the Context card reloaded
def _restarted(qtbot, qs, path, info=None):
    """The app started again on ``path``: the last chat reopens before any model loads."""
    from app.ui.window import MainWindow

    backend = ScriptedBackend(info=dict(info or THREE_MODES))
    win = MainWindow(backend=backend, store=TurnStore(path), qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.show()
    return win


def _load(qtbot, win):
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)


def test_after_a_restart_the_context_card_shows_the_loaded_models_length(qtbot, qs, tmp_path):
    path = tmp_path / "chats.db"
    win, _ = loaded(qtbot, qs, store=TurnStore(path))
    try:
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        live = win.live.labels["context"].text()
        assert live.endswith(" / 262,144"), live
        conv_id = win.conv.id
    finally:
        win.shutdown()
    win2 = _restarted(qtbot, qs, path)
    try:
        assert win2.conv.id == conv_id
        # no model yet: the length is not known, so only the tokens used
        assert win2.live.labels["context"].text() == live.split(" / ")[0]
        _load(qtbot, win2)
        assert win2.live.labels["context"].text() == live
        assert win2.live.shown["context"][1] == 262_144
    finally:
        win2.shutdown()

