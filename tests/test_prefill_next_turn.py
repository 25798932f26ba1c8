"""The next turn's prefix prefilled between replies (``ChatSession.prefill_next_turn``).

Qwen-style templates drop the reasoning of the replies before the last user message, so after a
reply the prompt of the next turn no longer extends what the target's cache holds: without a
prefill in between, a follow-up prefills the whole last exchange (tool call, tool result,
answer) again. With it, the follow-up prefills only its own message, and gives the tokens of a
session that never prefilled ahead."""

from __future__ import annotations

import pytest

from app.chat.events import ReplyDone

SETTINGS = {"max_tokens": 96, "use_tools": True, "temperature": 0.0,
            "system_prompt": "You are a helpful assistant."}
FIRST, FOLLOW = "What is 17 times 23?", "Now divide that by 7."

#: every mode; make test-fast runs the dflash one (the others are marked slow)
FAST_TIER_DFLASH_ONLY = [pytest.param(m, marks=() if m == "dflash" else pytest.mark.slow)
                         for m in ("plain", "dflash", "dflash2")]


@pytest.fixture(scope="module")
def demo_spec():
    from app.chat.session import PairSpec
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    return PairSpec(target=str(t), drafter=str(d), drafter2=str(demo_dflash2_dir()))


def _session(spec):
    from app.chat.session import ChatSession
    from app.chat.storage import Store

    s = ChatSession(Store(":memory:"))
    s.load(spec)
    return s


def _send(session, conv_id, text, settings):
    done = [e for e in session.send(conv_id, text, settings) if isinstance(e, ReplyDone)]
    assert len(done) == 1
    return done[0].reply


@pytest.mark.parametrize("mode", FAST_TIER_DFLASH_ONLY)
def test_a_follow_up_prefills_only_its_message_and_gives_the_same_tokens(demo_spec, mode):
    settings = {**SETTINGS, "mode": mode}
    ahead, cold = _session(demo_spec), _session(demo_spec)
    convs = [s.store.new_conversation(system_prompt=settings["system_prompt"]).id
             for s in (ahead, cold)]
    firsts = [_send(s, c, FIRST, settings) for s, c in zip((ahead, cold), convs)]
    assert firsts[0].all_tokens == firsts[1].all_tokens
    assert len(firsts[0].rounds) == 2  # a calculator call, then the answer
    done = ahead.prefill_next_turn(convs[0], settings, settings["system_prompt"])
    assert done is not None and done.tokens > done.reused > 0
    # what the cache holds now is the next prompt's start: nothing more to do
    assert ahead.prefill_next_turn(convs[0], settings, settings["system_prompt"]) is None
    assert len(ahead.cache.ids) == done.tokens  # the cache holds exactly that prefix
    warm, fresh = (_send(s, c, FOLLOW, settings) for s, c in zip((ahead, cold), convs))
    assert warm.all_tokens == fresh.all_tokens
    w, f = warm.rounds[0].summary, fresh.rounds[0].summary
    assert w.prompt_tokens == f.prompt_tokens
    assert w.reused_tokens == done.tokens
    new_message = len(ahead.target.tokenizer.encode(FOLLOW, add_special_tokens=False))
    assert w.prompt_tokens - w.reused_tokens <= new_message + 12  # the message and its markup
    # without the prefill the follow-up read the last exchange again (call, result, answer)
    assert f.prompt_tokens - f.reused_tokens > w.prompt_tokens - w.reused_tokens + 40
    if mode != "plain":  # the drafter's context covers the prefilled tokens too
        assert ahead.cache.drafter_len == len(ahead.cache.ids)


def test_nothing_to_prefill_without_a_finished_reply(demo_spec):
    s = _session(demo_spec)
    conv = s.store.new_conversation()
    assert s.prefill_next_turn(conv.id, {**SETTINGS, "mode": "dflash"}) is None  # empty chat


def test_the_worker_prefills_on_request_and_survives_a_failure(qtbot):
    from app.chat.storage import Store
    from app.ui.worker import Worker

    calls = []

    class Backend:
        def prefill_next_turn(self, conv_id, settings, system_prompt, store=None):
            calls.append((conv_id, settings, system_prompt, store))
            if conv_id == 2:
                raise RuntimeError("boom")
            return None

    store = Store(":memory:")
    w = Worker(Backend(), store)
    w._on_prefill(1, {"mode": "dflash"}, "Be brief.")
    w._on_prefill(2, {"mode": "plain"}, "")  # logged, not raised: the next turn prefills more
    assert calls == [(1, {"mode": "dflash"}, "Be brief.", store),
                     (2, {"mode": "plain"}, "", store)]


@pytest.mark.parametrize("mode", FAST_TIER_DFLASH_ONLY)
def test_a_new_chat_prefilled_after_load_reads_only_its_message(demo_spec, mode):
    """``prefill_new_chat`` (the window's worker runs it after a load): the first reply of a
    fresh start reuses the whole system + tools preamble and gives a cold start's tokens and
    target cache."""
    from test_engine_exact import cache_state, cache_tol, max_difference

    settings = {**SETTINGS, "mode": mode}
    ahead, cold = _session(demo_spec), _session(demo_spec)
    done = ahead.prefill_new_chat(settings, settings["system_prompt"])
    assert done is not None and done.reused == 0 and done.tokens > 500  # tools are long
    assert ahead.prefill_new_chat(settings, settings["system_prompt"]) is None  # held now
    convs = [s.store.new_conversation(system_prompt=settings["system_prompt"]).id
             for s in (ahead, cold)]
    warm, fresh = (_send(s, c, FIRST, settings) for s, c in zip((ahead, cold), convs))
    assert warm.all_tokens == fresh.all_tokens
    w, f = warm.rounds[0].summary, fresh.rounds[0].summary
    assert w.prompt_tokens == f.prompt_tokens and f.reused_tokens == 0
    assert w.reused_tokens == done.tokens
    new_message = len(ahead.target.tokenizer.encode(FIRST, add_special_tokens=False))
    assert w.prompt_tokens - w.reused_tokens <= new_message + 12
    # zero but in float32 under OpenBLAS, whose rounding depends on the row count (as in
    # tests/test_prefix_across_chats.py): the demo target runs in float32 on this CPU
    dtype = next(c.keys.dtype for c in cold.cache.target_cache if hasattr(c, "keys"))
    assert max_difference(cache_state(ahead.cache.target_cache),
                          cache_state(cold.cache.target_cache)) <= cache_tol(dtype)


def test_a_preamble_prefilled_without_tools_or_system_prompt(demo_spec):
    """No system prompt and no tools: what the template writes before the first message is
    still prefilled, and a different system prompt is a different preamble."""
    s = _session(demo_spec)
    plain = {"max_tokens": 8, "mode": "plain"}
    done = s.prefill_new_chat(plain)
    assert done is not None and 0 < done.tokens < 20
    other = s.prefill_new_chat(plain, "Answer in French.")
    assert other is not None and other.tokens > done.tokens


def test_the_worker_prefills_a_new_chat_on_request_and_survives_a_failure(qtbot):
    from app.chat.storage import Store
    from app.ui.worker import Worker

    calls = []

    class Backend:
        def prefill_new_chat(self, settings, system_prompt):
            calls.append((settings, system_prompt))
            if system_prompt == "boom":
                raise RuntimeError("boom")
            return None

    w = Worker(Backend(), Store(":memory:"))
    w._on_preamble({"mode": "dflash"}, "Be brief.")
    w._on_preamble({"mode": "plain"}, "boom")  # logged, not raised
    assert calls == [({"mode": "dflash"}, "Be brief."), ({"mode": "plain"}, "boom")]


def test_a_long_chat_that_leaves_turns_out_still_prefills_its_next_turn(demo_spec):
    """Once earlier turns are left out to fit (in steps of two turns), the next turn's start
    is still prefilled between replies, and the next reply reuses all of it with a cold
    session's tokens."""
    settings = {"max_tokens": 24, "mode": "dflash", "temperature": 0.0}
    ahead, cold = _session(demo_spec), _session(demo_spec)
    chat = [{"role": "system", "content": "You are a helpful assistant."}]
    for i, country in enumerate(["France", "Peru", "Kenya", "Japan", "Chile"]):
        chat += [{"role": "user", "content": f"Question {i}: what is the capital of {country}?"},
                 {"role": "assistant", "content": f"I do not know the capital of {country}."}]
    for s in (ahead, cold):  # room for the system prompt and about three of the five turns
        s.target.trained_chat_length = 130
    done = ahead.prefill_after(chat, settings)
    assert done is not None and done.tokens > 40
    nxt = [*chat, {"role": "user", "content": "And of Spain?"}]
    replies = []
    for s in (ahead, cold):
        events = list(s.reply(nxt, settings))
        notice = [e for e in events if type(e).__name__ == "Notice"]
        assert notice and notice[0].left_out_turns % 2 == 0 < notice[0].left_out_turns
        replies.append([e for e in events if isinstance(e, ReplyDone)][0].reply)
    warm, fresh = replies
    assert warm.all_tokens == fresh.all_tokens
    assert warm.rounds[0].summary.reused_tokens == done.tokens
