"""Cycle invariants: rollback leaves the exact cache of plain decoding; end tokens, mask-valued
tokens, the first token and cancellation behave as the notes require."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from engine_fixtures import OracleDrafter, collect, prompt_ids, run
from mlx_lm.models.cache import make_prompt_cache

from app.engine.events import CycleEvent
from app.engine.generate import GenerationConfig, generate
from app.engine.target import TargetRunner, trim_attention


def _cache_arrays(cache, offset):
    """Comparable numpy arrays of a cache list: GDN conv/recurrent state, KV up to offset."""
    out = []
    for c in cache:
        if hasattr(c, "cache"):  # ArraysCache: [conv_state, recurrent_state]
            out += [np.array(a) for a in c.cache]
        else:
            assert c.offset == offset
            out += [np.array(c.keys[..., :offset, :]), np.array(c.values[..., :offset, :])]
    return out


@pytest.mark.parametrize("strategy", ["tape", "replay"])
@pytest.mark.parametrize("n_keep", [1, 3, 5])
def test_rollback_equals_plain_decoding_of_the_same_tokens(tiny_hybrid, strategy, n_keep):
    target, _ = tiny_hybrid
    runner = TargetRunner(target.model, target.model_type)
    ids = prompt_ids(target)
    block = [17, 33, 101, 250, 5, 64, 77, 300]  # pending token + 7 "drafts"

    cache = runner.make_cache()
    runner.forward(mx.array([ids]), cache)
    tapes = []
    runner.forward(mx.array([block]), cache, tapes=tapes)
    assert len(tapes) == sum(runner.linear) > 0
    if strategy == "tape":
        for t in tapes:
            t.rollback(n_keep)
        trim_attention(cache, runner.linear, len(block) - n_keep)
    else:
        for t in tapes:
            t.restore()
        trim_attention(cache, runner.linear, len(block))
        runner.forward(mx.array([block[:n_keep]]), cache)

    # plain decoding: the prompt, then the kept tokens one at a time, through mlx-lm's forward
    ref = make_prompt_cache(target.model)
    target.model(mx.array([ids]), cache=ref)
    for tok in block[:n_keep]:
        target.model(mx.array([[tok]]), cache=ref)
    offset = len(ids) + n_keep
    got, want = _cache_arrays(cache, offset), _cache_arrays(ref, offset)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4)  # BLAS rounding only
    # and the next token's logits agree
    a = runner.forward(mx.array([[9]]), cache)[0]
    b = target.model(mx.array([[9]]), cache=ref)
    np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)


def test_without_rollback_the_state_keeps_rejected_drafts(tiny_hybrid):
    """The failure the seed describes: trimming attention alone leaves the GDN state wrong."""
    target, _ = tiny_hybrid
    runner = TargetRunner(target.model, target.model_type)
    ids = prompt_ids(target)
    block = [17, 33, 101, 250]
    cache = runner.make_cache()
    runner.forward(mx.array([ids]), cache)
    runner.forward(mx.array([block]), cache)
    trim_attention(cache, runner.linear, 3)  # keep 1, but the recurrent state saw all 4
    ref = make_prompt_cache(target.model)
    target.model(mx.array([ids]), cache=ref)
    target.model(mx.array([block[:1]]), cache=ref)
    gdn = [i for i, lin in enumerate(runner.linear) if lin][0]
    diff = np.abs(np.array(cache[gdn].cache[1]) - np.array(ref[gdn].cache[1])).max()
    assert diff > 1e-3


def _oracle(target, ids, n, block=8, schedule=None):
    reference = run(target, ids, mode="plain", max_tokens=n + block).tokens
    return reference, OracleDrafter(reference, len(ids), target.vocab_size, block, [1, 3],
                                    schedule)


def test_end_token_inside_a_block_ends_generation_there(tiny_hybrid):
    target, _ = tiny_hybrid
    ids = prompt_ids(target)
    reference, oracle = _oracle(target, ids, 40, schedule=[None])  # full acceptance
    j = 13  # a position inside the second block of 8
    end_id = reference[j]
    assert end_id not in reference[:j]
    saved = target.eos_token_ids
    target.eos_token_ids = {end_id}
    try:
        plain = run(target, ids, mode="plain", max_tokens=40)
        spec = run(target, ids, oracle, mode="dflash", max_tokens=40)
    finally:
        target.eos_token_ids = saved
    assert plain.tokens == reference[: j + 1]
    assert spec.tokens == plain.tokens  # nothing after the end token is emitted or counted
    assert spec.summary.stop_cause == "end_token"
    assert spec.summary.generated_tokens == j + 1
    assert spec.cycles[-1].committed < spec.cycles[-1].accepted + 1


def test_tokens_equal_to_the_mask_id_are_kept(tiny_hybrid):
    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    plain = run(target, ids, mode="plain", max_tokens=48)
    mask_like = plain.tokens[7]
    saved = drafter.config.mask_token_id
    drafter.config.mask_token_id = mask_like  # the block input uses it; outputs must not drop it
    try:
        spec = run(target, ids, drafter, mode="dflash", max_tokens=48)
    finally:
        drafter.config.mask_token_id = saved
    assert spec.tokens == plain.tokens
    assert spec.tokens.count(mask_like) == plain.tokens.count(mask_like) >= 1


def test_first_token_emitted_once(tiny_hybrid):
    target, _ = tiny_hybrid
    ids = prompt_ids(target)
    reference, oracle = _oracle(target, ids, 20, schedule=[None])
    spec = run(target, ids, oracle, mode="dflash", max_tokens=20)
    assert spec.tokens == reference[:20]
    assert spec.indices == list(range(20))
    assert spec.from_draft[0] is False  # the prefill's token is the target's own
    first_cycle_tokens = spec.cycles[0].committed
    assert spec.tokens[1 : 1 + first_cycle_tokens] == reference[1 : 1 + first_cycle_tokens]


def test_cancel_stops_before_the_next_cycle(tiny_hybrid):
    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    gen = generate(target, ids, GenerationConfig(mode="dflash", max_tokens=200), drafter)
    cycles_at_cancel = []

    def on_cycle(r, g):
        if len(r.cycles) == 3:
            g.cancel()
            cycles_at_cancel.append(len(r.cycles))

    result = collect(gen, on_cycle)
    assert cycles_at_cancel == [3]
    assert len(result.cycles) == 3 and result.summary.cycles == 3
    assert result.summary.stop_cause == "cancelled"


def test_cancel_stops_plain_before_the_next_token(tiny_hybrid):
    target, _ = tiny_hybrid
    ids = prompt_ids(target)
    gen = generate(target, ids, GenerationConfig(mode="plain", max_tokens=200))
    tokens = []
    for ev in gen:
        if hasattr(ev, "token_id"):
            tokens.append(ev.token_id)
            if len(tokens) == 5:
                gen.cancel()
    assert len(tokens) == 5
    assert gen.summary.stop_cause == "cancelled"


def test_summary_figures_are_consistent(tiny_hybrid):
    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    events = list(generate(target, ids, GenerationConfig(mode="dflash", max_tokens=24), drafter))
    cycles = [e for e in events if isinstance(e, CycleEvent)]
    s = events[-1].summary
    assert s.prompt_tokens == len(ids)
    assert s.cycles == len(cycles)
    assert s.drafted == sum(c.drafted for c in cycles)
    assert s.draft_s == pytest.approx(sum(c.draft_s for c in cycles))
    busy = s.draft_s + s.verify_s + s.rollback_s
    assert s.rollback_share == pytest.approx(s.rollback_s / busy)
    assert s.ttft_s > 0 and s.tok_per_s > 0 and s.peak_memory_bytes > 0
    assert s.accepted_lengths == [c.accepted for c in cycles]


@pytest.mark.parametrize("setting,match", [
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": 0.7, "top_p": 0.0}, "top_p"),
    ({"temperature": 0.7, "top_p": 1.5}, "top_p"),
    ({"temperature": 0.7, "min_p": 2.0}, "min_p"),
    ({"temperature": 0.7, "top_k": 100_000}, "top_k"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"temperature": 0.5, "seed": -1}, "seed"),
])
def test_invalid_sampling_settings_are_refused_up_front(tiny_hybrid, setting, match):
    from app.engine.errors import GenerationError

    target, drafter = tiny_hybrid
    for mode in ("plain", "dflash"):
        with pytest.raises(GenerationError, match=match):
            generate(target, [1, 2, 3], GenerationConfig(mode=mode, **setting), drafter)


def test_accepted_end_token_leaves_no_later_draft_in_the_cache(tiny_hybrid, monkeypatch):
    """When the end token is an accepted draft, the stored cache keeps the positions before it
    (the end token itself pending, as after a plain sampled run), not the drafts the target
    verified after it."""
    from app.engine.prefix import PromptCache

    target, _ = tiny_hybrid
    ids = prompt_ids(target)
    reference = run(target, ids, mode="plain", max_tokens=40).tokens
    cut = next(i for i in range(3, 15) if reference[i] not in reference[:i])
    monkeypatch.setattr(target, "eos_token_ids", {reference[cut]})  # an end token mid-block
    oracle = OracleDrafter(reference, len(ids), target.vocab_size, 16, [1, 3], schedule=[None])
    session = PromptCache()
    spec = collect(generate(target, ids, GenerationConfig(mode="dflash", max_tokens=40,
                                                          block_size=16), oracle,
                            session=session))
    assert spec.tokens == reference[: cut + 1] and spec.summary.stop_cause == "end_token"
    assert spec.from_draft[-1]  # the end token was an accepted draft
    # the cycle counts as far as the end token: the drafts after it are not figures
    assert spec.cycles[0].accepted == spec.cycles[0].drafted == cut
    assert spec.summary.accepted == sum(spec.from_draft)
    assert session.ids == ids + reference[:cut]
    runner = TargetRunner(target.model, target.model_type)
    for c, lin in zip(session.target_cache, runner.linear):
        if not lin:
            assert c.offset == len(ids) + cut
    # and the recurrent state is plain's after the same positions
    plain_cache = make_prompt_cache(target.model)
    target.model(mx.array([ids + reference[:cut]]), cache=plain_cache)
    for a, b in zip(session.target_cache, plain_cache):
        if hasattr(a, "cache"):
            np.testing.assert_allclose(np.array(a.cache[1]), np.array(b.cache[1]), atol=1e-5)


@pytest.mark.parametrize("mode", ["plain", "dflash", "lookup"])
def test_cancel_stops_a_long_prefill_between_chunks(tiny_hybrid, monkeypatch, mode):
    """A cancel asked while a long prompt is prefilled stops it after the chunk in hand: the
    server freed its worker only once a 4,000-token prefill had run to its end (~10 s on the
    demo pair), and a shutdown's cancel could not reach such a request at all. The kept
    caches are dropped (they hold part of the prompt), and the next run on the same session
    gives a fresh run's tokens."""
    import app.engine.generate as gen_mod
    from app.engine.prefix import PromptCache

    target, drafter = tiny_hybrid
    ids = (prompt_ids(target) * 12)[:160]
    fresh = run(target, ids, mode=mode, max_tokens=12, drafter=drafter).tokens
    session = PromptCache()
    chunks = []
    real = gen_mod._prefill

    def counting(forward, *args, **kwargs):
        def counted(chunk, last):
            chunks.append(chunk.shape[1])
            if len(chunks) == 2:
                gen.cancel()  # asked while the second of five chunks runs
            return forward(chunk, last)
        return real(counted, *args, **kwargs)

    config = GenerationConfig(mode=mode, max_tokens=12, prefill_step=32)
    gen = generate(target, ids, config, drafter, session=session)
    with monkeypatch.context() as patch:
        patch.setattr(gen_mod, "_prefill", counting)
        events = list(gen)
    assert not [e for e in events if hasattr(e, "token_id")]
    assert gen.summary.stop_cause == "cancelled" and gen.summary.error is None
    assert chunks == [32, 32]
    assert session.ids == [] and session.target_cache is None
    again = collect(generate(target, ids, GenerationConfig(mode=mode, max_tokens=12), drafter,
                             session=session))
    assert again.tokens == fresh


@pytest.mark.parametrize("mode", ["plain", "dflash"])
def test_a_reply_stopped_during_its_prefill_stops_after_the_chunk_in_hand(
        tiny_hybrid, monkeypatch, mode):
    """Stop (the window's button, Ctrl+C, a server client leaving) sets the reply's cancel
    event; during a long prompt's prefill the engine yields nothing, so a reply that only
    passed the event on at its next event ran the whole prefill first (a 3,161-token prompt
    kept the server's worker 7 s after its client left). The engine now watches the event
    itself and stops after the chunk in hand."""
    import threading

    import app.engine.generate as gen_mod
    from app.chat.reply import run_reply
    from app.chat.settings import ReplySettings

    target, drafter = tiny_hybrid
    stop = threading.Event()
    chunks = []
    real = gen_mod._prefill

    def counting(forward, *args, **kwargs):
        def counted(chunk, last):
            chunks.append(chunk.shape[1])
            if len(chunks) == 1:
                stop.set()  # the user presses Stop while the first chunk runs
            return forward(chunk, last)
        return real(counted, *args, **kwargs)

    monkeypatch.setattr(gen_mod, "_prefill", counting)
    text = "Tell me about the capital cities of every country you know. " * 60
    settings = ReplySettings(mode=mode, max_tokens=8, tools=[], run_tools=False)
    events = list(run_reply(target, drafter, [{"role": "user", "content": text}], settings,
                            cancel_event=stop))
    assert len(chunks) == 1, chunks  # the prompt is several chunks of 512
    done = [e for e in events if hasattr(e, "reply")][-1].reply
    assert done.finish_reason == "cancelled" and done.tokens == []
