"""Where a 16-token verify pass spends its time against a 1-token step, part by part (JSON).

    python tools/profile_verify.py [--demo] [--dtypes bfloat16,4bit] [--prefix 128] [--repeats 20]
                                   [--layers N] [--hidden N] [--vocab N] [--out FILE]
    python tools/profile_verify.py --count-ops [--layers N] [--hidden N] [--vocab N] [--out FILE]

Made for issue #21: on an H200 through MLX's CUDA backend, a random Qwen3.5-4B-shaped target
(``tools/bench_gpu.py``'s ``QWEN35_4B``) verifies 16 tokens for several steps' cost. For S = 1
and S = 16 after ``--prefix`` cached tokens, median milliseconds (each part waited for with
``mx.eval``, so launch latency is included) of:

* ``forward``: ``TargetRunner.forward`` without taps or tapes, last position's logits;
* ``verify``: with taps, tapes and every position's logits (what a DFlash cycle runs);
* per layer kind, summed over the model's layers of that kind: ``gdn`` (a whole Gated DeltaNet
  mixer, ``gdn_forward``), ``gdn_proj`` (its input projections), ``gdn_conv`` (its depthwise
  convolution), ``gdn_recurrence`` (``gdn_kernel.gated_delta_update``), ``attention`` (the
  attention mixer with its cache), ``mlp``;
* ``lm_head``: final norm and logits of S rows;
* ``st1_proj`` .. ``st6_out_proj``: what each stage of the GDN mixer adds, timed as prefixes
  of its operations (:func:`gdn_stages`), summed over the GDN layers.

``--count-ops`` times nothing: it counts the operations (nodes of MLX's lazy graph, by
primitive, from ``mx.export_to_dot``) of ``forward`` and ``verify`` for S = 1 and S = 16,
each after the previous one was evaluated, bf16. Off CUDA the GDN recurrence is replaced
by a one-operation stand-in (``"recurrence": "stand-in"`` in the output), so that the graph is
the one the CUDA path builds around its kernel and not mlx-lm's per-token loop.

A benchmark, not a test: nothing is asserted.
"""

# Every closure below is timed at once, inside the loop iteration that made it:
# ruff: noqa: B023
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _ms(fn, repeats: int) -> float:
    import mlx.core as mx

    mx.eval(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def gdn_stages(attn, x, conv_before, state, upto: int) -> list:
    """``gdn_forward``'s operations up to stage ``upto`` (1 projections, 2 + convolution,
    3 + split and q/k normalisation, 4 + recurrence, 5 + gated norm, 6 + output projection),
    returning every array still live, so that timing stage k minus stage k-1 gives its cost."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.gated_delta import normalize_qk

    from app.engine.kernels.gdn_kernel import gated_delta_update
    from app.engine.target import _gdn_project

    B, S, _ = x.shape
    qkv, z, b, a = _gdn_project(attn, x)
    if upto == 1:
        return [qkv, z, b, a]
    conv_out = nn.silu(attn.conv1d(mx.concatenate([conv_before, qkv], axis=1)))
    if upto == 2:
        return [conv_out, z, b, a]
    q, k, v = [t.reshape(B, S, h, d) for t, h, d in zip(
        mx.split(conv_out, [attn.key_dim, 2 * attn.key_dim], -1),
        [attn.num_k_heads, attn.num_k_heads, attn.num_v_heads],
        [attn.head_k_dim, attn.head_k_dim, attn.head_v_dim])]
    q, k = normalize_qk(q, k, inv_scale=attn.head_k_dim**-0.5, eps=1e-6)
    if upto == 3:
        return [q, k, v, z, b, a]
    out, new_state = gated_delta_update(q, k, v, a, b, attn.A_log, attn.dt_bias, state, None)
    if upto == 4:
        return [out, new_state, z]
    out = attn.norm(out, z)
    if upto == 5:
        return [out, new_state]
    return [attn.out_proj(out.reshape(B, S, -1)), new_state]


def profile(model, hidden: int, prefix: int, repeats: int) -> dict:
    """Per-part medians for S = 1 and S = 16 (see the module docstring)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.base import create_attention_mask

    from app.engine.kernels.gdn_kernel import gated_delta_update
    from app.engine.target import TargetRunner, _gdn_project, gdn_forward, trim_attention

    runner = TargetRunner(model, "qwen3_5")
    n = runner.num_layers
    taps = sorted({1, n // 3, (2 * n) // 3, n - 2} & set(range(n)))
    cache = runner.make_cache()
    ids = mx.array([[1 + i % 50 for i in range(prefix)]], dtype=mx.int32)
    mx.eval(runner.forward(ids, cache, all_logits=False))
    saved = [list(c.cache) if lin else None for c, lin in zip(cache, runner.linear)]

    def restore(length):
        for c, kept in zip(cache, saved):
            if kept is not None:
                c.cache = list(kept)
        trim_attention(cache, runner.linear, length)

    out: dict = {}
    for S in (1, 16):
        block = mx.array([[7] * S], dtype=mx.int32)
        x = (0.1 * mx.random.normal((1, S, hidden))).astype(
            model.parameters()["language_model"]["model"]["norm"]["weight"].dtype)
        row: dict = {}

        def forward():
            r = runner.forward(block, cache, all_logits=False)[0]
            restore(S)
            return r

        def verify():
            r = list(runner.forward(block, cache, taps=taps, tapes=[]))
            restore(S)
            return r

        row["forward"] = _ms(forward, repeats)
        row["verify"] = _ms(verify, repeats)
        parts = {k: 0.0 for k in ("gdn", "gdn_proj", "gdn_conv", "gdn_recurrence",
                                  "attention", "mlp")}
        stages = [0.0] * 6
        for i, (layer, c) in enumerate(zip(runner.layers, cache)):
            xn = layer.input_layernorm(x)
            parts["mlp"] += _ms(lambda: layer.mlp(layer.post_attention_layernorm(x)), repeats)
            if runner.linear[i]:
                attn = layer.linear_attn
                kept = list(c.cache)

                def gdn():
                    r = gdn_forward(attn, xn, None, c, [] if S > 1 else None)
                    c.cache = list(kept)
                    return r

                parts["gdn"] += _ms(gdn, repeats)
                for st in range(6):
                    stages[st] += _ms(lambda: gdn_stages(attn, xn, kept[0], kept[1], st + 1),
                                      repeats)
                parts["gdn_proj"] += _ms(lambda: list(_gdn_project(attn, xn)), repeats)
                qkv = attn.in_proj_qkv(xn)
                conv_in = mx.concatenate([kept[0], qkv], axis=1)
                parts["gdn_conv"] += _ms(lambda: nn.silu(attn.conv1d(conv_in)), repeats)
                B = 1
                q = mx.random.normal((B, S, attn.num_k_heads, attn.head_k_dim)).astype(x.dtype)
                k = mx.random.normal((B, S, attn.num_k_heads, attn.head_k_dim)).astype(x.dtype)
                v = mx.random.normal((B, S, attn.num_v_heads, attn.head_v_dim)).astype(x.dtype)
                a = mx.random.normal((B, S, attn.num_v_heads)).astype(x.dtype)
                b = mx.random.normal((B, S, attn.num_v_heads)).astype(x.dtype)
                parts["gdn_recurrence"] += _ms(lambda: list(gated_delta_update(
                    q, k, v, a, b, attn.A_log, attn.dt_bias, kept[1], None)), repeats)
            else:
                mask = create_attention_mask(xn, c)

                def attention():
                    r = layer.self_attn(xn, mask=mask, cache=c)
                    c.trim(S)
                    return r

                parts["attention"] += _ms(attention, repeats)
        row.update(parts)
        # the cost each stage of the GDN mixer adds (summed over GDN layers)
        for st, name in enumerate(("st1_proj", "st2_conv", "st3_split_norm", "st4_recurrence",
                                   "st5_gated_norm", "st6_out_proj")):
            row[name] = stages[st] - (stages[st - 1] if st else 0.0)
        inner = runner.inner
        row["lm_head"] = _ms(lambda: runner.lm_head(inner.norm(x)), repeats)
        out[f"S{S}"] = row
    out["ratio"] = {k: out["S16"][k] / out["S1"][k] for k in out["S1"] if out["S1"][k]}
    return out


def count_ops(model) -> dict:
    """``--count-ops``: graph nodes of ``forward`` and ``verify`` for S = 1 and 16 (see the
    module doc): per pass the total and the per-primitive counts that differ from S = 1."""
    import collections
    import os
    import re
    import tempfile

    import mlx.core as mx

    import app.engine.kernels.gdn_kernel as gk
    from app.engine.target import TargetRunner, trim_attention

    out: dict = {"recurrence": "kernel" if gk.kernel_active() else "stand-in"}
    if not gk.kernel_active():  # the CUDA path's graph: one node where the kernel would be
        gk.kernel_active = lambda: True
        gk._kernel_fits = lambda k, mask: True
        gk.cuda_gated_delta = lambda q, k, v, g, beta, state: (mx.tanh(v), mx.tanh(state))
    runner = TargetRunner(model, "qwen3_5")
    n = runner.num_layers
    taps = sorted({1, n // 3, (2 * n) // 3, n - 2} & set(range(n)))
    cache = runner.make_cache()

    def settle(*arrays):
        mx.eval(*arrays, [c.state for c in cache])

    settle(runner.forward(mx.array([[1 + i % 50 for i in range(128)]], dtype=mx.int32), cache,
                          all_logits=False))
    saved = [list(c.cache) if lin else None for c, lin in zip(cache, runner.linear)]

    def nodes(outputs) -> collections.Counter:
        fd, path = tempfile.mkstemp(suffix=".dot")
        os.close(fd)
        arrays = [a for a in outputs if isinstance(a, mx.array)]
        for c in cache:
            arrays += [a for a in (c.state if isinstance(c.state, (list, tuple)) else [c.state])
                       if isinstance(a, mx.array)]
        mx.export_to_dot(path, *arrays)
        text = Path(path).read_text()
        os.unlink(path)
        return collections.Counter(
            lab for lab in re.findall(r'label\s*=\s*"([^"]+)"', text)
            if re.fullmatch(r"[A-Za-z]\w*", lab))

    counts = {}
    for S in (1, 16):
        block = mx.array([[7] * S], dtype=mx.int32)
        for name, kw in (("forward", {"all_logits": False}), ("verify", {"taps": taps,
                                                                          "tapes": []})):
            r = list(runner.forward(block, cache, **kw))
            counts[(name, S)] = nodes(r)
            settle(r)
            for c, kept in zip(cache, saved):
                if kept is not None:
                    c.cache = list(kept)
            trim_attention(cache, runner.linear, S)
            settle()
    for name in ("forward", "verify"):
        one, many = counts[(name, 1)], counts[(name, 16)]
        out[name] = {"S1": sum(one.values()), "S16": sum(many.values()),
                     "differs": {k: many[k] - one[k] for k in sorted(set(one) | set(many))
                                 if many[k] != one[k]}}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="bfloat16,4bit")
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--out", type=Path)
    p.add_argument("--demo", action="store_true",
                   help="profile the bundled demo target instead of the 4B shape")
    p.add_argument("--count-ops", action="store_true",
                   help="count the graph's operations for S = 1 and 16 instead of timing")
    args = p.parse_args(argv)

    import mlx.core as mx
    from bench_gpu import emit_json, qwen35_4b_config, random_target

    from app.engine.device import configure_cuda_attention, device_description
    from app.engine.kernels.gdn_kernel import kernel_active

    configure_cuda_attention()
    import os

    result: dict = {"header": {"mlx": mx.__version__, "device": device_description(mx),
                               "gdn_kernel": kernel_active(),
                               "cudnn_sdpa": os.environ.get("MLX_CUDA_USE_CUDNN_SDPA", "1")}}
    config = qwen35_4b_config(args.layers, args.hidden, args.vocab)
    if args.count_ops:
        result["ops"] = count_ops(random_target(config, "bfloat16"))
        return emit_json(result, args.out)
    if args.demo:  # the bundled target as the app loads it on this device
        from app.models.loader import load_target
        from app.paths import demo_pair_dirs

        target = load_target(demo_pair_dirs()[0])
        result["demo"] = profile(target.model, target.config["hidden_size"], args.prefix,
                                 args.repeats)
        args.dtypes = ""
    for dtype in [d for d in args.dtypes.split(",") if d]:
        model = random_target(config, dtype)
        result[dtype] = profile(model, config["hidden_size"], args.prefix, args.repeats)
        del model
    return emit_json(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
