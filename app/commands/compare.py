"""``python -m app compare``: plain, DFlash and DFlash2 on the same prompt.

Prints ``{"plain", "dflash", "identical", "first_divergence", "near_tie"}`` with ``--json``
(each side as ``chat --json`` prints it), else the replies and a verdict. When a DFlash2
drafter takes part (``--draft-model`` is one, ``--dflash2-model`` gives one beside a DFlash
drafter, or by default on the bundled demo pair its DFlash2 drafter, as in the window's
three-sided Compare; ``--dflash2-model none`` leaves it out) the object adds ``"dflash2",
"dflash2_identical", "dflash2_first_divergence"`` (DFlash2 vs plain). With only a DFlash2
drafter, ``"dflash"`` is that drafter's run too (mode ``dflash`` runs the drafter's own
draft), so today's fields keep their meaning: speculative vs plain. ``--lookup`` adds a
Lookup side (prompt-lookup drafts, no drafter) and ``"lookup", "lookup_identical",
"lookup_first_divergence", "lookup_speedup"`` (Lookup vs plain). A divergence is
reported, not an error (exit code 0); 2 for bad arguments or unusable model files.

Timing (``app.chat.measure``): every side's path is warmed up before anything is timed (a
note on stderr names them: ``warmed up 3 paths (plain, DFlash, DFlash2) in 2.1 s``), each side
runs ``--repeats`` times with the order rotating, and every side gives ``time_to_answer_s``
(send to last token, prefill and tool rounds included; its median over the repeats) and
``tool_s`` beside ``summary``/``reply_summary``, and ``runs`` (each run's figures). The
object adds ``"sampled"`` (temperature > 0: the sides are not expected to match),
``"repeats"``, ``"repeats_identical"`` and ``"speedup"`` (DFlash vs plain: pooled time to
answer and decode ratios, and the medians of paired ratios; ``"dflash2_speedup"`` likewise).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import replace

from app.chat.measure import ReplyFigures, median_figures, speedup
from app.chat.reply import collect_reply, divergence_near_tie
from app.chat.tools import builtin_tools
from app.commands.chat import _print_reply, chat_object, tool_hint
from app.commands.generation import (
    AUTO,
    _add_common,
    _guard,
    _load,
    _messages,
    _positive_int,
    check_prompt_fits,
    default_dflash2,
    default_thinking,
    load_tools,
    prepare_tools,
    refuse_mode,
    settings_from_args,
    warm_up_both,
)
from app.engine.compare import first_divergence
from app.engine.modes import Mode, drafter_mode


def register(subparsers) -> None:
    """Add the ``compare`` subcommand."""
    compare = subparsers.add_parser(
        "compare", help="plain, DFlash and DFlash2 on the same prompt",
        description="Run plain, then DFlash, then DFlash2 decoding on the same prompt and "
        "report whether the tokens are identical, where they first differ and how close the "
        "target's top two logits are there. The DFlash2 side runs with a DFlash2 drafter: "
        "--dflash2-model, or --draft-model when it is one (then it is the only speculative "
        "side), or by default on the bundled demo pair its bundled DFlash2 drafter, as the "
        "window's Compare does; without one, compare runs plain and DFlash only.",
    )
    _add_common(compare)
    compare.add_argument("--repeats", type=_positive_int, default=1,
                         help="run each side this many times, the order rotating each time "
                         "(default 1); figures are per-side medians and the speed-up is "
                         "given pooled and as the median of paired ratios")
    compare.add_argument("--dflash2-model", default=None,
                         help="a DFlash2 drafter to compare too, beside --draft-model's run "
                         "(default on the bundled demo pair: its DFlash2 drafter, "
                         "resources/models/demo-dflash2; 'none' leaves it out)")
    compare.add_argument("--lookup", action="store_true",
                         help="compare Lookup decoding (prompt-lookup drafts, no drafter) "
                         "with plain too")
    refuse_mode(compare, "compare", "it runs plain, DFlash and, with a DFlash2 drafter, "
                "DFlash2 side by side (--lookup adds Lookup; --dflash2-model none leaves "
                "DFlash2 out); for one mode, use chat --mode")
    compare.set_defaults(func=run_compare)


def run_compare(args) -> int:
    """``compare``: plain, then DFlash and/or DFlash2; returns the exit code."""
    return _guard(_compare, args)


def _compare(args) -> int:
    tools = load_tools(args.tools)
    tool_setup = prepare_tools(args.run_tools, tools)
    target, drafter, tpath, dpath = _load(args, need_drafter=True)
    think = args.think if args.think is not None else default_thinking(tpath, dpath)
    drafter2 = None
    d2path = default_dflash2(args)
    if d2path:
        from app.commands.generation import CommandError
        from app.models.loader import check_pair, load_drafter

        drafter2 = load_drafter(d2path)
        if drafter_mode(drafter2) is not Mode.DFLASH2:
            raise CommandError(f"--dflash2-model {d2path} is not a DFlash2 drafter")
        check_pair(target, drafter2)
    only_v2 = drafter_mode(drafter) is Mode.DFLASH2
    runs = [("plain", drafter), ("dflash2" if only_v2 else "dflash", drafter)]
    if drafter2 is not None and not only_v2:
        runs.append(("dflash2", drafter2))
    if args.lookup:
        runs.append((Mode.LOOKUP.value, None))
    check_prompt_fits(target, _messages(args), settings_from_args(args, runs[0][0], tools, think))
    # every side that is timed, warmed first (a drafter that runs no side is not)
    warm_up_both(target, [drafter] + [d for m, d in runs[2:] if d is not None],
                 auto_block=args.block_size == AUTO, lookup=args.lookup)
    if tool_setup is not None:  # else the first side's first conversion would pay for it
        tool_setup.join()
    # every run sees the same tool results: the built-in clock frozen at one instant
    frozen = builtin_tools(dt.datetime.now(dt.UTC)) if args.tools == "builtin" else None
    settings = {}
    for mode, _ in runs:
        settings[mode] = settings_from_args(args, mode, tools, think)
        if frozen is not None:
            settings[mode] = replace(settings[mode], runnable_tools=frozen)
    replies: dict[str, list] = {mode: [] for mode, _ in runs}
    walls: dict[str, list[float]] = {mode: [] for mode, _ in runs}
    for r in range(args.repeats):
        k = r % len(runs)  # the order rotates, so that no side always runs first
        for mode, d in runs[k:] + runs[:k]:
            t0 = time.perf_counter()
            replies[mode].append(collect_reply(target, d, _messages(args), settings[mode]))
            walls[mode].append(time.perf_counter() - t0)
    figures = {m: [ReplyFigures.of(rep, w) for rep, w in zip(replies[m], walls[m])]
               for m in replies}
    results = {m: (replies[m][0], settings[m], d) for m, d in runs}
    if only_v2:
        results["dflash"] = results["dflash2"]
        figures["dflash"] = figures["dflash2"]
    plain, dflash = results["plain"][0], results["dflash"][0]
    div = first_divergence(plain.all_tokens, dflash.all_tokens)
    tie = divergence_near_tie(target, plain, dflash) if div is not None else None
    speed = speedup(figures["plain"], figures["dflash"])

    def side(name):
        reply, s, d = results[name]
        out = chat_object(reply, s, d, args.run_tools,
                          median_figures(figures[name]).time_to_answer_s)
        out["runs"] = [f.to_dict() for f in figures[name]]
        return out

    obj = {
        "plain": side("plain"),
        "dflash": side("dflash"),
        "identical": div is None,
        "first_divergence": div,
        "near_tie": tie,
        "sampled": bool(args.temp and args.temp > 0),
        "repeats": args.repeats,
        "speedup": speed.to_dict(),
        # every repeat's tokens equal its side's first run (greedy runs are deterministic)
        "repeats_identical": all(rep.all_tokens == replies[m][0].all_tokens
                                 for m in replies for rep in replies[m]),
    }
    if "dflash2" in results:
        v2 = results["dflash2"][0]
        div2 = first_divergence(plain.all_tokens, v2.all_tokens)
        obj["dflash2"] = side("dflash2")
        obj["dflash2_identical"] = div2 is None
        obj["dflash2_first_divergence"] = div2
        obj["dflash2_speedup"] = speedup(figures["plain"], figures["dflash2"]).to_dict()
    if Mode.LOOKUP in results:
        div_l = first_divergence(plain.all_tokens, results[Mode.LOOKUP][0].all_tokens)
        obj["lookup"] = side(Mode.LOOKUP.value)
        obj["lookup_identical"] = div_l is None
        obj["lookup_first_divergence"] = div_l
        obj["lookup_speedup"] = speedup(figures["plain"], figures[Mode.LOOKUP]).to_dict()
    if args.json:
        print(json.dumps(obj, ensure_ascii=False))
        return 0
    for name, (reply, _, _) in results.items():
        if only_v2 and name == Mode.DFLASH:
            continue  # the same run as dflash2
        print(f"== {name} ==")
        _print_reply(reply, obj[name]["block_size"], obj[name]["time_to_answer_s"])
    if obj["sampled"]:
        print(f"sampled (temperature {args.temp:g}): the sides are not expected to match "
              "token for token")
    else:  # DFlash's line first, then the other sides' (as the speed lines below)
        if div is None:
            print("identical: yes")
        else:
            gap = f", top-two logit gap {tie['gap']:.3g}" if tie else ""
            print(f"identical: no (first divergence at token {div}{gap})")
        if "dflash2" in results and not only_v2:
            d2 = obj["dflash2_first_divergence"]
            print("dflash2 identical: "
                  + ("yes" if d2 is None else f"no (first divergence at {d2})"))
        if Mode.LOOKUP in results:
            dl = obj["lookup_first_divergence"]
            print("lookup identical: "
                  + ("yes" if dl is None else f"no (first divergence at {dl})"))
    # whole replies, tool rounds included (as the window compares them), warmed, sides rotated
    print("speed: " + speed.line("DFlash2" if only_v2 else "DFlash"))
    if "dflash2" in results and not only_v2:
        print("speed: " + speedup(figures["plain"], figures["dflash2"]).line("DFlash2"))
    if Mode.LOOKUP in results:
        print("speed: " + speedup(figures["plain"], figures[Mode.LOOKUP]).line("Lookup"))
    if hint := tool_hint(plain, args.run_tools):
        print(hint)
    return 0
