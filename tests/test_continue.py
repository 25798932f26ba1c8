"""Continue after Max tokens (Qt-free, the chat layer): the stored reply Max tokens cut goes on
where it stopped, from token ids (the first run's prompt ids plus the reply's own tokens), in
the mode that made it, and the same row then holds the whole reply. With greedy decoding a
reply with Max tokens N continued for N more is the reply with Max tokens 2N, token for token,
text for text."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from engine_fixtures import FakeCancel

from app.chat import reply as reply_mod
from app.chat.events import RoundFinished, RoundResumed, RoundStarted
from app.chat.session import ChatSession, PairSpec
from app.chat.storage import Store
from app.chat.stored_turn import CannotContinueError, TurnRequest, run_turn
from app.chat.turns import CONTINUED_KEY, RESUME_KEY, ViewStore
from app.engine.errors import EngineError
from app.engine.events import Done, Summary, TokenEvent
from app.engine.threads import allow_engine_on_current_thread

PROMPT = "What is the capital of France?"
N = 10


def _loaded(pair, store: Store | None = None) -> ChatSession:
    """A session over ``store`` with the fixture pair (``tiny_hybrid`` / ``tiny_dense``)
    loaded as the window loads a pair."""
    allow_engine_on_current_thread()
    target, drafter = pair
    session = ChatSession(store if store is not None else Store(":memory:"))
    session.load(PairSpec(str(target.path), str(drafter.path)))
    return session


def _one_shot(pair, settings: dict, max_tokens: int):
    """The stored reply to PROMPT in a fresh session with ``max_tokens``."""
    session = _loaded(pair)
    conv = session.store.new_conversation()
    list(session.send(conv.id, PROMPT, dict(settings, max_tokens=max_tokens)))
    return session.store.get_message(session.last_reply_id)


@pytest.mark.parametrize("pair_name, mode, think", [
    ("tiny_hybrid", "plain", True),
    ("tiny_hybrid", "dflash", True),
    ("tiny_hybrid", "dflash", False),
    ("tiny_dense", "plain", False),
    ("tiny_dense", "dflash", True),
])
def test_max_tokens_n_then_continue_n_is_the_reply_with_max_tokens_2n(
        request, tmp_path, pair_name, mode, think):
    pair = request.getfixturevalue(pair_name)
    settings = {"mode": mode, "max_tokens": N, "use_tools": False, "temperature": 0.0,
                "enable_thinking": think}
    path = tmp_path / "chats.db"
    store = Store(path)
    session = _loaded(pair, store)
    conv = store.new_conversation()
    list(session.send(conv.id, PROMPT, settings))
    cut = store.get_message(session.last_reply_id)
    assert cut.finish_reason == "length" and len(cut.token_ids) == N
    assert cut.generation[RESUME_KEY]["prompt_ids"]  # what Continue resumes from

    events = list(session.continue_reply(cut.id, settings))
    assert session.last_reply_id == cut.id
    started = next(e for e in events if isinstance(e, RoundStarted))
    resumed = next(e for e in events if isinstance(e, RoundResumed))
    assert resumed.tokens == cut.token_ids
    run = next(e for e in events if isinstance(e, RoundFinished)).round.summary
    prompt = cut.generation[RESUME_KEY]["prompt_ids"]
    # the continuation's prompt is the first run's prompt ids and the reply's own tokens, and
    # only the last of those is prefilled again (the kept cache holds the rest)
    assert started.prompt_tokens == run.prompt_tokens == len(prompt) + N
    assert run.reused_tokens == len(prompt) + N - 1
    assert run.generated_tokens == N and run.mode == mode

    whole = store.get_message(cut.id)
    one = _one_shot(pair, settings, 2 * N)
    assert whole.token_ids == one.token_ids and len(whole.token_ids) == 2 * N
    assert whole.token_ids[:N] == cut.token_ids
    assert (whole.content, whole.reasoning) == (one.content, one.reasoning)
    assert whole.reasoning or whole.content
    assert whole.finish_reason == one.finish_reason == "length"
    assert whole.summary["generated_tokens"] == one.summary["generated_tokens"] == 2 * N
    assert whole.summary["prompt_tokens"] == one.summary["prompt_tokens"] == len(prompt)
    assert whole.summary["mode"] == mode and whole.mode == mode
    assert len(whole.from_draft) == 2 * N
    assert whole.generation[CONTINUED_KEY] == [
        {"after_tokens": N, "tokens": N, "max_tokens": N}]
    # one assistant message, no user message added, in the store and after a restart
    assert [(m.role, m.id) for m in store.messages(conv.id)] == [
        ("user", cut.parent_id), ("assistant", cut.id)]

    # Max tokens again: Continue is offered again and goes on as far as one 3N reply
    list(session.continue_reply(cut.id, settings))
    store.close()
    reopened = ViewStore(path)
    try:
        view = reopened.get(conv.id)
        assert [t.role for t in view.messages] == ["user", "assistant"]
        result = view.messages[-1].version.result
        three = _one_shot(pair, settings, 3 * N)
        assert result.tokens == three.token_ids and len(result.tokens) == 3 * N
        assert (result.content, result.reasoning) == (three.content, three.reasoning)
        assert result.summary.generated_tokens == 3 * N
        assert [c["after_tokens"] for c in result.continued] == [N, 2 * N]
        assert result.resumable and result.finish_reason == "length"
    finally:
        reopened.close()


DFLASH_N = {"mode": "dflash", "max_tokens": N, "use_tools": False, "temperature": 0.0}


def _cut_dflash_reply(pair):
    """``(session, store, settings, cut row)``: a DFlash reply Max tokens ended after N."""
    session = _loaded(pair)
    conv = session.store.new_conversation()
    list(session.send(conv.id, PROMPT, DFLASH_N))
    return session, session.store, dict(DFLASH_N), session.store.get_message(
        session.last_reply_id)


def test_a_stopped_continuation_is_stored_stopped_and_not_offered_again(tiny_hybrid):
    session, store, settings, cut = _cut_dflash_reply(tiny_hybrid)
    stop = threading.Event()
    stop.set()  # Stop pressed at once: the first cycle does not run
    list(session.continue_reply(cut.id, dict(settings, max_tokens=200), stop))
    row = store.get_message(cut.id)
    assert row.status == "stopped" and row.finish_reason == "cancelled"
    assert row.token_ids[:N] == cut.token_ids and len(row.token_ids) < N + 200
    assert not row.generation[RESUME_KEY]
    with pytest.raises(CannotContinueError, match="was stopped"):
        list(session.continue_reply(cut.id, settings))


def test_continue_needs_the_models_that_made_the_reply_and_keeps_it_otherwise(
        tiny_hybrid, tiny_dense, monkeypatch):
    session, store, settings, cut = _cut_dflash_reply(tiny_hybrid)

    def unchanged():
        row = store.get_message(cut.id)
        return (row.content, row.reasoning, row.token_ids, row.summary, row.status,
                row.finish_reason, row.generation) == (
            cut.content, cut.reasoning, cut.token_ids, cut.summary, cut.status,
            cut.finish_reason, cut.generation)

    target, drafter = tiny_hybrid
    session.load(PairSpec(str(target.path)))  # the target alone: no DFlash
    with pytest.raises(CannotContinueError, match="made in DFlash"):
        list(session.continue_reply(cut.id, settings))
    assert unchanged()
    other_target, other_drafter = tiny_dense
    session.load(PairSpec(str(other_target.path), str(other_drafter.path)))
    with pytest.raises(CannotContinueError, match="not the pair loaded now"):
        list(session.continue_reply(cut.id, settings))
    assert unchanged()

    session.load(PairSpec(str(target.path), str(drafter.path)))

    def broken(*args, **kwargs):
        raise EngineError("the GPU went away")

    monkeypatch.setattr(reply_mod, "_engine_generate", broken)
    with pytest.raises(EngineError, match="kept as it was"):
        list(session.continue_reply(cut.id, settings))
    assert unchanged()

    class FailsMidway(FakeCancel):  # a few tokens, then the engine's Done says it failed
        def __init__(self, *args, **kwargs):
            super().__init__()

        def __iter__(self):
            for i in range(3):
                yield TokenEvent(7 + i, i, False)
            yield Done(Summary(mode="dflash", generated_tokens=3, stop_cause="error",
                               error="RuntimeError: out of memory"))

    monkeypatch.setattr(reply_mod, "_engine_generate", FailsMidway)
    with pytest.raises(EngineError, match="out of memory. The reply is kept as it was"):
        list(session.continue_reply(cut.id, settings))
    assert unchanged()
    monkeypatch.undo()
    list(session.continue_reply(cut.id, settings))  # with the pair back, it continues
    assert len(store.get_message(cut.id).token_ids) == 2 * N


def test_a_compare_turn_is_not_continued(tiny_hybrid):
    settings = {"mode": "dflash", "max_tokens": N, "use_tools": False, "temperature": 0.0}
    session = _loaded(tiny_hybrid)
    store = session.store
    conv = store.new_conversation()
    events = [t.event for t in run_turn(store, session, TurnRequest(
        conv.id, PROMPT, settings, tags=("plain", "dflash")))]
    side = store.get_message(events[0].reply_ids["dflash"])
    assert side.finish_reason == "length" and side.compare_group
    assert RESUME_KEY not in side.generation
    with pytest.raises(CannotContinueError, match="Compare turn"):
        list(session.continue_reply(side.id, settings))
    assert store.get_message(side.id).token_ids == side.token_ids


# ------------------------------------------------------------------ a cut tool call
LOOKUP = ("<tool_call>\n<function=country_info>\n<parameter=name>\nChile\n</parameter>\n"
          "</function>\n</tool_call>")
ANSWER = "Chile is in South America; its capital is Santiago."


class ScriptEngine:
    """Replaces ``reply._engine_generate``: each call emits the next script's ids (the end
    token after the last one), at most ``max_tokens`` of them (then ``length``), and records
    the prompt it was given."""

    def __init__(self, tokenizer, scripts: list[list[int]]):
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.scripts = scripts
        self.prompts: list[list[int]] = []

    def __call__(self, target, prompt_ids, config, drafter=None, session=None,
                 boundaries=None):
        self.prompts.append(list(prompt_ids))
        ids = self.scripts[len(self.prompts) - 1] + [self.eos]
        emitted = ids[: config.max_tokens]
        cause = "end_token" if emitted == ids else "length"

        class Gen(FakeCancel):
            def __iter__(self):
                for i, t in enumerate(emitted):
                    yield TokenEvent(t, i, False)
                yield Done(Summary(mode=config.mode, generated_tokens=len(emitted),
                                   prompt_tokens=len(prompt_ids), stop_cause=cause,
                                   tok_per_s=100.0))

        return Gen()


def test_a_tool_call_the_limit_cut_is_completed_and_then_runs(monkeypatch, qwen_tokenizer):
    """Max tokens cut the reply inside its tool call (not run: ``cut_in_tool_call``);
    Continue resumes inside the call, the call completes and runs, and the reply goes on
    to its answer, all in the one stored reply."""
    allow_engine_on_current_thread()
    store = Store(":memory:")
    session = ChatSession(store)
    eos = {qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")}
    session.target = SimpleNamespace(tokenizer=qwen_tokenizer, eos_token_ids=eos,
                                     context_length=8192, path="/models/scripted")
    session.cache = object()  # stands for the PromptCache the engine would use
    call = qwen_tokenizer.encode(LOOKUP, add_special_tokens=False)
    cut_at = call.index(qwen_tokenizer.encode("Chile", add_special_tokens=False)[0])
    answer = qwen_tokenizer.encode(ANSWER, add_special_tokens=False)
    engine = ScriptEngine(qwen_tokenizer, [call[:cut_at], call[cut_at:], answer])
    monkeypatch.setattr(reply_mod, "_engine_generate", engine)
    settings = {"mode": "plain", "use_tools": True, "max_tokens": cut_at,
                "enable_thinking": False}
    conv = store.new_conversation()
    list(session.send(conv.id, "Tell me about Chile.", settings))
    cut = store.get_message(session.last_reply_id)
    assert cut.finish_reason == "length" and not cut.tool_calls and cut.content == ""

    events = list(session.continue_reply(cut.id, dict(settings, max_tokens=200)))
    assert engine.prompts[1] == engine.prompts[0] + call[:cut_at]  # ids, not text again
    assert any(getattr(e, "run", None) is not None for e in events)  # the tool ran
    row = store.get_message(cut.id)
    assert row.status == "complete" and row.content == ANSWER
    assert row.tool_calls[0]["name"] == "country_info"
    assert row.tool_calls[0]["result"]["population"] == 19600000
    assert [m["role"] for m in row.rounds] == ["assistant", "tool", "assistant"]
    assert row.rounds[0]["tool_calls"][0]["function"]["arguments"] == {"name": "Chile"}
    assert row.summary["generated_tokens"] == len(call) + 1 + len(answer) + 1
    assert [s["generated_tokens"] for s in row.summary["round_summaries"]] == [
        len(call) + 1, len(answer) + 1]
    assert [m.role for m in store.messages(conv.id)] == ["user", "assistant"]
    # the second round's prompt holds the completed call and its result
    assert '"population": 19600000' in qwen_tokenizer.decode(engine.prompts[2])
