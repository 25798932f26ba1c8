"""Attention of 1 to 16 new queries over a KV cache whose every query's result does not depend
on how many queries the call had: the attention half of the row mode.

Why: on MLX's CUDA backend ``mx.fast.scaled_dot_product_attention`` takes different kernels
for one query and for a causal block (MLX 0.32: its vector kernel for fewer than 4 queries and
head sizes 64 / 96 / 128, cuDNN for a block of head size <= 128 and for a step over 256 or more
cached keys, and unfused products plus softmax for head size 256, Qwen3.5's). They round
differently, so with them a verify pass's attention differs from plain decoding's in the last
bits: with every product on the row kernel it is the only row-count dependent operation of a
Qwen3.5-shaped target (``tools/probe_rows.py``; docs/history/performance-log.md, "What still
made qwen3_5 differ").

What: :func:`kernel_attention` is one ``mx.fast.cuda_kernel`` (:data:`SOURCE`) that takes both
a step's single query and a verify block's 16. A block of 32 warps computes one query of one
head: warp w takes keys w, w + 32, w + 64, ... up to the query's own position (causal), each
lane 1/32 of the head; an online softmax in float32 (scores in base 2, as MLX's vector kernel
does) per warp, then the 32 warps merged in a fixed order. Nothing of this depends on the number
of queries in the call except where the query's keys end, so query i of a 16-query verify
equals, bit for bit, a step's query at that position; the GPU tests check it. The key count and
strides are read at run time, so a growing cache builds no new kernel.

Where: :func:`use_row_attention` points the ``scaled_dot_product_attention`` that mlx-lm's
model files import at a wrapper that, in the ``all`` mode of ``DFLASH_ROW_PRODUCTS``
(``app.engine.kernels.row_products.mode``, the default on MLX's CUDA backend), sends float16 and
bfloat16 steps and causal blocks of up to 16 queries over a plain ``KVCache`` to the kernel
(or, for shapes it does not take, to :func:`attention_by_query`: MLX's kernel one query at a
time), and everything else (prefill, float32, other caches, other modes) to mlx-lm's own
function. float32 stays with MLX: its products do not go through the row kernel either, so
nothing would be gained there.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from app.engine.kernels.cuda_source import compact

__all__ = ["SOURCE", "attention_by_query", "instance_call", "kernel_attention", "kernel_takes",
           "use_row_attention"]

#: The kernel body (``mx.fast.cuda_kernel``; template ``T`` the dtype, ``D`` the head size, a
#: multiple of 32 up to 256). Grid: ``(1024 * H, L, B)`` threads in blocks of 1024 (32 warps),
#: block (h, i, b) computing query i of head h of batch b. Inputs q ``(B, H, L, D)``,
#: k / v ``(B, H_kv, T, D)`` (any strides), scale ``(1,)`` float32; output ``(B, H, L, D)``.
SOURCE = r"""
constexpr int E = D / 32;  // elements of the head a lane holds
const int lane = threadIdx.x & 31;
const int warp = threadIdx.x >> 5;
const int h = blockIdx.x;
const int i = blockIdx.y;
const int b = blockIdx.z;
const int L = q_shape[2];
const int last = k_shape[2] - L + i;  // the query's own position: it sees keys 0..last
const int hk = h / (q_shape[1] / k_shape[1]);
const T* qp = q + b * q_strides[0] + h * q_strides[1] + i * q_strides[2];
const T* kp = k + b * k_strides[0] + hk * k_strides[1];
const T* vp = v + b * v_strides[0] + hk * v_strides[1];
const float s = scale[0] * 1.4426950408889634f;  // scores in base 2
float qr[E];
float o[E];
#pragma unroll
for (int e = 0; e < E; ++e) {
  qr[e] = s * static_cast<float>(qp[(lane * E + e) * q_strides[3]]);
  o[e] = 0.f;
}
float m = -3.402823466e38f;
float l = 0.f;
for (int j = warp; j <= last; j += 32) {
  const T* kj = kp + j * k_strides[2];
  const T* vj = vp + j * v_strides[2];
  float sc = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    sc += qr[e] * static_cast<float>(kj[(lane * E + e) * k_strides[3]]);
  }
#pragma unroll
  for (int w = 16; w > 0; w >>= 1) {
    sc += __shfl_xor_sync(0xffffffff, sc, w);
  }
  const float mn = fmaxf(m, sc);
  const float f = exp2f(m - mn);
  const float p = exp2f(sc - mn);
  m = mn;
  l = l * f + p;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    o[e] = o[e] * f + p * static_cast<float>(vj[(lane * E + e) * v_strides[3]]);
  }
}
__shared__ float wm[32];
__shared__ float wl[32];
__shared__ float wo[32][33];
if (lane == 0) {
  wm[warp] = m;
  wl[warp] = l;
}
__syncthreads();
const float mine = wm[lane];  // lane j of every warp now stands for key-warp j
float top = mine;
#pragma unroll
for (int w = 16; w > 0; w >>= 1) {
  top = fmaxf(top, __shfl_xor_sync(0xffffffff, top, w));
}
const float g = exp2f(mine - top);
float total = wl[lane] * g;
#pragma unroll
for (int w = 16; w > 0; w >>= 1) {
  total += __shfl_xor_sync(0xffffffff, total, w);
}
const float inv = total == 0.f ? 0.f : __frcp_rn(total);
T* op = out + ((b * q_shape[1] + h) * L + i) * D;
#pragma unroll
for (int e = 0; e < E; ++e) {
  wo[lane][warp] = o[e];  // element lane * E + e of key-warp `warp`
  __syncthreads();
  float x = wo[warp][lane] * g;  // element warp * E + e of key-warp `lane`
#pragma unroll
  for (int w = 16; w > 0; w >>= 1) {
    x += __shfl_xor_sync(0xffffffff, x, w);
  }
  if (lane == 0) {
    op[warp * E + e] = static_cast<T>(x * inv);
  }
  __syncthreads();
}
"""

#: The most queries a call takes (a verify block: ``app.engine.kernels.row_products.MAX_ROWS``).
MAX_QUERIES = 16
_KERNEL: list = []
#: The dtypes the routing sends to the kernel (those the row products take).
_HALF = (mx.float16, mx.bfloat16)
_SCALES: dict = {}


def _kernel():
    """The ``mx.fast.cuda_kernel`` (built once a process; MLX compiles one instance per dtype
    and head size on first use)."""
    if not _KERNEL:
        _KERNEL.append(mx.fast.cuda_kernel(
            name="dflash_rows_attention", input_names=["q", "k", "v", "scale"],
            output_names=["out"], source=compact(SOURCE),
            ensure_row_contiguous=False))
    return _KERNEL[0]


def kernel_takes(queries: mx.array, keys: mx.array, values: mx.array) -> bool:
    """Whether :func:`kernel_attention` takes these shapes: ``(B, H, L, D)`` queries with
    ``1 <= L <= 16`` over at least L keys, one dtype (float16, bfloat16 or float32), D a
    multiple of 32 up to 256, values of the keys' shape, H a multiple of the KV heads."""
    if queries.ndim != 4 or keys.ndim != 4 or values.shape != keys.shape:
        return False
    b, h, n, d = queries.shape
    return (1 <= n <= MAX_QUERIES and keys.shape[2] >= n and keys.shape[0] == b
            and keys.shape[3] == d and d % 32 == 0 and d <= 256 and h % keys.shape[1] == 0
            and queries.dtype == keys.dtype == values.dtype
            and queries.dtype in (mx.float16, mx.bfloat16, mx.float32))


def kernel_attention(queries: mx.array, keys: mx.array, values: mx.array,
                     scale: float) -> mx.array:
    """Causal attention of the last L positions of a cache with :data:`SOURCE` (MLX's CUDA
    backend only).

    Args:
        queries: ``(B, H, L, D)``, ``1 <= L <= 16``, the queries of the cache's last L
            positions; float16, bfloat16 or float32.
        keys, values: ``(B, H_kv, T, D)``, ``T >= L``, the cache after those positions were
            added (H a multiple of H_kv: grouped-query attention), queries' dtype, any strides.
        scale: the scale of the scores (``D ** -0.5`` usually).

    Returns:
        ``(B, H, L, D)`` in the queries' dtype: query i attends to keys ``0 .. T - L + i``. Its
        values equal, bit for bit, this function's for that query alone over those keys (a
        step's call), and agree with ``mx.fast.scaled_dot_product_attention(mask="causal")``
        to rounding.

    Raises:
        ValueError: shapes or dtypes :func:`kernel_takes` refuses.
    """
    if not kernel_takes(queries, keys, values):
        raise ValueError(f"kernel_attention: queries {tuple(queries.shape)} {queries.dtype} "
                         f"over keys {tuple(keys.shape)} {keys.dtype}, values "
                         f"{tuple(values.shape)} (1-{MAX_QUERIES} queries over at "
                         f"least as many keys, head size a multiple of 32 up to 256)")
    if scale not in _SCALES:
        _SCALES[scale] = mx.array([scale], mx.float32)
    return _kernel()(**_call_args(queries, keys, values, _SCALES[scale]))[0]


def _call_args(queries: mx.array, keys: mx.array, values: mx.array, scale: mx.array) -> dict:
    """The keyword arguments of :func:`kernel_attention`'s kernel call (``scale`` a 1-element
    float32 array)."""
    b, h, n, d = queries.shape
    return dict(inputs=[queries, keys, values, scale], template=[("T", queries.dtype), ("D", d)],
                grid=(1024 * h, n, b), threadgroup=(1024, 1, 1), output_shapes=[queries.shape],
                output_dtypes=[queries.dtype])


def instance_call(dtype: mx.Dtype, head_dim: int) -> tuple:
    """``(kernel, keyword arguments)`` of a call that runs the kernel instance attention of
    this ``dtype`` and ``head_dim`` uses, on tiny zero inputs (one head, one query, one key):
    MLX generates an instance's source from the dtypes and template only, so this builds the
    same instance as a model's call (``app.engine.kernels.custom_cache.build`` compiles it
    ahead of a run)."""
    q = mx.zeros((1, 1, 1, head_dim), dtype=dtype)
    return _kernel(), _call_args(q, q, q, mx.array([1.0], mx.float32))


def attention_by_query(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
                       sinks: mx.array | None = None) -> mx.array:
    """Causal attention of L new queries over a cache by MLX's own kernel, one query at a time,
    so each query takes the kernel a one-token step takes at that position (for shapes
    :func:`kernel_takes` refuses: sinks, other head sizes).

    Args:
        queries: ``(B, H, L, D)``, the last L positions of the cache.
        keys, values: ``(B, H_kv, T, D)`` with ``T >= L``: the cache after these positions
            were added.
        scale: the attention scale; sinks: as ``mx.fast.scaled_dot_product_attention``.

    Returns:
        ``(B, H, L, D)``: query i attends to the first ``T - L + i + 1`` keys, unmasked, as a
        step at that position does.

    Raises:
        ValueError: fewer keys than queries.
    """
    n, t = queries.shape[2], keys.shape[2]
    if t < n:
        raise ValueError(f"attention_by_query: {n} queries over {t} keys")
    outs = []
    for i in range(n):
        end = t - n + i + 1
        outs.append(mx.fast.scaled_dot_product_attention(
            queries[:, :, i:i + 1], keys[:, :, :end], values[:, :, :end], scale=scale,
            mask=None, sinks=sinks))
    return mx.concatenate(outs, axis=2)


def _routed(original, active):
    """mlx-lm's ``scaled_dot_product_attention`` (``mlx_lm.models.base``) that, while
    ``active()`` (the row mode's ``all``: asked at each call), sends a float16 or bfloat16
    step (one query, no mask) or causal block of up to 16 queries over a plain ``KVCache`` to
    :func:`kernel_attention` (blocks the kernel does not take: :func:`attention_by_query`),
    and everything else to ``original``."""

    def attention(queries, keys, values, cache, scale, mask, sinks=None):
        n = queries.shape[2]
        causal = isinstance(mask, str) and mask == "causal"
        if (n <= MAX_QUERIES and (causal or (n == 1 and mask is None))
                and type(cache) is KVCache and keys.shape[2] >= n
                and queries.dtype in _HALF and active()):
            if sinks is None and kernel_takes(queries, keys, values):
                return kernel_attention(queries, keys, values, scale)
            if n > 1:
                return attention_by_query(queries, keys, values, scale, sinks)
        return original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

    attention.dflash_rows = True
    return attention


def use_row_attention(model: nn.Module, active) -> int:
    """Point the ``scaled_dot_product_attention`` of each model file that ``model``'s modules
    come from (mlx-lm's model files import it by name) at the row mode's routing, on while
    ``active()`` (a callable asked at each call; off, mlx-lm's own function runs).
    Process-wide and idempotent (a file switched once keeps its first ``active``).

    Returns:
        How many model files were switched by this call.
    """
    switched = 0
    for name in {type(m).__module__ for _, m in model.named_modules()}:
        file = sys.modules.get(name)
        fn = getattr(file, "scaled_dot_product_attention", None)
        if fn is not None and not getattr(fn, "dflash_rows", False):
            file.scaled_dot_product_attention = _routed(fn, active)
            switched += 1
    return switched
