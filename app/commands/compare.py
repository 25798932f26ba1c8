"""``python -m app compare``: plain, DFlash and DFlash2 on the same prompt.

Prints ``{"plain", "dflash", "identical", "first_divergence", "near_tie"}`` with ``--json``
(each side as ``chat --json`` prints it), else the replies and a verdict. When a DFlash2
drafter takes part (``--draft-model`` is one, ``--dflash2-model`` gives one beside a DFlash
drafter, or by default on the bundled demo pair its DFlash2 drafter, as in the window's
three-sided Compare; ``--dflash2-model none`` leaves it out) the object adds ``"dflash2",
"dflash2_identical", "dflash2_first_divergence"`` (DFlash2 vs plain). With only a DFlash2
drafter, ``"dflash"`` is that drafter's run too (mode ``dflash`` runs the drafter's own
draft), so today's fields keep their meaning: speculative vs plain. A divergence is
reported, not an error (exit code 0); 2 for bad arguments or unusable model files.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

from app.chat.reply import collect_reply, divergence_near_tie
from app.chat.tools import builtin_tools
from app.commands.chat import _print_reply, chat_object
from app.commands.generation import (
    _add_common,
    _guard,
    _load,
    _messages,
    default_dflash2,
    default_thinking,
    load_tools,
    settings_from_args,
    warm_up_on_gpu,
)
from app.engine.compare import first_divergence


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
    compare.add_argument("--dflash2-model", default=None,
                         help="a DFlash2 drafter to compare too, beside --draft-model's run "
                         "(default on the bundled demo pair: its DFlash2 drafter, "
                         "resources/models/demo-dflash2; 'none' leaves it out)")
    compare.set_defaults(func=run_compare)


def run_compare(args) -> int:
    """``compare``: plain, then DFlash and/or DFlash2; returns the exit code."""
    return _guard(_compare, args)


def _compare(args) -> int:
    tools = load_tools(args.tools)
    target, drafter, tpath, dpath = _load(args, need_drafter=True)
    think = args.think if args.think is not None else default_thinking(tpath, dpath)
    drafter2 = None
    d2path = default_dflash2(args)
    if d2path:
        from app.commands.generation import CommandError
        from app.models.loader import check_pair, load_drafter

        drafter2 = load_drafter(d2path)
        if getattr(drafter2.config, "kind", "dflash") != "dflash2":
            raise CommandError(f"--dflash2-model {d2path} is not a DFlash2 drafter")
        check_pair(target, drafter2)
    warm_up_on_gpu(target, [drafter, drafter2])
    only_v2 = getattr(drafter.config, "kind", "dflash") == "dflash2"
    results = {}
    runs = [("plain", drafter), ("dflash2" if only_v2 else "dflash", drafter)]
    if drafter2 is not None and not only_v2:
        runs.append(("dflash2", drafter2))
    # both runs see the same tool results: the built-in clock frozen at one instant
    frozen = builtin_tools(dt.datetime.now(dt.UTC)) if args.tools == "builtin" else None
    for mode, d in runs:
        settings = settings_from_args(args, mode, tools, think)
        if frozen is not None:
            settings = replace(settings, runnable_tools=frozen)
        reply = collect_reply(target, d, _messages(args), settings)
        results[mode] = (reply, settings, d)
    if only_v2:
        results["dflash"] = results["dflash2"]
    (plain, ps, _), (dflash, ds, _) = results["plain"], results["dflash"]
    div = first_divergence(plain.all_tokens, dflash.all_tokens)
    tie = divergence_near_tie(target, plain, dflash) if div is not None else None
    obj = {
        "plain": chat_object(plain, ps, drafter, args.run_tools),
        "dflash": chat_object(dflash, ds, drafter, args.run_tools),
        "identical": div is None,
        "first_divergence": div,
        "near_tie": tie,
    }
    if "dflash2" in results:
        v2, s2, d2 = results["dflash2"]
        div2 = first_divergence(plain.all_tokens, v2.all_tokens)
        obj["dflash2"] = chat_object(v2, s2, d2, args.run_tools)
        obj["dflash2_identical"] = div2 is None
        obj["dflash2_first_divergence"] = div2
    if args.json:
        print(json.dumps(obj, ensure_ascii=False))
        return 0
    for name, (reply, _, _) in results.items():
        if only_v2 and name == "dflash":
            continue  # the same run as dflash2
        print(f"== {name} ==")
        _print_reply(reply, obj[name]["block_size"])
    if "dflash2" in results and not only_v2:
        d2 = obj["dflash2_first_divergence"]
        print("dflash2 identical: " + ("yes" if d2 is None else f"no (first divergence at {d2})"))
    if div is None:
        print("identical: yes")
    else:
        gap = f", top-two logit gap {tie['gap']:.3g}" if tie else ""
        print(f"identical: no (first divergence at token {div}{gap})")
    # the whole replies' speeds, tool rounds included (as the window compares them)
    sp, sd = plain.reply_summary.tok_per_s, dflash.reply_summary.tok_per_s
    if sp > 0 and sd > 0:
        print(f"speed: DFlash{'2' if only_v2 else ''} {sd:.1f} tok/s vs plain {sp:.1f} tok/s "
              f"({sd / sp:.2f}x)")
    if "dflash2" in results and not only_v2:
        s2 = results["dflash2"][0].reply_summary.tok_per_s
        if sp > 0 and s2 > 0:
            print(f"speed: DFlash2 {s2:.1f} tok/s vs plain {sp:.1f} tok/s ({s2 / sp:.2f}x)")
    return 0
