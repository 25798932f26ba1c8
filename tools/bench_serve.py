"""The server's cost: tok/s through ``python -m app serve`` against the same generation in
process, plain and DFlash, and the stream's time to first byte.

The server runs as a child process (``python -m app serve --port 0`` on the bundled demo pair,
or ``--model``/``--draft-model``), so the client's HTTP and JSON work does not share its
interpreter. Each prompt is sent, streamed, once per mode and repeat, and right after it the
same messages and settings go through a ``ChatSession`` in this process (warmed up the same
way); the two sides take turns going first. Greedy: the two sides' texts must match, and
the report says whether they do.

Per side it reports medians over the runs:

* ``wall_s``: send to the last byte (the stream's ``[DONE]``; in process: ``ReplyDone``);
* ``ttfb_s`` (server only): send to the first byte of the stream (the role chunk, sent once
  the worker took the request and checked its prompt);
* ``ttft_s``: send to the first text (the first content / reasoning delta);
* ``stream_tok_per_s``: completion tokens over first text to end, as the client sees them;
* ``engine_tok_per_s``: the engine's own ``Summary.tok_per_s`` (from ``dflash.tok_per_s``
  through the server), generation only;

and the paired medians of server / in-process per run (each run's two sides ran back to
back), the figure to read on a noisy machine.

    python tools/bench_serve.py [--modes plain dflash] [--repeats 3] [--max-tokens 128]
                                [--model M --draft-model D] [--json FILE]

Run it with OpenBLAS preloaded on Linux (``make``'s environment, or ``LD_PRELOAD``), as the
other tools: this process runs the in-process side itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Which are three capital cities of Oceania?",
    "Briefly, how does a language model work?",
    "Tell me about Peru.",
    "What is the capital of Kenya?",
    "Which continent is Chile in?",
    "Name five capitals in Europe.",
]
"""Questions the demo pair answers in text (no tool call), 30-120 tokens each."""


def start_server(args) -> tuple[subprocess.Popen, str]:
    """The server child process and its base URL (read from its first line)."""
    cmd = [sys.executable, "-m", "app", "serve", "--port", "0"]
    if args.model:
        cmd += ["--model", args.model]
    if args.draft_model:
        cmd += ["--draft-model", args.draft_model]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    line = proc.stdout.readline()
    if not line.startswith("Serving "):
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].split("/v1", 1)[0]


def through_server(client, url: str, messages: list[dict], mode: str, max_tokens: int) -> dict:
    """One streamed request: its timings, text and figures."""
    body = {"messages": messages, "mode": mode, "max_tokens": max_tokens, "stream": True}
    t0 = time.perf_counter()
    first_byte = first_text = None
    text, last = [], None
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            if first_byte is None:
                first_byte = now
            payload = line[6:]
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if chunk["choices"]:
                delta = chunk["choices"][0]["delta"]
                piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                if piece and first_text is None:
                    first_text = now
                text.append(piece)
            if "dflash" in chunk:
                last = chunk
    end = time.perf_counter()
    tokens = last["usage"]["completion_tokens"]
    return {"wall_s": end - t0, "ttfb_s": first_byte - t0, "ttft_s": first_text - t0,
            "stream_tok_per_s": tokens / (end - first_text) if end > first_text else 0.0,
            "engine_tok_per_s": last["dflash"]["tok_per_s"], "tokens": tokens,
            "text": "".join(text), "reused": last["dflash"]["reused_tokens"]}


def in_process(session, messages: list[dict], mode: str, max_tokens: int) -> dict:
    """The same reply through ``ChatSession.reply`` in this process."""
    from app.chat.events import ContentDelta, ReasoningDelta, ReplyDone

    t0 = time.perf_counter()
    first_text, text, reply = None, [], None
    for ev in session.reply(messages, {"mode": mode, "max_tokens": max_tokens}):
        if isinstance(ev, ContentDelta | ReasoningDelta) and ev.text:
            if first_text is None:
                first_text = time.perf_counter()
            text.append(ev.text)
        elif isinstance(ev, ReplyDone):
            reply = ev.reply
    end = time.perf_counter()
    tokens = len(reply.tokens)
    return {"wall_s": end - t0, "ttft_s": first_text - t0,
            "stream_tok_per_s": tokens / (end - first_text) if end > first_text else 0.0,
            "engine_tok_per_s": reply.summary.tok_per_s, "tokens": tokens,
            "text": "".join(text), "reused": reply.summary.reused_tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["plain", "dflash"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model")
    parser.add_argument("--draft-model")
    parser.add_argument("--json", help="write every run and the medians to this file")
    args = parser.parse_args(argv)

    import httpx

    from app.chat.session import ChatSession, PairSpec
    from app.commands.generation import resolve_pair

    args.mode = None
    target, drafter = resolve_pair(args, need_drafter=False)
    session = ChatSession(None)
    session.load(PairSpec(target, drafter))
    session.warm_up()
    proc, url = start_server(args)
    runs: list[dict] = []
    try:
        with httpx.Client(timeout=300) as client:
            for repeat in range(args.repeats):
                for prompt in PROMPTS:
                    messages = [{"role": "user", "content": prompt}]
                    for mode in args.modes:
                        order = len(runs) % 2  # the sides alternate who goes first
                        if order:
                            p = in_process(session, messages, mode, args.max_tokens)
                        s = through_server(client, url, messages, mode, args.max_tokens)
                        if not order:
                            p = in_process(session, messages, mode, args.max_tokens)
                        runs.append({"repeat": repeat, "prompt": prompt, "mode": mode,
                                     "server": s, "in_process": p,
                                     "identical": s["text"] == p["text"]})
    finally:
        proc.terminate()
        proc.wait(30)

    keys = ["wall_s", "ttfb_s", "ttft_s", "stream_tok_per_s", "engine_tok_per_s"]
    medians = {}
    print(f"{len(PROMPTS)} prompts x {args.repeats} repeats, max {args.max_tokens} tokens, "
          "medians per mode (server | in process):")
    print(f"{'mode':<8} {'wall s':>15} {'TTFB s':>8} {'TTFT s':>15} {'stream tok/s':>17} "
          f"{'engine tok/s':>17} {'server/in-proc':>15} identical")
    for mode in args.modes:
        mine = [r for r in runs if r["mode"] == mode]
        med = {side: {k: statistics.median(r[side][k] for r in mine)
                      for k in keys if k in mine[0][side]}
               for side in ("server", "in_process")}
        paired = {k: statistics.median(r["server"][k] / r["in_process"][k] for r in mine)
                  for k in ("wall_s", "ttft_s", "stream_tok_per_s", "engine_tok_per_s")}
        ratio = paired["stream_tok_per_s"]
        same = sum(r["identical"] for r in mine)
        medians[mode] = {**med, "paired_ratios": paired, "identical": same,
                         "runs": len(mine)}
        s, p = med["server"], med["in_process"]
        print(f"{mode:<8} {s['wall_s']:>6.3f} | {p['wall_s']:<6.3f} {s['ttfb_s']:>8.3f} "
              f"{s['ttft_s']:>6.3f} | {p['ttft_s']:<6.3f} {s['stream_tok_per_s']:>7.1f} | "
              f"{p['stream_tok_per_s']:<7.1f} {s['engine_tok_per_s']:>7.1f} | "
              f"{p['engine_tok_per_s']:<7.1f} {ratio:>15.3f} {same}/{len(mine)}")
    print("paired medians of server / in process, per run:")
    for mode, m in medians.items():
        print(f"  {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in m["paired_ratios"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
