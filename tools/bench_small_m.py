"""What one kernel costs for 1 row against 16 rows, at Qwen3.5-4B's shapes (JSON).

    python tools/bench_small_m.py [--dtypes bfloat16,4bit] [--chain 64] [--repeats 10]
                                  [--keys 144] [--no-mixer] [--out FILE]

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
  4 key/value heads, head dim 256) over ``--keys`` cached positions, causal for 16;
* ``mixer`` (bf16, one Gated DeltaNet layer's parts that grow with the positions, 1 and 16):
  ``recurrence`` (``app.engine.kernels.gdn_kernel.gated_delta_update``: the project's CUDA kernel on
  CUDA, mlx-lm's function elsewhere; 16 key / 32 value heads of 128, float32 state),
  ``conv`` (the depthwise causal convolution over 3 + S positions of 8,192 channels, kernel
  4, then SiLU), ``rms_norm`` (``mx.fast.rms_norm`` over 2,560).

Milliseconds per call, medians over ``--repeats`` chains. A benchmark: nothing is asserted.
"""

# Every closure below is timed at once, inside the loop iteration that made it:
# ruff: noqa: B023
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def mixer(chain: int, repeats: int) -> dict:
    """The ``mixer`` rows (see the module doc): ms per call for 1 and 16 positions."""
    import mlx.core as mx
    import mlx.nn as nn

    from app.engine.kernels.gdn_kernel import gated_delta_update, kernel_active

    bf = mx.bfloat16
    hk, hv, d, channels, hidden = 16, 32, 128, 2 * 16 * 128 + 32 * 128, 2560
    conv = nn.Conv1d(channels, channels, 4, groups=channels, bias=False)
    conv.set_dtype(bf)
    a_log, dt_bias = mx.zeros((hv,), dtype=bf), mx.ones((hv,), dtype=bf)
    state = mx.zeros((1, hv, d, d), dtype=mx.float32)
    norm_w = mx.ones((hidden,), dtype=bf)
    mx.eval(conv.parameters(), a_log, dt_bias, state, norm_w)
    out: dict = {"recurrence_impl": "cuda kernel" if kernel_active() else "mlx-lm"}
    for S in (1, 16):
        def r(*shape):
            return [mx.random.normal(shape).astype(bf) for _ in range(chain)]

        q, k, v, a, b = r(1, S, hk, d), r(1, S, hk, d), r(1, S, hv, d), r(1, S, hv), r(1, S, hv)
        xs, hs = r(1, S + 3, channels), r(1, S, hidden)
        mx.eval(q, k, v, a, b, xs, hs)
        out[f"recurrence_s{S}_ms"] = _per_call_ms(
            lambda i: gated_delta_update(q[i], k[i], v[i], a[i], b[i], a_log, dt_bias, state),
            chain, repeats)
        out[f"conv_s{S}_ms"] = _per_call_ms(lambda i: nn.silu(conv(xs[i])), chain, repeats)
        out[f"rms_norm_s{S}_ms"] = _per_call_ms(
            lambda i: mx.fast.rms_norm(hs[i], norm_w, 1e-6), chain, repeats)
    return out


def run(dtypes: list[str], chain: int, repeats: int, keys: int, with_mixer: bool = True
        ) -> dict:
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
    if with_mixer:
        out["mixer"] = mixer(chain, repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module doc."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="bfloat16,4bit")
    p.add_argument("--chain", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--keys", type=int, default=144)
    p.add_argument("--no-mixer", action="store_true", help="leave out the mixer rows")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    result = run([d for d in a.dtypes.split(",") if d], a.chain, a.repeats, a.keys,
                 not a.no_mixer)
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
