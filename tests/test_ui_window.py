"""The desktop window, offscreen (pytest-qt): chat, reasoning and tool panes, live panel,
Stop, plain == DFlash, Compare, load errors, and no MLX call on the GUI thread.

Two kinds of backend: the real one (``ChatSession`` over a tiny random-weight pair built by
``app.models.tiny``) and a scripted one that emits the engine's and the chat pipeline's real
event dataclasses at a controlled pace (for Stop and exact figures).
"""

from __future__ import annotations

import os
import threading

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine_fixtures import FakeCancel  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402

from app.chat.pipeline import ContentDelta  # noqa: E402
from app.chat.scripted import DEFAULT_TURN, ScriptedSession, ScriptedTurn  # noqa: E402
from app.chat.session import ChatSession  # noqa: E402
from app.chat.settings import ReplySettings, Sampling  # noqa: E402
from app.chat.storage import _prompt_dicts  # noqa: E402
from app.chat.stored_turn import TurnRequest  # noqa: E402
from app.engine.errors import WrongThreadError  # noqa: E402
from app.engine.events import Done, Summary, TokenEvent  # noqa: E402
from app.engine.modes import Mode  # noqa: E402
from app.ui.chat import NO_ANSWER_IN_REASONING  # noqa: E402
from app.ui.compare import first_difference  # noqa: E402
from app.ui.panels import FIGURES, format_figure  # noqa: E402
from app.ui.worker import assert_not_gui_thread  # noqa: E402

PROMPT = "What is the capital of France?"


# ------------------------------------------------------------------ helpers
# ``qs`` and the autouse ``_allow_engine_after`` are conftest.py fixtures.


def make_window(qtbot, qs, backend):
    from app.ui.window import MainWindow

    win = MainWindow(backend=backend, qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.show()
    return win


def close_window(win):
    win.shutdown()


class _ScriptedTokens(FakeCancel):
    """A stand-in engine generation that emits ``ids`` as plain tokens, then ends."""

    def __init__(self, ids):
        super().__init__()
        self.ids = ids

    def __iter__(self):
        for i, t in enumerate(self.ids):
            yield TokenEvent(t, i, False)
        yield Done(Summary(mode="plain", generated_tokens=len(self.ids), stop_cause="end_token"))


def send_and_wait(qtbot, win, text, mode=None, compare=False, timeout=120_000):
    if mode:
        win.composer.set_mode(mode)
    with qtbot.waitSignal(win.replyFinished, timeout=timeout) as blocker:
        assert (win.replies.compare(text) if compare else win.send(text))
    return blocker.args[0]


def send_and_stop(qtbot, win, running, text=PROMPT):
    """Load the scripted pair, send ``text`` in DFlash and press Stop once ``running(side)``
    holds for the running reply's side; returns the finished message. Asserts Stop was
    enabled when pressed."""
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
    win.composer.set_mode("dflash")
    with qtbot.waitSignal(win.replyFinished, timeout=30_000) as blocker:
        assert win.send(text)
        qtbot.waitUntil(lambda: win.replies.run is not None and running(win.replies.run.sides[""]),
                        timeout=10_000)
        assert win.composer.stop_btn.isEnabled()
        win.composer.stop_btn.click()
    return blocker.args[0]


def send_refused_by_storage(qtbot, win, monkeypatch, text="Tell me more."):
    """Send ``text`` while the store refuses to begin a reply ("the disk is full"); waits until
    the window is idle again and asserts it said so. The refusal stays patched in
    (``monkeypatch.undo()`` lifts it)."""
    from app.chat.storage import StorageError

    def refuse(*args, **kwargs):
        raise StorageError("the disk is full")

    monkeypatch.setattr(win.store.db, "begin_reply", refuse)
    assert win.send(text)
    qtbot.waitUntil(lambda: not win.busy, timeout=10_000)
    assert "Could not save this turn" in win.banner.text()


ScriptedBackend = ScriptedSession
"""The scripted session (``app.chat.scripted``): reasoning, content with a code block, tokens
and DFlash cycles; ``delay_s`` per cycle; the cancel event checked before every cycle like the
engine does."""


# ------------------------------------------------------------------ scripted backend
def test_prompt_fills_chat_reasoning_and_live_panel(qtbot, qs):
    backend = ScriptedBackend(cycles=7, block=4)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        msg = send_and_wait(qtbot, win, PROMPT, mode="dflash")
        chat_text = win.chat.toPlainText()
        assert "Paris" in chat_text and "w5" in chat_text
        assert PROMPT in chat_text
        assert win.reasoning.toPlainText() == "Paris is the capital. Say it plainly."
        s = backend.summary
        shown = win.live.shown
        assert shown["acceptance"] == s.acceptance_rate
        assert shown["tau"] == s.tau
        assert shown["replays"] == s.replays
        assert shown["rollback_share"] == s.rollback_share
        assert shown["tok_per_s"] == s.tok_per_s
        assert shown["ttft"] == s.ttft_s
        assert shown["cycles"] == s.cycles == 7
        assert shown["tokens"] == s.generated_tokens
        assert shown["context"] == (s.prompt_tokens + s.generated_tokens, 2048)
        for key, _name, _tip in FIGURES:
            assert win.live.labels[key].text() == format_figure(key, shown[key])
            assert win.live.labels[key].toolTip()
        assert win.live.chart.values == [0, 1, 2, 3, 0, 1, 2]
        v = msg.version
        assert v.result.mode == "dflash" and not v.stopped
        assert v.result.from_draft.count(True) == s.accepted
        # the code block got a copy link that copies the code
        assert win.chat.codes == ["print('Paris')"]
        QGuiApplication.clipboard().setText("")
        from PySide6.QtCore import QUrl

        win.chat.anchorClicked.emit(QUrl("copy:0"))
        assert QGuiApplication.clipboard().text() == "print('Paris')"
    finally:
        close_window(win)


def test_stop_leaves_partial_reply_marked_stopped(qtbot, qs):
    backend = ScriptedBackend(cycles=100_000, block=4, delay_s=0.002)
    win = make_window(qtbot, qs, backend)
    try:
        v = send_and_stop(qtbot, win, lambda side: side.stats.cycles >= 5).version
        assert v.stopped
        assert v.result.finish_reason == "cancelled"
        assert 5 <= backend.emitted_cycles < 100_000
        assert v.result.summary.cycles == backend.emitted_cycles
        assert win.live.shown["cycles"] == backend.emitted_cycles
        assert len(v.result.tokens) == backend.summary.generated_tokens
        assert "stopped" in win.chat.toPlainText()
        assert win.composer.send_btn.isEnabled() and not win.composer.stop_btn.isEnabled()
    finally:
        close_window(win)


def test_load_error_shows_message_and_window_stays_usable(qtbot, qs):
    backend = ScriptedBackend(fail_load="broken-model")
    win = make_window(qtbot, qs, backend)
    try:
        with qtbot.waitSignal(win.loadFailed, timeout=10_000):
            win.load_model("broken-model", "")
        assert win.banner_row.isVisible()
        assert "config.json is missing" in win.banner.text()
        assert win.model is None
        assert not win.send("hello")  # no model: a message, no crash
        assert "No model is loaded" in win.banner.text()
        win.load_model("good-model", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        msg = send_and_wait(qtbot, win, "hello again", mode="plain")
        assert msg.version is not None and msg.version.result.tokens
    finally:
        close_window(win)


def test_engine_load_error_from_real_loader(qtbot, qs, tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    win = make_window(qtbot, qs, ChatSession())
    try:
        with qtbot.waitSignal(win.loadFailed, timeout=30_000) as blocker:
            win.load_model(str(empty), "")
        assert "config.json" in blocker.args[0] or "not-a-model" in blocker.args[0]
        assert blocker.args[0] in win.banner.text()
        assert win.isVisible() and win.composer.edit.isEnabled()
    finally:
        close_window(win)


def test_wrong_thread_guard_raises_on_gui_thread(qtbot, qs):
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        with pytest.raises(WrongThreadError):
            assert_not_gui_thread("load_target")
    finally:
        close_window(win)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


# ------------------------------------------------------------------ the real engine
@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from app.models.tiny import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("ui_tiny"), "qwen3_5", seed=0, block_size=8)


@pytest.fixture
def engine_window(qtbot, qs, tiny_dirs, monkeypatch):
    """A window on the tiny pair whose engine entry points record their thread."""
    import app.chat.reply as reply_mod
    import app.engine.generate as gen_mod
    import app.models.loader as loader_mod

    calls: list[tuple[str, int]] = []

    def recording(name, fn):
        def wrapper(*a, **k):
            calls.append((name, threading.get_ident()))
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(loader_mod, "load_target", recording("load_target",
                                                             loader_mod.load_target))
    monkeypatch.setattr(loader_mod, "load_drafter", recording("load_drafter",
                                                              loader_mod.load_drafter))
    monkeypatch.setattr(gen_mod, "generate", recording("generate", gen_mod.generate))
    monkeypatch.setattr(reply_mod, "run_reply", recording("run_reply", reply_mod.run_reply))
    win = make_window(qtbot, qs, ChatSession())
    win.engine_calls = calls
    t, d = tiny_dirs
    with qtbot.waitSignal(win.modelLoaded, timeout=60_000):
        win.load_model(str(t), str(d))
    yield win
    close_window(win)


def test_tiny_pair_plain_equals_dflash_and_compare_identical(qtbot, engine_window):
    win = engine_window
    main = threading.get_ident()
    plain = send_and_wait(qtbot, win, PROMPT, mode="plain").version.result
    win.new_chat()
    dflash = send_and_wait(qtbot, win, PROMPT, mode="dflash").version.result
    assert plain.mode == "plain" and dflash.mode == "dflash"
    assert len(plain.tokens) == 12
    assert plain.tokens == dflash.tokens
    assert plain.content == dflash.content and plain.reasoning == dflash.reasoning
    # the panel shows the finished reply's engine summary
    s = dflash.summary
    assert s.mode == "dflash" and s.cycles > 0
    assert win.live.shown["cycles"] == s.cycles
    assert win.live.shown["tau"] == s.tau
    assert win.live.shown["acceptance"] == s.acceptance_rate
    assert win.live.shown["tokens"] == s.generated_tokens
    assert win.reasoning.toPlainText() == dflash.reasoning
    # thinking on: the template pre-opens <think>, so the random text is reasoning
    assert dflash.reasoning
    win.new_chat()
    msg = send_and_wait(qtbot, win, PROMPT, compare=True)
    assert msg.is_compare and msg.chosen == "dflash"
    header = win.compare_view.header.text()
    assert header.startswith(f"identical, {len(plain.tokens)} tokens")
    assert msg.versions["plain"].result.tokens == plain.tokens
    win.compare_view.buttons["plain"].click()
    assert msg.chosen == "plain"
    # no engine entry point ran on the GUI thread
    names = {n for n, _ in win.engine_calls}
    assert {"load_target", "load_drafter", "run_reply", "generate"} <= names
    assert all(ident != main for _, ident in win.engine_calls)


def test_second_turn_reuses_the_prefix_and_the_panel_says_so(qtbot, engine_window):
    win = engine_window
    win.new_chat()
    # after the reply the worker is asked to prefill the chat's next turn (while the user writes)
    with qtbot.waitSignal(win.worker.prefillRequested, timeout=60_000) as asked:
        first = send_and_wait(qtbot, win, PROMPT, mode="dflash").version.result
    assert asked.args[0] == win.conv.id and asked.args[1].mode == "dflash"
    # only what the template writes before a first message was prefilled after the load
    assert first.summary.reused_tokens < 8
    second = send_and_wait(qtbot, win, "And another one?", mode="dflash").version.result
    s = second.summary
    assert first.summary.reused_tokens + 8 < s.reused_tokens < s.prompt_tokens
    assert win.live.shown["prompt"] == (s.reused_tokens, s.prompt_tokens - s.reused_tokens)


def test_a_load_prefills_a_new_chats_preamble_for_the_first_reply(qtbot, qs, tiny_dirs):
    """After a load the worker prefills a new chat's system prompt and tools with the
    window's settings, so the first reply of a fresh start reads only its message."""
    qs.setValue("generation/system_prompt", "You are a terse assistant. Answer in one line.")
    win = make_window(qtbot, qs, ChatSession())
    t, d = tiny_dirs
    with qtbot.waitSignal(win.worker.preambleRequested, timeout=60_000) as asked:
        win.load_model(str(t), str(d))
    settings, system_prompt = asked.args
    assert system_prompt == "You are a terse assistant. Answer in one line."
    assert settings.mode == win.composer.mode() and settings.system_prompt == system_prompt
    win.new_chat()
    first = send_and_wait(qtbot, win, PROMPT).version.result.summary
    preamble = len(win.worker.backend.target.tokenizer.encode(
        "<|im_start|>system\nYou are a terse assistant. Answer in one line.<|im_end|>\n"))
    assert preamble <= first.reused_tokens < first.prompt_tokens
    close_window(win)


def test_tool_call_goes_to_tool_pane_not_chat(qtbot, engine_window, tiny_dirs, monkeypatch):
    """The real pipeline and tool runner over a scripted token stream."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    import app.chat.reply as reply_mod

    tok = load_tokenizer(tiny_dirs[0])
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    rounds = [
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n2+3\n</parameter>\n"
        "</function>\n</tool_call>",
        "The sum is 5.",
    ]

    script = iter(rounds)

    def fake_generate(target, prompt_ids, config, drafter=None, **kwargs):
        return _ScriptedTokens(list(tok.encode(next(script), add_special_tokens=False)) + [eos])

    monkeypatch.setattr(reply_mod, "_engine_generate", fake_generate)
    win = engine_window
    win.defaults["use_tools"] = True
    win.defaults["thinking"] = False
    msg = send_and_wait(qtbot, win, "What is 2+3?", mode="plain")
    r = msg.version.result
    assert r.content == "The sum is 5."
    calls = win.tools.calls()
    assert [c["name"] for c in calls] == ["calculator"]
    assert calls[0]["arguments"] == {"expression": "2+3"}
    assert calls[0]["result"] == 5
    top = win.tools.topLevelItem(0)
    assert top.text(0) == "calculator" and top.text(1) == "done"
    chat = win.chat.toPlainText()
    assert "The sum is 5." in chat
    assert "<tool_call>" not in chat and "<function=" not in chat


def test_next_turn_prompt_keeps_the_tool_call_and_result(qtbot, engine_window, tiny_dirs,
                                                         monkeypatch):
    """The window builds the prompt from the stored messages: turn 1's tool call and tool
    result reach turn 2 (they were lost when the prompt kept role and content only)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    import app.chat.reply as reply_mod

    tok = load_tokenizer(tiny_dirs[0])
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    script = iter([
        "<tool_call>\n<function=country_info>\n<parameter=name>\nChile\n</parameter>\n"
        "</function>\n</tool_call>",
        "Chile's capital is Santiago.",
        "About 19.6 million.",
    ])
    prompts: list[str] = []

    def fake_generate(target, prompt_ids, config, drafter=None, **kwargs):
        prompts.append(tok.decode(list(prompt_ids)))
        return _ScriptedTokens(list(tok.encode(next(script), add_special_tokens=False)) + [eos])

    monkeypatch.setattr(reply_mod, "_engine_generate", fake_generate)
    win = engine_window
    win.defaults["use_tools"] = True
    win.defaults["thinking"] = False
    win.new_chat()
    first = send_and_wait(qtbot, win, "Tell me about Chile.", mode="plain")
    assert first.version.result.content == "Chile's capital is Santiago."
    second = send_and_wait(qtbot, win, "And its population?", mode="plain")
    assert second.version.result.content == "About 19.6 million."
    assert len(prompts) == 3
    turn2 = prompts[2]
    assert "<function=country_info>" in turn2 and '"population": 19600000' in turn2
    assert turn2.index("19600000") < turn2.index("And its population?")
    # and the stored reply keeps its rounds across a reload of the conversation
    reloaded = win.store.get(win.conv.id).messages[1].version.result
    assert [m["role"] for m in reloaded.messages] == ["assistant", "tool", "assistant"]


# ------------------------------------------------------------------ storage
def test_conversation_survives_relaunch_and_quit_saves_partial_reply(qtbot, qs, tmp_path):
    from app.chat.turns import ViewStore

    db = tmp_path / "conversations.db"
    from app.ui.window import MainWindow

    backend = ScriptedBackend(cycles=5, block=4)
    win = MainWindow(backend=backend, store=ViewStore(db), qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
    first = send_and_wait(qtbot, win, PROMPT, mode="dflash").version.result
    # a long second reply, cut by quitting the app
    backend.cycles, backend.delay_s = 100_000, 0.002
    win.composer.set_mode("plain")
    assert win.send("Tell me more.")
    qtbot.waitUntil(lambda: win.replies.run is not None
                    and win.replies.run.sides[""].stats.cycles >= 3, timeout=10_000)
    conv_id = win.conv.id
    win.shutdown()
    assert not win.busy
    partial_tokens = backend.summary.generated_tokens

    win2 = MainWindow(backend=ScriptedBackend(), store=ViewStore(db), qsettings=qs,
                      auto_load=False)
    qtbot.addWidget(win2)
    try:
        conv = win2.conv
        assert conv is not None and conv.id == conv_id
        assert conv.title == PROMPT
        roles = [m.role for m in conv.messages]
        assert roles == ["user", "assistant", "user", "assistant"]
        reloaded = conv.messages[1].version.result
        assert reloaded.content == first.content
        assert reloaded.tokens == first.tokens and reloaded.from_draft == first.from_draft
        assert reloaded.summary.tau == first.summary.tau
        last = conv.messages[3]
        assert last.version.stopped and last.version.interrupted  # quit: "interrupted"
        assert len(last.version.result.tokens) == partial_tokens
        assert last.version.result.content.startswith("The capital is **Paris**.")
        assert "interrupted" in win2.chat.toPlainText()
    finally:
        win2.shutdown()


REPLY_WRITES = ("add_message", "begin_reply", "begin_compare", "regenerate", "edit_user_message",
                "update_partial", "finish_reply")
"""The store's methods that write a reply (its user message, rows, growth, final state)."""


def test_replies_are_stored_off_the_gui_thread(qtbot, qs, tmp_path):
    """The window never writes a reply itself: send, regenerate, Compare and edit are all
    stored by the worker thread (``app.chat.stored_turn.run_turn``); the GUI thread only
    reads the store back."""
    from app.chat.turns import ViewStore
    from app.ui.window import MainWindow

    store = ViewStore(tmp_path / "c.db")
    calls: list[tuple[str, bool]] = []
    for name in REPLY_WRITES:
        method = getattr(store.db, name)

        def spy(*args, _name=name, _method=method, **kwargs):
            calls.append((_name, threading.current_thread() is threading.main_thread()))
            return _method(*args, **kwargs)

        setattr(store.db, name, spy)
    win = MainWindow(backend=ScriptedBackend(cycles=3), store=store, qsettings=qs,
                     auto_load=False)
    qtbot.addWidget(win)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        first = send_and_wait(qtbot, win, PROMPT, mode="dflash")
        win.composer.set_mode("plain")
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.regenerate()
        send_and_wait(qtbot, win, "Compare this.", compare=True)
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.edit_message(2, "Compare this, edited.")
        names = {n for n, _ in calls}
        assert {"add_message", "begin_reply", "begin_compare", "regenerate",
                "edit_user_message", "finish_reply"} <= names
        assert [n for n, on_gui in calls if on_gui] == []
        # and the view holds what the store holds
        assert first.ids == {"dflash": first.ids["dflash"], "plain": first.ids["plain"]}
        assert store.db.get_message(first.ids["plain"]).status == "complete"
        assert [m.content for m in win.conv.messages if m.role == "user"] == \
            [PROMPT, "Compare this, edited."]
        assert win.conv.messages[-1].ids[win.conv.messages[-1].chosen] == \
            store.db.active_path(win.conv.id)[-1].id
    finally:
        win.shutdown()


def test_a_turn_that_cannot_be_stored_leaves_the_chat_as_it_was(qtbot, qs, monkeypatch):

    backend = ScriptedBackend(cycles=2)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        first = send_and_wait(qtbot, win, PROMPT, mode="plain")
        stored = [(m.id, m.status) for m in win.store.db.messages(win.conv.id)]

        send_refused_by_storage(qtbot, win, monkeypatch)
        assert "the disk is full" in win.banner.text()
        assert win.conv.messages == [win.conv.messages[0], first]
        assert win.composer.edit.toPlainText() == "Tell me more."
        assert [(m.id, m.status) for m in win.store.db.messages(win.conv.id)] == stored
        assert backend.turn == 1  # no reply ran
        monkeypatch.undo()
        win.composer.edit.clear()
        msg = send_and_wait(qtbot, win, "Tell me more.")
        assert msg.version.result.content and len(win.conv.messages) == 4
    finally:
        close_window(win)


# ------------------------------------------------------------------ settings, about
def test_hand_edited_settings_out_of_range_take_the_defaults(qtbot, qs, caplog):
    """The tester's settings.ini: out-of-range values and ``@Invalid()`` take the defaults
    (not the nearest bound, not the text "None"), in the dialog and in the reply."""
    from app.ui import settings as settings_mod

    qs.beginGroup("generation")
    for key, value in {"max_tokens": "-5", "top_p": "0", "min_p": "7", "system_prompt": None,
                       "block_size": 999, "temperature": -5}.items():
        qs.setValue(key, value)
    qs.endGroup()
    table = settings_mod.DEFAULTS
    with caplog.at_level("WARNING", logger="app.ui.settings"):
        backend = ScriptedBackend(cycles=2)
        win = make_window(qtbot, qs, backend)
    try:
        assert len(caplog.records) == 6
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        assert dlg.max_tokens.value() == table["max_tokens"]
        assert dlg.top_p.value() == table["top_p"] and dlg.min_p.value() == table["min_p"]
        assert dlg.temperature.value() == table["temperature"]
        assert dlg.block.value() == table["block_size"]
        assert dlg.system.toPlainText() == table["system_prompt"]
        dlg.reject()
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        s = backend.last_settings
        assert s.max_tokens == table["max_tokens"]
        assert s.sampling == Sampling()
        assert backend.last_messages[0] == {"role": "system",
                                            "content": table["system_prompt"]}
    finally:
        close_window(win)


def test_conversation_settings_override_app_defaults(qtbot, qs):
    from app.ui import settings as settings_mod

    settings_mod.save_defaults(qs, {"max_tokens": 77, "system_prompt": "Be brief.",
                                    "block_size": 0, "stop_strings": ["END", "###"]})
    backend = ScriptedBackend(cycles=2)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        with qtbot.waitSignal(win.worker.replyRequested, timeout=10_000) as asked:
            send_and_wait(qtbot, win, "first", mode="dflash")
        request = asked.args[1]  # what crosses to the worker thread: one typed record
        assert isinstance(request, TurnRequest) and isinstance(request.settings, ReplySettings)
        s = backend.last_settings
        assert s is request.settings  # handed to the backend as it was built
        assert s.mode == Mode.DFLASH and s.max_tokens == 77 and s.block_size is None
        assert s.stop == ["END", "###"] and s.system_prompt == "Be brief."
        assert backend.last_messages[0] == {"role": "system", "content": "Be brief."}
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        assert dlg.max_tokens.value() == 77
        dlg.max_tokens.setValue(5)
        dlg.block.setValue(3)
        dlg.for_chat.click()
        assert win.conv.settings["max_tokens"] == 5 and win.conv.settings["block_size"] == 3
        assert win.conv.settings["stop_strings"] == ["END", "###"]  # every value is kept
        send_and_wait(qtbot, win, "second", mode="dflash")
        assert backend.last_settings.max_tokens == 5
        assert backend.last_settings.block_size == 3
        # history carries the first turn
        assert [m["role"] for m in backend.last_messages] == ["system", "user", "assistant",
                                                              "user"]
        win.new_chat()
        send_and_wait(qtbot, win, "third", mode="dflash")
        assert backend.last_settings.max_tokens == 77
        assert settings_mod.load_defaults(qs)["max_tokens"] == 77
    finally:
        close_window(win)


def test_chat_settings_stay_as_saved_when_the_defaults_change(qtbot, qs):
    """"Save for this chat" keeps the chat's settings as they were saved: a later "Save as
    defaults" from another chat changes neither its stored row nor what its next reply uses.
    A chat stored with only the values that differed from the defaults still reads them
    over the defaults."""
    from app.ui import settings as settings_mod

    win = make_window(qtbot, qs, ScriptedBackend(cycles=2))
    try:
        win.new_chat()
        chat_a = win.conv
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        dlg.block.setValue(4)
        dlg.thinking.setChecked(False)
        dlg.for_chat.click()
        saved_a = dict(win.state.current_settings())
        assert saved_a["block_size"] == 4 and saved_a["thinking"] is False
        assert saved_a["stop_strings"] == [] and saved_a["auto_block"] is False
        win.transcript.select_conversation(win.state.store.new())  # chat B
        assert win.conv.id != chat_a.id
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        dlg.stops.setText("Paris")
        dlg.system.setPlainText("Answer in one word.")
        dlg.auto_block.setChecked(True)
        dlg.as_defaults.click()
        assert settings_mod.load_defaults(qs)["stop_strings"] == ["Paris"]
        win.transcript.select_conversation(win.state.store.get(chat_a.id))
        assert win.state.current_settings() == saved_a
        assert win.state.store.get(chat_a.id).settings == saved_a
        assert win.composer.note.text().startswith("Next reply: ") \
            and "auto" not in win.composer.note.text()
        # a row saved before (only what differed from the defaults) still follows them
        win.conv.settings = {"block_size": 4, "thinking": False}
        now = win.state.current_settings()
        assert now["stop_strings"] == ["Paris"] and now["block_size"] == 4
        assert now["system_prompt"] == "Answer in one word." and now["thinking"] is False
        # "Save as defaults" in a chat of its own settings: that chat follows the defaults
        win.conv.settings = dict(saved_a)
        win.transcript.open_settings()
        dlg = win.transcript.settings_dialog
        dlg.max_tokens.setValue(99)
        dlg.as_defaults.click()
        assert win.conv.settings == {} and win.state.store.get(chat_a.id).settings == {}
        assert win.state.current_settings()["max_tokens"] == 99
        assert win.state.current_settings()["block_size"] == 4  # the dialog's, now default
        assert win.banner.text().startswith("Saved as the defaults: this chat and every chat")
    finally:
        close_window(win)


def test_a_chat_override_the_table_refuses_starts_no_reply(qtbot, qs):
    """A stored chat override out of range (a hand-edited database) is named in the banner;
    nothing is sent to the worker and the message goes back to the composer."""
    backend = ScriptedBackend(cycles=2)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        win.new_chat()
        win.conv.settings = {"max_tokens": 0}
        asked = []
        win.worker.replyRequested.connect(lambda *args: asked.append(args))
        assert not win.send("Hello?")
        assert "max_tokens 0 is out of range" in win.banner.text()
        assert win.composer.edit.toPlainText() == "Hello?" and not asked
        assert backend.last_settings is None and not win.busy
    finally:
        close_window(win)


def test_about_box_and_debug_info(qtbot, qs):
    backend = ScriptedBackend()
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("/models/target-x", "/models/drafter-y")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        win.show_about()
        dlg = win._about
        from PySide6.QtWidgets import QTextBrowser

        texts = {tb.accessibleName(): tb.toPlainText() for tb in dlg.findChildren(QTextBrowser)}
        assert "LGPL" in texts["Licences"]
        assert "/models/target-x" in texts["Versions"]
        QGuiApplication.clipboard().setText("")
        dlg.copy_debug_info()
        text = QGuiApplication.clipboard().text()
        assert "PySide6" in text and "mlx-lm" in text and "BLAS" in text
        assert "target: /models/target-x" in text and "drafter: /models/drafter-y" in text
    finally:
        close_window(win)


def test_debug_info_names_the_dflash2_drafter_too(qtbot, qs):
    backend = ScriptedBackend(info={"target_name": "t", "drafter_name": "d",
                                    "drafter2_name": "d2", "drafter2_path": "/models/d2",
                                    "context_length": 2048, "memory_bytes": 0})
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("/models/t", "/models/d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        win.copy_debug_info()
        text = QGuiApplication.clipboard().text()
        assert "drafter: /models/d\n" in text and "DFlash2 drafter: /models/d2" in text
    finally:
        close_window(win)
    win = make_window(qtbot, qs, ScriptedBackend())  # a pair without one says nothing of it
    try:
        win.load_model("/models/t", "/models/d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        win.copy_debug_info()
        assert "DFlash2" not in QGuiApplication.clipboard().text()
    finally:
        close_window(win)


def test_long_history_is_trimmed_and_user_told(qtbot, engine_window):
    win = engine_window
    backend = win.workers.worker.backend
    long_text = "The capital of France is Paris, and it uses the euro. " * 4
    win.composer.set_mode("plain")
    send_and_wait(qtbot, win, long_text)
    prompt_1 = win.conv.messages[-1].version.result.summary.prompt_tokens
    backend.target.context_length = prompt_1 + 30  # room for one turn and the reply only
    msg = send_and_wait(qtbot, win, long_text)
    assert "1 earlier turn was left out" in win.banner.text()
    # the second prompt was built without the first turn: same length as the first
    assert msg.version.result.summary.prompt_tokens == prompt_1
    assert len(win.conv.messages) == 4  # nothing is dropped from the conversation itself


def test_regenerate_switch_versions_compare_export_import_search(qtbot, qs, tmp_path):
    import json

    from app.chat.turns import ViewStore
    from app.ui.window import MainWindow

    db = tmp_path / "conversations.db"
    backend = ScriptedBackend(cycles=3, block=4)
    win = MainWindow(backend=backend, store=ViewStore(db), qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        first = send_and_wait(qtbot, win, PROMPT, mode="dflash")
        backend.cycles = 5
        win.composer.set_mode("plain")
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.regenerate()
        msg = win.conv.messages[-1]
        assert msg is first and list(msg.versions) == ["dflash", "plain"]
        assert msg.chosen == "plain" and len(win.conv.messages) == 2
        assert "version 2 of 2" in win.chat.toPlainText()
        win._on_chat_link("version:1:dflash")
        assert msg.chosen == "dflash"
        # a Compare turn on top, continued from Plain
        cmp_msg = send_and_wait(qtbot, win, "Compare this.", compare=True)
        assert cmp_msg.compare and cmp_msg.chosen == "dflash"
        win.compare_view.buttons["plain"].click()
        assert cmp_msg.chosen == "plain"
        conv_id = win.conv.id
        win.conversations.rename_conversation("Capitals")
        out = tmp_path / "chat.json"
        assert win.conversations.export_chat(str(out))
        data = json.loads(out.read_text())
        assert data["conversation"]["title"] == "Capitals"
        assert win.conversations.export_chat(str(tmp_path / "chat.md"))
        assert "# Capitals" in (tmp_path / "chat.md").read_text()
        win.search_box.setText("Compare this")
        assert [win.conv_list.item(i).data(0x0100) for i in range(win.conv_list.count())] == \
            [conv_id]
        assert not win.conv_side.no_match.isVisibleTo(win)
        win.search_box.setText("no such words anywhere")
        assert win.conv_list.count() == 0
        # an empty list says why (a new user's Xvfb pass saw just an empty list)
        assert win.conv_side.no_match.isVisibleTo(win)
        assert win.conv_side.no_match.text() == "No chats match “no such words anywhere”."
        win.search_box.setText("")
        assert not win.conv_side.no_match.isVisibleTo(win)
        assert "Exported to" in win.flash_label.text()
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        assert not win.conversations.import_chat(str(bad))
        assert win.messages.banner_kind == "error"
        assert "Could not import bad.json" in win.banner.text()
        assert win.conversations.import_chat(str(out))
        assert win.conv.id != conv_id and win.conv.title == "Capitals"
        # the imported copy looks like the chat it came from: it says it is a new one, where
        # the failed import's error was (that red banner stayed up after a later success)
        assert "Imported chat.json as “Capitals”" in win.flash_label.text()
        assert win.messages.banner_kind == "note"
        assert win.banner.text().startswith("Imported chat.json as a new chat, “Capitals”")
    finally:
        win.shutdown()
    # relaunch: versions and choices come back from the database
    win2 = MainWindow(backend=ScriptedBackend(), store=ViewStore(db), qsettings=qs,
                      auto_load=False)
    qtbot.addWidget(win2)
    try:
        conv = win2.store.get(conv_id)
        reply, cmp_reply = conv.messages[1], conv.messages[3]
        assert set(reply.versions) == {"dflash", "plain"} and reply.chosen == "dflash"
        assert cmp_reply.compare and cmp_reply.chosen == "plain"
        assert cmp_reply.versions["plain"].result.mode == "plain"
        assert _prompt_dicts(win2.store.db.active_path(conv_id))[-1]["content"] == \
            cmp_reply.versions["plain"].result.content
    finally:
        win2.shutdown()


# ------------------------------------------------------------------ keys, names, errors
def test_enter_sends_shift_enter_newline_and_shortcuts(qtbot, qs):
    from PySide6.QtCore import Qt

    backend = ScriptedBackend(cycles=2)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        edit = win.composer.edit
        edit.setFocus()
        qtbot.keyClicks(edit, "line one")
        qtbot.keyClick(edit, Qt.Key_Return, Qt.ShiftModifier)
        qtbot.keyClicks(edit, "line two")
        assert edit.toPlainText() == "line one\nline two"
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            qtbot.keyClick(edit, Qt.Key_Return)
        assert edit.toPlainText() == ""
        assert backend.last_messages[-1] == {"role": "user", "content": "line one\nline two"}
        shortcuts = {a.text(): a.shortcut().toString() for a in
                     (win.send_action, win.stop_action, win.new_action, win.compare_action)}
        assert shortcuts == {"Send": "Ctrl+Return", "Stop": "Esc", "New chat": "Ctrl+N",
                             "Compare plain and DFlash": "Ctrl+Shift+C"}
        n = len(win.store.list())
        win.new_action.trigger()
        assert len(win.store.list()) == n + 1 and win.conv.messages == []
    finally:
        close_window(win)


def test_controls_have_accessible_names(qtbot, qs):
    from PySide6.QtWidgets import (
        QAbstractButton,
        QAbstractSpinBox,
        QComboBox,
        QLineEdit,
        QPlainTextEdit,
        QTextBrowser,
        QWidget,
    )

    labelled = ("QPushButton", "QCheckBox", "QRadioButton")  # named by their visible text
    kinds = (QAbstractButton, QPlainTextEdit, QTextBrowser, QLineEdit, QComboBox,
             QAbstractSpinBox)
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.transcript.open_settings()
        for root in (win, win.transcript.settings_dialog):
            unnamed = []
            for w in root.findChildren(QWidget):
                if not isinstance(w, kinds) or not w.isVisibleTo(root):
                    continue
                if isinstance(w.parent(), QAbstractSpinBox):  # a spin box's inner editor
                    continue
                if w.accessibleName():
                    continue
                if w.metaObject().className() in labelled and w.text():
                    continue
                unnamed.append(w.metaObject().className())
            assert unnamed == [], root
    finally:
        close_window(win)


class FailingBackend(ScriptedBackend):
    def _events(self, turn, mode, cancel):
        from app.engine.errors import GenerationError

        yield ContentDelta("Half an ans")
        yield TokenEvent(5, 0, False)
        raise GenerationError("block size 99 is larger than the drafter's 8")


def test_generation_error_keeps_window_and_partial_text(qtbot, qs):
    win = make_window(qtbot, qs, FailingBackend())
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        msg = send_and_wait(qtbot, win, PROMPT, mode="dflash")
        assert "Block size 99" in win.banner.text()  # a message starts with a capital
        assert msg.version.error and "block size 99" in msg.version.error
        assert msg.version.result.content == "Half an ans"
        assert win.composer.send_btn.isEnabled()
        assert len(win.conv.messages) == 2
    finally:
        close_window(win)


# ------------------------------------------------------------------ models, theme, layout
def test_models_dialog_loads_the_bundled_pair_through_the_worker(qtbot, qs, tmp_path,
                                                                 monkeypatch, tiny_dirs):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    t, d = tiny_dirs
    monkeypatch.setattr("app.paths.demo_pair_dirs", lambda: (t, d))
    backend = ScriptedBackend()
    from app.ui.window import MainWindow

    win = MainWindow(backend=backend, qsettings=qs, auto_load=False, data_dir=tmp_path / "data")
    qtbot.addWidget(win)
    try:
        win.models.open_models()
        dlg = win.models.models_dialog
        assert dlg.targets.topLevelItemCount() == 1
        with qtbot.waitSignal(win.modelLoaded, timeout=10_000) as blocker:
            assert dlg.load_selected()
        info = blocker.args[0]
        assert info.target_path == str(t) and info.drafter_path == str(d)
        assert win.qs.value("model/target") == str(t)
        assert "Drafter" in win.model_label.text()
    finally:
        win.shutdown()


def test_palette_follows_system_scheme_and_layout_is_restored(qtbot, qs, monkeypatch):
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication

    from app.ui import theme

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        monkeypatch.setattr(theme, "system_is_dark", lambda: True)
        win.apply_theme()
        assert QApplication.instance().palette().color(QPalette.Window).name() == \
            theme.DARK["window"]
        monkeypatch.setattr(theme, "system_is_dark", lambda: False)
        win.apply_theme()
        assert QApplication.instance().palette().color(QPalette.Window).name() == \
            theme.LIGHT["window"]
        win.composer.set_mode("plain")
        sizes = [200, 700, 300]
        win.split.setSizes(sizes)
        win.split.splitterMoved.emit(0, 2)  # as when the user drags the handle
        kept = win.split.sizes()
    finally:
        close_window(win)
    win2 = make_window(qtbot, qs, ScriptedBackend())
    try:
        assert win2.composer.mode() == "plain"
        assert win2.qs.value("window/geometry") is not None  # offscreen clamps its size
        # the right panel keeps its width (the centre takes what the window size changed),
        # as far as the conversation stays at least as wide (offscreen restores a narrower
        # window than the one saved)
        left, centre, right = win2.split.sizes()
        assert right == min(kept[2], (centre + right) // 2) and right != 380
        assert centre >= right
    finally:
        close_window(win2)


@pytest.fixture(scope="module")
def tiny_dirs_dense(tmp_path_factory):
    from app.models.tiny import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("ui_tiny_dense"), "qwen3", seed=1,
                           block_size=8)


def test_switching_models_twice_while_generating(qtbot, tiny_dirs, tiny_dirs_dense,
                                                 engine_window):
    win = engine_window
    backend = win.workers.worker.backend
    win.defaults["max_tokens"] = 400
    win.composer.set_mode("dflash")
    assert win.send(PROMPT)
    qtbot.waitUntil(lambda: win.replies.run is not None
                    and win.replies.run.sides[""].stats.tokens >= 2, timeout=30_000)
    reply = win.conv.messages[-1]
    loaded = []
    win.modelLoaded.connect(loaded.append)
    win.load_model(str(tiny_dirs_dense[0]), str(tiny_dirs_dense[1]))
    win.load_model(str(tiny_dirs[0]), str(tiny_dirs[1]))
    qtbot.waitUntil(lambda: len(loaded) == 2, timeout=120_000)
    assert not win.busy
    assert reply.version.stopped and len(reply.version.result.tokens) < 400
    assert [i.model_type for i in loaded] == ["qwen3", "qwen3_5"]
    assert win.model.target_path == str(tiny_dirs[0])
    assert str(backend.target.path) == str(tiny_dirs[0])
    assert str(backend.drafter.path) == str(tiny_dirs[1])
    win.defaults["max_tokens"] = 6
    msg = send_and_wait(qtbot, win, "And again?", mode="dflash")
    assert len(msg.version.result.tokens) == 6


def test_autoscroll_pauses_when_scrolled_up_and_resumes_at_bottom(qtbot, qs):
    backend = ScriptedBackend(cycles=100_000, block=4, delay_s=0.003)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        win.composer.set_mode("dflash")
        assert win.send(PROMPT)
        sb = win.chat.verticalScrollBar()
        qtbot.waitUntil(lambda: sb.maximum() > 200, timeout=20_000)
        assert sb.value() == sb.maximum()  # following
        sb.setValue(10)  # the user scrolls up
        grown = sb.maximum()
        qtbot.waitUntil(lambda: sb.maximum() > grown + 100, timeout=20_000)
        assert sb.value() == 10 and not win.chat.follow
        sb.setValue(sb.maximum())  # back to the bottom: following again
        grown = sb.maximum()
        qtbot.waitUntil(lambda: sb.maximum() > grown + 100, timeout=20_000)
        assert win.chat.follow and sb.value() == sb.maximum()
        with qtbot.waitSignal(win.replyFinished, timeout=20_000):
            win.stop()
    finally:
        close_window(win)


def test_compare_stopped_during_plain_side_keeps_plain_and_closes_both(qtbot, qs, tmp_path):
    from app.chat.turns import ViewStore
    from app.ui.window import MainWindow

    backend = ScriptedBackend(cycles=100_000, block=4, delay_s=0.002)
    store = ViewStore(tmp_path / "c.db")
    win = MainWindow(backend=backend, store=store, qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        with qtbot.waitSignal(win.replyFinished, timeout=30_000) as blocker:
            assert win.replies.compare(PROMPT)
            qtbot.waitUntil(lambda: win.replies.run.sides["plain"].stats.cycles >= 3,
                            timeout=10_000)
            win.stop()
        msg = blocker.args[0]
        assert msg.compare and msg.chosen == "plain"
        assert msg.versions["plain"].stopped and msg.versions["plain"].result.tokens
        assert msg.versions["dflash"].stopped and not msg.versions["dflash"].result.tokens
        assert backend.last_settings.mode == "plain"  # the DFlash side never started
        rows = {store.db.get_message(i).mode: store.db.get_message(i).status
                for i in msg.ids.values()}
        assert rows == {"plain": "stopped", "dflash": "stopped"}
        assert "stopped before both sides ran" in win.compare_view.header.text()
    finally:
        win.shutdown()


def test_colour_drafts_tints_exactly_the_drafter_tokens(qtbot, qs):
    import re

    from app.chat.scripted import DEFAULT_TURN
    from app.ui import theme

    # token texts that spell what the reply streams: the content on the first token (cycle 0
    # commits one), then one filler word per token (Colour drafts colours only such texts)
    backend = ScriptedBackend(cycles=4, block=4, piece=lambda t: (
        DEFAULT_TURN.content if t == 100 else f" w{t - 100}"))
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        r = send_and_wait(qtbot, win, PROMPT, mode="dflash").version.result
        assert "".join(r.pieces).strip() == r.content.strip()
        win.composer.colour_box.setChecked(True)
        html = win.chat.toHtml()
        colour = theme.colours()["draft_bg"]
        tinted = re.findall(r'<span style="[^"]*background-color:' + colour + r';[^"]*">([^<]*)'
                            r'</span>', html)
        tinted_text = "".join(tinted)
        expected = [p for p, f in zip(r.pieces, r.from_draft, strict=True) if f]
        assert expected and tinted_text.split() == "".join(expected).split()
        own = [p for p, f in zip(r.pieces, r.from_draft, strict=True) if not f]
        assert all(p.strip() not in tinted_text.split() for p in own)
        win.composer.colour_box.setChecked(False)
        assert colour not in win.chat.toHtml()
    finally:
        close_window(win)


def test_stop_on_the_real_engine_counts_cycles(qtbot, engine_window):
    win = engine_window
    win.defaults["max_tokens"] = 400
    win.composer.set_mode("dflash")
    seen = {}
    with qtbot.waitSignal(win.replyFinished, timeout=120_000) as blocker:
        assert win.send(PROMPT)
        qtbot.waitUntil(lambda: win.replies.run is not None
                        and win.replies.run.sides[""].stats.cycles >= 3, timeout=60_000)
        win.stop()
        run = win.replies.run
        seen["stats"] = run.sides[""].stats
    v = blocker.args[0].version
    s = v.result.summary
    assert v.stopped and v.result.finish_reason == "cancelled"
    assert s.stop_cause == "cancelled"
    assert 3 <= s.cycles and len(v.result.tokens) < 400
    assert seen["stats"].cycles == s.cycles  # every cycle event reached the window
    assert len(s.accepted_lengths) == s.cycles
    assert win.live.shown["cycles"] == s.cycles
    assert "stopped" in win.chat.toPlainText()


def test_edit_a_user_message_and_rerun_keeps_the_old_branch_stored(qtbot, qs, tmp_path):
    from app.chat.turns import ViewStore
    from app.ui.window import MainWindow

    db = tmp_path / "c.db"
    backend = ScriptedBackend(cycles=2)
    win = MainWindow(backend=backend, store=ViewStore(db), qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, "first question", mode="plain")
        send_and_wait(qtbot, win, "second question", mode="plain")
        old_first = win.conv.messages[0]
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.edit_message(0, "first question, edited")
        assert [m.role for m in win.conv.messages] == ["user", "assistant"]
        assert win.conv.messages[0].content == "first question, edited"
        assert backend.last_messages == [{"role": "user",
                                          "content": "first question, edited"}]
        conv_id = win.conv.id
        versions = win.store.db.versions(win.conv.messages[0].ids[""])
        assert [v.content for v in versions] == ["first question", "first question, edited"]
        assert old_first.ids[""] == versions[0].id
        assert len(win.store.db.messages(conv_id)) == 6  # the old branch is still stored
        # ... and within reach: the edited message shows its versions as soon as its reply
        # is stored, and its "previous" brings the old branch back
        assert win.conv.messages[0].edits == (versions[0].id, versions[1].id)
        assert "version 2 of 2 · ‹ previous" in win.chat.toPlainText()
        win._on_chat_link(f"prompt:{versions[0].id}")
        assert [m.content for m in win.conv.messages if m.role == "user"] == \
            ["first question", "second question"]
        win._on_chat_link(f"prompt:{versions[1].id}")
    finally:
        win.shutdown()
    win2 = MainWindow(backend=ScriptedBackend(), store=ViewStore(db), qsettings=qs,
                      auto_load=False)
    qtbot.addWidget(win2)
    try:
        assert [m.content for m in win2.conv.messages if m.role == "user"] == \
            ["first question, edited"]
    finally:
        win2.shutdown()


def test_interrupted_reply_shows_as_interrupted(qtbot, qs, tmp_path):
    from app.chat.storage import Store
    from app.chat.turns import ViewStore

    db = tmp_path / "c.db"
    raw = Store(db)
    conv = raw.new_conversation()
    raw.add_message(conv.id, "user", "Tell me a long story.")
    reply = raw.begin_reply(conv.id, mode="dflash", block_size=8, rollback="tape")
    raw.update_partial(reply.id, content="Once upon a time", token_ids=[1, 2, 3],
                       from_draft=[False, True, True], force=True)
    raw.close()  # a store closed mid-reply marks it interrupted (as recovery does after a crash)
    qs.setValue("last_conversation", conv.id)
    from app.ui.window import MainWindow

    win = MainWindow(backend=ScriptedBackend(), store=ViewStore(db), qsettings=qs,
                     auto_load=False)
    qtbot.addWidget(win)
    try:
        v = win.conv.messages[1].version
        assert v.interrupted and v.stopped
        assert v.result.content == "Once upon a time"
        assert v.result.from_draft == [False, True, True]
        text = win.chat.toPlainText()
        assert "Once upon a time" in text and "interrupted" in text
        # drafter colouring survives the reload: token texts come from the worker
        from app.ui import theme

        win.workers.worker.backend.piece = {1: "Once", 2: " upon a", 3: " time"}.get
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        win.composer.colour_box.setChecked(True)
        qtbot.waitUntil(lambda: v.result.pieces == ["Once", " upon a", " time"], timeout=10_000)
        qtbot.waitUntil(lambda: theme.colours()["draft_bg"] in win.chat.toHtml(), timeout=5_000)
        assert "Once upon a time" in win.chat.toPlainText()
    finally:
        win.shutdown()


def test_short_benchmark_from_the_window(qtbot, engine_window):
    """The short benchmark runs on the worker; a message sent meanwhile (a new user's pass: an
    empty bubble and Stop for 25 s, unexplained) says it starts when the benchmark ends, and
    it does."""
    win = engine_window
    with qtbot.waitSignal(win.benchFinished, timeout=120_000) as blocker:
        win.models.run_benchmark(max_tokens=12)
        with qtbot.waitSignal(win.replyFinished, timeout=120_000, raising=False) as reply:
            assert win.send(PROMPT)
            assert win.messages.banner_kind == "note" and "short benchmark is still running" in \
                win.banner.text()
            qtbot.waitUntil(lambda: not win.state.benchmarking, timeout=120_000)
            assert "short benchmark" not in win.banner.text()
    qtbot.waitUntil(lambda: reply.signal_triggered or not win.busy, timeout=120_000)
    assert not win.busy and win.conv.messages[-1].version.result.tokens
    result = blocker.args[0]
    modes = result["modes"]
    assert list(modes) == ["plain", "dflash+tape@8", "dflash+replay@8"]
    assert all(m["identical_tokens"] for m in modes.values())
    tape, replay = modes["dflash+tape@8"], modes["dflash+replay@8"]
    assert tape["replays"] == replay["replays"] > 0
    dlg = win.models.bench_dialog
    assert dlg.table.rowCount() == 3 and dlg.table.item(1, 0).text() == "DFlash (block 8)"
    from app.ui.bench_dialog import COLUMNS

    same = [key for key, _ in COLUMNS].index("identical_tokens")
    assert dlg.table.item(1, same).text() == "yes"
    assert dlg.cycles_chart.values == result["accepted"]
    assert sum(dlg.histogram_chart.values) == len(result["accepted"])
    assert all(ident != threading.get_ident() for n, ident in win.engine_calls
               if n == "generate")


def test_benchmark_end_keeps_a_note_that_joined_its_wait_note(qtbot, qs):
    """The drafter probe's note can join the "benchmark still running" note; when the
    benchmark ends only its own sentence goes."""
    from app.ui.text import sentence

    win = make_window(qtbot, qs, ChatSession())
    win.state.benchmarking = True
    probe = "The drafter had 0% of its drafts accepted."
    win.messages.show_note(f"{sentence(win.models.BENCH_WAIT)} {probe}")
    win.models.bench_ended()
    assert win.messages.banner_kind == "note" and win.banner.text() == probe
    win.state.benchmarking = True
    win.messages.show_note(win.models.BENCH_WAIT)
    win.models.bench_ended()
    assert win.messages.banner_kind == "" and win.banner.text() == ""
    close_window(win)


def test_benchmark_without_a_drafter_says_why(qtbot, qs, tiny_dirs):
    win = make_window(qtbot, qs, ChatSession())
    with qtbot.waitSignal(win.modelLoaded, timeout=60_000):
        win.load_model(str(tiny_dirs[0]), "")
    with qtbot.waitSignal(win.benchFinished, timeout=30_000) as blocker:
        win.models.run_benchmark()
    assert blocker.args[0] is None
    assert "drafter" in win.banner.text()
    close_window(win)


def test_token_texts_hide_the_end_token(tiny_dirs):
    """Compare and drafter colouring show token texts; the end token is counted, not shown."""
    from app.models.loader import load_target

    backend = ChatSession()
    backend.target = load_target(tiny_dirs[0])
    tok = backend.target.tokenizer
    eos = next(iter(backend.target.eos_token_ids))
    ids = tok.encode("Paris is nice.", add_special_tokens=False)
    pieces = backend.pieces(ids + [eos])
    assert len(pieces) == len(ids) + 1
    assert pieces[-1] == "" and "".join(pieces) == "Paris is nice."


def test_compare_header_gives_the_top_two_gap_of_a_divergence(tiny_hybrid):
    """A divergence shown in Compare comes with the target's top-two logit gap there, which
    the worker's backend computes from the two replies."""
    from types import SimpleNamespace

    from app.chat.reply import ReplySettings, collect_reply
    from app.chat.turns import ReplyResult
    from app.engine.compare import near_tie
    from app.ui.compare import verdict

    target, drafter = tiny_hybrid
    rep = collect_reply(target, drafter, [{"role": "user", "content": "Hi"}],
                        ReplySettings(mode="plain", max_tokens=6))
    changed = list(rep.tokens)
    changed[3] = (changed[3] + 1) % 100
    other = SimpleNamespace(rounds=[SimpleNamespace(tokens=changed,
                                                    prompt_ids=rep.rounds[0].prompt_ids)])
    backend = ChatSession()
    backend.target = target
    gap = backend.top2_gap(rep, other)
    expected = near_tie(target, rep.rounds[0].prompt_ids, rep.tokens[:3], {}, 3)["gap"]
    assert gap == pytest.approx(expected)
    plain = ReplyResult(tokens=list(rep.tokens), mode="plain")
    dflash = ReplyResult(tokens=changed, mode="dflash", top2_gap=gap)
    assert verdict(plain, dflash).startswith(
        f"differs from token 3 (of 6 plain / 6 DFlash; top-two logit gap there {gap:.3g})")
    assert verdict(plain, ReplyResult(tokens=list(rep.tokens))).startswith("identical, 6")


def test_export_and_import_from_the_file_menu_open_their_dialogs(qtbot, qs, tmp_path,
                                                                  monkeypatch):
    # The menu's triggered(bool) used to reach export_chat(path=False): "Could not export:
    # expected str, bytes or os.PathLike object, not bool", and Import raised in its handler.
    from PySide6.QtWidgets import QFileDialog

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        out = tmp_path / "menu.json"
        asked = []
        monkeypatch.setattr(QFileDialog, "getSaveFileName",
                            lambda *a, **k: (asked.append("save"), (str(out), ""))[1])
        monkeypatch.setattr(QFileDialog, "getOpenFileName",
                            lambda *a, **k: (asked.append("open"), (str(out), ""))[1])
        actions = {a.text(): a for a in win.menuBar().actions()[0].menu().actions()}
        first_id = win.conv.id
        actions["Export chat…"].trigger()
        assert asked == ["save"] and out.exists()
        assert PROMPT in out.read_text()
        actions["Import chat…"].trigger()
        assert asked == ["save", "open"]
        assert win.conv.id != first_id and win.conv.messages[0].content == PROMPT
    finally:
        close_window(win)


def answer_rename(title: str) -> list[dict]:
    """Answer the next Rename chat dialog with ``title`` (set in the field, then OK), as a
    user would, without replacing any of the window's code. Returns a list that receives,
    for the dialog answered, its ``text`` before the answer and its ``width`` in px."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QInputDialog

    asked: list[dict] = []

    def answer(tries_left: int = 250):  # polls for 5 s at most
        dlg = QApplication.activeModalWidget()
        if not isinstance(dlg, QInputDialog):
            if tries_left:
                QTimer.singleShot(20, lambda: answer(tries_left - 1))  # not open yet
            return
        asked.append({"text": dlg.textValue(), "width": dlg.width()})
        dlg.setTextValue(title)
        dlg.accept()

    QTimer.singleShot(20, answer)
    return asked


def test_double_click_on_a_chat_in_the_list_renames_it(qtbot, qs):
    from PySide6.QtCore import Qt

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        conv_id = win.conv.id
        win.new_chat()
        answer_rename("Capitals  quiz")
        item = next(win.conv_list.item(i) for i in range(win.conv_list.count())
                    if win.conv_list.item(i).data(Qt.UserRole) == conv_id)
        win.conv_list.itemDoubleClicked.emit(item)
        assert win.conv.id == conv_id and win.conv.title == "Capitals quiz"
        assert win.store.get(conv_id).title == "Capitals quiz"
    finally:
        close_window(win)


def test_the_rename_dialog_is_wide_enough_for_a_whole_title(qtbot, qs):
    # new-user pass under Xvfb: QInputDialog.getText's field was about 180 px wide, so an
    # automatic title (up to 60 characters) showed only its first words while renaming
    from app.chat.storage import auto_title

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, "What is the local time in Anchorage and in Ouagadougou, "
                      "and which is later?", mode="plain")
        asked = answer_rename("Two clocks")
        win.conversations.rename_chat()
        title = auto_title("What is the local time in Anchorage and in Ouagadougou, and which "
                           "is later?")
        assert [a["text"] for a in asked] == [title]
        field_px = win.fontMetrics().horizontalAdvance(title)
        assert asked[0]["width"] >= min(field_px, 400), (asked, field_px)
        assert win.conv.title == "Two clocks"
    finally:
        close_window(win)


def test_a_real_double_click_on_a_chat_that_is_not_shown_renames_it(qtbot, qs):
    """The first click of the double-click shows that chat; the list must not be rebuilt under
    the mouse then, or the second click lands on a new item and no double-click is seen."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        other = win.conv.id
        win.new_chat()
        assert win.conv.id != other
        asked = answer_rename("Capitals")
        row = next(i for i in range(win.conv_list.count())
                   if win.conv_list.item(i).data(Qt.UserRole) == other)
        centre = win.conv_list.visualItemRect(win.conv_list.item(row)).center()
        # a double-click as the system sends it: a click, then the second press as a
        # double-click (QTest.mouseDClick alone is not one)
        QTest.mouseClick(win.conv_list.viewport(), Qt.LeftButton, Qt.NoModifier, centre)
        assert win.conv.id == other and asked == []  # the first click shows that chat
        QTest.mouseDClick(win.conv_list.viewport(), Qt.LeftButton, Qt.NoModifier, centre)
        assert win.conv.id == other and [a["text"] for a in asked] == [PROMPT]
        assert win.store.get(other).title == "Capitals"
    finally:
        close_window(win)


def test_a_note_on_one_chat_leaves_when_another_chat_is_shown(qtbot, qs):
    """A note (a reply's malformed tool call, settings saved for a chat) is about the chat it
    came with; an error stays until it is dismissed."""
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        first = win.conv.id
        win.new_chat()
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        win.messages.show_note("Malformed tool call kept as text: the tool call was not closed.")
        win.conv_side.selected.emit(first)
        assert win.conv.id == first
        assert not win.banner_row.isVisibleTo(win) and win.messages.banner_kind == ""
        win.messages.show_banner("Chats are kept in memory only this time: the disk is full")
        win.conv_side.selected.emit(win.conv_side.rows()[0][0])
        assert win.banner_row.isVisibleTo(win) and win.messages.banner_kind == "error"
    finally:
        close_window(win)


def test_colour_drafts_is_remembered_across_a_restart(qtbot, qs):
    win = make_window(qtbot, qs, ScriptedBackend())
    assert not win.composer.colour_box.isChecked()
    win.composer.colour_box.setChecked(True)
    close_window(win)
    win2 = make_window(qtbot, qs, ScriptedBackend())
    try:
        assert win2.composer.colour_box.isChecked() and win2.chat.colour_drafts
    finally:
        close_window(win2)


def test_compare_with_an_empty_box_says_what_it_needs(qtbot, qs):
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        seen = []
        win.composer.compare.connect(seen.append)
        win.composer.compare_btn.click()
        assert seen == [] and "Type a message" in win.composer.mode_note.text()
        assert win.conv is None or not win.conv.messages
    finally:
        close_window(win)


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_stop_before_any_token_shows_no_first_token_time(qtbot, qs):
    """Stopped while the reply was still thinking (no token yet): there is no time to first
    token, so the live panel shows a dash, not the summary's made-up figure."""
    backend = ScriptedBackend(turns=[ScriptedTurn(" ".join(["think"] * 2000), "Paris.")],
                              reasoning_delay_s=0.002)
    win = make_window(qtbot, qs, backend)
    try:
        v = send_and_stop(qtbot, win, lambda side: bool(side.reasoning)).version
        assert v.stopped and not v.result.tokens
        assert win.live.shown["tokens"] == 0
        assert win.live.shown["ttft"] is None
        assert win.live.shown["tok_per_s"] is None  # no rate without tokens ("–", not 0.0)
        assert win.live.labels["ttft"].text() == "–"
    finally:
        close_window(win)


def test_compare_side_without_tokens_has_no_first_token_figure():
    from types import SimpleNamespace

    from app.ui.compare import side_figures

    none = SimpleNamespace(mode="plain", summary=Summary(mode="plain", ttft_s=0.75))
    assert "first token" not in side_figures(none)
    some = SimpleNamespace(mode="plain", summary=Summary(mode="plain", ttft_s=0.75,
                                                         generated_tokens=3))
    assert "first token 750 ms" in side_figures(some)
    # the live card's format: seconds with two decimals from one second on
    slow = SimpleNamespace(mode="dflash2", summary=Summary(mode="dflash2", ttft_s=1.314,
                                                           generated_tokens=3))
    assert "first token 1.31 s" in side_figures(slow)
    assert format_figure("ttft", 1.314) == "1.31 s"


def test_regenerate_is_disabled_on_a_compare_turn_and_says_why(qtbot, qs):
    """The menu offers Regenerate only where it runs: after an ordinary reply, not on a
    Compare turn (the tooltip says why), and triggering it there shows no error banner."""
    backend = ScriptedBackend(cycles=3, block=4)
    win = make_window(qtbot, qs, backend)
    try:
        assert not win.regen_action.isEnabled()  # no reply yet
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        assert win.regen_action.isEnabled()
        send_and_wait(qtbot, win, "Compare this.", compare=True)
        assert win.conv.messages[-1].is_compare
        assert not win.regen_action.isEnabled()
        assert "Compare turn" in win.regen_action.toolTip()
        win.regen_action.trigger()
        win.replies.regenerate()  # called directly: a quiet note, not the red banner
        assert not (win.banner_row.isVisible() and win.messages.banner_kind == "error")
        win._on_chat_link("choose:plain")  # continuing from one side keeps it a Compare turn
        assert not win.regen_action.isEnabled()
        win.new_chat()
        assert not win.regen_action.isEnabled()
    finally:
        close_window(win)


def _menu_action(win, text: str):
    """The window's menu item named ``text``."""
    for top in win.menuBar().actions():
        for action in top.menu().actions():
            if action.text() == text:
                return action
    raise AssertionError(f"no menu item {text!r}")


def test_rename_and_delete_chat_are_off_without_a_chat(qtbot, qs, monkeypatch):
    """A new user's pass: on a fresh start with an empty chat list, Chat › Rename chat… (F2)
    and Delete chat were enabled with nothing to rename or delete. They are off while no chat
    is shown and on while one is (off again once the last chat is deleted), and F2 or either
    item with no chat asks nothing."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QInputDialog, QMessageBox

    asked = []
    monkeypatch.setattr(QInputDialog, "exec", lambda self: asked.append("rename") or 0)
    monkeypatch.setattr(QMessageBox, "question",
                        lambda *a, **k: asked.append("delete") or QMessageBox.Yes)
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        rename, delete = _menu_action(win, "Rename chat…"), _menu_action(win, "Delete chat")
        assert win.conv is None and win.store.list() == []
        assert not rename.isEnabled() and not delete.isEnabled()
        win.activateWindow()
        qtbot.waitUntil(win.isActiveWindow)
        qtbot.keyClick(win.composer.edit, Qt.Key_F2)
        rename.trigger()
        delete.trigger()
        assert asked == [] and win.conv is None
        win.new_chat()
        assert rename.isEnabled() and delete.isEnabled()
        delete.trigger()
        assert asked == ["delete"]
        assert win.conv is None and win.store.list() == []
        assert not rename.isEnabled() and not delete.isEnabled()
    finally:
        close_window(win)


def test_ctrl_r_on_a_compare_turn_says_why_it_does_nothing(qtbot, qs):
    """A new user's pass: Ctrl+R on a chat whose last turn is a Compare did nothing at all
    (the menu item is off there, and the shortcut of an item that is off is silent). The item
    stays off with its reason as tooltip, and Ctrl+R now says that reason in a note; on an
    ordinary last reply it regenerates as before."""
    from PySide6.QtCore import Qt

    win = make_window(qtbot, qs, ScriptedBackend(cycles=3, block=4))
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        send_and_wait(qtbot, win, "Compare this.", compare=True)
        turns = len(win.conv.messages)
        assert not win.regen_action.isEnabled()
        win.activateWindow()
        qtbot.waitUntil(win.isActiveWindow)
        win.composer.edit.setFocus()
        qtbot.keyClick(win.composer.edit, Qt.Key_R, Qt.ControlModifier)
        assert win.banner_row.isVisibleTo(win) and win.messages.banner_kind == "note"
        assert win.banner.text() == win.regen_action.toolTip()
        assert "Compare turn" in win.banner.text()
        assert not win.busy and len(win.conv.messages) == turns
        send_and_wait(qtbot, win, "And once more.", mode="dflash")
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            qtbot.keyClick(win.composer.edit, Qt.Key_R, Qt.ControlModifier)
        assert len(win.conv.messages[-1].versions) == 2
    finally:
        close_window(win)


def _split_across_lines(doc, text: str) -> list[int]:
    """Widths of ``doc`` (a clone is laid out at each) at which ``text`` starts on one line
    and ends on another."""
    bad = []
    for width in range(120, 700, 3):
        doc.setTextWidth(width)
        doc.documentLayout().documentSize()
        block = doc.begin()
        while block.isValid():
            at = block.text().find(text)
            if at >= 0:
                layout = block.layout()
                first = layout.lineForTextPosition(at).lineNumber()
                last = layout.lineForTextPosition(at + len(text) - 1).lineNumber()
                if first != last:
                    bad.append(width)
            block = block.next()
    return bad


def test_previous_and_next_version_links_stay_on_one_line(qtbot, qs):
    backend = ScriptedBackend(cycles=3, block=4)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        win.composer.set_mode("plain")
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.regenerate()
        with qtbot.waitSignal(win.replyFinished, timeout=30_000):
            assert win.replies.regenerate()
        win._on_chat_link("version:1:" + list(win.conv.messages[-1].versions)[1])
        doc = win.chat.document().clone()
        raw = doc.toRawText()
        assert "previous" in raw and "next" in raw
        for link in ("‹\u00a0previous", "next\u00a0›"):
            text = link if link in raw else link.replace("\u00a0", " ")
            assert _split_across_lines(doc, text) == [], link
    finally:
        close_window(win)


def test_edit_message_dialog_tab_moves_focus_and_lines_wrap(qtbot, qs):
    """The edit-message dialog: Tab moves the focus on (no tab character typed) and a long
    line wraps at the box's width."""
    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtWidgets import QApplication, QPlainTextEdit

    backend = ScriptedBackend(cycles=3, block=4)
    win = make_window(qtbot, qs, backend)
    seen = {}

    def inspect():
        dlg = QApplication.activeModalWidget()
        if dlg is None:
            QTimer.singleShot(20, inspect)
            return
        box = dlg.findChild(QPlainTextEdit)
        seen["tab_focus"] = box.tabChangesFocus()
        seen["wrap"] = box.lineWrapMode() == QPlainTextEdit.WidgetWidth and \
            box.wordWrapMode() != 0  # QTextOption.NoWrap
        box.setFocus()
        before = box.toPlainText()
        qtbot.keyClick(box, Qt.Key_Tab)
        seen["typed_tab"] = box.toPlainText() != before
        seen["focus_left"] = not box.hasFocus()
        dlg.reject()

    try:
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        QTimer.singleShot(0, inspect)
        assert not win.replies.edit_message(0)  # cancelled
        assert seen == {"tab_focus": True, "wrap": True, "typed_tab": False,
                        "focus_left": True}, seen
    finally:
        close_window(win)


def test_tab_leaves_the_settings_system_prompt(qtbot):
    """Found on a keyboard pass through File › Settings under Xvfb: Tab in the System prompt
    box (the dialog's first field) typed tab characters into the prompt, so Tab never
    reached the other settings. It moves the focus on, as in the message box."""
    from PySide6.QtCore import Qt

    from app.ui import settings as settings_mod

    dlg = settings_mod.SettingsDialog(settings_mod.defaults())
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.waitExposed(dlg)
    dlg.activateWindow()
    qtbot.waitUntil(dlg.isActiveWindow)
    dlg.system.setFocus()
    qtbot.waitUntil(dlg.system.hasFocus)
    before = dlg.system.toPlainText()
    qtbot.keyClick(dlg.system, Qt.Key_Tab)
    assert dlg.system.toPlainText() == before
    assert dlg.max_tokens.hasFocus()


def test_a_message_too_long_for_the_context_stays_in_the_composer(qtbot, engine_window):
    """A refused send (too long for the context) keeps the text in the composer, the chat and
    the figures as they were, and stores nothing."""
    win = engine_window
    win.defaults = dict(win.defaults, max_tokens=8)
    first = send_and_wait(qtbot, win, PROMPT, mode="plain")
    shown = dict(win.live.shown)
    assert shown["context"][0] > 0
    turns = [(m.role, m.content) for m in win.conv.messages]
    stored = len(win.store.db.messages(win.conv.id))
    huge = "word " * (win.model.context_length * 2) + "end"
    win.composer.edit.setPlainText(huge)
    win.composer.send_btn.click()  # the composer empties, as on Enter
    assert win.busy and not win.composer.edit.toPlainText()
    qtbot.waitUntil(lambda: not win.busy, timeout=30_000)
    assert "Shorten the message" in win.banner.text()
    assert win.composer.edit.toPlainText() == huge
    assert [(m.role, m.content) for m in win.conv.messages] == turns
    assert len(win.store.db.messages(win.conv.id)) == stored
    assert win.live.shown == shown  # the last reply's figures, not "Context 0 / …"
    assert win.state.shown_message is first


def test_reply_that_ends_inside_its_reasoning_says_there_is_no_answer(qtbot, qs):
    """A reply whose text all went to the reasoning (the model never closed it, as demo pair
    v9 did once in 96 script turns) ends with no answer: the chat says so and points to the
    reasoning, instead of showing a figures line under nothing."""
    backend = ScriptedBackend(turns=[ScriptedTurn("The user wants the population of", ""),
                                     DEFAULT_TURN], filler=lambda i: "")
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="dflash")
        text = win.chat.toPlainText()
        assert NO_ANSWER_IN_REASONING in text
        send_and_wait(qtbot, win, "And its population?", mode="dflash")
        text = win.chat.toPlainText()
        assert text.count(NO_ANSWER_IN_REASONING) == 1  # the answered reply has no such note
        assert "Paris" in text
    finally:
        close_window(win)


def test_export_suggests_a_file_name_that_is_one_file_in_the_documents_folder(
        qtbot, qs, tmp_path, monkeypatch):
    """The title "Convert km/h: 2 < 3?" suggested "Convert km/h: 2 < 3?.md" in the folder the app
    was started from (a new user saw the repository): the "/" made it a subfolder that does
    not exist. The suggestion is one safe file name in the Documents folder (home when there is
    none)."""
    from PySide6.QtWidgets import QFileDialog

    from app.ui.conversation_flow import documents_folder
    from app.ui.text import file_name

    assert file_name("Convert km/h: 2 < 3?") == "Convert km-h- 2 - 3"
    # a new user's export of "What is the local time in Anchorage?" was offered "…Anchorage-.md"
    assert file_name("What is the local time in Anchorage?") == \
        "What is the local time in Anchorage"
    assert file_name("  \t ") == "chat" and file_name("a" * 100) == "a" * 40
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        win.conversations.rename_conversation("Convert km/h: 2 < 3?")
        asked = []
        monkeypatch.setattr(QFileDialog, "getSaveFileName",
                            lambda parent, caption, start, filters: (asked.append(start),
                                                                     ("", ""))[1])
        assert not win.conversations.export_chat()
        assert asked == [str(documents_folder() / "Convert km-h- 2 - 3.md")]
    finally:
        close_window(win)


def test_tool_pane_wraps_a_long_error_instead_of_cutting_it(qtbot):
    """A new user's tool pane cut a long error after the first line ("… pin…"): a
    QTreeWidget sizes a row spanned over its columns for the first column and elides the rest.
    The detail rows now wrap to the pane's width, and re-wrap when it changes."""
    from app.ui.panels import ToolPane

    error = ("unknown unit 'furlongs_per_fortnight': pint could not parse it "
             "(UndefinedUnitError: 'furlongs_per_fortnight' is not defined in the unit registry)")
    pane = ToolPane()
    qtbot.addWidget(pane)
    pane.resize(350, 300)
    pane.show()
    pane.set_calls([{"name": "convert_units", "arguments": {"value": 10}, "error": error,
                     "duration_s": 0.002}])
    item = pane.topLevelItem(0)
    row = item.child(1)
    assert row.text(0) == "error: " + error
    line = pane.fontMetrics().lineSpacing()
    qtbot.waitUntil(lambda: pane.visualItemRect(row).height() >= 3 * line, timeout=2_000)
    narrow = pane.visualItemRect(row).height()
    pane.resize(900, 300)
    qtbot.waitUntil(lambda: pane.visualItemRect(row).height() < narrow, timeout=2_000)


def test_export_and_import_open_in_a_folder_that_exists(tmp_path, monkeypatch):
    """A new user's Xvfb pass: Export and Import opened in the folder the app was started
    from, because the platform's Documents folder did not exist; they now fall back to home."""
    from PySide6.QtCore import QStandardPaths

    from app.ui.conversation_flow import documents_folder

    docs = tmp_path / "Documents"
    monkeypatch.setattr(QStandardPaths, "writableLocation", lambda kind: str(docs))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert documents_folder() == tmp_path  # Documents missing: home
    docs.mkdir()
    assert documents_folder() == docs


def test_a_reply_max_tokens_cut_before_its_answer_says_so(qtbot):
    """A new user's Xvfb pass: a reply cut by Max tokens inside its tool call (the call is
    dropped) said "the model's reply ended inside its reasoning", which was done; the note
    now names the limit."""
    from app.chat.turns import ConversationView, ReplyResult, Turn, Version
    from app.ui.chat import NO_ANSWER_AT_LIMIT, ChatView

    view = ChatView()
    qtbot.addWidget(view)
    reply = Turn("assistant", versions={"plain": Version(ReplyResult(
        mode="plain", reasoning="The user asks for Japan's population.", content="",
        finish_reason="length"))}, chosen="plain")
    conv = ConversationView(1, "Japan", messages=[Turn("user", "Population of Japan?"), reply])
    view.render(conv)
    text = view.toPlainText()
    assert NO_ANSWER_AT_LIMIT in text and NO_ANSWER_IN_REASONING not in text
    reply.versions["plain"].result.finish_reason = "stop"  # the model itself ended there
    view.render(conv)
    assert NO_ANSWER_IN_REASONING in view.toPlainText()


def test_a_reply_stopped_after_its_tool_call_keeps_its_reasoning_fold(qtbot):
    """A new user's pass: a Plain reply stopped early in its second round (after a tool
    call) had reasoning in the pane but no "Reasoning" fold in its bubble: the fold only
    looked at the last round's reasoning, which had none yet."""
    from app.chat.turns import ConversationView, ReplyResult, Turn, Version
    from app.ui.chat import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    first = {"role": "assistant", "content": "", "reasoning_content": "I look up Oceania.",
             "tool_calls": [{"function": {"name": "country_info", "arguments": "{}"}}]}
    reply = Turn("assistant", versions={"plain": Version(ReplyResult(
        mode="plain", reasoning="", content="", finish_reason="cancelled",
        tool_calls=[{"name": "country_info", "arguments": {}}], rounds=2,
        messages=[first, {"role": "tool", "content": "{}"}], status="stopped"))},
        chosen="plain")
    conv = ConversationView(1, "Oceania", messages=[Turn("user", "Three capitals?"), reply])
    view.render(conv)
    assert "Reasoning (4 words)" in view.toPlainText()


def click_link(qtbot, view, href: str) -> None:
    """Click the chat view's link ``href`` with the mouse, as a user does (it must be on
    screen: the footer of the last reply, where the view follows to)."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QTextCursor

    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.isValid() and frag.charFormat().anchorHref() == href:
                cursor = QTextCursor(view.document())
                cursor.setPosition(frag.position() + max(1, frag.length() // 2))
                point = view.cursorRect(cursor).center()
                assert view.viewport().rect().contains(point)
                qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=point)
                return
            it += 1
        block = block.next()
    raise AssertionError(f"no link {href!r} in the chat")


def test_continue_link_extends_the_same_reply_and_adds_no_user_turn(qtbot, engine_window):
    """Continue under a reply Max tokens cut resumes that reply, in the mode that made it
    (DFlash here, though the switch says Plain now): no user message, the same turn grows,
    and the stored chat keeps one reply, the one a reply with twice the Max tokens gives.
    Before, the link sent a user message "Continue from where you stopped." and a new reply."""
    win = engine_window
    win.new_chat()
    msg = send_and_wait(qtbot, win, PROMPT, mode="dflash")
    first = msg.version.result
    assert first.finish_reason == "length" and len(first.tokens) == 12
    conv = win.conv
    turns = list(conv.messages)
    win.composer.set_mode("plain")
    with qtbot.waitSignal(win.replyFinished, timeout=120_000) as blocker:
        click_link(qtbot, win.chat, "continue:")
    assert blocker.args[0] is msg and win.conv is conv
    assert len(conv.messages) == len(turns) == 2
    assert all(a is b for a, b in zip(conv.messages, turns))
    assert [t.role for t in conv.messages] == ["user", "assistant"]
    result = msg.version.result
    assert result.mode == "dflash" and result.summary.mode == "dflash"
    assert result.tokens[:12] == first.tokens and len(result.tokens) == 24
    assert result.summary.generated_tokens == 24
    assert "continued after 12 tokens" in win.chat.toPlainText()
    assert "continued after 12 tokens" in win.live.scope_label.text()
    assert win.live.shown["tokens"] == 24
    stored = win.store.get(conv.id)
    assert [t.role for t in stored.messages] == ["user", "assistant"]
    assert stored.messages[-1].version.result.tokens == result.tokens
    # the same as one reply with Max tokens 24
    win.new_chat()
    win.defaults["max_tokens"] = 24
    one = send_and_wait(qtbot, win, PROMPT, mode="dflash").version.result
    assert one.tokens == result.tokens
    assert (one.content, one.reasoning) == (result.content, result.reasoning)


def test_continue_without_the_mode_that_made_the_reply_says_so_and_keeps_it(
        qtbot, engine_window, tiny_dirs):
    """A DFlash reply's Continue with the target loaded alone (no drafter): the banner says
    why, and the reply stays as it was, shown and stored."""
    win = engine_window
    win.new_chat()
    msg = send_and_wait(qtbot, win, PROMPT, mode="dflash")
    before = msg.version.result
    assert before.finish_reason == "length"
    with qtbot.waitSignal(win.modelLoaded, timeout=60_000):
        win.load_model(str(tiny_dirs[0]), "")
    click_link(qtbot, win.chat, "continue:")
    qtbot.waitUntil(lambda: not win.busy, timeout=30_000)
    assert "made in DFlash" in win.banner.text()
    assert win.conv.messages[-1] is msg and msg.version is not None
    assert msg.version.result.tokens == before.tokens and len(win.conv.messages) == 2
    stored = win.store.get(win.conv.id).messages[-1].version.result
    assert stored.tokens == before.tokens and stored.finish_reason == "length"
    assert not stored.continued
    assert "Continue" in win.chat.toPlainText()  # it can be continued once DFlash is back


def test_a_compare_turn_cut_by_max_tokens_offers_no_continue_and_says_why(qtbot):
    from app.chat.turns import ConversationView, ReplyResult, Turn, Version
    from app.ui.chat import NO_CONTINUE_COMPARE, NO_CONTINUE_COMPARE_TIP, ChatView

    view = ChatView()
    qtbot.addWidget(view)
    sides = {k: Version(ReplyResult(mode=k, content="Paris is the", finish_reason="length",
                                    resumable=True)) for k in ("plain", "dflash")}
    reply = Turn("assistant", versions=sides, chosen="dflash", compare=True)
    conv = ConversationView(1, "France", messages=[Turn("user", PROMPT), reply])
    view.render(conv)
    assert 'href="continue:"' not in view.toHtml()
    assert NO_CONTINUE_COMPARE in view.toPlainText()
    assert view.tooltip_of(NO_CONTINUE_COMPARE) == NO_CONTINUE_COMPARE_TIP
    reply.compare = False  # the same reply alone is continued
    view.render(conv)
    assert 'href="continue:"' in view.toHtml()


def test_number_fields_say_their_range_and_settings_has_a_shortcut(qtbot, qs):
    """A new user typed 99 into Temperature and "abc-5" into Max tokens: the fields kept
    what fits without a word. Each number field's tooltip now gives its range (and what its
    lowest value means where that is a word), and File › Settings… has Ctrl+, on Linux too."""
    from PySide6.QtGui import QKeySequence

    from app.chat.settings import RANGES, defaults
    from app.ui.settings import SettingsDialog

    dlg = SettingsDialog(dict(defaults(), system_prompt="", stop_strings=[]), max_block=16)
    qtbot.addWidget(dlg)
    low, high = RANGES["temperature"]
    assert dlg.temperature.toolTip().endswith(f"From {low:g} to {high:g}.")
    assert dlg.block.toolTip().endswith("From 0 to 16. 0: drafter default.")
    assert dlg.max_tokens.toolTip() == f"From {RANGES['max_tokens'][0]:,} to " \
                                       f"{RANGES['max_tokens'][1]:,}."
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        assert win.settings_action.shortcut() == QKeySequence("Ctrl+,")
    finally:
        win.shutdown()


def test_send_with_an_empty_message_says_what_it_needs(qtbot):
    """A new user pressed Send with nothing typed (and with spaces only): nothing happened.
    It now says to type a message first, as Compare does, and sends nothing; the note goes
    once typing starts."""
    from PySide6.QtCore import Qt

    from app.ui.chat import EMPTY_COMPARE, EMPTY_SEND, Composer

    c = Composer()
    qtbot.addWidget(c)
    c.show()
    sent = []
    c.send.connect(sent.append)
    c.edit.setPlainText("   ")
    qtbot.mouseClick(c.send_btn, Qt.LeftButton)
    assert sent == [] and c.mode_note.text() == EMPTY_SEND
    c.edit.setPlainText("What is 17 times 23?")
    assert c.mode_note.text() == ""
    qtbot.mouseClick(c.send_btn, Qt.LeftButton)
    assert sent == ["What is 17 times 23?"]
    qtbot.mouseClick(c.compare_btn, Qt.LeftButton)
    assert c.mode_note.text() == EMPTY_COMPARE


def test_a_restored_dflash2_switch_shows_while_the_pair_loads(qtbot):
    """A new user's restart: the switch was saved on DFlash2, and while the pair loaded it
    showed Plain | DFlash with neither selected. DFlash2 now shows, selected and disabled,
    until the pair says whether it offers it."""
    from app.ui.chat import Composer

    c = Composer()
    qtbot.addWidget(c)
    c.show()
    assert not c.dflash2_btn.isVisible()  # no pair yet
    c.set_mode("dflash2")
    assert c.dflash2_btn.isVisible() and c.dflash2_btn.isChecked()
    assert not c.dflash2_btn.isEnabled() and c.mode() == "dflash2"
    c.set_modes(("plain", "dflash", "dflash2"))
    assert c.dflash2_btn.isEnabled() and c.mode() == "dflash2"
    c.set_mode("dflash2")
    c.set_modes(("plain", "dflash"))  # a pair without DFlash2: the switch moves to DFlash
    assert not c.dflash2_btn.isVisible() and c.mode() == "dflash"


def test_tab_leaves_the_message_box(qtbot):
    """A new user pressed Tab in the message box to reach the mode switch and Send: it typed
    a tab character instead, and Tab never left the box. Tab now moves the focus on (as in
    LM Studio's and GPT4All's message boxes) and leaves the text as it was."""
    from PySide6.QtCore import Qt

    from app.ui.chat import Composer

    c = Composer()
    qtbot.addWidget(c)
    c.show()
    qtbot.waitExposed(c)
    c.edit.setFocus()
    qtbot.waitUntil(c.edit.hasFocus)
    c.edit.setPlainText("hello")
    qtbot.keyClick(c.edit, Qt.Key_Tab)
    assert c.edit.toPlainText() == "hello"
    assert not c.edit.hasFocus()


def test_a_user_message_keeps_its_line_breaks(qtbot):
    """A new user wrote "Convert 5 miles", Shift+Enter, "into km please": the bubble showed
    one line ("Convert 5 miles into km please"), though the line break was stored. Markdown
    joins the lines of a paragraph; the user's own bubble keeps them (the model's answers
    are Markdown as before)."""
    from app.chat.turns import ConversationView, Turn
    from app.ui.chat import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    conv = ConversationView(1, "Miles", messages=[
        Turn("user", "Convert 5 miles\ninto km please\n\n- one\n- two")])
    view.render(conv)
    lines = [ln.strip() for ln in view.toPlainText().splitlines()]
    assert "Convert 5 miles" in lines and "into km please" in lines
    assert "Convert 5 miles into km please" not in view.toPlainText()
    assert "\\" not in view.toPlainText()


def test_an_unsent_message_stays_with_its_chat(qtbot, qs):
    """A new user's Ctrl+N: the text typed but not sent in one chat came along into the new
    chat, with the caret before it, so what they typed next went in front of it. Each chat
    now keeps its own unsent message, as ChatGPT and LM Studio do; the caret goes to its end."""
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        first = win.new_chat()
        win.conversations.rename_conversation("First")  # a chat of its own: New chat makes another
        win.composer.edit.setPlainText("What is 2 + 2?")
        second = win.new_chat()
        assert second.id != first.id
        assert win.composer.edit.toPlainText() == ""
        win.composer.edit.setPlainText("Convert 5 miles")
        win.select_conversation(win.store.get(first.id))
        assert win.composer.edit.toPlainText() == "What is 2 + 2?"
        assert win.composer.edit.textCursor().atEnd()
        win.select_conversation(win.store.get(second.id))
        assert win.composer.edit.toPlainText() == "Convert 5 miles"
    finally:
        close_window(win)


def test_colour_drafts_keep_a_reply_stopped_in_its_reasoning_out_of_the_answer(qtbot):
    """A new user's pass: with Colour drafts on, a reply stopped inside its reasoning showed
    the reasoning's tokens ("The") as its answer; with it off, the bubble showed only the
    Reasoning fold. Both now show the fold and no answer text."""
    from app.chat.turns import ConversationView, ReplyResult, Turn, Version
    from app.ui.chat import ChatView
    from app.ui.theme import LIGHT

    view = ChatView()
    qtbot.addWidget(view)
    view.palette_colours = dict(LIGHT)
    reply = Turn("assistant", versions={"dflash": Version(ReplyResult(
        mode="dflash", tokens=[1, 2, 3], pieces=["The", " user", " asks"],
        from_draft=[False, True, True], reasoning="The user asks", content="",
        finish_reason="cancelled", status="stopped"))}, chosen="dflash")
    conv = ConversationView(1, "Cups", messages=[Turn("user", "Change 87.54 cups into ml."),
                                                 reply])
    for colour in (False, True):
        view.colour_drafts = colour
        view.render(conv)
        text = view.toPlainText()
        assert "Reasoning (3 words)" in text, (colour, text)
        assert "The user asks" not in text, (colour, text)


def test_an_error_about_one_chats_turn_goes_when_another_chat_is_shown(qtbot, qs):
    """A new user's pass: "Could not save this turn ... temperature 99.0 is out of range"
    stayed in red above other chats after switching to them and deleting them. An error
    about a chat's turn now goes with that chat; one about the app (a model that did not
    load) stays."""
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        first = win.new_chat()
        win.conversations.rename_conversation("First")
        second = win.new_chat()
        assert second.id != first.id
        win.select_conversation(win.store.get(first.id))
        win.messages.show_banner("Could not save this turn, so no reply was started: "
                                 "temperature 99.0 is out of range", chat=first.id)
        assert win.banner_row.isVisibleTo(win)
        win.select_conversation(win.store.get(second.id))  # a click in the list
        assert not win.banner_row.isVisibleTo(win) and win.banner.text() == ""
        win.messages.show_banner("Could not load the model: no such folder")
        win.select_conversation(win.store.get(first.id))
        assert win.banner_row.isVisibleTo(win) and "Could not load" in win.banner.text()
    finally:
        close_window(win)


def test_keyboard_focus_shows_on_the_buttons(qtbot, qs):
    """A new user moving with Tab saw no mark on the focused button (the stylesheet's borders
    replaced the platform's focus frame): the switch, Compare and Send now draw their border
    in the text colour while they have the focus, without changing their size."""
    from PySide6.QtCore import Qt

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.activateWindow()
        qtbot.waitUntil(win.isActiveWindow)
        c = win.composer
        for button in (c.plain_btn, c.dflash_btn, c.compare_btn, c.send_btn):
            win.centralWidget().setFocus()
            qtbot.waitUntil(lambda b=button: not b.hasFocus())
            size, before = button.size(), button.grab().toImage()
            button.setFocus(Qt.TabFocusReason)
            qtbot.waitUntil(button.hasFocus)
            after = button.grab().toImage()
            assert button.size() == size, button.text()
            assert after != before, button.text()
    finally:
        close_window(win)


FOCUS_STYLED = ("QPushButton", "QToolButton", "QComboBox", "QLineEdit", "QPlainTextEdit",
                "QTextEdit", "QListView", "QTreeView", "QCheckBox", "QSpinBox")
"""The widget kinds Tab can reach in the window and its dialogs."""


@pytest.mark.parametrize("dark", [False, True])
def test_the_stylesheet_has_a_focus_rule_for_every_kind_of_control(dark):
    """A new user moving with Tab met controls that showed no focus at all: a stylesheet that
    sets borders hides Qt's focus frame. Every kind of control Tab reaches has a ``:focus``
    rule for all its widgets (not only those of one object name) that sets a border (combo
    and spin boxes: a background, as a border of their own would drop their arrows)."""
    import re

    from app.ui import theme

    styled = set()
    for rule in theme.stylesheet(theme.colours(dark)).split("}"):
        selectors, _, body = rule.partition("{")
        if "border" not in body and "background" not in body:
            continue
        for selector in selectors.split(","):
            m = re.fullmatch(r"(Q\w+)(?::\w+)*:focus(?::\w+)*", selector.strip())
            if m:
                styled.add(m.group(1))
    assert set(FOCUS_STYLED) <= styled, sorted(set(FOCUS_STYLED) - styled)


def _edge(image, width: int = 3) -> list[int]:
    """The pixels of ``image`` within ``width`` of its edge (where a focus border is drawn)."""
    w, h = image.width(), image.height()
    rows = [y for y in range(h) if y < width or y >= h - width]
    cols = [x for x in range(w) if x < width or x >= w - width]
    return ([image.pixel(x, y) for y in rows for x in range(w)]
            + [image.pixel(x, y) for y in range(h) for x in cols])


def _tab_stops_without_a_mark(qtbot, win) -> tuple[list, list[str]]:
    """Walk the window's Tab chain from the focused widget back to it (the chat keeps the focus
    while Tab goes through its links); returns the widgets it reaches and the names of those
    whose edge looks the same with the focus as without."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    start = QApplication.focusWidget()
    chain = [start]
    for _ in range(200):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Tab)
        widget = QApplication.focusWidget()
        if widget is start:
            break
        if widget not in chain:
            chain.append(widget)
    unmarked = []
    for widget in chain:
        win.centralWidget().setFocus()
        qtbot.waitUntil(lambda w=widget: not w.hasFocus())
        before = _edge(widget.grab().toImage())
        widget.setFocus(Qt.TabFocusReason)
        qtbot.waitUntil(widget.hasFocus)
        if _edge(widget.grab().toImage()) == before:
            unmarked.append(widget.accessibleName() or type(widget).__name__)
    return chain, unmarked


def test_every_tab_stop_of_the_window_shows_the_focus(qtbot, qs):
    """A new user's pass: Tab reached the Colour drafts box, the side panel, its section
    headers and panes, the chat list and the chat, and none of them looked any different with
    the focus. Each widget Tab reaches now draws its edge differently while it has it, on the
    first screen and with a Compare shown (the scroll areas that hold the side panel and the
    Compare view are no Tab stops: Tab goes to what they hold)."""
    win = make_window(qtbot, qs, ScriptedBackend(cycles=3, block=4))
    try:
        win.activateWindow()
        qtbot.waitUntil(win.isActiveWindow)
        chain, unmarked = _tab_stops_without_a_mark(qtbot, win)
        assert win.composer.edit in chain and win.conv_list in chain and len(chain) > 10
        assert unmarked == [], unmarked
        win.load_model("t", "d")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, "Compare this.", compare=True)
        assert win.compare_view.isVisible()
        win.composer.edit.setFocus()
        chain, unmarked = _tab_stops_without_a_mark(qtbot, win)
        assert any(win.compare_view.isAncestorOf(w) for w in chain)
        assert unmarked == [], unmarked
    finally:
        close_window(win)

def test_a_click_into_the_chat_draws_no_focus_border_but_the_keyboard_does(qtbot, qs):
    """A new user's pass: a click into the chat (to select text, or on a link) drew the
    accent border round it, the focus mark meant for those moving with the keyboard. The chat
    now draws it only when the focus came by keyboard (Tab, Backtab, a shortcut), as a
    browser's ``:focus-visible``; coming back to the window keeps whichever it was."""
    from PySide6.QtCore import QEvent, Qt
    from PySide6.QtGui import QFocusEvent
    from PySide6.QtWidgets import QApplication

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.activateWindow()
        qtbot.waitUntil(win.isActiveWindow)
        chat = win.chat

        def leave():
            win.composer.edit.setFocus()
            qtbot.waitUntil(lambda: not chat.hasFocus())

        def edge():
            return _edge(chat.grab().toImage())

        def click():
            qtbot.mouseClick(chat.viewport(), Qt.LeftButton, pos=chat.viewport().rect()
                             .topLeft() + chat.viewport().rect().center() / 8)
            qtbot.waitUntil(chat.hasFocus)

        def come_back():  # the window was left and is active again
            QApplication.sendEvent(chat, QFocusEvent(QEvent.FocusIn,
                                                     Qt.ActiveWindowFocusReason))

        leave()
        unfocused = edge()
        click()
        assert edge() == unfocused
        come_back()
        assert edge() == unfocused
        for reason in (Qt.TabFocusReason, Qt.BacktabFocusReason, Qt.ShortcutFocusReason):
            leave()
            chat.setFocus(reason)
            qtbot.waitUntil(chat.hasFocus)
            assert edge() != unfocused, reason
        come_back()
        assert edge() != unfocused
        leave()
        click()
        assert edge() == unfocused
        leave()
        for _ in range(100):  # the Tab key itself, from the message box on
            qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Tab)
            if chat.hasFocus():
                break
        assert chat.hasFocus() and edge() != unfocused
    finally:
        close_window(win)


def test_an_edited_message_keeps_its_earlier_version_within_reach(qtbot, qs):
    """A new user edited "What is 17 * 23?" into "What is 12 * 12?": the old question and its
    reply stayed stored but nothing in the window led back to them (replies had "version 2
    of 2 · ‹ previous"; the edited message had only "edit"). The message now shows its
    versions the same way, and a click brings back the old question with its reply."""
    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        conv = win.new_chat()
        db = win.store.db
        old = db.add_message(conv.id, "user", "What is 17 * 23?")
        db.add_message(conv.id, "assistant", "It is 391.", parent_id=old.id, mode="plain")
        new = db.edit_user_message(old.id, "What is 12 * 12?")
        db.add_message(conv.id, "assistant", "It is 144.", parent_id=new.id, mode="plain")
        win.select_conversation(win.store.get(conv.id))
        user = win.conv.messages[0]
        assert user.content == "What is 12 * 12?" and user.edits == (old.id, new.id)
        text = win.chat.toPlainText()
        assert "version 2 of 2 · ‹ previous" in text and "It is 144." in text
        win.chat.verticalScrollBar().setValue(0)
        click_link(qtbot, win.chat, f"prompt:{old.id}")
        qtbot.waitUntil(lambda: "What is 17 * 23?" in win.chat.toPlainText())
        text = win.chat.toPlainText()
        assert "It is 391." in text and "It is 144." not in text
        assert "version 1 of 2 · next ›" in text
        # the choice is stored: the chat reopens on it
        assert win.store.get(conv.id).messages[0].content == "What is 17 * 23?"
        assert [m.role for m in win.conv.messages] == ["user", "assistant"]
    finally:
        close_window(win)


def test_new_chat_clears_the_search_filter(qtbot, qs):
    """A new user's pass: with a search typed ("zzzzqq"), Ctrl+N opened a chat that the list
    did not show ("No chats match"). New chat now clears the filter, so the chat is listed
    and selected."""
    from PySide6.QtCore import Qt

    win = make_window(qtbot, qs, ScriptedBackend())
    try:
        win.new_chat()
        win.conversations.rename_conversation("First")
        win.conv_side.search_box.setText("zzzzqq")
        conv = win.new_chat()
        assert win.conv_side.search_box.text() == ""
        lst = win.conv_side.list
        ids = [lst.item(i).data(Qt.UserRole) for i in range(lst.count())]
        assert conv.id in ids
    finally:
        close_window(win)


def test_quit_asks_only_while_a_reply_is_being_written(qtbot, qs, tmp_path, monkeypatch):
    """Ctrl+Q about a second after a short reply ended asked "A reply is still being written.
    Quit anyway?": the window counted the reply as running until the worker had stored it
    (and measured it), after its last token was on screen. It asks while a side has no
    result yet, not after; and the reply quit after its end is stored whole."""
    from app.chat.stored_turn import _TurnRun
    from app.chat.turns import ViewStore
    from app.ui.window import MainWindow

    backend = ScriptedBackend(cycles=100_000, block=4, delay_s=0.002)
    db = tmp_path / "conversations.db"
    win = MainWindow(backend=backend, store=ViewStore(db), qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.show()
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
    asked = []
    monkeypatch.setattr(win, "confirm_quit_while_busy", lambda: asked.append(1) or False)
    # while a reply is written, the question comes (answered No: the window stays)
    assert win.send("Tell me a long story.")
    qtbot.waitUntil(lambda: win.replies.run is not None
                    and win.replies.run.sides[""].stats.cycles >= 2, timeout=10_000)
    win.close()
    assert asked == [1] and win.isVisible()
    win.stop()
    qtbot.waitUntil(lambda: not win.busy, timeout=10_000)
    # a short reply whose final write waits: it has ended when the window is closed
    backend.cycles, backend.delay_s = 3, 0.0
    real_final = _TurnRun._store_final
    gate = threading.Event()

    def held_final(self, begun):  # after ReplyFinished, before the store's lock is taken
        gate.wait(30)
        return real_final(self, begun)

    monkeypatch.setattr(_TurnRun, "_store_final", held_final)
    assert win.send(PROMPT)
    qtbot.waitUntil(lambda: win.replies.run is not None
                    and win.replies.run.sides[""].result is not None, timeout=30_000)
    assert win.busy  # the worker has not stored it yet
    gate.set()  # no event is handled before closeEvent: the window still counts it busy
    win.close()
    assert asked == [1]  # nothing left to write: no question
    monkeypatch.undo()
    reopened = ViewStore(db)
    try:
        conv = reopened.db.list_conversations()[0]
        last = reopened.db.messages(conv.id)[-1]
        assert last.role == "assistant" and last.status == "complete"
    finally:
        reopened.close()


def test_unload_asks_first_while_a_reply_is_being_written(qtbot, qs, monkeypatch):
    """File › Unload model during a reply stopped it without a word (Quit and Delete ask
    first). It asks now, No by default: No leaves the reply and the model as they were."""
    from PySide6.QtWidgets import QMessageBox

    backend = ScriptedBackend(cycles=100_000, block=4, delay_s=0.002)
    win = make_window(qtbot, qs, backend)
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        asked = []

        def answer(reply):
            def question(parent, title, text, buttons=None, default=None):
                asked.append((title, text, default))
                return reply
            return question

        monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.No))
        assert win.send("Tell me a long story.")
        qtbot.waitUntil(lambda: win.replies.run is not None
                        and win.replies.run.sides[""].stats.cycles >= 2, timeout=10_000)
        win.models.unload_asking()
        assert asked and asked[0][0] == "Unload model" and asked[0][2] == QMessageBox.No
        assert "A reply is still being written" in asked[0][1]
        assert win.model is not None and win.busy  # nothing changed
        monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.Yes))
        win.models.unload_asking()
        qtbot.waitUntil(lambda: not win.busy, timeout=10_000)
        assert win.model is None
        # with no reply running, no question
        asked.clear()
        win.models.unload_asking()
        assert asked == []
    finally:
        close_window(win)


def test_delete_chat_defaults_to_no(qtbot, qs, monkeypatch):
    """The Delete chat question had Yes as its default button: Enter deleted the chat."""
    from PySide6.QtWidgets import QMessageBox

    win = make_window(qtbot, qs, ScriptedBackend(cycles=2, block=4))
    try:
        win.load_model("scripted-target", "scripted-drafter")
        qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)
        send_and_wait(qtbot, win, PROMPT)
        asked = []
        monkeypatch.setattr(QMessageBox, "question",
                            lambda parent, title, text, buttons=None, default=None:
                            asked.append(default) or QMessageBox.No)
        win.conversations.delete_chat()
        assert asked == [QMessageBox.No] and win.conv is not None
    finally:
        close_window(win)
