"""Check that what ``modeling.py`` exports computes the same in MLX as in torch (float32).

Two stages, one per venv (torch and MLX never share one here)::

    .venv-train/bin/python tools/demo_pair/check_parity.py torch /tmp/parity [SHAPE]
    .venv/bin/python -m tools.demo_pair.check_parity mlx /tmp/parity
    .venv-train/bin/python tools/demo_pair/check_parity.py torch2 /tmp/parity2 [SHAPE]
    .venv/bin/python -m tools.demo_pair.check_parity mlx2 /tmp/parity2
    .venv/bin/python -m tools.demo_pair.check_parity export2 DRAFTER_DIR [TARGET_DIR]

``torch``: builds a random target (norm weights perturbed so the zero-centred-norm shift
matters) and drafter, exports both in float32, stores inputs and torch logits.
``mlx``: loads the target with mlx-lm (``mlx_lm.utils.load_model``) and the drafter with
``app.engine.drafter``, and prints the largest absolute logit differences (expected ~1e-5).
``torch2``/``mlx2``: the same for the DFlash2 drafter (``dflash2_modeling.py`` against
``app.engine.dflash2`` loaded by ``app.models.loader.load_drafter``): random weights with
every convolution and the selector's codebooks perturbed away from their identity/zero
initialisation; compared are the block logits, the selector's pairwise scores over the
top-k candidates (with the torch walk's tokens as predecessors) and the greedy walk's drafts,
selector on and off.
``export2``: a trained DFlash2 export (``train_dflash2.py``) with the demo target through the
app's engine (``load_target``, ``load_drafter``, ``check_pair``, ``generate``): greedy
``dflash2`` tokens (selector on and off) must equal ``plain``'s on a few held-out prompts;
prints the mean accepted drafts per cycle.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def torch_stage(root: Path) -> None:
    """Random models -> float32 checkpoints + reference logits under ``root``."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.demo_pair.modeling import (
        SHAPES,
        Drafter,
        DrafterSpec,
        TargetSpec,
        build_target,
        drafter_shape,
        drafter_single_block_logits,
        export_drafter,
        export_target,
        target_logits_and_taps,
    )

    torch.manual_seed(0)
    spec = TargetSpec(vocab_size=300, **SHAPES[SHAPE])
    target = build_target(spec).eval()
    dspec = DrafterSpec(vocab_size=300, mask_token_id=299, **drafter_shape(spec))
    drafter = Drafter(dspec).eval()
    with torch.no_grad():
        for mod in (target, drafter):
            for p in mod.parameters():
                if p.ndim == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        ids = torch.randint(0, 299, (1, 40))
        logits, taps = target_logits_and_taps(target, ids, dspec.target_layer_ids)
        embed = target.model.embed_tokens.weight
        block = torch.tensor([int(ids[0, -1])] + [299] * (dspec.block_size - 1))
        dlogits = drafter_single_block_logits(drafter, embed, [t[:, :-1] for t in taps], block)
    export_target(target, spec, root / "target", dtype=torch.float32)
    export_drafter(drafter, root / "drafter", dtype=torch.float32)
    np.savez(root / "ref.npz", ids=ids.numpy(), logits=logits.numpy(),
             taps=torch.cat(taps, -1)[:, :-1].numpy(), block=block.numpy(),
             dlogits=dlogits.numpy(), embed=embed.detach().numpy())
    print(f"wrote {root}")


def mlx_stage(root: Path) -> dict:
    """Compare MLX logits with the stored torch ones; returns the max abs differences."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    from app.engine.drafter import DFlashDrafter, DrafterConfig

    ref = np.load(root / "ref.npz")
    model, _ = load_model(root / "target")
    out = np.array(model(mx.array(ref["ids"])))
    cfg = DrafterConfig.from_dict(json.loads((root / "drafter" / "config.json").read_text()))
    drafter = DFlashDrafter(cfg)
    drafter.load_weights(list(mx.load(str(root / "drafter" / "model.safetensors")).items()))
    embed = mx.array(ref["embed"])
    h = drafter(embed[mx.array(ref["block"])][None], mx.array(ref["taps"]), drafter.make_cache())
    dout = np.array(h @ embed.T)[0]
    res = {
        "target_max_abs_diff": float(np.abs(out - ref["logits"]).max()),
        "target_scale": float(np.abs(ref["logits"]).max()),
        "drafter_max_abs_diff": float(np.abs(dout - ref["dlogits"]).max()),
        "drafter_scale": float(np.abs(ref["dlogits"]).max()),
    }
    print(json.dumps(res))
    return res


def torch2_stage(root: Path) -> None:
    """Random target + DFlash2 drafter -> float32 checkpoints + reference outputs."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.demo_pair.dflash2_modeling import DFlash2Drafter, DFlash2Spec, export_dflash2
    from tools.demo_pair.modeling import (
        SHAPES,
        TargetSpec,
        build_target,
        drafter_shape,
        export_target,
        target_logits_and_taps,
    )

    torch.manual_seed(0)
    vocab, mask_id = 300, 299
    spec = TargetSpec(vocab_size=vocab, **SHAPES[SHAPE])
    target = build_target(spec).eval()
    dspec = DFlash2Spec(vocab_size=vocab, mask_token_id=mask_id, selector_rank=8,
                        selector_top_k=16, **drafter_shape(spec))
    drafter = DFlash2Drafter(dspec).eval()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
            elif "base_kernel" in name:
                p.add_(torch.randn_like(p) * 0.3)
            elif "kernel_projection" in name:
                p.normal_(std=0.05)
            elif "codebook" in name:
                p.normal_(std=1.0)
        ids = torch.randint(0, mask_id, (1, 40))
        _, taps = target_logits_and_taps(target, ids, dspec.target_layer_ids)
        taps = [t[:, :-1] for t in taps]
        embed = target.model.embed_tokens.weight
        anchor = int(ids[0, -1])
        block = torch.tensor([anchor] + [mask_id] * (dspec.block_size - 1))
        ctx = drafter.context(taps)
        s, nb = ctx.shape[1], block.shape[0]
        h = drafter(F_embedding(block[None], embed), ctx, torch.arange(s),
                    torch.arange(s, s + nb), torch.ones(nb, s + nb, dtype=torch.bool))
        dlogits = (h @ embed.T)[0]
        sel = drafter.candidate_selector
        hid, lg = h[:, 1:], dlogits[None, 1:]
        drafts = sel.walk(hid, lg, torch.tensor([anchor]), dspec.selector_top_k)[0]
        drafts_nosel = sel.walk(hid, lg, torch.tensor([anchor]), dspec.selector_top_k,
                                pairwise=False)[0]
        cand, _ = sel.candidates(lg[0], dspec.selector_top_k)
        prev = torch.cat([torch.tensor([anchor]), drafts[:-1]])
        pair = sel.pairwise(hid[0], prev, cand)
    export_target(target, spec, root / "target", dtype=torch.float32)
    export_dflash2(drafter, root / "drafter", dtype=torch.float32)
    np.savez(root / "ref.npz", taps=torch.cat(taps, -1).numpy(), block=block.numpy(),
             dlogits=dlogits.numpy(), embed=embed.detach().numpy(), drafts=drafts.numpy(),
             drafts_nosel=drafts_nosel.numpy(), cand=cand.numpy(), prev=prev.numpy(),
             pair=pair.numpy())
    print(f"wrote {root}")


def F_embedding(ids, table):  # noqa: N802 - torch's F.embedding, imported lazily
    import torch.nn.functional as F

    return F.embedding(ids, table)


def mlx2_stage(root: Path) -> dict:
    """DFlash2: MLX (``load_drafter``) against the stored torch outputs."""
    import mlx.core as mx

    from app.models.loader import load_drafter

    ref = np.load(root / "ref.npz")
    loaded = load_drafter(root / "drafter")
    drafter, cfg = loaded.model, loaded.config
    assert cfg.kind == "dflash2", cfg.kind
    embed = mx.array(ref["embed"])
    h = drafter(embed[mx.array(ref["block"])][None], mx.array(ref["taps"]), drafter.make_cache())
    dout = np.array(h @ embed.T)[0]
    hid, lg = h[0, 1:], (h @ embed.T)[0, 1:].astype(mx.float32)
    sel = drafter.candidate_selector
    anchor = int(ref["block"][0])
    drafts, cand, _ = sel.walk(hid, lg, anchor, cfg.selector_top_k)
    drafts_nosel, _, _ = sel.walk(hid, lg, anchor, cfg.selector_top_k, pairwise=False)
    proj = sel.hidden_projection(hid)
    ctx = sel.predecessor_codebook[mx.array(ref["prev"])] * proj
    pair = (sel.successor_codebook[mx.array(ref["cand"])] @ ctx[:, :, None])[..., 0]
    res = {
        "drafter_max_abs_diff": float(np.abs(dout - ref["dlogits"]).max()),
        "drafter_scale": float(np.abs(ref["dlogits"]).max()),
        "selector_pairwise_max_abs_diff": float(np.abs(np.array(pair) - ref["pair"]).max()),
        "selector_pairwise_scale": float(np.abs(ref["pair"]).max()),
        "candidates_equal": bool((np.array(cand) == ref["cand"]).all()),
        "walk_drafts_equal": bool((np.array(drafts) == ref["drafts"]).all()),
        "walk_drafts_nosel_equal": bool((np.array(drafts_nosel) == ref["drafts_nosel"]).all()),
        "walk_differs_from_nosel": bool((ref["drafts"] != ref["drafts_nosel"]).any()),
    }
    print(json.dumps(res))
    return res


def export2_stage(drafter_dir: Path, target_dir: Path | None = None) -> dict:
    """Greedy plain vs DFlash2 (selector on/off) through the app's API; raises on a
    difference."""
    from app.engine.events import CycleEvent, TokenEvent
    from app.engine.generate import GenerationConfig, generate
    from app.models.loader import check_pair, load_drafter, load_target

    repo = Path(__file__).resolve().parents[2]
    target_dir = target_dir or repo / "resources" / "models" / "demo-target"
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir)
    check_pair(target, drafter)
    assert drafter.config.kind == "dflash2", drafter.config.kind
    prompts = json.loads((Path(__file__).parent / "heldout_prompts.json").read_text())
    res: dict = {"prompts": 0, "identical": True}
    for item in prompts[:: max(1, len(prompts) // 3)][:3]:
        from app.chat.tools import tool_schemas

        ids = list(target.tokenizer.apply_chat_template(
            item["messages"], tools=tool_schemas() if item.get("tools") else None,
            add_generation_prompt=True, enable_thinking=item.get("enable_thinking", True)))
        runs = {}
        for mode, sel in (("plain", True), ("dflash2", True), ("dflash2", False)):
            toks, cyc = [], []
            cfg = GenerationConfig(mode=mode, max_tokens=48, block_size=16, selector=sel)
            for ev in generate(target, ids, cfg, None if mode == "plain" else drafter):
                if isinstance(ev, TokenEvent):
                    toks.append(ev.token_id)
                elif isinstance(ev, CycleEvent):
                    cyc.append(ev.accepted)
            runs[(mode, sel)] = (toks, cyc)
        plain = runs[("plain", True)][0]
        for key in (("dflash2", True), ("dflash2", False)):
            toks, cyc = runs[key]
            name = "selector" if key[1] else "no_selector"
            res.setdefault(f"accepted_per_cycle_{name}", []).append(
                round(float(np.mean(cyc)), 2) if cyc else None)
            if toks != plain:
                res["identical"] = False
        res["prompts"] += 1
    print(json.dumps(res))
    if not res["identical"]:
        raise SystemExit("DFlash2 tokens differ from plain")
    return res


SHAPE = "h320-l8-a4"

if __name__ == "__main__":
    stage, folder = sys.argv[1], Path(sys.argv[2])
    if stage == "export2":
        export2_stage(folder, Path(sys.argv[3]) if len(sys.argv) > 3 else None)
        raise SystemExit(0)
    if len(sys.argv) > 3:
        SHAPE = sys.argv[3]
    folder.mkdir(parents=True, exist_ok=True)
    {"torch": torch_stage, "mlx": mlx_stage, "torch2": torch2_stage,
     "mlx2": mlx2_stage}[stage](folder)
