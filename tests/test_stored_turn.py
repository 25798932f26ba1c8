"""app.chat.stored_turn: one turn stored as it is generated (Qt-free), and the store shared by
two threads (the GUI thread reads while the worker writes a reply)."""

from __future__ import annotations

import threading

import pytest

from app.chat.scripted import ScriptedSession, ScriptedTurn
from app.chat.storage import StorageError, Store, _prompt_dicts
from app.chat.stored_turn import (
    ReplyFailed,
    ReplyFinished,
    TurnBegun,
    TurnNotStarted,
    TurnRequest,
    TurnStored,
    run_turn,
)
from app.engine.errors import GenerationError
from app.engine.events import TokenEvent

SETTINGS = {"mode": "dflash", "block_size": 4, "rollback": "tape", "max_tokens": 64,
            "temperature": 0.0}


@pytest.fixture
def store():
    s = Store(":memory:")
    yield s
    s.close()


def events_of(store, backend, request, cancel=None, interrupted=None):
    return [t.event for t in run_turn(store, backend, request, cancel, interrupted)]


def test_a_turn_stores_the_user_message_the_reply_and_its_final_state(store):
    conv = store.new_conversation()
    backend = ScriptedSession(cycles=3, block=4)
    events = events_of(store, backend, TurnRequest(conv.id, "Capital of France?", SETTINGS,
                                                   system_prompt="Be brief."))
    begun = events[0]
    assert isinstance(begun, TurnBegun) and set(begun.reply_ids) == {"dflash"}
    assert isinstance(events[-1], TurnStored) and events[-1].chosen == "dflash"
    assert not events[-1].error
    finished = [e for e in events if isinstance(e, ReplyFinished)]
    assert len(finished) == 1
    # the prompt was read back from the stored rows, with the system prompt first
    assert backend.last_messages == [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Capital of France?"}]
    row = store.get_message(begun.reply_ids["dflash"])
    assert row.status == "complete" and row.content == finished[0].result.content
    assert row.token_ids == finished[0].result.tokens
    assert row.block_size == 4 and row.generation["max_tokens"] == 64
    assert store.get_message(begun.user_id).content == "Capital of France?"
    assert store.get_conversation(conv.id).title == "Capital of France?"


def test_a_turn_that_cannot_be_stored_stores_nothing_and_runs_nothing(store, monkeypatch):
    conv = store.new_conversation()
    backend = ScriptedSession(cycles=2)
    events_of(store, backend, TurnRequest(conv.id, "first", SETTINGS))
    before = [(m.id, m.content, m.status) for m in store.messages(conv.id)]
    backend.turn = 0

    def refuse(*args, **kwargs):
        raise StorageError("disk full")

    monkeypatch.setattr(store, "begin_reply", refuse)
    events = events_of(store, backend, TurnRequest(conv.id, "second", SETTINGS))
    assert len(events) == 1 and isinstance(events[0], TurnNotStarted)
    assert "disk full" in events[0].message
    assert backend.turn == 0  # no reply ran
    # the user message was rolled back with the reply row: the conversation is as it was
    assert [(m.id, m.content, m.status) for m in store.messages(conv.id)] == before
    monkeypatch.undo()
    events = events_of(store, backend, TurnRequest(conv.id, "second", SETTINGS))
    assert isinstance(events[-1], TurnStored)
    assert [m["content"] for m in _prompt_dicts(store.active_path(conv.id))][::2] == ["first",
                                                                              "second"]


class Failing(ScriptedSession):
    def _events(self, turn, mode, cancel):
        yield TokenEvent(5, 0, False)
        from app.chat.events import ContentDelta

        yield ContentDelta("Half an ans")
        raise GenerationError("block size 99 is larger than the drafter's 8")


def test_a_failed_reply_is_stored_with_its_error_and_the_earlier_turns_stay(store):
    conv = store.new_conversation()
    events_of(store, ScriptedSession(cycles=2), TurnRequest(conv.id, "first", SETTINGS))
    events = events_of(store, Failing(), TurnRequest(conv.id, "second", SETTINGS))
    (failed,) = [e for e in events if isinstance(e, ReplyFailed)]
    assert "block size 99" in failed.message
    row = store.get_message(events[0].reply_ids["dflash"])
    assert row.status == "error" and "block size 99" in row.error
    assert row.content == "Half an ans" and row.token_ids == [5]
    # the failed reply is left out of the next prompt; the first turn is intact
    prompt = _prompt_dicts(store.active_path(conv.id))
    assert [m["role"] for m in prompt] == ["user", "assistant", "user"]
    assert prompt[1]["content"]


def test_regenerate_compare_and_edit_store_siblings(store):
    conv = store.new_conversation()
    backend = ScriptedSession(cycles=2)
    first = events_of(store, backend, TurnRequest(conv.id, "q", SETTINGS))[0]
    again = events_of(store, backend, TurnRequest(
        conv.id, "", {**SETTINGS, "mode": "plain"}, key="plain",
        regenerate_of=first.reply_ids["dflash"]))
    assert again[0].user_id is None
    new_id = again[0].reply_ids["plain"]
    assert [v.id for v in store.versions(new_id)] == [first.reply_ids["dflash"], new_id]
    assert store.active_path(conv.id)[-1].id == new_id
    cmp = events_of(store, backend, TurnRequest(conv.id, "compare", SETTINGS,
                                                tags=("plain", "dflash")))
    assert set(cmp[0].reply_ids) == {"plain", "dflash"} and cmp[-1].chosen == "dflash"
    assert backend.last_settings.mode == "dflash"
    rows = [store.get_message(i) for i in cmp[0].reply_ids.values()]
    assert {r.mode: r.status for r in rows} == {"plain": "complete", "dflash": "complete"}
    assert store.active_path(conv.id)[-1].id == cmp[0].reply_ids["dflash"]
    edited = events_of(store, backend, TurnRequest(conv.id, "q, edited", SETTINGS,
                                                   edit_of=first.user_id))
    assert [m.content for m in store.versions(edited[0].user_id)] == ["q", "q, edited"]
    assert [m.role for m in store.active_path(conv.id)] == ["user", "assistant"]


def test_stop_and_quit_mark_the_rows_stopped_and_interrupted(store):
    conv = store.new_conversation()
    cancel, interrupted = threading.Event(), threading.Event()
    cancel.set()
    events = events_of(store, ScriptedSession(cycles=100),
                       TurnRequest(conv.id, "q", SETTINGS, tags=("plain", "dflash")), cancel)
    stored = events[-1]
    assert stored.chosen == "plain"  # the DFlash side never started
    statuses = {k: store.get_message(i).status for k, i in stored.reply_ids.items()}
    assert statuses == {"plain": "stopped", "dflash": "stopped"}
    interrupted.set()
    events = events_of(store, ScriptedSession(cycles=100), TurnRequest(conv.id, "q2", SETTINGS),
                       cancel, interrupted)
    assert store.get_message(events[-1].reply_ids["dflash"]).status == "interrupted"


@pytest.mark.parametrize("how", ["stop", "quit"])
def test_a_compare_side_that_finished_before_stop_or_quit_stays_complete(store, how):
    """Stop (or quitting) during a Compare's DFlash side cuts that side only: the plain side
    had finished, so its row is complete (the chat footer then keeps its speed), while the
    DFlash side is stopped (or interrupted)."""
    conv = store.new_conversation()
    cancel, interrupted = threading.Event(), threading.Event()
    events = []
    for item in run_turn(store, ScriptedSession(cycles=100),
                         TurnRequest(conv.id, "q", SETTINGS, tags=("plain", "dflash")),
                         cancel, interrupted):
        events.append(item.event)
        if isinstance(item.event, ReplyFinished) and item.event.result.mode == "plain":
            cancel.set()
            if how == "quit":
                interrupted.set()
    stored = events[-1]
    statuses = {k: store.get_message(i).status for k, i in stored.reply_ids.items()}
    cut = "stopped" if how == "stop" else "interrupted"
    assert statuses == {"plain": "complete", "dflash": cut}


def test_tool_rounds_are_stored_with_the_reply(store):
    conv = store.new_conversation()
    backend = ScriptedSession(turns=[ScriptedTurn("look it up", "Santiago.",
                                                  ("country_info", {"name": "Chile"},
                                                   {"capital": "Santiago"}))], cycles=2)
    events = events_of(store, backend, TurnRequest(conv.id, "Chile?", SETTINGS))
    row = store.get_message(events[0].reply_ids["dflash"])
    assert row.tool_calls[0]["name"] == "country_info"
    assert row.tool_calls[0]["result"] == {"capital": "Santiago"}


def test_one_store_is_safe_to_share_between_two_threads(tmp_path):
    """The window's GUI thread reads while the worker writes replies on the same ``Store``
    (one connection opened with ``check_same_thread=False``, every call under the store's
    lock): no "SQLite objects created in a thread" error, no statement interleaved inside
    another thread's transaction, and a reader never sees half a transaction."""
    store = Store(tmp_path / "c.db", partial_interval_s=0.0)
    conv = store.new_conversation()
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for i in range(60):
                with store.transaction():
                    store.add_message(conv.id, "user", f"q{i}")
                    row = store.begin_reply(conv.id, mode="plain")
                    store.update_partial(row.id, content=f"a{i}", force=True)
                store.finish_reply(row.id, status="complete", content=f"a{i}")
        except BaseException as exc:  # pragma: no cover - the failure being tested
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not done.is_set() or reads == 0:
        msgs = store.messages(conv.id)
        # a transaction adds a user message and its reply together: never one alone
        assert len(msgs) % 2 == 0
        store.list_conversations()
        reads += 1
    thread.join()
    assert not errors, errors
    assert len(store.messages(conv.id)) == 120
    assert all(m.status == "complete" for m in store.messages(conv.id)
               if m.role == "assistant")
    store.close()


def test_a_three_sided_compare_stores_a_dflash2_sibling(store):
    conv = store.new_conversation()
    backend = ScriptedSession(cycles=2)
    events = events_of(store, backend, TurnRequest(conv.id, "compare", SETTINGS,
                                                   tags=("plain", "dflash", "dflash2")))
    begun, stored = events[0], events[-1]
    assert set(begun.reply_ids) == {"plain", "dflash", "dflash2"}
    assert stored.chosen == "dflash" and not stored.error
    assert backend.last_settings.mode == "dflash2"  # the third side ran last
    rows = {k: store.get_message(i) for k, i in begun.reply_ids.items()}
    assert {k: r.mode for k, r in rows.items()} == \
        {"plain": "plain", "dflash": "dflash", "dflash2": "dflash2"}
    assert all(r.status == "complete" for r in rows.values())
    assert len({r.compare_group for r in rows.values()}) == 1
    assert len({r.parent_id for r in rows.values()}) == 1
    assert store.active_path(conv.id)[-1].id == begun.reply_ids["dflash"]
    assert [m.id for m in store.compare_siblings(begun.reply_ids["dflash"])] == \
        [begun.reply_ids["plain"], begun.reply_ids["dflash2"]]
    assert store.compare_siblings(begun.user_id) == []
    from app.chat.export import export_markdown

    md = export_markdown(store, conv.id)
    assert md.count("· compared") == 2 and md.count("· continued") == 1
    assert "## Assistant · DFlash2 (block 4, tape rollback) · version 3 of 3 · compared" in md


class _DivergingSession:
    """A backend whose DFlash side differs from plain at token 2, with a top-two gap there."""

    def reply(self, messages, settings, cancel=None):
        from app.chat.events import Reply, ReplyDone, ReplyRound
        from app.engine.events import Summary

        mode = settings.mode
        tokens = [5, 6, 7] if mode == "plain" else [5, 6, 9]
        rnd = ReplyRound(0, mode, "text", "", [], "stop", tokens, [False] * 3, "text",
                         Summary(mode=mode, generated_tokens=3), [1, 2])
        yield ReplyDone(Reply(mode, [rnd], [], []))

    def top2_gap(self, plain, dflash):
        return 0.25


def test_a_compare_keeps_its_top_two_gap_with_the_drafting_row(store):
    from app.chat.turns import ReplyResult

    conv = store.new_conversation()
    events = events_of(store, _DivergingSession(),
                       TurnRequest(conv.id, "compare", SETTINGS, tags=("plain", "dflash")))
    begun = events[0]
    plain = ReplyResult.from_row(store.get_message(begun.reply_ids["plain"]))
    dflash = ReplyResult.from_row(store.get_message(begun.reply_ids["dflash"]))
    assert dflash.top2_gap == 0.25 and dflash.gap_checked
    assert plain.top2_gap is None and not plain.gap_checked  # plain has no gap of its own
    # a stored value that is not a number is no gap
    store.update_generation(begun.reply_ids["dflash"], {"top2_gap": "?"})
    assert ReplyResult.from_row(store.get_message(begun.reply_ids["dflash"])).top2_gap is None


def test_a_tool_replys_round_figures_survive_reopening(store):
    """A reply of two rounds keeps each round's figures in its stored summary, so a reopened
    chat shows "Reply total over 2 rounds" with the round picker, as the live reply did
    (before, it said "This reply": only the total was stored; seen in a new-user pass)."""
    from app.chat.stored_turn import finish_row
    from app.chat.turns import ReplyResult, ViewStore
    from app.engine.events import Summary

    conv = store.new_conversation()
    row = store.begin_reply(conv.id, mode="dflash", block_size=4, rollback="tape")
    r1 = Summary(mode="dflash", generated_tokens=20, cycles=3, drafted=9, accepted=7,
                 prompt_tokens=100)
    r2 = Summary(mode="dflash", generated_tokens=12, cycles=2, drafted=6, accepted=5,
                 prompt_tokens=160)
    result = ReplyResult(content="42.", summary=Summary.reply_total([r1, r2]),
                         round_summaries=[r1, r2], rounds=2, mode="dflash")
    finish_row(store, row.id, result, "complete")
    back = ReplyResult.from_row(store.get_message(row.id))
    assert [s.generated_tokens for s in back.round_summaries] == [20, 12]
    assert [s.prompt_tokens for s in back.round_summaries] == [100, 160]
    assert back.summary.generated_tokens == 32
    view = ViewStore.__new__(ViewStore)
    view.db = store
    assert len(view.get(conv.id).messages[-1].version.result.round_summaries) == 2


def test_kept_writes_are_retried_in_order_and_dropped_once_stored(tmp_path):
    """``PendingWrites.retry``: oldest first, stops at the first that still fails (kept
    with the later ones), drops what was stored; an export made meanwhile holds them."""
    from app.chat.storage import StoreWriteError
    from app.chat.stored_turn import PendingWrite, PendingWrites
    from app.chat.turns import ViewStore

    ts = ViewStore(tmp_path / "c.db")
    store = ts.db
    conv = store.new_conversation("Kept")
    store.add_message(conv.id, "user", "hello")
    row = store.begin_reply(conv.id, mode="plain")
    full = [True]
    done = []

    def first(s) -> None:
        if full[0]:
            raise StoreWriteError("the disk holding x is full", "full", tmp_path)
        s.finish_reply(row.id, content="Hello there.", token_ids=[1, 2])
        done.append("first")

    def second(s) -> None:
        done.append("second")

    kept = PendingWrites()
    kept.add(PendingWrite(conv.id, "the reply", first))
    kept.add(PendingWrite(conv.id, "another", second))
    err = kept.retry(store)
    assert err is not None and err.cause == "full" and len(kept) == 2 and done == []
    assert store.get_message(row.id).status == "generating"
    full[0] = False
    out = ts.export(conv.id, tmp_path / "chat.md", kept)  # from a copy: the file unchanged
    assert "Hello there." in out.read_text(encoding="utf-8")
    assert store.get_message(row.id).status == "generating" and len(kept) == 2
    done.clear()
    assert kept.retry(store) is None and len(kept) == 0 and done == ["first", "second"]
    got = store.get_message(row.id)
    assert got.status == "complete" and got.content == "Hello there."
    ts.close()


def test_the_request_carries_one_typed_record_and_each_side_gets_a_replaced_one(store):
    """A Compare turn's sides run ``replace(settings, mode=tag)`` records (with the frozen
    tools of the turn), the request's own record is never changed, and each row keeps the
    record's figures in the stored ``generation`` format."""
    from app.chat.settings import ReplySettings, Sampling
    from app.engine.modes import Mode

    rs = ReplySettings(mode="dflash", max_tokens=64, block_size=4, run_tools=True,
                       sampling=Sampling(temperature=0.5, seed=3), system_prompt="Be brief.")
    conv = store.new_conversation()
    backend = ScriptedSession(cycles=2, block=4)
    seen = []
    reply = backend.reply
    backend.reply = lambda messages, settings, cancel=None: (seen.append(settings),
                                                             reply(messages, settings,
                                                                   cancel))[1]
    request = TurnRequest(conv.id, "compare", rs, tags=("plain", "dflash"),
                          system_prompt=rs.system_prompt)
    events = events_of(store, backend, request)
    assert request.settings is rs and rs.mode is Mode.DFLASH and rs.runnable_tools is None
    assert [type(s) for s in seen] == [ReplySettings, ReplySettings]
    assert [s.mode for s in seen] == [Mode.PLAIN, Mode.DFLASH]
    assert seen[0].runnable_tools is not None and seen[0].runnable_tools is \
        seen[1].runnable_tools  # one frozen clock for both sides
    assert all(s.max_tokens == 64 and s.sampling == rs.sampling for s in seen)
    row = store.get_message(events[0].reply_ids["dflash"])
    kept = {k: v for k, v in row.generation.items() if k != "top2_gap"}  # the Compare's own
    assert kept == {"max_tokens": 64, "temperature": 0.5, "top_p": 1.0, "top_k": 0,
                    "min_p": 0.0, "seed": 3, "enable_thinking": None}


def test_a_settings_dict_is_converted_and_a_bad_one_refused(store):
    from app.chat.settings import ReplySettings, SettingError

    request = TurnRequest(1, "hi", dict(SETTINGS))
    assert isinstance(request.settings, ReplySettings)
    assert (request.settings.mode, request.settings.block_size) == ("dflash", 4)
    with pytest.raises(SettingError, match="max_tokens 0 is out of range"):
        TurnRequest(1, "hi", dict(SETTINGS, max_tokens=0))
    with pytest.raises(SettingError, match="unknown setting: blocksize"):
        TurnRequest(1, "hi", {"blocksize": 4})


def test_a_stored_reply_with_an_overflow_warning_per_round_says_it_once():
    """Replies stored before ``app.chat.reply`` warned once a reply hold a context overflow
    warning for each tool round: the note says the first one only; other warnings stay."""
    from app.chat.events import Reply, ReplyRound
    from app.chat.settings import ReplySettings
    from app.chat.turns import ReplyResult
    from app.engine.events import Summary

    def overflow(prompt: int) -> dict:  # as app.chat.reply worded it then
        return {"code": "context_overflow",
                "message": f"the prompt has {prompt} tokens and up to 100000 more may be "
                           f"generated, beyond the model's context of 4096: the reply may "
                           f"degrade"}

    rounds = [ReplyRound(i, "plain", "", "", [], "stop", [1, 2], [False] * 2, "",
                         Summary(mode="plain", generated_tokens=2), [1]) for i in range(2)]
    malformed = {"code": "malformed_tool_call", "message": "a tool call could not be read"}
    reply = Reply("plain", rounds, [], [overflow(590), malformed, overflow(726)])
    result = ReplyResult.from_reply(reply, ReplySettings(max_tokens=100000), lambda ids: [])
    assert result.note == ("the prompt has 590 tokens and up to 100000 more may be "
                           "generated, beyond the model's context of 4096: the reply may "
                           "degrade; a tool call could not be read")
