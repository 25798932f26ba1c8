"""The automatic block size against plain decoding and fixed block 16: time to answer.

    python tools/bench_auto.py [--max-tokens 128] [--repeats 2] [--classes bench tool long]
        [--lengths 2000 3900] [--json F]

On the bundled demo pair (resources/models/), greedy, each run from an empty cache (no prefix
reuse), timed from ``generate`` to its ``Done`` (prefill and decode: the time to answer of a
one-round reply). Sides:

* ``plain``; ``dflash@16`` and ``dflash@auto`` (the DFlash drafter, fixed block 16 and the
  automatic block size, ``GenerationConfig.auto_block``); ``dflash2@16`` and ``dflash2@auto``
  (the bundled DFlash2 drafter).

Prompt classes:

* ``bench``: the prompts ``python -m app bench`` runs by default (the held-out prompts of the
  demo pair plus two ~600-word prompts);
* ``tool``: the answer round of tool replies: a question, the model's tool call and the
  tool's result (run by the built-in tools at a frozen clock) in the prompt, so that the reply
  restates the result (copy-heavy);
* ``long``: synthetic chat histories of about ``--lengths`` tokens (the ``bench
  --multi-turn`` history; the demo target's context is 4,096 tokens) with a question;
* ``unfit``: the first three bench prompts with a drafter that does not fit: the bundled
  DFlash drafter's weights replaced by random ones (fixed seed), so nearly every draft is
  rejected (plain, ``dflash@16`` and ``dflash@auto`` only).

Everything is warmed first: one run of every side (the automatic sides' first run measures
the pair's cost model, :mod:`app.engine.costs`, whose time is printed). Then per prompt and
repeat the sides run in an order that rotates, so a busy machine slows them alike. Printed:
per prompt the median time to answer of each side and the ratios; per class the median of the
per-prompt ratios (auto / plain, auto / fixed 16, DFlash2 auto / DFlash auto) of the time to
answer and of the decode speed (tokens per second after the first token), the mean block
the automatic sides used, and whether every side gave plain's tokens. The JSON adds each
prompt's median tau per drafting side (``tau``). A benchmark, not a test:
it asserts nothing. Run it with OpenBLAS preloaded on Linux (tools/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIDES = ("plain", "dflash@16", "dflash@auto", "dflash2@16", "dflash2@auto")

TOOL_QUESTIONS = ("Describe Liberia briefly.", "Describe Brazil briefly.",
                  "What is the local time in Anchorage?", "Tell me about Kenya.")


def _config(side: str, max_tokens: int):
    from app.engine.generate import GenerationConfig

    if side == "plain":
        return GenerationConfig(mode="plain", max_tokens=max_tokens)
    mode, block = side.split("@")
    if block == "auto":
        return GenerationConfig(mode=mode, max_tokens=max_tokens, auto_block=True)
    return GenerationConfig(mode=mode, max_tokens=max_tokens, block_size=int(block))


def _run(target, drafters, ids, side, max_tokens):
    """One generation: (tokens, seconds from start to Done, Summary)."""
    from app.engine.events import Done, TokenEvent
    from app.engine.generate import generate

    cfg = _config(side, max_tokens)
    drafter = drafters.get(cfg.mode)
    tokens, summary = [], None
    t0 = time.perf_counter()
    for ev in generate(target, ids, cfg, drafter):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
        elif isinstance(ev, Done):
            summary = ev.summary
    dt = time.perf_counter() - t0
    if summary is None or summary.stop_cause == "error":
        raise RuntimeError(f"{side}: {getattr(summary, 'error', 'no summary')}")
    return tokens, dt, summary


def _tool_prompts(target) -> list[tuple[str, list[int]]]:
    """The answer round of each tool question: the model's own first round (plain, greedy),
    its tool calls run by the built-in tools at a frozen clock, rendered as the next prompt."""
    import datetime as dt

    from app.chat.reply import ReplySettings, collect_reply
    from app.chat.tools import builtin_tools, tool_schemas

    frozen = dt.datetime(2026, 12, 5, 15, 0, 0, tzinfo=dt.UTC)
    settings = ReplySettings(mode="plain", max_tokens=256, tools=tool_schemas(),
                             run_tools=True, runnable_tools=builtin_tools(frozen))
    out = []
    for q in TOOL_QUESTIONS:
        reply = collect_reply(target, None, [{"role": "user", "content": q}], settings)
        if len(reply.rounds) < 2:
            print(f"note: {q!r} made no tool call; left out", flush=True)
            continue
        out.append((f"tool: {q}", list(reply.rounds[-1].prompt_ids)))
    return out


def _long_prompts(target, lengths, limit: int) -> list[tuple[str, list[int]]]:
    """A synthetic chat history (``bench --multi-turn``'s) and a question, of at least 95% of
    each length in ``lengths`` tokens where that stays within ``limit``."""
    from app.commands.bench import _long_history

    tok = target.tokenizer
    ask = [{"role": "user", "content": "Summarise the numbers you were given in the first "
            "question."}]
    out = []
    for n in lengths:
        request, ids = n, []
        while request < 2 * n:
            msgs = _long_history(tok, request) + ask
            got = list(tok.apply_chat_template(msgs, add_generation_prompt=True))
            if len(got) > limit:
                break
            ids = got
            if len(ids) >= 0.95 * n:
                break
            request += 100
        out.append((f"long {len(ids)} tok", ids))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--classes", nargs="+", choices=["bench", "tool", "long", "unfit"],
                   default=["bench", "tool", "long", "unfit"])
    p.add_argument("--lengths", type=int, nargs="+", default=[2000, 3900],
                   help="token lengths of the long prompts (default 2000 3900)")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                   help="sides to time (plain always runs: its tokens are the reference)")
    p.add_argument("--json", default=None, help="write every measurement to this file")
    args = p.parse_args(argv)

    from app.chat.templates import bench_prompt_ids
    from app.engine import costs
    from app.engine.bench import default_prompts
    from app.engine.blas import blas_description
    from app.engine.device import device_description
    from app.engine.threads import allow_engine_on_current_thread
    from app.models.loader import load_drafter, load_target
    from app.paths import bundled_pair

    allow_engine_on_current_thread()
    pair = bundled_pair()
    if pair is None:
        print("the bundled demo pair is missing", file=sys.stderr)
        return 2
    tdir, ddir, d2dir = pair
    target = load_target(tdir)
    drafters = {"dflash": load_drafter(ddir)}
    sides = list(dict.fromkeys(["plain", *args.sides]))
    if d2dir is not None:
        drafters["dflash2"] = load_drafter(d2dir)
    else:
        sides = [s for s in sides if not s.startswith("dflash2")]
    print(f"device: {device_description()}; BLAS: {blas_description(load_mlx=True)}")
    print(f"max tokens {args.max_tokens}, repeats {args.repeats}, sides {', '.join(sides)}")

    classes: dict[str, list[tuple[str, list[int]]]] = {}
    if "bench" in args.classes:
        prompts, source = default_prompts(Path(tdir))
        classes["bench"] = [(p.id, bench_prompt_ids(target, p)) for p in prompts]
        print(f"bench set: {source}")
    if "tool" in args.classes:
        classes["tool"] = _tool_prompts(target)
    if "long" in args.classes:
        cfg = dict(target.config)
        context = int(cfg.get("max_position_embeddings")
                      or (cfg.get("text_config") or {}).get("max_position_embeddings") or 1 << 20)
        classes["long"] = _long_prompts(target, args.lengths, context - args.max_tokens)

    unfit = None
    if "unfit" in args.classes:
        import mlx.core as mx
        from mlx.utils import tree_map

        prompts, _ = default_prompts(Path(tdir))
        classes["unfit"] = [(p.id, bench_prompt_ids(target, p)) for p in prompts[:3]]
        unfit = load_drafter(ddir)
        mx.random.seed(0)
        unfit.model.update(tree_map(lambda a: mx.random.normal(a.shape, dtype=a.dtype) * 0.05
                                    if a.ndim == 2 else a, unfit.model.parameters()))
        mx.eval(unfit.model.parameters())
        _run(target, {"dflash": unfit}, classes["unfit"][0][1], "dflash@auto", 16)

    # warm-up: every side once (the automatic sides measure the cost model here)
    warm_ids = next(iter(classes.values()))[0][1]
    for side in sides:
        _run(target, drafters, warm_ids, side, 16)
    for mode, d in drafters.items():
        m = costs.known_model(d, target.model)
        if m is not None:
            print(f"cost model {mode}: measured in {m.calibration_s:.2f} s; verify ms "
                  f"L={m.lengths} at ctx {m.contexts[0]}: "
                  f"{[round(x, 1) for x in m.verify_ms[0]]}, at {m.contexts[1]}: "
                  f"{[round(x, 1) for x in m.verify_ms[1]]}; draft ms at ctx "
                  f"{m.contexts[0]}: {[round(x, 1) for x in m.draft_ms[0]]}")

    rows, k = [], 0
    summary: dict[str, dict] = {}
    for cls, prompts in classes.items():
        ratios: dict[str, list[float]] = {}
        blocks: dict[str, list[float]] = {s: [] for s in sides if s.endswith("auto")}
        same = 0
        use = {"dflash": unfit} if cls == "unfit" else drafters
        cls_sides = [x for x in sides if x in ("plain", "dflash@16", "dflash@auto")] \
            if cls == "unfit" else sides
        decode: dict[str, list[float]] = {}
        for pid, ids in prompts:
            times: dict[str, list[float]] = {s: [] for s in cls_sides}
            rates: dict[str, list[float]] = {s: [] for s in cls_sides}
            taus: dict[str, list[float]] = {s: [] for s in cls_sides if s != "plain"}
            toks: dict[str, list[int]] = {}
            for _ in range(args.repeats):
                order = cls_sides[k % len(cls_sides):] + cls_sides[: k % len(cls_sides)]
                k += 1
                for side in order:
                    t, dt, s = _run(target, use, ids, side, args.max_tokens)
                    times[side].append(dt)
                    rates[side].append(s.tok_per_s)
                    if side in taus and s.tau:
                        taus[side].append(s.tau)
                    toks.setdefault(side, t)
                    if side in blocks and s.block_lengths:
                        blocks[side].append(statistics.mean(s.block_lengths))
            med = {s: statistics.median(v) for s, v in times.items()}
            rate = {s: statistics.median(v) for s, v in rates.items()}
            identical = all(toks[s] == toks["plain"] for s in cls_sides)
            same += identical
            row = {"class": cls, "prompt": pid, "prompt_tokens": len(ids),
                   "tokens": len(toks["plain"]), "median_s": med, "identical": identical}
            rows.append(row)

            pairs = {"16/plain": ("dflash@16", "plain"), "auto/plain": ("dflash@auto", "plain"),
                     "auto/16": ("dflash@auto", "dflash@16"),
                     "v2auto/plain": ("dflash2@auto", "plain"),
                     "v2auto/auto": ("dflash2@auto", "dflash@auto"),
                     "v2-16/plain": ("dflash2@16", "plain")}
            got = {}
            for name, (a, b) in pairs.items():
                v = med[b] / med[a] if a in med and b in med else None
                if v is not None:
                    ratios.setdefault(name, []).append(v)
                    got[name] = v
                if a in rate and b in rate and rate[b] > 0 and rate[a] > 0:
                    decode.setdefault(name, []).append(rate[a] / rate[b])
            row["ratios"] = got
            row["decode_tok_per_s"] = rate
            row["tau"] = {x: statistics.median(v) for x, v in taus.items() if v}
            print(f"{cls:5s} {pid[:28]:28s} {len(ids):5d} tok in, {len(toks['plain']):4d} out  "
                  + "  ".join(f"{s} {med[s]:.2f}s" for s in cls_sides) + "  |  "
                  + "  ".join(f"{n} {v:.2f}x" for n, v in got.items())
                  + ("" if identical else "  TOKENS DIFFER"), flush=True)
        summary[cls] = {n: statistics.median(v) for n, v in ratios.items()}
        summary[cls]["decode"] = {n: statistics.median(v) for n, v in decode.items()}
        summary[cls]["mean_block"] = {s: statistics.mean(v) for s, v in blocks.items() if v}
        summary[cls]["identical"] = f"{same}/{len(prompts)}"
    print()
    print("median of per-prompt time-to-answer ratios (higher is faster for the first side):")
    for cls, fig in summary.items():
        parts = [f"{n} {v:.2f}x" for n, v in fig.items() if isinstance(v, float)]
        mb = ", ".join(f"{s} {v:.1f}" for s, v in fig["mean_block"].items())
        dec = "  ".join(f"{n} {v:.2f}x" for n, v in fig["decode"].items())
        print(f"  {cls:5s} time to answer: " + "  ".join(parts) + f"  (mean block: {mb}; "
              f"identical {fig['identical']})")
        print(f"  {'':5s} decode tok/s:   {dec}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
