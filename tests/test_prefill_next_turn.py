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


@pytest.mark.parametrize("mode", ["plain", "dflash", "dflash2"])
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
