"""Check that what ``modeling.py`` exports computes the same in MLX as in torch (float32).

Two stages, one per venv (torch and MLX never share one here)::

    .venv-train/bin/python tools/demo_pair/check_parity.py torch /tmp/parity [SHAPE]
    .venv/bin/python -m tools.demo_pair.check_parity mlx /tmp/parity

``torch``: builds a random target (norm weights perturbed so the zero-centred-norm shift
matters) and drafter, exports both in float32, stores inputs and torch logits.
``mlx``: loads the target with mlx-lm (``mlx_lm.utils.load_model``) and the drafter with
``app.engine.drafter``, and prints the largest absolute logit differences (expected ~1e-5).
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


SHAPE = "h320-l8-a4"

if __name__ == "__main__":
    stage, folder = sys.argv[1], Path(sys.argv[2])
    if len(sys.argv) > 3:
        SHAPE = sys.argv[3]
    folder.mkdir(parents=True, exist_ok=True)
    torch_stage(folder) if stage == "torch" else mlx_stage(folder)
