"""``python -m app chat``: one reply, plain, DFlash, DFlash2 or Lookup (the JSON contract is in the
README).

``python -m app chat [--model M --draft-model D] --mode {plain,dflash,dflash2,lookup} --prompt TEXT``
prints the reply (or, with ``--json``, one object: ``mode, block_size, rollback, tokens, text,
summary, content, reasoning, tool_calls, finish_reason`` and ``rounds`` with ``--run-tools``).
It goes through :func:`app.chat.reply.run_reply`, the same code the window uses. Exit codes:
0 ok, 2 bad arguments or unusable model files, 130 interrupted (Ctrl+C; the first one during
the reply stops it and prints it as far as it got, ``finish_reason`` ``cancelled``).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from app.chat.events import Reply
from app.chat.reply import ReplySettings, collect_reply
from app.commands.generation import (
    _add_common,
    _guard,
    _load,
    _messages,
    auto_block_note,
    check_prompt_fits,
    default_thinking,
    load_tools,
    prepare_tools,
    settings_from_args,
    warm_up_on_gpu,
)
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES, MODES, Mode, drafter_mode


def register(subparsers) -> None:
    """Add the ``chat`` subcommand."""
    chat = subparsers.add_parser(
        "chat", help="one reply, plain, DFlash, DFlash2 or Lookup",
        description="Generate one reply to --prompt (plain, DFlash, DFlash2 or Lookup "
        "decoding) and print it with its figures.",
    )
    _add_common(chat)
    chat.add_argument("--mode", choices=[m.value for m in MODES], default="dflash",
                      help="decoding mode (default dflash; dflash2 needs a DFlash2 drafter: "
                      "on the bundled demo pair its bundled one, else --draft-model; lookup "
                      "drafts by prompt lookup and needs no drafter)")
    chat.set_defaults(func=run_chat)


# ------------------------------------------------------------------------------ output
def chat_object(reply: Reply, settings: ReplySettings, drafter, with_rounds: bool,
                wall_s: float | None = None) -> dict:
    """The ``chat --json`` object for ``reply``; ``time_to_answer_s`` and ``tool_s`` are
    :class:`app.chat.measure.ReplyFigures`' (``wall_s``: the send-to-last-token seconds the
    caller measured; without it, the rounds' seconds plus the tools')."""
    from app.chat.measure import ReplyFigures

    fig = ReplyFigures.of(reply, wall_s)
    block = None
    if reply.mode in DRAFTING_MODES:
        block = settings.block_size or (drafter.config.block_size if drafter and
                                        reply.mode in DRAFTER_MODES else DEFAULT_BLOCK)
    out: dict[str, Any] = {
        "mode": reply.mode,
        "block_size": block,
        "auto_block": bool(settings.auto_block and reply.mode in DRAFTER_MODES),
        "rollback": settings.rollback,
        "tokens": reply.tokens,
        "text": reply.text,
        "summary": reply.summary.to_dict(),
        "reply_summary": reply.reply_summary.to_dict(),
        "content": reply.content,
        "reasoning": reply.reasoning,
        "tool_calls": [c.to_dict() for c in reply.tool_calls],
        "finish_reason": reply.finish_reason,
        "from_draft": reply.from_draft,
        "warnings": reply.warnings,
        "time_to_answer_s": fig.time_to_answer_s,
        "tool_s": fig.tool_s,
    }
    if with_rounds:
        out["rounds"] = [r.to_dict() for r in reply.rounds]
    return out


def figures_line(reply: Reply, block: int | None = None, wall_s: float | None = None) -> str:
    """One line of figures of the whole reply, tool rounds included (as the window's panel
    gives them): mode (and block; under the automatic block size its range and the mean
    block used), tokens, rounds, time to answer (tools' share), decode tok/s, TTFT,
    acceptance, tau, replays, for a sharded target the seconds waited on the network and the
    bytes sent, finish (with :func:`finish_note`; ``wall_s`` as :func:`chat_object`'s)."""
    from app.chat.measure import ReplyFigures

    s = reply.reply_summary
    fig = ReplyFigures.of(reply, wall_s)
    label = f" (block {block})" if block else ""
    if s.auto_block and s.block_lengths:  # the automatic block size: its range and mean
        mean = sum(s.block_lengths) / len(s.block_lengths)
        label = f" (block auto 1..{block}, mean {mean:.1f})"
    parts = [reply.mode + label]
    rounds = f" in {len(reply.rounds)} rounds" if len(reply.rounds) > 1 else ""
    parts.append(f"{len(reply.all_tokens)} tokens{rounds}")
    tools = f" (tools {fig.tool_s:.2f} s)" if fig.tool_s > 0 else ""
    parts.append(f"answer in {fig.time_to_answer_s:.2f} s{tools}")
    parts.append(f"{s.tok_per_s:.1f} tok/s")
    parts.append(f"TTFT {s.ttft_s:.2f} s")
    if reply.mode in DRAFTING_MODES:
        acc = "n/a" if s.acceptance_rate is None else f"{100 * s.acceptance_rate:.0f}%"
        tau = "n/a" if s.tau is None else f"{s.tau:.2f}"
        parts += [f"acceptance {acc}", f"tau {tau}", f"replays {s.replays}"]
    if s.network_bytes:  # a target sharded over a group (docs/distributed.md)
        parts.append(f"network {s.network_wait_s:.2f} s waited, {s.network_bytes / 1e6:.2f} MB")
    parts.append(f"finish {reply.finish_reason}{finish_note(reply)}")
    return " · ".join(parts)


def finish_note(reply: Reply) -> str:
    """What the figures line adds after ``finish <reason>``: ``" (stop string)"`` when one of
    the stop strings ended the reply (its finish reason is ``stop`` and its last round's
    ``stop_cause`` ``stop_string``, as ``--json`` gives them), else ""."""
    if reply.finish_reason == "stop" and reply.summary.stop_cause == "stop_string":
        return " (stop string)"
    return ""


def _print_reply(reply: Reply, block: int | None, wall_s: float | None = None) -> None:
    for r in reply.rounds[:-1]:  # what each earlier round wrote, as chat streams it
        if r.reasoning:
            print("[reasoning]")
            print(r.reasoning)
        if r.content:
            print(r.content)
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
    print(figures_line(reply, block, wall_s))


TOOL_HINT = ("note: the model asked for a tool and the reply stopped there; add --run-tools to "
             "run the built-in tools and get its answer (the window runs them by default)")
"""Printed after a text-mode reply that ended with ``finish_reason`` ``tool_calls``."""


def tool_hint(reply: Reply, run_tools: bool) -> str | None:
    """:data:`TOOL_HINT` when ``reply`` stopped at a tool call that was not run
    (``run_tools`` False), else None."""
    return TOOL_HINT if reply.finish_reason == "tool_calls" and not run_tools else None


INTERRUPTED = 130
"""The exit code of a reply stopped by Ctrl+C (128 + SIGINT, as the shell gives it)."""


@contextmanager
def cancel_on_interrupt():
    """Within the block, the first Ctrl+C (SIGINT) sets the yielded event instead of raising
    :class:`KeyboardInterrupt`: :func:`app.chat.reply.run_reply` then cancels the engine before
    its next cycle and ends the reply ``cancelled``, so that it is printed as far as it got. A
    second Ctrl+C interrupts at once. Outside the main thread (where Python cannot set a
    signal handler) the event is never set. The previous handler is put back on leaving."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return

    def handler(signum, frame):
        if event.is_set():
            raise KeyboardInterrupt
        event.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


def run_chat(args) -> int:
    """``chat``: one reply; returns the exit code."""
    return _guard(_chat, args)


def _chat(args) -> int:
    tools = load_tools(args.tools)
    prepare_tools(args.run_tools, tools)
    settings = settings_from_args(args, args.mode, tools, args.think)
    if note := auto_block_note(args.block_size, args.mode):
        print(note, file=sys.stderr)
    target, drafter, tpath, dpath = _load(args, need_drafter=args.mode in DRAFTER_MODES)
    if settings.mode == Mode.DFLASH and drafter is not None \
            and drafter_mode(drafter) is Mode.DFLASH2:  # the drafter decides: say so
        settings = replace(settings, mode=Mode.DFLASH2)
        print(f"note: {dpath} is a DFlash2 drafter: the reply runs DFlash2", file=sys.stderr)
    if settings.enable_thinking is None:
        settings = replace(settings, enable_thinking=default_thinking(tpath, dpath))
    check_prompt_fits(target, _messages(args), settings)
    warm_up_on_gpu(target, [drafter])
    t0 = time.perf_counter()
    if args.json:
        with cancel_on_interrupt() as interrupted:
            reply = collect_reply(target, drafter, _messages(args), settings, interrupted)
        wall = time.perf_counter() - t0
        print(json.dumps(chat_object(reply, settings, drafter, args.run_tools, wall),
                         ensure_ascii=False))
        return INTERRUPTED if reply.finish_reason == "cancelled" else 0
    with cancel_on_interrupt() as interrupted:
        reply = _stream_reply(target, drafter, _messages(args), settings, interrupted)
    wall = time.perf_counter() - t0
    block = chat_object(reply, settings, drafter, False)["block_size"]
    for w in reply.warnings:
        print(f"[warning] {w['message']}")
    print(figures_line(reply, block, wall))
    if hint := tool_hint(reply, args.run_tools):
        print(hint)
    return INTERRUPTED if reply.finish_reason == "cancelled" else 0


def _stream_reply(target, drafter, messages: list[dict], settings: ReplySettings,
                  cancel_event: threading.Event | None = None) -> Reply:
    """Run the reply, printing reasoning, answer, tool calls and results as they arrive
    (``cancel_event``: :func:`run_reply`'s, set to stop the reply where it is)."""
    from app.chat.events import (
        ContentDelta,
        ReasoningDelta,
        ReplyDone,
        ToolCallDelta,
        ToolResultEvent,
    )
    from app.chat.reply import run_reply

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

    for ev in run_reply(target, drafter, messages, settings, cancel_event):
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


