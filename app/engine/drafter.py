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
  RMSNorms and RoPE runs at absolute positions (context rows at their own positions, block rows
  continuing from the context length);
* ``full_attention`` layers attend bidirectionally within the block; ``sliding_attention``
  layers are causal with a window of ``sliding_window`` positions (config ``layer_types``);
* a final ``norm``; logits come from the **target's** LM head.

Only the context K/V are cached (after ``k_norm`` and RoPE), one :class:`mlx_lm.models.cache.KVCache`
per layer; block K/V are recomputed every cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from app.engine.errors import ModelLoadError, UnsupportedArchitectureError

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

    ``block_size`` comes from ``dflash_config.block_size`` or the top-level ``block_size``;
    ``rope_theta`` from the top level or ``rope_parameters.rope_theta``; ``target_layer_ids`` from
    ``dflash_config`` or the top level, else :func:`default_target_layer_ids`.
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

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> DrafterConfig:
        """Parse a checkpoint config dict.

        Raises:
            UnsupportedArchitectureError: ``architectures`` names another model (e.g.
                ``DFlash2DraftModel``).
            ModelLoadError: a required field is missing or has the wrong type.
        """
        archs = cfg.get("architectures") or []
        if archs and SUPPORTED_ARCHITECTURE not in archs:
            raise UnsupportedArchitectureError(
                f"drafter architecture {archs[0]!r} is not supported; this app runs "
                f"{SUPPORTED_ARCHITECTURE} checkpoints (z-lab DFlash)"
            )
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
            if int(pick("block_size", 16)) < 1:
                raise ValueError(f"block_size is {pick('block_size')}, it must be at least 1")
            layer_types = list(cfg.get("layer_types") or ["full_attention"] * n_layers)
            if len(layer_types) != n_layers:
                raise ValueError(
                    f"layer_types has {len(layer_types)} entries for {n_layers} layers"
                )
            sliding = cfg.get("sliding_window")
            return cls(
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=n_layers,
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=head_dim,
                vocab_size=int(cfg["vocab_size"]),
                block_size=int(pick("block_size", 16)),
                mask_token_id=int(mask_id),
                target_layer_ids=[int(t) for t in taps],
                num_target_layers=None if num_target_layers is None else int(num_target_layers),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope_theta),
                attention_bias=bool(cfg.get("attention_bias", False)),
                layer_types=layer_types,
                sliding_window=None if sliding is None else int(sliding),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
                model_type=str(cfg.get("model_type", "qwen3")),
            )
        except KeyError as exc:
            raise ModelLoadError(f"drafter config.json lacks the field {exc.args[0]}") from exc
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"drafter config.json has an unreadable field: {exc}") from exc


class DraftAttention(nn.Module):
    """Attention with queries from the block and keys/values from ``[context; block]``."""

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
        self.rope = nn.RoPE(self.head_dim, traditional=False, base=cfg.rope_theta)
        self.sliding = layer_type == "sliding_attention"
        self.window = cfg.sliding_window if self.sliding else None

    def _kv(self, h: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        B, L, _ = h.shape
        k = self.k_norm(self.k_proj(h).reshape(B, L, self.n_kv_heads, self.head_dim))
        v = self.v_proj(h).reshape(B, L, self.n_kv_heads, self.head_dim)
        k = self.rope(k.transpose(0, 2, 1, 3), offset=offset)
        return k, v.transpose(0, 2, 1, 3)

    def __call__(self, x: mx.array, ctx: mx.array | None, cache: KVCache) -> mx.array:
        """x: normed block ``(B, L, D)``; ctx: new context rows ``(B, C, D)`` or None."""
        B, L, _ = x.shape
        if ctx is not None and ctx.shape[1] > 0:
            k_ctx, v_ctx = self._kv(ctx, cache.offset)
            cache.update_and_fetch(k_ctx, v_ctx)
        start = cache.offset
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, self.head_dim))
        q = self.rope(q.transpose(0, 2, 1, 3), offset=start)
        k_blk, v_blk = self._kv(x, start)
        if start > 0:
            keys = mx.concatenate([cache.keys[..., :start, :], k_blk], axis=2)
            values = mx.concatenate([cache.values[..., :start, :], v_blk], axis=2)
        else:
            keys, values = k_blk, v_blk
        mask = None
        if self.sliding:
            q_pos = start + mx.arange(L)[:, None]
            k_pos = mx.arange(start + L)[None, :]
            visible = k_pos <= q_pos
            if self.window is not None:
                visible = visible & (q_pos - k_pos < self.window)
            mask = visible
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


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

    def __call__(self, x: mx.array, ctx: mx.array | None, cache: KVCache) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), ctx, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """The drafter network; parameter names match z-lab's ``model.safetensors``."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        n_taps = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [DraftLayer(cfg, t) for t in cfg.layer_types]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def make_cache(self) -> list[KVCache]:
        """One context K/V cache per layer."""
        return [KVCache() for _ in self.layers]

    def __call__(
        self, block_embeddings: mx.array, taps: mx.array | None, cache: list[KVCache]
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
            ctx = self.hidden_norm(self.fc(taps))
        h = block_embeddings
        for layer, c in zip(self.layers, cache):
            h = layer(h, ctx, c)
        return self.norm(h)

    def extend_context(self, taps: mx.array, cache: list[KVCache]) -> None:
        """Append context rows for ``taps`` ``(B, C, n_taps * hidden)`` without drafting."""
        ctx = self.hidden_norm(self.fc(taps))
        for layer, c in zip(self.layers, cache):
            k, v = layer.self_attn._kv(ctx, c.offset)
            c.update_and_fetch(k, v)

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


def expected_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape for a checkpoint of this config (for load-time validation)."""
    model = DFlashDrafter(cfg)
    from mlx.utils import tree_flatten

    return {k: tuple(v.shape) for k, v in tree_flatten(model.parameters())}
