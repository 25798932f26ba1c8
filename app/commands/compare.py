"""``python -m app compare``: plain then DFlash on the same prompt.

Prints ``{"plain", "dflash", "identical", "first_divergence", "near_tie"}`` with ``--json``
(each side as ``chat --json`` prints it), else both replies and a verdict. A divergence is
reported, not an error (exit code 0); 2 for bad arguments or unusable model files.
"""

from __future__ import annotations

import json

from app.chat.reply import collect_reply, divergence_near_tie
from app.commands.chat import _print_reply, chat_object
from app.commands.generation import (
    _add_common,
    _guard,
    _load,
    _messages,
    default_thinking,
    load_tools,
    settings_from_args,
)
from app.engine.compare import first_divergence


def register(subparsers) -> None:
    """Add the ``compare`` subcommand."""
    compare = subparsers.add_parser(
        "compare", help="plain then DFlash on the same prompt",
        description="Run plain then DFlash decoding on the same prompt and report whether the "
        "tokens are identical, where they first differ and how close the target's top two "
        "logits are there.",
    )
    _add_common(compare)
    compare.set_defaults(func=run_compare)


def run_compare(args) -> int:
    """``compare``: plain then DFlash; returns the exit code."""
    return _guard(_compare, args)


def _compare(args) -> int:
    tools = load_tools(args.tools)
    target, drafter, tpath, dpath = _load(args, need_drafter=True)
    think = args.think if args.think is not None else default_thinking(tpath, dpath)
    results = {}
    for mode in ("plain", "dflash"):
        settings = settings_from_args(args, mode, tools, think)
        reply = collect_reply(target, drafter, _messages(args), settings)
        results[mode] = (reply, settings)
    (plain, ps), (dflash, ds) = results["plain"], results["dflash"]
    div = first_divergence(plain.all_tokens, dflash.all_tokens)
    tie = divergence_near_tie(target, plain, dflash) if div is not None else None
    obj = {
        "plain": chat_object(plain, ps, drafter, args.run_tools),
        "dflash": chat_object(dflash, ds, drafter, args.run_tools),
        "identical": div is None,
        "first_divergence": div,
        "near_tie": tie,
    }
    if args.json:
        print(json.dumps(obj, ensure_ascii=False))
        return 0
    for name, (reply, _) in results.items():
        print(f"== {name} ==")
        _print_reply(reply, obj[name]["block_size"])
    if div is None:
        print("identical: yes")
    else:
        gap = f", top-two logit gap {tie['gap']:.3g}" if tie else ""
        print(f"identical: no (first divergence at token {div}{gap})")
    sp, sd = plain.summary.tok_per_s, dflash.summary.tok_per_s
    if sp > 0 and sd > 0:
        print(f"speed: DFlash {sd:.1f} tok/s vs plain {sp:.1f} tok/s ({sd / sp:.2f}x)")
    return 0
