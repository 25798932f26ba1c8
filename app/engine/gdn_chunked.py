"""Chunked (parallel-in-time) Gated DeltaNet recurrence for multi-token passes off Metal.

mlx-lm runs the gated delta rule one token at a time when no Metal kernel is available
(``mlx_lm.models.gated_delta.gated_delta_ops``): a T-token verify block costs T sequential
steps per layer. :func:`chunked_gated_delta` computes the same outputs and final state with a
few batched matrix products per chunk of tokens.

Algorithm sources: the chunkwise / WY (UT-transform) form of the delta rule from Yang, Wang,
Zhang, Shen, Kim, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
NeurIPS 2024, with the scalar decay of Yang, Kautz, Hatamizadeh, "Gated Delta Networks:
Improving Mamba2 with Delta Rule", ICLR 2025. The derivation below and the code are written for
this project.

Derivation (one batch entry and head; state ``S`` is ``[Dv, Dk]`` as in mlx-lm)::

    S_t = g_t S_{t-1} + u_t k_t^T,   u_t = beta_t (v_t - g_t S_{t-1} k_t),   y_t = S_t q_t

Inside a chunk that starts from state ``S_0`` (tokens ``t = 0..C-1``), write
``gam_t = g_0 ... g_t`` and ``P[t, j] = g_{j+1} ... g_t`` for ``j <= t`` (``P[t, t] = 1``).
Unrolling gives ``g_t S_{t-1} = gam_t S_0 + sum_{j<t} P[t, j] u_j k_j^T``, so the
pseudo-values ``u`` solve the unit lower triangular system

    (I + A) U = diag(beta) V - diag(beta * gam) K S_0^T,
    A[t, j] = beta_t P[t, j] (k_t . k_j)   for j < t, else 0,

and, with ``Tinv = (I + A)^{-1}``,

    U     = Tinv diag(beta) V  -  Tinv diag(beta * gam) K  S_0^T
    Y     = diag(gam) Q S_0^T  +  (P o Q K^T, lower triangular incl. diagonal) U
    S_new = gam_{C-1} S_0      +  U^T diag(P[C-1, :]) K.

Everything that does not involve ``S_0`` is computed for all chunks at once; only the three
lines above run chunk after chunk, rearranged so that each chunk needs two products with the
state: ``[W; diag(gam) Q - M W] S_0^T`` (``W = Tinv diag(beta gam) K``, ``M`` the masked
score matrix) and ``U^T diag(P[C-1, :]) K``. Masked steps and the padding of the last chunk
are steps with ``g = 1, beta = 0``, which leave the state exactly as it was. ``P`` is built with a cumulative product of a masked
``[C, C]`` matrix (never a ratio ``gam_t / gam_j``), so decays near 0 underflow to 0 the way
the step loop does instead of dividing by 0. ``Tinv`` comes from LAPACK's triangular inverse
on the CPU device and from a blocked recursive inverse (2 matrix products per level) on other
devices; both are exact up to rounding, unlike a truncated Neumann series whose terms grow
like binomial coefficients when keys in a chunk are alike.

Vector gating (``g`` of shape ``[B, T, Hv, Dk]``, decay per key channel) uses the same
formulas with ``P[t, j]`` and ``gam_t`` vectors over ``Dk``: ``A`` and the intra-chunk
scores become ``sum_d k_t[d] P[t, j, d] k_j[d]``, which costs ``C * C * Dk`` per chunk and
head (memory is bounded by processing chunks in groups).

Use: :func:`chunked_gated_delta_update` takes the arguments of mlx-lm's
``gated_delta_update`` and can replace it in a GDN layer's forward pass.
"""

from __future__ import annotations

import math
from functools import partial

import mlx.core as mx
from mlx_lm.models.gated_delta import compute_g, compute_lower_bound_g, gated_delta_update

__all__ = ["chunked_gated_delta", "chunked_gated_delta_update"]

# Largest number of float32 elements the vector-gating path materialises at once for its
# [n, B, Hk, r, C, C, Dk] decay tensor (about 64 MiB).
_VECTOR_GROUP_ELEMENTS = 16 * 1024 * 1024

# mx.compile'd cores keyed by (chunk, has_mask, device); mx.compile retraces per input shape.
_COMPILED: dict = {}


def _unit_lower_inverse(a: mx.array) -> mx.array:
    """Return ``(I + a)^{-1}`` for strictly lower triangular ``a`` of shape ``[..., C, C]``.

    float32 in, float32 out. On the CPU device this is ``mx.linalg.tri_inv`` (LAPACK
    ``strtri``); elsewhere :func:`_block_unit_lower_inverse` (matrix products only).
    """
    if mx.default_device() == mx.cpu:
        rows = mx.arange(a.shape[-1])
        return mx.linalg.tri_inv(mx.where(rows[:, None] == rows[None, :], 1.0, a), upper=False)
    return _block_unit_lower_inverse(a)


def _block_unit_lower_inverse(a: mx.array) -> mx.array:
    """Return ``(I + a)^{-1}`` for strictly lower triangular ``a`` (``[..., C, C]``, float32).

    Recursive block inversion: for ``L = [[L11, 0], [L21, L22]]``,
    ``L^{-1} = [[L11^{-1}, 0], [-L22^{-1} L21 L11^{-1}, L22^{-1}]]``. Starting from 1x1
    diagonal blocks (whose inverse is 1), each level merges neighbouring blocks with two
    batched matrix products, so ``ceil(log2 C)`` levels in all. ``C`` is padded to a power of
    two with identity rows, which does not change the leading ``C x C`` block of the inverse.
    """
    c = a.shape[-1]
    batch = a.shape[:-2]
    size = 1 << max(0, math.ceil(math.log2(c)))
    if size != c:
        pad = [(0, 0)] * len(batch) + [(0, size - c), (0, size - c)]
        a = mx.pad(a, pad)
    # inv: the inverses of the current diagonal blocks, [..., n_blocks, b, b]
    inv = mx.ones((*batch, size, 1, 1), dtype=a.dtype)
    b = 1
    while b < size:
        n_pairs = size // (2 * b)
        # Diagonal 2b x 2b blocks of a: [..., n_pairs, 2b, 2b]
        blocks = a.reshape(*batch, n_pairs, 2 * b, n_pairs, 2 * b)
        blocks = mx.moveaxis(mx.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)
        l21 = blocks[..., b:, :b]
        pair = inv.reshape(*batch, n_pairs, 2, b, b)
        inv11, inv22 = pair[..., 0, :, :], pair[..., 1, :, :]
        lower = -(inv22 @ (l21 @ inv11))
        top = mx.concatenate([inv11, mx.zeros_like(inv11)], axis=-1)
        bottom = mx.concatenate([lower, inv22], axis=-1)
        inv = mx.concatenate([top, bottom], axis=-2)
        b *= 2
    return inv.reshape(*batch, size, size)[..., :c, :c]


def _chunk_terms(q, k, v, g, beta, *, vector: bool):
    """State-independent terms of a group of chunks (chunk index first, heads grouped).

    Inputs are float32: q, k ``[n, B, Hk, 1, C, Dk]``; v ``[n, B, Hk, r, C, Dv]``;
    g ``[n, B, Hk, r, C]`` (scalar) or ``[n, B, Hk, r, C, Dk]`` (vector); beta
    ``[n, B, Hk, r, C]``, where ``r = Hv // Hk`` value heads share a key head.
    Returns ``(ub, yb, lhs, kl, glast)``, each with leading ``[n, B, Hk, r]``:

    - ``ub = Tinv diag(beta) V`` ``[C, Dv]`` and ``yb = M ub`` ``[C, Dv]`` where ``M`` is the
      masked intra-chunk score matrix ``P o Q K^T`` (lower triangular incl. diagonal);
    - ``lhs = [W; diag(gam) Q - M W]`` ``[2C, Dk]`` with ``W = Tinv diag(beta gam) K``, so that
      ``lhs S_0^T`` gives ``[W S_0^T; Y - yb]`` in one product, and ``U = ub - W S_0^T``;
    - ``kl = diag(P[C-1, :]) K`` ``[C, Dk]`` and ``glast = gam_{C-1}`` (``[1, 1]`` scalar,
      ``[1, Dk]`` vector), so ``S_new = glast * S_0 + U^T kl``.
    """
    c = q.shape[-2]
    dv = v.shape[-1]
    rows = mx.arange(c)
    strict = rows[:, None] > rows[None, :]
    lower = rows[:, None] >= rows[None, :]
    if vector:
        gam = mx.cumprod(g, axis=-2)  # [..., C, Dk]
        # decay[t, j, d] = prod_{j < s <= t} g_s[d]  (1 where t <= j; masked below)
        steps = mx.where(strict[:, :, None], g[..., :, None, :], 1.0)
        decay = mx.cumprod(steps, axis=-3)  # [..., C, C, Dk]
        kj = k[..., None, :, :]
        kk = ((k[..., :, None, :] * decay) * kj).sum(axis=-1)
        qk = ((q[..., :, None, :] * decay) * kj).sum(axis=-1)
        kb = k * (beta[..., None] * gam)
        qg = q * gam
        kl = k * decay[..., -1, :, :]
        glast = gam[..., -1:, :]
    else:
        gam = mx.cumprod(g, axis=-1)  # [..., C]
        steps = mx.where(strict, g[..., :, None], 1.0)
        decay = mx.cumprod(steps, axis=-2)  # [..., C, C]
        scores = mx.concatenate([k, q], axis=-2) @ k.swapaxes(-1, -2)  # [n, B, Hk, 1, 2C, C]
        kk = scores[..., :c, :] * decay
        qk = scores[..., c:, :] * decay
        kb = k * (beta * gam)[..., None]
        qg = q * gam[..., None]
        kl = k * decay[..., -1, :][..., None]
        glast = gam[..., -1:, None]
    rhs = mx.concatenate([v * beta[..., None], kb], axis=-1)  # [..., C, Dv + Dk]
    if c > 1:
        a = mx.where(strict, beta[..., None] * kk, 0.0)
        rhs = _unit_lower_inverse(a) @ rhs
    qk = mx.where(lower, qk, 0.0)
    ub, w = rhs[..., :dv], rhs[..., dv:]
    mixed = qk @ rhs
    yb, qw = mixed[..., :dv], mixed[..., dv:]
    lhs = mx.concatenate([w, qg - qw], axis=-2)
    return ub, yb, lhs, kl, glast


def _check_shapes(q, k, v, g, beta, state, mask) -> None:
    """Raise ValueError when the inputs do not have ``gated_delta_ops``'s shapes."""
    if q.ndim != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, Hk, Dk]; got {q.shape} and {k.shape}")
    b, t, hk, dk = q.shape
    if v.ndim != 4 or v.shape[:2] != (b, t):
        raise ValueError(f"v must be [B, T, Hv, Dv] with B, T = {b, t}; got {v.shape}")
    hv, dv = v.shape[2:]
    if hk == 0 or hv % hk != 0:
        raise ValueError(f"Hv ({hv}) must be a multiple of Hk ({hk})")
    if beta.shape != (b, t, hv):
        raise ValueError(f"beta must be {(b, t, hv)}; got {beta.shape}")
    if g.shape not in ((b, t, hv), (b, t, hv, dk)):
        raise ValueError(f"g must be {(b, t, hv)} or {(b, t, hv, dk)}; got {g.shape}")
    if state is not None and state.shape != (b, hv, dv, dk):
        raise ValueError(f"state must be {(b, hv, dv, dk)}; got {state.shape}")
    if mask is not None and mask.shape != (b, t):
        raise ValueError(f"mask must be {(b, t)}; got {mask.shape}")


def chunked_gated_delta(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array | None = None,
    mask: mx.array | None = None,
    chunk_size: int = 16,
    *,
    compiled: bool = False,
) -> tuple[mx.array, mx.array]:
    """Run the gated delta rule over T tokens in chunks; same contract as ``gated_delta_ops``.

    Shapes (mlx-lm's ``gated_delta_ops``):

    - ``q``, ``k``: ``[B, T, Hk, Dk]``, already normalised by the caller (mlx-lm's
      ``normalize_qk`` folds the ``Dk**-0.5`` readout scale into ``q``; no scale is applied
      here).
    - ``v``: ``[B, T, Hv, Dv]``; ``Hv`` must be a multiple of ``Hk`` (q and k heads are
      repeated ``Hv // Hk`` times, as mlx-lm does).
    - ``g``: decay in (0, 1], ``[B, T, Hv]`` (scalar gating, Qwen3-Next / Qwen3.5) or
      ``[B, T, Hv, Dk]`` (vector gating).
    - ``beta``: ``[B, T, Hv]``.
    - ``state``: ``[B, Hv, Dv, Dk]`` or None for zeros; computed in float32.
    - ``mask``: ``[B, T]`` bool or None. A masked step leaves the state unchanged and its
      output is 0 (as mlx-lm's Metal kernel; mlx-lm's ops loop also keeps the state but
      returns ``S q`` there, a value callers discard).
    - ``chunk_size``: tokens per chunk (>= 1); capped at T, so a verify block of T <= 16
      tokens is one chunk. Larger chunks mean fewer sequential state updates but ``O(C)``
      more work per token; for long prefills 64 measured faster than 16 here.
    - ``compiled``: run through ``mx.compile`` (one traced graph per chunk size, mask
      presence, device and input shapes, cached in this module), which fuses the many small
      ops: on this (shared, noisy) 2-core CPU 1.05-2.6x faster at the demo pair's head
      shape, no clear gain at Qwen3.5-4B's (``tools/bench_gdn.py``). Off by default because on the CPU backend
      every fused kernel is first built with the system C++ compiler (seconds each, cached
      under ``$TMPDIR/mlx``).

    Returns ``(y, new_state)``: ``y`` ``[B, T, Hv, Dv]`` in ``q.dtype`` and ``new_state``
    ``[B, Hv, Dv, Dk]`` float32. All arithmetic is float32; results agree with the step loop
    to float32 rounding (not bitwise).

    Raises:
        ValueError: shapes that do not fit together, or ``chunk_size < 1``.

    Algorithm: chunkwise WY / UT-transform form of the delta rule (Yang et al., NeurIPS 2024)
    with Gated DeltaNet's decay (Yang et al., ICLR 2025); see the module docstring for the
    derivation.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    _check_shapes(q, k, v, g, beta, state, mask)
    bsz, t_len, hk, dk = q.shape
    hv, dv = v.shape[2:]
    if state is None:
        state = mx.zeros((bsz, hv, dv, dk), dtype=mx.float32)
    if t_len == 0:
        return mx.zeros((bsz, 0, hv, dv), dtype=q.dtype), state.astype(mx.float32)
    chunk = min(chunk_size, t_len)
    args = (q, k, v, g, beta, state) + (() if mask is None else (mask,))
    if not compiled:
        return _chunked_core(*args, chunk=chunk)
    key = (chunk, mask is not None, str(mx.default_device()))
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = mx.compile(partial(_chunked_core, chunk=chunk))
    return fn(*args)


def chunked_gated_delta_update(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    a: mx.array,
    b: mx.array,
    A_log: mx.array,  # noqa: N803 (mlx-lm's parameter name)
    dt_bias: mx.array,
    state: mx.array | None = None,
    mask: mx.array | None = None,
    *,
    use_kernel: bool = True,
    lower_bound: float | None = None,
    allow_neg_eigval: bool = False,
    chunk_size: int = 16,
    min_tokens: int = 2,
    compiled: bool = False,
) -> tuple[mx.array, mx.array]:
    """Drop-in for mlx-lm 0.32's ``gated_delta_update`` that uses the chunked pass off Metal.

    Same arguments and results as ``mlx_lm.models.gated_delta.gated_delta_update``: q, k
    ``[B, T, Hk, Dk]`` normalised by ``normalize_qk``; v ``[B, T, Hv, Dv]``; a, b
    ``[B, T, Hv]`` (pre-activation decay and write-strength inputs); A_log, dt_bias ``[Hv]``;
    state ``[B, Hv, Dv, Dk]`` or None; mask ``[B, T]`` or None. Returns ``(y, state)`` with y
    ``[B, T, Hv, Dv]`` in q's dtype and the float32 state.

    beta and g are computed exactly as mlx-lm does (``sigmoid(b)``, doubled when
    ``allow_neg_eigval``; ``compute_g`` / ``compute_lower_bound_g``). The call is handed to
    mlx-lm unchanged when its Metal kernel would run (``use_kernel`` on a Metal GPU device)
    or when ``T < min_tokens`` (a single decode step is cheaper as mlx-lm's one step, and
    then matches plain decoding bit for bit); otherwise :func:`chunked_gated_delta` runs
    with ``chunk_size`` and ``compiled``. Masked steps output 0 on the chunked path (mlx-lm's
    ops loop returns ``S q`` there; its Metal kernel returns 0).

    Raises:
        ValueError: as :func:`chunked_gated_delta` for inconsistent shapes.
    """
    on_metal = mx.default_device() == mx.gpu and mx.metal.is_available()
    if (use_kernel and on_metal) or q.shape[1] < min_tokens:
        return gated_delta_update(
            q,
            k,
            v,
            a,
            b,
            A_log,
            dt_bias,
            state,
            mask,
            use_kernel=use_kernel,
            lower_bound=lower_bound,
            allow_neg_eigval=allow_neg_eigval,
        )
    beta = mx.sigmoid(b)
    if allow_neg_eigval:
        beta = beta * 2.0
    if lower_bound is None:
        g = compute_g(A_log, a, dt_bias)
    else:
        g = compute_lower_bound_g(A_log, a, dt_bias, lower_bound)
    return chunked_gated_delta(
        q, k, v, g, beta, state, mask, chunk_size=chunk_size, compiled=compiled
    )


def _chunked_core(q, k, v, g, beta, state, mask=None, *, chunk: int):
    """The computation behind :func:`chunked_gated_delta` (checked inputs, ``1 <= chunk <= T``).

    Arrays only (plus the static ``chunk``), so it can be traced by ``mx.compile``.
    """
    bsz, t_len, hk, dk = q.shape
    hv, dv = v.shape[2:]
    out_dtype = q.dtype
    f32 = mx.float32
    vector = g.ndim == 4
    q, k, v, g, beta, state = (x.astype(f32) for x in (q, k, v, g, beta, state))
    if mask is not None:
        keep = mask.astype(mx.bool_)
        # A masked step acts as g = 1, beta = 0: the state passes through unchanged.
        beta = mx.where(keep[..., None], beta, 0.0)
        g = mx.where(keep[..., None, None] if vector else keep[..., None], g, 1.0)

    c = chunk
    n_chunks = -(-t_len // c)
    pad = n_chunks * c - t_len
    if pad:
        # Padding steps: g = 1, beta = 0 (state unchanged), outputs dropped below.
        def padded(x, value):
            widths = [(0, 0)] * x.ndim
            widths[1] = (0, pad)
            return mx.pad(x, widths, constant_values=value)

        q, k, v, beta = padded(q, 0.0), padded(k, 0.0), padded(v, 0.0), padded(beta, 0.0)
        g = padded(g, 1.0)

    r = hv // hk

    def chunks_first(x, heads, group):
        # [B, T', H, ...] -> [n, B, Hk, group, C, ...]
        x = x.reshape(bsz, n_chunks, c, heads // group, group, *x.shape[3:])
        return x.transpose(1, 0, 3, 4, 2, *range(5, x.ndim))

    q, k = chunks_first(q, hk, 1), chunks_first(k, hk, 1)
    v, g, beta = (chunks_first(x, hv, r) for x in (v, g, beta))
    state = state.reshape(bsz, hk, r, dv, dk)

    if vector:
        group = max(1, _VECTOR_GROUP_ELEMENTS // (bsz * hv * c * c * dk))
    else:
        group = n_chunks
    ys = []
    for start in range(0, n_chunks, group):
        stop = min(start + group, n_chunks)
        terms = _chunk_terms(
            *(x[start:stop] for x in (q, k, v, g, beta)), vector=vector
        )
        per_chunk = zip(*(mx.split(x, stop - start, axis=0) for x in terms))
        for ub, yb, lhs, kl, glast in per_chunk:
            ub, yb, lhs, kl, glast = (x.squeeze(0) for x in (ub, yb, lhs, kl, glast))
            both = lhs @ state.swapaxes(-1, -2)  # [B, Hk, r, 2C, Dv]
            u = ub - both[..., :c, :]
            ys.append(yb + both[..., c:, :])
            state = state * glast + u.swapaxes(-1, -2) @ kl
    y = mx.stack(ys, axis=1)  # [B, n, Hk, r, C, Dv]
    y = mx.moveaxis(y, 4, 2).reshape(bsz, n_chunks * c, hv, dv)[:, :t_len]
    if mask is not None:
        y = mx.where(mask.astype(mx.bool_)[..., None, None], y, 0.0)
    return y.astype(out_dtype), state.reshape(bsz, hv, dv, dk)
