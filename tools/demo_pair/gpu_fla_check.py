"""Device-side check that flash-linear-attention's kernels run the target's Gated DeltaNet
(one forward and backward under bf16 autocast, finite loss); exits 1 if not.

Usage (on the GPU machine): ``python3 tools/demo_pair/gpu_fla_check.py SHAPE``
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.demo_pair.modeling import SHAPES, TargetSpec, build_target  # noqa: E402


def main() -> int:
    """Run one forward/backward of a random target of ``SHAPE`` with fla importable."""
    t0 = time.time()
    try:
        import fla  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"fla import failed: {exc!r}")
        return 1
    torch.manual_seed(0)
    spec = TargetSpec(vocab_size=4096, **SHAPES[sys.argv[1]])
    model = build_target(spec).cuda()
    ids = torch.randint(0, 4096, (4, 700), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, 4096),
                                             ids[:, 1:].reshape(-1))
    loss.backward()
    print(f"fla forward/backward ok: loss {loss.item():.4f} ({time.time() - t0:.1f}s)")
    return 0 if torch.isfinite(loss) else 1


if __name__ == "__main__":
    raise SystemExit(main())
