"""What the GPU itself does in a 1-token step and a 16-token verify pass: kernels, busy time (JSON).

    python tools/trace_verify.py [--dtypes bfloat16,4bit] [--passes 5] [--prefix 128]
                                 [--layers N] [--hidden N] [--vocab N] [--out FILE]

Made for issue #21 on a GPU host that has PyTorch (the H200 host does): PyTorch's profiler
records, through CUPTI, every CUDA kernel the process runs, MLX's included. For each pass
length of ``tools/bench_gpu.py``'s random Qwen3.5-4B-shaped target (taps and tapes for the
16-token pass, as a DFlash cycle verifies), per pass:

* ``wall_ms``: built and waited for, as ``bench_gpu.py`` times it;
* ``kernels``: CUDA kernels run; ``gpu_busy_ms``: their summed durations;
* ``top``: the kernels that take the most time, with count and ms per pass.

When ``gpu_busy_ms`` is far below ``wall_ms``, the pass is bound by the host (building the
graph, launching kernels), not by the GPU. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def trace(model, taps: list[int], prefix: int, passes: int) -> dict:
    """Per-pass figures (module docstring) for S = 1 and S = 16 on one ``qwen3_5`` model."""
    import bench_launch
    import mlx.core as mx
    import torch
    from torch.profiler import ProfilerActivity, profile

    build, restore = bench_launch.passes(model, taps, prefix)

    def one_pass(length: int) -> None:
        mx.eval(build(length))
        restore(length)

    out: dict = {}
    for length in (1, 16):
        for _ in range(3):
            one_pass(length)  # kernels built, caches warm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(passes):
                one_pass(length)
            wall = (time.perf_counter() - t0) / passes
        kernels = [e for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name: dict = collections.defaultdict(lambda: [0, 0.0])
        for e in kernels:
            by_name[e.name][0] += 1
            by_name[e.name][1] += e.time_range.elapsed_us() / 1000
        top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:15]
        out[f"S{length}"] = {
            "wall_ms": 1000 * wall,
            "kernels": len(kernels) / passes,
            "gpu_busy_ms": sum(v[1] for v in by_name.values()) / passes,
            "top": [{"kernel": name[:120], "count": c / passes, "ms": ms / passes}
                    for name, (c, ms) in top],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    from bench_launch import run_per_dtype

    return run_per_dtype(__doc__, trace, argv, "--passes", 5)


if __name__ == "__main__":
    raise SystemExit(main())
