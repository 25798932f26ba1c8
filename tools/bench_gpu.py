"""What a DFlash cycle costs on this MLX device (Apple GPU, CUDA or CPU), as one JSON object.

    python tools/bench_gpu.py [--shapes demo,qwen3.5-4b] [--dtypes float32,bfloat16,4bit]
                              [--repeats N] [--max-tokens N] [--prefix N]
                              [--layers N] [--hidden N] [--vocab N] [--out FILE]

Made for issue #21 (DFlash off Apple GPUs): the same figures on any device, so a GPU host and
this CPU can be compared. A benchmark, not a test: nothing is asserted.

* ``load``: seconds to load the bundled pair (with its DFlash2 drafter, as the window loads it)
  in this process and to warm it up as the app does after a load on a GPU
  (``app/engine/warmup.py``, its parallel kernel build on CUDA included; ``--no-warm-up``
  skips it), the kernels MLX compiled to its disk cache during the warm-up and after it
  (``kernels_compiled_in_warm_up``, ``kernels_compiled_after``: what a warm-up missed), then
  the first plain and first DFlash reply (cold: tok/s, time to first token) against the same
  replies run again (warm). With ``MLX_PTX_CACHE_DIR`` set to an empty folder, a process
  compiles every kernel as on a fresh host (``tools/gpu_measure.sh warmup``).
* ``pair``: on the bundled pair (demo prompt, greedy, exact defaults), plain tok/s, DFlash
  (tape, the drafter's block size) tok/s and their ratio, per-cycle draft / verify / rollback
  ms (the engine's ``Summary`` totals over its cycles, from a second run with
  ``stage_timing``, which waits after each stage), the default run's ms per cycle, ``tau``,
  whether the tokens are identical, and the host synchronisations per cycle: calls of
  ``mx.eval``, ``mx.array.item`` and ``mx.array.tolist``, over the whole run
  (``host_syncs_per_cycle``, prefill included) and from the first token to the last cycle
  (``host_syncs_in_cycles``), divided by the cycles (``async_eval`` does not wait and is not
  counted).
* ``pair_by_dtype`` (``--pair-dtypes float32,bfloat16``): the ``pair`` figures again with
  the bundled pair cast to each dtype (after one run in that dtype, so its shapes are built).
* ``forward``: per target shape and dtype, a 1-token step and a 16-token verify pass
  (``TargetRunner.forward`` with tap capture and Gated DeltaNet tapes, the pass a cycle runs;
  exact step loop and the opt-in ``fast_verify``) after ``--prefix`` cached tokens, median ms,
  and verify / step. Shapes: ``demo`` is the bundled target as loaded; ``qwen3.5-4b`` a random
  ``qwen3_5`` built here with Qwen3.5-4B's published sizes (32 layers, hidden 2560, 16/4
  attention heads of 256, linear attention 16 key / 32 value heads of 128, MLP 9216, vocabulary
  248320; every 4th layer full attention). ``--layers``, ``--hidden`` and ``--vocab`` shrink it
  for a quick run on a CPU. dtypes: ``float32``, ``bfloat16``, ``4bit`` (mlx-lm's affine
  quantization, group 64, bf16 scales), ``4bit-dequantized`` (that model dequantized to
  float32, as ``load_target`` does with a quantized target on the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN35_4B = {
    "model_type": "qwen3_5",
    "architectures": ["Qwen3_5ForCausalLM"],
    "vocab_size": 248320,
    "hidden_size": 2560,
    "intermediate_size": 9216,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_parameters": {"type": "default", "rope_theta": 10_000_000.0,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]},
}


def qwen35_4b_config(layers: int | None = None, hidden: int | None = None,
                     vocab: int | None = None) -> dict:
    """:data:`QWEN35_4B`, optionally with fewer layers, a narrower width (a multiple of 256;
    the MLP keeps its 18/5 ratio) or a smaller vocabulary, for quick runs on a CPU."""
    config = dict(QWEN35_4B)
    if layers:
        config["num_hidden_layers"] = layers
    if hidden:
        config.update(hidden_size=hidden, intermediate_size=hidden * 18 // 5)
    if vocab:
        config["vocab_size"] = vocab
    return config


def emit_json(result: dict, out: Path | None) -> int:
    """Print ``result`` as indented JSON (and write it to ``out`` when given); returns 0."""
    text = json.dumps(result, indent=1)
    if out:
        out.write_text(text)
    print(text)
    return 0


@contextmanager
def count_host_syncs():
    """Count calls of ``mx.eval``, ``mx.array.item`` and ``mx.array.tolist`` inside the block
    (each waits for the device). Yields a dict whose ``"syncs"`` grows as they happen."""
    import mlx.core as mx

    counter = {"syncs": 0}
    eval_, item, tolist = mx.eval, mx.array.item, mx.array.tolist

    def counted(fn):
        def call(*a, **k):
            counter["syncs"] += 1
            return fn(*a, **k)
        return call

    mx.eval, mx.array.item, mx.array.tolist = counted(eval_), counted(item), counted(tolist)
    try:
        yield counter
    finally:
        mx.eval, mx.array.item, mx.array.tolist = eval_, item, tolist


def ptx_cache_summary(since: float, directory: Path | None = None) -> dict:
    """The kernels MLX compiled since the wall-clock time ``since`` (``time.time()``): how
    many, and each module's name with the seconds after ``since`` at which it was written
    (in order; the gap before a module is about its compile time). Empty on a backend
    without a PTX cache (CPU, Metal)."""
    from app.engine.kernels.kernel_prebuild import ptx_cache_dir

    directory = directory or ptx_cache_dir()
    if not directory.is_dir():
        return {"dir": str(directory), "modules": 0, "written_s": {}}
    new = sorted((f.stat().st_mtime - since, f.stem) for f in directory.glob("*.ptx")
                 if f.stat().st_mtime >= since)
    return {"dir": str(directory), "modules": len(new),
            "written_s": {name: round(t, 3) for t, name in new}}


def _median_ms(fn, repeats: int) -> float:
    import mlx.core as mx

    mx.eval(fn())  # warm-up: kernels for this shape
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def random_target(config: dict, dtype: str):
    """A random-weight mlx-lm model for ``config`` in ``dtype`` (``float32``, ``bfloat16``,
    ``4bit``: affine, group 64, bf16 scales, or ``4bit-dequantized``: that 4-bit model
    dequantized to float32 as the loader does on the CPU)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import _get_classes

    from app.engine.device import configure_cuda_attention

    # as the app's loader does before the first attention pass: on MLX's CUDA backend, no
    # cuDNN attention (built per key length, so a drafter pays it every cycle)
    configure_cuda_attention()
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.eval()  # as mlx-lm's loader leaves it: GDN layers take their kernel only when not training
    cast_floats(model, "float32" if dtype == "float32" else "bfloat16")
    if dtype.startswith("4bit"):
        nn.quantize(model, group_size=64, bits=4,
                    class_predicate=lambda _, m: hasattr(m, "to_quantized")
                    and m.weight.shape[-1] % 64 == 0)
    if dtype == "4bit-dequantized":  # what the loader does with a 4-bit target on the CPU
        from app.models.loader import dequantize_model

        dequantize_model(model)
        cast_floats(model, "float32")
    mx.eval(model.parameters())
    return model


def _pass_ms(runner, taps: list[int], prefix: int, repeats: int, length: int) -> float:
    """Median ms of a ``length``-token pass after ``prefix`` cached tokens (a 1-token step, or
    a verify pass with taps and tapes); the cache is put back after every pass."""
    import mlx.core as mx

    from app.engine.target import trim_attention

    cache = runner.make_cache()
    ids = mx.array([[1 + i % 50 for i in range(prefix)]], dtype=mx.int32)
    mx.eval(runner.forward(ids, cache, taps=taps, all_logits=False))
    snapshot = [list(c.cache) if lin else None for c, lin in zip(cache, runner.linear)]

    def one_pass():
        block = mx.array([[7] * length], dtype=mx.int32)
        if length == 1:
            out = [runner.forward(block, cache, all_logits=False)[0]]
        else:
            out = list(runner.forward(block, cache, taps=taps, tapes=[]))
        for c, kept in zip(cache, snapshot):
            if kept is not None:
                c.cache = list(kept)
        trim_attention(cache, runner.linear, length)
        return out

    return _median_ms(one_pass, repeats)


def cast_floats(model, dtype: str) -> None:
    """Cast every floating-point parameter of the MLX module ``model`` to ``dtype``
    (``float32``, ``bfloat16`` or ``float16``), in place; integer arrays (quantized weights)
    are kept. Raises ``AttributeError`` for another dtype name."""
    import mlx.core as mx
    from mlx.utils import tree_map

    cast = getattr(mx, dtype)
    model.update(tree_map(lambda a: a.astype(cast) if mx.issubdtype(a.dtype, mx.floating)
                          else a, model.parameters()))


def forward_costs(model, model_type: str, taps: list[int], prefix: int, repeats: int) -> dict:
    """Median ms of a 1-token step and of 16-token verify passes (exact and, on a hybrid
    target, the opt-in fast one) after ``prefix`` cached tokens, and verify / step."""
    from app.engine.target import TargetRunner

    exact = TargetRunner(model, model_type)
    out = {"step_ms": _pass_ms(exact, taps, prefix, repeats, 1),
           "verify16_ms": _pass_ms(exact, taps, prefix, repeats, 16)}
    out["verify16_over_step"] = out["verify16_ms"] / out["step_ms"]
    fast = TargetRunner(model, model_type, fast_verify=True)
    if fast.fast_verify:
        out["verify16_fast_ms"] = _pass_ms(fast, taps, prefix, repeats, 16)
        out["verify16_fast_over_step"] = out["verify16_fast_ms"] / out["step_ms"]
    return out


def pair_figures(target, drafter, max_tokens: int) -> dict:
    """Plain vs DFlash on the demo prompt: tok/s, ratio, per-cycle ms and host syncs.

    DFlash runs twice: as it runs by default (tok/s, cycle ms, host syncs) and with
    ``stage_timing`` (waits after each stage: the per-stage draft / verify / rollback ms).
    ``host_syncs_per_cycle`` is every sync of the run (prefill and clean-up included) over its
    cycles, ``host_syncs_in_cycles`` only those from the first token to the last cycle."""
    from app.chat.templates import render_prompt
    from app.chat.tools import tool_schemas
    from app.commands.generation import DEFAULT_PROMPT
    from app.engine.events import CycleEvent, Done, TokenEvent
    from app.engine.generate import GenerationConfig, generate

    ids = render_prompt(target.tokenizer, [{"role": "user", "content": DEFAULT_PROMPT}],
                        tools=tool_schemas()).ids

    def run(mode, **kw):
        tokens, summary, first, last = [], None, None, None
        with count_host_syncs() as counter:
            for ev in generate(target, ids,
                               GenerationConfig(mode=mode, max_tokens=max_tokens, **kw),
                               drafter if mode == "dflash" else None):
                if isinstance(ev, TokenEvent):
                    tokens.append(ev.token_id)
                    first = counter["syncs"] if first is None else first
                elif isinstance(ev, CycleEvent):
                    last = counter["syncs"]
                elif isinstance(ev, Done):
                    summary = ev.summary
        in_cycles = (last - first) if last is not None else 0
        return tokens, summary, counter["syncs"], in_cycles

    (pt, ps, _, _), (dt, ds, syncs, in_cycles) = run("plain"), run("dflash")
    st, ss, _, _ = run("dflash", stage_timing=True)
    cycles, staged = max(ds.cycles, 1), max(ss.cycles, 1)
    gen_s = (ds.generated_tokens - 1) / ds.tok_per_s if ds.tok_per_s else 0.0
    return {
        "prompt_tokens": len(ids), "plain_tok_per_s": ps.tok_per_s,
        "dflash_tok_per_s": ds.tok_per_s,
        "ratio": ds.tok_per_s / ps.tok_per_s if ps.tok_per_s else None,
        "tau": ds.tau, "cycles": ds.cycles, "identical": pt == dt and st == dt,
        "cycle_ms": 1000 * gen_s / cycles,
        "draft_ms_per_cycle": 1000 * ss.draft_s / staged,
        "verify_ms_per_cycle": 1000 * ss.verify_s / staged,
        "rollback_ms_per_cycle": 1000 * ss.rollback_s / staged,
        "staged_dflash_tok_per_s": ss.tok_per_s,
        "host_syncs_per_cycle": syncs / cycles,
        "host_syncs_in_cycles": in_cycles / cycles,
        "plain_step_ms": 1000 / ps.tok_per_s if ps.tok_per_s else None,
        "plain_ttft_s": ps.ttft_s, "dflash_ttft_s": ds.ttft_s,
        "plain_total_s": ps.total_s, "dflash_total_s": ds.total_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="demo,qwen3.5-4b")
    p.add_argument("--dtypes", default="bfloat16,4bit")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--layers", type=int, help="qwen3.5-4b shape: fewer layers (quick runs)")
    p.add_argument("--hidden", type=int, help="qwen3.5-4b shape: narrower (a multiple of 256)")
    p.add_argument("--vocab", type=int, help="qwen3.5-4b shape: smaller vocabulary")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--pair-dtypes", default="",
                   help="also run the pair figures with the bundled pair cast to each of these "
                        "dtypes (comma-separated: float32, bfloat16, float16), as "
                        "pair_by_dtype")
    p.add_argument("--no-warm-up", action="store_true",
                   help="measure the first replies without the warm-up the app runs after a "
                        "load on a GPU (app/engine/warmup.py)")
    args = p.parse_args(argv)

    import mlx.core as mx

    from app import __version__
    from app.engine.blas import blas_description
    from app.engine.device import device_description
    from app.engine.kernels.gdn_kernel import kernel_active
    from app.models.loader import load_drafter, load_target
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    result: dict = {"header": {"app": __version__, "mlx": mx.__version__,
                               "device": str(mx.default_device()),
                               "gdn_kernel": kernel_active(),
                               "device_name": device_description(mx),
                               "platform": f"{platform.system()} {platform.machine()}",
                               "blas": blas_description()}}
    t_dir, d_dir = demo_pair_dirs()
    t0 = time.perf_counter()
    target, drafter = load_target(t_dir), load_drafter(d_dir)
    # the window loads the pair's DFlash2 drafter too, and warms it up with the others
    drafter2 = load_drafter(demo_dflash2_dir()) if demo_dflash2_dir().is_dir() else None
    load_s = time.perf_counter() - t0
    result["header"]["cudnn_sdpa"] = os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "1")
    warm_up_s = warm_up_parts = None
    since = time.time()
    if not args.no_warm_up:
        from app.engine.warmup import warm_up

        report = warm_up(target, [drafter, drafter2])
        warm_up_s = report.seconds
        built = report.prebuild
        warm_up_parts = {"plain_s": report.plain_s, "dflash_s": report.drafted_s,
                         "prebuild_s": built.seconds if built else None,
                         "prebuild_processes": built.processes if built else 0,
                         "prebuild_failed": built.failed if built else []}
    compiled = ptx_cache_summary(since)
    cold = pair_figures(target, drafter, args.max_tokens)
    warm = pair_figures(target, drafter, args.max_tokens)
    result["load"] = {"load_s": load_s, "warm_up_s": warm_up_s,
                      "warm_up_parts": warm_up_parts, "kernels_compiled_in_warm_up": compiled,
                      "kernels_compiled_after": ptx_cache_summary(since + (warm_up_s or 0)),
                      "cold_plain_tok_per_s": cold["plain_tok_per_s"],
                      "cold_dflash_tok_per_s": cold["dflash_tok_per_s"],
                      "cold_plain_ttft_s": cold["plain_ttft_s"],
                      "cold_dflash_ttft_s": cold["dflash_ttft_s"],
                      "cold_identical": cold["identical"],
                      "warm_plain_tok_per_s": warm["plain_tok_per_s"],
                      "warm_dflash_tok_per_s": warm["dflash_tok_per_s"]}
    result["pair"] = warm
    if args.pair_dtypes:
        result["pair_by_dtype"] = {}
        for name in [d for d in args.pair_dtypes.split(",") if d]:
            cast_floats(target.model, name)
            cast_floats(drafter.model, name)
            pair_figures(target, drafter, args.max_tokens)  # the new dtype's shapes, once
            result["pair_by_dtype"][name] = pair_figures(target, drafter, args.max_tokens)
        target, drafter = load_target(t_dir), load_drafter(d_dir)
    result["forward"] = {}
    taps = list(drafter.config.target_layer_ids)
    for shape in [s for s in args.shapes.split(",") if s]:
        if shape == "demo":
            result["forward"]["demo"] = forward_costs(target.model, target.model_type, taps,
                                                      args.prefix, args.repeats)
            continue
        if shape != "qwen3.5-4b":
            p.error(f"unknown shape {shape!r}")
        config = qwen35_4b_config(args.layers, args.hidden, args.vocab)
        n = config["num_hidden_layers"]
        big_taps = sorted({1, n // 3, (2 * n) // 3, n - 2} & set(range(n)))
        for dtype in [d for d in args.dtypes.split(",") if d]:
            model = random_target(config, dtype)
            result["forward"][f"{shape}-{dtype}"] = forward_costs(
                model, "qwen3_5", big_taps, args.prefix, args.repeats)
            del model
    return emit_json(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
