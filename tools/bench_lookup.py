"""Lookup (prompt-lookup drafts) against plain and DFlash on replies that copy text.

Three ``ChatSession``s hold the bundled demo pair, answering in plain, lookup and DFlash
decoding, each warmed up and past one chat before anything is timed (as
``tools/bench_time_to_answer.py`` does). Each chat of :data:`CHATS` is sent to all three, turn
by turn in the same chat; the side that goes first rotates from reply to reply. Each side is
timed from send to its last event (``ChatSession.send``: prefill, every round and the tools,
their clock frozen). The chats are replies that copy text from their context:

* ``tool``: a country question answered through the ``country_info`` tool, whose result the
  reply restates, and follow-ups for other countries (whose replies also repeat the wording
  of the earlier answers);
* ``list``: a request to repeat a list given in the message.

Printed per reply: each side's time to answer and decode tok/s, lookup's and DFlash's tau and
acceptance, whether the three token sequences are identical. Then per kind of chat the
median of the paired time-to-answer and decode ratios over plain (``app.chat.measure``). The
issue's gate: lookup >= 1.5x plain on the replies that copy a tool result.

    python tools/bench_lookup.py [--max-tokens N] [--kinds tool list] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHATS = {
    "tool": [
        ("Describe Liberia briefly.", "Describe Brazil briefly.", "And Japan?"),
        ("Tell me about Kenya.", "And about Peru?", "What about Norway?"),
        ("Describe Canada briefly.", "Describe India briefly.", "And Egypt?"),
    ],
    "list": [
        ("Repeat this list exactly: Paris, Berlin, Madrid, Rome, Lisbon, Vienna, Prague, "
         "Warsaw, Dublin, Athens.",),
        ("Copy these numbers back to me: 12, 47, 93, 105, 230, 318, 402, 511, 687, 799.",),
    ],
}
"""Chats by kind, each a tuple of messages sent in one conversation."""

MODES = ("plain", "lookup", "dflash")
from bench_time_to_answer import FROZEN_NOW, _send  # noqa: E402 (the clock, one timed turn)


def _fmt(v, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-tokens", type=int, default=None,
                   help="Max tokens (default: the window's default)")
    p.add_argument("--kinds", nargs="+", choices=list(CHATS), default=list(CHATS))
    p.add_argument("--json", default=None, help="write every measurement to this file")
    args = p.parse_args(argv)

    from bench_new_chat import demo_sessions

    from app.chat.measure import ReplyFigures, speedup
    from app.chat.settings import defaults
    from app.chat.tools import builtin_tools

    loaded = demo_sessions(len(MODES))
    if loaded is None:
        return 2
    sessions = dict(zip(MODES, loaded))
    settings = {}
    for m, s in sessions.items():
        s.warm_up(force=True)
        settings[m] = defaults() | {"mode": m, "runnable_tools": builtin_tools(FROZEN_NOW)}
        if args.max_tokens:
            settings[m]["max_tokens"] = args.max_tokens
        warm = s.store.new_conversation(system_prompt=settings[m]["system_prompt"])
        _send(s, warm.id, "Hello!", settings[m])  # past one chat, as a user is
    rows = []
    figures: dict[str, dict[str, list]] = {k: {m: [] for m in MODES} for k in args.kinds}
    k = 0
    for kind in args.kinds:
        for chat in CHATS[kind]:
            convs = {m: sessions[m].store.new_conversation(
                system_prompt=settings[m]["system_prompt"]).id for m in MODES}
            for text in chat:
                order = MODES[k % 3:] + MODES[: k % 3]
                k += 1
                got = {}
                for m in order:
                    reply, wall = _send(sessions[m], convs[m], text, settings[m])
                    got[m] = (reply, ReplyFigures.of(reply, wall))
                    figures[kind][m].append(got[m][1])
                toks = {m: got[m][0].all_tokens for m in MODES}
                pf, lf, df = (got[m][1] for m in MODES)
                row = {"kind": kind, "message": text, "first": order[0],
                       "rounds": len(got["plain"][0].rounds),
                       "identical": toks["plain"] == toks["lookup"] == toks["dflash"],
                       **{m: got[m][1].to_dict() for m in MODES}}
                rows.append(row)
                print(f"{kind:4s} {text[:34]:34s} rounds {row['rounds']}  answer plain "
                      f"{pf.time_to_answer_s:5.2f} s  lookup {lf.time_to_answer_s:5.2f} s "
                      f"({pf.time_to_answer_s / lf.time_to_answer_s:.2f}x, tau "
                      f"{_fmt(lf.tau)}, acc {_fmt(lf.acceptance_rate, '.0%')})  dflash "
                      f"{df.time_to_answer_s:5.2f} s ({pf.time_to_answer_s / df.time_to_answer_s:.2f}x"
                      f", tau {_fmt(df.tau)})  decode {pf.decode_tok_per_s:5.1f}/"
                      f"{lf.decode_tok_per_s:5.1f}/{df.decode_tok_per_s:5.1f} tok/s  "
                      f"{got['plain'][1].generated_tokens} tok  identical "
                      f"{'yes' if row['identical'] else 'NO'}", flush=True)
    print()
    summary = {}
    for kind in args.kinds:
        f = figures[kind]
        for m in ("lookup", "dflash"):
            sp = speedup(f["plain"], f[m])
            summary[f"{kind}/{m}"] = sp.to_dict()
            print(f"{kind:4s} {m:6s} vs plain ({len(f[m])} replies): time to answer median "
                  f"paired {sp.median_paired_time_to_answer:.2f}x, pooled "
                  f"{sp.time_to_answer:.2f}x; decode tok/s median paired "
                  f"{sp.median_paired_decode:.2f}x, pooled {sp.decode:.2f}x")
    same = sum(r["identical"] for r in rows)
    print(f"identical tokens (plain = lookup = dflash): {same} of {len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"speedup": summary, "replies": rows}, indent=1))
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
