"""New chats in one loaded session: how much of the preamble they reuse, and their first token.

For each mode (plain, DFlash, DFlash2 on the bundled demo pair) and each of a few first
messages, a new chat is sent in a ``ChatSession`` that already answered other chats (warm), and
the same message in a fresh session whose prefix cache is empty (cold: the whole preamble is
prefilled), and in a fresh session that only prefilled a new chat's preamble, as the window's
worker does after a load (``ChatSession.prefill_new_chat``: the first reply of a fresh
start). Printed per reply: prompt tokens, reused tokens, time to first token, whether the
tokens equal the cold reply's. The summary gives, per mode, the median share of the preamble
reused and the median warm TTFT as a share of the cold one (the issue's gate: >= 90% reused,
<= 25% of the cold TTFT, identical tokens).

    python tools/bench_new_chat.py [--modes plain dflash dflash2] [--max-tokens 48] [--json F]

Run it through ``make`` or with OpenBLAS preloaded on Linux (``python -m app`` does that; a
script imports the engine directly). Greedy, the window's default settings otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MESSAGES = {
    "plain": ["What is the capital of Peru?", "What is 17 times 23?",
              "Convert 10 miles to kilometres.", "Which continent is Kenya in?",
              "What currency does Japan use?"],
    "dflash": ["What is the capital of Chile?", "What is 19 times 21?",
               "Convert 5 miles to kilometres.", "Which continent is Peru in?",
               "What currency does Mexico use?"],
    "dflash2": ["What is the capital of Kenya?", "What is 13 times 27?",
                "Convert 20 miles to kilometres.", "Which continent is Chile in?",
                "What currency does India use?"],
}
"""First messages per mode, each sent once (a message sent before would find its whole earlier
chat in the cache, not only the preamble)."""


def demo_sessions(n: int) -> list | None:
    """``n`` ``ChatSession``s (each on its own in-memory store) with the bundled demo pair
    loaded, on this thread; prints the BLAS in use. None (with a message) without the pair."""
    from app.chat.session import ChatSession, PairSpec
    from app.chat.storage import Store
    from app.engine.blas import blas_description
    from app.engine.threads import allow_engine_on_current_thread
    from app.paths import bundled_pair

    allow_engine_on_current_thread()
    pair = bundled_pair()
    if pair is None:
        print("the bundled demo pair is missing", file=sys.stderr)
        return None
    target, drafter, drafter2 = pair
    spec = PairSpec(target=str(target), drafter=str(drafter),
                    drafter2=str(drafter2) if drafter2 else None)
    print(f"BLAS: {blas_description(load_mlx=True)}")
    sessions = [ChatSession(Store(":memory:")) for _ in range(n)]
    for s in sessions:
        s.load(spec)
    return sessions


def _reply_figures(session, store, text, settings):
    """Send ``text`` in a new chat; returns (tokens, first-round Summary, send-to-end s)."""
    from app.chat.events import ReplyDone

    conv = store.new_conversation(system_prompt=settings["system_prompt"])
    t0 = time.perf_counter()
    reply = None
    for ev in session.send(conv.id, text, settings):
        if isinstance(ev, ReplyDone):
            reply = ev.reply
    total = time.perf_counter() - t0
    return reply.all_tokens, reply.rounds[0].summary, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", nargs="+", default=["plain", "dflash", "dflash2"])
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--json", default=None, help="write every measurement to this file")
    args = p.parse_args(argv)

    from app.chat.settings import defaults

    sessions = demo_sessions(3)
    if sessions is None:
        return 2
    warm, cold, loaded = sessions
    from app.chat.reply import preamble_boundary
    from app.chat.settings import reply_settings
    from app.chat.templates import render_prompt

    rows = []
    for mode in args.modes:
        settings = defaults() | {"mode": mode, "max_tokens": args.max_tokens}
        rs = reply_settings(settings)
        for session in sessions:  # warm the code paths (and leave a chat in the cache)
            _reply_figures(session, session.store, "Hello!", settings)
        for text in MESSAGES.get(mode, MESSAGES["plain"]):
            convo = [{"role": "system", "content": settings["system_prompt"]},
                     {"role": "user", "content": text}]
            ids = render_prompt(warm.target.tokenizer, convo, tools=rs.tools,
                                enable_thinking=rs.enable_thinking).ids
            preamble = (preamble_boundary(warm.target, convo, rs, ids) or [0])[0]
            cold.cache.clear_all()  # cold: nothing cached, the whole prompt is prefilled
            c_tokens, c_sum, _ = _reply_figures(cold, cold.store, text, settings)
            w_tokens, w_sum, _ = _reply_figures(warm, warm.store, text, settings)
            loaded.cache.clear_all()  # a fresh start: the preamble prefilled after the load
            loaded.prefill_new_chat(settings, settings["system_prompt"])
            l_tokens, l_sum, _ = _reply_figures(loaded, loaded.store, text, settings)
            row = {"mode": mode, "message": text, "prompt_tokens": w_sum.prompt_tokens,
                   "preamble_tokens": preamble,
                   "reused": w_sum.reused_tokens, "cold_reused": c_sum.reused_tokens,
                   "ttft_s": w_sum.ttft_s, "cold_ttft_s": c_sum.ttft_s,
                   "loaded_reused": l_sum.reused_tokens, "loaded_ttft_s": l_sum.ttft_s,
                   "identical": w_tokens == c_tokens == l_tokens}
            rows.append(row)
            print(f"{mode:8s} {text[:34]:34s} prompt {row['prompt_tokens']:4d}  preamble "
                  f"{preamble:4d}  reused {row['reused']:4d} (cold {row['cold_reused']})  "
                  f"TTFT {row['ttft_s'] * 1000:6.1f} ms (cold {row['cold_ttft_s'] * 1000:6.1f},"
                  f" after load {row['loaded_ttft_s'] * 1000:6.1f})"
                  f"  identical {'yes' if row['identical'] else 'NO'}")
    print()
    for mode in args.modes:
        mine = [r for r in rows if r["mode"] == mode]
        share = statistics.median(min(r["reused"], r["preamble_tokens"])
                                  / max(1, r["preamble_tokens"]) for r in mine)
        ttft = statistics.median(r["ttft_s"] / r["cold_ttft_s"] for r in mine if r["cold_ttft_s"])
        first = statistics.median(r["loaded_ttft_s"] / r["cold_ttft_s"] for r in mine
                                  if r["cold_ttft_s"])
        same = all(r["identical"] for r in mine)
        print(f"{mode:8s} median reused {share:.1%} of the preamble; median TTFT {ttft:.1%} of "
              f"cold (first chat after a load: {first:.1%}); identical: "
              f"{'all' if same else 'NOT all'} ({len(mine)} new chats)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
