"""Matrix products of 1 to 16 rows on MLX's CUDA backend, on tensor cores, rows independent.

Why: on MLX's CUDA backend a 1-token step multiplies one row by each weight matrix (MLX's
``gemv`` / ``qmv`` kernels) and a 16-token verify pass sixteen (cuBLASLt's kernels in bf16;
MLX 0.32's ``qmm_sm80`` / ``qmm_naive`` in 4-bit). The two kinds of kernel sum in different
orders, so a verify pass's hidden states differ from plain decoding's in the last bits, and
MLX's 4-bit 16-row products cost more GPU time than a whole step (``tools/trace_verify.py`` on a
Qwen3.5-4B-shaped target; docs/history/performance-log.md, "Where a 16-token verify's extra
time goes").

What: :func:`rows_quantized_matmul` and :func:`rows_matmul` compute ``x @ W.T`` for at most
:data:`MAX_ROWS` rows as one ``mx.fast.cuda_kernel`` (:data:`SOURCE`) on tensor cores: the 16
rows of x are the M of ``mma.sync.m16n8k16`` (rows past the call's are zeros), a block takes 8
output columns, and its :data:`K_SPLIT` warps take every fourth 128-element step of K, summed
in warp order at the end. Affine 4- and 8-bit weights are dequantized in registers
(``fmaf(scale, q, bias)`` in float32, rounded to x's dtype). Each output ``(m, n)`` depends
only on row ``m`` of x and the weights, through a sequence of MMAs fixed by K; so row ``m`` of
an M-row call equals, bit for bit, a 1-row call on that row (the tests on the GPU check it).

Host time: each ``mx.fast.cuda_kernel`` call goes through its Python and C++ front end (the
source text is assembled per call), and a pass on a fast GPU is bound by the host. A layer
therefore calls the kernel through ``mx.compile`` (:class:`_Plan`), which replays the traced
call (docs/history/performance-log.md, "The row kernel's host cost, traced away").

Attention is the other operation whose result depends on the row count
(``tools/probe_rows.py``); in the ``all`` mode steps and verify blocks also share one attention
kernel (:mod:`app.engine.kernels.row_attention`). With both, every float16, bfloat16 and 4-/8-bit
test target of the exactness suite keeps plain decoding's tokens and, bit for bit, its caches,
and a 16-token verify of a Qwen3.5-4B-shaped target costs fewer steps than with MLX's products
(docs/performance.md, "Exactness" and "Figures"). Exact by default is the project's rule, so
``all`` is the default on MLX's CUDA backend. ``DFLASH_ROW_PRODUCTS`` (read when a model is
switched, at load; then at each call, to pick among the modes that are on) chooses otherwise:

* ``all`` (the default): dense (float16 / bfloat16) and quantized layers, 1-16 rows, and
  attention: plain steps and verify passes compute alike;
* ``0``: MLX's own products and attention. Plain 4-bit decoding may be a little faster (MLX's
  ``qmv`` costs the host less), but a verify pass rounds unlike plain steps: DFlash may leave
  plain decoding's tokens;
* ``quantized``: quantized layers only, 1-16 rows (dense ones and attention keep MLX's);
* ``quantized-verify``: quantized layers, 2-16 rows only: the fast 16-row product for verify
  passes, MLX's ``qmv`` for steps (no host cost in a step; the rows no longer match a step's).

Where: :func:`use_row_stable_products` switches a target's ``nn.Linear``,
``nn.QuantizedLinear`` and (for tied output heads) ``nn.Embedding`` /
``nn.QuantizedEmbedding`` to subclasses that take the kernel where the mode says and the shapes
fit (at most 16 rows, float16 / bfloat16, K a multiple of 128) on MLX's CUDA backend, and the
module's own operation otherwise (prefill, the CPU, Apple GPUs, float32, quantization modes
other than affine).
"""

from __future__ import annotations

import math
import os

import mlx.core as mx
import mlx.nn as nn

from app.engine.device import backend
from app.engine.kernels.cuda_source import compact
from app.engine.kernels.row_attention import use_row_attention

__all__ = ["HEADER", "MAX_ROWS", "MODES", "SOURCE", "describe", "instance_call", "mode",
           "on_cuda", "rows_matmul", "rows_quantized_matmul", "use_row_stable_products"]

#: The most rows a call takes (a verify pass's block, the M of one m16n8k16 MMA); more rows
#: go to MLX's own product.
MAX_ROWS = 16
#: ``DFLASH_ROW_PRODUCTS`` values (the first is the default).
MODES = ("all", "0", "quantized", "quantized-verify")
#: Warps of a block, each taking every ``K_SPLIT``-th 128-element step of K.
K_SPLIT = 4

#: Device functions the kernel body calls (``header`` of ``mx.fast.cuda_kernel``).
HEADER = r"""template <typename A, typename B> struct dflash_same { static constexpr bool value = false; };
template <typename A> struct dflash_same<A, A> { static constexpr bool value = true; };

// Two floats as one packed pair of T (the lower k in the low half), rounded to nearest.
template <typename T>
__device__ __forceinline__ unsigned int dflash_pack2(float lo, float hi) {
  if constexpr (dflash_same<T, __half>::value) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned int*>(&h);
  }
}

// D = A B + D for one m16n8k16 tile with float32 accumulators (PTX ISA, "Matrix fragments
// for mma.m16n8k16 with floating point type": a0/a1 rows g / g + 8, k slots 2t, 2t + 1;
// a2/a3 the same rows, k slots 2t + 8, 2t + 9; b0 k slots 2t, 2t + 1 and b1 2t + 8, 2t + 9
// of column g; d rows g (d0, d1) and g + 8 (d2, d3), columns 2t, 2t + 1).
template <typename T>
__device__ __forceinline__ void dflash_mma(float* d, unsigned int a0, unsigned int a1,
                                           unsigned int a2, unsigned int a3,
                                           unsigned int b0, unsigned int b1) {
  if constexpr (dflash_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Elements k .. k + 31 of weight row n as 16 packed pairs of T. Bits 0: dense T weights
// [N, K]. Bits 4 or 8: MLX's affine packing ([N, K * Bits / 32] uint32, lowest bits first;
// scales and biases [N, K / Gs]), dequantized as fmaf(scale, q, bias) in float32 and rounded
// to T; the 32 elements lie in one group (Gs is 32, 64 or 128 and k a multiple of 32).
template <typename T, int Bits, int Gs, typename W>
__device__ __forceinline__ void dflash_load_b(const W* w, const T* scales, const T* biases,
                                              int n, int K, int k, unsigned int* out) {
  if constexpr (Bits == 0) {
    const uint4* p = reinterpret_cast<const uint4*>(w + (size_t)n * K + k);
    #pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 q = p[v];
      out[4 * v] = q.x; out[4 * v + 1] = q.y; out[4 * v + 2] = q.z; out[4 * v + 3] = q.w;
    }
  } else {
    constexpr int WORDS = 32 * Bits / 32;   // uint32 words for 32 elements: 4 or 8
    constexpr int PER_WORD = 32 / Bits;
    constexpr unsigned int MASK = (1u << Bits) - 1u;
    const uint4* p = reinterpret_cast<const uint4*>(
        w + (size_t)n * (K * Bits / 32) + k * Bits / 32);
    unsigned int words[WORDS];
    #pragma unroll
    for (int v = 0; v < WORDS / 4; ++v) {
      const uint4 q = p[v];
      words[4 * v] = q.x; words[4 * v + 1] = q.y; words[4 * v + 2] = q.z; words[4 * v + 3] = q.w;
    }
    const size_t gi = (size_t)n * (K / Gs) + k / Gs;
    const float sc = static_cast<float>(scales[gi]);
    const float bi = static_cast<float>(biases[gi]);
    #pragma unroll
    for (int p2 = 0; p2 < 16; ++p2) {
      const int e0 = 2 * p2, e1 = 2 * p2 + 1;
      const unsigned int q0 = (words[e0 / PER_WORD] >> (Bits * (e0 % PER_WORD))) & MASK;
      const unsigned int q1 = (words[e1 / PER_WORD] >> (Bits * (e1 % PER_WORD))) & MASK;
      out[p2] = dflash_pack2<T>(fmaf(sc, static_cast<float>(q0), bi),
                                fmaf(sc, static_cast<float>(q1), bi));
    }
  }
}
"""

#: Kernel body. Inputs ``x`` ``[..., K]`` (``T``: float16 or bfloat16, M <= 16 rows in all),
#: ``w`` (dense: ``[N, K]`` in T; affine-quantized: ``[N, K * Bits / 32]`` uint32) and, when
#: quantized, ``scales`` and ``biases`` ``[N, K / Gs]`` in T; output ``y`` ``[..., N]`` in T. Template
#: constants: ``T``, ``Bits`` (0 dense, 4, 8), ``Gs``, ``NT`` (8-column tiles per block),
#: ``KSplit`` (warps per block). K must be a multiple of 128. Grid ``(32, KSplit * ceil(N /
#: (8 * NT)), 1)`` threads in blocks of ``(32, KSplit, 1)``.
SOURCE = r"""
    // One block: 8 * NT output columns, KSplit warps splitting K; 16 rows of x (rows >= M are
    // zeros). Each warp walks the 128-element steps it, it + KSplit, ... of K; in a step lane
    // (g = lane / 4, t = lane % 4) loads elements [32 t, 32 t + 32) of the step for x rows g
    // and g + 8 and for weight row n0 + 8 j + g (j < NT), and feeds them to 8 MMAs
    // (m16n8k16): MMA i takes elements 4 i .. 4 i + 3 of each lane's 32 as its k slots
    // 2 t, 2 t + 1, 2 t + 8, 2 t + 9 (the same map for A and B).
    int M = 1;
    for (int d = 0; d < x_ndim - 1; ++d) {
      M *= x_shape[d];
    }
    const int K = x_shape[x_ndim - 1];
    const int N = w_shape[0];
    const int lane = threadIdx.x;
    const int warp = threadIdx.y;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int n0 = blockIdx.y * (8 * NT);
    const bool x_vec = (reinterpret_cast<size_t>(x) & 15) == 0;
    float c[NT][4];
    #pragma unroll
    for (int j = 0; j < NT; ++j) {
      c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
    }
    const int steps = K / 128;
    for (int it = warp; it < steps; it += KSplit) {
      const int k = it * 128 + 32 * t;
      // A: rows g and g + 8 of x, elements k .. k + 31, as 16 packed pairs each.
      unsigned int xa[2][16];
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        if (row < M) {
          const T* xp = x + (size_t)row * K + k;
          if (x_vec) {
            #pragma unroll
            for (int v = 0; v < 4; ++v) {
              const uint4 q = reinterpret_cast<const uint4*>(xp)[v];
              xa[h][4 * v] = q.x; xa[h][4 * v + 1] = q.y;
              xa[h][4 * v + 2] = q.z; xa[h][4 * v + 3] = q.w;
            }
          } else {
            #pragma unroll
            for (int p = 0; p < 16; ++p) {
              xa[h][p] = dflash_pack2<T>(static_cast<float>(xp[2 * p]),
                                        static_cast<float>(xp[2 * p + 1]));
            }
          }
        } else {
          #pragma unroll
          for (int p = 0; p < 16; ++p) {
            xa[h][p] = 0u;
          }
        }
      }
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int n = n0 + 8 * j + g;
        unsigned int wb[16];
        if (n < N) {
          dflash_load_b<T, Bits, Gs>(w, scales, biases, n, K, k, wb);
        } else {
          #pragma unroll
          for (int p = 0; p < 16; ++p) {
            wb[p] = 0u;
          }
        }
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
          dflash_mma<T>(c[j], xa[0][2 * i], xa[1][2 * i], xa[0][2 * i + 1],
                        xa[1][2 * i + 1], wb[2 * i], wb[2 * i + 1]);
        }
      }
    }
    // Sum the warps' partial sums in warp order (fixed), then write rows < M.
    __shared__ float part[KSplit][NT][32][4];
    #pragma unroll
    for (int j = 0; j < NT; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        part[warp][j][lane][e] = c[j][e];
      }
    }
    __syncthreads();
    if (warp == 0) {
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          float s = part[0][j][lane][e];
          for (int w2 = 1; w2 < KSplit; ++w2) {
            s += part[w2][j][lane][e];
          }
          const int row = g + 8 * (e >> 1);
          const int col = n0 + 8 * j + 2 * t + (e & 1);
          if (row < M && col < N) {
            y[(size_t)row * N + col] = static_cast<T>(s);
          }
        }
      }
    }
"""

_KERNELS: dict = {}


_CAPABILITY: list = []


def on_cuda() -> bool:
    """True when MLX's default device is a GPU of its CUDA backend
    (:func:`app.engine.device.backend`) that the kernel runs on: compute capability 8.0 or
    later (``mma.sync.m16n8k16`` with bfloat16 needs sm_80), as ``mx.device_info()`` reports
    it (read once). An older GPU, or an MLX that does not report it, keeps MLX's own
    products."""
    if backend() != "CUDA":
        return False
    if not _CAPABILITY:
        try:
            info = mx.device_info()
            major = info.get("compute_capability_major")
            if major is None:  # "sm_90" (the architecture MLX 0.32 also reports)
                arch = str(info.get("architecture", ""))
                major = arch[3:-1] if arch.startswith("sm_") and len(arch) > 4 else 0
            major = int(major)
        except Exception:  # an MLX without device_info, or one that fails
            major = 0
        _CAPABILITY.append(major)
    return _CAPABILITY[0] >= 8


def _kernel(quantized: bool):
    """The ``mx.fast.cuda_kernel`` for dense or quantized weights (built once a process; MLX
    compiles one instance per template on first use)."""
    if quantized not in _KERNELS:
        if quantized:
            _KERNELS[quantized] = mx.fast.cuda_kernel(
                name="dflash_rows_q", input_names=["x", "w", "scales", "biases"],
                output_names=["y"], source=compact(SOURCE), header=compact(HEADER))
        else:
            _KERNELS[quantized] = mx.fast.cuda_kernel(
                name="dflash_rows_d", input_names=["x", "w"], output_names=["y"],
                source=compact("const T* scales = nullptr;\nconst T* biases = nullptr;\n" + SOURCE),
                header=compact(HEADER))
    return _KERNELS[quantized]


def describe() -> str | None:
    """One line for ``python -m app --version`` on MLX's CUDA backend: which kernels a target's
    products and attention take (:func:`mode`, :func:`on_cuda`) and what that means for
    DFlash; None on other backends (the CPU, Apple GPUs), where the row mode does not apply."""
    if backend() != "CUDA":
        return None
    if not on_cuda():
        return ("products and attention: MLX's own (the row kernels need compute capability "
                "8.0); DFlash may leave plain decoding's tokens")
    way = mode()
    if way == "all":
        return ("products and attention: the row kernels (DFLASH_ROW_PRODUCTS=all, the "
                "default): verify passes compute as plain steps")
    return (f"products and attention: DFLASH_ROW_PRODUCTS={way} (MLX's own where the row "
            "kernels are off); DFlash may leave plain decoding's tokens")


#: ``os.environ``'s encoded store and each mode's encoded value, for :func:`mode`: a product
#: asks for the mode, and ``os.environ.get`` (which encodes the key and decodes the value)
#: cost more than a microsecond of a step's host time per product.
_ENV = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("DFLASH_ROW_PRODUCTS") if _ENV is not None else None
_ENCODED = {os.environ.encodevalue(m): m for m in MODES} if _ENV is not None else {}


def mode() -> str:
    """``DFLASH_ROW_PRODUCTS`` (one of :data:`MODES`; unset or unknown: ``"all"``). Read at
    each call from ``os.environ``'s own store (cheap next to a product), so benchmarks and
    tests can change it within one process."""
    if _ENV is not None:
        return _ENCODED.get(_ENV.get(_ENV_KEY), MODES[0])
    value = os.environ.get("DFLASH_ROW_PRODUCTS", MODES[0])
    return value if value in MODES else MODES[0]


def _rows(x: mx.array) -> int:
    return math.prod(x.shape[:-1]) if x.ndim > 1 else 1


#: 8-column tiles a block computes (the kernel's ``NT``). Traced on an H200 (Qwen3.5-4B
#: shapes, 16 rows), 1 was fastest for 4-bit weights (4.9 ms a pass against 5.7 for 2 and 7.5
#: for 4) and within 4% of 2 for bf16; the sums do not depend on it.
TILES = 1

#: CUDA's limit on a grid's y blocks.
_MAX_BLOCKS_Y = 65535


def _fits(x: mx.array, n: int, k: int) -> bool:
    """Shapes and dtypes the kernel takes: at most 16 rows, float16 / bfloat16, K a multiple
    of 128, N within the grid."""
    return (x.ndim >= 1 and _rows(x) <= MAX_ROWS and x.shape[-1] == k and k % 128 == 0
            and x.dtype in (mx.float16, mx.bfloat16)
            and math.ceil(n / (8 * TILES)) <= _MAX_BLOCKS_Y)


class _Plan:
    """What one weight matrix's calls pass to the kernel besides x, built once per matrix
    and dtype: a forward pass makes ~250 products, and the host time around each one is paid
    on every step, which bounds a step on a fast GPU.

    A call goes through ``mx.compile`` (one trace per input shape, so per row count): replaying
    the traced kernel skips ``mx.fast.cuda_kernel``'s front end, which assembles the kernel's
    source text on every call. On an H200 host (``tools/bench_kernel_call.py``) that cut the
    host cost of building one 1-row product from 4.3 to 2.2 us (bf16; MLX's own product:
    3.0), and a chain of dependent 1-row products ran at 15.2 us each against 19.0 for MLX's.
    The replay runs the same kernel on the same inputs, so the result is the same, bit for
    bit. The weight arrays are inputs of the traced function, not constants: a constant that
    is not evaluated yet would be traced with the operations that make it and computed anew,
    perhaps fused and rounded otherwise, on every call."""

    __slots__ = ("dtype", "inputs", "kernel", "n", "template", "grid", "_launch", "_compiled")

    def __init__(self, dtype: mx.Dtype, inputs: list, n: int, bits: int, group_size: int):
        self.dtype = dtype
        self.inputs = inputs
        self.kernel = _kernel(bits != 0)
        self.n = n
        self.template = [("T", dtype), ("Bits", bits), ("Gs", group_size), ("NT", TILES),
                         ("KSplit", K_SPLIT)]
        self.grid = (32, K_SPLIT * math.ceil(n / (8 * TILES)), 1)
        self._launch = _launcher(self.kernel, self.template, self.grid, n, dtype)
        self._compiled = None

    def launch(self, x: mx.array) -> mx.array:
        """The kernel's product of ``x`` through ``mx.fast.cuda_kernel`` itself (no trace)."""
        return self._launch(x, *self.inputs)

    def __call__(self, x: mx.array) -> mx.array:
        if self._compiled is None:
            self._compiled = mx.compile(self._launch)
        return self._compiled(x, *self.inputs)


def _launcher(kernel, template: list, grid: tuple, n: int, dtype: mx.Dtype):
    """``(x, *weight arrays) -> x @ W.T`` by one call of ``kernel`` (a function, not a method
    of the plan, so that its trace holds no reference to the plan)."""
    dtypes = [dtype]

    def launch(x: mx.array, *weights: mx.array) -> mx.array:
        return kernel(**_call_args(x, weights, template, grid, n, dtypes))[0]

    return launch


def _call_args(x: mx.array, weights, template: list, grid: tuple, n: int, dtypes: list) -> dict:
    """The keyword arguments of one kernel call computing ``x @ W.T`` (``W`` given by
    ``weights``: the matrix, or the packed matrix, scales and biases) with ``n`` columns: a
    block is one warp per :data:`K_SPLIT` share of K."""
    return dict(inputs=[x, *weights], template=template, grid=grid,
                threadgroup=(32, K_SPLIT, 1), output_shapes=[(*x.shape[:-1], n)],
                output_dtypes=dtypes)


def instance_call(dtype: mx.Dtype, bits: int = 0, group_size: int = 32) -> tuple:
    """``(kernel, keyword arguments)`` of a call that runs the kernel instance a layer of this
    activation ``dtype`` (float16 / bfloat16) uses: dense for ``bits`` 0, else affine
    ``bits`` (4, 8) with ``group_size``. The inputs are tiny zero arrays (1 row, K 128, N 8):
    MLX generates an instance's source from the dtypes and template only, so this builds the
    same instance as a layer's call (``app.engine.kernels.custom_cache.build`` compiles it
    ahead of a run)."""
    k, n = 128, 8
    if bits:
        weights = [mx.zeros((n, k * bits // 32), dtype=mx.uint32),
                   mx.zeros((n, k // group_size), dtype=dtype),
                   mx.zeros((n, k // group_size), dtype=dtype)]
    else:
        weights, group_size = [mx.zeros((n, k), dtype=dtype)], 32
    plan = _Plan(dtype, weights, n, bits, group_size)
    return plan.kernel, _call_args(mx.zeros((1, k), dtype=dtype), weights, plan.template,
                                   plan.grid, n, [dtype])


def rows_matmul(x: mx.array, weight: mx.array) -> mx.array:
    """``x @ weight.T`` with :data:`SOURCE` (MLX's CUDA backend only, tensor cores).

    Args:
        x: ``(..., K)`` with at most :data:`MAX_ROWS` rows in all, float16 or bfloat16; K a
            multiple of 128.
        weight: ``(N, K)`` in x's dtype.

    Returns:
        ``(..., N)`` in x's dtype, summed in float32; every row equals, bit for bit, the same
        row multiplied alone. It agrees with MLX's product to rounding, not bit for bit.

    Raises:
        ValueError: more rows than :data:`MAX_ROWS`, another dtype, or mismatched shapes.
    """
    if weight.ndim != 2 or x.ndim < 1 or not _fits(x, *weight.shape) or weight.dtype != x.dtype:
        raise ValueError(f"rows_matmul: x {tuple(x.shape)} {x.dtype} against weight "
                         f"{tuple(weight.shape)} {weight.dtype} (at most {MAX_ROWS} rows of "
                         f"float16 or bfloat16, K a multiple of 128)")
    return _Plan(x.dtype, [weight], weight.shape[0], 0, 32).launch(x)


def rows_quantized_matmul(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array,
                          group_size: int, bits: int) -> mx.array:
    """``mx.quantized_matmul(x, weight, scales, biases, transpose=True)`` in MLX's affine mode
    with :data:`SOURCE` (MLX's CUDA backend only).

    Args:
        x: ``(..., K)``, at most :data:`MAX_ROWS` rows, float16 or bfloat16, K a multiple
            of 128.
        weight: ``(N, K * bits / 32)`` uint32, packed as ``mx.quantize`` packs.
        scales, biases: ``(N, K / group_size)`` in x's dtype.
        group_size: 32, 64 or 128; bits: 4 or 8.

    Returns:
        ``(..., N)`` in x's dtype, rows independent of each other (see :func:`rows_matmul`).
        It agrees with MLX's ``quantized_matmul`` to rounding, not bit for bit (weights are
        dequantized in float32 and rounded to x's dtype, as tensor cores take them).

    Raises:
        ValueError: shapes, dtypes, bits or group size outside the above.
    """
    if (x.ndim < 1 or weight.ndim != 2 or weight.dtype != mx.uint32 or scales is None
            or biases is None):
        raise ValueError(f"rows_quantized_matmul: x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)} {weight.dtype} (uint32, 2-D), scales and "
                         f"biases must be given")
    k = x.shape[-1]
    n = weight.shape[0]
    if (not _fits(x, n, k) or bits not in (4, 8) or group_size not in (32, 64, 128)
            or weight.shape[1] * 32 // bits != k
            or scales.shape != (n, k // group_size) or biases.shape != scales.shape
            or scales.dtype != x.dtype or biases.dtype != x.dtype):
        raise ValueError(
            f"rows_quantized_matmul: x {tuple(x.shape)} {x.dtype}, weight "
            f"{tuple(weight.shape)}, scales {tuple(scales.shape)} {scales.dtype}, bits {bits}, "
            f"group size {group_size} (affine 4 or 8 bits, group 32/64/128 with biases in x's "
            f"dtype, at most {MAX_ROWS} rows, K a multiple of 128)")
    return _Plan(x.dtype, [weight, scales, biases], n, bits, group_size).launch(x)


def _dense_fits(x: mx.array, weight: mx.array) -> bool:
    """Whether :func:`rows_matmul` takes a dense product of ``x`` by ``weight``."""
    return (weight.ndim == 2 and x.dtype == weight.dtype
            and _fits(x, weight.shape[0], weight.shape[1]))


def _quantized_fits(module: nn.Module, x: mx.array) -> bool:
    """Whether :func:`rows_quantized_matmul` takes a quantized module's product of ``x``
    (affine 4 or 8 bits, group 32/64/128, scales and biases in x's dtype)."""
    return (getattr(module, "mode", "affine") == "affine"
            and module.bits in (4, 8) and module.group_size in (32, 64, 128)
            and module.get("biases") is not None and module["scales"].dtype == x.dtype
            and _fits(x, module["weight"].shape[0], x.shape[-1])
            and x.shape[-1] * module.bits // 32 == module["weight"].shape[1])


def _plan(module: nn.Module, x: mx.array) -> _Plan | None:
    """The module's plan for ``x`` when the kernel takes this call, else None. The answer is
    worked out once per input dtype and width and kept on the module (``_row_plans``) while
    its weight, scales and biases are the same arrays (a new array, e.g. after ``update`` or
    ``set_dtype``, works it out again); what each call checks is cheap (mode, rows, the cache
    key, the arrays' identity). Call it only for models on MLX's CUDA backend (what
    :func:`use_row_stable_products` switches)."""
    way = mode()
    if way == "0" or x.ndim == 0 or x.size > x.shape[-1] * MAX_ROWS:
        return None
    quantized = isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    if (not quantized and way != "all") or (way == "quantized-verify" and x.size == x.shape[-1]):
        return None
    plans = module.__dict__.get("_row_plans")
    if plans is None:
        plans = module.__dict__["_row_plans"] = {}
    key = (x.dtype, x.shape[-1])
    weight = module["weight"]
    scales = module["scales"] if quantized else None
    biases = module.get("biases") if quantized else None
    entry = plans.get(key)
    if entry is None or entry[0] is not weight or entry[1] is not scales \
            or entry[2] is not biases:
        if quantized:
            plan = (_Plan(x.dtype, [weight, scales, biases], weight.shape[0], module.bits,
                          module.group_size) if _quantized_fits(module, x) else None)
        else:
            plan = _Plan(x.dtype, [weight], weight.shape[0], 0, 32) if _dense_fits(x, weight) \
                else None
        entry = plans[key] = (weight, scales, biases, plan)
    return entry[3]


def _linear_call(module: nn.Module, x: mx.array, base: type) -> mx.array:
    """A switched linear layer's call: the kernel's product (and the bias) when its plan
    takes ``x``, else ``base``'s own call (named, not looked up on the instance's class: a
    subclass of the switched class, e.g. a probe's, must not call back into this)."""
    plan = _plan(module, x)
    if plan is None:
        return base.__call__(module, x)
    y = plan(x)
    return y + module["bias"] if "bias" in module else y


class RowStableLinear(nn.Linear):
    """``nn.Linear`` that multiplies 1-16 rows with :func:`rows_matmul` on MLX's CUDA
    backend in the ``all`` mode (a bias is added after the product) and as ``nn.Linear``
    otherwise."""

    def __call__(self, x: mx.array) -> mx.array:
        return _linear_call(self, x, nn.Linear)


class RowStableQuantizedLinear(nn.QuantizedLinear):
    """``nn.QuantizedLinear`` that multiplies 1-16 rows (2-16 in ``quantized-verify``) with
    :func:`rows_quantized_matmul` on MLX's CUDA backend when :func:`mode` asks for it, and as
    ``nn.QuantizedLinear`` otherwise."""

    def __call__(self, x: mx.array) -> mx.array:
        return _linear_call(self, x, nn.QuantizedLinear)


class RowStableEmbedding(nn.Embedding):
    """``nn.Embedding`` whose ``as_linear`` (a tied output head) uses :func:`rows_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        plan = _plan(self, x)
        return super().as_linear(x) if plan is None else plan(x)


class RowStableQuantizedEmbedding(nn.QuantizedEmbedding):
    """``nn.QuantizedEmbedding`` whose ``as_linear`` uses :func:`rows_quantized_matmul`."""

    def as_linear(self, x: mx.array) -> mx.array:
        plan = _plan(self, x)
        return super().as_linear(x) if plan is None else plan(x)


def _attention_on() -> bool:
    """Whether the row mode's attention kernel is on now (the ``all`` mode; asked at each
    attention call, as :func:`mode` is at each product)."""
    return mode() == "all"


#: Module class -> its row-stable subclass (exact classes only: a subclass of these from a
#: model file may compute something else and is left alone).
_SWAPS = {nn.Linear: RowStableLinear, nn.QuantizedLinear: RowStableQuantizedLinear,
          nn.Embedding: RowStableEmbedding, nn.QuantizedEmbedding: RowStableQuantizedEmbedding}


def use_row_stable_products(model: nn.Module) -> int:
    """On MLX's CUDA backend (:func:`on_cuda`), unless ``DFLASH_ROW_PRODUCTS`` is ``0``,
    switch every ``nn.Linear``, ``nn.QuantizedLinear``, ``nn.Embedding`` and
    ``nn.QuantizedEmbedding`` in ``model`` to its row-stable subclass, in place (parameters,
    names and ``isinstance`` checks unchanged), and route its model files' attention through
    :func:`app.engine.kernels.row_attention.use_row_attention` (steps and verify blocks share one
    kernel in the ``all`` mode). Elsewhere (the CPU, Apple GPUs) or with ``0`` nothing changes,
    so the products pay no extra Python either. Idempotent. The loader calls it for every
    target and :class:`~app.engine.target.TargetRunner` for the models it is given, so plain
    decoding and verify passes compute alike.

    Returns:
        How many modules were switched by this call.
    """
    if mode() == "0" or not on_cuda():
        return 0
    use_row_attention(model, _attention_on)
    switched = 0
    for _, module in model.named_modules():
        swap = _SWAPS.get(type(module))
        if swap is not None:
            module.__class__ = swap
            switched += 1
    return switched
