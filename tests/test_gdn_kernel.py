"""The CUDA Gated DeltaNet kernel (``app/engine/kernels/gdn_kernel.py``) and how it is routed.

On this CPU the kernel itself cannot run: these tests check that nothing changes off CUDA, that
when the kernel is active plain decoding and DFlash's verify passes both go through it (a
stand-in with different arithmetic shows the routing), and the shape checks. The tests marked
``cuda`` run the real kernel on MLX's CUDA backend (skipped elsewhere): against mlx-lm's
operations loop to float32 rounding, and a T-token call bit for bit against T one-token calls.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from engine_fixtures import prompt_ids, run
from mlx_lm.models import gated_delta as mlx_gd

from app.engine.kernels import gdn_kernel


def _inputs(T=5, B=1, Hk=2, Hv=4, Dk=32, Dv=16, dtype=mx.float32, seed=0):
    mx.random.seed(seed)
    q = mx.random.normal((B, T, Hk, Dk)).astype(dtype)
    k = mx.random.normal((B, T, Hk, Dk)).astype(dtype)
    q, k = mlx_gd.normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6)
    v = mx.random.normal((B, T, Hv, Dv)).astype(dtype)
    a = mx.random.normal((B, T, Hv)).astype(dtype)
    b = mx.random.normal((B, T, Hv)).astype(dtype)
    A_log = mx.random.normal((Hv,)).astype(dtype)
    dt_bias = mx.random.normal((Hv,)).astype(dtype)
    state = mx.random.normal((B, Hv, Dv, Dk)).astype(mx.float32)
    return q, k, v, a, b, A_log, dt_bias, state


def _stepwise(q, k, v, g, beta, state):
    """A stand-in kernel: mlx-lm's one-token ops step, token by token, with 1e-3 added to y
    (other arithmetic than mlx-lm's loop, as the real kernel has; T-invariant like it)."""
    ys = []
    for t in range(q.shape[1]):
        out, state = mlx_gd.gated_delta_ops(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1],
                                            g[:, t:t + 1], beta[:, t:t + 1], state)
        ys.append(out + 1e-3)
    return mx.concatenate(ys, axis=1), state


def test_off_cuda_the_update_is_mlx_lms_own(monkeypatch):
    monkeypatch.setattr(gdn_kernel, "_on_cuda", lambda: False)  # as on the CPU and Metal
    assert not gdn_kernel.kernel_active()
    args = _inputs()
    y, s = gdn_kernel.gated_delta_update(*args)
    y0, s0 = mlx_gd.gated_delta_update(*args)
    assert np.array_equal(np.array(y), np.array(y0))
    assert np.array_equal(np.array(s), np.array(s0))


def test_the_switch_turns_the_kernel_off(monkeypatch):
    monkeypatch.setattr(gdn_kernel, "_on_cuda", lambda: True)
    assert gdn_kernel.kernel_active()
    monkeypatch.setenv("DFLASH_GDN_KERNEL", "0")
    assert not gdn_kernel.kernel_active()


def test_shapes_the_kernel_does_not_take_are_refused():
    q, k, v, a, b, A_log, dt_bias, state = _inputs(Dk=32)
    g = mx.ones(a.shape)
    with pytest.raises(ValueError, match="unsupported shapes"):
        gdn_kernel.cuda_gated_delta(q, k, v, g, b, state[:, :, :, :16])
    q2, k2, *_ = _inputs(Dk=48)
    with pytest.raises(ValueError, match="unsupported shapes"):
        gdn_kernel.cuda_gated_delta(q2, k2, v, g, b, mx.zeros((1, 4, 16, 48)))


def test_the_kernel_source_reads_the_token_count_from_q_shape():
    # mx.fast.cuda_kernel passes q_shape only when the body names it; T must not be a template
    # constant (a build per verify length) nor a host read
    assert "q_shape[1]" in gdn_kernel.CUDA_SOURCE
    assert "__shfl_xor_sync" in gdn_kernel.CUDA_SOURCE


@pytest.fixture(scope="module")
def demo_pair():
    from app.models.loader import load_drafter, load_target
    from app.paths import demo_pair_dirs

    t, d = demo_pair_dirs()
    return load_target(t), load_drafter(d)


def test_with_the_kernel_active_plain_and_verify_share_it(monkeypatch, demo_pair):
    target, drafter = demo_pair
    ids = prompt_ids(target, [{"role": "user", "content": "What is the capital of Chile?"}])
    before = run(target, ids, mode="plain", max_tokens=24).tokens
    calls = {"n": 0}

    def counted(*a):
        calls["n"] += 1
        return _stepwise(*a)

    monkeypatch.setattr(gdn_kernel, "_on_cuda", lambda: True)
    monkeypatch.setattr(gdn_kernel, "cuda_gated_delta", counted)
    plain = run(target, ids, mode="plain", max_tokens=24)
    assert calls["n"] > 0, "plain decoding did not go through the kernel"
    calls["n"] = 0
    spec = run(target, ids, drafter, mode="dflash", max_tokens=24)
    assert calls["n"] > 0
    # the stand-in's arithmetic changes the reply, and both paths follow it
    assert plain.tokens != before
    assert plain.tokens == spec.tokens


cuda = pytest.mark.skipif(not gdn_kernel._on_cuda(), reason="needs MLX's CUDA backend")


@cuda
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
@pytest.mark.parametrize("Dk,Dv,Hk,Hv", [(32, 32, 6, 12), (128, 128, 16, 32)])
def test_cuda_kernel_matches_mlx_lms_loop(dtype, Dk, Dv, Hk, Hv):
    args = _inputs(T=16, Hk=Hk, Hv=Hv, Dk=Dk, Dv=Dv, dtype=dtype)
    y, s = gdn_kernel.gated_delta_update(*args)
    y0, s0 = mlx_gd.gated_delta_update(*args)
    tol = 1e-4 if dtype == mx.float32 else 2e-2
    assert np.allclose(np.array(s), np.array(s0), atol=1e-4, rtol=1e-4)
    assert np.allclose(np.array(y.astype(mx.float32)), np.array(y0.astype(mx.float32)),
                       atol=tol, rtol=tol)


@cuda
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_cuda_kernel_is_the_same_in_one_call_or_token_by_token(dtype):
    q, k, v, a, b, A_log, dt_bias, state = _inputs(T=16, Hk=16, Hv=32, Dk=128, Dv=128,
                                                   dtype=dtype)
    y, s = gdn_kernel.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state)
    ys, st = [], state
    for t in range(16):
        sl = slice(t, t + 1)
        out, st = gdn_kernel.gated_delta_update(q[:, sl], k[:, sl], v[:, sl], a[:, sl],
                                                b[:, sl], A_log, dt_bias, st)
        ys.append(out)
    assert np.array_equal(np.array(s), np.array(st))
    assert np.array_equal(np.array(y.astype(mx.float32)),
                          np.array(mx.concatenate(ys, 1).astype(mx.float32)))


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_compiled_layers_compute_what_the_layer_walk_computes(tiny_hybrid, monkeypatch, dtype):
    """``DFLASH_COMPILE_LAYERS=1`` (CUDA only; forced on here): the ``mx.compile`` programs
    give, bit for bit, the layer walk's logits, tap states, GDN tapes, caches and, after a
    tape rollback and a step, the same again; steps and verify passes both take them."""
    from mlx.utils import tree_map

    from app.engine import target as target_mod
    from app.engine.target import TargetRunner, cache_arrays, trim_attention

    base, _ = tiny_hybrid
    model = base.model
    if dtype != mx.float32:
        import copy

        model = copy.deepcopy(model)
        model.update(tree_map(lambda a: a.astype(dtype), model.parameters()))
    runner = TargetRunner(model, base.model_type)
    assert runner.hybrid
    ids = mx.array([[1 + i % 50 for i in range(40)]], dtype=mx.int32)
    made = []
    real_programs = target_mod._layer_programs
    monkeypatch.setattr(target_mod, "_layer_programs",
                        lambda layer: made.append(layer) or real_programs(layer))

    def run(on: bool) -> list:
        monkeypatch.setattr(target_mod, "compiled_layers_on", lambda: on)
        cache = runner.make_cache()
        out = list(runner.forward(ids, cache, taps=[1, 3], all_logits=False))
        tapes = []
        out += runner.forward(mx.array([[3, 4, 5, 6]], dtype=mx.int32), cache, taps=[1, 3],
                              tapes=tapes)
        out += [x for t in tapes for x in (t.conv_input, t.q, t.k, t.v, t.a, t.b)]
        for t in tapes:
            t.rollback(2)
        trim_attention(cache, runner.linear, 2)
        out.append(runner.forward(mx.array([[9]], dtype=mx.int32), cache)[0])
        out += cache_arrays(cache)
        mx.eval(out)
        return out

    walked = run(False)
    assert not made
    compiled = run(True)
    assert len(made) >= 3 * runner.num_layers  # prefill, verify and step
    assert len(walked) == len(compiled)
    for a, b in zip(walked, compiled):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert mx.array_equal(a, b).item()
    if model is not base.model:  # an unloaded model's programs go with it
        import gc

        keys = [id(layer) for layer in model.layers]
        assert all(any(k == o for o, _ in target_mod._PROGRAMS) for k in keys)
        del model, runner, made[:], walked, compiled
        gc.collect()
        assert not any(o in keys for o, _ in target_mod._PROGRAMS)
