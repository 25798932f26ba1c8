"""Headless ``chat`` and ``compare`` commands (issues 3-5; the JSON contract is in the README).

``python -m app chat [--model M --draft-model D] --mode {plain,dflash,dflash2} --prompt TEXT ...``
prints the reply (or, with ``--json``, one object: ``mode, block_size, rollback, tokens, text,
summary, content, reasoning, tool_calls, finish_reason`` and ``rounds`` with ``--run-tools``).
``python -m app compare ...`` runs plain then DFlash on the same prompt and prints
``{"plain", "dflash", "identical", "first_divergence", "near_tie"}``; when a DFlash2 drafter
takes part (``--draft-model`` is one, or ``--dflash2-model`` gives one beside a DFlash drafter)
it adds ``"dflash2", "dflash2_identical", "dflash2_first_divergence"`` (DFlash2 vs plain). With
only a DFlash2 drafter, ``"dflash"`` is that drafter's run too (mode ``dflash`` runs the
drafter's own draft), so today's fields keep their meaning: speculative vs plain.

Both go through :func:`app.chat.reply.run_reply`, the same code the window uses. Exit codes:
0 ok (a divergence is reported, not an error), 2 bad arguments or unusable model files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.chat.reply import Reply, ReplySettings, collect_reply, divergence_near_tie
from app.engine.compare import first_divergence
from app.engine.errors import EngineError

# A question that needs a tool and a reasoning block, in the bundled pair's closed world.
DEFAULT_PROMPT = "What is the local time in Sydney?"
TINY_PAIR_FOLDER = "tiny-pair"


class CommandError(Exception):
    """A problem with the command's input (exit code 2, message on stderr)."""


# ------------------------------------------------------------------------------ arguments
def int_at_least(minimum: int):
    """An argparse ``type`` accepting whole numbers >= ``minimum`` (clear message otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive_int = int_at_least(1)
_non_negative_int = int_at_least(0)


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10, got {value:g}")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="target: a folder or a cached Hugging Face repo id "
                   "(default: the bundled demo pair)")
    p.add_argument("--draft-model", help="DFlash drafter folder or cached repo id")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message")
    p.add_argument("--system-prompt", help="a system message")
    p.add_argument("--max-tokens", type=_positive_int, default=256,
                   help="generated tokens at most per round (default 256)")
    p.add_argument("--block-size", type=_positive_int,
                   help="DFlash block size, 1..the drafter's (default: the drafter's)")
    p.add_argument("--rollback", choices=["tape", "replay"], default="tape",
                   help="recurrent-state rollback under DFlash (default tape)")
    p.add_argument("--fast-verify", action="store_true",
                   help="near-exact: verify with the chunked Gated DeltaNet form (faster on "
                   "CPU for hybrid targets; can change tokens, see README); off by default")
    think = p.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think", action="store_true", default=None,
                       help="thinking on in the chat template")
    think.add_argument("--no-think", dest="think", action="store_false",
                       help="thinking off in the chat template")
    p.add_argument("--temp", type=_temperature, default=0.0,
                   help="sampling temperature (default 0: greedy)")
    p.add_argument("--seed", type=int, help="random seed for sampling")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1)")
    p.add_argument("--top-k", type=_non_negative_int, default=0,
                   help="sample among the k most likely tokens (default 0: all)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below min-p times the top probability (default 0)")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="penalise tokens seen in the last 20 (mlx-lm; e.g. 1.1)")
    p.add_argument("--tools", default="builtin", metavar="{builtin,none,FILE}",
                   help="tool definitions shown to the model: the built-in tools (default), "
                   "none, or a JSON file of definitions")
    p.add_argument("--tool-parser", help="mlx_lm.tool_parsers module to use instead of the "
                   "one inferred from the chat template (e.g. json_tools)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop string (repeatable)")
    p.add_argument("--run-tools", action="store_true",
                   help="run the model's tool calls (built-in tools) and continue the reply")
    p.add_argument("--max-tool-rounds", type=_non_negative_int, default=8,
                   help="tool rounds at most per reply (default 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers) -> None:
    """Add the ``chat`` and ``compare`` subcommands."""
    chat = subparsers.add_parser(
        "chat", help="one reply, plain or DFlash",
        description="Generate one reply to --prompt and print it with its figures.",
    )
    _add_common(chat)
    chat.add_argument("--mode", choices=["plain", "dflash", "dflash2"], default="dflash",
                      help="decoding mode (default dflash; dflash2 needs a DFlash2 drafter)")
    chat.set_defaults(func=run_chat)
    compare = subparsers.add_parser(
        "compare", help="plain then DFlash on the same prompt",
        description="Run plain then DFlash decoding on the same prompt and report whether the "
        "tokens are identical, where they first differ and how close the target's top two "
        "logits are there.",
    )
    _add_common(compare)
    compare.add_argument("--dflash2-model", default=None,
                         help="a DFlash2 drafter to compare too, beside --draft-model's run")
    compare.set_defaults(func=run_compare)


# ------------------------------------------------------------------------------ setup
def _warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def resolve_pair(args, need_drafter: bool) -> tuple[str, str | None]:
    """(target, drafter or None) paths/repo ids from the arguments, the bundled demo pair, or
    a tiny random pair built under ``cache_dir()`` (one line on stderr says so)."""
    from app.paths import cache_dir, demo_pair_dirs

    if args.model:
        if need_drafter and not args.draft_model:
            hint = " (or use --mode plain)" if getattr(args, "mode", None) else ""
            raise CommandError(f"DFlash needs --draft-model with --model{hint}")
        return args.model, args.draft_model
    if args.draft_model:
        raise CommandError("--draft-model needs --model (the target it was made for)")
    target, drafter = demo_pair_dirs()
    if (target / "config.json").is_file() and (drafter / "config.json").is_file():
        return str(target), str(drafter)
    from app.engine.tiny import build_tiny_pair

    root = cache_dir() / TINY_PAIR_FOLDER
    _warn(f"The bundled demo pair is missing: using a tiny random-weight pair in {root} "
          "(its text is gibberish).")
    t, d = build_tiny_pair(root)
    return str(t), str(d)


def load_tools(spec: str) -> list[dict] | None:
    """Tool definitions for ``--tools``: ``builtin``, ``none`` or a JSON file path."""
    if spec == "none":
        return None
    from app.chat.tools import ToolFileError, load_tool_file, tool_schemas

    if spec == "builtin":
        return tool_schemas()

    try:
        return tool_schemas(load_tool_file(Path(spec)))
    except ToolFileError as exc:
        raise CommandError(str(exc)) from None


def default_thinking(target: str, drafter: str | None) -> bool | None:
    """The known pair's recommended thinking setting, else None (the template's default)."""
    from app.engine.catalog import known_pair_for

    for name in (drafter, target):
        pair = known_pair_for(name)
        if pair is not None:
            return pair.thinking
    return None


def settings_from_args(args, mode: str, tools: list[dict] | None, think: bool | None):
    """:class:`ReplySettings` for ``mode`` from parsed arguments."""
    return ReplySettings(
        mode=mode,
        max_tokens=args.max_tokens,
        block_size=args.block_size,
        rollback=args.rollback,
        fast_verify=args.fast_verify,
        enable_thinking=think,
        stop=list(args.stop),
        tools=tools,
        run_tools=args.run_tools,
        # Only the built-in tools run, and only when they are the ones offered to the model;
        # tools from a file are shown to the model but never run here.
        runnable_tools=None if args.tools == "builtin" else [],
        max_tool_rounds=args.max_tool_rounds,
        tool_parser=args.tool_parser,
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )


def _messages(args) -> list[dict]:
    msgs = []
    if args.system_prompt:
        msgs.append({"role": "system", "content": args.system_prompt})
    msgs.append({"role": "user", "content": args.prompt})
    return msgs


def _load(args, need_drafter: bool):
    from app.engine.loader import check_pair, load_drafter, load_target

    tpath, dpath = resolve_pair(args, need_drafter)
    target = load_target(tpath)
    drafter = None
    if dpath and need_drafter:
        drafter = load_drafter(dpath)
        check_pair(target, drafter)
    return target, drafter, tpath, dpath


# ------------------------------------------------------------------------------ output
def chat_object(reply: Reply, settings: ReplySettings, drafter, with_rounds: bool) -> dict:
    """The ``chat --json`` object for ``reply``."""
    block = None
    if reply.mode in ("dflash", "dflash2"):
        block = settings.block_size or (drafter.config.block_size if drafter else None)
    out: dict[str, Any] = {
        "mode": reply.mode,
        "block_size": block,
        "rollback": settings.rollback,
        "tokens": reply.tokens,
        "text": reply.text,
        "summary": reply.summary.to_dict(),
        "content": reply.content,
        "reasoning": reply.reasoning,
        "tool_calls": [c.to_dict() for c in reply.tool_calls],
        "finish_reason": reply.finish_reason,
        "from_draft": reply.from_draft,
        "warnings": reply.warnings,
    }
    if with_rounds:
        out["rounds"] = [r.to_dict() for r in reply.rounds]
    return out


def figures_line(reply: Reply, block: int | None = None) -> str:
    """One line of figures: mode, tokens, tok/s, TTFT, acceptance, tau, replays, finish."""
    s = reply.summary
    parts = [reply.mode + (f" (block {block})" if block else "")]
    parts.append(f"{len(reply.tokens)} tokens")
    parts.append(f"{s.tok_per_s:.1f} tok/s")
    parts.append(f"TTFT {s.ttft_s:.2f} s")
    if reply.mode in ("dflash", "dflash2"):
        acc = "n/a" if s.acceptance_rate is None else f"{100 * s.acceptance_rate:.0f}%"
        tau = "n/a" if s.tau is None else f"{s.tau:.2f}"
        parts += [f"acceptance {acc}", f"tau {tau}", f"replays {s.replays}"]
    parts.append(f"finish {reply.finish_reason}")
    return " · ".join(parts)


def _print_reply(reply: Reply, block: int | None) -> None:
    for r in reply.rounds[:-1]:
        for run in r.tool_runs:
            print(f"[tool call] {run.call.name} {json.dumps(run.call.arguments, ensure_ascii=False)}")
            print(f"[tool result] {run.result.content()}")
    if reply.reasoning:
        print("[reasoning]")
        print(reply.reasoning)
        if reply.content:
            print("[answer]")
        elif not reply.tool_calls:
            print("[answer] (none: the reply ended while reasoning)")
    if reply.content or not (reply.reasoning or reply.tool_calls):
        print(reply.content)
    for c in reply.tool_calls:
        print(f"[tool call] {c.name} {json.dumps(c.arguments, ensure_ascii=False)}")
    for w in reply.warnings:
        print(f"[warning] {w['message']}")
    print(figures_line(reply, block))


# ------------------------------------------------------------------------------ commands
def _guard(fn, args) -> int:
    try:
        return fn(args)
    except (EngineError, CommandError, ValueError) as exc:
        _warn(f"error: {exc}")
        return 2


def run_chat(args) -> int:
    """``chat``: one reply; returns the exit code."""
    return _guard(_chat, args)


def run_compare(args) -> int:
    """``compare``: plain then DFlash; returns the exit code."""
    return _guard(_compare, args)


def _chat(args) -> int:
    tools = load_tools(args.tools)
    settings = settings_from_args(args, args.mode, tools, args.think)
    target, drafter, tpath, dpath = _load(args, need_drafter=args.mode in ("dflash", "dflash2"))
    if settings.enable_thinking is None:
        settings.enable_thinking = default_thinking(tpath, dpath)
    if args.json:
        reply = collect_reply(target, drafter, _messages(args), settings)
        print(json.dumps(chat_object(reply, settings, drafter, args.run_tools), ensure_ascii=False))
        return 0
    reply = _stream_reply(target, drafter, _messages(args), settings)
    block = chat_object(reply, settings, drafter, False)["block_size"]
    for w in reply.warnings:
        print(f"[warning] {w['message']}")
    print(figures_line(reply, block))
    return 0


def _stream_reply(target, drafter, messages: list[dict], settings: ReplySettings) -> Reply:
    """Run the reply, printing reasoning, answer, tool calls and results as they arrive."""
    from app.chat.pipeline import ContentDelta, ReasoningDelta, ToolCallDelta
    from app.chat.reply import ReplyDone, ToolResultEvent, run_reply

    section = None
    reply = None

    def enter(name: str | None) -> None:
        nonlocal section
        if name == section:
            return
        if section is not None:
            print(flush=True)
        if name is not None:
            print(f"[{name}]")
        section = name

    for ev in run_reply(target, drafter, messages, settings):
        if isinstance(ev, ReasoningDelta):
            enter("reasoning")
            print(ev.text, end="", flush=True)
        elif isinstance(ev, ContentDelta):
            enter("answer")
            print(ev.text, end="", flush=True)
        elif isinstance(ev, ToolCallDelta):
            enter(None)
            args = json.dumps(ev.call.arguments, ensure_ascii=False)
            print(f"[tool call] {ev.call.name} {args}", flush=True)
        elif isinstance(ev, ToolResultEvent):
            enter(None)
            print(f"[tool result] {ev.run.result.content()}", flush=True)
        elif isinstance(ev, ReplyDone):
            reply = ev.reply
    enter(None)
    if reply.reasoning and not reply.content and not reply.tool_calls:
        print("[answer] (none: the reply ended while reasoning)")
    return reply


def _compare(args) -> int:
    tools = load_tools(args.tools)
    target, drafter, tpath, dpath = _load(args, need_drafter=True)
    think = args.think if args.think is not None else default_thinking(tpath, dpath)
    drafter2 = None
    if getattr(args, "dflash2_model", None):
        from app.engine.loader import check_pair, load_drafter

        drafter2 = load_drafter(args.dflash2_model)
        if getattr(drafter2.config, "kind", "dflash") != "dflash2":
            raise CommandError(f"--dflash2-model {args.dflash2_model} is not a DFlash2 drafter")
        check_pair(target, drafter2)
    only_v2 = getattr(drafter.config, "kind", "dflash") == "dflash2"
    results = {}
    runs = [("plain", drafter), ("dflash2" if only_v2 else "dflash", drafter)]
    if drafter2 is not None and not only_v2:
        runs.append(("dflash2", drafter2))
    for mode, d in runs:
        settings = settings_from_args(args, mode, tools, think)
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
    sp, sd = plain.summary.tok_per_s, dflash.summary.tok_per_s
    if sp > 0 and sd > 0:
        print(f"speed: DFlash {sd:.1f} tok/s vs plain {sp:.1f} tok/s ({sd / sp:.2f}x)")
    return 0
