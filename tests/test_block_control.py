"""The automatic block size: the cost model, the controller's choices, and exactness.

The controller (``app.engine.block_control``) only picks how many drafts a cycle verifies;
the runs here check that whatever it picks, greedy DFlash and DFlash2 under ``auto_block``
give plain decoding's tokens and, after every cycle, its caches (as
``tests/test_engine_exact.py`` checks fixed block sizes), on float32 and bfloat16 targets,
hybrid and dense, with runs that switch between plain steps and drafted blocks.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from engine_fixtures import OracleDrafter, collect, prompt_ids, run
from test_engine_exact import (
    CacheSpy,
    _variant,
    cache_state,
    cache_tol,
    max_difference,
    plain_states,
)

from app.engine import block_control, costs
from app.engine.block_control import BlockController
from app.engine.costs import CostModel
from app.engine.generate import GenerationConfig, generate
from app.engine.target import TargetRunner


def flat_costs(plain=10.0, per_token=0.0, draft=0.0, rollback=0.0, ctx_slope=0.0,
               lengths=(1, 2, 8, 16)) -> CostModel:
    """A cost model whose verify is ``plain + per_token * (L - 1)`` ms (plus ``ctx_slope`` ms
    per context position at every L), drafts ``draft`` ms, rollbacks ``rollback`` ms."""
    row = [plain + per_token * (L - 1) for L in lengths]
    far = [v + ctx_slope * 1000 for v in row]
    drafts = [0.0] + [draft] * (len(lengths) - 1)
    return CostModel(list(lengths), [0, 1000], [row, far], [drafts, drafts],
                     [0.0] + [rollback] * (len(lengths) - 1))


# --- the cost model -------------------------------------------------------------------------


def test_cost_model_interpolates_lengths_and_extrapolates_context():
    m = CostModel([1, 2, 8, 16], [64, 1064], [[10, 12, 18, 26], [20, 24, 36, 52]],
                  [[0, 4, 6, 8], [0, 5, 8, 12]], [0, 1, 3, 5])
    assert m.verify(1, 64) == 10 and m.verify(16, 64) == 26
    assert m.verify(5, 64) == pytest.approx(15.0)  # halfway between 2 (12) and 8 (18)
    assert m.verify(1, 564) == pytest.approx(15.0)  # halfway in context
    assert m.verify(1, 2064) == pytest.approx(30.0)  # past the longer context: same slope
    assert m.verify(1, 0) == 10  # never below the shorter context's figure
    assert m.draft(1, 5000) == 0 and m.draft(8, 1064) == 8
    assert m.rollback(1) == 0 and m.rollback(12) == pytest.approx(4.0)
    assert CostModel.from_dict(m.to_dict()) == m


@pytest.mark.parametrize("bad", [
    {"lengths": [2, 4]}, {"contexts": [100, 10]}, {"rollback_ms": [0, 1]},
])
def test_malformed_cost_models_are_refused(bad):
    good = flat_costs().to_dict()
    with pytest.raises(ValueError):
        CostModel.from_dict(good | bad)
    with pytest.raises(ValueError, match="not a cost model"):
        CostModel.from_dict({"lengths": [1]})


# --- the controller's choices ---------------------------------------------------------------


def test_expensive_blocks_and_no_acceptance_give_plain_steps():
    """Verify of 16 at 10x a plain step, drafts always rejected: L = 1."""
    c = BlockController(flat_costs(plain=10, per_token=90 / 15), 16)
    for _ in range(20):
        L = c.choose(100)
        c.update(L, L - 1, 0)
    assert c.choose(100) == 1
    assert c.last.block == 1 and "block 1" in c.last.reason


def test_flat_costs_and_full_acceptance_give_the_whole_block():
    c = BlockController(flat_costs(plain=10), 16)
    for _ in range(30):
        L = c.choose(100)
        c.update(L, L - 1, L - 1)
    assert c.choose(100) == 16
    assert c.expected_tokens(16) == pytest.approx(16.0, abs=0.2)


def test_the_choice_balances_acceptance_against_cost():
    """Acceptance of 3 drafts then a rejection, blocks cost 1 ms per token: a block just past
    the accepted run wins over both a plain step and the whole block."""
    c = BlockController(flat_costs(plain=10, per_token=1.0), 16)
    for _ in range(40):
        L = c.choose(100)
        c.update(L, L - 1, min(3, L - 1))
    assert 2 <= c.choose(100) <= 8


def test_long_contexts_make_blocks_lose_to_plain_steps():
    """Verify cost that grows with L * context: drafting wins at a short context and loses at
    a long one, with the same acceptance."""
    lengths = [1, 2, 8, 16]
    near = [10 + 0.5 * (L - 1) for L in lengths]
    far = [12 + 10.0 * (L - 1) for L in lengths]
    m = CostModel(lengths, [0, 4000], [near, far], [[0, 2, 2, 2]] * 2, [0, 1, 1, 1])
    c = BlockController(m, 16)
    c.rates = [0.6] * 15
    assert c.choose(100) > 1
    assert c.choose(4000) == 1


def test_after_plain_steps_blocks_are_tried_again():
    """Rejections drive it to plain steps; unobserved positions drift back to the prior, so
    it drafts again within a bounded number of plain steps."""
    c = BlockController(flat_costs(plain=10, per_token=4.0, draft=3.0), 16)
    for _ in range(30):
        L = c.choose(100)
        c.update(L, L - 1, 0)
    assert c.choose(100) == 1
    steps = 0
    while c.choose(100) == 1 and steps < 500:
        c.update(1, 0, 0)
        steps += 1
    assert 0 < steps < 500


def test_limit_and_measured_costs():
    c = BlockController(flat_costs(plain=10), 16)
    assert c.choose(100, limit=3) <= 3
    assert c.choose(100, limit=0) == 1
    # one draft accepted, the second rejected: drafting pays at the modelled costs ...
    c = BlockController(flat_costs(plain=10, per_token=1.0), 16)
    for _ in range(30):
        c.update(8, 7, 1)
    assert c.choose(100) > 1
    # ... but not when blocks measure twice their prediction (the correction learns it)
    for _ in range(40):
        c.update(3, 2, 1, seconds=2 * c.predicted_ms(3, 100) / 1e3, ctx=100)
    assert c.block_scale > 1.9
    assert c.choose(100) == 1


def test_near_ties_go_to_the_longer_block():
    """Rates within block_control.TIE of the best: the longest such block; plain steps are
    never traded for a near-tie."""
    c = BlockController(flat_costs(plain=10, per_token=1.0), 16)
    c.rates = [0.99] * 8 + [0.5] * 7  # blocks of 9..16 within a few percent of each other
    exact = max(range(1, 17), key=lambda L: c.expected_tokens(L) / c.cost_ms(L, 0))
    chosen = c.choose(0)
    assert chosen >= exact
    rate = c.expected_tokens(chosen) / c.cost_ms(chosen, 0)
    assert rate >= (1 - block_control.TIE) * c.expected_tokens(exact) / c.cost_ms(exact, 0)
    c.rates = [0.0] * 15
    assert c.choose(0) == 1


def test_censored_positions_are_not_counted_as_rejections():
    """Positions past the rejected one are not observed: not lowered as a rejection would
    lower them; one no cycle has reached yet is capped at the rate of the position before it,
    one reached earlier keeps its rate."""
    c = BlockController(flat_costs(), 8, prior=0.9, alpha=0.5, decay=0.0)
    c.rates = [0.5, 0.5, 0.5, 0.9, 0.2, 0.9, 0.9]
    c.update(8, 7, 2)  # drafts 1, 2 accepted, 3 rejected, 4..7 not seen
    assert c.rates == [0.75, 0.75, 0.25, 0.25, 0.2, 0.2, 0.2]
    c = BlockController(flat_costs(), 8, prior=0.9, alpha=0.5, decay=0.0)
    c.update(8, 7, 7)  # every position reached once
    c.update(8, 7, 0)
    assert c.rates == [0.475] + [0.95] * 6
    c = BlockController(flat_costs(), 4, prior=0.9, alpha=0.5, decay=0.0)
    c.update(4, 3, 3)  # all seen, all accepted
    assert c.rates == [0.95] * 3


def test_an_unfit_drafter_is_dropped_after_few_blocks():
    """Every first draft rejected, a block costing 2.4 plain steps: plain steps within a few
    cycles (the positions never reached do not keep the prior's promise)."""
    c = BlockController(flat_costs(plain=10, per_token=0.6, draft=5.0), 16)
    drafted = 0
    for _ in range(8):
        L = c.choose(100)
        drafted += L > 1
        c.update(L, L - 1, 0)
    assert c.choose(100) == 1 and drafted <= 5


def test_state_carries_over():
    c = BlockController(flat_costs(), 16)
    for _ in range(10):
        c.update(16, 15, 3)
    c.block_scale = 2.0
    d = BlockController(flat_costs(), 8)
    d.restore(c.state())
    assert d.rates == c.rates[:7] and d.block_scale == 2.0
    e = BlockController(flat_costs(), 16, prior=0.5)
    e.restore({"rates": [0.9, 0.1]})
    assert e.rates[:3] == [0.9, 0.1, 0.5]
    e.restore(None)
    assert e.rates[0] == 0.9


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="max_block"):
        BlockController(flat_costs(), 0)
    with pytest.raises(ValueError, match="alpha"):
        BlockController(flat_costs(), 4, alpha=0)


# --- calibration ----------------------------------------------------------------------------


def test_calibration_measures_every_stage(tiny_hybrid):
    target, drafter = tiny_hybrid
    runner = TargetRunner(target.model, target.model_type)
    m = costs.calibrate(runner, drafter, contexts=(8, 64), repeats=1)
    assert m.lengths == [1, 2, 8, 16] and m.contexts == [8, 64]
    assert all(v > 0 for row in m.verify_ms for v in row)
    assert all(v > 0 for row in m.draft_ms for v in row[1:]) and m.draft_ms[0][0] == 0
    assert m.rollback_ms[0] == 0 and all(v > 0 for v in m.rollback_ms[1:])
    assert m.calibration_s > 0 and m.device
    # the cache it filled is gone: a generation after it is plain's
    plain = run(target, prompt_ids(target), mode="plain", max_tokens=12).tokens
    auto = run(target, prompt_ids(target), drafter, mode="dflash", max_tokens=12,
               auto_block=True)
    assert auto.tokens == plain
    assert costs.known_model(drafter, target.model) is not None  # measured once, kept
    kept = costs.remember_state.__module__ and costs._MODELS[id(drafter.model)]
    assert any(k[0] == "state" for k in kept)  # the next reply starts from this one's state


def test_calibration_and_auto_on_a_sliding_window_target(wide, monkeypatch):
    """A target with sliding-window layers (llama, ``RotatingKVCache``, window 24): measuring
    a 1-token step used to trim its ring buffer after an in-place write, which raised
    "sliding-window cache is not in the state a verify pass leaves" before the first token of
    every auto reply. Now it measures; and an auto reply that mixes plain steps and blocks
    while the context grows far past the window gives plain's tokens and, after every cycle,
    plain's visible K/V (to the float32 rounding ``test_sliding_window_llama_target_is_exact``
    allows: attention over a rotated buffer sums in another order)."""
    from mlx_lm.models.cache import RotatingKVCache

    from app.models.loader import load_drafter, load_target
    from app.models.tiny import build_tiny_pair

    t, d = build_tiny_pair(wide / "llama-sliding", "llama", seed=2, block_size=8)
    target, drafter = load_target(t), load_drafter(d)
    runner = TargetRunner(target.model, target.model_type)
    assert any(isinstance(c, RotatingKVCache) for c in runner.make_cache())
    m = costs.calibrate(runner, drafter, contexts=(8, 64), repeats=1)
    assert all(v > 0 for row in m.verify_ms for v in row)
    # (the fixed_costs fixture: choices from the given costs alone)
    ids, plain, states, oracle = _oracle_setup(
        target, 72, 8, [0, 0, 0, None, 5, None, 1, None, None, 0, 3])
    spy = CacheSpy(monkeypatch)
    spec, worst = _auto_run(target, oracle, ids, plain, states, spy)
    assert spec.summary.error is None and spec.tokens == plain
    assert worst <= max(cache_tol(mx.float32), 1e-5), worst
    blocks = spec.summary.block_lengths
    assert 1 in blocks and max(blocks) > 1, blocks


# --- exactness ------------------------------------------------------------------------------

EXACT_VARIANTS = ("qwen3_5-float32", "qwen3_5-bfloat16", "qwen3-bfloat16")


@pytest.fixture(autouse=True)
def fixed_costs(request, monkeypatch):
    """The exactness runs choose from the given costs alone (no online correction from
    measured times), so that their choices do not depend on the machine's speed, and try
    blocks again sooner after plain steps, so that short runs switch both ways."""
    if "wide" in request.fixturenames or "tiny_hybrid" in request.fixturenames:
        monkeypatch.setattr(block_control, "COST_ALPHA", 0.0)
        monkeypatch.setattr(block_control, "DECAY", 0.05)
        monkeypatch.setattr(costs, "known_state", lambda *a: None)  # each run from the prior


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return tmp_path_factory.mktemp("wide_auto")


class DraftContextSpy:
    """Checks, at every draft, that the drafter's context covers every position in the
    target cache (no tap state lost or read twice across plain steps)."""

    def __init__(self, monkeypatch, model, target_spy):
        self.checked = 0
        original = type(model).draft

        def draft(m, runner, pending, length, taps, cache):
            seen = int(cache[0].offset) + (0 if taps is None else int(taps.shape[1]))
            full = next(c for c in target_spy.cache if hasattr(c, "offset")).offset
            assert seen == full, f"drafter context {seen} != target cache {full}"
            self.checked += 1
            return original(m, runner, pending, length, taps, cache)

        monkeypatch.setattr(type(model), "draft", draft)


def _oracle_setup(target, n: int, block: int, schedule: list, rollback: str = "tape"):
    """Prompt ids, plain's first ``n`` tokens, plain's cache after each position, and an
    oracle drafter of ``block`` that corrupts the slots ``schedule`` names (every acceptance
    length occurs), with costs under which both plain steps and blocks win at times."""
    ids = prompt_ids(target)
    reference = run(target, ids, mode="plain", max_tokens=n + 20).tokens
    plain = reference[:n]
    oracle = OracleDrafter(reference, len(ids), target.vocab_size, block, [1, 3],
                           schedule=schedule)
    costs.remember(oracle, target.model, flat_costs(plain=10, per_token=4.0, draft=3.0,
                                                    rollback=1.0), rollback)
    return ids, plain, plain_states(target, ids, plain), oracle


def _cache_length(cache) -> int:
    return next(c for c in cache if hasattr(c, "offset")).offset


def _auto_run(target, drafter, ids, plain, states, spy, mode="dflash", **kw):
    """Greedy auto run; after every cycle the target cache is compared with plain's for the
    same positions: the committed tokens but the pending one, or, when the next plain step is
    already queued on it (``ahead``), the pending one too. Returns (run, worst difference,
    cycles that had the next step queued)."""
    worst, queued = [0.0], [0]

    def on_cycle(r, gen):
        pos = len(ids) + len(r.tokens) - 1
        held = _cache_length(spy.cache)
        assert held in (pos, pos + 1), (held, pos)
        queued[0] += held == pos + 1
        if held in states:
            worst[0] = max(worst[0], max_difference(cache_state(spy.cache), states[held]))

    cfg = GenerationConfig(mode=mode, max_tokens=len(plain), auto_block=True, **kw)
    spec = collect(generate(target, ids, cfg, drafter), on_cycle)
    spec.queued = queued[0]
    return spec, worst[0]


@pytest.mark.parametrize("rollback", ["tape", "replay"])
@pytest.mark.parametrize("name", EXACT_VARIANTS)
def test_auto_oracle_tokens_and_caches_equal_plain(wide, name, rollback, monkeypatch):
    """An oracle drafter that corrupts a different slot each cycle (every acceptance length
    occurs) and costs under which both plain steps and blocks win at times."""
    if rollback == "replay" and not name.startswith("qwen3_5"):
        pytest.skip("a dense target only trims")
    target, _, dtype = _variant(wide, name)
    ids, plain, states, oracle = _oracle_setup(
        target, 96, 16, [0, 0, 0, None, 5, None, 1, 12, None, None, 0, 3], rollback)
    spy = CacheSpy(monkeypatch)
    spec, worst = _auto_run(target, oracle, ids, plain, states, spy, rollback=rollback)
    assert spec.tokens == plain
    assert worst <= cache_tol(dtype), f"{name}: cache differs from plain's by {worst:.3g}"
    blocks = spec.summary.block_lengths
    assert spec.summary.auto_block and blocks == [c.block for c in spec.cycles]
    assert 1 in blocks and max(blocks) > 1, (blocks, [c.accepted for c in spec.cycles])
    assert len(set(blocks)) >= 3, blocks
    assert {c.accepted for c in spec.cycles if c.block > 1} >= {0, 1}, (blocks, [c.accepted for c in spec.cycles])


@pytest.mark.parametrize("name", EXACT_VARIANTS)
def test_auto_real_drafter_is_exact_and_keeps_its_context(wide, name, monkeypatch):
    """The variant's random drafter (its drafts mostly rejected): many plain steps with
    blocks tried again now and then; tokens and caches equal plain's, and the drafter's
    context covers the target cache whenever it drafts."""
    target, drafter, dtype = _variant(wide, name)
    ids = prompt_ids(target)
    n = 64
    plain = run(target, ids, mode="plain", max_tokens=n).tokens
    states = plain_states(target, ids, plain)
    costs.remember(drafter, target.model, flat_costs(plain=10, per_token=1.0, draft=2.0))
    spy = CacheSpy(monkeypatch)
    ctx = DraftContextSpy(monkeypatch, drafter.model, spy)
    spec, worst = _auto_run(target, drafter, ids, plain, states, spy)
    assert spec.tokens == plain
    assert worst <= cache_tol(dtype)
    blocks = spec.summary.block_lengths
    assert blocks.count(1) >= len(blocks) // 3 and max(blocks) > 1, blocks
    assert ctx.checked >= 2  # it drafted again after plain steps
    assert spec.queued >= len(blocks) // 4  # runs of plain steps queued one step ahead


def test_auto_dflash2_is_exact(tiny_hybrid, tmp_path, monkeypatch):
    """DFlash2 (the ``propose`` path) under the automatic block size."""
    from test_dflash2 import _mask_id, dflash2_config, write_checkpoint

    from app.models.loader import load_drafter

    target, _ = tiny_hybrid
    folder = write_checkpoint(tmp_path / "d2", dflash2_config(target.path, _mask_id(target)),
                              seed=1)
    drafter = load_drafter(folder)
    ids = prompt_ids(target)
    n = 48
    plain = run(target, ids, mode="plain", max_tokens=n).tokens
    states = plain_states(target, ids, plain)
    costs.remember(drafter, target.model, flat_costs(plain=10, per_token=0.5, draft=1.0))
    spy = CacheSpy(monkeypatch)
    spec, worst = _auto_run(target, drafter, ids, plain, states, spy, mode="dflash2")
    assert spec.tokens == plain and spec.summary.mode == "dflash2"
    assert worst <= cache_tol(mx.float32)
    assert 1 in spec.summary.block_lengths and max(spec.summary.block_lengths) > 1


@pytest.mark.parametrize("max_tokens", [1, 2, 9])
def test_auto_stops_cleanly_with_a_step_queued(tiny_hybrid, max_tokens, monkeypatch):
    """A run of plain steps queued ahead that ends (token limit, end token) leaves the kept
    caches consistent: the next turn reuses them and still matches plain."""
    from app.engine.prefix import PromptCache

    target, drafter = tiny_hybrid
    costs.remember(drafter, target.model, flat_costs(plain=1, per_token=50.0, draft=50.0))
    ids = prompt_ids(target)
    plain = run(target, ids, mode="plain", max_tokens=max_tokens + 12).tokens
    session = PromptCache()
    first = collect(generate(target, ids, GenerationConfig(
        mode="dflash", max_tokens=max_tokens, auto_block=True), drafter, session=session))
    assert first.tokens == plain[:max_tokens]
    assert set(first.summary.block_lengths) <= {1}
    follow = ids + first.tokens
    second = collect(generate(target, follow, GenerationConfig(
        mode="dflash", max_tokens=12, auto_block=True), drafter, session=session))
    assert second.summary.reused_tokens > len(ids) - 1
    assert second.tokens == run(target, follow, mode="plain", max_tokens=12).tokens


def test_fixed_blocks_record_their_length(tiny_hybrid):
    target, drafter = tiny_hybrid
    spec = run(target, prompt_ids(target), drafter, mode="dflash", max_tokens=20, block_size=4)
    assert not spec.summary.auto_block
    assert set(spec.summary.block_lengths) <= {4, 3, 2, 1} and spec.cycles[0].block == 4
    assert all(c.reason == "" for c in spec.cycles)  # fixed blocks: nothing was chosen


def test_auto_cycles_say_why_their_block_was_chosen(tiny_hybrid):
    """With auto each CycleEvent carries the controller's reason for its block (what the
    window's live panel shows): a plain step says so, a drafted block names its length."""
    target, drafter = tiny_hybrid
    costs.remember(drafter, target.model, flat_costs(plain=10.0, per_token=0.1))
    spec = run(target, prompt_ids(target), drafter, mode="dflash", max_tokens=20,
               auto_block=True)
    assert spec.summary.auto_block and spec.cycles
    for c in spec.cycles:
        assert c.reason.startswith(f"block {c.block}"), (c.block, c.reason)
        assert ("(a plain step)" in c.reason) == (c.block == 1)
        assert c.reason.startswith(f"block {c.block}:") or c.block == 1
    costs.remember(drafter, target.model, flat_costs(plain=1.0, per_token=50.0, draft=50.0))
    steps = run(target, prompt_ids(target), drafter, mode="dflash", max_tokens=8,
                auto_block=True)
    assert {c.block for c in steps.cycles} == {1}
    assert all(c.reason.startswith("block 1 (a plain step)") for c in steps.cycles)


# --- the command line -----------------------------------------------------------------------


def test_block_size_arguments():
    import argparse

    from app.commands.bench import _block_sizes
    from app.commands.generation import block_settings, block_size_arg

    assert block_size_arg("auto") == "auto" and block_size_arg("AUTO") == "auto"
    assert block_size_arg("8") == 8
    for bad in ("0", "autox", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            block_size_arg(bad)
    assert block_settings("auto") == (None, True) and block_settings(8) == (8, False)
    assert block_settings(None) == (None, False)
    assert _block_sizes("16,auto,4") == [4, 16, "auto"] and _block_sizes("auto") == ["auto"]
    with pytest.raises(argparse.ArgumentTypeError):
        _block_sizes("4,x")


def test_chat_json_with_block_size_auto(capsys, tiny_root, tmp_path, monkeypatch):
    """``chat --block-size auto --json``: plain's tokens, ``auto_block`` true, the largest
    block as ``block_size``, the blocks used in the summary."""
    import json

    from app.cli import main
    from app.models.tiny import build_tiny_pair

    monkeypatch.setattr(costs, "_store", [None])  # the command sets it: undone after
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path))
    t, d = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    objs = {}
    for extra in (["--mode", "plain"], ["--mode", "dflash", "--block-size", "auto"]):
        code = main(["chat", "--model", str(t), "--draft-model", str(d), *extra,
                     "--prompt", "Name a capital.", "--max-tokens", "20", "--tools", "none",
                     "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        objs[extra[1]] = json.loads(out)
    auto = objs["dflash"]
    assert auto["tokens"] == objs["plain"]["tokens"]
    assert auto["auto_block"] is True and auto["block_size"] == 16
    assert objs["plain"]["auto_block"] is False
    s = auto["summary"]
    assert s["auto_block"] and len(s["block_lengths"]) == s["cycles"] > 0


def test_cost_models_are_stored_per_pair_and_read_back(tiny_root, tmp_path, monkeypatch,
                                                       capsys):
    """With a store set, a measured model is written to the data folder and a later load of
    the same pair reads it instead of measuring; ``models --json`` lists it."""
    import json

    from app.cli import main
    from app.models.loader import load_drafter, load_target
    from app.models.tiny import build_tiny_pair

    monkeypatch.setattr(costs, "_store", [None])
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path))
    t, d = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    target, drafter = load_target(t), load_drafter(d)
    runner = TargetRunner(target.model, target.model_type)
    costs.set_store(tmp_path)
    first = costs.model_for(runner, target.model, drafter, "tape", target.path)
    assert (tmp_path / costs.STORE_NAME).is_file()

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(costs, "calibrate", no_measuring)
    again = load_drafter(d)  # a new load: nothing in memory
    assert costs.model_for(runner, target.model, again, "tape", target.path) == first
    (listed,) = costs.stored_models(tmp_path)
    assert listed["rollback"] == "tape" and listed["verify_ms"] == first.verify_ms
    assert main(["models", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost_models"] == [listed]
    (tmp_path / costs.STORE_NAME).write_text("not json")
    assert costs.stored_models(tmp_path) == []
