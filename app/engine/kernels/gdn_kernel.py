"""The Gated DeltaNet recurrence as one CUDA kernel, shared by 1-token steps and verify passes.

Why: off Apple GPUs, mlx-lm 0.32's ``gated_delta_update`` runs the recurrence as an operations
loop (``gated_delta_ops``): per token and per layer a handful of small kernels, so a 16-token
verify pass costs 16 such rounds per GDN layer, and a DFlash cycle on MLX's CUDA backend would
cost about six plain steps. mlx-lm's own kernel for this loop is written for Metal
(``mx.fast.metal_kernel``) and does not run on CUDA.

What: :func:`gated_delta_update` takes mlx-lm's ``gated_delta_update`` arguments. On MLX's CUDA
backend (unmasked batch, key head dim a multiple of 32) it runs :data:`CUDA_SOURCE` through
``mx.fast.cuda_kernel``; everywhere else it calls mlx-lm's function unchanged, so the CPU and
Apple GPUs compute exactly what mlx-lm computes.

Exactness: the kernel walks the tokens of a call one after another and keeps the state in
float32 registers between them; the arithmetic of token ``t`` does not depend on how many tokens
the call holds. A T-token verify pass therefore gives bit for bit the outputs and final state
of T one-token steps, provided plain decoding uses this kernel too. That is why, when
:func:`kernel_active` is true, plain decoding goes through the same layer walk as the DFlash
loop (``TargetRunner.forward``, see ``generate._plain_body``) instead of mlx-lm's model call.
Against mlx-lm's operations loop the results agree to float32 rounding only (another summation
order), which is never mixed within one generation.

The recurrence (Yang et al. 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule"),
per value head, with the state ``S`` of shape ``(Dv, Dk)``::

    S = g_t * S
    delta = beta_t * (v_t - S k_t)
    S = S + delta k_t^T
    y_t = S q_t

Layout (the same as mlx-lm's Metal kernel, whose semantics it follows): one 32-thread warp per
(batch, value head, value row); each thread holds ``Dk / 32`` state entries; the two dot
products are warp reductions by butterfly (``__shfl_xor_sync`` 1, 2, 4, 8, 16).

Switch: ``DFLASH_GDN_KERNEL=0`` in the environment makes :func:`kernel_active` false (mlx-lm's
loop everywhere), for benchmarks that compare the two; read at each call.
"""

from __future__ import annotations

import os

import mlx.core as mx
from mlx_lm.models.gated_delta import compute_g
from mlx_lm.models.gated_delta import gated_delta_update as _mlx_lm_update

__all__ = ["CUDA_SOURCE", "cuda_gated_delta", "gated_delta_update", "instance_call",
           "kernel_active"]

#: Body of the CUDA kernel (``mx.fast.cuda_kernel`` writes the signature: inputs ``q k v g
#: beta state_in`` as ``const T*``, outputs ``y state_out``; ``q_shape`` is passed because the
#: body names it). Template constants: ``InT`` (q/k/v/y dtype), ``StT`` (state dtype), ``Dk``,
#: ``Dv``, ``Hk``, ``Hv``. Grid ``(32, Dv, B*Hv)`` threads in blocks of ``(32, 4, 1)``.
CUDA_SOURCE = r"""
    constexpr int n_per_t = Dk / 32;
    const int lane = threadIdx.x;
    const int dv_idx = blockIdx.y * blockDim.y + threadIdx.y;
    const int n = blockIdx.z;
    if (dv_idx >= Dv) {
      return;  // a whole warp shares dv_idx: no shuffle loses a partner
    }
    const int T = q_shape[1];
    const int b_idx = n / Hv;
    const int hv_idx = n % Hv;
    const int hk_idx = hv_idx / (Hv / Hk);

    // q, k: [B, T, Hk, Dk]; v, y: [B, T, Hv, Dv]; g, beta: [B, T, Hv]
    const auto* q_ = q + (size_t)b_idx * T * Hk * Dk + hk_idx * Dk;
    const auto* k_ = k + (size_t)b_idx * T * Hk * Dk + hk_idx * Dk;
    const auto* v_ = v + (size_t)b_idx * T * Hv * Dv + hv_idx * Dv;
    auto* y_ = y + (size_t)b_idx * T * Hv * Dv + hv_idx * Dv;
    const auto* g_ = g + (size_t)b_idx * T * Hv;
    const auto* beta_ = beta + (size_t)b_idx * T * Hv;

    // state_in, state_out: [B, Hv, Dv, Dk]
    const size_t row = ((size_t)n * Dv + dv_idx) * Dk;
    float state[n_per_t];
    for (int i = 0; i < n_per_t; ++i) {
      state[i] = static_cast<float>(state_in[row + n_per_t * lane + i]);
    }

    for (int t = 0; t < T; ++t) {
      const float gt = static_cast<float>(g_[hv_idx]);
      float kv_mem = 0.0f;
      for (int i = 0; i < n_per_t; ++i) {
        const int s = n_per_t * lane + i;
        state[i] = state[i] * gt;
        kv_mem += state[i] * static_cast<float>(k_[s]);
      }
      for (int off = 1; off < 32; off <<= 1) {
        kv_mem += __shfl_xor_sync(0xffffffffu, kv_mem, off);
      }
      const float delta =
          (static_cast<float>(v_[dv_idx]) - kv_mem) * static_cast<float>(beta_[hv_idx]);
      float out = 0.0f;
      for (int i = 0; i < n_per_t; ++i) {
        const int s = n_per_t * lane + i;
        state[i] = state[i] + static_cast<float>(k_[s]) * delta;
        out += state[i] * static_cast<float>(q_[s]);
      }
      for (int off = 1; off < 32; off <<= 1) {
        out += __shfl_xor_sync(0xffffffffu, out, off);
      }
      if (lane == 0) {
        y_[dv_idx] = static_cast<InT>(out);
      }
      q_ += Hk * Dk;
      k_ += Hk * Dk;
      v_ += Hv * Dv;
      y_ += Hv * Dv;
      g_ += Hv;
      beta_ += Hv;
    }
    for (int i = 0; i < n_per_t; ++i) {
      state_out[row + n_per_t * lane + i] = static_cast<StT>(state[i]);
    }
"""

_KERNEL = None


def _kernel():
    """The compiled-on-first-use ``mx.fast.cuda_kernel`` (built once per process)."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = mx.fast.cuda_kernel(
            name="dflash_gated_delta",
            input_names=["q", "k", "v", "g", "beta", "state_in"],
            output_names=["y", "state_out"],
            source=CUDA_SOURCE,
        )
    return _KERNEL


def _on_cuda() -> bool:
    """True when the default device is a GPU of MLX's CUDA backend."""
    if mx.default_device() != mx.gpu:
        return False
    try:
        return bool(mx.cuda.is_available())
    except AttributeError:  # an MLX without the cuda module
        return False


def kernel_active() -> bool:
    """Whether GDN layers run :data:`CUDA_SOURCE` here: MLX's CUDA backend is the default
    device and ``DFLASH_GDN_KERNEL`` is not ``"0"``. Shapes the kernel does not take (key head
    dim not a multiple of 32, a padding mask) still go to mlx-lm's loop, in plain decoding and
    verify alike."""
    return os.environ.get("DFLASH_GDN_KERNEL", "1") != "0" and _on_cuda()


def _kernel_fits(k: mx.array, mask: mx.array | None) -> bool:
    return mask is None and k.shape[-1] >= 32 and k.shape[-1] % 32 == 0


def cuda_gated_delta(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
                     state: mx.array) -> tuple[mx.array, mx.array]:
    """Run the recurrence over T tokens with :data:`CUDA_SOURCE` (CUDA backend only).

    Shapes (mlx-lm's ``gated_delta_ops``): q, k ``(B, T, Hk, Dk)``; v ``(B, T, Hv, Dv)``;
    g, beta ``(B, T, Hv)`` (a scalar gate per head); state ``(B, Hv, Dv, Dk)`` (float32 in
    practice). ``Hv`` must be a multiple of ``Hk`` and ``Dk`` a multiple of 32.

    Returns:
        y ``(B, T, Hv, Dv)`` in q's dtype and the final state in the state's dtype.

    Raises:
        ValueError: shapes outside the above.
    """
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2:]
    if Dk % 32 or Hv % Hk or g.ndim != 3 or state.shape != (B, Hv, Dv, Dk):
        raise ValueError(
            f"gated delta kernel: unsupported shapes q/k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"g {tuple(g.shape)}, state {tuple(state.shape)}"
        )
    return _kernel()(**_call_args(q, k, v, g, beta, state))


def _call_args(q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array,
               state: mx.array) -> dict:
    """The keyword arguments of :func:`cuda_gated_delta`'s kernel call (shapes checked)."""
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2:]
    return dict(
        inputs=[q, k, v, g, beta, state],
        template=[("InT", q.dtype), ("StT", state.dtype), ("Dk", Dk), ("Dv", Dv),
                  ("Hk", Hk), ("Hv", Hv)],
        grid=(32, Dv, B * Hv),
        threadgroup=(32, 4, 1),
        output_shapes=[(B, T, Hv, Dv), state.shape],
        output_dtypes=[q.dtype, state.dtype],
    )


def instance_call(dtype: mx.Dtype, dk: int, dv: int, hk: int, hv: int) -> tuple:
    """``(kernel, keyword arguments)`` of a one-token call with the dtypes a reply passes (q,
    k, v and beta in the activation ``dtype``, g and the state float32) and these head
    sizes and counts: the instance a Gated DeltaNet layer of those shapes runs (the
    template holds them; ``app.engine.kernels.custom_cache.build`` compiles it ahead of a
    run, and the warm-up runs it)."""
    qk = mx.zeros((1, 1, hk, dk), dtype=dtype)
    return _kernel(), _call_args(qk, qk, mx.zeros((1, 1, hv, dv), dtype=dtype),
                                 mx.zeros((1, 1, hv), dtype=mx.float32),
                                 mx.zeros((1, 1, hv), dtype=dtype),
                                 mx.zeros((1, hv, dv, dk), dtype=mx.float32))


def gated_delta_update(q: mx.array, k: mx.array, v: mx.array, a: mx.array, b: mx.array,
                       A_log: mx.array, dt_bias: mx.array, state: mx.array | None = None,
                       mask: mx.array | None = None, *, use_kernel: bool = True
                       ) -> tuple[mx.array, mx.array]:
    """mlx-lm 0.32's ``gated_delta_update`` (same arguments and results), with
    :func:`cuda_gated_delta` on MLX's CUDA backend.

    ``beta = sigmoid(b)`` and ``g = compute_g(A_log, a, dt_bias)`` are computed as mlx-lm
    computes them. Off CUDA, with ``use_kernel=False``, a padding mask or a key head dim the
    kernel does not take, it is mlx-lm's function itself.
    """
    if not (use_kernel and kernel_active() and _kernel_fits(k, mask)):
        return _mlx_lm_update(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel)
    beta = mx.sigmoid(b)
    g = compute_g(A_log, a, dt_bias)
    if state is None:
        B, _, _, Dk = q.shape
        Hv, Dv = v.shape[-2:]
        state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
    return cuda_gated_delta(q, k, v, g, beta, state)
