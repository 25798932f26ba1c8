"""The row-stable products of app/engine/rows_kernel.py.

On the CPU (CI): the switch leaves a model alone off CUDA, the subclasses compute what their
bases compute when the kernel does not apply, and bad shapes get a ValueError. On MLX's CUDA
backend (the H200 host, ``tools/gpu_measure.sh exact``): the kernels agree with MLX's products
and each row of a 16-row call equals that row multiplied alone, bit for bit.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from app.engine import gdn_kernel, rows_kernel


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 128)
        self.proj = nn.Linear(128, 96, bias=False)
        self.out = nn.Linear(96, 128, bias=True)


def test_switch_leaves_a_model_alone_off_cuda(monkeypatch):
    monkeypatch.setattr(gdn_kernel, "on_cuda", lambda: False)
    model = _Tiny()
    assert rows_kernel.use_row_stable_products(model) == 0
    assert type(model.proj) is nn.Linear


def test_switch_keeps_parameters_and_is_idempotent(monkeypatch):
    monkeypatch.setattr(gdn_kernel, "on_cuda", lambda: True)
    model = _Tiny()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p == "proj")
    before = dict(tree_flatten(model.parameters()))
    assert rows_kernel.use_row_stable_products(model) == 3
    assert rows_kernel.use_row_stable_products(model) == 0
    assert type(model.proj) is rows_kernel.RowStableQuantizedLinear
    assert type(model.out) is rows_kernel.RowStableLinear
    assert type(model.embed) is rows_kernel.RowStableEmbedding
    assert isinstance(model.out, nn.Linear)
    after = dict(tree_flatten(model.parameters()))
    assert before.keys() == after.keys()


def test_switched_modules_compute_as_their_bases_when_the_kernel_is_off(monkeypatch):
    """Off (DFLASH_ROWS_KERNEL=0, or more than 16 rows) they are their base classes' call."""
    monkeypatch.setattr(gdn_kernel, "on_cuda", lambda: True)
    mx.random.seed(3)
    model = _Tiny()
    x = mx.random.normal((1, 4, 128))
    want_out = model.out(model.proj(x)[..., :96])
    want_head = model.embed.as_linear(x)
    rows_kernel.use_row_stable_products(model)
    monkeypatch.setenv("DFLASH_ROWS_KERNEL", "0")
    assert np.array_equal(np.array(model.out(model.proj(x)[..., :96])), np.array(want_out))
    assert np.array_equal(np.array(model.embed.as_linear(x)), np.array(want_head))
    monkeypatch.delenv("DFLASH_ROWS_KERNEL")
    big = mx.random.normal((1, 17, 128))  # more rows than a block: the base's product
    assert np.array_equal(np.array(model.embed.as_linear(big)),
                          np.array(nn.Embedding.as_linear(model.embed, big)))


def test_bad_shapes_raise_value_error():
    with pytest.raises(ValueError, match="at most 16 rows"):
        rows_kernel.rows_matmul(mx.zeros((17, 32)), mx.zeros((8, 32)))
    with pytest.raises(ValueError, match="bits 3"):
        rows_kernel.rows_quantized_matmul(mx.zeros((1, 64)), mx.zeros((8, 6), mx.uint32),
                                          mx.zeros((8, 1)), mx.zeros((8, 1)), 64, 3)


cuda = pytest.mark.skipif(not gdn_kernel.on_cuda(), reason="needs MLX's CUDA backend")


@cuda
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("n,k", [(96, 128), (2561, 2560), (1024, 9216)])
def test_dense_kernel_matches_matmul_and_rows_are_independent(dtype, n, k):
    mx.random.seed(0)
    w = (0.05 * mx.random.normal((n, k))).astype(dtype)
    x = mx.random.normal((1, 16, k)).astype(dtype)
    y = rows_kernel.rows_matmul(x, w)
    ref = (x.astype(mx.float32) @ w.astype(mx.float32).T)
    tol = 3e-2  # MLX's float32 matmul on CUDA rounds its inputs to TF32: the reference is coarse
    assert y.shape == (1, 16, n) and y.dtype == dtype
    assert np.allclose(np.array(y.astype(mx.float32)), np.array(ref), atol=tol, rtol=tol)
    for m in (0, 7, 15):
        one = rows_kernel.rows_matmul(x[:, m:m + 1], w)
        assert np.array_equal(np.array(one.astype(mx.float32))[0, 0],
                              np.array(y.astype(mx.float32))[0, m])


@cuda
@pytest.mark.parametrize("bits,group", [(4, 64), (4, 32), (8, 64), (4, 128)])
def test_quantized_kernel_matches_quantized_matmul_and_rows_are_independent(bits, group):
    mx.random.seed(1)
    n, k = 2560, 2560
    w = (0.05 * mx.random.normal((n, k))).astype(mx.bfloat16)
    wq, scales, biases = mx.quantize(w, group_size=group, bits=bits)
    x = mx.random.normal((1, 16, k)).astype(mx.bfloat16)
    y = rows_kernel.rows_quantized_matmul(x, wq, scales, biases, group, bits)
    ref = mx.quantized_matmul(x.astype(mx.float32), wq, scales.astype(mx.float32),
                              biases.astype(mx.float32), transpose=True, group_size=group,
                              bits=bits)
    assert np.allclose(np.array(y.astype(mx.float32)), np.array(ref), atol=5e-2, rtol=3e-2)
    for m in (0, 9, 15):
        one = rows_kernel.rows_quantized_matmul(x[:, m:m + 1], wq, scales, biases, group, bits)
        assert np.array_equal(np.array(one.astype(mx.float32))[0, 0],
                              np.array(y.astype(mx.float32))[0, m])
