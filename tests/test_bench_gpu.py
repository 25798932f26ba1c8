"""tools/bench_gpu.py: the host-sync counter counts what waits for the device, and the forward
costs are measured on real passes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import mlx.core as mx
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_gpu", Path(__file__).resolve().parent.parent / "tools" / "bench_gpu.py")
bench_gpu = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench_gpu)


def test_host_sync_counter_counts_eval_item_tolist_not_async_eval():
    a = mx.ones((3,))
    eval_ = mx.eval
    with bench_gpu.count_host_syncs() as counter:
        mx.eval(a)
        a.tolist()
        a.sum().item()
        mx.async_eval(a)
    assert counter["syncs"] == 3
    assert mx.eval is eval_  # restored
    a.tolist()
    assert counter["syncs"] == 3


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_forward_costs_and_pair_figures_on_the_tiny_pair(tiny_hybrid):
    target, drafter = tiny_hybrid
    costs = bench_gpu.forward_costs(target.model, target.model_type, [1, 3], prefix=16,
                                    repeats=2)
    assert costs["step_ms"] > 0 and costs["verify16_ms"] > 0
    assert costs["verify16_over_step"] == costs["verify16_ms"] / costs["step_ms"]
    assert costs["verify16_fast_ms"] > 0  # a hybrid target has the opt-in fast verify
    figs = bench_gpu.pair_figures(target, drafter, max_tokens=24)
    assert figs["identical"] is True and figs["cycles"] > 0
    assert figs["host_syncs_per_cycle"] >= 1  # the prefill's and clean-up's syncs included
    assert figs["host_syncs_in_cycles"] == 1  # one host read per greedy cycle
    assert figs["draft_ms_per_cycle"] > 0 and figs["cycle_ms"] > 0


def test_cast_floats_casts_floating_parameters_and_keeps_integer_ones():
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    nn.quantize(model, group_size=64, bits=4,  # uint32 weights, float scales
                class_predicate=lambda path, _m: path == "layers.1")
    bench_gpu.cast_floats(model, "bfloat16")
    dtypes = {k: v.dtype for k, v in tree_flatten(model.parameters())}
    assert dtypes["layers.0.weight"] == mx.bfloat16
    assert dtypes["layers.1.scales"] == mx.bfloat16
    assert dtypes["layers.1.weight"] == mx.uint32
    bench_gpu.cast_floats(model, "float32")
    assert tree_flatten(model.parameters())[0][1].dtype == mx.float32


def test_bench_launch_measures_real_passes_and_puts_the_cache_back(tiny_hybrid):
    """tools/bench_launch.py's figures come from real passes, and a pass's ``restore`` leaves
    the cache as it was: the next step's logits are those of a step on the untouched cache."""
    spec = importlib.util.spec_from_file_location(
        "bench_launch", Path(__file__).resolve().parent.parent / "tools" / "bench_launch.py")
    bench_launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_launch)  # it puts tools/ on sys.path for bench_gpu
    target, _ = tiny_hybrid
    out = bench_launch.measure(target.model, [1, 3], prefix=16, repeats=3)
    for key in ("step_ms", "verify16_ms", "build_step_ms", "build_verify16_ms",
                "pipelined_step_ms", "product_build_us", "mlx_product_build_us"):
        assert out[key] > 0, key
    assert out["build_step_ms"] < out["step_ms"]  # building is part of the waited pass
    assert out["verify16_over_step"] == out["verify16_ms"] / out["step_ms"]
    assert out["verify16_over_pipelined_step"] == out["verify16_ms"] / out["pipelined_step_ms"]
    build, restore = bench_launch.passes(target.model, [1, 3], prefix=16)
    first = build(1)[0]
    mx.eval(first)
    restore(1)
    mx.eval(build(16))
    restore(16)
    again = build(1)[0]
    assert mx.array_equal(first, again).item()
