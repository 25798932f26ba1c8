"""The DFlash2 drafter in MLX (z-lab / Inco ``DFlash2DraftModel`` checkpoints), and the
distribution-exact acceptance rule its sampled proposals need.

Semantics, from the public reference code (z-lab's DFlash2 as the MLX/Swift ports, SpecForge
and the Qualcomm PyTorch port run it; summarised in ``shared/DFLASH_NOTES.md``, "DFlash2"):

* **Backbone** as DFlash (:mod:`app.engine.drafter`): context ``hidden_norm(fc(taps))``, the
  block ``[anchor] + [mask] * (L - 1)`` embedded with the target's table (times the optional
  ``input_embedding_scale``), Qwen3 layers whose attention takes queries from the block and
  keys/values from ``[proj(ctx); proj(block)]``, a final ``norm``, the target's LM head.
  The same :class:`~app.engine.drafter.DraftAttention` and context cache are reused.
* **Grouped dynamic causal convolution** around both sublayers of every layer
  (:class:`GroupedDynamicCausalConv`)::

      a, d = attention_conv.prepare(input_layernorm(x))   # conv side 0 on the input
      h = x + attention_conv.finish(self_attn(a, ctx), d)  # conv side 1 on the output
      m, e = mlp_conv.prepare(post_attention_layernorm(h))
      out = h + mlp_conv.finish(mlp(m), e)

  The dynamic deltas of both sides come from the *sublayer input* (one ``kernel_projection``).
  The convolution runs over the block rows only (the context rows are never convolved) and is
  zero-padded before the anchor row.
* **Candidate selector** (:class:`CandidateSelector`): per draft slot ``t = 1 .. L-1`` the
  target head's top-``selector_top_k`` tokens (logits times ``output_multiplier``, then the
  optional softcap ``cap * tanh(z / cap)``) are scored
  ``unary[c] + <A[prev] * (W h_t), B[c]>`` (``A`` = ``predecessor_codebook``, ``B`` =
  ``successor_codebook``, ``W`` = ``hidden_projection``, ``h_t`` the drafter's final state of
  slot ``t``); the slots are walked from the anchor (``prev`` = the anchor for slot 1, then the
  token chosen for the slot before), choosing the argmax, or at temperature ``T > 0`` sampling
  from ``softmax(score / T)`` and keeping those proposal probabilities ``q``.
* **Acceptance at T > 0** (:func:`accept_sampled`): standard speculative sampling (Leviathan et
  al. 2023, Chen et al. 2023) for an autoregressive proposal: draft ``x`` at slot ``i`` is
  accepted with probability ``min(1, p(x) / q(x))``, where ``p`` is the distribution the plain
  path samples from there (processors, filters and temperature of mlx-lm's sampler,
  :func:`make_target_probs`); on rejection the token is drawn from ``max(p - q, 0)``
  normalised over the **whole vocabulary** (``q = 0`` outside the candidates). Resampling on
  the candidate ids only (as some ports do) can never give a token outside the top-k and is
  not distribution-exact (``tests/test_dflash2.py`` shows it fails the test).

The published configs say ``is_causal: false`` (the block is bidirectional, as in DFlash); one
port reads a *missing* ``is_causal`` as "causal on sliding layers". This module keeps
:class:`~app.engine.drafter.DrafterConfig`'s reading (missing = false), which only affects
acceptance, never the output.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn

from app.engine.drafter import (
    DEFAULT_BLOCK_SIZE,
    DFlashDrafter,
    DrafterConfig,
    DraftLayer,
    common_fields,
)
from app.engine.errors import ModelLoadError, UnsupportedArchitectureError
from app.engine.target import compiled_layers_on, compiled_program

ARCHITECTURE = "DFlash2DraftModel"


@dataclass
class DFlash2Config(DrafterConfig):
    """A DFlash2 ``config.json``: the DFlash backbone fields (:func:`common_fields`) plus

    Attributes:
        conv_kernel_size: taps ``K`` of each convolution (``dflash_config.conv_kernel_size``;
            2 in published checkpoints): row ``t`` mixes rows ``t, t-1, .., t-K+1``.
        conv_group_size: channels sharing one dynamic delta (``conv_group_size``, 16); must
            divide ``hidden_size``.
        selector_rank: ``r`` of the selector's codebooks (``selector_rank``, 256).
        selector_top_k: candidates per slot (``selector_top_k``, 16), 1..vocab_size.
        output_multiplier: factor on the draft logits (``output_multiplier``, default 1).
        logit_softcap: ``final_logit_softcapping`` (or ``logit_softcap``); None = off.
        input_embedding_scale: factor on the block embeddings (default 1).

    Each is read from ``dflash_config`` first, then the top level (as the reference's
    ``_draft_value``).
    """

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    output_multiplier: float = 1.0
    logit_softcap: float | None = None
    input_embedding_scale: float = 1.0

    kind: ClassVar[str] = "dflash2"

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> DFlash2Config:
        """Parse and check a DFlash2 checkpoint config.

        Raises:
            UnsupportedArchitectureError: ``architectures`` does not name
                ``DFlash2DraftModel``, or the config asks for a variant this engine does not
                run (``attention_mode`` other than ``gqa``, ``shift_label``,
                ``pure_draft_prefix_len``, ``projector_type``).
            ModelLoadError: a field is missing, unreadable or out of range (the message
                names it).
        """
        archs = cfg.get("architectures") or []
        if ARCHITECTURE not in archs:
            raise UnsupportedArchitectureError(
                f"drafter architecture {(archs or [None])[0]!r} is not {ARCHITECTURE}"
            )
        fields = common_fields(cfg)
        dflash = cfg.get("dflash_config") or {}

        def pick(name, default=None):
            return dflash[name] if name in dflash else cfg.get(name, default)

        def need(name):
            value = pick(name)
            if value is None:
                raise ModelLoadError(f"DFlash2 drafter config.json lacks the field {name}")
            return value

        def as_int(name, value, low, high=None):
            try:
                if isinstance(value, bool) or int(value) != value:
                    raise ValueError
                value = int(value)
            except (TypeError, ValueError):
                raise ModelLoadError(
                    f"DFlash2 drafter config.json: {name} is {value!r}, not an integer"
                ) from None
            if value < low or (high is not None and value > high):
                rng = f"at least {low}" if high is None else f"in {low}..{high}"
                raise ModelLoadError(
                    f"DFlash2 drafter config.json: {name} is {value}, it must be {rng}"
                )
            return value

        def as_float(name, value):
            try:
                out = float(value)
            except (TypeError, ValueError):
                raise ModelLoadError(
                    f"DFlash2 drafter config.json: {name} is {value!r}, not a number"
                ) from None
            if not math.isfinite(out):
                raise ModelLoadError(f"DFlash2 drafter config.json: {name} is {value!r}")
            return out

        for key, allowed in (("attention_mode", (None, "gqa")), ("shift_label", (None, False)),
                             ("pure_draft_prefix_len", (None, 0)), ("projector_type", (None,))):
            if pick(key) not in allowed:
                raise UnsupportedArchitectureError(
                    f"DFlash2 drafter with {key}={pick(key)!r} is not supported "
                    "(this engine runs the published gqa variant)"
                )
        hidden, vocab = fields["hidden_size"], fields["vocab_size"]
        as_int("block_size", pick("block_size", DEFAULT_BLOCK_SIZE), 2)
        as_int("mask_token_id", fields["mask_token_id"], 0, vocab - 1)
        kernel = as_int("conv_kernel_size", need("conv_kernel_size"), 1)
        group = as_int("conv_group_size", need("conv_group_size"), 1, hidden)
        if hidden % group:
            raise ModelLoadError(
                f"DFlash2 drafter config.json: conv_group_size {group} does not divide "
                f"hidden_size {hidden}"
            )
        rank = as_int("selector_rank", need("selector_rank"), 1)
        top_k = as_int("selector_top_k", need("selector_top_k"), 1, vocab)
        mult = as_float("output_multiplier", pick("output_multiplier", 1.0))
        cap = pick("final_logit_softcapping", pick("logit_softcap"))
        if cap is not None:
            cap = as_float("final_logit_softcapping", cap)
            if cap <= 0:
                raise ModelLoadError(
                    f"DFlash2 drafter config.json: final_logit_softcapping is {cap}, it must "
                    "be > 0 (or absent)"
                )
        scale = as_float("input_embedding_scale", pick("input_embedding_scale", 1.0))
        bad = [t for t in fields["layer_types"]
               if t not in ("sliding_attention", "full_attention")]
        if bad:
            raise ModelLoadError(f"DFlash2 drafter config.json: unknown layer type {bad[0]!r}")
        if "sliding_attention" in fields["layer_types"] and fields["sliding_window"] is None \
                and cfg.get("use_sliding_window") is not False:
            raise ModelLoadError(
                "DFlash2 drafter config.json has sliding_attention layers but no sliding_window"
            )
        return cls(
            **fields,
            conv_kernel_size=kernel,
            conv_group_size=group,
            selector_rank=rank,
            selector_top_k=top_k,
            output_multiplier=mult,
            logit_softcap=cap,
            input_embedding_scale=scale,
        )


def causal_shift(x: mx.array, j: int) -> mx.array:
    """``x`` ``(B, L, H)`` moved ``j`` rows later along L, zeros in the first ``j`` rows (row
    ``t`` of the result is row ``t - j`` of ``x``: zero-padding before the anchor)."""
    if j == 0:
        return x
    B, L, H = x.shape
    if j >= L:
        return mx.zeros_like(x)
    return mx.concatenate([mx.zeros((B, j, H), dtype=x.dtype), x[:, : L - j]], axis=1)


class GroupedDynamicCausalConv(nn.Module):
    """Depthwise causal convolution over the block rows with a learned per-channel kernel and a
    per-group dynamic delta (the reference's ``GroupedDynamicCausalConv``)::

        out[t, c] = sum_{j=0}^{K-1} (base[s, j, c] + delta[t, s, j, g(c)]) * x[t - j, c]

    with ``x[t - j] = 0`` for ``t - j < 0`` (before the anchor row), ``g(c) = c // group_size``
    and ``s`` the side (0: the sublayer's input, :meth:`prepare`; 1: its output,
    :meth:`finish`).

    Parameters (names and shapes as in the checkpoints):

    * ``base_kernel`` ``[2, K, H]``: axis 0 is the side ``s`` (2: before and after the
      sublayer; it equals ``K`` only because published checkpoints use ``K = 2``), axis 1 the
      tap offset ``j`` (0 = the row itself, ``j`` = the row ``j`` earlier), axis 2 the channel.
    * ``kernel_projection.weight`` ``[2 * K * G, H]`` (``G = H / group_size``; no bias): a
      linear map of the sublayer's (normed) input row ``t`` whose output is read as
      ``[2, K, G]`` = (side, tap offset, group): ``delta[t, s, j, g]``. Both sides' deltas come
      from the input, so :meth:`prepare` returns side 1's for :meth:`finish`. (1280 x 5120 in
      the Qwen3.8-27B checkpoint: 2 * 2 * 320 rows.)
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.group_size = group_size
        self.groups = hidden_size // group_size
        self.base_kernel = mx.zeros((2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups,
                                           bias=False)

    def convolve(self, x: mx.array, delta: mx.array, side: int) -> mx.array:
        """``x`` ``(B, L, H)``, ``delta`` ``(B, L, K, G)`` (one side) -> ``(B, L, H)``.

        Each group's delta is broadcast over its ``group_size`` channels (a view of ``x`` as
        ``(B, L, G, group_size)``), not repeated into a ``(B, L, H)`` copy."""
        B, L, H = x.shape
        grouped = (B, L, self.groups, self.group_size)
        out = None
        for j in range(min(self.kernel_size, L)):
            weight = self.base_kernel[side, j].astype(x.dtype).reshape(grouped[2:]) \
                + delta[:, :, j, :, None].astype(x.dtype)  # (B, L, G, group_size)
            term = weight * causal_shift(x, j).reshape(grouped)
            out = term if out is None else out + term
        return out.reshape(B, L, H)

    def prepare(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """Convolve the sublayer input ``x`` ``(B, L, H)`` (side 0); also return side 1's
        delta ``(B, L, K, G)`` for :meth:`finish`."""
        B, L, _ = x.shape
        delta = self.kernel_projection(x).reshape(B, L, 2, self.kernel_size, self.groups)
        return self.convolve(x, delta[:, :, 0], 0), delta[:, :, 1]

    def finish(self, y: mx.array, delta: mx.array) -> mx.array:
        """Convolve the sublayer output ``y`` ``(B, L, H)`` with side 1."""
        return self.convolve(y, delta, 1)


class DFlash2Layer(DraftLayer):
    """A :class:`~app.engine.drafter.DraftLayer` with ``attention_conv`` and ``mlp_conv``
    around its two sublayers (module docstring, "Grouped dynamic causal convolution")."""

    def __init__(self, cfg: DFlash2Config, layer_type: str):
        super().__init__(cfg, layer_type)
        H = cfg.hidden_size
        self.attention_conv = GroupedDynamicCausalConv(H, cfg.conv_kernel_size,
                                                       cfg.conv_group_size)
        self.mlp_conv = GroupedDynamicCausalConv(H, cfg.conv_kernel_size, cfg.conv_group_size)

    def __call__(self, x: mx.array, ctx: mx.array | None, cache) -> mx.array:
        if compiled_layers_on():
            q, k, v, d = compiled_program(self, "before_attention", _before_attention)(x)
            o = self.self_attn.attend(q, k, v, ctx, cache)
            return compiled_program(self, "after_attention", _after_attention)(x, o, d)
        a, d = self.attention_conv.prepare(self.input_layernorm(x))
        h = x + self.attention_conv.finish(self.self_attn(a, ctx, cache), d)
        return self._mlp_side(h)

    def _mlp_side(self, h: mx.array) -> mx.array:
        m, e = self.mlp_conv.prepare(self.post_attention_layernorm(h))
        return h + self.mlp_conv.finish(self.mlp(m), e)


def _before_attention(ref):
    """:class:`DFlash2Layer`'s part before its attention, as a function of arrays for
    :func:`~app.engine.target.compiled_program`: ``x`` -> the attention's ``(q, k, v)``
    (:meth:`~app.engine.drafter.DraftAttention.project` of the convolved input) and the
    output side's delta."""
    def before(x):
        layer = ref()
        a, d = layer.attention_conv.prepare(layer.input_layernorm(x))
        return (*layer.self_attn.project(a), d)
    return before


def _after_attention(ref):
    """:class:`DFlash2Layer`'s part after its attention: ``(x, o, d)`` -> the layer's output
    (``o`` from :meth:`~app.engine.drafter.DraftAttention.attend`, ``d`` from
    :func:`_before_attention`)."""
    def after(x, o, d):
        layer = ref()
        return layer._mlp_side(x + layer.attention_conv.finish(layer.self_attn.o_proj(o), d))
    return after


@functools.lru_cache(maxsize=64)
def _group_width(vocab: int, k: int) -> int | None:
    """The divisor of ``vocab`` nearest ``sqrt(vocab)`` that leaves at least ``k`` groups of
    at least ``k`` entries, or None (then one partition of the whole row is used)."""
    root = math.isqrt(vocab)
    for off in range(root):
        for d in (root - off, root + off + 1):
            if k <= d <= vocab // k and vocab % d == 0:
                return d
    return None


def top_k_indices(x: mx.array, k: int) -> mx.array:
    """Indices ``(n, k)`` of the ``k`` largest entries of each row of ``x`` ``(n, V)``, in no
    particular order (of exactly equal entries at the k-th place, any may be chosen).

    Two small partitions instead of one over the whole row: the row is cut into groups of
    ``g`` entries (:func:`_group_width`, ~sqrt(V)), the ``k`` groups with the largest maxima
    are kept (every top-k entry lies in one of them: an entry in another group would have
    ``k`` group maxima above it), and the top ``k`` of their ``k * g`` entries are taken.
    MLX's CPU ``argpartition`` costs ~14 ns an entry: on this project's 2-core CPU, 15 rows
    of the demo pair's 4,096 entries took 0.2-0.4 ms instead of 1.0, and of a 248,320-entry
    vocabulary (g = 485) 5-8 ms instead of 53 (medians of repeated calls, 2026-12-07;
    ``tests/test_dflash2.py`` checks the sets against a full sort).
    """
    n, V = x.shape
    g = _group_width(V, k) if k < V else None
    if g is None:
        return mx.argpartition(x, kth=V - k, axis=-1)[:, V - k:]
    groups = V // g
    xg = x.reshape(n, groups, g)
    best = mx.argpartition(xg.max(axis=-1), kth=groups - k, axis=-1)[:, groups - k:]
    sub = mx.take_along_axis(xg, best[:, :, None], axis=1).reshape(n, k * g)
    pos = mx.argpartition(sub, kth=k * g - k, axis=-1)[:, k * g - k:]
    return mx.take_along_axis(best, pos // g, axis=-1) * g + pos % g


def _walk(hidden: mx.array, logits: mx.array, anchor: mx.array,
          books: tuple[mx.array, mx.array, mx.array] | None, k: int, temperature: float
          ) -> tuple[mx.array, mx.array, mx.array | None]:
    """:meth:`CandidateSelector.walk`'s computation on bare arrays: ``anchor`` a 0-d int
    array, ``books`` the selector's ``(W [r, H], A [V, r], B [V, r])`` or None for no bigram
    term, ``k`` candidates per slot (<= V). Returns what ``walk`` returns."""
    n = logits.shape[0]
    if k < logits.shape[-1]:  # the top k without sorting the whole vocabulary
        top = top_k_indices(logits, k)
    else:
        top = mx.broadcast_to(mx.arange(k), (n, k))
    order = mx.argsort(-mx.take_along_axis(logits, top, axis=-1), axis=-1)
    cand = mx.take_along_axis(top, order, axis=-1).astype(mx.int32)  # descending logits
    unary = mx.take_along_axis(logits, cand, axis=-1)
    first, rest = unary[:1], unary[1:, None, :]  # (1, k); (n - 1, 1, k): any predecessor
    if books is not None:
        w, pred, succ_book = books
        proj = (hidden @ w.T).astype(mx.float32)  # (n, r)
        succ = succ_book[cand].astype(mx.float32)  # (n, k, r)
        # predecessor rows gathered first, then cast (V x r is big)
        first = first + (pred[anchor].astype(mx.float32) * proj[0])[None] @ succ[0].T
        rest = rest + (pred[cand[:-1]].astype(mx.float32) * proj[1:, None, :]) \
            @ succ[1:].swapaxes(1, 2)
    rest = mx.broadcast_to(rest, (n - 1, k, k))  # [slot, predecessor index, candidate]
    if temperature > 0:
        first, rest = first * (1.0 / temperature), rest * (1.0 / temperature)
        j0 = mx.random.categorical(first)  # (1,)
        table = mx.random.categorical(rest) if n > 1 else None
    else:
        j0 = mx.argmax(first, axis=-1)
        table = mx.argmax(rest, axis=-1) if n > 1 else None
    table = mx.zeros((0, k), mx.int32) if table is None else table.astype(mx.int32)
    span = 1  # table[i] maps slot i's choice to slot i + 1's, over `span` slots
    while span < n - 1:
        table = mx.concatenate(
            [table[:span], mx.take_along_axis(table[span:], table[:-span], axis=-1)])
        span *= 2
    index = mx.concatenate([j0.astype(mx.int32), table[:, j0[0]]])  # (n,) into cand rows
    drafts = mx.take_along_axis(cand, index[:, None], axis=-1)[:, 0]
    q = None
    if temperature > 0:
        rows = mx.take_along_axis(rest, index[:-1, None, None], axis=1)[:, 0]
        q = mx.softmax(mx.concatenate([first, rows]), axis=-1)
    return drafts, cand, q


@mx.compile
def _greedy_walk(hidden: mx.array, logits: mx.array, anchor: mx.array,
                 books: tuple[mx.array, mx.array, mx.array] | None, k: int
                 ) -> tuple[mx.array, mx.array]:
    """The greedy :func:`_walk` as one ``mx.compile`` program, traced once per slot count,
    ``k`` and dtype, and replayed after that (its ~40 small operations cost one dispatch
    each when run op by op: on the demo pair the walk took 1.0 ms that way on this project's
    2-core CPU against 0.65 ms compiled, medians of 50, ``.prof``-style micro-benchmark).
    Not used on MLX's CUDA backend (:func:`_on_cuda`): there a program's fused modules are
    compiled by NVRTC the first time on a host, and on a fresh H100 the first compiled walk
    took 22.9 s, to save 0.13 ms a draft after that (0.39 ms against 0.51 op by op, demo
    pair, 15 slots; ``.prof``-style script, 2026-12-07).
    Returns ``(drafts (n,) int32, candidates (n, k) int32)``."""
    drafts, cand, _ = _walk(hidden, logits, anchor, books, k, 0.0)
    return drafts, cand


@functools.lru_cache(maxsize=1)
def _on_cuda() -> bool:
    """True when MLX's default device runs on its CUDA backend (asked once a process)."""
    from app.engine.device import backend

    return backend() == "CUDA"


class CandidateSelector(nn.Module):
    """The bigram rescorer over each slot's top-k target-head candidates.

    Parameters: ``hidden_projection.weight`` ``[r, H]`` (``W``), ``predecessor_codebook``
    ``[V, r]`` (``A``) and ``successor_codebook`` ``[V, r]`` (``B``), the codebooks stored as
    bare tensors (no ``.weight``).
    """

    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.predecessor_codebook = mx.zeros((vocab_size, rank))
        self.successor_codebook = mx.zeros((vocab_size, rank))

    def walk(self, hidden: mx.array, logits: mx.array, anchor: int, top_k: int,
             temperature: float = 0.0, pairwise: bool = True
             ) -> tuple[mx.array, mx.array, mx.array | None]:
        """Choose one token per slot, walking from the anchor.

        Args:
            hidden: ``(n, H)`` the drafter's final states of slots 1..n.
            logits: ``(n, V)`` float32 draft logits of those slots (after multiplier/softcap).
            anchor: the block's first token (the predecessor of slot 1).
            top_k: candidates per slot (the target head's ``top_k`` largest logits, sorted
                descending; the first wins an exact tie of scores).
            temperature: 0 = argmax of the scores; > 0 = sample from ``softmax(score / T)``
                with ``mx.random``.
            pairwise: False drops the bigram term (score = unary): "selector off".

        Returns:
            ``(drafts (n,) int32, candidates (n, top_k) int32, q (n, top_k) float32 or None)``
            lazily; ``q[i]`` is the probability slot ``i``'s proposal gave each candidate
            (given the tokens chosen for the earlier slots); None when greedy.

        The walk is sequential (slot ``i``'s scores depend on slot ``i - 1``'s choice), but
        each slot has only ``top_k`` possible predecessors. So every slot's choice is made
        at once for each of them (a ``(n - 1, k)`` table of choices, by argmax or by one
        independent draw per row), and the path from the anchor is read off the table by
        composing its rows in ``log2(n)`` gathers (an inclusive prefix scan of function
        composition, Hillis and Steele 1986). This gives the same choices as walking slot by
        slot, in a fixed, small number of array operations and no host round trip; a draw
        made for a predecessor the path does not take is never used, so each slot's token is
        still drawn from ``softmax(score / T)`` of the path's own predecessor.
        """
        k = min(top_k, logits.shape[-1])
        books = ((self.hidden_projection.weight, self.predecessor_codebook,
                  self.successor_codebook) if pairwise else None)
        if temperature > 0 or _on_cuda():  # mx.random draws; see _greedy_walk on CUDA
            return _walk(hidden, logits, mx.array(anchor), books, k, temperature)
        drafts, cand = _greedy_walk(hidden, logits, mx.array(anchor), books, k)
        return drafts, cand, None


class DFlash2Drafter(DFlashDrafter):
    """The DFlash2 drafter network; parameter names match ``DFlash2DraftModel``'s
    ``model.safetensors`` (the DFlash names plus ``layers.{i}.attention_conv.*``,
    ``layers.{i}.mlp_conv.*`` and ``candidate_selector.*``)."""

    layer_class: ClassVar[type] = DFlash2Layer

    def __init__(self, cfg: DFlash2Config):
        super().__init__(cfg)
        self.candidate_selector = CandidateSelector(cfg.hidden_size, cfg.vocab_size,
                                                    cfg.selector_rank)

    def draft_logits(self, runner, hidden: mx.array) -> mx.array:
        """Float32 logits ``(..., V)`` of final states ``(..., H)`` through the target's head,
        times ``output_multiplier``, then ``cap * tanh(logits / cap)`` when a softcap is set
        (the reference's ``compute_logits``)."""
        cfg = self.config
        logits = runner.lm_head(hidden).astype(mx.float32)
        if cfg.output_multiplier != 1.0:
            logits = logits * cfg.output_multiplier
        if cfg.logit_softcap is not None:
            logits = mx.tanh(logits / cfg.logit_softcap) * cfg.logit_softcap
        return logits

    def propose(self, runner, pending: int, length: int, taps: mx.array | None, cache,
                temperature: float = 0.0, selector: bool = True
                ) -> tuple[mx.array, mx.array, mx.array | None]:
        """One draft pass and the selector's walk: ``length - 1`` proposed tokens after
        ``pending``.

        Args:
            runner: the target's :class:`~app.engine.target.TargetRunner` (embedding, head).
            pending: the anchor (last committed token, not yet in the target cache).
            length: block length L >= 2.
            taps: tap states ``(1, C, n_taps * H)`` of positions newly committed, or None.
            cache: this drafter's context cache (:meth:`make_cache`).
            temperature: 0 greedy walk; > 0 sampled walk (proposal probabilities kept).
            selector: False scores candidates by their logits only (no bigram term).

        Returns:
            ``(drafts (L-1,) int32, candidates (L-1, top_k) int32, q (L-1, top_k) or None)``,
            lazily (see :meth:`CandidateSelector.walk`).
        """
        cfg = self.config
        ids = mx.array([[pending] + [cfg.mask_token_id] * (length - 1)], dtype=mx.int32)
        emb = runner.embed_tokens(ids)
        if cfg.input_embedding_scale != 1.0:
            emb = emb * cfg.input_embedding_scale
        hidden = self(emb, taps, cache)[0, 1:]
        logits = self.draft_logits(runner, hidden)
        return self.candidate_selector.walk(
            hidden, logits, pending, cfg.selector_top_k, temperature, pairwise=selector
        )

    def draft(self, runner, pending: int, length: int, taps: mx.array | None, cache) -> mx.array:
        """Greedy drafts ``(length - 1,)`` (the selector's argmax walk); the same interface as
        :meth:`app.engine.drafter.DFlashDrafter.draft`."""
        return self.propose(runner, pending, length, taps, cache)[0]


def expected_shapes(cfg: DFlash2Config) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of a DFlash2 checkpoint of this config."""
    from app.engine.drafter import expected_shapes as shapes

    return shapes(cfg, DFlash2Drafter)


# --- sampling: the target's distribution and the acceptance rule ---------------------------


def make_target_probs(config) -> Any:
    """``probs(logits (V,), history list[int]) -> (V,) float32``: the distribution the plain
    path's sampler draws from at temperature ``config.temperature > 0``.

    The same steps as :func:`app.engine.generate._make_choose` (mlx-lm 0.32's
    ``make_logits_processors`` then ``make_sampler``): the repetition penalty on the logits,
    log-softmax, the filters ``apply_top_p``, ``apply_min_p``, ``apply_top_k`` in the order
    ``make_sampler`` chains them, then ``softmax(logprobs / T)``, which is what
    ``categorical_sampling`` samples from.
    """
    from mlx_lm.sample_utils import (
        apply_min_p,
        apply_top_k,
        apply_top_p,
        make_logits_processors,
    )

    processors = make_logits_processors(
        None, config.repetition_penalty, config.repetition_context_size
    )
    filters = []
    if 0 < config.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, config.top_p))
    if config.min_p != 0.0:
        filters.append(lambda x: apply_min_p(x, config.min_p, 1))
    if config.top_k > 0:
        filters.append(lambda x: apply_top_k(x, config.top_k))
    temp = float(config.temperature)

    def probs(logits: mx.array, history: list[int]) -> mx.array:
        logits = logits[None]
        if processors:
            tokens = mx.array(history, dtype=mx.int32)
            for proc in processors:
                logits = proc(tokens, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        for f in filters:
            logprobs = f(logprobs)
        return mx.softmax((logprobs * (1.0 / temp)).astype(mx.float32), axis=-1)[0]

    return probs


def residual_sample(p: mx.array, candidates: mx.array, q: mx.array) -> int:
    """A token from ``max(p - q, 0)`` normalised over the whole vocabulary.

    Args:
        p: ``(V,)`` float32 target probabilities at the rejected slot.
        candidates: ``(k,)`` int32 the slot's candidate ids (distinct); ``q`` ``(k,)`` their
            proposal probabilities (``q = 0`` for every other id).

    Returns the sampled id (``mx.random``). When the residual has no mass (``p <= q``
    everywhere, which a rejection makes impossible up to rounding) it samples from ``p``.
    """
    q_full = mx.zeros_like(p).at[candidates].add(q.astype(p.dtype))
    residual = mx.maximum(p - q_full, 0.0)
    if float(residual.sum().item()) <= 0.0:
        residual = p
    return int(mx.random.categorical(mx.log(residual)).item())


def accept_sampled(probs, vlogits: mx.array, drafts: list[int], candidates: mx.array,
                   q: mx.array, history: list[int], choose, resample=None
                   ) -> tuple[int, int]:
    """Speculative sampling over one verified block (module docstring, "Acceptance").

    Args:
        probs: from :func:`make_target_probs`.
        vlogits: ``(L, V)`` the verify pass's logits (row ``i`` predicts the token after
            ``history + drafts[:i]``).
        drafts: the ``L - 1`` proposed ids; ``candidates``/``q``: ``(L-1, k)`` from the walk.
        history: every token before the block's first draft (prompt + committed).
        choose: the plain path's ``(logits, history) -> int`` sampler, used for the bonus
            token after a fully accepted block (a sample from ``p`` there).
        resample: ``(p, candidates, q) -> int`` on rejection; :func:`residual_sample`
            (looked up at call time, so tests can swap it).

    Returns:
        ``(accepted, token)``: the number of drafts accepted and the token that follows them
        (the residual sample at the first rejection, or the bonus).
    """
    resample = resample or residual_sample
    q_host = q.tolist()
    cand_host = candidates.tolist()
    for i, x in enumerate(drafts):
        p = probs(vlogits[i], history + drafts[:i])
        px = float(p[x].item())
        qx = q_host[i][cand_host[i].index(x)]
        u = float(mx.random.uniform().item())
        if (qx <= 0.0 and px > 0.0) or (qx > 0.0 and u < min(1.0, px / qx)):
            continue
        return i, resample(p, candidates[i], q[i])
    n = len(drafts)
    return n, choose(vlogits[n], history + drafts)
