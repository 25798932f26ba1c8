"""Train a DFlash2 drafter for an exported demo target (drafter-only stage of ``train.py``).

The target is frozen, loaded from an export (``--init-target``, e.g.
``resources/models/demo-target``); the data are its own greedy continuations of sampled
training prompts (``train.target_continuations``, as the DFlash stage), optionally cached in
a file (``--continuations``) so that several variants train on the same sequences. The
backbone can start from the shipped DFlash drafter (``--init-dflash``); the convolutions start
as the identity and the selector's pairwise term at zero, so the initial DFlash2 drafter
drafts exactly as that DFlash drafter.

Loss (this project's own recipe; no public DFlash2 training code exists; README.md,
"DFlash2 drafter"):

* backbone: the DFlash recipe of ``train.py`` (random anchors in the reply, block
  ``[anchor] + [mask] * 15``, cross-entropy at slots k = 1..15 against the token at
  ``anchor + k``, weighted ``exp(-(k-1)/gamma)``);
* selector: at every labelled slot, the top-``selector_top_k`` candidates of the draft
  logits are scored ``unary[c] + <A[prev] * (W h), B[c]>`` with ``prev`` the *true* token
  before the slot (teacher forcing: the selector's walk only matters for acceptance while
  the earlier drafts were right, and then they equal the true tokens); cross-entropy over
  the candidates against the true token where it is one of them (slots where it is not are
  left out), with the same slot weights, times ``--selector-weight``. Gradients reach the
  backbone through the unary term and ``h``.

Offline tau (256 held-back sequences, 8 random anchors each; accepted = leading drafts equal
to the sequence's next tokens) is logged for the selector's greedy walk and for the unary
term alone (selector off), before and after training, and for the ``--init-dflash`` drafter
itself on the same blocks.

Usage::

    python tools/demo_pair/train_dflash2.py --data build/demo_pair --out OUT \\
        --init-target resources/models/demo-target --init-dflash resources/models/demo-dflash
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
from tools.demo_pair.dflash2_modeling import (  # noqa: E402
    DFlash2Drafter,
    DFlash2Spec,
    export_dflash2,
    init_from_dflash,
    window_mask,
)
from tools.demo_pair.modeling import (  # noqa: E402
    SHAPES,
    TargetSpec,
    build_target,
    drafter_shape,
    target_logits_and_taps,
)
from tools.demo_pair.train import (  # noqa: E402
    IGNORE,
    drafter_batch,
    length_batches,
    load_dataset,
    load_exported,
    log,
    optimizer_step,
    scheduled_lr,
    target_continuations,
)


def batch_to(dev, *tensors):
    """Move tensors to ``dev``."""
    return [t.to(dev) for t in tensors]


def prepare(seqs, plens, dspec: DFlash2Spec, n_anchor: int, rng: random.Random, dev):
    """``train.drafter_batch`` plus the sliding window (``|q - k| <= window - 1``) on the
    mask and the true predecessor of every block row (the token at position ``pos - 1``)."""
    ids, blk_ids, labels, blk_pos, mask = drafter_batch(seqs, plens, dspec, n_anchor, rng, 0)
    S = ids.shape[1]
    k_pos = torch.cat([torch.arange(S)[None].expand(ids.shape[0], -1), blk_pos], dim=1)
    mask = mask & window_mask(blk_pos, k_pos, dspec.sliding_window)
    prev = ids.gather(1, (blk_pos - 1).clamp(0, S - 1))
    return batch_to(dev, ids, blk_ids, labels, blk_pos, mask, prev)


def forward(drafter, target, embed, dspec, ids, blk_ids, blk_pos, mask):
    """Final states ``(R, A*B, H)`` and float logits ``(R, A*B, V)`` (target frozen)."""
    with torch.no_grad():
        _, taps = target_logits_and_taps(target, ids, dspec.target_layer_ids)
    ctx = drafter.context([t.float() for t in taps])
    x = F.embedding(blk_ids, embed)
    h = drafter(x, ctx, torch.arange(ids.shape[1], device=ids.device), blk_pos, mask)
    return h, (h @ embed.T).float()


def selector_loss(sel, h, logits, labels, prev, weights, top_k: int):
    """The selector's cross-entropy (module docstring); returns (loss, share of labelled
    slots whose true token is among the candidates)."""
    lab = labels.reshape(-1)
    rows = (lab != IGNORE).nonzero()[:, 0]
    if rows.numel() == 0:
        return logits.sum() * 0.0, 0.0
    lg = logits.reshape(-1, logits.shape[-1])[rows]
    cand, unary = sel.candidates(lg, top_k)
    score = unary + sel.pairwise(h.reshape(-1, h.shape[-1])[rows], prev.reshape(-1)[rows], cand)
    hit = cand == lab[rows, None]
    found = hit.any(-1)
    w = weights.reshape(-1)[rows] * found.float()
    ce = torch.logsumexp(score, -1) - (score * hit.float()).sum(-1)
    return (ce * w).sum() / w.sum().clamp_min(1e-6), float(found.float().mean())


def train(drafter, target, seqs, plens, dspec, args, dev, logd):
    """AdamW, cosine on the larger of the step and the time fraction, clip 1.0."""
    rng = random.Random(args.seed + 1)
    embed = target.model.embed_tokens.weight.detach().float()
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    B = dspec.block_size
    w = torch.tensor([0.0] + [math.exp(-(k - 1) / args.gamma) for k in range(1, B)], device=dev)
    lengths = [len(s) for s in seqs]
    total, step, t0 = args.steps, 0, time.time()
    found_log = []
    drafter.train()
    while step < total:
        for b in length_batches(lengths, args.batch_tokens, rng, max_rows=256):
            if step >= total:
                break
            ids, blk_ids, labels, blk_pos, mask, prev = prepare(
                [seqs[i] for i in b], [plens[i] for i in b], dspec, args.anchors, rng, dev)
            for g in opt.param_groups:
                g["lr"] = scheduled_lr(step, total, t0, args.time_train, args.lr)
            slot_w = w.repeat(args.anchors)[None].expand_as(labels)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                h, logits = forward(drafter, target, embed, dspec, ids, blk_ids, blk_pos, mask)
            sel, found = selector_loss(drafter.candidate_selector, h, logits, labels, prev,
                                       slot_w, dspec.selector_top_k)
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                 ignore_index=IGNORE, reduction="none")
            valid = (labels.reshape(-1) != IGNORE).float()
            sw = slot_w.reshape(-1) * valid
            backbone = (ce * sw).sum() / sw.sum().clamp_min(1e-6)
            loss = backbone + args.selector_weight * sel
            found_log.append(found)
            step, total = optimizer_step(opt, drafter, loss, step, total, t0, args.time_train,
                                         "dflash2", logd)
            if step % 100 == 0 or step == total:
                logd.setdefault("dflash2_parts", []).append(
                    [step, round(backbone.item(), 4), round(sel.item(), 4),
                     round(float(np.mean(found_log[-100:])), 4)])
    logd["steps"] = step
    logd["train_seconds"] = round(time.time() - t0, 1)
    drafter.eval()


@torch.no_grad()
def offline_tau(drafter, target, seqs, plens, dspec, dev) -> dict:
    """Offline tau of the selector's greedy walk and of the unary term alone, on 8 random
    anchors (fixed seed) of each sequence."""
    rng = random.Random(123)
    embed = target.model.embed_tokens.weight.detach().float()
    B = dspec.block_size
    acc = {"selector": [], "no_selector": []}
    for i in range(0, len(seqs), 16):
        chunk = range(i, min(i + 16, len(seqs)))
        ids, blk_ids, labels, blk_pos, mask, _ = prepare(
            [seqs[j] for j in chunk], [plens[j] for j in chunk], dspec, 8, rng, dev)
        h, logits = forward(drafter, target, embed, dspec, ids, blk_ids, blk_pos, mask)
        R = ids.shape[0]
        h = h.view(R * 8, B, -1)[:, 1:]
        logits = logits.view(R * 8, B, -1)[:, 1:]
        lab = labels.view(R * 8, B)[:, 1:].cpu()
        anchor = blk_ids.view(R * 8, B)[:, 0]
        sel = drafter.candidate_selector
        for key, pair in (("selector", True), ("no_selector", False)):
            drafts = sel.walk(h, logits, anchor, dspec.selector_top_k, pairwise=pair).cpu()
            ok = (drafts == lab) & (lab != IGNORE)
            used = (lab != IGNORE).any(-1)
            n_acc = ok.long().cumprod(-1).sum(-1)
            acc[key].extend(n_acc[used].tolist())
    out = {}
    for key, a in acc.items():
        a = np.asarray(a, dtype=np.float64)
        out[key] = {"tau_offline": round(float((a + 1).mean()), 3),
                    "accepted_mean": round(float(a.mean()), 3), "blocks": int(len(a))}
    return out


def stored(drafter, only=None) -> int:
    """float16 bytes of the drafter's tensors (``only``: name filter)."""
    return 2 * sum(v.numel() for k, v in drafter.state_dict().items()
                   if only is None or only(k))


def main(argv=None) -> int:
    """Entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description="train a DFlash2 drafter for the demo target")
    p.add_argument("--data", type=Path, required=True, help="build folder (dataset.npz)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--name", default="demo-dflash2", help="export folder under --out")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shape", choices=sorted(SHAPES), default="h384-l6-a3")
    p.add_argument("--init-target", type=Path, required=True)
    p.add_argument("--init-dflash", type=Path, help="DFlash drafter export for the backbone")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=0, help="MLP size (0: the target's)")
    p.add_argument("--selector-rank", type=int, default=32)
    p.add_argument("--top-k", type=int, default=16)
    p.add_argument("--freeze-backbone", action="store_true",
                   help="train only the convolutions and the selector")
    p.add_argument("--continuations", type=Path,
                   help="npz cache of the continuations: read if present, else written")
    p.add_argument("--gen-only", action="store_true", help="write --continuations and stop")
    p.add_argument("--gen-prompts", type=int, default=20_000)
    p.add_argument("--gen-batch", type=int, default=1024)
    p.add_argument("--max-new", type=int, default=200)
    p.add_argument("--time-gen", type=float, default=60.0)
    p.add_argument("--eval-seqs", type=int, default=256)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--lr", type=float, default=8e-4)
    p.add_argument("--batch-tokens", type=int, default=48_000)
    p.add_argument("--anchors", type=int, default=24)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--selector-weight", type=float, default=1.0)
    p.add_argument("--time-train", type=float, default=240.0,
                   help="seconds; training stops there if the steps are not done (0: off)")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device(args.device)
    t_start = time.time()
    specs = json.loads((args.data / "specs.json").read_text())
    tspec = TargetSpec(**specs["target"], **SHAPES[args.shape])
    logd: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    target = build_target(tspec)
    load_exported(target, args.init_target, tied=True)
    target = target.to(dev).eval()
    for prm in target.parameters():
        prm.requires_grad_(False)
    log(f"target from {args.init_target}, device {dev}")

    if args.continuations and args.continuations.exists():
        z = np.load(args.continuations)
        # One read of each array: NpzFile.__getitem__ reads the file again on every access.
        offs, tokens = z["offsets"], z["tokens"]
        seqs = [tokens[offs[i]:offs[i + 1]].astype(np.int64) for i in range(len(offs) - 1)]
        plens = [int(x) for x in z["prompt_lens"]]
        logd["continuations"] = f"read from {args.continuations}"
        log(f"{len(seqs)} continuations read from {args.continuations}")
    else:
        data = load_dataset(args.data / "dataset.npz")
        seqs, plens = target_continuations(target, data, args, tspec, dev, logd)
        if args.continuations:
            args.continuations.parent.mkdir(parents=True, exist_ok=True)
            offs = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
            np.savez(args.continuations, tokens=np.concatenate(seqs).astype(np.uint16),
                     offsets=offs, prompt_lens=np.asarray(plens))
            log(f"continuations written to {args.continuations}")
    if args.gen_only:
        return 0

    dfields = drafter_shape(tspec, args.layers)
    if args.intermediate:
        dfields["intermediate_size"] = args.intermediate
    dspec = DFlash2Spec(**specs["drafter"], **dfields, selector_rank=args.selector_rank,
                        selector_top_k=args.top_k)
    drafter = DFlash2Drafter(dspec)
    n_eval = min(args.eval_seqs, len(seqs) // 10)
    ev_s, ev_p = seqs[:n_eval], plens[:n_eval]
    if args.init_dflash:
        # The DFlash drafter itself on the eval blocks: a DFlash2 drafter of its shape with
        # the identity convolutions and a zero pairwise term computes exactly that drafter.
        dcfg = json.loads((args.init_dflash / "config.json").read_text())
        base_fields = dict(dfields, num_hidden_layers=dcfg["num_hidden_layers"],
                           intermediate_size=dcfg["intermediate_size"])
        base = DFlash2Drafter(DFlash2Spec(**specs["drafter"], **base_fields,
                                          selector_rank=1, selector_top_k=args.top_k))
        init_from_dflash(base, args.init_dflash)
        logd["tau_dflash"] = offline_tau(base.to(dev).eval(), target, ev_s, ev_p, base.spec,
                                         dev)["no_selector"]
        log(f"DFlash drafter {args.init_dflash}: {logd['tau_dflash']}")
        del base
        copied = init_from_dflash(drafter, args.init_dflash)
        logd["init_copied_tensors"] = len(copied)
        log(f"backbone: {len(copied)} tensors from {args.init_dflash}")
    if args.freeze_backbone:
        for name, prm in drafter.named_parameters():
            prm.requires_grad_("_conv." in name or name.startswith("candidate_selector."))
    drafter = drafter.to(dev)
    logd["params"] = sum(p.numel() for p in drafter.parameters())
    logd["trainable_params"] = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    logd["fp16_bytes"] = stored(drafter)
    logd["fp16_bytes_conv_and_selector"] = stored(
        drafter, lambda k: "_conv." in k or k.startswith("candidate_selector."))
    log(f"drafter {dspec.num_hidden_layers} layers, rank {dspec.selector_rank}: "
        f"{logd['params']} params, {logd['fp16_bytes']} fp16 bytes")
    logd["tau_init"] = offline_tau(drafter, target, ev_s, ev_p, dspec, dev)
    log(f"tau before training {logd['tau_init']}")
    train(drafter, target, seqs[n_eval:], plens[n_eval:], dspec, args, dev, logd)
    logd["tau_eval"] = offline_tau(drafter, target, ev_s, ev_p, dspec, dev)
    log(f"tau after training {logd['tau_eval']}")
    export_dflash2(drafter, args.out / args.name)
    logd["seconds"] = round(time.time() - t_start, 1)
    (args.out / args.name / "train_log.json").write_text(json.dumps(logd, indent=1) + "\n")
    log(f"all done in {logd['seconds']}s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
