"""Measure the shipped demo pair on its held-out prompts, through the app's own code path.

For each held-out prompt (``resources/models/demo-target/heldout_prompts.json``): render it with
the app's template code (:func:`app.chat.templates.render_prompt`, the built-in tool
definitions when the prompt has tools), decode greedily with the app's engine, feed the tokens
through the app's :class:`app.chat.pipeline.TextPipeline`, and check the answer against the
prompt's ``expect``:

* ``contains``: every string occurs in the final content;
* ``tool_call``: the first parsed tool call has the expected name and arguments, and its
  arguments pass the tool's schema (:func:`app.chat.tools.check_arguments`);
* ``list_items`` + ``count``: the content lists at least ``count`` numbered items, each naming
  one of the allowed strings.

``python -m tools.demo_pair.evaluate [--dflash] [--limit N]`` prints a JSON report (accuracy,
tool-call validity, and with ``--dflash`` acceptance, tau, replays and tok/s of both paths).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def heldout_path() -> Path:
    """The frozen held-out prompts shipped beside the demo target."""
    from app.paths import demo_pair_dirs

    return demo_pair_dirs()[0] / "heldout_prompts.json"


def load_heldout(path: Path | None = None) -> list[dict]:
    """Held-out prompt records (see :func:`tools.demo_pair.corpus.heldout_prompts`)."""
    return json.loads((path or heldout_path()).read_text(encoding="utf-8"))


def run_item(target, item: dict, *, mode: str = "plain", drafter=None,
             max_tokens: int = 96) -> dict:
    """Generate a reply to ``item`` greedily; returns content, reasoning, tool calls, summary.

    ``target``/``drafter``: :class:`app.engine.loader.LoadedTarget` / ``LoadedDrafter``.
    Returns ``{"tokens": [int], "content": str, "reasoning": str, "tool_calls": [ToolCall],
    "summary": Summary}``.
    """
    from app.chat.pipeline import TextPipeline
    from app.chat.templates import render_prompt
    from app.chat.tools import tool_schemas
    from app.engine.generate import GenerationConfig, generate

    tools = tool_schemas() if item.get("tools") else None
    prompt = render_prompt(target.tokenizer, item["messages"], tools=tools,
                           enable_thinking=item.get("enable_thinking", True))
    pipe = TextPipeline(target.tokenizer, tools=tools,
                        starts_in_reasoning=prompt.starts_in_reasoning)
    cfg = GenerationConfig(mode=mode, max_tokens=max_tokens)
    gen = generate(target, prompt.ids, cfg, drafter=drafter)
    tokens, summary = [], None
    for ev in gen:
        name = type(ev).__name__
        if name == "TokenEvent":
            tokens.append(ev.token_id)
            pipe.feed(ev.token_id)
            if pipe.stopped:
                gen.cancel()
        elif name == "Done":
            summary = ev.summary
    pipe.finish(summary.stop_cause if summary else None)
    return {"tokens": tokens, "content": pipe.content, "reasoning": pipe.reasoning,
            "tool_calls": list(pipe.tool_calls), "summary": summary}


_ITEM = re.compile(r"^\s*\d+\.\s*(.+?)\s*$", re.M)


def check(item: dict, result: dict) -> tuple[bool, str]:
    """Whether ``result`` (from :func:`run_item`) satisfies ``item["expect"]``; and why not."""
    exp = item["expect"]
    content = result["content"]
    if "tool_call" in exp:
        from app.chat.tools import BUILTIN_TOOLS, ToolError, check_arguments

        if not result["tool_calls"]:
            return False, f"no tool call (content {content[:80]!r})"
        call = result["tool_calls"][0]
        want = exp["tool_call"]
        tool = next((t for t in BUILTIN_TOOLS if t.name == call.name), None)
        if tool is None:
            return False, f"unknown tool {call.name!r}"
        try:
            args = check_arguments(call.arguments, tool.parameters)
        except ToolError as exc:
            return False, f"arguments invalid for the schema: {exc}"
        if call.name != want["name"] or args != want["arguments"]:
            return False, f"called {call.name}({args}), expected {want}"
        return True, ""
    if "contains" in exp:
        missing = [s for s in exp["contains"] if s not in content]
        return (not missing), (f"missing {missing} in {content[:120]!r}" if missing else "")
    if "list_items" in exp:
        items = _ITEM.findall(content)
        allowed = exp["list_items"]
        bad = [i for i in items if not any(a in i for a in allowed)]
        if len(items) < exp["count"] or bad:
            return False, f"{len(items)} items, not allowed: {bad}"
        return True, ""
    return False, "no expectation"


def tool_call_valid(result: dict) -> bool:
    """True when the reply has a parsed call to a built-in tool with schema-valid arguments."""
    from app.chat.tools import BUILTIN_TOOLS, ToolError, check_arguments

    if not result["tool_calls"]:
        return False
    call = result["tool_calls"][0]
    tool = next((t for t in BUILTIN_TOOLS if t.name == call.name), None)
    if tool is None:
        return False
    try:
        check_arguments(call.arguments, tool.parameters)
    except ToolError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Print a JSON report over the held-out prompts."""
    import argparse

    from app.engine.loader import load_drafter, load_target
    from app.paths import demo_pair_dirs

    p = argparse.ArgumentParser(description="evaluate the demo pair on held-out prompts")
    p.add_argument("--dflash", action="store_true", help="also run DFlash and compare")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    tdir, ddir = demo_pair_dirs()
    target = load_target(str(tdir))
    drafter = load_drafter(str(ddir)) if args.dflash else None
    items = load_heldout()
    if args.limit:
        items = items[: args.limit]
    rows = []
    for it in items:
        r = run_item(target, it, max_tokens=args.max_tokens)
        ok, why = check(it, r)
        row = {"id": it["id"], "ok": ok, "why": why,
               "plain_tok_s": r["summary"].tok_per_s, "tokens": len(r["tokens"])}
        if it.get("needs_tools"):
            row["tool_call_valid"] = tool_call_valid(r)
        if args.dflash:
            d = run_item(target, it, mode="dflash", drafter=drafter, max_tokens=args.max_tokens)
            s = d["summary"]
            row.update(identical=d["tokens"] == r["tokens"], dflash_tok_s=s.tok_per_s,
                       drafted=s.drafted, accepted=s.accepted, cycles=s.cycles,
                       replays=s.replays, committed=len(d["tokens"]))
        if args.verbose:
            print(json.dumps(row), r["reasoning"][:100], "|", r["content"][:160], flush=True)
        rows.append(row)
    n = len(rows)
    tool_rows = [r for r in rows if "tool_call_valid" in r]
    report = {
        "prompts": n,
        "accuracy": round(sum(r["ok"] for r in rows) / max(1, n), 3),
        "tool_call_validity": round(sum(r["tool_call_valid"] for r in tool_rows)
                                    / max(1, len(tool_rows)), 3),
        "tool_prompts": len(tool_rows),
        "failures": [(r["id"], r["why"]) for r in rows if not r["ok"]],
    }
    if args.dflash:
        drafted = sum(r["drafted"] for r in rows)
        cycles = sum(r["cycles"] for r in rows)
        plain_t = sum(r["tokens"] / r["plain_tok_s"] for r in rows if r["plain_tok_s"])
        dfl_t = sum(r["committed"] / r["dflash_tok_s"] for r in rows if r["dflash_tok_s"])
        report.update(
            identical=all(r["identical"] for r in rows),
            acceptance_rate=round(sum(r["accepted"] for r in rows) / max(1, drafted), 3),
            tau=round((sum(r["accepted"] for r in rows) + cycles) / max(1, cycles), 3),
            replays=sum(r["replays"] for r in rows),
            plain_tok_s=round(sum(r["tokens"] for r in rows) / max(plain_t, 1e-9), 1),
            dflash_tok_s=round(sum(r["committed"] for r in rows) / max(dfl_t, 1e-9), 1),
        )
        report["speedup"] = round(report["dflash_tok_s"] / max(report["plain_tok_s"], 1e-9), 3)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
