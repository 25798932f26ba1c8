"""What one kernel costs for 1 row against 16 rows, at Qwen3.5-4B's shapes (JSON).

    python tools/bench_small_m.py [--dtypes bfloat16,4bit] [--chain 64] [--repeats 10]
                                  [--keys 144] [--out FILE]

Made for issue #21's last goal (a 16-token verify <= 1.5x a 1-token step on the H200 through
MLX's CUDA backend). ``tools/profile_verify.py`` found the extra cost of 16 tokens spread over
the matrix products, attention over 16 queries and the GDN mixer's element-wise stages, each
part timed with a host round trip. Here each operation is queued ``--chain`` times on
independent inputs and waited for once, so the figure is the device's cost per call (launch
included, host round trip amortised):

* ``matmul``: ``x @ W.T`` for the target's projection shapes (``QWEN35_4B`` of
  ``tools/bench_gpu.py``: hidden 2560, MLP 9216, GDN in/out projections, attention q/k/v/o),
  ``x`` of 1 and of 16 rows; for ``4bit``, ``mx.quantized_matmul`` (group 64, bf16 scales);
* ``sdpa``: ``mx.fast.scaled_dot_product_attention`` with 1 and 16 queries (16 query heads,
  4 key/value heads, head dim 256) over ``--keys`` cached positions, causal for 16.

Milliseconds per call, medians over ``--repeats`` chains. A benchmark: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# (name, out features, in features) of one layer's products at Qwen3.5-4B's shapes.
SHAPES = [
    ("mlp_gate_up", 2 * 9216, 2560),
    ("mlp_down", 2560, 9216),
    ("gdn_in_qkvz", 16 * 128 * 2 + 32 * 128 * 2, 2560),
    ("gdn_out", 2560, 32 * 128),
    ("attn_qkv", 16 * 256 * 2 + 2 * 4 * 256, 2560),
    ("attn_o", 2560, 16 * 256),
]


def _per_call_ms(make, chain: int, repeats: int) -> float:
    """Median over ``repeats`` of (time to evaluate ``chain`` calls of ``make(i)``) / chain."""
    import mlx.core as mx

    mx.eval([make(i) for i in range(chain)])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval([make(i) for i in range(chain)])
        times.append(1000 * (time.perf_counter() - t0) / chain)
    return round(statistics.median(times), 4)


def run(dtypes: list[str], chain: int, repeats: int, keys: int) -> dict:
    """The JSON result: per dtype and shape, ms per call for 1 and 16 rows and their ratio."""
    import mlx.core as mx

    out: dict = {"device": str(mx.default_device()), "mlx": mx.__version__, "chain": chain,
                 "repeats": repeats, "matmul": {}, "sdpa": {}}
    for dt in dtypes:
        rows = {}
        for name, n_out, n_in in SHAPES:
            w = (mx.random.normal((n_out, n_in)) * 0.02).astype(mx.bfloat16)
            if dt == "4bit":
                wq, s, b = mx.quantize(w, group_size=64, bits=4)
                mx.eval(wq, s, b)
            else:
                mx.eval(w)
            row = {}
            for m in (1, 16):
                xs = [mx.random.normal((m, n_in)).astype(mx.bfloat16) for _ in range(chain)]
                mx.eval(xs)
                if dt == "4bit":
                    fn = lambda i, xs=xs: mx.quantized_matmul(  # noqa: E731
                        xs[i], wq, s, b, transpose=True, group_size=64, bits=4)
                else:
                    fn = lambda i, xs=xs: xs[i] @ w.T  # noqa: E731
                row[f"m{m}_ms"] = _per_call_ms(fn, chain, repeats)
            row["ratio"] = round(row["m16_ms"] / row["m1_ms"], 2)
            rows[name] = row
        out["matmul"][dt] = rows
    k = mx.random.normal((1, 4, keys, 256)).astype(mx.bfloat16)
    v = mx.random.normal((1, 4, keys, 256)).astype(mx.bfloat16)
    for m in (1, 16):
        qs = [mx.random.normal((1, 16, m, 256)).astype(mx.bfloat16) for _ in range(chain)]
        mx.eval(k, v, qs)
        mask = "causal" if m > 1 else None
        out["sdpa"][f"q{m}_ms"] = _per_call_ms(
            lambda i, qs=qs, mask=mask: mx.fast.scaled_dot_product_attention(
                qs[i], k, v, scale=256 ** -0.5, mask=mask), chain, repeats)
    out["sdpa"]["ratio"] = round(out["sdpa"]["q16_ms"] / out["sdpa"]["q1_ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module doc."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="bfloat16,4bit")
    p.add_argument("--chain", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--keys", type=int, default=144)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    result = run([d for d in a.dtypes.split(",") if d], a.chain, a.repeats, a.keys)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
