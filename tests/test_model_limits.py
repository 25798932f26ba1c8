"""Issue 43, the app's part: a model's limits. The trained chat length a model folder states,
the note a reply keeps when its prompt left turns out, one banner queue with priorities, and
the "DFlash was slower" advice only where the context was not the cause."""

from __future__ import annotations

import json
import os
import re

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from test_ui_window import PROMPT, make_window, send_and_wait  # noqa: E402

from app.chat.baseline import (  # noqa: E402
    LONG_CHAT_NOTE,
    SlowStreak,
    long_context,
)
from app.chat.events import Notice  # noqa: E402
from app.chat.scripted import DEFAULT_TURN, ScriptedSession, ScriptedTurn  # noqa: E402
from app.ui.banners import BannerQueue, Priority  # noqa: E402

LEFT_OUT = Notice("3 earlier turns were left out of the prompt to fit the model's context "
                  "(the prompt takes 3,100 of the 3,584 tokens left for it, before any tool "
                  "results).", left_out_turns=3, prompt_tokens=3100, budget=3584)
LONG_TURN = ScriptedTurn(DEFAULT_TURN.reasoning, DEFAULT_TURN.content, notice=LEFT_OUT)


# ------------------------------------------------------------------ the trained chat length
def test_a_model_folder_may_state_its_trained_chat_length(tmp_path):
    from app.models.catalog import CHAT_LIMITS_FILE, trained_chat_length

    assert trained_chat_length(tmp_path) is None  # no file: the context alone limits
    path = tmp_path / CHAT_LIMITS_FILE
    path.write_text(json.dumps({"trained_chat_tokens": 1500}))
    assert trained_chat_length(tmp_path) == 1500
    for bad in ("not json", json.dumps({"trained_chat_tokens": 0}),
                json.dumps({"trained_chat_tokens": "1500"}), json.dumps([1500]),
                json.dumps({"trained_chat_tokens": True})):
        path.write_text(bad)
        assert trained_chat_length(tmp_path) is None, bad


def test_the_demo_card_states_its_context_and_trained_chat_length():
    from app.models.catalog import context_length, read_config, trained_chat_length
    from app.paths import demo_pair_dirs

    target = demo_pair_dirs()[0]
    trained = trained_chat_length(target)
    context = context_length(read_config(target))
    assert trained is not None and context is not None and trained < context
    card = (target / "README.md").read_text(encoding="utf-8")
    assert f"context of {context:,} tokens" in card
    assert f"{trained:,} tokens" in card


# ------------------------------------------------------------------ the advice
def test_long_context_is_left_out_turns_or_over_half_the_usable_context():
    assert long_context(100, 4096, left_out=True)
    assert not long_context(2048, 4096)
    assert long_context(2049, 4096)
    assert long_context(900, 4096, trained=1625)  # half the trained length, not the context
    assert not long_context(800, 4096, trained=1625)
    assert not long_context(10_000, 0)  # an unknown context says nothing


def test_slow_advice_names_the_long_chat_not_the_block_size():
    streak = SlowStreak()
    for _ in range(3):
        streak.add(0.8)
    assert streak.advice() == SlowStreak.NOTE and "smaller block size" in streak.advice()
    streak.add(0.7, long_context=True)
    assert streak.advice() == LONG_CHAT_NOTE
    assert "Start a new chat" in LONG_CHAT_NOTE and "smaller block" not in \
        LONG_CHAT_NOTE.split(":")[0]
    streak.add(1.5)
    assert streak.advice() is None  # not slow: no advice at all


# ------------------------------------------------------------------ the banner queue
def test_the_queue_shows_the_highest_and_keeps_the_lesser_waiting():
    q = BannerQueue()
    left_out = q.push("turns left out", "note", Priority.WARNING)
    q.push("DFlash was slower", "note", Priority.TIP)
    assert q.top() is left_out  # the tip came later and waits
    err = q.push("could not export", "error", Priority.ERROR)
    assert q.top() is err
    q.drop(lambda e: e is err)
    assert q.top() is left_out
    q.drop(lambda e: e is left_out)
    assert q.top().text == "DFlash was slower"
    newer = q.push("DFlash was slower again", "note", Priority.TIP)
    assert q.top() is newer and len(q) == 1  # one per priority: the newest
    q.push("expires", "note", Priority.NOTE, expires=5.0)
    assert q.top(now=4.0).text == "expires" and q.next_expiry() == 5.0
    assert q.top(now=5.0) is newer


def test_the_window_never_covers_a_note_with_a_lesser_one(qtbot, qs):
    win = make_window(qtbot, qs, ScriptedSession())
    try:
        win.messages.show_note(LEFT_OUT.message, Priority.WARNING)
        win.messages.show_note(SlowStreak.NOTE, Priority.TIP)  # ~20 ms later in the issue
        assert "earlier turns were left out" in win.banner.text()
        assert win.messages.banner_kind == "note"
        win.messages.show_banner("could not export: disk full")  # an error outranks every note
        assert win.messages.banner_kind == "error"
        assert win.banner.text() == "Could not export: disk full."
        assert win.banner.accessibleName() == "Error"
        win.banner_close.click()  # dismissed: the waiting note shows again
        assert win.messages.banner_kind == "note"
        assert "earlier turns were left out" in win.banner.text()
        win.banner_close.click()
        assert "smaller block size" in win.banner.text()
        win.banner_close.click()
        assert win.messages.banner_kind == "" and not win.banner_row.isVisibleTo(win)
        # a note that expires lets the lesser one show by itself
        win.messages.show_note("tools are off", Priority.TIP)
        win.messages.show_note("saved for this chat", ms=50)
        assert win.banner.text() == "Saved for this chat."
        qtbot.waitUntil(lambda: win.banner.text() == "Tools are off.", timeout=5_000)
        # a same-priority note replaces the shown one, and clear_banner empties the queue
        win.messages.show_note("a newer tip", Priority.TIP)
        assert win.banner.text() == "A newer tip." and len(win.messages.banners) == 1
        win.messages.clear_banner()
        assert len(win.messages.banners) == 0 and win.messages.banner_kind == ""
    finally:
        win.shutdown()


# ------------------------------------------------------------------ the lasting note
def _loaded(qtbot, qs, backend, store=None):
    from app.ui.window import MainWindow

    win = MainWindow(backend=backend, qsettings=qs, auto_load=False, store=store)
    qtbot.addWidget(win)
    win.show()
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
    return win


def test_left_out_turns_stay_noted_with_the_reply_after_reopening(qtbot, qs, tmp_path):
    from app.chat.turns import CONTEXT_KEY, ViewStore

    path = tmp_path / "chats.sqlite"
    backend = ScriptedSession(turns=[DEFAULT_TURN, LONG_TURN])
    win = _loaded(qtbot, qs, backend, ViewStore(str(path)))
    try:
        first = send_and_wait(qtbot, win, PROMPT, mode="dflash")
        assert first.version.result.context_note is None
        assert "left out" not in win.chat.toPlainText()
        msg = send_and_wait(qtbot, win, "And its population?", mode="dflash")
        assert msg.version.result.context_note == LEFT_OUT
        assert "3 earlier turns left out" in win.chat.toPlainText()
        assert win.chat.tooltip_of("3 earlier turns left out") == LEFT_OUT.message
        assert "earlier turns were left out" in win.banner.text()
        conv_id = win.conv.id
        row = win.store.db.get_message(msg.ids[msg.chosen])
        assert row.generation[CONTEXT_KEY] == LEFT_OUT.to_dict()
    finally:
        win.shutdown()
    # a new window on the same chats: the note is in the reopened reply's footer
    again = _loaded(qtbot, qs, ScriptedSession(), ViewStore(str(path)))
    try:
        again.select_conversation(again.store.get(conv_id))
        replies = [m for m in again.conv.messages if m.role == "assistant"]
        assert replies[-1].version.result.context_note == LEFT_OUT
        assert replies[0].version.result.context_note is None
        text = again.chat.toPlainText()
        assert text.count("earlier turns left out") == 1
        assert again.chat.tooltip_of("3 earlier turns left out") == LEFT_OUT.message
    finally:
        again.shutdown()


def _speed(backend, tok_per_s, prompt_tokens=42):
    backend.figures = dict(backend.figures, tok_per_s=tok_per_s, prompt_tokens=prompt_tokens)


def test_slow_dflash_in_a_long_chat_says_start_a_new_chat(qtbot, qs):
    """The issue's sequence: turns left out, DFlash slower than plain three times. The
    left-out note stays; under it waits the long-chat advice, never the block-size one."""
    backend = ScriptedSession()
    win = _loaded(qtbot, qs, backend)
    try:
        _speed(backend, 30.0)
        for _ in range(3):
            send_and_wait(qtbot, win, PROMPT, mode="plain")
            win.new_chat()
        backend.turns = [LONG_TURN]
        for i in range(3):
            _speed(backend, 20.0 + i)
            send_and_wait(qtbot, win, PROMPT, mode="dflash")
            assert "earlier turns were left out" in win.banner.text(), i
        assert "x plain" in win.chat.toPlainText()  # it was slower than comparable plain
        assert not any("smaller block size" in e.text
                       for e in win.messages.banners.entries.values())
        win.banner_close.click()
        assert win.banner.text() == LONG_CHAT_NOTE
        assert "smaller block size" not in win.banner.text()
    finally:
        win.shutdown()


def test_slow_dflash_in_a_short_chat_keeps_the_block_size_advice(qtbot, qs):
    backend = ScriptedSession()
    win = _loaded(qtbot, qs, backend)
    try:
        _speed(backend, 30.0)
        for _ in range(3):
            send_and_wait(qtbot, win, PROMPT, mode="plain")
            win.new_chat()
        for i in range(3):
            _speed(backend, 20.0 + i)
            send_and_wait(qtbot, win, PROMPT, mode="dflash")
            if i < 2:
                win.new_chat()
        assert win.banner.text() == SlowStreak.NOTE
        # a prompt over half the context is a long chat too, without turns left out
        win.new_chat()
        _speed(backend, 20.0, prompt_tokens=int(win.model.context_length * 0.6))
        for _ in range(3):
            send_and_wait(qtbot, win, PROMPT, mode="plain")
        backend.figures = dict(backend.figures, tok_per_s=15.0)
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        assert win.banner.text() == LONG_CHAT_NOTE
    finally:
        win.shutdown()


@pytest.mark.parametrize("shortened", [0, 2])
def test_notice_round_trips_and_labels(shortened):
    n = Notice("m", left_out_turns=0 if shortened else 1, shortened_turns=shortened,
               prompt_tokens=5, budget=9)
    assert Notice.from_dict(n.to_dict()) == n
    assert n.label() == ("earlier tool results shortened" if shortened
                         else "1 earlier turn left out")
    assert Notice.from_dict({"message": 3}) is None and Notice.from_dict(None) is None
    assert re.fullmatch(r"\d+ earlier turns left out", LEFT_OUT.label())
