"""The row mode's attention (app/engine/kernels/row_attention.py).

On the CPU (CI): which calls the routing sends to the kernel, to MLX's kernel one query at a
time, or to mlx-lm's own function; the kernel's launch (grid, template, inputs as they are);
the shapes it refuses. On MLX's CUDA backend (the H200 host, ``tools/gpu_measure.sh rows``):
each query of a 16-query call equals, bit for bit, that query's call alone over its keys (a
step), and the result agrees with MLX's causal attention to rounding.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.base import scaled_dot_product_attention as base_attention
from mlx_lm.models.cache import KVCache, RotatingKVCache

from app.engine.kernels import row_attention as ra
from app.engine.kernels import row_products as rp


def _f32(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def _reference(q: mx.array, k: mx.array, v: mx.array, scale: float) -> np.ndarray:
    """Causal attention in float32 on the CPU (MLX's float32 products on CUDA round to TF32)."""
    f = [a.astype(mx.float32) for a in (q, k, v)]
    return np.array(mx.fast.scaled_dot_product_attention(*f, scale=scale, mask="causal",
                                                         stream=mx.cpu))


def test_attention_by_query_is_causal_attention_one_query_at_a_time():
    """Query i of a block attends to the keys before it and its own, as a step there does."""
    mx.random.seed(4)
    q = mx.random.normal((1, 4, 5, 32))
    k = mx.random.normal((1, 2, 12, 32))
    v = mx.random.normal((1, 2, 12, 32))
    y = ra.attention_by_query(q, k, v, 0.25)
    assert y.shape == (1, 4, 5, 32)
    assert np.allclose(_f32(y), _reference(q, k, v, 0.25), atol=1e-3, rtol=1e-3)
    step = mx.fast.scaled_dot_product_attention(q[:, :, 2:3], k[:, :, :10], v[:, :, :10],
                                                scale=0.25)
    assert np.array_equal(_f32(y[:, :, 2:3]), _f32(step))
    with pytest.raises(ValueError, match="attention_by_query"):
        ra.attention_by_query(q, k[:, :, :4], v[:, :, :4], 0.25)


def test_the_kernel_takes_steps_and_blocks_of_head_sizes_in_32s():
    bf = mx.bfloat16
    q, kv = mx.zeros((1, 16, 16, 256), bf), mx.zeros((1, 4, 40, 256), bf)
    assert ra.kernel_takes(q, kv, kv) and ra.kernel_takes(q[:, :, :1], kv, kv)
    assert ra.kernel_takes(mx.zeros((2, 4, 3, 64)), mx.zeros((2, 2, 3, 64)),
                           mx.zeros((2, 2, 3, 64)))
    refused = [
        (mx.zeros((1, 16, 17, 256), bf), kv, kv),  # more than 16 queries
        (q, kv[:, :, :15], kv[:, :, :15]),  # fewer keys than queries
        (mx.zeros((1, 16, 16, 80), bf), mx.zeros((1, 4, 40, 80), bf),
         mx.zeros((1, 4, 40, 80), bf)),  # head size not a multiple of 32
        (mx.zeros((1, 16, 16, 288), bf), mx.zeros((1, 4, 40, 288), bf),
         mx.zeros((1, 4, 40, 288), bf)),  # more than 256
        (q.astype(mx.float16), kv, kv),  # mixed dtypes
        (mx.zeros((1, 6, 16, 256), bf), kv, kv),  # heads not a multiple of the KV heads
        (q, kv, kv[:, :, :20]),  # values unlike keys
    ]
    for args in refused:
        assert not ra.kernel_takes(*args)
    with pytest.raises(ValueError, match="kernel_attention"):
        ra.kernel_attention(*refused[0], 0.1)


class _FakeKernel:
    """Stands in for ``mx.fast.cuda_kernel`` on the CPU: records each call, returns ones."""

    def __init__(self):
        self.calls = []

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        self.calls.append(dict(inputs=inputs, template=dict(template), grid=grid,
                               threadgroup=threadgroup, shape=output_shapes[0],
                               dtype=output_dtypes[0]))
        return [mx.ones(output_shapes[0], output_dtypes[0])]


def test_a_kernel_call_is_one_block_of_32_warps_per_query_and_head(monkeypatch):
    fake = _FakeKernel()
    monkeypatch.setattr(ra, "_kernel", lambda: fake)
    cache = KVCache()
    keys = mx.zeros((2, 4, 300, 128), mx.float16)
    k, v = cache.update_and_fetch(keys, keys)
    k, v = cache.update_and_fetch(keys[:, :, :16], keys[:, :, :16])  # a slice of the buffer
    q = mx.zeros((2, 16, 8, 128), mx.float16).transpose(0, 2, 1, 3)  # as mlx-lm makes it
    y = ra.kernel_attention(q, k, v, 128 ** -0.5)
    call = fake.calls[0]
    assert y.shape == (2, 8, 16, 128) and y.dtype == mx.float16
    assert call["grid"] == (1024 * 8, 16, 2) and call["threadgroup"] == (1024, 1, 1)
    assert call["template"] == {"T": mx.float16, "D": 128}
    assert call["inputs"][1] is k and call["inputs"][2] is v  # strided, not copied
    assert call["inputs"][3].item() == pytest.approx(128 ** -0.5)
    ra.kernel_attention(q[:, :, :1], k, v, 128 ** -0.5)
    assert fake.calls[1]["grid"] == (1024 * 8, 1, 2)
    assert fake.calls[1]["inputs"][3] is call["inputs"][3]  # the scale array is kept


#: What a model file imports from mlx_lm.models.base (the switch patches this name here).
scaled_dot_product_attention = base_attention


class _Attn(nn.Module):
    """A module of this file: its model file is this test module."""


def _routed(monkeypatch) -> tuple:
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setitem(globals(), "scaled_dot_product_attention", base_attention)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "all")
    calls = []
    monkeypatch.setattr(ra, "kernel_attention", lambda *a: calls.append(("kernel", a)) or a[0])
    monkeypatch.setattr(ra, "attention_by_query",
                        lambda *a: calls.append(("by_query", a)) or a[0])
    model = nn.Sequential(nn.Linear(8, 8))
    model.attn = _Attn()
    rp.use_row_stable_products(model)
    wrapped = globals()["scaled_dot_product_attention"]
    assert wrapped is not base_attention and ra.use_row_attention(model, lambda: True) == 0
    assert ra.MAX_QUERIES == rp.MAX_ROWS  # a verify block's queries are its rows
    return wrapped, calls


def test_the_row_mode_sends_steps_and_causal_blocks_over_a_kv_cache_to_the_kernel(monkeypatch):
    wrapped, calls = _routed(monkeypatch)
    bf = mx.bfloat16
    q, kv, cache = mx.zeros((1, 2, 4, 32), bf), mx.zeros((1, 2, 9, 32), bf), KVCache()
    assert wrapped(q, kv, kv, cache, scale=1.0, mask="causal") is q
    assert wrapped(q[:, :, :1], kv, kv, cache, scale=1.0, mask=None) is not None  # a step
    assert [c[0] for c in calls] == ["kernel", "kernel"]
    calls.clear()
    for other in ({"mask": None}, {"mask": mx.zeros((4, 9), mx.bool_)}):  # not causal blocks
        wrapped(q, kv, kv, cache, scale=1.0, **other)
    wrapped(q, kv, kv, RotatingKVCache(max_size=64), scale=1.0, mask="causal")
    wrapped(mx.zeros((1, 2, 17, 32), bf), mx.zeros((1, 2, 20, 32), bf),
            mx.zeros((1, 2, 20, 32), bf), cache, scale=1.0, mask="causal")  # a prefill
    f32 = mx.zeros((1, 2, 9, 32))
    wrapped(f32[:, :, :4], f32, f32, cache, scale=1.0, mask="causal")  # float32: MLX's
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "quantized")
    wrapped(q, kv, kv, cache, scale=1.0, mask="causal")
    assert calls == []


def test_shapes_the_kernel_refuses_go_one_query_at_a_time_in_a_block(monkeypatch):
    """Sinks or a head size the kernel does not take: a block runs MLX's kernel per query
    (as steps do, which keep mlx-lm's own function)."""
    wrapped, calls = _routed(monkeypatch)
    bf = mx.bfloat16
    q, kv, cache = mx.zeros((1, 2, 4, 40), bf), mx.zeros((1, 2, 9, 40), bf), KVCache()
    wrapped(q, kv, kv, cache, scale=1.0, mask="causal")
    wrapped(q[:, :, :1], kv, kv, cache, scale=1.0, mask=None)
    sinks = mx.zeros((2,), bf)
    q, kv = mx.zeros((1, 2, 4, 32), bf), mx.zeros((1, 2, 9, 32), bf)
    wrapped(q, kv, kv, cache, scale=1.0, mask="causal", sinks=sinks)
    assert [c[0] for c in calls] == ["by_query", "by_query"]
    assert calls[1][1][4] is sinks


cuda = pytest.mark.skipif(not rp.on_cuda(), reason="needs MLX's CUDA backend")


def _cached(b: int, kv_heads: int, before: int, n: int, d: int, dtype) -> tuple:
    """Keys and values as a ``KVCache`` hands them to attention: slices of a larger buffer,
    ``before`` positions then ``n`` more."""
    mx.random.seed(before + d)
    cache = KVCache()
    k = mx.random.normal((b, kv_heads, before + n, d)).astype(dtype)
    v = mx.random.normal((b, kv_heads, before + n, d)).astype(dtype)
    cache.update_and_fetch(k[:, :, :before], v[:, :, :before])
    return cache.update_and_fetch(k[:, :, before:], v[:, :, before:])


@cuda
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("b,heads,kv_heads,before,d", [
    (1, 16, 4, 300, 256),  # Qwen3.5-4B's attention after 300 cached positions
    (1, 4, 2, 12, 64),  # the exactness suite's targets
    (2, 8, 8, 1100, 128),  # past 1024 keys (where MLX's vector kernel takes two passes)
])
def test_each_query_of_a_block_equals_a_step_at_its_position(dtype, b, heads, kv_heads,
                                                             before, d):
    k, v = _cached(b, kv_heads, before, 16, d, dtype)
    q = mx.random.normal((b, 16, heads, d)).astype(dtype).transpose(0, 2, 1, 3)
    y = ra.kernel_attention(q, k, v, d ** -0.5)
    for i in range(16):
        step = ra.kernel_attention(q[:, :, i:i + 1], k[:, :, :before + i + 1],
                                   v[:, :, :before + i + 1], d ** -0.5)
        assert np.array_equal(_f32(y[:, :, i:i + 1]), _f32(step)), i
    tol = 1e-4 if dtype == mx.float32 else 2e-2
    assert np.allclose(_f32(y), _reference(q, k, v, d ** -0.5), atol=tol, rtol=tol)


@cuda
def test_a_routed_model_file_keeps_a_steps_result_in_a_block():
    """Through the routing as mlx-lm's attention layer calls it: a causal block's query i
    equals a step's (mask None) call at that position."""
    routed = ra._routed(base_attention, lambda: True)
    k, v = _cached(1, 2, 40, 16, 64, mx.bfloat16)
    q = mx.random.normal((1, 4, 16, 64)).astype(mx.bfloat16)
    y = routed(q, k, v, KVCache(), scale=0.125, mask="causal")
    step = routed(q[:, :, 7:8], k[:, :, :48], v[:, :, :48], KVCache(), scale=0.125, mask=None)
    assert np.array_equal(_f32(y[:, :, 7:8]), _f32(step))
