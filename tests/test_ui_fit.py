"""The window as a new user meets it at small sizes and after a reload (offscreen, pytest-qt,
scripted backends): the composer fits down to the window's minimum width, long figure values
are shown whole, a reloaded reply's footer says what it said live, Compare does not widen the
window, a reopened chat shows its end, the Context card of a chat reopened on launch gets
the context length once the model loads, and a chat ending in a Compare reopens its Compare
view from what is stored (saying what storage lacks), and Colour drafts, remembered, colours the
chat reopened on launch once the model loads (only token texts that spell the stored reply).
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from test_ui_window import (  # noqa: E402
    PROMPT,
    ScriptedBackend,
    send_and_wait,
    send_refused_by_storage,
)

from app.chat.scripted import ScriptedTurn  # noqa: E402
from app.chat.turns import ViewStore  # noqa: E402
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
        widgets = (c.plain_btn, c.dflash_btn, c.dflash2_btn, c.lookup_btn, c.colour_box,
                   c.compare_btn, c.send_btn, c.edit, c.note)
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
        row = [c.plain_btn, c.dflash_btn, c.dflash2_btn, c.lookup_btn, c.colour_box,
               c.compare_btn, c.send_btn]
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
    win, backend = loaded(qtbot, qs, store=ViewStore(path))
    win.defaults["block_size"] = 4  # the scripted pair has no drafter to store its block from
    try:
        _speed(backend, 20.0)
        for text in (PROMPT, "And of Italy?", "And of Peru?"):  # a baseline is 3 replies
            send_and_wait(qtbot, win, text, mode="plain")
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
    win2, _ = loaded(qtbot, qs, store=ViewStore(path))
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
    win, _ = loaded(qtbot, qs, store=ViewStore(path))
    win.defaults["block_size"] = 4
    try:
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        live = _footer(win)
        assert "no plain baseline yet" in live
        conv_id = win.conv.id
    finally:
        win.shutdown()
    win2, _ = loaded(qtbot, qs, store=ViewStore(path))
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


def test_a_low_compare_keeps_each_sides_figures_below_its_text(qtbot, qs):
    """At 900x600 (a new user's Xvfb pass) a side's figures wrapped to two lines and were drawn
    over the bottom of its text, the Continue button cut in half: the layout had kept room for
    one line. Now every line has room (the view scrolls instead), and a tab does not repeat its
    side's name above the text."""
    fig = "67.6 tok/s · 134 tokens · first token 263 ms · τ 4.40 · acceptance 24% · 27 replays"
    win, _ = loaded(qtbot, qs, ScriptedBackend(info=dict(THREE_MODES)))
    try:
        win.resize(900, 600)
        settle(qtbot)
        send_and_wait(qtbot, win, PROMPT, compare=True)
        view = win.compare_view
        for label in view.figs.values():
            label.setText(fig)
        settle(qtbot, 150)
        assert view.tabbed
        key = next(k for k in view.sides if view.buttons[k].isVisible())
        text, figs, button = view.texts[key], view.figs[key], view.buttons[key]
        assert figs.height() >= figs.heightForWidth(figs.width()) > figs.fontMetrics().height()
        assert figs.geometry().top() >= text.geometry().bottom()
        assert button.geometry().top() >= figs.geometry().bottom()
        assert button.height() >= button.sizeHint().height()
        assert not view.titles[key].isVisible()
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
    win, _ = loaded(qtbot, qs, backend, store=ViewStore(path))
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
    win3, _ = loaded(qtbot, qs, store=ViewStore(path))
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
    win = MainWindow(backend=backend, store=ViewStore(path), qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.show()
    return win


def _load(qtbot, win):
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)


def test_after_a_restart_the_context_card_shows_the_loaded_models_length(qtbot, qs, tmp_path):
    path = tmp_path / "chats.db"
    win, _ = loaded(qtbot, qs, store=ViewStore(path))
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

# ------------------------------------------------------------------ 7: a reopened Compare
def _compare_shown(view) -> dict:
    """What a Compare view says: its verdict (the full form; the header may show the short one
    where it is narrow), sides, each side's figures and chosen button."""
    return {"header": view.header.full, "sides": list(view.results),
            "figures": {k: view.figs[k].text() for k in view.results},
            "chosen": [k for k in view.results if view.buttons[k].isChecked()]}


@pytest.mark.parametrize("three", [False, True])
def test_a_chat_ending_in_a_compare_reopens_its_compare_view(qtbot, qs, tmp_path, three):
    path = tmp_path / "chats.db"
    info = dict(THREE_MODES)
    if not three:
        info.pop("drafter2_name")
    win, _ = loaded(qtbot, qs, ScriptedBackend(info=info), store=ViewStore(path))
    try:
        send_and_wait(qtbot, win, PROMPT, compare=True)
        view = win.compare_view
        assert view.isVisible()
        live = _compare_shown(view)
        assert live["sides"] == (["plain", "dflash", "dflash2"] if three else ["plain", "dflash"])
        assert "identical" in live["header"] and live["chosen"] == ["dflash"]
        compare_id = win.conv.id
        win.new_chat()
        assert not view.isVisible()
        win.conv_side.selected.emit(compare_id)  # reopened from the list
        settle(qtbot)
        assert win.conv.id == compare_id and view.isVisible()
        assert _compare_shown(view) == live
        assert view.height() > 100  # it has room in the splitter, not a sliver
        win.new_chat()  # the app quits on another chat
    finally:
        win.shutdown()
    # restarted: the Compare chat reopened from the list, before and after the model loads
    win2 = _restarted(qtbot, qs, path, info)
    try:
        view = win2.compare_view
        assert not view.isVisible()
        win2.conv_side.selected.emit(compare_id)
        settle(qtbot)
        assert view.isVisible() and _compare_shown(view) == live and view.height() > 100
        for key in live["sides"]:
            assert "Paris" in view.texts[key].toPlainText()
        _load(qtbot, win2)
        assert view.isVisible() and _compare_shown(view) == live
    finally:
        win2.shutdown()
    # restarted on the Compare chat itself (the last one shown)
    qs.setValue("last_conversation", compare_id)
    win3 = _restarted(qtbot, qs, path, info)
    try:
        settle(qtbot)
        assert win3.conv.id == compare_id
        assert win3.compare_view.isVisible() and _compare_shown(win3.compare_view) == live
        assert win3.compare_view.height() > 100
    finally:
        win3.shutdown()


def _stored_compare(path, sides: dict, chosen="dflash"):
    """A chat whose last turn is a Compare, written straight into the store at ``path``:
    ``sides`` maps each side's mode to (tokens, content, status, generation) or None (a side
    stopped before it ran: an empty row); returns the conversation's id."""
    from app.chat.storage import Store

    db = Store(path)
    try:
        conv = db.new_conversation()
        user = db.add_message(conv.id, "user", "Compare it")
        for mode, side in sides.items():
            tokens, content, status, generation = side or ([], "", "stopped", {})
            summary = None if side is None else Summary(
                mode=mode, generated_tokens=len(tokens), prompt_tokens=10,
                tok_per_s=20.0 if mode == "plain" else 30.0, ttft_s=0.05).to_dict()
            db.add_message(conv.id, "assistant", content, parent_id=user.id,
                           activate=mode == chosen, mode=mode,
                           block_size=None if mode == "plain" else 4, rollback="tape",
                           generation=generation, summary=summary, token_ids=tokens,
                           from_draft=[False] * len(tokens), status=status,
                           finish_reason="stop" if side else "cancelled",
                           compare_group=f"g{conv.id}")
        return conv.id
    finally:
        db.close()


LETTERS = {1: "a", 2: "b", 3: "c", 9: "x"}
"""Token texts that spell the stored answers of :func:`_stored_compare`'s sides."""


def test_a_reopened_compare_says_what_storage_lacks_and_marks_once_the_model_loads(
        qtbot, qs, tmp_path):
    path = tmp_path / "chats.db"
    conv_id = _stored_compare(path, {
        "plain": ([1, 2, 3], "abc", "complete", {}),
        "dflash": ([1, 9, 3], "axc", "complete", {}),  # stored before the gap was kept
    })
    qs.setValue("last_conversation", conv_id)
    win = _restarted(qtbot, qs, path, {k: v for k, v in THREE_MODES.items()
                                       if k != "drafter2_name"})
    win.workers.worker.backend.piece = lambda t: LETTERS[t]
    try:
        view = win.compare_view
        assert win.conv.id == conv_id and view.isVisible()
        verdict, note = view.header.full.split("\n")
        assert verdict.startswith("differs from token 1 (of 3 plain / 3 DFlash)")
        assert verdict.endswith("DFlash 1.50× plain speed")
        assert note == ("Reopened from storage: the top-two logit gap was not stored; the "
                        "first divergence is not marked (its token texts are not stored).")
        assert view.figs["plain"].text().startswith("20.0 tok/s · 3 tokens")
        assert view.figs["dflash"].text().startswith("30.0 tok/s · 3 tokens")
        assert "axc" in view.texts["dflash"].toPlainText()
        assert view.buttons["dflash"].isChecked()
        _load(qtbot, win)  # the tokenizer gives the token texts back: the mark as live
        qtbot.waitUntil(lambda: "(marked)" in view.header.full, timeout=5_000)
        verdict, note = view.header.full.split("\n")
        assert "first divergence in the answer (marked)" in verdict
        assert note == "Reopened from storage: the top-two logit gap was not stored."
        assert "background-color" in view.texts["dflash"].toHtml()
    finally:
        win.shutdown()


def test_a_reopened_compare_with_a_side_that_never_ran_or_is_gone_does_not_crash(
        qtbot, qs, tmp_path):
    path = tmp_path / "chats.db"
    stopped = _stored_compare(path, {
        "plain": ([1, 2, 3], "abc", "complete", {}),
        "dflash": ([1, 2, 3], "abc", "stopped", {"top2_gap": None}),
        "dflash2": None,  # Stop came before the DFlash2 side ran
    })
    gone = _stored_compare(path, {  # the DFlash row is not in the store
        "plain": ([1, 2, 3], "abc", "complete", {}),
        "dflash2": ([1, 2, 3], "abc", "complete", {"top2_gap": None}),
    }, chosen="plain")
    qs.setValue("last_conversation", stopped)
    win = _restarted(qtbot, qs, path)
    try:
        view = win.compare_view
        assert win.conv.id == stopped and view.isVisible()
        assert list(view.results) == ["plain", "dflash", "dflash2"]
        assert view.header.text().split("\n") == [
            "DFlash: identical, 3 tokens · 1.50× plain speed",
            "DFlash2: stopped before it ran"]
        assert view.figs["dflash2"].text() == "not run"
        assert not view.buttons["dflash2"].isEnabled()
        # the chat offers the sides that ran, not the one that never did, and its link (say,
        # from an older window) leaves the choice alone
        text = win.chat.toPlainText()
        assert "continue from Plain instead" in text
        assert "continue from DFlash2 instead" not in text
        chosen = win.conv.messages[-1].chosen
        win._on_chat_link("choose:dflash2")
        assert win.conv.messages[-1].chosen == chosen
        win.conv_side.selected.emit(gone)
        assert win.conv.id == gone and view.isVisible()
        # plain and DFlash2 alone read as the Compare of a pair whose one drafter is DFlash2
        assert view.sides == ("plain", "dflash2") and view.missing == ()
        assert view.header.text() == "identical, 3 tokens · DFlash2 1.50× plain speed"
        assert view.buttons["plain"].isChecked()
        _load(qtbot, win)
        assert view.isVisible() and view.sides == ("plain", "dflash2")
    finally:
        win.shutdown()


# ------------------------------------------------------------------ 8: Colour drafts on launch
def _stored_dflash_reply(path, tokens, content, from_draft):
    """A chat with one stored DFlash reply written straight into the store at ``path`` (no
    token texts: those come from the loaded model's tokenizer); returns the chat's id."""
    from app.chat.storage import Store

    db = Store(path)
    try:
        conv = db.new_conversation()
        user = db.add_message(conv.id, "user", "Say it")
        summary = Summary(mode="dflash", generated_tokens=len(tokens), prompt_tokens=10,
                          tok_per_s=30.0, ttft_s=0.05).to_dict()
        db.add_message(conv.id, "assistant", content, parent_id=user.id, mode="dflash",
                       block_size=4, rollback="tape", summary=summary, token_ids=tokens,
                       from_draft=from_draft, status="complete", finish_reason="stop")
        return conv.id
    finally:
        db.close()


def test_colour_drafts_remembered_colours_the_chat_reopened_on_launch_once_the_model_loads(
        qtbot, qs, tmp_path):
    from app.ui import theme

    path = tmp_path / "chats.db"
    conv_id = _stored_dflash_reply(path, [1, 2, 3], "t1 t2 t3", [False, True, True])
    qs.setValue("composer/colour_drafts", True)
    qs.setValue("last_conversation", conv_id)
    win = _restarted(qtbot, qs, path)  # the chat is shown before any model is loaded
    try:
        assert win.conv.id == conv_id and win.composer.colour_box.isChecked()
        tint = theme.colours()["draft_bg"]
        assert tint not in win.chat.toHtml()  # no tokenizer yet: nothing to colour with
        _load(qtbot, win)  # Colour drafts is not touched
        qtbot.waitUntil(lambda: tint in win.chat.toHtml(), timeout=5_000)
        assert "t1 t2 t3" in win.chat.toPlainText()
    finally:
        win.shutdown()


def test_colour_drafts_leaves_a_reply_uncoloured_when_the_token_texts_do_not_spell_it(
        qtbot, qs, tmp_path):
    from app.ui import theme

    path = tmp_path / "chats.db"
    conv_id = _stored_dflash_reply(path, [1, 2, 3], "Paris is nice.", [False, True, True])
    qs.setValue("last_conversation", conv_id)
    win = _restarted(qtbot, qs, path)
    try:
        _load(qtbot, win)  # its tokenizer decodes these ids as "t1 t2 t3 ", not the stored text
        v = win.conv.messages[1].version
        win.composer.colour_box.setChecked(True)
        qtbot.waitUntil(lambda: v.result.pieces == ["t1 ", "t2 ", "t3 "], timeout=5_000)
        qtbot.wait(50)
        assert theme.colours()["draft_bg"] not in win.chat.toHtml()
        text = win.chat.toPlainText()
        assert "Paris is nice." in text and "t1" not in text  # the stored text, uncoloured
    finally:
        win.shutdown()


def test_colour_drafts_keeps_a_tool_call_the_parser_kept_as_text(qtbot, qs, tmp_path):
    """A malformed tool call stays in the stored answer as text; the answer section of the
    token texts leaves it out, so the reply is shown as stored, uncoloured (not cut)."""
    from app.ui import theme

    content = "<tool_call>\n<function=convert_units>\n150.\n</think>\n\n150."
    texts = {1: "I convert it.", 2: "\n</think>\n\n", 3: "<tool_call>",
             4: "\n<function=convert_units>\n150.\n", 5: "</think>", 6: "\n\n150."}
    path = tmp_path / "chats.db"
    conv_id = _stored_dflash_reply(path, list(texts), content, [False, True] * 3)
    qs.setValue("composer/colour_drafts", True)
    qs.setValue("last_conversation", conv_id)
    win = _restarted(qtbot, qs, path)
    win.workers.worker.backend.piece = texts.get
    try:
        _load(qtbot, win)
        v = win.conv.messages[1].version
        qtbot.waitUntil(lambda: v.result.pieces == list(texts.values()), timeout=5_000)
        qtbot.wait(50)
        assert "function=convert_units" in win.chat.toPlainText()
        assert theme.colours()["draft_bg"] not in win.chat.toHtml()
    finally:
        win.shutdown()


# ------------------------------------------------------------------ 9: the Compare view's turn
def test_the_compare_view_leaves_when_a_plain_send_follows_the_compare(qtbot, qs,
                                                                         monkeypatch):
    """The Compare view shows the last turn's comparison: a reply sent after it (or an edit
    of the Compare's message, which is one reply) is not a Compare, so the view goes; a send
    that could not be stored leaves the Compare the last turn, and its view stays."""

    win, _ = loaded(qtbot, qs)
    try:
        send_and_wait(qtbot, win, PROMPT, compare=True)
        assert win.compare_view.isVisible()
        shown = _compare_shown(win.compare_view)

        send_refused_by_storage(qtbot, win, monkeypatch)
        assert win.compare_view.isVisible() and _compare_shown(win.compare_view) == shown
        monkeypatch.undo()
        win.composer.edit.clear()
        send_and_wait(qtbot, win, "And the next one?", mode="dflash")
        assert not win.compare_view.isVisible()
        send_and_wait(qtbot, win, PROMPT, compare=True)
        assert win.compare_view.isVisible()
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.edit_message(len(win.conv.messages) - 2, "Only one reply, please.")
        assert not win.compare_view.isVisible()
    finally:
        win.shutdown()


@pytest.mark.parametrize("smallest", [False, True])
def test_benchmark_table_shows_all_its_rows_without_scrolling(qtbot, smallest):
    """The demo pair's short benchmark has five rows (plain, DFlash and DFlash2 each with tape
    and replay): the table is as tall as its rows, none cut off, no vertical scrolling, at
    the dialog's first size and at the smallest it can be made (the table's height does not
    depend on the room the charts leave, which differs by platform and font)."""
    from app.ui.bench_dialog import BenchDialog

    fig = {"tok_per_s": 123.4, "ratio_to_plain": 2.5, "tau": 3.1, "acceptance_rate": 0.5,
           "replays": 7, "rollback_share": 0.01, "identical_tokens": True}
    names = ["plain", "dflash+tape@16", "dflash+replay@16", "dflash2+tape@16",
             "dflash2+replay@16"]
    dlg = BenchDialog(None, {"modes": {n: dict(fig) for n in names}, "accepted": [1, 2, 3],
                             "prompts": 3, "block_size": 16})
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.waitExposed(dlg)
    if smallest:
        dlg.resize(dlg.minimumSizeHint())
        qtbot.waitUntil(lambda: dlg.size() == dlg.minimumSizeHint(), timeout=2_000)
    table = dlg.table
    view = table.viewport().rect()
    assert table.verticalScrollBar().maximum() == 0
    assert table.horizontalScrollBar().maximum() == 0
    for row in range(table.rowCount()):
        for col in (0, table.columnCount() - 1):
            rect = table.visualRect(table.model().index(row, col))
            assert view.contains(rect), (row, col, rect, view)


def test_benchmark_modes_are_named_in_words_with_the_bench_name_as_tooltip(qtbot):
    """The table said "dflash2+tape@16+nosel" (bench jargon) where a reader wants words."""
    from app.ui.bench_dialog import BenchDialog, mode_title

    assert mode_title("plain") == "Plain"
    assert mode_title("dflash+tape@16") == "DFlash (block 16)"
    assert mode_title("dflash+replay@8") == "DFlash, replay rollback (block 8)"
    assert mode_title("dflash+tape@16+fast") == "DFlash, fast verify, not exact (block 16)"
    assert mode_title("dflash2+tape@16+nosel") == "DFlash2, selector off (block 16)"
    assert mode_title("something+new") == "something+new"
    dlg = BenchDialog(None, {"modes": {"plain": {}, "dflash2+tape@16+nosel": {}},
                             "accepted": [1], "prompts": 1, "block_size": 16})
    qtbot.addWidget(dlg)
    item = dlg.table.item(1, 0)
    assert item.text() == "DFlash2, selector off (block 16)"
    assert item.toolTip() == "dflash2+tape@16+nosel in python -m app bench"


# ------------------------------------------------------------------ narrowing the window
def test_narrowing_the_window_keeps_the_conversation_the_widest_pane(qtbot, qs):
    # found under Xvfb: from 1280 to 880 px, the conversation lost all 400 px (640 -> 280)
    # while the chat list and the side panel kept theirs, so it was narrower than the panel
    win, _ = loaded(qtbot, qs)
    try:
        win.resize(1280, 800)
        settle(qtbot)
        win.resize(880, 640)
        settle(qtbot)
        left, centre, right = win.split.sizes()
        assert centre >= right and centre > 300, (left, centre, right)
        assert right >= win.details_scroll.minimumWidth()
        win.resize(1280, 800)  # and widening gives the space back
        settle(qtbot)
        assert win.split.sizes()[1] >= 600, win.split.sizes()
    finally:
        win.shutdown()


def test_a_narrow_window_puts_the_figures_two_to_a_row_and_keeps_the_conversation_wider(
        qtbot, qs):
    """At 680x500 (a new user's pass) the figures column kept three tiles a row, 290 px, and
    the conversation beside it had 240: now the tiles go two to a row below the width three
    need, nothing of a caption's words is cut, and the conversation is at least as wide."""
    win, _ = loaded(qtbot, qs)
    try:
        live = win.live
        for width, columns in ((1280, 3), (680, 2), (1280, 3)):
            win.resize(width, 500)
            settle(qtbot)
            left, centre, right = win.split.sizes()
            assert centre >= right, (width, left, centre, right)
            assert live._columns == columns == live.columns_for(live.width()), width
            for key, caption in live.captions.items():
                if not caption.isVisibleTo(win):
                    continue
                word = max(caption.fontMetrics().horizontalAdvance(w)
                           for w in caption.text().split())
                assert caption.width() >= word, (width, key, caption.width(), word)
    finally:
        win.shutdown()


def test_widening_the_window_again_gives_the_side_panes_their_widths_back(qtbot, qs):
    # found by a new user under Xvfb: 1400x900 -> 700x500 -> 1400x900 left the chat list at
    # 118 px and the side panel at 285 px (tool names cut to "cou..."), and a restart kept them
    def sizes_at(win, width, height):
        win.resize(width, height)
        settle(qtbot)
        return win.split.sizes()

    win, _ = loaded(qtbot, qs)
    try:
        before, narrow = sizes_at(win, 1280, 800), sizes_at(win, 700, 500)
        assert narrow[0] < before[0] and narrow[2] < before[2], (before, narrow)
        left, centre, right = sizes_at(win, 1280, 800)
        assert (left, right) == tuple(win.split.preferred) == (210, 380), (left, right)
        assert centre >= right
        sizes_at(win, 700, 500)
        win.save_layout()
    finally:
        win.shutdown()
    win2, _ = loaded(qtbot, qs)  # the next start restores the narrow layout, then widens it
    try:
        left, _, right = sizes_at(win2, 1280, 800)
        assert (left, right) == (210, 380)
    finally:
        win2.shutdown()


def test_the_side_panel_shows_its_three_sections_without_scrolling_at_1280x800(qtbot, qs):
    # found by a new-user pass under Xvfb: at the default 1280x800 the Tool calls pane was cut
    # at the bottom (the side panel was 825 px in a 751 px view, so it scrolled), because the
    # live figures' tiles make the panel height-for-width and the scroll area then sizes it
    # to its preferred height, where the reasoning and the tool list asked for 192 px each
    win, _ = loaded(qtbot, qs)
    try:
        win.resize(1280, 800)
        settle(qtbot)
        view = win.details_scroll.viewport()
        assert win.details.height() <= view.height(), (win.details.height(), view.height())
        assert win.details_scroll.verticalScrollBar().maximum() == 0
        tools = rect_in(view, win.tools)
        assert tools.height() >= 90 and view.rect().contains(tools), (tools, view.rect())
        assert win.reasoning.height() >= 90
    finally:
        win.shutdown()


def test_a_long_status_message_ends_in_an_ellipsis_with_the_whole_as_tooltip(qtbot, qs):
    # a new user's Xvfb pass: a long status message was cut mid-letter beside "MLX memory"
    win, _ = loaded(qtbot, qs)
    try:
        win.resize(900, 650)
        settle(qtbot)
        text = "Could not read line 1 of the imported file: " + "a long reason " * 20
        win.messages.flash(text, 60_000)
        settle(qtbot)
        assert win.flash_label.text().endswith(text)  # the whole text is kept
        assert win.flash_label.elided()
        assert win.flash_label.toolTip() == win.flash_label.text()
    finally:
        win.shutdown()


@pytest.mark.parametrize("width, compare", [(None, False), (1000, False), (None, True)])
def test_composer_is_whole_at_the_minimum_height(qtbot, qs, width, compare):
    """A new user's resize: the window allowed 680 x 296, and below about 370 px the mode
    switch was drawn over the message box and the settings line ran into Compare and Send
    (with a Compare view open, still at 680 x 460). At the smallest size the window allows,
    the composer's parts are whole and apart."""
    win, _ = loaded(qtbot, qs)
    try:
        if compare:
            send_and_wait(qtbot, win, PROMPT, compare=True)
            assert win.compare_view.isVisible()
        win.resize(width or win.minimumWidth(), 1)  # the window stops at its minimum height
        settle(qtbot)
        assert win.height() == win.minimumHeight()
        c = win.composer
        parts = {"message box": c.edit, "mode switch": c.mode_seg, "colour": c.colour_box,
                 "actions": c.actions, "settings line": c.note}
        window = win.rect()
        for name, w in parts.items():
            assert w.isVisible(), name
            r = rect_in(win, w)
            assert window.contains(r) and rect_in(win, c).contains(r), (name, r, window)
            assert w.height() >= (w.minimumHeight() or w.sizeHint().height()), name
        names = list(parts)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                assert not rect_in(win, parts[a]).intersects(rect_in(win, parts[b])), (a, b)
    finally:
        win.close()


def test_the_benchmark_histogram_fills_its_width_with_one_slot_per_bin(qtbot):
    """16 bins (0..15 accepted) were drawn in 24 slots, leaving the right third empty: each
    bin now has a slot, the last bar ends at the plot's right edge; the cycles chart keeps
    its 24 slots for a few cycles (thin bars, not three wide blocks)."""
    from app.ui.bench_dialog import BenchDialog

    dlg = BenchDialog(None, {"modes": {"plain": {}}, "accepted": [0, 3, 15, 15, 7],
                             "prompts": 1, "block_size": 16})
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.waitExposed(dlg)
    chart = dlg.histogram_chart
    plot = chart.plot_rect()
    bars = chart.bar_rects()
    assert len(bars) == 16 and chart.caption == "0..15 accepted"
    slot = plot.width() / 16
    assert bars[0].left() == pytest.approx(plot.left() + 0.5)
    assert bars[-1].right() == pytest.approx(plot.right() - 1.0)
    assert bars[-1].height() == pytest.approx(plot.height() * 2 / chart.max_value)
    assert bars[1].left() - bars[0].left() == pytest.approx(slot)
    cycles = dlg.cycles_chart.bar_rects()  # five cycles: five thin bars at the left
    assert len(cycles) == 5
    assert cycles[-1].right() < plot.left() + plot.width() * 6 / 24


def test_a_compare_side_stopped_before_its_first_token_is_not_offered(qtbot, qs, tmp_path):
    """After quitting during a Compare, the side that had begun (a summary) but written no
    token was still offered, "continue from DFlash instead", and choosing it made the chat go
    on from an empty reply."""
    path = tmp_path / "chats.db"
    conv_id = _stored_compare(path, {
        "plain": ([1, 2, 3], "abc", "complete", {}),
        "dflash": ([], "", "interrupted", {"top2_gap": None}),
    }, chosen="plain")
    qs.setValue("last_conversation", conv_id)
    win = _restarted(qtbot, qs, path)
    try:
        assert win.conv.id == conv_id
        side = win.conv.messages[-1].versions["dflash"]
        assert not side.never_ran and side.empty  # it began, and wrote nothing
        text = win.chat.toPlainText()
        assert "compare turn" in text and "continue from DFlash instead" not in text
        win._on_chat_link("choose:dflash")
        assert win.conv.messages[-1].chosen == "plain"
    finally:
        win.shutdown()
