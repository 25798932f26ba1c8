"""Time mlx-lm's Gated DeltaNet step loop against the chunked form on this machine.

Usage: ``.venv/bin/python tools/bench_gdn.py [--repeats N] [--chunk-size C] [--lengths T ...]
[--shape NAME]``

For T = 1, 4, 8, 16, 64 tokens at a Qwen3.5-4B-like head shape (Hk 16, Hv 32, Dk 128,
Dv 128, B 1) and at the bundled demo pair's shape (Hk 4, Hv 8, Dk 32, Dv 32, B 1), prints the
median wall time (ms) of ``gated_delta_ops`` (mlx-lm's loop of one compiled step per token)
and of ``app.engine.gdn_chunked.chunked_gated_delta`` (``chunked``: the default, eager;
``compiled``: ``compiled=True``, mx.compile'd, whose first call per shape builds C++ kernels;
``blocked``: eager with the matmul-only triangular inverse used on non-CPU devices), each
call forced with ``mx.eval`` after warm-up, plus the largest absolute differences between
the loop's and the chunked form's outputs and final states.
The header names the device and the BLAS libraries mapped into this process (read from
``/proc/self/maps`` on Linux). A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.gated_delta import gated_delta_ops

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine import gdn_chunked  # noqa: E402

SHAPES = {
    "qwen3.5-4b-like": dict(hk=16, hv=32, dk=128, dv=128),
    "demo pair": dict(hk=4, hv=8, dk=32, dv=32),
}
LENGTHS = (1, 4, 8, 16, 64)


def blas_libraries() -> list[str]:
    """Return the paths of BLAS/LAPACK-like shared libraries mapped into this process."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return ["(unknown: no /proc/self/maps on this system)"]
    names = set()
    for line in maps.read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        low = path.lower()
        if any(word in low for word in ("blas", "lapack", "mkl", "accelerate")):
            names.add(path)
    return sorted(names) or ["(none mapped)"]


def make_inputs(t: int, hk: int, hv: int, dk: int, dv: int, seed: int = 0):
    """Random inputs shaped like a Gated DeltaNet layer's (q, k unit-norm, q scaled)."""
    mx.random.seed(seed)
    q = mx.random.normal((1, t, hk, dk))
    k = mx.random.normal((1, t, hk, dk))
    q = q / mx.linalg.norm(q, axis=-1, keepdims=True) * dk**-0.5
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)
    v = mx.random.normal((1, t, hv, dv))
    g = mx.random.uniform(0.8, 1.0, (1, t, hv))
    beta = mx.random.uniform(0.0, 1.0, (1, t, hv))
    state = mx.random.normal((1, hv, dv, dk)) * 0.1
    mx.eval(q, k, v, g, beta, state)
    return q, k, v, g, beta, state


def median_ms(fn, repeats: int) -> float:
    """Median wall time of ``mx.eval(fn())`` in milliseconds, after two warm-up calls."""
    for _ in range(2):
        mx.eval(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Print the timing table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=list(LENGTHS), help="token counts T"
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), help="only this head shape")
    args = parser.parse_args(argv)

    print(f"mlx {mx.__version__}, device {mx.default_device()}, {platform.machine()}")
    print("BLAS/LAPACK mapped:", ", ".join(blas_libraries()))
    print(f"chunk size {args.chunk_size}, median of {args.repeats} after 2 warm-ups, ms")
    header = f"{'shape':<17}{'T':>4}{'step loop':>11}{'chunked':>10}{'compiled':>10}{'blocked':>10}"
    print(header + f"{'loop/chunked':>14}{'max |dy|':>11}{'max |ds|':>11}")
    for name, shape in SHAPES.items():
        if args.shape and name != args.shape:
            continue
        for t in args.lengths:
            inputs = make_inputs(t, **shape)
            loop = partial(gated_delta_ops, *inputs)
            chunked = partial(
                gdn_chunked.chunked_gated_delta, *inputs, chunk_size=args.chunk_size
            )
            compiled = partial(chunked, compiled=True)
            t_loop = median_ms(loop, args.repeats)
            t_chunk = median_ms(chunked, args.repeats)
            t_comp = median_ms(compiled, args.repeats)
            saved = gdn_chunked._unit_lower_inverse
            gdn_chunked._unit_lower_inverse = gdn_chunked._block_unit_lower_inverse
            try:
                t_block = median_ms(chunked, args.repeats)
            finally:
                gdn_chunked._unit_lower_inverse = saved
            (y0, s0), (y1, s1) = loop(), chunked()
            dy = mx.abs(y0 - y1).max().item()
            ds = mx.abs(s0 - s1).max().item()
            print(
                f"{name:<17}{t:>4}{t_loop:>11.3f}{t_chunk:>10.3f}{t_comp:>10.3f}{t_block:>10.3f}"
                f"{t_loop / t_chunk:>14.2f}{dy:>11.2e}{ds:>11.2e}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
