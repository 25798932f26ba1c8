"""The chunked Gated DeltaNet pass against mlx-lm's step loop (``gated_delta_ops``)."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.gated_delta import gated_delta_ops, gated_delta_update

from app.engine import gdn_chunked
from app.engine.gdn_chunked import chunked_gated_delta as _chunked
from app.engine.gdn_chunked import chunked_gated_delta_update

TOL = 1e-5  # absolute, per unit of the reference's largest magnitude (float32 rounding)


def make_inputs(
    seed: int,
    b: int,
    t: int,
    hk: int,
    hv: int,
    dk: int,
    dv: int,
    *,
    g_range=(0.5, 1.0),
    vector: bool = False,
    with_state: bool = True,
):
    """Random inputs shaped and scaled as a Gated DeltaNet layer feeds them (unit-norm k)."""
    mx.random.seed(seed)
    q = mx.random.normal((b, t, hk, dk))
    k = mx.random.normal((b, t, hk, dk))
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * dk**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((b, t, hv, dv))
    g_shape = (b, t, hv, dk) if vector else (b, t, hv)
    g = mx.random.uniform(g_range[0], g_range[1], g_shape)
    beta = mx.random.uniform(0.0, 1.0, (b, t, hv))
    state = mx.random.normal((b, hv, dv, dk)) if with_state else None
    return q, k, v, g, beta, state


def assert_close(actual: mx.array, expected: mx.array, what: str) -> None:
    """Max abs difference within TOL times the larger of 1 and the reference's magnitude."""
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    a = np.array(actual.astype(mx.float32))
    e = np.array(expected.astype(mx.float32))
    scale = max(1.0, float(np.abs(e).max(initial=0.0)))
    err = float(np.abs(a - e).max(initial=0.0))
    assert err <= TOL * scale, f"{what}: max |diff| {err:.3e} > {TOL * scale:.3e}"


def reference(q, k, v, g, beta, state, mask):
    """mlx-lm's loop, with outputs at masked steps set to 0 (what its Metal kernel returns)."""
    y, s = gated_delta_ops(q, k, v, g, beta, state, mask)
    if mask is not None:
        y = mx.where(mask[..., None, None], y, 0.0)
    return y, s


def chunked_gated_delta(*args, compiled=False, **kwargs):
    """Eager by default: each mx.compile'd shape costs a C++ JIT build on CPU (slow in CI)."""
    return _chunked(*args, compiled=compiled, **kwargs)


def _restore_compile() -> None:
    if os.environ.get("MLX_DISABLE_COMPILE"):
        mx.disable_compile()
    else:
        mx.enable_compile()


@pytest.fixture
def jit():
    """Request this fixture to run a test with mx.compile enabled."""
    mx.enable_compile()
    try:
        yield
    finally:
        _restore_compile()


@pytest.fixture(autouse=True)
def no_jit(request):
    """Run mlx eagerly (mlx-lm's step loop is mx.compile'd too) unless a test asks for JIT.

    On CPU every fused kernel of a compiled graph is built with the system C++ compiler on
    first use (cached under $TMPDIR/mlx), which costs seconds per kernel on a cold CI machine.
    """
    if "jit" in request.fixturenames:
        yield
        return
    mx.disable_compile()
    try:
        yield
    finally:
        _restore_compile()


CASES = [
    # b, t, hk, hv, dk, dv
    (1, 1, 1, 1, 8, 8),
    (1, 5, 1, 2, 16, 8),
    (2, 16, 2, 4, 32, 16),
    (1, 17, 2, 2, 64, 64),
    (2, 40, 1, 3, 8, 32),
    (1, 33, 2, 4, 16, 64),
]


@pytest.mark.parametrize("chunk", [1, 4, 16, 64])
@pytest.mark.parametrize("case", CASES)
def test_matches_step_loop(case, chunk):
    b, t, hk, hv, dk, dv = case
    for with_state in (True, False):
        args = make_inputs(chunk + t, b, t, hk, hv, dk, dv, with_state=with_state)
        y_ref, s_ref = reference(*args, None)
        y, s = chunked_gated_delta(*args, chunk_size=chunk)
        assert y.dtype == mx.float32 and s.dtype == mx.float32
        assert_close(y, y_ref, f"y {case} chunk {chunk} state {with_state}")
        assert_close(s, s_ref, f"state {case} chunk {chunk} state {with_state}")


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_mask_keeps_state_and_zeroes_output(chunk):
    b, t, hk, hv, dk, dv = 2, 23, 2, 4, 16, 8
    q, k, v, g, beta, state = make_inputs(7, b, t, hk, hv, dk, dv)
    mask = np.ones((b, t), dtype=bool)
    mask[0, :5] = False  # left padding
    mask[0, [9, 10, 17]] = False
    mask[1, 20:] = False  # right padding
    mask = mx.array(mask)
    y_ref, s_ref = reference(q, k, v, g, beta, state, mask)
    y, s = chunked_gated_delta(q, k, v, g, beta, state, mask, chunk_size=chunk)
    assert_close(y, y_ref, "masked y")
    assert_close(s, s_ref, "masked state")
    assert np.all(np.array(y)[0, :5] == 0.0)
    assert np.all(np.array(y)[1, 20:] == 0.0)


def test_fully_masked_leaves_state_untouched():
    q, k, v, g, beta, state = make_inputs(3, 1, 12, 1, 2, 8, 8)
    mask = mx.zeros((1, 12), dtype=mx.bool_)
    y, s = chunked_gated_delta(q, k, v, g, beta, state, mask, chunk_size=4)
    np.testing.assert_array_equal(np.array(s), np.array(state))
    np.testing.assert_array_equal(np.array(y), np.zeros((1, 12, 2, 8), dtype=np.float32))


@pytest.mark.parametrize(
    "g_range",
    [(1e-6, 1e-3), (1e-30, 1e-20), (0.0, 0.0), (0.999, 1.0), (1.0, 1.0)],
    ids=["near-0", "tiny", "zero", "near-1", "exactly-1"],
)
@pytest.mark.parametrize("chunk", [4, 16, 64])
def test_extreme_decays(g_range, chunk):
    args = make_inputs(11, 2, 40, 2, 4, 16, 16, g_range=g_range)
    y_ref, s_ref = reference(*args, None)
    y, s = chunked_gated_delta(*args, chunk_size=chunk)
    assert_close(y, y_ref, f"y decay {g_range}")
    assert_close(s, s_ref, f"state decay {g_range}")
    assert np.all(np.isfinite(np.array(y))) and np.all(np.isfinite(np.array(s)))


@pytest.mark.parametrize("block_inverse", [False, True], ids=["lapack", "blocked"])
def test_alike_keys_no_decay_full_beta(block_inverse, monkeypatch):
    """Keys nearly equal, beta 1, g 1: (I + A) has all-ones below the diagonal.

    A power series for its inverse would sum terms as large as binomial(63, 31); an exact
    triangular inverse stays accurate.
    """
    if block_inverse:
        monkeypatch.setattr(
            gdn_chunked, "_unit_lower_inverse", gdn_chunked._block_unit_lower_inverse
        )
    b, t, hk, hv, dk, dv = 1, 64, 1, 2, 16, 16
    q, k, v, _, _, state = make_inputs(5, b, t, hk, hv, dk, dv)
    base = mx.random.normal((1, 1, 1, dk))
    k = base + 1e-3 * k
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    g = mx.ones((b, t, hv))
    beta = mx.ones((b, t, hv))
    y_ref, s_ref = reference(q, k, v, g, beta, state, None)
    y, s = chunked_gated_delta(q, k, v, g, beta, state, chunk_size=64, compiled=False)
    assert_close(y, y_ref, "y alike keys")
    assert_close(s, s_ref, "state alike keys")


@pytest.mark.parametrize("chunk", [1, 4, 16])
def test_vector_gating(chunk):
    args = make_inputs(13, 2, 19, 1, 2, 16, 8, vector=True, g_range=(0.3, 1.0))
    mask = mx.array(np.arange(19)[None, :] % 5 != 2).astype(mx.bool_)
    mask = mx.broadcast_to(mask, (2, 19))
    for m in (None, mask):
        y_ref, s_ref = reference(*args, m)
        y, s = chunked_gated_delta(*args, m, chunk_size=chunk)
        assert_close(y, y_ref, "vector-gated y")
        assert_close(s, s_ref, "vector-gated state")


def test_vector_gating_in_groups(monkeypatch):
    """Chunks processed a few at a time (memory bound) give the same result."""
    monkeypatch.setattr(gdn_chunked, "_VECTOR_GROUP_ELEMENTS", 1)
    args = make_inputs(17, 1, 21, 2, 2, 8, 8, vector=True)
    y_ref, s_ref = reference(*args, None)
    y, s = chunked_gated_delta(*args, chunk_size=4, compiled=False)
    assert_close(y, y_ref, "grouped y")
    assert_close(s, s_ref, "grouped state")


def test_blocked_inverse_path(monkeypatch):
    """The matmul-only inverse used off the CPU device gives the same outputs."""
    monkeypatch.setattr(gdn_chunked, "_unit_lower_inverse", gdn_chunked._block_unit_lower_inverse)
    for chunk in (3, 16):
        args = make_inputs(19, 2, 37, 2, 4, 32, 16)
        y_ref, s_ref = reference(*args, None)
        y, s = chunked_gated_delta(*args, chunk_size=chunk)
        assert_close(y, y_ref, "blocked-inverse y")
        assert_close(s, s_ref, "blocked-inverse state")


@pytest.mark.parametrize("c", [1, 2, 5, 16, 33])
def test_block_unit_lower_inverse_against_numpy(c):
    rng = np.random.default_rng(c)
    a = np.tril(rng.uniform(-1, 1, (3, c, c)).astype(np.float32), -1)
    expected = np.linalg.inv(np.eye(c, dtype=np.float64) + a)
    got = np.array(gdn_chunked._block_unit_lower_inverse(mx.array(a)))
    np.testing.assert_allclose(got, expected, atol=1e-4 * max(1.0, np.abs(expected).max()))


def test_split_passes_compose():
    """Two passes carrying the state equal one pass over the whole sequence."""
    q, k, v, g, beta, state = make_inputs(23, 1, 30, 2, 4, 16, 16)
    y_all, s_all = chunked_gated_delta(q, k, v, g, beta, state, chunk_size=8)
    cut = 13
    first = [x[:, :cut] for x in (q, k, v, g, beta)]
    second = [x[:, cut:] for x in (q, k, v, g, beta)]
    y1, s1 = chunked_gated_delta(*first, state, chunk_size=8)
    y2, s2 = chunked_gated_delta(*second, s1, chunk_size=8)
    assert_close(mx.concatenate([y1, y2], axis=1), y_all, "split y")
    assert_close(s2, s_all, "split state")


def test_bfloat16_inputs():
    q, k, v, g, beta, state = make_inputs(29, 1, 16, 1, 2, 16, 16)
    q, k, v = (x.astype(mx.bfloat16) for x in (q, k, v))
    y_ref, s_ref = reference(q, k, v, g, beta, state, None)
    y, s = chunked_gated_delta(q, k, v, g, beta, state)
    assert y.dtype == mx.bfloat16 and s.dtype == mx.float32
    assert_close(s, s_ref, "bf16 state")
    scale = float(mx.abs(y_ref.astype(mx.float32)).max().item())
    err = float(mx.abs(y.astype(mx.float32) - y_ref.astype(mx.float32)).max().item())
    assert err <= 2**-7 * max(1.0, scale)  # one bfloat16 rounding step


@pytest.mark.slow  # cold CI: ~10 s of C++ JIT builds for the fused kernels
def test_compiled_matches_step_loop(jit):
    """The mx.compile'd graph against the loop, with a mask and padding (JIT only ours)."""
    args = make_inputs(31, 2, 20, 2, 4, 16, 8)
    mask = mx.array(np.arange(20)[None, :] >= np.array([[0], [3]]))
    mx.disable_compile()
    y_ref, s_ref = reference(*args, mask)
    mx.eval(y_ref, s_ref)
    mx.enable_compile()
    y, s = chunked_gated_delta(*args, mask, chunk_size=8, compiled=True)
    assert_close(y, y_ref, "compiled y")
    assert_close(s, s_ref, "compiled state")


def test_zero_length():
    q, k, v, g, beta, state = make_inputs(37, 2, 0, 1, 2, 8, 4)
    y, s = chunked_gated_delta(q, k, v, g, beta, state)
    assert y.shape == (2, 0, 2, 4)
    np.testing.assert_array_equal(np.array(s), np.array(state))


def test_bad_inputs_raise():
    q, k, v, g, beta, state = make_inputs(41, 1, 4, 2, 4, 8, 8)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_gated_delta(q, k, v, g, beta, state, chunk_size=0)
    with pytest.raises(ValueError, match="multiple of Hk"):
        chunked_gated_delta(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="beta"):
        chunked_gated_delta(q, k, v, g, beta[:, :3], state)
    with pytest.raises(ValueError, match="state"):
        chunked_gated_delta(q, k, v, g, beta, state[:, :, :4])
    with pytest.raises(ValueError, match="mask"):
        chunked_gated_delta(q, k, v, g, beta, state, mx.ones((1, 5), dtype=mx.bool_))
    with pytest.raises(ValueError, match="g must"):
        chunked_gated_delta(q, k, v, g[..., None], beta, state)


def _layer_inputs(seed: int, t: int):
    """q, k, v, a, b, A_log, dt_bias as a qwen3_5 GDN layer passes them (B 1, Hk 2, Hv 4)."""
    q, k, v, _, _, state = make_inputs(seed, 1, t, 2, 4, 16, 16)
    a = mx.random.normal((1, t, 4))
    b = mx.random.normal((1, t, 4))
    a_log = mx.log(mx.random.uniform(1.0, 16.0, (4,)))
    dt_bias = mx.random.normal((4,))
    return (q, k, v, a, b, a_log, dt_bias, state)


@pytest.mark.parametrize(
    "options",
    [{}, {"lower_bound": -5.0}, {"allow_neg_eigval": True}],
    ids=["plain", "lower-bound", "neg-eigval"],
)
def test_update_wrapper_matches_mlx_lm(options, monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs["chunk_size"])
        return _chunked(*args, **kwargs)

    monkeypatch.setattr(gdn_chunked, "chunked_gated_delta", spy)
    args = _layer_inputs(43, 16)
    y_ref, s_ref = gated_delta_update(*args, None, use_kernel=False, **options)
    y, s = chunked_gated_delta_update(*args, None, chunk_size=8, **options)
    assert calls == [8]  # the chunked pass ran (on the CPU device)
    assert_close(y, y_ref, f"wrapper y {options}")
    assert_close(s, s_ref, f"wrapper state {options}")


def test_update_wrapper_single_step_is_mlx_lm_bitwise():
    args = _layer_inputs(47, 1)
    y_ref, s_ref = gated_delta_update(*args, None, use_kernel=False)
    y, s = chunked_gated_delta_update(*args, None)
    np.testing.assert_array_equal(np.array(y), np.array(y_ref))
    np.testing.assert_array_equal(np.array(s), np.array(s_ref))


def test_drop_in_for_a_qwen3_5_model(monkeypatch):
    """A tiny random qwen3_5 model gives the same logits and recurrent states when its GDN
    layers call chunked_gated_delta_update instead of mlx-lm's gated_delta_update."""
    from mlx_lm.models import qwen3_5

    from app.models.tiny import target_config

    mx.random.seed(53)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(target_config("qwen3_5", 97, 0)))
    tokens = mx.random.randint(0, 97, (1, 21))

    def run():
        cache = model.make_cache()
        first = model(tokens[:, :13], cache=cache)  # prefill: one chunk of 8 plus 5
        second = model(tokens[:, 13:], cache=cache)  # an 8-token block on top
        states = [c[1] for c in cache if isinstance(c, qwen3_5.ArraysCache)]
        return mx.concatenate([first, second], axis=1), states

    logits_ref, states_ref = run()
    calls = []

    def chunked_update(*args, **kwargs):
        calls.append(args[0].shape[1])
        return chunked_gated_delta_update(*args, chunk_size=8, **kwargs)

    monkeypatch.setattr(qwen3_5, "gated_delta_update", chunked_update)
    logits, states = run()
    assert calls == [13] * 4 + [8] * 4  # 4 GDN layers, two passes
    assert len(states) == 4
    assert_close(logits, logits_ref, "logits")
    for s, s_ref in zip(states, states_ref):
        assert_close(s, s_ref, "layer state")
