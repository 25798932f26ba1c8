"""PyTorch side of the demo pair's DFlash2 drafter (z-lab ``DFlash2DraftModel`` layout).

Exactly the forward of ``app/engine/dflash2.py`` (the MLX engine; its module docstring gives
the semantics), written for training: torch + transformers only, no MLX and no ``app``
import, so it runs on the GPU machine.

* Backbone as the DFlash drafter of :mod:`tools.demo_pair.modeling` (same tensor names).
* In every layer a :class:`GroupedDynamicCausalConv` around the attention and the MLP::

      a, d = attention_conv.prepare(input_layernorm(x))
      h = x + attention_conv.finish(self_attn(a, ctx), d)
      m, e = mlp_conv.prepare(post_attention_layernorm(h))
      out = h + mlp_conv.finish(mlp(m), e)

  over the rows of each block only (zero-padded before the anchor row).
* A :class:`CandidateSelector` (``hidden_projection`` ``[r, H]``, ``predecessor_codebook`` and
  ``successor_codebook`` ``[V, r]``, the codebooks stored without ``.weight``).

Initialisation makes a fresh DFlash2 drafter compute exactly what its backbone computes as a
DFlash drafter: ``base_kernel[s, 0] = 1``, ``base_kernel[s, j > 0] = 0`` and a zero
``kernel_projection`` (each convolution is the identity), ``successor_codebook = 0`` (the
selector's score is the unary term, i.e. the draft logits). So a backbone copied from the
shipped DFlash drafter (:func:`init_from_dflash`) starts at the DFlash drafter's acceptance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tools.demo_pair.modeling import Drafter, DrafterSpec, DraftLayer


@dataclass
class DFlash2Spec(DrafterSpec):
    """A :class:`~tools.demo_pair.modeling.DrafterSpec` plus the DFlash2 fields
    (``dflash_config.conv_kernel_size`` .. ``selector_top_k``); every layer is
    ``sliding_attention`` with ``sliding_window``."""

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 32
    selector_top_k: int = 16
    sliding_window: int = 2048

    def hf_config(self) -> dict:
        """``config.json`` in the DFlash2 checkpoint layout (what
        ``app.engine.dflash2.DFlash2Config.from_dict`` reads)."""
        cfg = super().hf_config()
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["layer_types"] = ["sliding_attention"] * self.num_hidden_layers
        cfg["sliding_window"] = self.sliding_window
        cfg["use_sliding_window"] = True
        cfg["is_causal"] = False
        cfg["dflash_config"].update({
            "conv_kernel_size": self.conv_kernel_size,
            "conv_group_size": self.conv_group_size,
            "selector_rank": self.selector_rank,
            "selector_top_k": self.selector_top_k,
        })
        return cfg


def causal_shift(x: torch.Tensor, j: int) -> torch.Tensor:
    """``x`` ``(..., L, H)`` moved ``j`` rows later along L, zeros in the first ``j`` rows."""
    if j == 0:
        return x
    L = x.shape[-2]
    if j >= L:
        return torch.zeros_like(x)
    return torch.cat([torch.zeros_like(x[..., :j, :]), x[..., : L - j, :]], dim=-2)


class GroupedDynamicCausalConv(nn.Module):
    """``out[t, c] = sum_j (base[s, j, c] + delta[t, s, j, c // group]) * x[t - j, c]``.

    ``base_kernel`` ``[2, K, H]`` (side s: 0 = sublayer input, 1 = its output; tap offset j;
    channel); ``kernel_projection.weight`` ``[2 * K * G, H]`` maps the (normed) sublayer input
    row ``t`` to ``delta[t]`` read as ``[2, K, G]``. Rows are the rows of one block: inputs
    are ``(..., block, H)`` (a batch of blocks reshaped so that the shift never crosses two
    blocks).
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.group_size = group_size
        self.groups = hidden_size // group_size
        base = torch.zeros(2, kernel_size, hidden_size)
        base[:, 0] = 1.0  # identity at initialisation
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups,
                                           bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        """``x`` ``(..., L, H)``, ``delta`` ``(..., L, K, G)`` -> ``(..., L, H)``."""
        out = None
        for j in range(min(self.kernel_size, x.shape[-2])):
            dyn = delta[..., j, :].repeat_interleave(self.group_size, dim=-1)
            term = (self.base_kernel[side, j].to(x.dtype) + dyn.to(x.dtype)) * causal_shift(x, j)
            out = term if out is None else out + term
        return out

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Side 0 on the sublayer input; also returns side 1's delta."""
        delta = self.kernel_projection(x).unflatten(-1, (2, self.kernel_size, self.groups))
        return self.convolve(x, delta[..., 0, :, :], 0), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Side 1 on the sublayer output."""
        return self.convolve(y, delta, 1)


class DFlash2Layer(DraftLayer):
    """A drafter layer with ``attention_conv`` and ``mlp_conv`` around its sublayers."""

    def __init__(self, s: DFlash2Spec):
        super().__init__(s)
        self.attention_conv = GroupedDynamicCausalConv(s.hidden_size, s.conv_kernel_size,
                                                       s.conv_group_size)
        self.mlp_conv = GroupedDynamicCausalConv(s.hidden_size, s.conv_kernel_size,
                                                 s.conv_group_size)


class CandidateSelector(nn.Module):
    """``hidden_projection`` (W), ``predecessor_codebook`` (A), ``successor_codebook`` (B)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        nn.init.normal_(self.hidden_projection.weight, std=hidden_size ** -0.5)
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))

    def pairwise(self, hidden: torch.Tensor, prev: torch.Tensor, cand: torch.Tensor
                 ) -> torch.Tensor:
        """``<A[prev] * (W h), B[cand]>``: hidden ``(..., H)``, prev ``(...)``, cand
        ``(..., k)`` -> ``(..., k)`` float32."""
        proj = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype)).float()
        ctx = self.predecessor_codebook[prev].float() * proj
        return torch.einsum("...r,...kr->...k", ctx, self.successor_codebook[cand].float())

    def candidates(self, logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k ids by logit (descending) and their logits (the unary term)."""
        unary, cand = logits.float().topk(min(top_k, logits.shape[-1]), dim=-1, sorted=True)
        return cand, unary

    @torch.no_grad()
    def walk(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
             top_k: int, pairwise: bool = True) -> torch.Tensor:
        """Greedy walk (``app.engine.dflash2.CandidateSelector.walk``, batched):
        hidden ``(N, n, H)``, logits ``(N, n, V)`` of slots 1..n, anchor ``(N,)`` ->
        drafts ``(N, n)``."""
        cand, unary = self.candidates(logits, top_k)
        if not pairwise:
            return cand[..., 0]
        proj = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype)).float()
        succ = self.successor_codebook[cand].float()  # (N, n, k, r)
        prev, out = anchor, []
        for i in range(cand.shape[1]):
            ctx = self.predecessor_codebook[prev].float() * proj[:, i]
            score = unary[:, i] + torch.einsum("nr,nkr->nk", ctx, succ[:, i])
            prev = cand[:, i].gather(1, score.argmax(-1, keepdim=True))[:, 0]
            out.append(prev)
        return torch.stack(out, dim=1)


class DFlash2Drafter(Drafter):
    """The DFlash2 drafter; parameter names match ``DFlash2DraftModel``'s safetensors."""

    def __init__(self, s: DFlash2Spec):
        super().__init__(s)
        self.layers = nn.ModuleList([DFlash2Layer(s) for _ in range(s.num_hidden_layers)])
        for name, p in self.layers.named_parameters():
            if p.ndim == 2 and "_conv." not in name:
                nn.init.normal_(p, std=0.02)
        self.candidate_selector = CandidateSelector(s.hidden_size, s.vocab_size,
                                                    s.selector_rank)

    def forward(self, block_emb, ctx, ctx_pos, blk_pos, mask) -> torch.Tensor:
        """Final states ``(B, Lq, H)``; block rows ``Lq = A * block_size`` (A blocks side by
        side, each convolved on its own); ``blk_pos`` ``(Lq,)`` or ``(B, Lq)``; ``mask``
        ``(Lq, S + Lq)`` or ``(B, Lq, S + Lq)`` bool, True = attend."""
        bs = self.spec.block_size
        x = block_emb
        b, lq, hd = x.shape
        if lq % bs:
            bs = lq  # one shorter block (inference-style calls)
        blocks = (b, lq // bs, bs, hd)

        def conv_in(conv, t):
            y, d = conv.prepare(t.view(blocks))
            return y.view(b, lq, hd), d

        def conv_out(conv, t, d):
            return conv.finish(t.view(blocks), d).view(b, lq, hd)

        if blk_pos.ndim == 1:
            blk_pos = blk_pos[None].expand(b, -1)
        if mask.ndim == 2:
            mask = mask[None].expand(b, -1, -1)
        for layer in self.layers:
            a, d = conv_in(layer.attention_conv, layer.input_layernorm(x))
            h = x + conv_out(layer.attention_conv, _attention(layer.self_attn, a, ctx, ctx_pos,
                                                              blk_pos, mask), d)
            m, e = conv_in(layer.mlp_conv, layer.post_attention_layernorm(h))
            mlp = layer.mlp
            y = mlp.down_proj(F.silu(mlp.gate_proj(m)) * mlp.up_proj(m))
            x = h + conv_out(layer.mlp_conv, y, e)
        return self.norm(x)


def _rope_rows(x, pos, theta):
    """RoPE (half-split, as ``modeling.rope``) with per-row positions: x (B, H, L, D),
    pos (B, L)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2 :].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _attention(att, x, ctx, ctx_pos, blk_pos, mask):
    """``modeling.DraftAttention`` with per-row positions: queries from ``x`` (B, Lq, H),
    keys/values from ``[ctx; x]``."""
    s = att.s
    b, lq, _ = x.shape
    sc = ctx.shape[1]
    q = att.q_norm(att.q_proj(x).view(b, lq, s.num_attention_heads, s.head_dim))
    kv_in = torch.cat([ctx, x], dim=1)
    k = att.k_norm(att.k_proj(kv_in).view(b, sc + lq, s.num_key_value_heads, s.head_dim))
    v = att.v_proj(kv_in).view(b, sc + lq, s.num_key_value_heads, s.head_dim)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kpos = torch.cat([ctx_pos.to(blk_pos.device)[None].expand(b, -1), blk_pos], dim=1)
    q = _rope_rows(q, blk_pos, s.rope_theta)
    k = _rope_rows(k, kpos, s.rope_theta)
    rep = s.num_attention_heads // s.num_key_value_heads
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    return att.o_proj(o.transpose(1, 2).reshape(b, lq, -1))


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """``|q - k| <= window - 1`` (the sliding layers' visibility, as
    ``app.engine.drafter.attention_visibility``): q_pos (..., Lq), k_pos (..., S) ->
    (..., Lq, S) bool."""
    return (q_pos[..., :, None] - k_pos[..., None, :]).abs() <= window - 1


def init_from_dflash(drafter: DFlash2Drafter, folder: Path) -> list[str]:
    """Copy a DFlash drafter export's backbone tensors (``fc``, norms, layers' attention and
    MLP) into ``drafter``: every tensor whose name and shape match; a drafter with fewer
    layers takes the first ones. Returns the names copied."""
    from safetensors.torch import load_file

    src = load_file(str(Path(folder) / "model.safetensors"))
    own = drafter.state_dict()
    hit = {k: v.float() for k, v in src.items() if k in own and own[k].shape == v.shape}
    drafter.load_state_dict(hit, strict=False)
    return sorted(hit)


def export_dflash2(drafter: DFlash2Drafter, out_dir: Path, dtype=torch.float16) -> None:
    """Write ``config.json`` and ``model.safetensors`` (DFlash2 layout)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in drafter.state_dict().items()}
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(drafter.spec.hf_config(), indent=2) + "\n")


def stored_bytes(spec: DFlash2Spec) -> int:
    """float16 bytes of the tensors of a drafter of ``spec`` (without the safetensors
    header, ~3 KB)."""
    return 2 * sum(p.numel() for p in DFlash2Drafter(spec).state_dict().values())
