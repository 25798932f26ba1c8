"""Matrix products of 1 to 16 rows as one CUDA kernel whose rows do not depend on each other.

Why (issue #21): on MLX's CUDA backend a 1-token step multiplies one row by each weight matrix
(MLX's ``gemv`` / ``qmv`` kernels) and a 16-token verify pass sixteen (cuBLASLt's ``nvjet``
kernels in bf16, MLX's ``qmm_sm80`` / ``qmm_naive`` in 4-bit). Traced on an H200
(``tools/trace_verify.py``, a Qwen3.5-4B-shaped target), the 4-bit 16-row products took
13.6 ms of GPU time a pass against 3.8 ms for one row, more than a whole step; and the two
kinds of kernel sum in different orders, so a verify pass's hidden states differ from plain
decoding's in the last bits and a greedy token can flip (docs/performance.md, "Exactness on
CUDA").

What: :func:`rows_matmul` (dense weights) and :func:`rows_quantized_matmul` (MLX's affine
quantization, 4 or 8 bits) compute ``x @ W.T`` for ``M <= MAX_ROWS`` rows with
``mx.fast.cuda_kernel``. Each weight element is read once and applied to every row; each output
``(m, n)`` is summed in an order fixed by ``K`` alone (lane ``l`` of a warp takes the elements
``32 * j + l``, in float32, with explicit ``fmaf``, then a butterfly reduction), so row ``m`` of
an ``M``-row call equals, bit for bit, a 1-row call on that row. Plain decoding and verify
passes therefore multiply alike, as :mod:`app.engine.gdn_kernel` makes them run the recurrence
alike.

Where: :func:`use_row_stable_products` switches a target's ``nn.Linear``,
``nn.QuantizedLinear`` and (for tied output heads) ``nn.Embedding`` /
``nn.QuantizedEmbedding`` to subclasses that take these kernels for 1-16 rows on MLX's CUDA
backend and the module's own operation otherwise (prefill, the CPU, Apple GPUs, other
dtypes). ``DFLASH_ROWS_KERNEL=0`` in the environment turns it off (read at each call), for
benchmarks that compare the two.
"""

from __future__ import annotations

import math
import os

import mlx.core as mx
import mlx.nn as nn

__all__ = ["DENSE_SOURCE", "MAX_ROWS", "QUANTIZED_SOURCE", "rows_active", "rows_matmul",
           "rows_quantized_matmul", "use_row_stable_products"]

#: The most rows a call takes (a verify pass's block); more rows go to MLX's own product.
MAX_ROWS = 16
#: Output columns per warp (each weight row loaded once is used for all M rows of x).
_COLS = 4
#: Warps per thread block (they share the staged rows of x).
_WARPS = 8
#: Elements of K staged at a time: 16 rows x 256 float32 = 16 KiB of shared memory.
_TILE = 256

#: Dense kernel body. Inputs ``x`` ``[rows, K]`` and ``w`` ``[N, K]``; output ``y``
#: ``[rows, N]`` (``OutT``); rows, K and N are read from the shapes, so one build serves every
#: matrix. Template constants: ``OutT``, ``Cols`` (output columns a warp computes), ``MaxRows``,
#: ``Tile`` (elements of K staged at a time in shared memory as float32, a multiple of 32).
#: Grid ``(32, ceil(N / Cols) rounded up to the warps, 1)`` threads in blocks of
#: ``(32, _WARPS, 1)``. Lane ``l`` accumulates the elements ``k = l, l + 32, l + 64, ...`` in
#: that order, for every row alike.
DENSE_SOURCE = r"""
    const int rows = x_shape[0];
    const int K = x_shape[1];
    const int N = w_shape[0];
    const int lane = threadIdx.x;
    const int tid = threadIdx.y * 32 + lane;
    const int nthreads = blockDim.y * 32;
    const int n0 = (blockIdx.y * blockDim.y + threadIdx.y) * Cols;
    __shared__ float xs[MaxRows][Tile];
    float acc[MaxRows][Cols];
    #pragma unroll
    for (int m = 0; m < MaxRows; ++m) {
      #pragma unroll
      for (int c = 0; c < Cols; ++c) {
        acc[m][c] = 0.0f;
      }
    }
    for (int k0 = 0; k0 < K; k0 += Tile) {
      for (int i = tid; i < MaxRows * Tile; i += nthreads) {
        const int m = i / Tile;
        const int k = k0 + i % Tile;
        xs[m][i % Tile] = (m < rows && k < K) ? static_cast<float>(x[(size_t)m * K + k]) : 0.0f;
      }
      __syncthreads();
      if (n0 < N) {
        for (int j = 0; j < Tile / 32; ++j) {
          const int kk = j * 32 + lane;
          if (k0 + kk < K) {
            float wv[Cols];
            #pragma unroll
            for (int c = 0; c < Cols; ++c) {
              wv[c] = (n0 + c < N) ? static_cast<float>(w[(size_t)(n0 + c) * K + k0 + kk])
                                   : 0.0f;
            }
            #pragma unroll
            for (int m = 0; m < MaxRows; ++m) {
              if (m < rows) {
                const float xv = xs[m][kk];
                #pragma unroll
                for (int c = 0; c < Cols; ++c) {
                  acc[m][c] = fmaf(xv, wv[c], acc[m][c]);
                }
              }
            }
          }
        }
      }
      __syncthreads();
    }
    if (n0 < N) {
      #pragma unroll
      for (int m = 0; m < MaxRows; ++m) {
        #pragma unroll
        for (int c = 0; c < Cols; ++c) {
          float s = acc[m][c];
          for (int off = 16; off > 0; off >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, off);
          }
          if (lane == 0 && m < rows && n0 + c < N) {
            y[(size_t)m * N + n0 + c] = static_cast<OutT>(s);
          }
        }
      }
    }
"""

#: Affine-quantized kernel body (MLX's packing: ``32 / Bits`` values per ``uint32``, lowest
#: bits first; ``w = scale * q + bias`` per group of ``Gs`` values along K). Inputs ``x``
#: ``[rows, K]``, ``w`` ``[N, K * Bits / 32]`` (uint32), ``scales`` and ``biases``
#: ``[N, K / Gs]``; output ``y`` ``[rows, N]`` (``OutT``); K a multiple of 32 and of ``Gs``
#: (checked by the caller); x is staged as in the dense kernel.
#: Lane ``l`` takes the words ``l, l + 32, ...`` of each tile and a word's values in order.
QUANTIZED_SOURCE = r"""
    constexpr int PER_WORD = 32 / Bits;
    constexpr unsigned int MASK = (1u << Bits) - 1u;
    const int rows = x_shape[0];
    const int K = x_shape[1];
    const int N = w_shape[0];
    const int WORDS = K / PER_WORD;
    const int GROUPS = K / Gs;
    const int lane = threadIdx.x;
    const int tid = threadIdx.y * 32 + lane;
    const int nthreads = blockDim.y * 32;
    const int n0 = (blockIdx.y * blockDim.y + threadIdx.y) * Cols;
    __shared__ float xs[MaxRows][Tile];
    float acc[MaxRows][Cols];
    #pragma unroll
    for (int m = 0; m < MaxRows; ++m) {
      #pragma unroll
      for (int c = 0; c < Cols; ++c) {
        acc[m][c] = 0.0f;
      }
    }
    for (int k0 = 0; k0 < K; k0 += Tile) {
      for (int i = tid; i < MaxRows * Tile; i += nthreads) {
        const int m = i / Tile;
        const int k = k0 + i % Tile;
        xs[m][i % Tile] = (m < rows && k < K) ? static_cast<float>(x[(size_t)m * K + k]) : 0.0f;
      }
      __syncthreads();
      if (n0 < N) {
        for (int j = lane; j < Tile / PER_WORD; j += 32) {
          const int wi = k0 / PER_WORD + j;
          if (wi < WORDS) {
            const int g = (wi * PER_WORD) / Gs;
            unsigned int word[Cols];
            float sc[Cols], bi[Cols];
            #pragma unroll
            for (int c = 0; c < Cols; ++c) {
              const bool in = n0 + c < N;
              word[c] = in ? w[(size_t)(n0 + c) * WORDS + wi] : 0u;
              sc[c] = in ? static_cast<float>(scales[(size_t)(n0 + c) * GROUPS + g]) : 0.0f;
              bi[c] = in ? static_cast<float>(biases[(size_t)(n0 + c) * GROUPS + g]) : 0.0f;
            }
            #pragma unroll
            for (int v = 0; v < PER_WORD; ++v) {
              float wv[Cols];
              #pragma unroll
              for (int c = 0; c < Cols; ++c) {
                wv[c] = fmaf(sc[c], static_cast<float>((word[c] >> (Bits * v)) & MASK), bi[c]);
              }
              const int kk = j * PER_WORD + v;
              #pragma unroll
              for (int m = 0; m < MaxRows; ++m) {
                if (m < rows) {
                  const float xv = xs[m][kk];
                  #pragma unroll
                  for (int c = 0; c < Cols; ++c) {
                    acc[m][c] = fmaf(xv, wv[c], acc[m][c]);
                  }
                }
              }
            }
          }
        }
      }
      __syncthreads();
    }
    if (n0 < N) {
      #pragma unroll
      for (int m = 0; m < MaxRows; ++m) {
        #pragma unroll
        for (int c = 0; c < Cols; ++c) {
          float s = acc[m][c];
          for (int off = 16; off > 0; off >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, off);
          }
          if (lane == 0 && m < rows && n0 + c < N) {
            y[(size_t)m * N + n0 + c] = static_cast<OutT>(s);
          }
        }
      }
    }
"""

_KERNELS: dict = {}


def _kernel(name: str):
    """The ``mx.fast.cuda_kernel`` for ``"dense"`` or ``"quantized"`` (built once a process)."""
    if name not in _KERNELS:
        if name == "dense":
            _KERNELS[name] = mx.fast.cuda_kernel(
                name="dflash_rows_dense", input_names=["x", "w"], output_names=["y"],
                source=DENSE_SOURCE)
        else:
            _KERNELS[name] = mx.fast.cuda_kernel(
                name="dflash_rows_quantized", input_names=["x", "w", "scales", "biases"],
                output_names=["y"], source=QUANTIZED_SOURCE)
    return _KERNELS[name]


def rows_active() -> bool:
    """Whether the row-stable modules take their kernels now: ``DFLASH_ROWS_KERNEL`` is not
    ``"0"`` (read at each call; cheap, since it runs for every product of a step). The
    modules are switched only on MLX's CUDA backend (:func:`use_row_stable_products`)."""
    return os.environ.get("DFLASH_ROWS_KERNEL", "1") != "0"


def _grid(n: int) -> tuple[int, int, int]:
    warps = math.ceil(n / _COLS)
    return (32, math.ceil(warps / _WARPS) * _WARPS, 1)


def _rows(x: mx.array) -> int:
    return math.prod(x.shape[:-1]) if x.ndim > 1 else 1


def rows_matmul(x: mx.array, weight: mx.array) -> mx.array:
    """``x @ weight.T`` with :data:`DENSE_SOURCE` (MLX's CUDA backend only).

    Args:
        x: ``(..., K)`` with at most :data:`MAX_ROWS` rows in all, float32, float16 or
            bfloat16.
        weight: ``(N, K)`` in x's dtype.

    Returns:
        ``(..., N)`` in x's dtype; every row equals, bit for bit, the same row multiplied alone.

    Raises:
        ValueError: more rows than :data:`MAX_ROWS`, another dtype, or mismatched shapes.
    """
    m = _rows(x)
    n, k = weight.shape
    if m > MAX_ROWS or x.shape[-1] != k or x.dtype != weight.dtype:
        raise ValueError(f"rows_matmul: x {tuple(x.shape)} {x.dtype} against weight "
                         f"{tuple(weight.shape)} {weight.dtype} (at most {MAX_ROWS} rows)")
    y = _kernel("dense")(
        inputs=[x.reshape(m, k), weight],
        template=[("OutT", x.dtype), ("Cols", _COLS), ("MaxRows", MAX_ROWS), ("Tile", _TILE)],
        grid=_grid(n), threadgroup=(32, _WARPS, 1),
        output_shapes=[(m, n)], output_dtypes=[x.dtype])[0]
    return y.reshape(*x.shape[:-1], n)


def rows_quantized_matmul(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array,
                          group_size: int, bits: int) -> mx.array:
    """``mx.quantized_matmul(x, weight, scales, biases, transpose=True)`` in MLX's affine mode
    with :data:`QUANTIZED_SOURCE` (MLX's CUDA backend only).

    Args:
        x: ``(..., K)``, at most :data:`MAX_ROWS` rows, float16 / bfloat16 / float32.
        weight: ``(N, K * bits / 32)`` uint32, packed as ``mx.quantize`` packs.
        scales, biases: ``(N, K / group_size)``.
        group_size: 32, 64 or 128; bits: 4 or 8.

    Returns:
        ``(..., N)`` in x's dtype, rows independent of each other (see :func:`rows_matmul`).
        It agrees with MLX's ``quantized_matmul`` to float32 rounding, not bit for bit.

    Raises:
        ValueError: shapes, bits or group size outside the above.
    """
    m = _rows(x)
    k = x.shape[-1]
    n = weight.shape[0]
    if (m > MAX_ROWS or bits not in (4, 8) or k % group_size or k % 32
            or weight.shape[1] * 32 // bits != k or scales.shape != (n, k // group_size)
            or biases.shape != scales.shape):
        raise ValueError(f"rows_quantized_matmul: x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}, scales {tuple(scales.shape)}, bits {bits}, "
                         f"group size {group_size} (at most {MAX_ROWS} rows)")
    y = _kernel("quantized")(
        inputs=[x.reshape(m, k), weight, scales, biases],
        template=[("OutT", x.dtype), ("Cols", _COLS), ("MaxRows", MAX_ROWS), ("Tile", _TILE),
                  ("Bits", bits), ("Gs", group_size)],
        grid=_grid(n), threadgroup=(32, _WARPS, 1),
        output_shapes=[(m, n)], output_dtypes=[x.dtype])[0]
    return y.reshape(*x.shape[:-1], n)


def _dense_fits(x: mx.array, weight: mx.array) -> bool:
    return (x.ndim >= 1 and _rows(x) <= MAX_ROWS and x.dtype == weight.dtype
            and x.dtype in (mx.bfloat16, mx.float16, mx.float32) and rows_active())


def _quantized_fits(module: nn.Module, x: mx.array) -> bool:
    return (getattr(module, "mode", "affine") == "affine" and module.bits in (4, 8)
            and module.get("biases") is not None and _rows(x) <= MAX_ROWS
            and x.shape[-1] % module.group_size == 0 and x.shape[-1] % 32 == 0
            and x.dtype in (mx.bfloat16, mx.float16, mx.float32) and rows_active())


class RowStableLinear(nn.Linear):
    """``nn.Linear`` that multiplies 1-16 rows with :func:`rows_matmul` on MLX's CUDA
    backend (a bias is added after the product) and as ``nn.Linear`` otherwise."""

    def __call__(self, x: mx.array) -> mx.array:
        if not _dense_fits(x, self["weight"]):
            return super().__call__(x)
        y = rows_matmul(x, self["weight"])
        return y + self["bias"] if "bias" in self else y


class RowStableQuantizedLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` that multiplies 1-16 rows with :func:`rows_quantized_matmul`
    on MLX's CUDA backend (affine mode) and as ``nn.QuantizedLinear`` otherwise."""

    def __call__(self, x: mx.array) -> mx.array:
        if not _quantized_fits(self, x):
            return super().__call__(x)
        y = rows_quantized_matmul(x, self["weight"], self["scales"], self["biases"],
                                  self.group_size, self.bits)
        return y + self["bias"] if "bias" in self else y


class RowStableEmbedding(nn.Embedding):
    """``nn.Embedding`` whose ``as_linear`` (a tied output head) uses :func:`rows_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        if not _dense_fits(x, self["weight"]):
            return super().as_linear(x)
        return rows_matmul(x, self["weight"])


class RowStableQuantizedEmbedding(nn.QuantizedEmbedding):
    """``nn.QuantizedEmbedding`` whose ``as_linear`` uses :func:`rows_quantized_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        if not _quantized_fits(self, x):
            return super().as_linear(x)
        return rows_quantized_matmul(x, self["weight"], self["scales"], self["biases"],
                                     self.group_size, self.bits)


#: Module class -> its row-stable subclass (exact classes only: a subclass of these from a
#: model file may compute something else and is left alone).
_SWAPS = {nn.Linear: RowStableLinear, nn.QuantizedLinear: RowStableQuantizedLinear,
          nn.Embedding: RowStableEmbedding, nn.QuantizedEmbedding: RowStableQuantizedEmbedding}


def use_row_stable_products(model: nn.Module) -> int:
    """On MLX's CUDA backend (:func:`app.engine.gdn_kernel.on_cuda`), switch every
    ``nn.Linear``, ``nn.QuantizedLinear``, ``nn.Embedding`` and ``nn.QuantizedEmbedding`` in
    ``model`` to its row-stable subclass, in place (parameters, names and ``isinstance``
    checks unchanged). Elsewhere nothing changes. Idempotent. The loader calls it for every
    target and :class:`~app.engine.target.TargetRunner` for the models it is given, so plain
    decoding and verify passes multiply alike.

    Returns:
        How many modules were switched by this call.
    """
    from app.engine.gdn_kernel import on_cuda

    if not on_cuda():
        return 0
    switched = 0
    for _, module in model.named_modules():
        swap = _SWAPS.get(type(module))
        if swap is not None:
            module.__class__ = swap
            switched += 1
    return switched
