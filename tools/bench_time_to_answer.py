"""Time to answer, DFlash against plain, as a user of the window meets it.

Two ``ChatSession``s hold the bundled demo pair, one answering in plain decoding and one in
DFlash, both loaded, warmed up and past one chat before anything is timed. Each of
:data:`CHATS` is sent as a new chat to both, then its follow-up in the same chat: replies with
tool rounds (the built-in tools, their clock frozen at one instant so that both sides see the
same results) and without. For every reply the two sides run back to back, the side that goes
first alternating, and each is timed from send to its last event (``ChatSession.send``, the
call the window's worker makes: prefill, every round and the tools included).

After every reply each side prefills what the chat's next turn starts with, untimed
(``ChatSession.prefill_next_turn``), as the window's worker does while the user reads and
writes; ``--no-prefill`` leaves that out, so that a follow-up prefills the last exchange again
(the template drops the reasoning of replies before the last user message).

Printed per reply: each side's time to answer and decode tok/s, their ratios, whether the
tokens are identical. The summary gives the medians of the paired ratios and the pooled
ratios (``app.chat.measure.speedup``); the issue's gate is a median paired time-to-answer
ratio >= 2.0x and decode >= 2.5x with identical tokens.

    python tools/bench_time_to_answer.py [--mode dflash|dflash2] [--max-tokens N] [--json F]

Greedy, the window's default settings otherwise (system prompt, tools on, Max tokens).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHATS = [
    ("What time is it in Tokyo right now?", "And in Lisbon?"),
    ("What is 17 times 23?", "Now divide that by 7."),
    ("Convert 12 miles to kilometres.", "And 30 miles?"),
    ("What currency is used in Brazil?", "What about Chile?"),
    ("What is the capital of Canada?", "How many people live there?"),
    ("Name three rivers in Africa.", "Which is the longest?"),
    ("How many grams are in 3 pounds?", "And in 10 pounds?"),
    ("What is 144 divided by 12?", "Multiply the result by 9."),
    ("Which continent is Peru in?", "Name two of its neighbours."),
    ("Give me a short tip for learning a language.", "One more, please."),
    ("What is the date today in New York?", "And in Sydney?"),
    ("Explain in one sentence what a prime number is.", "Is 91 one?"),
]
"""First messages and their follow-ups (not the demo pair's held-out prompts)."""

FROZEN_NOW = dt.datetime(2026, 12, 5, 15, 0, 0, tzinfo=dt.UTC)
"""The instant the built-in clock tools report, on both sides."""


def _send(session, conv_id: int, text: str, settings: dict):
    """One timed turn: (Reply, send-to-last-event seconds)."""
    from app.chat.events import ReplyDone

    t0 = time.perf_counter()
    reply = None
    for ev in session.send(conv_id, text, settings):
        if isinstance(ev, ReplyDone):
            reply = ev.reply
    return reply, time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["dflash", "dflash2"], default="dflash")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="Max tokens (default: the window's default)")
    p.add_argument("--chats", type=int, default=len(CHATS), help="how many of the chats")
    p.add_argument("--json", default=None, help="write every measurement to this file")
    p.add_argument("--no-prefill", action="store_true",
                   help="no prefill of the next turn between replies (the window does one)")
    args = p.parse_args(argv)

    from bench_new_chat import demo_sessions

    from app.chat.measure import ReplyFigures, speedup
    from app.chat.settings import defaults
    from app.chat.tools import builtin_tools

    modes = ("plain", args.mode)
    loaded = demo_sessions(len(modes))
    if loaded is None:
        return 2
    sessions = dict(zip(modes, loaded))
    settings = {}
    for m, s in sessions.items():
        s.warm_up(force=True)
        settings[m] = defaults() | {"mode": m, "runnable_tools": builtin_tools(FROZEN_NOW)}
        if args.max_tokens:
            settings[m]["max_tokens"] = args.max_tokens
        warm_chat = s.store.new_conversation(system_prompt=settings[m]["system_prompt"])
        _send(s, warm_chat.id, "Hello!", settings[m])  # past one chat, as a user is
    figures = {m: [] for m in modes}
    rows = []
    k = 0
    for first, follow in CHATS[: args.chats]:
        convs = {m: sessions[m].store.new_conversation(
            system_prompt=settings[m]["system_prompt"]).id for m in modes}
        for turn, text in (("new chat", first), ("follow-up", follow)):
            order = modes if k % 2 == 0 else modes[::-1]
            k += 1
            got = {}
            for m in order:
                reply, wall = _send(sessions[m], convs[m], text, settings[m])
                got[m] = (reply, ReplyFigures.of(reply, wall))
                figures[m].append(got[m][1])
                if not args.no_prefill:
                    sessions[m].prefill_next_turn(convs[m], settings[m],
                                                  settings[m]["system_prompt"])
            (pr, pf), (dr, df) = got["plain"], got[args.mode]
            row = {"turn": turn, "message": text, "rounds": len(pr.rounds),
                   "first": order[0], "plain": pf.to_dict(), args.mode: df.to_dict(),
                   "answer_ratio": pf.time_to_answer_s / df.time_to_answer_s,
                   "decode_ratio": (df.decode_tok_per_s / pf.decode_tok_per_s
                                    if pf.decode_tok_per_s else None),
                   "identical": pr.all_tokens == dr.all_tokens,
                   "prefilled": [r.rounds[0].summary.prompt_tokens
                                 - r.rounds[0].summary.reused_tokens for r in (pr, dr)]}
            rows.append(row)
            dec = "n/a" if row["decode_ratio"] is None else f"{row['decode_ratio']:.2f}x"
            print(f"{turn:9s} {text[:38]:38s} rounds {row['rounds']}  answer "
                  f"{pf.time_to_answer_s:6.2f} s vs {df.time_to_answer_s:6.2f} s "
                  f"({row['answer_ratio']:.2f}x)  decode {pf.decode_tok_per_s:6.1f} vs "
                  f"{df.decode_tok_per_s:6.1f} tok/s ({dec})  tools "
                  f"{pf.tool_s * 1000:.0f}/{df.tool_s * 1000:.0f} ms  prefill "
                  f"{row['prefilled'][0]}/{row['prefilled'][1]}  identical "
                  f"{'yes' if row['identical'] else 'NO'}")
    sp = speedup(figures["plain"], figures[args.mode])
    with_tools = [r for r in rows if r["rounds"] > 1]
    print()
    print(f"{len(rows)} replies ({len(with_tools)} with tool rounds), {args.mode} vs plain, "
          "warmed sessions, sides alternated, frozen clock, "
          + ("no prefill between turns" if args.no_prefill else
             "the next turn prefilled between replies"))
    print(f"time to answer: median of paired ratios {sp.median_paired_time_to_answer:.2f}x, "
          f"pooled {sp.time_to_answer:.2f}x")
    print(f"decode tok/s:   median of paired ratios {sp.median_paired_decode:.2f}x, "
          f"pooled {sp.decode:.2f}x")
    if with_tools:
        print("tool replies: median time-to-answer ratio "
              f"{statistics.median(r['answer_ratio'] for r in with_tools):.2f}x")
    same = sum(r["identical"] for r in rows)
    print(f"identical tokens: {same} of {len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"speedup": sp.to_dict(), "replies": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
