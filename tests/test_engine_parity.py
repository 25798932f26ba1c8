"""Greedy DFlash == greedy plain, token for token, on hybrid and dense targets.

Float32 on the CPU. The oracle drafter makes every acceptance length occur (0..L-1 and full
acceptance); the real drafter module (random weights, z-lab layout) mostly gets rejected, which
exercises rollback on nearly every cycle.
"""

from __future__ import annotations

import pytest
from engine_fixtures import (
    OracleDrafter,
    assert_same_or_near_tie,
    block_sizes,
    prompt_ids,
    run,
)

N_TOKENS = 64


@pytest.fixture(scope="module", params=["tiny_hybrid", "tiny_dense"])
def pair(request):
    target, drafter = request.getfixturevalue(request.param)
    ids = prompt_ids(target)
    plain = run(target, ids, mode="plain", max_tokens=N_TOKENS)
    assert len(plain.tokens) == N_TOKENS  # random weights never pick the end token this soon
    return target, drafter, ids, plain


@pytest.mark.parametrize("rollback", ["tape", "replay"])
@pytest.mark.parametrize("block_size", block_sizes((1, 2, 4, 16), (16,)))
def test_oracle_drafter_parity_every_acceptance_length(pair, block_size, rollback):
    target, drafter, ids, plain = pair
    # the schedule below commits 1 + 2 + ... + B tokens per round: long enough to see them all
    n = max(N_TOKENS, block_size * (block_size + 1) // 2 + block_size + 8)
    if n != N_TOKENS:
        plain = run(target, ids, mode="plain", max_tokens=n)
    reference = run(target, ids, mode="plain", max_tokens=n + 16).tokens
    oracle = OracleDrafter(
        reference, len(ids), target.vocab_size, 16, drafter.config.target_layer_ids
    )
    spec = run(
        target, ids, oracle, mode="dflash", max_tokens=n, block_size=block_size,
        rollback=rollback,
    )
    assert_same_or_near_tie(target, ids, plain.tokens, spec.tokens)
    assert spec.indices == list(range(len(spec.tokens)))  # first token emitted once, no gaps
    s = spec.summary
    assert s.stop_cause == "length" and s.generated_tokens == n
    if block_size > 1:
        seen = {c.accepted for c in spec.cycles if c.drafted == block_size - 1}
        assert seen == set(range(block_size)), f"acceptance lengths seen: {sorted(seen)}"
        partial = sum(1 for c in spec.cycles if c.accepted < c.drafted)
        hybrid = target.model_type == "qwen3_5"
        assert s.replays == (partial if hybrid else 0)
        assert s.accepted == sum(c.accepted for c in spec.cycles)
        assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
        assert s.tau == pytest.approx((n - 1) / s.cycles)
        # drafted tokens that were accepted are flagged, the target's own choices are not
        assert sum(spec.from_draft) == s.accepted
    else:
        assert s.acceptance_rate is None and s.replays == 0


@pytest.mark.parametrize("rollback", ["tape", "replay"])
@pytest.mark.parametrize("block_size", block_sizes((2, 4, 16), (16,)))
def test_real_drafter_module_parity(pair, block_size, rollback):
    target, drafter, ids, plain = pair
    spec = run(
        target, ids, drafter, mode="dflash", max_tokens=N_TOKENS, block_size=block_size,
        rollback=rollback,
    )
    assert_same_or_near_tie(target, ids, plain.tokens, spec.tokens)
    assert spec.summary.cycles == len(spec.cycles) > 0


def test_hybrid_tape_reports_replays_and_costs_less_than_replay(tiny_hybrid):
    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    tape = run(target, ids, drafter, mode="dflash", max_tokens=32, block_size=8)
    replay = run(target, ids, drafter, mode="dflash", max_tokens=32, block_size=8,
                 rollback="replay")
    assert tape.tokens == replay.tokens
    assert tape.summary.replays > 0 and tape.summary.replays == replay.summary.replays
    assert [c.replayed for c in tape.cycles] == [c.accepted < c.drafted for c in tape.cycles]


@pytest.mark.parametrize("fast", [False, True])
def test_parity_with_and_without_the_fast_verify(tiny_hybrid, fast):
    """The step-loop verify (the default) and the opt-in chunked ``fast_verify`` both keep
    greedy DFlash equal to plain on this float32 target (the fast one only up to a near-tie:
    tests/test_engine_exact.py shows where it diverges)."""
    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    plain = run(target, ids, mode="plain", max_tokens=48).tokens
    reference = run(target, ids, mode="plain", max_tokens=64).tokens
    oracle = OracleDrafter(reference, len(ids), target.vocab_size, 8, [1, 3])
    for d in (oracle, drafter):
        spec = run(target, ids, d, mode="dflash", max_tokens=48, block_size=8,
                   fast_verify=fast)
        assert_same_or_near_tie(target, ids, plain, spec.tokens)
        assert spec.summary.fast_verify is fast
