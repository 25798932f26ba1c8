"""``python -m app bench``: plain vs DFlash (tape and replay rollback) in one run, as ratios.

Every prompt goes through the target's chat template (:func:`app.chat.templates.render_prompt`)
and then through each mode: ``plain``, and for every block size B ``dflash+tape@B`` and
``dflash+replay@B`` (greedy; with ``--fast-verify`` also ``dflash+tape@B+fast``, the near-exact
chunked verify; with ``--dflash2-model`` also ``dflash2+tape@B`` and ``dflash2+tape@B+nosel``,
a DFlash2 drafter with its candidate selector on and off, and ``dflash2_vs_dflash`` in the
result; a DFlash2 ``--draft-model`` alone gives plain and the DFlash2 modes). Modes are interleaved (the order rotates from one prompt and
repeat to the next) and repeated, after one untimed warm-up run per mode. Per mode the report
gives the median tok/s (generation only, prefill excluded, as :class:`~app.engine.events.Summary`
counts it), the median time to first token, the acceptance rate and tau (definitions in
:mod:`app.engine.events`), replays, the time shares of draft / verify / rollback, the peak
memory, and the ratio to plain computed pair by pair (same prompt, same repeat; the median of
those ratios). Every mode's token ids are checked against plain's for the same prompt; per
prompt the report gives ``identical``, ``first_divergence`` and, where they differ, the target's
top-two logit gap there (``top2_gap``, :func:`app.engine.compare.near_tie`).

``--scaling`` adds cost per generated token against prompt length (128..4096 tokens) and
against generated length, plain and DFlash. Tau at lengths the model pair never saw in
training is not meaningful (the cost figures are), and the report says so.

``--json`` prints one object ``{"header", "modes", "tape_vs_replay_rollback", "scaling",
"identical_tokens", "goals"}``; ``--out DIR`` writes ``bench.json``, ``runs.csv``,
``summary.csv`` and PNG plots (matplotlib, imported only then); without ``--json`` and
``--out`` they go to ``benchmarks/<UTC time>/`` in the app-data folder.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

from app.chat.templates import bench_prompt_ids as render
from app.commands.generation import (
    CommandError,
    default_dflash2,
    int_at_least,
    load_target_arg,
    refuse_mode,
    resolve_pair,
)
from app.engine.bench import (
    DEFAULT_BLOCK_SIZES,
    DEFAULT_MAX_TOKENS,
    DEFAULT_REPEATS,
    SCALING_WINDOW,
    BenchError,
    RunRecord,
    _long_prompts,
    add_top2_gaps,
    aggregate,
    default_prompts,
    dflash2_vs_dflash,
    goals,
    header,
    load_prompts,
    make_modes,
    run_matrix,
    run_scaling,
    tape_vs_replay,
)
from app.engine.modes import DRAFTING_MODES, Mode, drafter_mode

__all__ = ["plot_results", "register", "run_bench", "text_report", "write_outputs"]


# ------------------------------------------------------------------------------ arguments
def _block_sizes(text: str) -> list[int | str]:
    """``--block-sizes``: whole numbers >= 1, sorted, then ``"auto"`` when it was given."""
    words = [x.strip().lower() for x in text.split(",") if x.strip()]
    auto = "auto" in words
    try:
        sizes = [int(x) for x in words if x != "auto"]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"block sizes must be integers like 4,8,16 (or auto): {text!r}") from None
    if not (sizes or auto):
        raise argparse.ArgumentTypeError(f"give at least one block size, got {text!r}")
    if any(b < 1 for b in sizes):
        raise argparse.ArgumentTypeError(
            f"block sizes must be at least 1, got {min(sizes)} (in {text!r})")
    return sorted(set(sizes)) + (["auto"] if auto else [])


def _positive(text: str) -> int:
    return int_at_least(1)(text)


def register(subparsers) -> None:
    """Add the ``bench`` subcommand (sets ``func`` to :func:`run_bench`)."""
    p = subparsers.add_parser(
        "bench", help="benchmark plain vs DFlash (tape and replay) and DFlash2, with ratios "
        "and plots",
        description="Run a prompt set through plain decoding and DFlash with tape and replay "
        "rollback at several block sizes, interleaved and repeated; report medians, ratios to "
        "plain (pair by pair) and whether every mode produced the same tokens.",
    )
    p.add_argument("--model", help="target folder or cached repo id (default: the bundled "
                   "demo pair, else a tiny random pair)")
    p.add_argument("--draft-model", help="DFlash (or DFlash2) drafter folder or cached repo "
                   "id (without --model it is paired with the bundled demo target)")
    p.add_argument("--dflash2-model", default=None,
                   help="a DFlash2 drafter: adds dflash2+tape@B and dflash2+tape@B+nosel "
                   "(selector off) beside the DFlash modes (default on the bundled demo pair: "
                   "its DFlash2 drafter, resources/models/demo-dflash2; 'none' leaves it out)")
    p.add_argument("--prompts", type=Path, help="JSON file: a list of strings or of "
                   "{id, messages, tools, enable_thinking} objects; or a text file, one "
                   "prompt per line (default: the demo pair's held-out prompts + long ones)")
    p.add_argument("--block-sizes", type=_block_sizes, default=_block_sizes(DEFAULT_BLOCK_SIZES),
                   help=f"comma-separated DFlash block sizes (default {DEFAULT_BLOCK_SIZES}; "
                   "sizes above the drafter's are dropped); 'auto' adds the automatic block "
                   "size (dflash+tape@auto, and dflash2+tape@auto with a DFlash2 drafter)")
    p.add_argument("--repeats", type=_positive, default=DEFAULT_REPEATS,
                   help=f"timed runs per prompt and mode (default {DEFAULT_REPEATS})")
    p.add_argument("--max-tokens", type=_positive, default=DEFAULT_MAX_TOKENS,
                   help=f"generated tokens at most per run (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--out", type=Path, help="folder for bench.json, CSV files and PNG plots "
                   "(default: benchmarks/<UTC time> in the app-data folder, none with --json)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--keep-quantized", action="store_true",
                   help="keep a quantized target's layers quantized on the CPU (by default "
                   "they are dequantized to float32 when that fits in memory)")
    p.add_argument("--stage-timing", action="store_true",
                   help="wait for the device after each DFlash stage, so that the draft / "
                   "verify / rollback shares and rollback ms per replay are each stage's own "
                   "compute (by default a cycle waits once: they are queueing time)")
    p.add_argument("--fast-verify", action="store_true", help="also run dflash+tape@B+fast: "
                   "the near-exact chunked verify (can change tokens; reported per prompt)")
    p.add_argument("--scaling", action="store_true", help="also measure cost per token "
                   "against prompt length (128..4096) and against generated length")
    p.add_argument("--multi-turn", action="store_true",
                   help="time to first token of turns 2..5 after a long history, cold vs "
                   "reused prefix (prefix reuse)")
    p.add_argument("--history-tokens", type=_positive, default=3800,
                   help="history length for --multi-turn (default 3800 tokens)")
    from app.commands.distributed import add_distributed_arguments

    add_distributed_arguments(p)
    refuse_mode(p, "bench", "it runs plain and DFlash (tape and replay) at each of "
                "--block-sizes, and DFlash2 with a DFlash2 drafter; for one mode, use chat "
                "--mode")
    p.set_defaults(func=run_bench)


def _fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


def text_report(result: dict) -> str:
    """A plain-text table of the per-mode figures, preceded by the header."""
    h = result["header"]
    lines = [f"DFlash Chat {h['app']} | mlx {h['mlx']} | mlx-lm {h['mlx_lm']} | {h['device']}",
             f"BLAS: {h['blas']}",
             f"target: {h['target']}", f"drafter: {h['drafter']}",
             f"prompts: {h['prompts']} | repeats {h['repeats']} | max tokens {h['max_tokens']}",
             ""]
    # tok/s and "x plain" are pooled (all tokens over all generation seconds, and the ratio of
    # those figures); "x med" is the median of the paired per-prompt ratios (app.chat.measure)
    cols = ("mode", "tok/s", "x plain", "x med", "answer s", "x plain", "TTFT ms", "accept",
            "tau", "replays", "draft%", "verify%", "rollb%", "rb ms/rep", "peak MB", "same")
    # the mode column as wide as its longest name ("dflash2+tape@16+nosel"), so columns line up
    wide = max([18, *(len(name) + 2 for name in result["modes"])])
    row = ("{:<" + str(wide) + "}{:>8}{:>8}{:>7}{:>9}{:>8}{:>9}{:>8}{:>6}{:>8}{:>8}{:>8}{:>8}"
           "{:>10}{:>8}{:>6}")
    lines.append(row.format(*cols))

    def pct(v):
        return _fmt(None if v is None else 100 * v, ".0f")

    for name, f in result["modes"].items():
        lines.append(row.format(
            name, _fmt(f.get("pooled_tok_per_s"), ".1f"), _fmt(f.get("pooled_ratio_to_plain")),
            _fmt(f["ratio_to_plain"]), _fmt(f.get("time_to_answer_s"), ".2f"),
            _fmt(f.get("answer_ratio_to_plain")),
            _fmt(None if f["ttft_s"] is None else 1000 * f["ttft_s"], ".1f"),
            _fmt(f["acceptance_rate"]), _fmt(f["tau"]), f["replays"], pct(f["draft_share"]),
            pct(f["verify_share"]), pct(f["rollback_share"]), _fmt(f["rollback_ms_per_replay"]),
            _fmt(f["peak_memory_bytes"] / 2**20, ".0f"), "yes" if f["identical_tokens"] else "NO"))
    tvr = result.get("tape_vs_replay_rollback") or {}
    if tvr:
        lines.append("")
        lines.append("tape/replay rollback cost per replay: " + ", ".join(
            f"B={b}: {_fmt(v)}" for b, v in tvr.items()) + " (goal <= 0.20)")
    for b, v in (result.get("dflash2_vs_dflash") or {}).items():
        lines.append(f"DFlash2 vs DFlash at B={b}: tau {_fmt(v['dflash2_tau'])} vs "
                     f"{_fmt(v['dflash_tau'])} ({_fmt(v['tau_ratio'])}x, goal >= 1.10), selector "
                     f"off {_fmt(v['dflash2_nosel_tau'])}; tok/s (pooled, as in the table) "
                     f"{_fmt(v.get('dflash2_pooled_tok_per_s'), '.1f')} vs "
                     f"{_fmt(v.get('dflash_pooled_tok_per_s'), '.1f')}")
    for name, f in result["modes"].items():
        if f.get("auto_block"):
            lines.append(f"{name}: the automatic block size, mean block "
                         f"{_fmt(f.get('mean_block'), '.1f')} (1 = a plain step)")
    lines.append("tok/s and the first x plain: pooled over every prompt and repeat; x med: the "
                 "median of paired per-prompt ratios; answer s: the median time to answer "
                 "(prefill + generation), its x plain pooled")
    lines.append(f"identical tokens in every mode: {'yes' if result['identical_tokens'] else 'NO'}")
    for name, f in result["modes"].items():
        for pid, p in (f.get("prompts") or {}).items():
            if not p["identical"]:
                lines.append(f"  {name} differs from plain on {pid} at token "
                             f"{p['first_divergence']} (top-two logit gap {_fmt(p['top2_gap'], '.3g')})")
    g = result.get("goals")
    if g:
        lines.append(f"goal DFlash+tape >= 2x plain: best {_fmt(g['best_tape_ratio_to_plain'])}x"
                     f" -> {g['tape_2x_plain_identical']}; goal tape rollback <= 1/5 replay: "
                     f"worst {_fmt(g['worst_tape_over_replay_rollback'])} -> "
                     f"{g['tape_rollback_le_fifth_of_replay']}")
        if g["dflash_growth_le_plain"] is not None:
            lines.append(f"goal cost growth with context DFlash <= plain: plain "
                         f"{_fmt(g['plain_cost_growth'])}x, DFlash {_fmt(g['dflash_cost_growth'])}x"
                         f" -> {g['dflash_growth_le_plain']}")
    sc = result.get("scaling")
    if sc:
        lines.append("")
        lines.append(f"cost per generated token vs prompt length (DFlash block {sc['block_size']};"
                     f" {sc['note']})")
        lines.append("{:>8}{:>12}{:>12}{:>8}".format("prompt", "plain ms", "dflash ms", "tau"))
        for row in sc["context"]:
            lines.append("{:>8}{:>12}{:>12}{:>8}".format(
                row["prompt_tokens"], _fmt(row["plain_ms_per_token"]),
                _fmt(row["dflash_ms_per_token"]), _fmt(row.get("dflash_tau"))))
    return "\n".join(lines)


def _run_rows(records: list[RunRecord]) -> list[dict]:
    rows = []
    for r in records:
        s = r.summary
        rows.append({
            "mode": r.mode.name, "block_size": r.mode.block, "rollback": r.mode.rollback
            if r.mode.mode in DRAFTING_MODES else "", "prompt_id": r.prompt_id, "repeat": r.repeat,
            "prompt_tokens": r.prompt_tokens, "generated_tokens": s.generated_tokens,
            "tok_per_s": s.tok_per_s, "ttft_s": s.ttft_s, "cycles": s.cycles,
            "drafted": s.drafted, "accepted": s.accepted, "tau": s.tau, "replays": s.replays,
            "draft_s": s.draft_s, "verify_s": s.verify_s, "rollback_s": s.rollback_s,
            "peak_memory_bytes": s.peak_memory_bytes, "stop_cause": s.stop_cause,
        })
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    fields = list(dict.fromkeys(k for row in rows for k in row))  # every row's keys, in order
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def write_outputs(result: dict, records: list[RunRecord], out: Path) -> list[Path]:
    """Write ``bench.json``, ``runs.csv``, ``summary.csv`` and the PNG plots into ``out``
    (created); returns the written paths. Raises ``OSError`` when the folder is unwritable."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "bench.json", out / "runs.csv", out / "summary.csv"]
    written[0].write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    _write_csv(written[1], _run_rows(records))
    _write_csv(written[2], [{"name": k, **v} for k, v in result["modes"].items()])
    written += plot_results(result, records, out)
    return written


def plot_results(result: dict, records: list[RunRecord], out: Path) -> list[Path]:
    """PNG plots: tok/s by mode and block size, accepted-length histograms and (with scaling)
    cost per token against context and generated length. Imports matplotlib (Agg) lazily."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    h = result["header"]
    subtitle = f"{Path(h['target']).name} | {h['device']} | BLAS: {h['blas'].split(' (')[0]}"
    paths = []
    modes = result["modes"]
    blocks = sorted({f["block_size"] for f in modes.values() if f["block_size"]})
    plain = modes.get("plain", {}).get("tok_per_s")

    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.38
    for j, rb in enumerate(("tape", "replay")):
        vals = [modes.get(f"dflash+{rb}@{b}", {}).get("tok_per_s") or 0 for b in blocks]
        xs = [i + (j - 0.5) * width for i in range(len(blocks))]
        bars = ax.bar(xs, vals, width, label=f"DFlash + {rb}")
        for b, bar in zip(blocks, bars):
            ratio = modes.get(f"dflash+{rb}@{b}", {}).get("ratio_to_plain")
            if ratio is not None:
                ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2,
                                              bar.get_height()), ha="center", va="bottom",
                            fontsize=8)
    if plain:
        ax.axhline(plain, color="black", linestyle="--", label=f"plain ({plain:.1f})")
    tops = [f.get("tok_per_s") or 0 for f in modes.values()]
    ax.set_ylim(0, 1.3 * max(tops + [1e-9]))  # room above the bars for the legend
    ax.set_xticks(range(len(blocks)), [f"block {b}" for b in blocks])
    ax.set_ylabel("tokens / s (median, prefill excluded)")
    ax.set_title(f"Decoding speed by mode and block size\n{subtitle}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    fig.tight_layout()
    paths.append(out / "tok_per_s.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, max(1, len(blocks)), figsize=(3.2 * max(1, len(blocks)), 3.4),
                             squeeze=False)
    for ax, b in zip(axes[0], blocks or [None]):
        lengths = [a for r in records if r.mode.name == f"dflash+tape@{b}"
                   for a in r.summary.accepted_lengths]
        if b is not None:
            ax.hist(lengths, bins=[x - 0.5 for x in range(b + 1)], color="tab:blue")
            ax.set_title(f"block {b}", fontsize=9)
        ax.set_xlabel("accepted drafts per cycle")
    axes[0][0].set_ylabel("cycles")
    fig.suptitle(f"Accepted length (DFlash + tape)\n{subtitle}", fontsize=9)
    fig.tight_layout()
    paths.append(out / "accepted_length.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    sc = result.get("scaling")
    if sc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        xs = [r["prompt_tokens"] for r in sc["context"]]
        for key in ("plain", "dflash"):
            a1.plot(xs, [r[f"{key}_ms_per_token"] for r in sc["context"]], marker="o",
                    label=key if key == "plain" else f"DFlash + tape @{sc['block_size']}")
            g = sc["generated"].get(key, [])
            a2.plot([p["generated"] for p in g], [p["ms_per_token"] for p in g], marker=".",
                    label=key if key == "plain" else f"DFlash + tape @{sc['block_size']}")
        a1.set_xscale("log", base=2)
        a1.set_xlabel("prompt tokens")
        a2.set_xlabel(f"generated tokens (windows of {SCALING_WINDOW})")
        for a in (a1, a2):
            a.set_ylabel("ms per generated token")
            a.legend(fontsize=8)
        fig.suptitle(f"Cost per token against context length\n{subtitle}\n({sc['note']})",
                     fontsize=8)
        fig.tight_layout()
        paths.append(out / "cost_per_token.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


# ------------------------------------------------------------------------------ command
def _long_history(tokenizer, n_tokens: int) -> list[dict]:
    """A synthetic conversation whose rendered prompt holds about ``n_tokens`` tokens."""
    lines = [p.messages[0]["content"] for p in _long_prompts(120)]
    msgs: list[dict] = []
    i = 0
    while True:
        msgs.append({"role": "user", "content": f"Question {i + 1}: summarise this.\n"
                     + lines[i % len(lines)]})
        msgs.append({"role": "assistant", "content": lines[(i + 1) % len(lines)]})
        i += 1
        if len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True)) >= n_tokens:
            return msgs[:-2] if len(msgs) > 2 else msgs  # stay under n_tokens


def run_multi_turn(args) -> int:
    """``bench --multi-turn``: time to first token for turns 2..5 of a conversation
    with a ~4k-token history, cold (everything prefilled) vs reused (the previous turn's cache
    through :class:`~app.engine.prefix.PromptCache`), plain and DFlash. Goal: reused TTFT under
    20% of cold."""
    from app.chat.reply import ReplySettings, collect_reply
    from app.engine.blas import warn_if_slow_blas
    from app.engine.errors import EngineError
    from app.engine.prefix import PromptCache
    from app.models.loader import check_pair, load_drafter

    try:
        tpath, dpath = resolve_pair(args, need_drafter=True)
        target = load_target_arg(args, tpath)
        drafter = load_drafter(dpath)
        check_pair(target, drafter)
    except (CommandError, EngineError, ValueError) as exc:
        _err(f"error: {exc}")
        return 2
    warn_if_slow_blas(sys.stderr, load_mlx=True)
    n_history = min(args.history_tokens, target.context_length - 200)
    history = _long_history(target.tokenizer, n_history)
    asks = ["What is the capital of France?", "And of Peru?", "Name a currency.",
            "Thanks! One more: the capital of Japan?", "Goodbye."]
    rows = []
    for mode in ("plain", "dflash"):
        settings = ReplySettings(mode=mode, max_tokens=min(args.max_tokens, 24))
        session = PromptCache()
        convo = list(history)
        for turn, ask in enumerate(asks, start=1):
            convo.append({"role": "user", "content": ask})
            warm = collect_reply(target, drafter, convo, settings, session=session)
            if turn >= 2:
                cold_settings = ReplySettings(mode=mode, max_tokens=1)
                cold = collect_reply(target, drafter, convo, cold_settings)
                rows.append({
                    "mode": mode, "turn": turn,
                    "prompt_tokens": warm.summary.prompt_tokens,
                    "reused_tokens": warm.summary.reused_tokens,
                    "cold_ttft_s": cold.summary.ttft_s, "reused_ttft_s": warm.summary.ttft_s,
                    "ratio": warm.summary.ttft_s / cold.summary.ttft_s,
                })
                if not args.json:
                    r = rows[-1]
                    _err(f"{mode:<6} turn {turn}: {r['prompt_tokens']} prompt tokens, "
                         f"{r['reused_tokens']} reused; TTFT cold {r['cold_ttft_s']:.3f} s, "
                         f"reused {r['reused_ttft_s']:.3f} s ({r['ratio']:.0%})")
            convo += warm.messages
    head = header(target, drafter, tpath, dpath, {"history_tokens": n_history, "turns": "2..5"})
    result = {"header": head, "turns": rows,
              "goal_reused_under_20pct": all(r["ratio"] < 0.2 for r in rows)}
    if args.json:
        print(json.dumps(result))
    else:
        print("multi-turn TTFT (reused / cold): " + ", ".join(
            f"{r['mode']} t{r['turn']} {r['ratio']:.0%}" for r in rows))
    return 0


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check_out_folder(out: Path) -> None:
    """Make ``--out`` (parents included) and check that a file can be written in it, before
    the bench runs: a folder that cannot be written was found only after the whole run.
    Raises :class:`CommandError` saying why."""
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise CommandError(f"cannot write the results to {out}: "
                           f"{exc.strerror or exc}") from None


def run_bench(args) -> int:
    """The ``bench`` command; returns the exit code (0 ok, 2 bad input or model files)."""
    if args.multi_turn:
        return run_multi_turn(args)
    from app.engine.blas import warn_if_slow_blas
    from app.engine.errors import EngineError
    from app.models.loader import check_pair, load_drafter

    try:
        if args.out is not None:
            check_out_folder(args.out)
        tpath, dpath = resolve_pair(args, need_drafter=True)
        target = load_target_arg(args, tpath)
        drafter = load_drafter(dpath)
        check_pair(target, drafter)
        drafter2 = None
        d2path = default_dflash2(args)
        if d2path:
            drafter2 = load_drafter(d2path)
            if drafter_mode(drafter2) is not Mode.DFLASH2:
                raise CommandError(f"--dflash2-model {d2path} is not a DFlash2 drafter")
            check_pair(target, drafter2)
        if args.prompts:
            prompts, source = load_prompts(args.prompts), str(args.prompts)
        else:
            prompts, source = default_prompts(Path(tpath) if Path(tpath).is_dir() else None)
        rendered = [(p.id, render(target, p)) for p in prompts]
    except (CommandError, EngineError, BenchError, ValueError) as exc:
        _err(f"error: {exc}")
        return 2
    warn_if_slow_blas(sys.stderr, load_mlx=True)
    only_v2 = drafter_mode(drafter) is Mode.DFLASH2
    limit = min(d.config.block_size for d in (drafter, drafter2) if d is not None)
    auto = "auto" in args.block_sizes
    sizes = [b for b in args.block_sizes if b != "auto"]
    blocks = [b for b in sizes if b <= limit]
    if len(blocks) < len(sizes):
        _err(f"note: block sizes above the drafter's {limit} dropped "
             f"({', '.join(str(b) for b in sizes if b > limit)})")
    if not blocks:
        blocks = [limit]
    modes = make_modes(blocks, fast=args.fast_verify and not only_v2,
                       dflash2=only_v2 or drafter2 is not None, dflash=not only_v2, auto=auto)
    settings = {"prompts": source, "prompt_count": len(prompts), "repeats": args.repeats,
                "max_tokens": args.max_tokens, "block_sizes": blocks, "auto_block": auto,
                "modes_order": "interleaved, rotating", "greedy": True,
                "fast_verify_modes": bool(args.fast_verify),
                "stage_timing": bool(getattr(args, "stage_timing", False))}
    if drafter2 is not None:
        settings["dflash2_drafter"] = str(d2path)
    head = header(target, drafter, tpath, dpath, settings)

    name_width = max(len(m.name) for m in modes)  # dflash2+tape@16+nosel: 21

    def progress(i, n, rec):
        if not args.json:
            _err(f"[{i}/{n}] {rec.mode.name:<{name_width}} {rec.prompt_id:<22} "
                 f"{rec.summary.tok_per_s:7.1f} tok/s")

    t0 = time.perf_counter()
    records = run_matrix(target, drafter, rendered, modes, args.repeats, args.max_tokens,
                         progress, drafter2=drafter2,
                         stage_timing=getattr(args, "stage_timing", False))
    figures = aggregate(records, modes)
    add_top2_gaps(target, figures, records, dict(rendered))
    result: dict[str, Any] = {
        "header": head,
        "modes": figures,
        "tape_vs_replay_rollback": tape_vs_replay(figures),
        "identical_tokens": all(f["identical_tokens"] for f in figures.values()),
        "scaling": None,
    }
    if any(f.get("mode") == "dflash2" for f in figures.values()):
        result["dflash2_vs_dflash"] = dflash2_vs_dflash(figures)
    if args.scaling:
        if not args.json:
            _err("scaling: cost per token against prompt and generated length ...")
        result["scaling"] = run_scaling(target, drafter, max(blocks), repeats=args.repeats)
    result["goals"] = goals(result)
    result["header"]["wall_s"] = round(time.perf_counter() - t0, 1)
    out = args.out
    if out is None and not args.json:
        from app.paths import default_data_dir

        out = default_data_dir() / "benchmarks" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    written: list[Path] = []
    write_error = None
    if out is not None:
        try:
            written = write_outputs(result, records, out)
        except OSError as exc:  # the results are still printed below
            write_error = f"error: cannot write the results to {out}: {exc}"
    if args.json:
        print(json.dumps(result))
    else:
        print(text_report(result))
        if written:
            print("wrote " + ", ".join(str(p) for p in written))
    if write_error:
        _err(write_error)
        return 2
    return 0

