"""Train the demo target, generate its own continuations, train the DFlash drafter, export.

Needs torch + transformers + numpy + safetensors only (no MLX, no ``app``), so it runs on the
GPU machine as well as on CPU. Input: a build folder written by ``tools.demo_pair.build``
(``dataset.npz``, ``specs.json``). Output: ``<out>/demo-target/`` and ``<out>/demo-dflash/``
(config.json + float16 model.safetensors) and ``<out>/train_log.json``.

Drafter training follows the DFlash recipe (see ``/work/shared/DFLASH_NOTES.md``, "Training a
drafter"): the target's own greedy continuations; random anchors inside the response; block input
``[token at anchor] + [mask] * (B-1)`` embedded with the frozen target embedding; cross-entropy at
block slots k = 1..B-1 against the token at ``anchor + k``, weighted ``exp(-(k-1)/gamma)``;
a block sees the context strictly before its anchor and itself (bidirectionally); target frozen.

The DFlash2 drafter stage (target frozen, from an export) is ``train_dflash2.py``; it reuses
this module's continuations, batches and optimiser step.

Usage: ``python -m tools.demo_pair.train --data BUILD_DIR --out OUT_DIR [--device cuda]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools.demo_pair.modeling import (  # noqa: E402
    SHAPES,
    Drafter,
    DrafterSpec,
    TargetSpec,
    build_target,
    cosine_lr,
    drafter_shape,
    export_drafter,
    export_target,
    target_logits_and_taps,
)

IGNORE = -100


def log(msg: str) -> None:
    """Print with a timestamp (flushed)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_dataset(path: Path) -> list[tuple[np.ndarray, int]]:
    """(token ids, prompt length) per example from ``dataset.npz``."""
    d = np.load(path)
    toks, offs, plens = d["tokens"].astype(np.int64), d["offsets"], d["prompt_lens"]
    return [(toks[offs[i]:offs[i + 1]], int(plens[i])) for i in range(len(plens))]


def merge_prefix_examples(data: list[tuple[np.ndarray, int]]) -> list[tuple[np.ndarray, list]]:
    """Merge consecutive examples where one (prompt + completion) is a prefix of the next
    prompt (the tool-call turn and the answer after the tool result): one sequence with both
    completion spans, so the long system prompt is processed once. Returns (tokens, spans)."""
    out: list[tuple[np.ndarray, list]] = []
    for toks, pl in data:
        if out:
            prev, spans = out[-1]
            if pl >= len(prev) and np.array_equal(toks[: len(prev)], prev):
                out[-1] = (toks, spans + [(pl, len(toks))])
                continue
        out.append((toks, [(pl, len(toks))]))
    return out


def length_batches(lengths: list[int], tokens_per_batch: int, rng: random.Random,
                   max_rows: int = 512) -> list[list[int]]:
    """Index batches of similar length, each with at most ``tokens_per_batch`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, cur, cur_max = [], [], 0
    for i in order:
        m = max(cur_max, lengths[i])
        if cur and (m * (len(cur) + 1) > tokens_per_batch or len(cur) >= max_rows):
            batches.append(cur)
            cur, m = [], lengths[i]
        cur.append(i)
        cur_max = m
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def pad_batch(seqs: list[np.ndarray], pad: int) -> torch.Tensor:
    """Right-padded (B, S) int64 tensor."""
    s = max(len(x) for x in seqs)
    out = np.full((len(seqs), s), pad, dtype=np.int64)
    for i, x in enumerate(seqs):
        out[i, : len(x)] = x
    return torch.from_numpy(out)


# --------------------------------------------------------------------------------------------


def scheduled_lr(step: int, total: int, t0: float, budget_s: float, peak: float) -> float:
    """Cosine with warm-up over the run's progress: the larger of the step fraction and the
    time-budget fraction, so that a run cut by its budget still ends with a decayed rate."""
    frac = step / max(1, total)
    if budget_s > 0:
        frac = max(frac, (time.time() - t0) / budget_s)
    return cosine_lr(int(min(1.0, frac) * 10_000), 10_000, peak)


def optimizer_step(opt, model, loss, step: int, total: int, t0: float, budget_s: float,
                   name: str, logd: dict) -> tuple[int, int]:
    """One AdamW step with gradient clipping at 1.0 (the DFlash paper's setting); ends the run
    early (``total = step``) once ``budget_s`` seconds have passed; logs the loss every 100
    steps under ``logd[name + "_loss"]``. Returns the new (step, total)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    step += 1
    if budget_s > 0 and time.time() - t0 > budget_s and step < total:
        log(f"{name}: time budget reached at step {step} of {total}")
        total = step
    if step % 100 == 0 or step == total:
        log(f"{name} step {step}/{total} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
        logd.setdefault(f"{name}_loss", []).append([step, round(loss.item(), 4)])
    return step, total


def train_target(model, data, args, dev, tspec: TargetSpec, logd: dict):
    """Next-token cross-entropy on completions only (prompts and padding ignored)."""
    rng = random.Random(args.seed)
    n_before = sum(len(t) for t, _ in data)
    data = merge_prefix_examples(data)
    log(f"target data: {len(data)} sequences after merging, "
        f"{sum(len(t) for t, _ in data)} tokens (was {n_before})")
    lengths = [len(t) for t, _ in data]
    opt = torch.optim.AdamW(model.parameters(), lr=args.target_lr, betas=(0.9, 0.95),
                            weight_decay=0.01)
    total = args.target_steps
    step, t0, epoch = 0, time.time(), 0
    model.train()
    while step < total:
        for b in length_batches(lengths, args.target_batch_tokens, rng):
            if step >= total:
                break
            ids = pad_batch([data[i][0] for i in b], tspec.pad_token_id).to(dev)
            labels = torch.full_like(ids, IGNORE)
            for r, i in enumerate(b):
                for lo, hi in data[i][1]:
                    labels[r, lo:hi] = ids[r, lo:hi]
            for g in opt.param_groups:
                g["lr"] = scheduled_lr(step, total, t0, args.time_target, args.target_lr)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                logits = model(input_ids=ids, use_cache=False).logits
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1), ignore_index=IGNORE)
            step, total = optimizer_step(opt, model, loss, step, total, t0, args.time_target,
                                         "target", logd)
        epoch += 1
    logd["target_steps"] = step
    logd["target_epochs"] = round(step / max(1, len(length_batches(lengths,
                                                                    args.target_batch_tokens,
                                                                    random.Random(0)))), 2)
    model.eval()


@torch.no_grad()
def greedy_continuations(model, prompts: list[np.ndarray], eos: int, pad: int, max_new: int,
                         dev, batch: int, time_cap: float = 0.0) -> list[np.ndarray | None]:
    """Greedy continuations (without the prompt, ending at ``eos`` if reached).

    Uses transformers' ``generate`` with left padding (Gated DeltaNet zeroes padded inputs, so
    the recurrent state of a padded row stays zero; RoPE attention depends on relative
    positions only). Prompts not reached within ``time_cap`` seconds (0: no cap) get None.
    Prompts run longest first, so that a batch pads to its own length (corpus v6's long-chat
    prompts of up to 3,584 tokens would otherwise pad every batch) and the few long prompts
    are not the ones a time cap leaves out.
    """
    outs: list[np.ndarray | None] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    t0 = time.time()
    for s in range(0, len(order), batch):
        if time_cap and time.time() - t0 > time_cap:
            break
        idx = order[s : s + batch]
        seqs = [prompts[i] for i in idx]
        L = max(len(x) for x in seqs)
        ids = np.full((len(seqs), L), pad, dtype=np.int64)
        att = np.zeros((len(seqs), L), dtype=np.int64)
        for r, x in enumerate(seqs):
            ids[r, L - len(x):] = x
            att[r, L - len(x):] = 1
        ids_t, att_t = torch.from_numpy(ids).to(dev), torch.from_numpy(att).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            gen = model.generate(input_ids=ids_t, attention_mask=att_t, max_new_tokens=max_new,
                                 do_sample=False, eos_token_id=eos, pad_token_id=pad)
        gen = gen[:, L:].cpu().numpy()
        for r, i in enumerate(idx):
            row = gen[r]
            hit = np.nonzero(row == eos)[0]
            outs[i] = row[: hit[0] + 1] if len(hit) else row
    return outs


def target_continuations(target, data, args, tspec: TargetSpec, dev, logd: dict
                         ) -> tuple[list[np.ndarray], list[int]]:
    """The target's own greedy continuations of ``args.gen_prompts`` sampled training prompts
    (the drafters' training data; ``args.seed``, ``max_new``, ``gen_batch``, ``time_gen``);
    prompts not reached within ``time_gen`` keep the corpus text. Returns (prompt +
    continuation, prompt length) per prompt; logs under ``continuations``,
    ``continuation_tokens`` and ``target_matches_corpus``."""
    rng = random.Random(args.seed + 2)
    pick = rng.sample(range(len(data)), min(args.gen_prompts, len(data)))
    prompts = [data[i][0][: data[i][1]] for i in pick]
    t0 = time.time()
    try:
        conts = greedy_continuations(target, prompts, tspec.eos_token_id, tspec.pad_token_id,
                                     args.max_new, dev, args.gen_batch, args.time_gen)
        n_gen = sum(c is not None for c in conts)
        logd["continuations"] = f"target greedy (generate) for {n_gen} of {len(conts)}"
        conts = [c if c is not None else data[i][0][data[i][1]:] for c, i in zip(conts, pick)]
    except Exception as exc:  # noqa: BLE001 - fall back to the corpus text, logged
        log(f"generate failed ({exc!r}); using corpus completions")
        conts = [data[i][0][data[i][1]:] for i in pick]
        logd["continuations"] = f"corpus (generate failed: {exc!r})"
    same = np.mean([np.array_equal(c, data[i][0][data[i][1]:]) for c, i in zip(conts, pick)])
    logd["continuation_tokens"] = int(sum(len(c) for c in conts))
    logd["target_matches_corpus"] = round(float(same), 4)
    log(f"continuations in {time.time() - t0:.0f}s; exact match with corpus {same:.3f}")
    seqs = [np.concatenate([pr, c]) for pr, c in zip(prompts, conts)]
    return seqs, [len(pr) for pr in prompts]


def drafter_batch(seqs, plens, dspec: DrafterSpec, n_anchor: int, rng: random.Random, pad: int):
    """Anchors, block inputs, labels, positions and masks for a batch of sequences.

    Returns ``ids`` (R, S), ``blk_ids`` (R, A*B), ``labels`` (R, A*B), ``blk_pos`` (R, A*B) and
    ``mask`` (R, A*B, S + A*B) bool: a block row sees context positions ``< anchor`` and the rows
    of its own block. Unused anchor slots (short responses) have no labels.
    """
    B = dspec.block_size
    R, S, A = len(seqs), max(len(s) for s in seqs), n_anchor
    ids = pad_batch(seqs, pad).numpy()
    anchors = np.zeros((R, A), dtype=np.int64)
    used = np.zeros((R, A), dtype=bool)
    lens = np.array([len(s) for s in seqs])
    for r, (s, pl) in enumerate(zip(seqs, plens)):
        lo, hi = pl, len(s) - 1
        n = hi - lo
        if n <= 0:
            continue
        k = min(A, n)
        anchors[r, :k] = sorted(rng.sample(range(lo, hi), k))
        used[r, :k] = True
    slot = np.arange(B)
    pos = anchors[:, :, None] + slot[None, None, :]  # (R, A, B)
    valid = used[:, :, None] & (pos < lens[:, None, None]) & (slot[None, None, :] > 0)
    gathered = np.take_along_axis(ids, np.minimum(pos, S - 1).reshape(R, -1), axis=1)
    labels = np.where(valid.reshape(R, -1), gathered, IGNORE)
    blk_ids = np.full((R, A, B), dspec.mask_token_id, dtype=np.int64)
    blk_ids[:, :, 0] = np.take_along_axis(ids, anchors, axis=1)
    ctx_vis = np.arange(S)[None, None, :] < np.where(used, anchors, 0)[:, :, None]  # (R, A, S)
    ctx_vis = np.repeat(ctx_vis, B, axis=1)  # (R, A*B, S)
    blk_of = np.repeat(np.arange(A), B)
    own = blk_of[:, None] == blk_of[None, :]  # (A*B, A*B)
    mask = np.concatenate([ctx_vis, np.broadcast_to(own, (R, A * B, A * B))], axis=2)
    return (torch.from_numpy(ids), torch.from_numpy(blk_ids.reshape(R, -1)),
            torch.from_numpy(labels), torch.from_numpy(pos.reshape(R, -1)),
            torch.from_numpy(np.ascontiguousarray(mask)))


def drafter_forward(drafter, target, ids, blk_ids, blk_pos, mask, dspec, embed):
    """Drafter logits (B, Lq, V) for a prepared batch (target run frozen for the taps)."""
    with torch.no_grad():
        _, taps = target_logits_and_taps(target, ids, dspec.target_layer_ids)
    ctx = drafter.context([t.float() for t in taps])
    x = F.embedding(blk_ids, embed)
    S = ids.shape[1]
    ctx_pos = torch.arange(S, device=ids.device)
    h = _drafter_rows(drafter, x, ctx, ctx_pos, blk_pos, mask)
    return h @ embed.T


def _drafter_rows(drafter, x, ctx, ctx_pos, blk_pos, mask):
    # Per-row positions differ across the batch: run layers with (B, L) positions.
    for layer in drafter.layers:
        att = layer.self_attn
        s = att.s
        b, lq, _ = x.shape
        sc = ctx.shape[1]
        xn = layer.input_layernorm(x)
        q = att.q_norm(att.q_proj(xn).view(b, lq, s.num_attention_heads, s.head_dim))
        kv_in = torch.cat([ctx, xn], dim=1)
        k = att.k_norm(att.k_proj(kv_in).view(b, sc + lq, s.num_key_value_heads, s.head_dim))
        v = att.v_proj(kv_in).view(b, sc + lq, s.num_key_value_heads, s.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        kpos = torch.cat([ctx_pos[None].expand(b, -1), blk_pos], dim=1)
        q = _rope_rows(q, blk_pos, s.rope_theta)
        k = _rope_rows(k, kpos, s.rope_theta)
        rep = s.num_attention_heads // s.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        h = x + att.o_proj(o.transpose(1, 2).reshape(b, lq, -1))
        m = layer.post_attention_layernorm(h)
        x = h + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(m)) * layer.mlp.up_proj(m))
    return drafter.norm(x)


def _rope_rows(x, pos, theta):
    """RoPE with per-row positions: x (B, H, L, D), pos (B, L)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2 :].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def train_drafter(drafter, target, seqs, plens, dspec, args, dev, logd):
    """DFlash drafter training (weighted block CE, target frozen)."""
    rng = random.Random(args.seed + 1)
    embed = target.model.embed_tokens.weight.detach().float()
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.drafter_lr, betas=(0.9, 0.95),
                            weight_decay=0.01)
    B = dspec.block_size
    w = torch.tensor([0.0] + [math.exp(-(k - 1) / args.gamma) for k in range(1, B)], device=dev)
    lengths = [len(s) for s in seqs]
    total = args.drafter_steps
    step, t0 = 0, time.time()
    drafter.train()
    while step < total:
        for b in length_batches(lengths, args.drafter_batch_tokens, rng, max_rows=256):
            if step >= total:
                break
            ids, blk_ids, labels, blk_pos, mask = drafter_batch(
                [seqs[i] for i in b], [plens[i] for i in b], dspec, args.anchors, rng, 0)
            ids, blk_ids, labels = ids.to(dev), blk_ids.to(dev), labels.to(dev)
            blk_pos, mask = blk_pos.to(dev), mask.to(dev)
            for g in opt.param_groups:
                g["lr"] = scheduled_lr(step, total, t0, args.time_drafter, args.drafter_lr)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                logits = drafter_forward(drafter, target, ids, blk_ids, blk_pos, mask, dspec,
                                         embed)
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                 labels.reshape(-1), ignore_index=IGNORE, reduction="none")
            slot_w = w.repeat(args.anchors)[None].expand_as(labels).reshape(-1)
            valid = (labels.reshape(-1) != IGNORE).float()
            loss = (ce * slot_w * valid).sum() / (slot_w * valid).sum().clamp_min(1e-6)
            step, total = optimizer_step(opt, drafter, loss, step, total, t0, args.time_drafter,
                                         "drafter", logd)
    logd["drafter_steps"] = step
    drafter.eval()


@torch.no_grad()
def estimate_tau(drafter, target, seqs, plens, dspec, dev, n: int = 256) -> dict:
    """Offline acceptance estimate: anchors at every 4th response position of ``n`` sequences;
    accepted = leading draft tokens equal to the target's own greedy continuation."""
    rng = random.Random(123)
    embed = target.model.embed_tokens.weight.detach().float()
    B = dspec.block_size
    acc = []
    for i in range(0, min(n, len(seqs)), 16):
        chunk = list(range(i, min(i + 16, len(seqs))))
        ids, blk_ids, labels, blk_pos, mask = drafter_batch(
            [seqs[j] for j in chunk], [plens[j] for j in chunk], dspec, 8, rng, 0)
        logits = drafter_forward(drafter, target, ids.to(dev), blk_ids.to(dev), blk_pos.to(dev),
                                 mask.to(dev), dspec, embed)
        pred = logits.argmax(-1).cpu()
        for r in range(len(chunk)):
            for a in range(8):
                lab = labels[r, a * B + 1 : (a + 1) * B]
                if (lab == IGNORE).all():
                    continue
                p = pred[r, a * B + 1 : (a + 1) * B]
                k = 0
                while k < B - 1 and lab[k] != IGNORE and p[k] == lab[k]:
                    k += 1
                acc.append(k)
    a = np.asarray(acc, dtype=np.float64)
    return {"tau_offline": round(float((a + 1).mean()), 3),
            "accepted_mean": round(float(a.mean()), 3), "blocks": int(len(a))}


def load_exported(model, folder: Path, tied: bool = False) -> None:
    """Load an exported float16 ``model.safetensors`` into ``model`` (float32); every tensor
    must match, the tied LM head aside."""
    from safetensors.torch import load_file

    sd = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{folder}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if tied:
        model.tie_weights()


def main(argv=None) -> int:
    """Entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description="train the demo pair")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shape", choices=sorted(SHAPES), default="h320-l8-a4",
                   help="target shape (modeling.SHAPES)")
    p.add_argument("--drafter-layers", type=int, default=2)
    p.add_argument("--init-target", type=Path, help="start from this exported target folder")
    p.add_argument("--init-drafter", type=Path, help="start from this exported drafter folder")
    p.add_argument("--target-steps", type=int, default=2200)
    p.add_argument("--target-lr", type=float, default=3e-3)
    p.add_argument("--target-batch-tokens", type=int, default=64_000)
    p.add_argument("--time-target", type=float, default=270.0,
                   help="seconds; training stops there if the steps are not done (0: off)")
    p.add_argument("--gen-prompts", type=int, default=20_000)
    p.add_argument("--gen-batch", type=int, default=1024)
    p.add_argument("--max-new", type=int, default=200)
    p.add_argument("--time-gen", type=float, default=80.0)
    p.add_argument("--drafter-steps", type=int, default=1800)
    p.add_argument("--drafter-lr", type=float, default=1e-3)
    p.add_argument("--drafter-batch-tokens", type=int, default=48_000)
    p.add_argument("--anchors", type=int, default=24)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--time-drafter", type=float, default=150.0)
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device(args.device)
    t_start = time.time()
    specs = json.loads((args.data / "specs.json").read_text())
    tspec = TargetSpec(**specs["target"], **SHAPES[args.shape])
    dspec = DrafterSpec(**specs["drafter"], **drafter_shape(tspec, args.drafter_layers))
    data = load_dataset(args.data / "dataset.npz")
    log(f"{len(data)} examples, {sum(len(t) for t, _ in data)} tokens, device {dev}")
    logd: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "shape": args.shape}

    target = build_target(tspec)
    if args.init_target:
        load_exported(target, args.init_target, tied=True)
        log(f"target initialised from {args.init_target}")
    target = target.to(dev)
    logd["target_params"] = sum(p.numel() for p in target.parameters())
    train_target(target, data, args, dev, tspec, logd)
    for prm in target.parameters():
        prm.requires_grad_(False)
    export_target(target, tspec, args.out / "demo-target")
    log(f"target done ({time.time() - t_start:.0f}s)")

    seqs, plens = target_continuations(target, data, args, tspec, dev, logd)
    n_eval = min(256, len(seqs) // 10)
    drafter = Drafter(dspec)
    if args.init_drafter:
        load_exported(drafter, args.init_drafter)
        log(f"drafter initialised from {args.init_drafter}")
    drafter = drafter.to(dev)
    logd["drafter_params"] = sum(p.numel() for p in drafter.parameters())
    train_drafter(drafter, target, seqs[n_eval:], plens[n_eval:], dspec, args, dev, logd)
    logd["tau_eval"] = estimate_tau(drafter, target, seqs[:n_eval], plens[:n_eval], dspec, dev)
    logd["tau_train"] = estimate_tau(drafter, target, seqs[n_eval:], plens[n_eval:], dspec, dev)
    log(f"tau eval {logd['tau_eval']} train {logd['tau_train']}")
    export_drafter(drafter, args.out / "demo-dflash")
    logd["seconds"] = round(time.time() - t_start, 1)
    (args.out / "train_log.json").write_text(json.dumps(logd, indent=1) + "\n")
    log(f"all done in {logd['seconds']}s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
