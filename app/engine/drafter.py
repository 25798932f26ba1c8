"""The DFlash drafter in MLX (z-lab ``DFlashDraftModel`` checkpoints).

Architecture (Chen et al. 2026, "DFlash: Block Diffusion for Flash Speculative Decoding";
z-lab's reference implementation; summarised in ``shared/DFLASH_NOTES.md``):

* context ``ctx = hidden_norm(fc(concat(taps)))``: ``taps`` are the residual-stream outputs of
  the target's decoder layers ``target_layer_ids`` (0-based, before the final norm), shape
  ``(B, C, len(taps) * hidden)``;
* the block ``[last token] + [mask] * (B - 1)`` is embedded with the **target's** embedding;
* every layer is a Qwen3 decoder layer whose attention takes queries from the (normed) block only
  and keys/values from ``[proj(ctx); proj(normed block)]``; ``ctx`` is not passed through the
  layer's input norm and is never updated from layer to layer; ``q_norm``/``k_norm`` are per-head
  RMSNorms and RoPE (mlx-lm's ``initialize_rope``, so ``rope_scaling`` is honoured) runs at
  absolute positions (context rows at their own positions, block rows continuing from the
  context length);
* attention is **non-causal in every layer** (z-lab's PyTorch drafter calls the attention
  function with ``is_causal=False``); ``sliding_attention`` layers pass ``sliding_window`` to it,
  which transformers' flash-attention path turns into flash-attn's
  ``window_size=(w - 1, w - 1)``: a query at position ``q`` sees the keys at positions ``k``
  with ``|q - k| <= w - 1``. See :func:`attention_visibility`;
* a final ``norm``; logits come from the **target's** LM head.

Only the context K/V are cached (after ``k_norm`` and RoPE), one :class:`DraftContextCache` per
layer; block K/V are recomputed every cycle. A sliding layer's cache keeps only the context rows
a later query can still see (plus a small trim margin), so its memory is bounded by the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from app.engine.errors import ModelLoadError, UnsupportedArchitectureError
from app.engine.modes import DEFAULT_BLOCK_SIZE
from app.engine.target import compiled_layers_on, compiled_program

SUPPORTED_ARCHITECTURE = "DFlashDraftModel"



def default_target_layer_ids(num_target_layers: int, count: int) -> list[int]:
    """Taps spread evenly from layer 1 to ``num_target_layers - 3`` (z-lab's default).

    E.g. 36 target layers and 5 taps give ``[1, 9, 17, 25, 33]`` (the Qwen3-8B drafter).
    """
    if count <= 1:
        return [1]
    start, end = 1, max(1, num_target_layers - 3)
    return [int(round(start + i * (end - start) / (count - 1))) for i in range(count)]


@dataclass
class DrafterConfig:
    """Fields of a z-lab DFlash ``config.json``, read defensively.

    ``block_size`` comes from ``dflash_config.block_size`` or the top-level ``block_size``
    (else :data:`DEFAULT_BLOCK_SIZE`);
    ``rope_theta`` from the top level or ``rope_parameters.rope_theta``; ``target_layer_ids`` from
    ``dflash_config`` or the top level, else :func:`default_target_layer_ids`.

    ``rope_scaling`` is the config's ``rope_scaling``, else its ``rope_parameters`` (the dict
    mlx-lm's ``qwen3.ModelArgs`` hands to ``initialize_rope``; a ``default`` rope type there
    gives plain RoPE). ``sliding_window`` is None when the config's ``use_sliding_window`` is
    false (transformers' ``Qwen3Config`` drops the window then) or no window is given; a config
    without ``use_sliding_window`` keeps its window (published sliding drafters say ``true``;
    ``Qwen3Config`` would default the key to false).
    ``is_causal`` is the config's ``is_causal`` (default False: the block is bidirectional in
    every layer, as z-lab's drafter runs it; a config that says ``is_causal: true`` gets a
    causal block in every layer, as the later z-lab code reads that key).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    max_position_embeddings: int = 40960
    model_type: str = "qwen3"
    rope_scaling: dict[str, Any] | None = None
    is_causal: bool = False

    #: Which draft the engine runs for this config (``"dflash"``; ``"dflash2"`` for
    #: :class:`app.engine.dflash2.DFlash2Config`).
    kind: ClassVar[str] = "dflash"

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> DrafterConfig:
        """Parse a checkpoint config dict.

        Raises:
            UnsupportedArchitectureError: ``architectures`` names another model (e.g.
                ``DFlash2DraftModel``: :class:`app.engine.dflash2.DFlash2Config` parses those).
            ModelLoadError: a required field is missing or has the wrong type.
        """
        archs = cfg.get("architectures") or []
        if archs and SUPPORTED_ARCHITECTURE not in archs:
            raise UnsupportedArchitectureError(
                f"drafter architecture {archs[0]!r} is not supported; this app runs "
                f"{SUPPORTED_ARCHITECTURE} checkpoints (z-lab DFlash) and DFlash2DraftModel "
                "checkpoints (z-lab DFlash2)"
            )
        return cls(**common_fields(cfg))


def common_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The :class:`DrafterConfig` fields of a DFlash or DFlash2 ``config.json`` dict (the
    backbone both share), as keyword arguments.

    Raises:
        ModelLoadError: a required field is missing or has the wrong type.
    """
    dflash = cfg.get("dflash_config") or {}

    def pick(name, default=None):
        if name in dflash:
            return dflash[name]
        return cfg.get(name, default)

    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        n_layers = int(cfg["num_hidden_layers"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta", 1_000_000.0))
        num_target_layers = pick("num_target_layers")
        taps = pick("target_layer_ids")
        if taps is None:
            if num_target_layers is None:
                raise KeyError("target_layer_ids (and num_target_layers to default it)")
            taps = default_target_layer_ids(int(num_target_layers), n_layers)
        mask_id = pick("mask_token_id")
        if mask_id is None:
            raise KeyError("mask_token_id")
        if int(pick("block_size", DEFAULT_BLOCK_SIZE)) < 1:
            raise ValueError(f"block_size is {pick('block_size')}, it must be at least 1")
        layer_types = list(cfg.get("layer_types") or ["full_attention"] * n_layers)
        if len(layer_types) != n_layers:
            raise ValueError(
                f"layer_types has {len(layer_types)} entries for {n_layers} layers"
            )
        sliding = cfg.get("sliding_window")
        if cfg.get("use_sliding_window") is False or sliding is None:
            sliding = None
        elif int(sliding) < 1:
            raise ValueError(f"sliding_window is {sliding}, it must be at least 1")
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is None and rope_params:
            rope_scaling = dict(rope_params)
        if rope_scaling is not None and not isinstance(rope_scaling, dict):
            raise TypeError(f"rope_scaling is {rope_scaling!r}, not an object")
        max_pos = int(cfg.get("max_position_embeddings", 40960))
        _make_rope(head_dim, float(rope_theta), rope_scaling, max_pos)  # refuse unknown types
        return dict(
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            vocab_size=int(cfg["vocab_size"]),
            block_size=int(pick("block_size", DEFAULT_BLOCK_SIZE)),
            mask_token_id=int(mask_id),
            target_layer_ids=[int(t) for t in taps],
            num_target_layers=None if num_target_layers is None else int(num_target_layers),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            attention_bias=bool(cfg.get("attention_bias", False)),
            layer_types=layer_types,
            sliding_window=None if sliding is None else int(sliding),
            max_position_embeddings=max_pos,
            model_type=str(cfg.get("model_type", "qwen3")),
            rope_scaling=rope_scaling,
            is_causal=bool(cfg.get("is_causal") or False),
        )
    except KeyError as exc:
        raise ModelLoadError(f"drafter config.json lacks the field {exc.args[0]}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"drafter config.json has an unreadable field: {exc}") from exc


def _make_rope(head_dim: int, theta: float, scaling: dict | None, max_pos: int) -> nn.Module:
    """The RoPE module mlx-lm builds for these settings (``rope_utils.initialize_rope``,
    non-traditional, as mlx-lm's qwen3 model passes it)."""
    return initialize_rope(
        head_dim,
        base=theta,
        traditional=False,
        scaling_config=scaling,
        max_position_embeddings=max_pos,
    )


def attention_visibility(
    q_start: int,
    q_len: int,
    k_start: int,
    k_len: int,
    window: int | None,
    causal: bool = False,
) -> mx.array | None:
    """Which keys each block query sees, by absolute position.

    Queries sit at positions ``q_start .. q_start + q_len - 1``; keys at the contiguous positions
    ``k_start .. k_start + k_len - 1`` (the kept context rows, then the block's own rows).
    Key ``k`` is visible to query ``q`` iff

    * ``|q - k| <= window - 1`` when ``window`` is set: flash-attn's ``window_size=(w - 1,
      w - 1)``, which transformers' flash-attention integration
      (``modeling_flash_attention_utils._flash_attention_forward``) passes for
      ``sliding_window=w`` and which z-lab's drafter hands it on ``sliding_attention`` layers
      (with a causal layer only the ``q - k <= w - 1`` side applies). transformers passes no
      window when there are at most ``w`` keys, which the rule gives as well;
    * ``k <= q`` only when ``causal`` (not the case for published DFlash drafters: the
      reference runs every layer with ``is_causal=False``).

    Returns:
        A ``(q_len, k_len)`` bool array (True = attend), or None when every key is visible
        to every query (the attention then runs without a mask).
    """
    far = (q_start + q_len - 1) - k_start  # the largest q - k
    near = q_start - (k_start + k_len - 1)  # the smallest q - k
    if not causal and (window is None or max(far, -near) <= window - 1):
        return None
    q_pos = q_start + mx.arange(q_len)[:, None]
    k_pos = k_start + mx.arange(k_len)[None, :]
    visible = mx.ones((q_len, k_len), dtype=mx.bool_)
    if causal:
        visible = visible & (k_pos <= q_pos)
    if window is not None:
        visible = visible & (q_pos - k_pos <= window - 1)
        if not causal:
            visible = visible & (k_pos - q_pos <= window - 1)
    return visible


#: Context rows a sliding layer keeps beyond its window, so that a trim (prefix reuse cutting
#: the last turn's tail) of up to this many positions stays exact.
TRIM_MARGIN = 256


class DraftContextCache:
    """One drafter layer's context K/V, at absolute positions ``start .. offset - 1``.

    ``keys``/``values`` are ``(B, n_kv_heads, capacity, head_dim)`` buffers (the model's dtype,
    after ``k_norm`` and RoPE) whose first ``offset - start`` rows are valid. ``offset`` is the
    number of context positions the cache covers (it equals the target cache's length, and is
    what :mod:`app.engine.prefix` and :mod:`app.engine.generate` read); ``start`` is the
    position of the oldest row still held.

    With ``window`` set (a sliding layer) a query at position ``q >= offset`` can only see keys
    ``k >= q - (window - 1)`` (:func:`attention_visibility`), so rows below
    ``offset - (window - 1) - margin`` are dropped when the buffer is reallocated (and appended
    rows older than that are never stored): the buffers hold at most
    ``window - 1 + margin + 2 * step`` rows, whatever the context length. The ``margin``
    rows keep :meth:`trim` exact for trims of up to ``margin`` positions; a deeper trim leaves
    the next queries without the dropped rows (see :attr:`exact`). Without a window nothing is
    dropped (``start`` stays 0), as mlx-lm's ``KVCache``.
    """

    step = 256

    def __init__(self, window: int | None = None, margin: int = TRIM_MARGIN):
        self.window = window
        self.margin = margin
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0
        self.start = 0

    @property
    def keep(self) -> int | None:
        """Rows always kept behind ``offset`` (None: all of them)."""
        return None if self.window is None else self.window - 1 + self.margin

    @property
    def size(self) -> int:
        """Valid rows held (``offset - start``)."""
        return self.offset - self.start

    def visible_start(self, q_start: int | None = None) -> int:
        """The oldest held position a query at ``q_start`` (default ``offset``) may see."""
        q = self.offset if q_start is None else q_start
        if self.window is None:
            return self.start
        return min(max(self.start, q - (self.window - 1)), self.offset)

    @property
    def exact(self) -> bool:
        """True when every key the reference would show a query at ``offset`` is held."""
        need = 0 if self.window is None else max(0, self.offset - (self.window - 1))
        return self.start <= need

    def can_trim_exactly(self, n: int) -> bool:
        """True when :meth:`trim` of ``n`` positions leaves the cache :attr:`exact`."""
        end = self.offset - min(n, self.offset)
        need = 0 if self.window is None else max(0, end - (self.window - 1))
        return self.start <= need

    def rows_to_skip(self, count: int) -> int:
        """Of ``count`` rows about to be appended, how many no later query can see."""
        keep = self.keep
        return 0 if keep is None else max(0, count - keep)

    def append(self, keys: mx.array, values: mx.array, skipped: int = 0) -> None:
        """Append context K/V ``(B, n_kv_heads, C, head_dim)`` for positions
        ``offset + skipped .. offset + skipped + C - 1``; ``skipped`` positions before them
        were dropped unseen (:meth:`rows_to_skip`)."""
        if skipped:
            self.offset += skipped
            self.start = self.offset  # every held row was older than the skipped ones
        count = keys.shape[2]
        if count == 0:
            return
        n = self.size
        cap = 0 if self.keys is None else self.keys.shape[2]
        if self.keys is None or n + count > cap:
            lo = self.start
            if self.keep is not None:
                lo = max(lo, self.offset + count - self.keep)
            held_k = self.keys[..., lo - self.start : n, :] if n and lo < self.offset else None
            held_v = self.values[..., lo - self.start : n, :] if held_k is not None else None
            first = max(0, lo - self.offset)  # appended rows already too old (count > keep)
            keys, values = keys[..., first:, :], values[..., first:, :]
            rows = (0 if held_k is None else held_k.shape[2]) + keys.shape[2]
            B, H, _, D = keys.shape
            pad = ((rows + self.step - 1) // self.step) * self.step - rows + self.step
            parts_k = ([] if held_k is None else [held_k]) + [keys]
            parts_v = ([] if held_v is None else [held_v]) + [values]
            parts_k.append(mx.zeros((B, H, pad, D), dtype=keys.dtype))
            parts_v.append(mx.zeros((B, H, pad, values.shape[3]), dtype=values.dtype))
            self.keys = mx.concatenate(parts_k, axis=2)
            self.values = mx.concatenate(parts_v, axis=2)
            self.start = lo
            self.offset += count
            return
        self.keys[..., n : n + count, :] = keys
        self.values[..., n : n + count, :] = values
        self.offset += count

    def fetch(self, lo: int) -> tuple[mx.array | None, mx.array | None]:
        """K/V of the held positions ``max(lo, start) .. offset - 1`` (None when empty)."""
        a = max(lo, self.start) - self.start
        if self.keys is None or a >= self.size:
            return None, None
        return self.keys[..., a : self.size, :], self.values[..., a : self.size, :]

    def with_block(self, lo: int, keys: mx.array, values: mx.array
                   ) -> tuple[mx.array, mx.array]:
        """K/V of the held positions ``max(lo, start) .. offset - 1`` followed by a block's
        ``keys``/``values`` ``(B, n_kv_heads, L, head_dim)``: what :meth:`fetch` gives,
        concatenated with the block, along axis 2.

        Where the buffers have room for ``L`` rows past ``offset``, the block is written
        there (scratch rows: ``offset`` does not move, the next :meth:`append` overwrites
        them) and views of the buffers are returned, so a cycle does not copy every context
        row into a new array; otherwise (no room, or nothing held) the arrays are
        concatenated. Both give the same values in the same order."""
        a = max(lo, self.start) - self.start
        if self.keys is None or a >= self.size:
            return keys, values
        n, count = self.size, keys.shape[2]
        if n + count > self.keys.shape[2]:
            return (mx.concatenate([self.keys[..., a:n, :], keys], axis=2),
                    mx.concatenate([self.values[..., a:n, :], values], axis=2))
        self.keys[..., n : n + count, :] = keys
        self.values[..., n : n + count, :] = values
        return self.keys[..., a : n + count, :], self.values[..., a : n + count, :]

    def is_trimmable(self) -> bool:
        """Always True (mlx-lm's cache protocol)."""
        return True

    def trim(self, n: int) -> int:
        """Drop the last ``n`` positions (fewer if the cache covers fewer); returns how many.

        ``offset`` goes back by that many. Rows below ``start`` are gone: after a trim deeper
        than :attr:`margin` the cache may lack keys a query at the new ``offset`` would see
        (:meth:`can_trim_exactly` says beforehand, :attr:`exact` afterwards); drafts are then
        computed from the rows held, which only affects acceptance, never the output.
        """
        n = max(0, min(n, self.offset))
        self.offset -= n
        if self.offset < self.start:
            self.start = self.offset
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the K/V buffers."""
        return sum(a.nbytes for a in (self.keys, self.values) if a is not None)


class DraftAttention(nn.Module):
    """Attention with queries from the block and keys/values from ``[context; block]``.

    Non-causal (unless the config's ``is_causal``); on ``sliding_attention`` layers with a
    window, keys farther than ``sliding_window - 1`` positions from a query are masked
    (:func:`attention_visibility`).
    """

    def __init__(self, cfg: DrafterConfig, layer_type: str):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        bias = cfg.attention_bias
        d = cfg.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.rope = _make_rope(
            self.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings
        )
        self.sliding = layer_type == "sliding_attention"
        self.window = cfg.sliding_window if self.sliding else None
        self.causal = cfg.is_causal

    def make_cache(self) -> DraftContextCache:
        """This layer's context cache (bounded by the window on a sliding layer)."""
        return DraftContextCache(self.window)

    def _kv(self, h: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        return self._place(*self._project_kv(h), offset)

    def _project_kv(self, h: mx.array) -> tuple[mx.array, mx.array]:
        """Normed keys and values of rows ``h`` ``(B, L, D)``: ``(B, L, kv_heads, head_dim)``
        each."""
        B, L, _ = h.shape
        k = self.k_norm(self.k_proj(h).reshape(B, L, self.n_kv_heads, self.head_dim))
        return k, self.v_proj(h).reshape(B, L, self.n_kv_heads, self.head_dim)

    def _place(self, k: mx.array, v: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        """Normed ``k`` and ``v`` ``(B, L, kv_heads, head_dim)`` -> head-major
        ``(B, kv_heads, L, head_dim)`` each, ``k`` rotated to positions ``offset ..``."""
        k = self.rope(k.transpose(0, 2, 1, 3), offset=offset)
        return k, v.transpose(0, 2, 1, 3)

    def extend(self, ctx: mx.array, cache: DraftContextCache) -> None:
        """Append context rows ``ctx`` ``(B, C, hidden)`` (positions from ``cache.offset``);
        rows no later query can see are skipped, not projected."""
        skip = cache.rows_to_skip(ctx.shape[1])
        if skip == ctx.shape[1]:  # nothing a later query sees (window 1, no margin)
            cache.append(*self._kv(ctx[:, :0], cache.offset), skipped=skip)
            return
        k, v = self._kv(ctx[:, skip:] if skip else ctx, cache.offset + skip)
        cache.append(k, v, skipped=skip)

    def project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The block's normed queries and keys and its values, before rotation: ``x``
        ``(B, L, D)`` -> ``(B, L, heads, head_dim)``, ``(B, L, kv_heads, head_dim)`` twice.
        Position-free, so it can run inside a compiled program (:meth:`DraftLayer.__call__`)."""
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, self.head_dim))
        return (q, *self._project_kv(x))

    def attend(self, q: mx.array, k: mx.array, v: mx.array, ctx: mx.array | None,
               cache: DraftContextCache) -> mx.array:
        """Attention of the block's :meth:`project` output over ``[context; block]``, before
        ``o_proj``: ``(B, L, heads * head_dim)``. ``ctx`` ``(B, C, D)`` (new context rows) is
        appended to ``cache`` first; the block's queries sit at positions ``cache.offset ..
        cache.offset + L - 1`` after that."""
        B, L = q.shape[:2]
        if ctx is not None and ctx.shape[1] > 0:
            self.extend(ctx, cache)
        start = cache.offset
        q = self.rope(q.transpose(0, 2, 1, 3), offset=start)
        k_blk, v_blk = self._place(k, v, start)
        # [context rows this block sees; block], without copying the context rows
        keys, values = cache.with_block(cache.visible_start(start), k_blk, v_blk)
        mask = attention_visibility(
            start, L, start + L - keys.shape[2], keys.shape[2], self.window, self.causal
        )
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return out.transpose(0, 2, 1, 3).reshape(B, L, -1)

    def __call__(self, x: mx.array, ctx: mx.array | None, cache: DraftContextCache) -> mx.array:
        """x: normed block ``(B, L, D)``; ctx: new context rows ``(B, C, D)`` or None.

        Returns ``(B, L, D)`` (:meth:`attend`, then ``o_proj``)."""
        return self.o_proj(self.attend(*self.project(x), ctx, cache))


class DraftMLP(nn.Module):
    """SwiGLU MLP (Qwen3)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Pre-norm decoder layer: ``h = x + attn(norm(x), ctx)``, ``h + mlp(norm(h))``."""

    def __init__(self, cfg: DrafterConfig, layer_type: str):
        super().__init__()
        self.self_attn = DraftAttention(cfg, layer_type)
        self.mlp = DraftMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x: mx.array, ctx: mx.array | None, cache: DraftContextCache) -> mx.array:
        if compiled_layers_on():
            q, k, v = compiled_program(self, "before_attention", _before_attention)(x)
            o = self.self_attn.attend(q, k, v, ctx, cache)
            return compiled_program(self, "after_attention", _after_attention)(x, o)
        h = x + self.self_attn(self.input_layernorm(x), ctx, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


def _before_attention(ref):
    """:class:`DraftLayer`'s position-free part before its attention, as a function of
    arrays for :func:`~app.engine.target.compiled_program`: ``x`` -> ``(q, k, v)``."""
    return lambda x: ref().self_attn.project(ref().input_layernorm(x))


def _after_attention(ref):
    """:class:`DraftLayer`'s part after its attention: ``(x, o)`` -> the layer's output, ``o``
    being :meth:`DraftAttention.attend`'s."""
    def after(x, o):
        layer = ref()
        h = x + layer.self_attn.o_proj(o)
        return h + layer.mlp(layer.post_attention_layernorm(h))
    return after


class DFlashDrafter(nn.Module):
    """The drafter network; parameter names match z-lab's ``model.safetensors``.

    ``layer_class`` builds each decoder layer (:class:`DraftLayer` here; DFlash2's drafter
    swaps in its convolved layer and keeps everything else).
    """

    layer_class: ClassVar[type] = None  # set below (DraftLayer)

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        n_taps = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [self.layer_class(cfg, t) for t in cfg.layer_types]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def make_cache(self) -> list[DraftContextCache]:
        """One context K/V cache per layer (:class:`DraftContextCache`; sliding layers keep
        only what their window can still see)."""
        return [layer.self_attn.make_cache() for layer in self.layers]

    def __call__(
        self, block_embeddings: mx.array, taps: mx.array | None, cache: list[DraftContextCache]
    ) -> mx.array:
        """Run one draft pass.

        Args:
            block_embeddings: ``(B, L, hidden)`` target embeddings of ``[last] + [mask]*(L-1)``.
            taps: ``(B, C, n_taps * hidden)`` tap states of the ``C`` positions committed to the
                target since the last call (appended to the context cache), or None.
            cache: from :meth:`make_cache`; its offset must equal the target cache's length.

        Returns:
            ``(B, L, hidden)`` final hidden states (apply the target's LM head for logits).
        """
        ctx = None
        if taps is not None and taps.shape[1] > 0:
            ctx = self.context_rows(taps)
        h = block_embeddings
        for layer, c in zip(self.layers, cache):
            h = layer(h, ctx, c)
        return self.norm(h)

    def context_rows(self, taps: mx.array) -> mx.array:
        """Tap states ``(B, C, n_taps * hidden)`` -> context rows ``(B, C, hidden)`` (``fc``,
        then ``hidden_norm``; a compiled program where :func:`compiled_layers_on`)."""
        if compiled_layers_on():
            return compiled_program(
                self, "context_rows", lambda ref: lambda t: ref().hidden_norm(ref().fc(t)))(taps)
        return self.hidden_norm(self.fc(taps))

    def extend_context(self, taps: mx.array, cache: list[DraftContextCache]) -> None:
        """Append context rows for ``taps`` ``(B, C, n_taps * hidden)`` without drafting."""
        ctx = self.context_rows(taps)
        for layer, c in zip(self.layers, cache):
            layer.self_attn.extend(ctx, c)

    def draft(self, runner, pending: int, length: int, taps: mx.array | None, cache) -> mx.array:
        """Propose ``length - 1`` draft tokens after ``pending`` (greedy, argmax).

        Args:
            runner: the target's :class:`~app.engine.target.TargetRunner` (its embedding and
                LM head are used).
            pending: the last committed token (not yet in the target cache).
            length: block length L (>= 2); the block is ``[pending] + [mask] * (L-1)``.
            taps: tap states of positions newly committed to the target, or None.
            cache: this drafter's context cache (:meth:`make_cache`).

        Returns:
            ``(length - 1,)`` token ids, lazily (not evaluated yet, so the caller can queue
            the verify pass behind it).
        """
        ids = mx.array([[pending] + [self.config.mask_token_id] * (length - 1)], dtype=mx.int32)
        hidden = self(runner.embed_tokens(ids), taps, cache)
        return mx.argmax(runner.lm_head(hidden[:, 1:]), axis=-1)[0]


DFlashDrafter.layer_class = DraftLayer


def expected_shapes(cfg: DrafterConfig, model_class: type | None = None
                    ) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape for a checkpoint of this config (for load-time validation);
    ``model_class`` defaults to :class:`DFlashDrafter`."""
    model = (model_class or DFlashDrafter)(cfg)
    from mlx.utils import tree_flatten

    return {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}
