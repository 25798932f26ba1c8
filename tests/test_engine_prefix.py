"""Prefix reuse across turns: the reused state gives the logits of a cold prefill, turn two
prefills only the new tokens, and a template that rewrites earlier text falls back to a snapshot
that is still a prefix."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from engine_fixtures import collect

from app.engine.generate import GenerationConfig, generate
from app.engine.prefix import PromptCache, common_prefix
from app.engine.target import TargetRunner


def _gen(target, ids, drafter=None, session=None, boundaries=(), **kw):
    cfg = GenerationConfig(**{"mode": "plain", "max_tokens": 12, **kw})
    return collect(generate(target, ids, cfg, drafter, session=session, boundaries=boundaries))


def _render(target, messages, gen_prompt=True):
    return list(target.tokenizer.apply_chat_template(messages, add_generation_prompt=gen_prompt))


@pytest.mark.parametrize("pair", ["tiny_hybrid", "tiny_dense"])
def test_reused_prefix_gives_cold_logits_and_prefills_only_new_tokens(request, pair):
    target, _ = request.getfixturevalue(pair)
    turn1 = _render(target, [{"role": "user", "content": "Name a capital."}])
    session = PromptCache()
    first = _gen(target, turn1, session=session)
    covered = turn1 + first.tokens[:-1]  # the last token is pending, never fed
    assert session.ids == covered
    turn2 = covered + [first.tokens[-1]] + _render(target, [{"role": "user", "content": "More"}])
    # next-token logits after the reused prefix == a cold prefill of the whole prompt
    reused = session.prepare(turn2, need_drafter=False)
    assert reused == len(covered)
    runner = TargetRunner(target.model, target.model_type)
    warm = runner.forward(mx.array([turn2[reused:]]), session.target_cache)[0][0, -1]
    cold = runner.forward(mx.array([turn2]), runner.make_cache())[0][0, -1]
    np.testing.assert_allclose(np.array(warm), np.array(cold), atol=1e-4)


@pytest.mark.parametrize("mode", ["plain", "dflash"])
@pytest.mark.parametrize("pair", ["tiny_hybrid", "tiny_dense"])
def test_turn_two_reuses_the_cache_and_matches_a_cold_run(request, pair, mode):
    target, drafter = request.getfixturevalue(pair)
    session = PromptCache()
    turn1 = _render(target, [{"role": "user", "content": "Name a capital."}])
    first = _gen(target, turn1, drafter, session, mode=mode)
    turn2 = turn1 + first.tokens + _render(target, [{"role": "user", "content": "Another?"}])
    warm = _gen(target, turn2, drafter, session, mode=mode)
    cold = _gen(target, turn2, drafter, mode=mode)
    plain = _gen(target, turn2)
    assert warm.tokens == cold.tokens == plain.tokens
    assert warm.summary.reused_tokens == len(turn1) + len(first.tokens) - 1
    assert warm.summary.prompt_tokens - warm.summary.reused_tokens == len(turn2) - (
        len(turn1) + len(first.tokens) - 1
    )
    assert cold.summary.reused_tokens == 0


def test_template_that_strips_reasoning_falls_back_to_the_history_snapshot(tiny_hybrid):
    target, drafter = tiny_hybrid
    session = PromptCache()
    history = [{"role": "user", "content": "What is 2+2?"}]
    turn1 = _render(target, history)
    boundary = len(_render(target, history, gen_prompt=False))
    assert turn1[:boundary] == _render(target, history, gen_prompt=False)
    _gen(target, turn1, drafter, session, boundaries=[boundary], mode="dflash")
    history2 = history + [
        {"role": "assistant", "content": "4", "reasoning_content": "two plus two"},
        {"role": "user", "content": "And 3+3?"},
    ]
    turn2 = _render(target, history2)
    lcp = common_prefix(session.ids, turn2)
    assert boundary <= lcp < len(turn1)  # the template rewrote the earlier reply
    for mode in ("dflash", "plain"):
        warm = _gen(target, turn2, drafter, session, mode=mode)
        cold = _gen(target, turn2, drafter, mode=mode)
        assert warm.tokens == cold.tokens
        if mode == "dflash":
            assert warm.summary.reused_tokens == boundary  # the snapshot, never a wrong state


def test_plain_turn_then_dflash_turn_stays_exact(tiny_hybrid):
    target, drafter = tiny_hybrid
    session = PromptCache()
    turn1 = _render(target, [{"role": "user", "content": "Hi"}])
    first = _gen(target, turn1, drafter, session, mode="plain")
    turn2 = turn1 + first.tokens + _render(target, [{"role": "user", "content": "Bye"}])
    warm = _gen(target, turn2, drafter, session, mode="dflash")
    assert warm.tokens == _gen(target, turn2).tokens
    # the plain turn kept the drafter's tap states: the DFlash turn reuses all of it
    assert warm.summary.reused_tokens == len(turn1) + len(first.tokens) - 1


def test_snapshot_memory_is_bounded(tiny_hybrid):
    target, _ = tiny_hybrid
    session = PromptCache()
    ids = _render(target, [{"role": "user", "content": "Hello there"}])
    _gen(target, ids, session=session, boundaries=[5, 10])
    one = session.snapshots[0].nbytes
    assert [s.position for s in session.snapshots][:3] == [5, 10, len(ids)]
    assert session.snapshot_bytes == one * len(session.snapshots)
    small = PromptCache(max_snapshot_bytes=2 * one)
    _gen(target, ids, session=small, boundaries=[5, 10])
    assert len(small.snapshots) == 2 and small.snapshot_bytes <= 2 * one
    assert small.snapshots[-1].position == len(small.ids)  # the newest are kept


def test_reply_runner_reuses_the_previous_turn(tiny_hybrid):
    from app.chat.reply import ReplySettings, collect_reply

    target, drafter = tiny_hybrid
    settings = ReplySettings(mode="dflash", max_tokens=10)
    session = PromptCache()
    convo = [{"role": "user", "content": "Hello"}]
    first = collect_reply(target, drafter, convo, settings, session=session)
    convo = convo + first.messages + [{"role": "user", "content": "Again"}]
    warm = collect_reply(target, drafter, convo, settings, session=session)
    cold = collect_reply(target, drafter, convo, settings)
    assert warm.tokens == cold.tokens
    assert warm.summary.reused_tokens > 0 and cold.summary.reused_tokens == 0


@pytest.mark.parametrize("block_size", [1, 16])
def test_drafter_context_covers_exactly_the_target_cache(tiny_hybrid, block_size):
    """After a DFlash reply the drafter's context cache holds one row per target position,
    also when the last cycles drafted nothing (block size 1, or the token limit)."""
    target, drafter = tiny_hybrid
    session = PromptCache()
    ids = _render(target, [{"role": "user", "content": "Count to ten."}])
    _gen(target, ids, drafter, session, mode="dflash", block_size=block_size, max_tokens=13)
    assert session.drafter_len == len(session.ids)
    assert all(c.offset == len(session.ids) for c in session.drafter_cache)


@pytest.mark.parametrize("mode", ["plain", "dflash"])
def test_sliding_window_cache_is_trimmed_only_where_exact(tmp_path, mode):
    """A ``RotatingKVCache`` that has rotated cannot be cut back (its oldest rows are gone):
    prefix reuse then prefills cold instead of trimming offsets over stale rows. Before it has
    rotated, the trim is exact and the prefix is reused."""
    from app.models.loader import load_drafter, load_target
    from app.models.tiny import build_tiny_pair

    t_dir, d_dir = build_tiny_pair(tmp_path, "llama", seed=2, block_size=8)
    target, drafter = load_target(t_dir), load_drafter(d_dir)
    window = 24
    short = _render(target, [{"role": "user", "content": "Hi"}])[: window - 10]
    for turn1, n in ((short, 4), (_render(target, [{"role": "user", "content": "x " * 30}]), 20)):
        session = PromptCache()
        first = _gen(target, turn1, drafter, session, mode=mode, max_tokens=n)
        # turn 2 shares turn 1's prompt but not its reply: the cache must be cut back
        turn2 = turn1 + [turn1[-1]] * 6
        warm = _gen(target, turn2, drafter, session, mode=mode, max_tokens=8)
        cold = _gen(target, turn2, mode="plain", max_tokens=8)
        assert warm.tokens == cold.tokens
        held = turn1 + first.tokens[:-1]
        rotated = len(held) > window
        assert rotated is (n == 20)
        expected = 0 if rotated else common_prefix(held, turn2)
        assert warm.summary.reused_tokens == expected and (rotated or expected > 0)


@pytest.mark.parametrize("pair", ["tiny_hybrid", "tiny_dense"])
@pytest.mark.parametrize("temp", [0.0, 0.7])
def test_plain_then_dflash_reuses_the_plain_turn(request, pair, temp):
    """With the drafter loaded, a plain turn records the drafter's tap states, so the DFlash
    turn after it reuses the whole plain turn (the prefix cache covers it for both models)
    and still gives the tokens of a cold run."""
    target, drafter = request.getfixturevalue(pair)
    session = PromptCache()
    turn1 = _render(target, [{"role": "user", "content": "Name a capital."}])
    first = _gen(target, turn1, drafter, session, mode="plain", temperature=temp, seed=3)
    covered = len(turn1) + len(first.tokens) - 1
    assert session.drafter_len == covered == len(session.ids)
    turn2 = turn1 + first.tokens + _render(target, [{"role": "user", "content": "Another?"}])
    warm = _gen(target, turn2, drafter, session, mode="dflash", temperature=temp, seed=5)
    cold = _gen(target, turn2, drafter, mode="dflash", temperature=temp, seed=5)
    assert warm.summary.reused_tokens == covered
    assert warm.tokens == cold.tokens
    if temp == 0.0:
        assert warm.tokens == _gen(target, turn2).tokens


def test_plain_without_a_session_or_drafter_keeps_no_taps(tiny_hybrid):
    target, drafter = tiny_hybrid
    session = PromptCache()
    turn1 = _render(target, [{"role": "user", "content": "Name a capital."}])
    _gen(target, turn1, None, session, mode="plain")
    assert session.drafter_cache is None and session.drafter_len == 0


def test_switching_drafters_keeps_each_drafters_context(tiny_hybrid):
    """Two drafters of one target (DFlash and DFlash2 in the app; here two loads of the same
    checkpoint, each with its own context): a turn of the second drafter puts the first one's
    context aside (``switch_drafter``), so the first drafter's next turn reuses the prefix
    instead of prefilling the whole conversation cold, and still gives a cold run's tokens."""
    from app.models.loader import load_drafter

    target, a = tiny_hybrid
    b = load_drafter(a.path)
    session = PromptCache()
    turn1 = _render(target, [{"role": "user", "content": "Name a capital."}])
    first = _gen(target, turn1, a, session, mode="dflash", max_tokens=12)
    session.switch_drafter("a", "b", a)  # a Compare's second drafting side on the same prompt
    side_b = _gen(target, turn1, b, session, mode="dflash", max_tokens=12)
    assert side_b.summary.reused_tokens == 0  # b has no context yet: cold, as before
    assert side_b.tokens == first.tokens
    assert set(session.kept_contexts) == {"a"}
    # a's context followed b's turn (update_kept): it covers what the target cache covers
    assert session.kept_contexts["a"].length == len(session.ids)
    turn2 = turn1 + first.tokens + _render(target, [{"role": "user", "content": "Another?"}])
    session.switch_drafter("b", "a", b)
    warm = _gen(target, turn2, a, session, mode="dflash", max_tokens=12)
    assert warm.summary.reused_tokens == len(turn1) + len(first.tokens) - 1
    assert warm.tokens == _gen(target, turn2, mode="plain", max_tokens=12).tokens
    # and the drafter context it reused is the one a cold turn builds over the same tokens
    # (to float32 rounding: the taps came in other chunks, and OpenBLAS's rows round by chunk;
    # a drafter context only shapes the drafts, never the output)
    cold = PromptCache()
    _gen(target, turn2, a, cold, mode="dflash", max_tokens=12)
    for kept_c, cold_c in zip(session.drafter_cache, cold.drafter_cache):
        n = cold_c.offset
        assert kept_c.offset == n
        assert np.allclose(np.array(kept_c.keys[..., :n, :]), np.array(cold_c.keys[..., :n, :]),
                           atol=1e-4)
    assert set(session.kept_contexts) == {"b"}


def test_a_context_brought_back_is_cut_to_the_tokens_it_shares(tiny_hybrid):
    """A drafter's kept context covers the tokens of the turn it last ran; when the other
    drafter's turn went on differently, only the shared prefix is brought back."""
    target, a = tiny_hybrid
    session = PromptCache()
    turn1 = _render(target, [{"role": "user", "content": "Name a capital."}])
    _gen(target, turn1, a, session, mode="dflash", max_tokens=12)
    covered = session.drafter_len
    session.switch_drafter("a", "b", a)
    session.ids = session.ids[:5] + [(t + 1) % 50 for t in session.ids[5:]]  # other tokens
    session.switch_drafter("b", "a", None)
    assert session.drafter_len == 5 < covered
    assert all(c.offset == 5 for c in session.drafter_cache)


def test_a_drafter_kept_from_the_start_follows_plain_turns(tiny_hybrid):
    """A second drafter registered before the first turn (``keep_context``, as the session
    does for the pair's DFlash2 drafter) is built from the plain turns' tap states, so its
    first drafting turn after them reuses what a plain turn reuses, with plain's tokens and a
    cold turn's drafter context."""
    from app.models.loader import load_drafter

    target, a = tiny_hybrid
    b = load_drafter(a.path)
    session = PromptCache()
    session.keep_context("b", b)
    turn1 = _render(target, [{"role": "user", "content": "Name a capital."}])
    first = _gen(target, turn1, a, session, mode="plain")
    assert session.kept_contexts["b"].length == len(session.ids)
    turn2 = turn1 + first.tokens + _render(target, [{"role": "user", "content": "Another?"}])
    second = _gen(target, turn2, a, session, mode="plain")
    turn3 = turn2 + second.tokens + _render(target, [{"role": "user", "content": "More?"}])
    session.switch_drafter("a", "b", a)
    warm = _gen(target, turn3, b, session, mode="dflash")
    assert warm.summary.reused_tokens == len(turn2) + len(second.tokens) - 1
    assert warm.tokens == _gen(target, turn3, mode="plain").tokens
    cold = PromptCache()
    _gen(target, turn3, b, cold, mode="dflash")
    for kept_c, cold_c in zip(session.drafter_cache, cold.drafter_cache):
        n = cold_c.offset
        assert kept_c.offset == n
        assert np.allclose(np.array(kept_c.keys[..., :n, :]), np.array(cold_c.keys[..., :n, :]),
                           atol=1e-4)
    kept_a = session.kept_contexts["a"]
    session.keep_context("a", a)  # a no-op for a drafter whose context is kept already
    assert session.kept_contexts == {"a": kept_a} and kept_a.length == len(session.ids)
