"""PyTorch side of the demo pair: the ``qwen3_5`` target and the DFlash drafter.

Runs with torch + transformers only (no MLX, no ``app`` import) so that it can run on the GPU
machine. The target is transformers' ``Qwen3_5ForCausalLM`` (text-only Qwen3.5: Gated DeltaNet
layers interleaved with gated full attention); it is exported in the flat layout that mlx-lm's
``qwen3_5`` model loads (``model_type: qwen3_5``, torch-layout ``conv1d`` weights, zero-centred
norm weights, which mlx-lm's ``sanitize`` shifts by one).

The drafter is written here from the DFlash description (z-lab paper "DFlash: Block Diffusion for
Flash Speculative Decoding" and its reference checkpoints' layout, see
``/work/shared/DFLASH_NOTES.md``): Qwen3-style decoder layers whose keys/values are
``[proj(ctx); proj(block)]`` with ``ctx = hidden_norm(fc(concat(target taps)))``, queries from the
block only, a final ``norm``, and logits through the target's (tied) embedding matrix.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------
# Target


@dataclass
class TargetSpec:
    """Size of the demo target (a text-only ``qwen3_5`` hybrid).

    ``full_attention_interval`` = 3 with 6 layers gives layers 2 and 5 full attention and the
    other four Gated DeltaNet (mlx-lm: ``is_linear = (i + 1) % interval != 0``).
    """

    vocab_size: int
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 8
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100000.0
    partial_rotary_factor: float = 0.25
    max_position_embeddings: int = 4096
    eos_token_id: int = 0
    pad_token_id: int = 0

    def layer_types(self) -> list[str]:
        """Per-layer ``linear_attention`` / ``full_attention`` as mlx-lm derives them."""
        return [
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]

    def mlx_config(self) -> dict:
        """The ``config.json`` that mlx-lm's ``qwen3_5`` model (flat, text-only) loads."""
        return {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "full_attention_interval": self.full_attention_interval,
            "layer_types": self.layer_types(),
            "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "hidden_act": "silu",
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "float16",
        }


SHAPES: dict[str, dict] = {
    # name: TargetSpec fields (the drafter gets the same hidden size; see drafter_shape)
    "h256-l6-a2": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                       full_attention_interval=3),
    "h320-l8-a4": dict(hidden_size=320, intermediate_size=960, num_hidden_layers=8,
                       full_attention_interval=2, num_attention_heads=4,
                       linear_num_key_heads=5, linear_num_value_heads=10),
    "h384-l6-a3": dict(hidden_size=384, intermediate_size=896, num_hidden_layers=6,
                       full_attention_interval=2, num_attention_heads=6,
                       linear_num_key_heads=6, linear_num_value_heads=12),
    "h384-l8-a4": dict(hidden_size=384, intermediate_size=896, num_hidden_layers=8,
                       full_attention_interval=2, num_attention_heads=6,
                       linear_num_key_heads=6, linear_num_value_heads=12),
}
"""Target shapes tried for the shipped pair (``--shape`` in ``train.py``); each is a hybrid
``qwen3_5`` (Gated DeltaNet + gated full attention; ``a`` = attention layers)."""


def drafter_shape(tspec: TargetSpec, layers: int = 2) -> dict:
    """DrafterSpec fields matching a target: same hidden size and heads, ``layers`` layers,
    four taps spread from layer 1 to the second-to-last layer."""
    n = tspec.num_hidden_layers
    taps = sorted({1, round((n - 2) / 3) + 1, round(2 * (n - 2) / 3) + 1, n - 2})
    return dict(hidden_size=tspec.hidden_size, intermediate_size=tspec.intermediate_size,
                num_hidden_layers=layers, num_attention_heads=tspec.num_attention_heads,
                num_key_value_heads=tspec.num_key_value_heads, head_dim=tspec.head_dim,
                target_layer_ids=taps, num_target_layers=n)


def build_target(spec: TargetSpec) -> nn.Module:
    """A randomly initialised transformers ``Qwen3_5ForCausalLM`` (float32) for ``spec``."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        linear_conv_kernel_dim=spec.linear_conv_kernel_dim,
        layer_types=spec.layer_types(),
        rms_norm_eps=spec.rms_norm_eps,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "partial_rotary_factor": spec.partial_rotary_factor,
        },
        eos_token_id=spec.eos_token_id,
        pad_token_id=spec.pad_token_id,
    )
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg)
    model.tie_weights()
    return model.float()


def target_logits_and_taps(
    model: nn.Module, ids: torch.Tensor, tap_ids: list[int] | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run the target on ``ids`` (B, S) int64; return logits (B, S, V) and tap states.

    A tap is the residual-stream output of decoder layer ``i`` (0-based, before the final
    norm), read with forward hooks so it does not depend on how the installed transformers
    numbers ``hidden_states``.
    """
    taps: dict[int, torch.Tensor] = {}
    hooks = []
    for i in tap_ids or []:
        def hook(_m, _inp, out, i=i):
            taps[i] = out[0] if isinstance(out, tuple) else out
        hooks.append(model.model.layers[i].register_forward_hook(hook))
    try:
        out = model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits, [taps[i] for i in tap_ids or []]


def export_target(model: nn.Module, spec: TargetSpec, out_dir: Path, dtype=torch.float16) -> None:
    """Write ``config.json`` and ``model.safetensors`` for mlx-lm's ``qwen3_5`` loader.

    Keys are transformers' own (``model.layers.{i}....``); the tied ``lm_head.weight`` is
    dropped. ``conv1d.weight`` stays in torch layout (C, 1, K): mlx-lm detects that, moves the
    axis and adds 1 to the zero-centred RMSNorm weights (Qwen3.5 computes ``x * (1 + w)``).
    """
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {
        k: v.detach().to("cpu", dtype).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(spec.mlx_config(), indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# Drafter


@dataclass
class DrafterSpec:
    """Size and wiring of the DFlash drafter (z-lab ``DFlashDraftModel`` layout)."""

    vocab_size: int
    mask_token_id: int
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    num_target_layers: int = 6
    block_size: int = 16
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100000.0
    max_position_embeddings: int = 4096

    def hf_config(self) -> dict:
        """``config.json`` in the z-lab DFlash checkpoint layout."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "num_target_layers": self.num_target_layers,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "block_size": self.block_size,
            "dflash_config": {
                "block_size": self.block_size,
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
            "dtype": "float16",
        }


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: ``weight * x / sqrt(mean(x^2) + eps)`` (weight starts at 1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Non-interleaved (half-split) RoPE over the full head dim; x (B, H, L, D), pos (L,)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2 :].float()
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class DraftAttention(nn.Module):
    """Attention with queries from the block, keys/values from ``[ctx; block]``."""

    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.s = s
        h, d, kv = s.num_attention_heads, s.head_dim, s.num_key_value_heads
        self.q_proj = nn.Linear(s.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, s.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, s.rms_norm_eps)
        self.k_norm = RMSNorm(d, s.rms_norm_eps)

    def forward(self, x, ctx, ctx_pos, blk_pos, mask):
        """x (B, Lq, H) normed block rows; ctx (B, S, H); mask (Lq, S+Lq) bool, True = attend."""
        s = self.s
        b, lq, _ = x.shape
        sc = ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, lq, s.num_attention_heads, s.head_dim))
        kv_in = torch.cat([ctx, x], dim=1)
        k = self.k_norm(self.k_proj(kv_in).view(b, sc + lq, s.num_key_value_heads, s.head_dim))
        v = self.v_proj(kv_in).view(b, sc + lq, s.num_key_value_heads, s.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = rope(q, blk_pos, s.rope_theta)
        k = rope(k, torch.cat([ctx_pos, blk_pos]), s.rope_theta)
        rep = s.num_attention_heads // s.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(b, lq, -1))


class DraftLayer(nn.Module):
    """One drafter decoder layer (pre-norm, SwiGLU MLP)."""

    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.self_attn = DraftAttention(s)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x, ctx, ctx_pos, blk_pos, mask):
        h = x + self.self_attn(self.input_layernorm(x), ctx, ctx_pos, blk_pos, mask)
        m = self.post_attention_layernorm(h)
        return h + self.mlp.down_proj(F.silu(self.mlp.gate_proj(m)) * self.mlp.up_proj(m))


class Drafter(nn.Module):
    """DFlash drafter; parameter names match the z-lab checkpoint layout."""

    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.spec = s
        self.fc = nn.Linear(len(s.target_layer_ids) * s.hidden_size, s.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.layers = nn.ModuleList([DraftLayer(s) for _ in range(s.num_hidden_layers)])
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        for p in self.parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)

    def context(self, taps: list[torch.Tensor]) -> torch.Tensor:
        """``hidden_norm(fc(concat(taps)))``: taps each (B, S, H) -> (B, S, H)."""
        return self.hidden_norm(self.fc(torch.cat(taps, dim=-1)))

    def forward(self, block_emb, ctx, ctx_pos, blk_pos, mask) -> torch.Tensor:
        """Hidden states (B, Lq, H) after the final norm for block rows ``block_emb``."""
        x = block_emb
        for layer in self.layers:
            x = layer(x, ctx, ctx_pos, blk_pos, mask)
        return self.norm(x)


def export_drafter(drafter: Drafter, out_dir: Path, dtype=torch.float16) -> None:
    """Write the drafter's ``config.json`` and ``model.safetensors`` (z-lab layout)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in drafter.state_dict().items()}
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(drafter.spec.hf_config(), indent=2) + "\n")


def drafter_single_block_logits(
    drafter: Drafter, embed: torch.Tensor, taps: list[torch.Tensor], block_ids: torch.Tensor
) -> torch.Tensor:
    """Inference-style logits for one block after a context of S rows (for parity checks).

    taps: each (1, S, H) for positions 0..S-1; block_ids (B_blk,) at positions S..S+B_blk-1;
    every block row sees every context row and the whole block. Returns (B_blk, V).
    """
    ctx = drafter.context(taps)
    s = ctx.shape[1]
    nb = block_ids.shape[0]
    x = F.embedding(block_ids[None], embed)
    ctx_pos = torch.arange(s)
    blk_pos = torch.arange(s, s + nb)
    mask = torch.ones(nb, s + nb, dtype=torch.bool)
    h = drafter(x, ctx, ctx_pos, blk_pos, mask)
    return (h @ embed.T)[0]


def spec_to_json(spec) -> str:
    """JSON text of a spec dataclass (kept next to the training data)."""
    return json.dumps(asdict(spec))


def cosine_lr(step: int, total: int, peak: float, warmup_frac: float = 0.04) -> float:
    """Cosine schedule with linear warm-up (the DFlash paper's setting: 4% warm-up)."""
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
