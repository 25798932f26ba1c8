"""The rollback unit alone (``app.engine.rollback.VerifyCheckpoint``): after a verify pass of L
tokens, keeping n of them leaves the cache a plain run over those n tokens builds, with either
strategy; undoing the pass leaves the cache as it was. The tiny targets are float32 on the CPU,
where a 1-row and an L-row product may round differently (``tests/test_engine_exact.py``), so
caches are compared within that suite's float32 tolerance."""

from __future__ import annotations

import mlx.core as mx
import pytest
from test_engine_exact import cache_state, max_difference

from app.engine.errors import GenerationError
from app.engine.rollback import VerifyCheckpoint
from app.engine.target import TargetRunner

PROMPT = [3, 17, 42, 7, 99, 5, 61, 8]
BLOCK = [11, 23, 5, 77, 2, 9]
TOL = 1e-4


def _runner_and_cache(target, tokens):
    runner = TargetRunner(target.model, target.model_type)
    cache = runner.make_cache()
    runner.forward(mx.array([tokens], dtype=mx.int32), cache, all_logits=False)
    mx.eval([a for c in cache for a in (c.state if hasattr(c, "state") else [])])
    return runner, cache


def _plain(target, tokens):
    """The cache after feeding ``tokens`` one at a time, as plain decoding does."""
    runner, cache = _runner_and_cache(target, PROMPT)
    for t in tokens:
        runner.forward(mx.array([[t]], dtype=mx.int32), cache, all_logits=False)
    return cache_state(cache)


@pytest.mark.parametrize("strategy", ["tape", "replay"])
@pytest.mark.parametrize("pair", ["tiny_hybrid", "tiny_dense"])
@pytest.mark.parametrize("n", [1, 3, len(BLOCK)])
def test_keeping_n_positions_gives_the_plain_cache(request, pair, strategy, n):
    target, _ = request.getfixturevalue(pair)
    runner, cache = _runner_and_cache(target, PROMPT)
    checkpoint = VerifyCheckpoint(runner, cache, strategy, mx.eval)
    ids = mx.array([BLOCK], dtype=mx.int32)
    runner.forward(ids, cache, tapes=checkpoint.begin(ids))
    replayed = checkpoint.commit(n)
    assert replayed == (runner.hybrid and n < len(BLOCK))
    assert max_difference(cache_state(cache), _plain(target, BLOCK[:n])) <= TOL
    with pytest.raises(GenerationError, match="cannot keep"):
        checkpoint.commit(n)  # one commit per pass


@pytest.mark.parametrize("pair", ["tiny_hybrid", "tiny_dense"])
def test_restore_undoes_the_pass(request, pair):
    target, _ = request.getfixturevalue(pair)
    runner, cache = _runner_and_cache(target, PROMPT)
    before = cache_state(cache)
    checkpoint = VerifyCheckpoint(runner, cache)
    ids = mx.array([BLOCK], dtype=mx.int32)
    runner.forward(ids, cache, tapes=checkpoint.begin(ids))
    assert max_difference(cache_state(cache), before) == float("inf")  # it grew
    checkpoint.restore()
    assert max_difference(cache_state(cache), before) == 0.0


def test_bad_input_is_a_typed_error(tiny_hybrid):
    target, _ = tiny_hybrid
    runner, cache = _runner_and_cache(target, PROMPT)
    with pytest.raises(GenerationError, match="unknown rollback strategy 'undo'"):
        VerifyCheckpoint(runner, cache, "undo")
    checkpoint = VerifyCheckpoint(runner, cache)
    with pytest.raises(GenerationError, match="no verify pass"):
        checkpoint.restore()
    ids = mx.array([BLOCK], dtype=mx.int32)
    runner.forward(ids, cache, tapes=checkpoint.begin(ids))
    with pytest.raises(GenerationError, match="cannot keep 0 of a 6"):
        checkpoint.commit(0)
