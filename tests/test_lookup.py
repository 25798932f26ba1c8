"""Lookup mode: the n-gram matcher, the draft length rule, and exactness.

Exactness as ``tests/test_engine_exact.py`` checks DFlash: greedy lookup gives plain decoding's
token ids and, after every cycle, each layer's cache equals the one plain decoding builds for
the same positions (zero tolerance but float32 under OpenBLAS, ``cache_tol``). Targets: the
random ``qwen3_5`` (hybrid) and ``qwen3`` (dense) of that module in float32, bfloat16 and 4-bit
with bf16 scales, plus the bundled demo target (a trained ``qwen3_5``, which restates tool
results, so lookup drafts are accepted on a hybrid target too).
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from engine_fixtures import collect, prompt_ids
from test_engine_exact import (
    CacheSpy,
    _variant,
    cache_state,
    cache_tol,
    expect_float32_difference_on_cuda,
    max_difference,
    plain_states,
)

from app.engine.errors import GenerationError
from app.engine.generate import GenerationConfig, generate
from app.engine.lookup import DEFAULT_BLOCK, DraftLength, NgramIndex, lookup_drafts

# ------------------------------------------------------------------ the matcher


def test_longest_suffix_wins_over_a_more_recent_shorter_one():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 8, 3, 7, 5, 1, 2, 3]
    # suffix (1, 2, 3) occurs at 0..2 (followed by 9, 8); (3,) alone is more recent at 5
    assert NgramIndex(tokens).match(2) == ([9, 8], 3)


def test_most_recent_occurrence_wins():
    tokens = [4, 5, 10, 4, 5, 11, 12, 4, 5]
    assert NgramIndex(tokens).match(3) == ([11, 12, 4], 2)
    assert lookup_drafts(tokens, 1) == [11]


def test_block_cap_and_end_of_sequence():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert NgramIndex(tokens).match(3) == ([3, 4, 5], 2)
    # past the end of the sequence the continuation repeats itself (period 6 here)
    assert NgramIndex(tokens).match(9) == ([3, 4, 5, 6, 1, 2, 3, 4, 5], 2)
    assert NgramIndex(tokens).match(0) == ([], 0)


def test_no_match():
    assert NgramIndex([1, 2, 3, 4]).match(5) == ([], 0)
    assert NgramIndex([]).match(5) == ([], 0)
    assert NgramIndex([7]).match(5) == ([], 0)  # the suffix itself is no earlier occurrence
    assert NgramIndex([1, 2, 3, 2], min_n=2).match(5) == ([], 0)  # only (2,) would match


def test_extend_indexes_new_tokens():
    index = NgramIndex([1, 2, 3])
    assert index.match(4) == ([], 0)
    index.extend([1, 2])
    assert index.match(4) == ([3, 1, 2, 3], 2)
    index.extend([9])
    assert index.match(4) == ([], 0)
    index.extend([3])  # (3,) was followed by 1 at index 3
    assert index.match(2) == ([1, 2], 1)
    assert len(index) == 7


def test_a_loop_proposes_its_period():
    assert NgramIndex([5, 5, 5, 5]).match(4) == ([5, 5, 5, 5], 3)
    assert NgramIndex([9, 7, 8, 7, 8]).match(5) == ([7, 8, 7, 8, 7], 2)


def test_bad_ngram_lengths():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramIndex([], max_n=1, min_n=2)
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramIndex([], min_n=0)


def test_draft_length_adapts():
    d = DraftLength(15)
    assert d.value == 4
    d.update(4, 4)
    assert d.value == 8
    d.update(8, 8)
    d.update(15, 15)
    assert d.value == 15  # capped at the limit
    d.update(15, 2)
    assert d.value == 3  # accepted + 1 after a miss
    d.update(3, 0)
    assert d.value == 1
    d.update(0, 0)  # a plain step changes nothing
    assert d.value == 1
    d.update(1, 1)
    assert d.value == 2
    assert DraftLength(0).value == 0
    with pytest.raises(ValueError):
        DraftLength(-1)


# ------------------------------------------------------------------ the engine


def test_lookup_needs_no_drafter_and_counts_cycles(tiny_dense):
    target, _ = tiny_dense
    ids = prompt_ids(target, [{"role": "user", "content": "one two three one two three"}])
    run = collect(generate(target, ids, GenerationConfig(mode="lookup", max_tokens=30)))
    plain = collect(generate(target, ids, GenerationConfig(max_tokens=30)))
    s = run.summary
    assert run.tokens == plain.tokens
    assert s.mode == "lookup" and s.generated_tokens == 30 and s.stop_cause == "length"
    assert s.cycles == len(run.cycles) and s.drafted == sum(c.drafted for c in run.cycles)
    assert s.accepted == sum(run.from_draft)
    assert s.tau == pytest.approx(29 / s.cycles)
    assert all(c.drafted <= DEFAULT_BLOCK - 1 for c in run.cycles)
    # each cycle's block length is what it verified: the pending token and the drafts (1:
    # a plain step), as for DFlash, not 0 ("unknown")
    assert s.block_lengths == [c.drafted + 1 for c in run.cycles]
    assert 1 in s.block_lengths and max(s.block_lengths) > 1


def test_lookup_block_size_caps_drafts(tiny_dense):
    target, _ = tiny_dense
    ids = prompt_ids(target, [{"role": "user", "content": "a b a b a b a b a b a b a b"}])
    run = collect(generate(target, ids, GenerationConfig(mode="lookup", max_tokens=40,
                                                         block_size=3)))
    assert run.cycles and all(c.drafted <= 2 for c in run.cycles)
    with pytest.raises(GenerationError, match="unknown rollback"):
        generate(target, ids, GenerationConfig(mode="lookup", rollback="undo"))


def test_lookup_sampled_is_reproducible(tiny_dense):
    """Sampled lookup (each position sampled on the host, drafts kept while they equal the
    sample) runs to the end and is reproducible with a seed."""
    target, _ = tiny_dense
    ids = prompt_ids(target, [{"role": "user", "content": "x y z x y z x y z"}])
    cfg = dict(mode="lookup", max_tokens=30, temperature=0.8, seed=3)
    a = collect(generate(target, ids, GenerationConfig(**cfg)))
    b = collect(generate(target, ids, GenerationConfig(**cfg)))
    assert a.tokens == b.tokens and len(a.tokens) == a.summary.generated_tokens


# ------------------------------------------------------------------ exactness

REPEATING = [{"role": "user", "content": "Repeat after me: red green blue, red green blue, "
              "red green blue, red green blue, red green blue, red green blue."}]
VARIANT_NAMES = ["qwen3_5-float32", "qwen3_5-bfloat16", "qwen3_5-4bit-bf16",
                 "qwen3-float32", "qwen3-bfloat16", "qwen3-4bit-bf16"]
N = 40


@pytest.fixture(scope="module")
def lookup_root(tmp_path_factory):
    return tmp_path_factory.mktemp("lookup_pairs")


def lookup_with_cache_checks(target, ids, n, monkeypatch, **kw):
    """Plain's tokens and per-position caches, then greedy lookup with its cache compared
    after every cycle. Returns (plain tokens, lookup run, worst cache difference)."""
    plain = collect(generate(target, ids, GenerationConfig(max_tokens=n))).tokens
    states = plain_states(target, ids, plain)
    spy = CacheSpy(monkeypatch)
    worst = [0.0]
    checked = [0]

    def on_cycle(run, gen):
        pos = len(ids) + len(run.tokens) - 1  # the last committed token is pending
        if pos in states:
            worst[0] = max(worst[0], max_difference(cache_state(spy.cache), states[pos]))
            checked[0] += 1

    run = collect(generate(target, ids, GenerationConfig(mode="lookup", max_tokens=n, **kw)),
                  on_cycle)
    assert checked[0] == len(run.cycles) > 0
    return plain, run, worst[0]


# every variant with the default rollback (tape); replay, the same code in every dtype, on
# the float32 hybrid only (a dense target only trims: both strategies are the same code)
CASES = [(name, "tape") for name in VARIANT_NAMES] + [("qwen3_5-float32", "replay")]


def slow_4bit(*values):
    """``pytest.param(*values)``, marked slow (left out of ``make test-fast``) for a 4-bit
    variant: ~40 s each on a 2-core CPU."""
    return pytest.param(*values, marks=[pytest.mark.slow] if "4bit" in values[0] else [])


@pytest.mark.parametrize(("name", "rollback"), [slow_4bit(*c) for c in CASES])
def test_lookup_equals_plain_tokens_and_caches(name, rollback, lookup_root, monkeypatch,
                                               request):
    target, _, dtype = _variant(lookup_root, name)
    if rollback == "tape":  # a replay recomputes the kept positions one by one, as plain
        expect_float32_difference_on_cuda(request, dtype, DEFAULT_BLOCK)
    for messages in (REPEATING, None):  # repeats; the suite's question, which rarely matches
        ids = prompt_ids(target, messages) if messages else prompt_ids(target)
        plain, run, worst = lookup_with_cache_checks(target, ids, N, monkeypatch,
                                                     rollback=rollback)
        assert run.tokens == plain
        assert worst <= cache_tol(dtype), f"{name}: cache differs by {worst:.3g}"
        s = run.summary
        assert s.drafted > 0 and s.cycles < N
        if messages and name.startswith("qwen3-"):
            assert s.accepted > 0  # the random dense target repeats itself: drafts accepted
        if name.startswith("qwen3_5"):
            assert s.replays > 0  # rejected drafts: the recurrent state was rolled back


DEMO_VARIANTS = {"float32": None, "bfloat16": {"dtype": "bfloat16"},
                 "4bit-bf16": {"quantize": True, "q_bits": 4, "q_group_size": 64,
                               "dtype": "bfloat16"}}


def tool_result_prompt(target) -> list[int]:
    """A rendered prompt whose reply restates a ``country_info`` tool result (the tool
    definitions left out, to keep the prompt short: 135 tokens)."""
    from app.chat.templates import render_prompt
    from app.chat.tools.countries import country_info

    msgs = [{"role": "user", "content": "Describe Brazil briefly."},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "country_info", "arguments": {"name": "Brazil"}}}]},
            {"role": "tool", "content": json.dumps(country_info("Brazil"))}]
    return render_prompt(target.tokenizer, msgs).ids


@pytest.mark.parametrize("variant", [  # make test-fast runs float32
    pytest.param(v, marks=() if v == "float32" else pytest.mark.slow) for v in DEMO_VARIANTS])
def test_demo_target_lookup_is_exact_and_accepts(variant, lookup_root, monkeypatch):
    from mlx_lm.convert import convert

    from app.models.loader import load_target
    from app.paths import demo_pair_dirs

    t_dir = demo_pair_dirs()[0]
    options = DEMO_VARIANTS[variant]
    if options is not None:
        out = lookup_root / f"demo-{variant}"
        if not out.exists():
            convert(str(t_dir), str(out), **options)
        t_dir = out
    # the original is stored in float16; the CPU loader computes it in float32
    target = load_target(t_dir) if options is None else load_target(t_dir, keep_dtype=True)
    dtype = mx.float32 if options is None else mx.bfloat16
    ids = tool_result_prompt(target)
    plain, run, worst = lookup_with_cache_checks(target, ids, 56, monkeypatch)
    assert run.tokens == plain
    assert worst <= cache_tol(dtype), f"demo {variant}: cache differs by {worst:.3g}"
    assert run.summary.accepted > 0 and run.summary.replays > 0


# ------------------------------------------------------------------ DFlash + lookup (opt-in)


@pytest.mark.parametrize("name", [slow_4bit(n) for n in
                                  ("qwen3-float32", "qwen3-4bit-bf16", "qwen3_5-bfloat16")])
def test_dflash_with_lookup_drafts_is_exact(name, lookup_root, monkeypatch, request):
    """``lookup_drafts``: long lookup matches replace the (random) drafter's block; tokens
    and caches still equal plain's after every cycle, and the drafter's skipped context is
    caught up (a later drafter block still verifies against the right state)."""
    target, drafter, dtype = _variant(lookup_root, name)
    expect_float32_difference_on_cuda(request, dtype, drafter.config.block_size)
    ids = prompt_ids(target, REPEATING)
    plain = collect(generate(target, ids, GenerationConfig(max_tokens=N))).tokens
    states = plain_states(target, ids, plain)
    spy = CacheSpy(monkeypatch)
    worst = [0.0]

    def on_cycle(run, gen):
        pos = len(ids) + len(run.tokens) - 1
        worst[0] = max(worst[0], max_difference(cache_state(spy.cache), states[pos]))

    cfg = GenerationConfig(mode="dflash", max_tokens=N, block_size=4, lookup_drafts=True)
    run = collect(generate(target, ids, cfg, drafter), on_cycle)
    assert run.tokens == plain
    assert worst[0] <= cache_tol(dtype), f"{name}: cache differs by {worst[0]:.3g}"
    s = run.summary
    if name.startswith("qwen3-"):  # the random dense target loops: long matches occur
        assert 0 < s.lookup_cycles < s.cycles
    off = collect(generate(target, ids, GenerationConfig(mode="dflash", max_tokens=N,
                                                         block_size=4), drafter))
    assert off.tokens == plain and off.summary.lookup_cycles == 0  # off by default


# ------------------------------------------------------------------ the CLI


def test_cli_chat_and_compare_run_lookup_without_a_drafter(capsys, tiny_root):
    from app.cli import main
    from app.models.tiny import build_tiny_pair

    t, _ = build_tiny_pair(tiny_root, "qwen3", seed=0, block_size=16)
    common = ["--model", str(t), "--prompt", "one two one two one two", "--max-tokens", "24",
              "--tools", "none", "--json"]
    assert main(["chat", "--mode", "lookup", *common]) == 0  # no --draft-model needed
    obj = json.loads(capsys.readouterr().out)
    assert obj["mode"] == "lookup" and obj["block_size"] == DEFAULT_BLOCK
    assert obj["summary"]["mode"] == "lookup" and obj["summary"]["cycles"] > 0
    assert main(["chat", "--mode", "plain", *common]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == obj["tokens"]
    _, d = build_tiny_pair(tiny_root, "qwen3", seed=0, block_size=16)
    assert main(["compare", *common, "--draft-model", str(d), "--lookup"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["lookup_identical"] is True and both["lookup_first_divergence"] is None
    assert both["lookup"]["tokens"] == both["plain"]["tokens"] == obj["tokens"]
    assert both["lookup"]["mode"] == "lookup" and "time_to_answer" in both["lookup_speedup"]
