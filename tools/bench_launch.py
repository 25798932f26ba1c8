"""A 16-token verify pass against a 1-token step under this process's MLX launch settings (JSON).

    python tools/bench_launch.py [--dtypes bfloat16,4bit] [--repeats 10] [--prefix 128]
                                 [--layers N] [--hidden N] [--vocab N] [--out FILE]

Made for issue #21's last goal (a Qwen3.5-4B-shaped target verifies 16 tokens for at most 1.5
steps on MLX's CUDA backend). A step runs ~850 CUDA kernels and the GPU is busy for about half
of its time (``tools/trace_verify.py``), so how MLX launches them may matter: its CUDA backend
records kernels into CUDA graphs of ``MLX_MAX_OPS_PER_BUFFER`` operations (100 on an
H100/H200), each updated in place from a cache of ``MLX_CUDA_GRAPH_CACHE_SIZE`` or, when one of
its nodes cannot be updated (a kernel with a cluster shape other than ``(x, 1, 1)``),
instantiated anew; ``MLX_USE_CUDA_GRAPHS=0`` launches every kernel on the stream instead.
MLX reads these variables once per process, so ``tools/gpu_measure.sh launch`` runs this
script once per setting (docs/history/performance-log.md, "Where a 16-token verify's extra
time goes" and "Exact on CUDA by default").

Per dtype (``bfloat16``; ``4bit``: affine, group 64, bf16 scales) of ``tools/bench_gpu.py``'s
random Qwen3.5-4B-shaped target, after ``--prefix`` cached tokens, median ms of:

* ``step_ms`` / ``verify16_ms``: a 1-token step and a 16-token verify pass (taps and tapes),
  each built and waited for (what ``bench_gpu.py`` reports), and ``verify16_over_step``;
* ``build_step_ms`` / ``build_verify16_ms``: the Python side only (building the lazy graph);
* ``pipelined_step_ms``: 16 steps queued back to back with ``mx.async_eval`` and waited for
  once, per step (how plain decoding runs); ``pipelined_build_ms`` and
  ``pipelined_async_eval_ms``: the host's time per step in building the graph and inside the
  ``async_eval`` call (where the kernels are encoded; a call that waits for the GPU shows
  here);
* ``product_build_us`` / ``mlx_product_build_us``: the host time to build one 1-row product of
  the first linear layer as the model calls it and through MLX's own layer
  (:func:`product_build_us`; they differ when ``DFLASH_ROW_PRODUCTS`` sends it to
  ``app/engine/kernels/row_products.py``'s kernel).

A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The MLX environment variables that shape how the CUDA backend launches kernels.
LAUNCH_VARIABLES = ("MLX_USE_CUDA_GRAPHS", "MLX_MAX_OPS_PER_BUFFER", "MLX_MAX_MB_PER_BUFFER",
                    "MLX_CUDA_GRAPH_CACHE_SIZE", "MLX_CUDA_USE_CUDNN_SDPA",
                    "DFLASH_ROW_PRODUCTS")


def passes(model, taps: list[int], prefix: int):
    """``(build, restore)`` for a ``qwen3_5`` model after ``prefix`` cached tokens:
    ``build(length)`` returns the lazy outputs of a 1-token step (last logits) or of a
    ``length``-token verify pass (taps and tapes); ``restore(length)`` puts the cache back as
    it was before ``length`` positions were added."""
    import mlx.core as mx

    from app.engine.target import TargetRunner, trim_attention

    runner = TargetRunner(model, "qwen3_5")
    cache = runner.make_cache()
    ids = mx.array([[1 + i % 50 for i in range(prefix)]], dtype=mx.int32)
    mx.eval(runner.forward(ids, cache, taps=taps, all_logits=False))
    snapshot = [list(c.cache) if lin else None for c, lin in zip(cache, runner.linear)]

    def restore(length: int) -> None:
        for c, kept in zip(cache, snapshot):
            if kept is not None:
                c.cache = list(kept)
        trim_attention(cache, runner.linear, length)

    def build(length: int) -> list:
        block = mx.array([[7] * length], dtype=mx.int32)
        if length == 1:
            return [runner.forward(block, cache, all_logits=False)[0]]
        return list(runner.forward(block, cache, taps=taps, tapes=[]))

    return build, restore


def measure(model, taps: list[int], prefix: int, repeats: int) -> dict:
    """The figures of the module docstring for one loaded ``qwen3_5`` model."""
    import mlx.core as mx

    build, restore = passes(model, taps, prefix)
    out: dict = {}
    for length, name in ((1, "step"), (16, "verify16")):
        mx.eval(build(length))  # this shape's kernels
        restore(length)
        whole, graph = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            arrays = build(length)
            t1 = time.perf_counter()
            mx.eval(arrays)
            whole.append(1000 * (time.perf_counter() - t0))
            graph.append(1000 * (t1 - t0))
            restore(length)
        out[f"{name}_ms"] = statistics.median(whole)
        out[f"build_{name}_ms"] = statistics.median(graph)
    out["verify16_over_step"] = out["verify16_ms"] / out["step_ms"]
    runs, built, queued = [], [], []
    for _ in range(max(3, repeats // 3)):
        t0 = time.perf_counter()
        for _ in range(16):
            t1 = time.perf_counter()
            arrays = build(1)
            t2 = time.perf_counter()
            mx.async_eval(arrays)
            built.append(1000 * (t2 - t1))
            queued.append(1000 * (time.perf_counter() - t2))
        mx.eval(build(1))
        runs.append(1000 * (time.perf_counter() - t0) / 17)
        restore(17)
    out["pipelined_step_ms"] = statistics.median(runs)
    out["pipelined_build_ms"] = statistics.median(built)
    out["pipelined_async_eval_ms"] = statistics.median(queued)
    out["verify16_over_pipelined_step"] = out["verify16_ms"] / out["pipelined_step_ms"]
    out.update(product_build_us(model))
    return out


def product_build_us(model, calls: int = 500) -> dict:
    """Host time to build one 1-row product of the model's first linear layer (graph only,
    not run), in microseconds: ``product_build_us`` through the layer as the model calls it
    (``app/engine/kernels/row_products.py``'s kernel when ``DFLASH_ROW_PRODUCTS`` takes it) and
    ``mlx_product_build_us`` through MLX's own layer class."""
    import mlx.core as mx
    import mlx.nn as nn

    layer = next(m for _, m in model.named_modules()
                 if isinstance(m, (nn.Linear, nn.QuantizedLinear)))
    base = nn.QuantizedLinear if isinstance(layer, nn.QuantizedLinear) else nn.Linear
    dtype = layer["scales"].dtype if isinstance(layer, nn.QuantizedLinear) else layer["weight"].dtype
    k = layer["weight"].shape[1] * (32 // layer.bits if isinstance(layer, nn.QuantizedLinear) else 1)
    x = mx.zeros((1, 1, k), dtype)
    out = {}
    for name, fn in (("product_build_us", layer), ("mlx_product_build_us",
                                                   lambda v: base.__call__(layer, v))):
        fn(x)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(x)
        out[name] = 1e6 * (time.perf_counter() - t0) / calls
    return out


def run_per_dtype(doc: str, figures, argv: list[str] | None, count: str = "--repeats",
                  count_default: int = 10) -> int:
    """The command line shared by this script and ``tools/trace_verify.py``: build
    ``bench_gpu.py``'s random Qwen3.5-4B-shaped target in each of ``--dtypes`` and print, as
    JSON, the device, MLX's version, the :data:`LAUNCH_VARIABLES` set and
    ``figures(model, taps, prefix, n)`` per dtype (``n`` from the ``count`` option)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--dtypes", default="bfloat16,4bit")
    p.add_argument(count, type=int, default=count_default)
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    import mlx.core as mx
    from bench_gpu import emit_json, qwen35_4b_config, random_target

    result: dict = {"device": str(mx.default_device()), "mlx": mx.__version__,
                    "env": {k: os.environ[k] for k in LAUNCH_VARIABLES if k in os.environ}}
    config = qwen35_4b_config(args.layers, args.hidden, args.vocab)
    n = config["num_hidden_layers"]
    taps = sorted({1, n // 3, (2 * n) // 3, n - 2} & set(range(n)))
    for dtype in [d for d in args.dtypes.split(",") if d]:
        model = random_target(config, dtype)
        result[dtype] = figures(model, taps, args.prefix, getattr(args, count.lstrip("-")))
        del model
        mx.clear_cache()
    return emit_json(result, args.out)


def main(argv: list[str] | None = None) -> int:
    return run_per_dtype(__doc__, measure, argv)


if __name__ == "__main__":
    raise SystemExit(main())
