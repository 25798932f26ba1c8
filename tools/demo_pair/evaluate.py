"""Measure the shipped demo pair through the app's own code path (greedy, exact verify).

Held-out sets (frozen beside the target, made by ``tools/demo_pair/corpus.py``):

* ``heldout_prompts.json``: single-turn prompts by category, plus out-of-scope prompts
  (category ``scope``);
* ``heldout_scripts.json``: multi-round tool scripts (2 user turns each).

Every reply goes through the app's reply runner (:func:`app.chat.reply.collect_reply`) with
the built-in tools run for real (``current_time`` is frozen at one instant per item, so plain
and DFlash see the same tool results), the history of a script is built as the window builds
it (the reply's messages appended, then :func:`app.chat.history.fit_for_tokenizer`), and every
engine pass runs the engine's default, exact step-loop verify (``fast_verify`` is never set).

Checks of one reply against its ``expect`` (see :class:`tools.demo_pair.corpus.Turn`):

* ``calls``: the first round's calls, in order, make the tools return what the expected calls
  return (``current_time``: the same zone); an empty list means no call at all;
* ``contains``: every string occurs in the final answer; ``time_of``: the ``time`` and
  ``date`` the tool returned for each zone occur in it;
* ``list_items``/``count``: at least ``count`` numbered items, each naming an allowed string;
* ``scope``: no tool call, and the answer carries the scope sentence.

Held-out set v2 (``tools/demo_pair/heldout_v2.py``, written apart from the corpus) adds:

* ``calls_optional``: no call at all also passes (a follow-up the history already answers);
* ``numbers``: every value is stated in the answer (:func:`states_number`: thousands
  separators allowed, rounding to two or more decimals allowed);
* ``any_of``: at least one of the words or phrases occurs (case-insensitive, whole words);
* ``not_contains``: none of the strings occurs (e.g. raw tool-call markup);
* ``exact_count`` with ``list_items``: exactly that many numbered (or bulleted) items, each
  naming an allowed string, none repeated;
* ``ref`` (script turns): ``{"turn", "index", "field"}``, a follow-up about the ``index``-th
  (1-based) list item of an earlier turn's answer, resolved by :func:`resolve_ref`.

``--set v1|v2|long`` picks the set (default ``v1``, the frozen sets beside the target); ``v2``
is ``heldout_v2_prompts.json`` + ``heldout_v2_scripts.json`` and ``long`` the three 30-turn
chats of ``heldout_v2_long.json`` (all in ``tools/demo_pair/``). The ``long`` report adds, per
chat, every turn's verdict, the share right, the turns the app's history fitter left out
before each turn (``app.chat.history.fit_for_tokenizer``, as the window sends it) and, with
``--dflash``, the median tau over the last ten turns (:func:`report_long`).

``python -m tools.demo_pair.evaluate [--dflash] [--limit N] [--scripts-limit N] [--out F]``
prints a JSON report: accuracy overall and per category, call and value accuracy of the
scripts, scope accuracy, and with ``--dflash`` parity, tau (median per first round and per
post-tool round), acceptance and tok/s. ``python -m tools.demo_pair.evaluate bench`` runs the
speed benchmark (:func:`bench`), ``app-bench ARGS`` runs ``python -m app bench ARGS`` with
the exact verify, and ``copy`` runs :func:`copy_probe` (does the target copy fictional place
names that are neither held out nor in the corpus's lists into its call and answer).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 200


# ---- setup ------------------------------------------------------------------------------------

def heldout_dir() -> Path:
    """The folder of the frozen held-out sets (the shipped demo target)."""
    from app.paths import demo_pair_dirs

    return demo_pair_dirs()[0]


def load_heldout(path: Path | None = None) -> list[dict]:
    """Held-out single-turn and scope prompts (:func:`tools.demo_pair.corpus.heldout_prompts`)."""
    return json.loads((path or heldout_dir() / "heldout_prompts.json").read_text("utf-8"))


def load_scripts(path: Path | None = None) -> list[dict]:
    """Held-out multi-round scripts (:func:`tools.demo_pair.corpus.heldout_scripts`)."""
    return json.loads((path or heldout_dir() / "heldout_scripts.json").read_text("utf-8"))


def frozen_tools(now: dt.datetime | None = None) -> list:
    """The built-in tools, ``current_time`` reading one fixed instant (default: now)."""
    from app.chat.tools import builtin_tools

    return builtin_tools(now or dt.datetime.now(dt.UTC))

def settings_for(mode: str, tools: bool, runnable, max_tokens: int = MAX_TOKENS):
    """:class:`app.chat.reply.ReplySettings` for one evaluated reply."""
    from app.chat.reply import ReplySettings
    from app.chat.tools import tool_schemas

    return ReplySettings(mode=mode, max_tokens=max_tokens, enable_thinking=True,
                         tools=tool_schemas() if tools else None, run_tools=tools,
                         runnable_tools=runnable, max_tool_rounds=3)


def fit(target, messages: list[dict], settings) -> list[dict]:
    """The messages the window's worker sends for ``messages`` (``fit_for_tokenizer``, within
    the context and the trained chat length the target's folder states)."""
    from app.chat.history import LEAVE_OUT_STEP, context_limit, fit_for_tokenizer

    limit = context_limit(getattr(target, "context_length", None) or 4096)
    return fit_for_tokenizer(messages, target.tokenizer, limit,
                             reserve=min(settings.max_tokens, limit // 2), tools=settings.tools,
                             trained=getattr(target, "trained_chat_length", None),
                             step=LEAVE_OUT_STEP, enable_thinking=True).messages


def fitted(target, messages: list[dict], settings):
    """The :class:`app.chat.history.FittedHistory` the window's worker builds for
    ``messages`` (what :func:`fit` sends, and how many earlier turns it left out)."""
    from app.chat.history import context_limit, fit_for_tokenizer

    limit = context_limit(getattr(target, "context_length", None) or 4096)
    return fit_for_tokenizer(messages, target.tokenizer, limit,
                             reserve=min(settings.max_tokens, limit // 2), tools=settings.tools,
                             enable_thinking=True)


def reply_to(target, drafter, history: list[dict], tools: bool, mode: str, runnable,
             max_tokens: int = MAX_TOKENS, fits: list | None = None):
    """One reply (``app.chat.reply.Reply``) to ``history`` through the reply runner; with
    ``fits``, the :class:`~app.chat.history.FittedHistory` sent is appended to it."""
    from app.chat.reply import collect_reply

    s = settings_for(mode, tools, runnable, max_tokens)
    if fits is None:
        return collect_reply(target, drafter if mode == "dflash" else None,
                             fit(target, history, s), s)
    f = fitted(target, history, s)
    fits.append(f)
    return collect_reply(target, drafter if mode == "dflash" else None, f.messages, s)


# ---- checks -----------------------------------------------------------------------------------

def _same_result(name: str, got: dict, want: dict) -> bool:
    from app.chat.tools import run_tool

    if name == "current_time":
        a, b = run_tool(name, got), run_tool(name, want)
        return a.ok and b.ok and a.result["timezone"] == b.result["timezone"]
    a, b = run_tool(name, got), run_tool(name, want)
    return a.to_payload() == b.to_payload()


def check_calls(reply, expect: dict) -> tuple[bool, str]:
    """Whether the reply's first round made the expected calls (by the tools' results); with
    ``calls_optional``, a reply with no call at all passes too."""
    want = expect.get("calls", [])
    got = reply.rounds[0].tool_calls
    if expect.get("calls_optional") and not any(r.tool_calls for r in reply.rounds):
        return True, ""
    if not want:
        return (not any(r.tool_calls for r in reply.rounds)), f"unexpected call {got[:1]}"
    if len(got) != len(want):
        return False, f"{len(got)} calls, expected {len(want)} ({reply.rounds[0].content[:80]!r})"
    for g, w in zip(got, want):
        if g.name != w["name"] or not _same_result(w["name"], g.arguments, w["arguments"]):
            return False, f"called {g.name}({g.arguments}), expected {w}"
    return True, ""


_ITEM = re.compile(r"^\s*\d+\.\s*(.+?)\s*$", re.M)
_BULLET = re.compile(r"^\s*[-*\u2022]\s+(.+?)\s*$", re.M)
_NUMBER = re.compile(r"(?<![\d.,])(-?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")


def list_items(content: str) -> list[str]:
    """The numbered items of an answer (``1. Kenya``), else its bulleted ones (``- Kenya``)."""
    return _ITEM.findall(content) or _BULLET.findall(content)


def stated_numbers(content: str) -> list[tuple[float, int]]:
    """Every number written in ``content`` as (value, decimals written); thousands separators
    (``41,500,000``) and the minus sign U+2212 are read."""
    out = []
    for sign, whole, frac in _NUMBER.findall(content.replace("\u2212", "-")):
        text = sign + whole.replace(",", "") + (frac or "")
        out.append((float(text), len(frac) - 1 if frac else 0))
    return out


def states_number(content: str, value: float) -> bool:
    """Whether ``content`` states ``value``: a whole value exactly; a fractional one to at
    least ``min(2, its decimals)`` decimals, rounded or cut (within one unit of the last
    decimal written)."""
    value = float(value)
    if value.is_integer():
        return any(abs(a - value) < 1e-9 for a, _ in stated_numbers(content))
    text = repr(value)
    decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 12
    need = min(2, decimals)
    return any(d >= need and abs(a - value) <= 10.0 ** -d + 1e-9
               for a, d in stated_numbers(content))


def _has_phrase(content: str, phrase: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(phrase.lower()) + r"(?!\w)", content.lower()) is not None


def resolve_ref(expect: dict, answers: list[str]) -> dict:
    """``expect`` with its ``ref`` (``{"turn", "index", "field"}``) made concrete from the
    earlier plain answers ``answers``: the country named by item ``index`` (1-based) of turn
    ``turn``'s list, a ``country_info`` call for it (optional) and its ``field`` stated. An
    item that names no country of the app's data gives ``{"unresolved": why}``."""
    ref = expect.get("ref")
    if not ref:
        return expect
    from app.chat.tools.countries import find_country, load_countries
    from tools.demo_pair.heldout_v2 import expect_fact

    rest = {k: v for k, v in expect.items() if k != "ref"}
    items = list_items(answers[ref["turn"]]) if ref["turn"] < len(answers) else []
    if len(items) < ref["index"]:
        return {**rest, "unresolved": f"turn {ref['turn']} has {len(items)} list items"}
    item = items[ref["index"] - 1]
    rec = find_country(item)
    if rec is None:  # the longest country name or alias inside the item
        names = sorted(((n, r) for r in load_countries() for n in [r["name"], *r["aliases"]]
                        if _has_phrase(item, n)), key=lambda x: -len(x[0]))
        rec = names[0][1] if names else None
    if rec is None:
        return {**rest, "unresolved": f"item {item!r} names no country"}
    return {**rest, "calls": [{"name": "country_info", "arguments": {"name": rec["name"]}}],
            "calls_optional": True, **expect_fact(ref["field"], rec)}


def check_answer(reply, expect: dict) -> tuple[bool, str]:
    """Whether the final answer states what ``expect`` asks for."""
    content = reply.content
    if expect.get("scope"):
        calls = any(r.tool_calls for r in reply.rounds)
        from tools.demo_pair.corpus import SCOPE_MARK

        ok = not calls and SCOPE_MARK in content
        return ok, "" if ok else f"not the scope answer: {content[:100]!r}"
    from tools.demo_pair.corpus import SCOPE_MARK

    if SCOPE_MARK in content:  # the scope answer where a real answer was due
        return False, "scope answer instead of an answer"
    if "unresolved" in expect:
        return False, expect["unresolved"]
    bad = [s for s in expect.get("not_contains", []) if s in content]
    if bad:
        return False, f"contains {bad}: {content[:100]!r}"
    want = list(expect.get("contains", []))
    for zone in expect.get("time_of", []):
        runs = [t for r in reply.rounds for t in r.tool_runs
                if t.result.ok and t.result.result.get("timezone") == zone]
        if not runs:
            return False, f"no current_time result for {zone}"
        want += [runs[-1].result.result["time"], runs[-1].result.result["date"]]
    missing = [s for s in want if s not in content]
    if missing:
        return False, f"missing {missing} in {content[:140]!r}"
    wrong = [v for v in expect.get("numbers", []) if not states_number(content, v)]
    if wrong:
        return False, f"does not state {wrong}: {content[:140]!r}"
    if expect.get("any_of") and not any(_has_phrase(content, w) for w in expect["any_of"]):
        return False, f"none of {expect['any_of'][:4]}...: {content[:100]!r}"
    if "exact_count" in expect:
        items = list_items(content)
        bad = [i for i in items if not any(a in i for a in expect.get("list_items", [i]))]
        if len(items) != expect["exact_count"] or bad or len(set(items)) < len(items):
            return False, (f"{len(items)} items for {expect['exact_count']}, not allowed: "
                           f"{bad}: {content[:100]!r}")
    elif "list_items" in expect:
        items = _ITEM.findall(content)
        bad = [i for i in items if not any(a in i for a in expect["list_items"])]
        if len(items) < expect["count"] or bad:
            return False, f"{len(items)} items, not allowed: {bad}"
        if len(set(items)) < len(items):
            return False, f"repeated items: {items}"
    return True, ""


def check(reply, expect: dict) -> tuple[bool, bool, str]:
    """(call ok, answer ok, why not)."""
    c_ok, c_why = check_calls(reply, expect)
    a_ok, a_why = check_answer(reply, expect)
    return c_ok, a_ok, "; ".join(w for ok, w in ((c_ok, c_why), (a_ok, a_why)) if not ok)


def round_figures(reply) -> list[dict]:
    """Per round: index, tokens, tok/s, generation seconds, cycles, accepted, tau."""
    out = []
    for r in reply.rounds:
        s = r.summary
        n = len(r.tokens)
        out.append({"index": r.index, "tokens": n, "tok_s": s.tok_per_s,
                    "gen_s": n / s.tok_per_s if s.tok_per_s else 0.0, "cycles": s.cycles,
                    "accepted": s.accepted, "drafted": s.drafted,
                    "tau": (s.accepted + s.cycles) / s.cycles if s.cycles else None})
    return out


# ---- runs -------------------------------------------------------------------------------------

def run_single(target, drafter, item: dict, dflash: bool) -> dict:
    """One held-out prompt, plain (and DFlash): checks, figures, parity."""
    runnable = frozen_tools()
    hist = list(item["messages"])
    plain = reply_to(target, drafter, hist, item["tools"], "plain", runnable)
    c_ok, a_ok, why = check(plain, item["expect"])
    row = {"id": item["id"], "category": item["category"], "call_ok": c_ok, "answer_ok": a_ok,
           "ok": c_ok and a_ok, "why": why, "content": plain.content[:200],
           "needs_call": bool(item["expect"].get("calls")),
           "plain": round_figures(plain)}
    if dflash:
        fast = reply_to(target, drafter, hist, item["tools"], "dflash", runnable)
        row["dflash"] = round_figures(fast)
        row["identical"] = fast.all_tokens == plain.all_tokens
    return row


def run_script(target, drafter, script: dict, dflash: bool) -> dict:
    """One multi-round script: each user turn answered with the history built as the app
    builds it; plain and DFlash each build their own history. Each turn's row also holds
    ``left_out_turns`` and ``prompt_tokens`` of the plain prompt as fitted (see
    :func:`fitted`)."""
    runnable = frozen_tools()
    turns = []
    answers: list[str] = []
    hist = {"plain": [], "dflash": []}
    for t in script["turns"]:
        row: dict = {"user": t["user"], "category": t["category"]}
        for mode in (("plain", "dflash") if dflash else ("plain",)):
            h = hist[mode] + [{"role": "user", "content": t["user"]}]
            fits: list = []
            rep = reply_to(target, drafter, h, script["tools"], mode, runnable, fits=fits)
            hist[mode] = h + rep.messages
            row[mode] = round_figures(rep)
            if mode == "plain":
                expect = resolve_ref(t["expect"], answers)
                answers.append(rep.content)
                c_ok, a_ok, why = check(rep, expect)
                row.update(call_ok=c_ok, answer_ok=a_ok, why=why, content=rep.content[:200],
                           needs_call=bool(expect.get("calls")),
                           left_out_turns=fits[0].left_out_turns,
                           prompt_tokens=fits[0].prompt_tokens)
                plain_tokens = rep.all_tokens
            else:
                row["identical"] = rep.all_tokens == plain_tokens
        turns.append(row)
    return {"id": script["id"], "kind": script["kind"], "turns": turns}


def _median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def report(singles: list[dict], scripts: list[dict], dflash: bool) -> dict:
    """The JSON report over evaluated rows (see the module doc)."""
    single = [r for r in singles if r["category"] != "scope"]
    scope = [r for r in singles if r["category"] == "scope"]
    cats: dict[str, list[bool]] = {}
    for r in single:
        cats.setdefault(r["category"], []).append(r["ok"])
    per_cat = {c: f"{sum(v)}/{len(v)}" for c, v in cats.items()}
    script_turns = [t for s in scripts for t in s["turns"]]
    call_turns = [t for t in script_turns if t["needs_call"]]
    out = {
        "single_prompts": len(single),
        "single_accuracy": round(sum(r["ok"] for r in single) / max(1, len(single)), 3),
        "single_per_category": per_cat,
        "worst_category": min(((sum(v) / len(v), c) for c, v in cats.items()), default=None),
        "scope_prompts": len(scope),
        "scope_accuracy": round(sum(r["ok"] for r in scope) / max(1, len(scope)), 3),
        "scripts": len(scripts),
        "script_turns": len(script_turns),
        "script_call_turns": len(call_turns),
        "script_call_accuracy": round(sum(t["call_ok"] for t in call_turns)
                                      / max(1, len(call_turns)), 3),
        "script_value_accuracy": round(sum(t["answer_ok"] for t in call_turns)
                                       / max(1, len(call_turns)), 3),
        "script_turn_accuracy": round(sum(t["call_ok"] and t["answer_ok"] for t in script_turns)
                                      / max(1, len(script_turns)), 3),
        "script_failures": [(s["id"], i, t["why"]) for s in scripts
                            for i, t in enumerate(s["turns"]) if t["why"]],
        "single_failures": [(r["id"], r["why"]) for r in singles if not r["ok"]],
    }
    # Every question that needs a tool, single-turn and script turns together: the right
    # call and the tool's value stated.
    tool_rows = [r for r in single if r.get("needs_call", r["category"].startswith("tool_"))]
    tool_rows += call_turns
    out["tool_questions"] = len(tool_rows)
    out["tool_question_accuracy"] = round(sum(r["call_ok"] and r["answer_ok"] for r in tool_rows)
                                          / max(1, len(tool_rows)), 3)
    if dflash:
        replies = [(r["plain"], r["dflash"]) for r in singles] + [
            (t["plain"], t["dflash"]) for s in scripts for t in s["turns"]]
        first = [d[0]["tau"] for _, d in replies if d]
        post = [x["tau"] for _, d in replies for x in d[1:]]
        n_tok = {m: sum(x["tokens"] for pr in replies for x in pr[i]) for i, m in
                 enumerate(("plain", "dflash"))}
        secs = {m: sum(x["gen_s"] for pr in replies for x in pr[i]) for i, m in
                enumerate(("plain", "dflash"))}
        drafted = sum(x["drafted"] for _, d in replies for x in d)
        accepted = sum(x["accepted"] for _, d in replies for x in d)
        rows = singles + [t for s in scripts for t in s["turns"]]
        out.update(
            identical=all(r["identical"] for r in rows),
            not_identical=[r.get("id", r.get("user")) for r in rows if not r["identical"]],
            tau_median_first_rounds=_median(first),
            tau_median_post_tool_rounds=_median(post),
            first_rounds=len(first), post_tool_rounds=len(post),
            acceptance_rate=round(accepted / max(1, drafted), 3),
            plain_tok_s=round(n_tok["plain"] / max(secs["plain"], 1e-9), 1),
            dflash_tok_s=round(n_tok["dflash"] / max(secs["dflash"], 1e-9), 1),
        )
        out["speedup_pooled"] = round(out["dflash_tok_s"] / max(out["plain_tok_s"], 1e-9), 3)
    return out


def _turn_tau(figs: list[dict]) -> float | None:
    cyc = sum(x["cycles"] for x in figs)
    return (sum(x["accepted"] for x in figs) + cyc) / cyc if cyc else None


def report_long(chats: list[dict], dflash: bool, last: int = 10) -> dict:
    """The long-chat report over :func:`run_script` rows of ``heldout_v2_long.json``: per chat
    the verdict of every turn (``"1"`` right, ``"0"`` wrong, in order), the share right, the
    earlier turns left out of each turn's prompt (``left_out``) and the first turn (0-based)
    where any were, and with ``dflash`` the median tau over its ``last`` turns (tau of a turn:
    (accepted + cycles) / cycles over all its rounds); then the same pooled over the chats."""
    per = []
    for c in chats:
        ok = [t["call_ok"] and t["answer_ok"] for t in c["turns"]]
        left = [t.get("left_out_turns", 0) for t in c["turns"]]
        row = {"id": c["id"], "turns": len(ok), "right": sum(ok),
               "accuracy": round(sum(ok) / max(1, len(ok)), 3),
               "verdicts": "".join("1" if x else "0" for x in ok),
               "left_out": left, "prompt_tokens": [t.get("prompt_tokens") for t in c["turns"]],
               "first_left_out_turn": next((i for i, n in enumerate(left) if n), None),
               "accuracy_last": round(sum(ok[-last:]) / max(1, len(ok[-last:])), 3)}
        if dflash:
            taus = [_turn_tau(t["dflash"]) for t in c["turns"]]
            row["tau_median_last"] = _median(taus[-last:])
            row["tau_per_turn"] = [round(x, 2) if x is not None else None for x in taus]
            row["identical"] = all(t["identical"] for t in c["turns"])
        per.append(row)
    turns = sum(r["turns"] for r in per)
    out = {"chats": len(per), "turns": turns,
           "turn_accuracy": round(sum(r["right"] for r in per) / max(1, turns), 3),
           "turns_left_out_anywhere": any(r["first_left_out_turn"] is not None for r in per),
           "per_chat": per}
    if dflash:
        out["tau_median_last"] = _median([x for c in chats for x in
                                          [_turn_tau(t["dflash"]) for t in c["turns"]][-last:]])
        out["identical"] = all(r["identical"] for r in per)
    return out


V2_DIR = Path(__file__).resolve().parent
SETS = ("v1", "v2", "long")
"""The sets ``--set`` names: ``v1`` the frozen sets beside the target, ``v2`` and ``long``
those of :mod:`tools.demo_pair.heldout_v2`."""


def load_set(name: str) -> tuple[list[dict], list[dict]]:
    """(single-turn items, scripts) of the set ``name`` (:data:`SETS`; ``long``: no single-turn
    items, the long chats as scripts). Raises ``ValueError`` for another name and
    ``FileNotFoundError`` when a set's file is missing."""
    if name == "v1":
        return load_heldout(), load_scripts()
    if name == "v2":
        return (load_heldout(V2_DIR / "heldout_v2_prompts.json"),
                load_scripts(V2_DIR / "heldout_v2_scripts.json"))
    if name == "long":
        return [], load_scripts(V2_DIR / "heldout_v2_long.json")
    raise ValueError(f"unknown set {name!r}; one of {', '.join(SETS)}")


def load_pair(tdir: Path | None = None, ddir: Path | None = None):
    """(target, drafter): the bundled pair's target and drafter, each unless its folder is
    given (one may be given without the other)."""
    from app.models.loader import check_pair, load_drafter, load_target
    from app.paths import demo_pair_dirs

    bundled_t, bundled_d = demo_pair_dirs()
    tdir, ddir = tdir or bundled_t, ddir or bundled_d
    target, drafter = load_target(str(tdir)), load_drafter(str(ddir))
    check_pair(target, drafter)
    return target, drafter


# ---- copying unknown names ----------------------------------------------------------------------

COPY_NAMES = ["Arcadia", "Neverland", "Wonderland", "Eldoria", "Hyrule", "Wadiya", "Genosha",
              "Elysium", "Laputa", "Oceania", "Eurasia", "Eastasia", "Themyscira", "Latverna",
              "Transia", "Illyria", "Osterlich", "Carpania", "Bozatta", "Evergreen Isle",
              "Tinseltown", "Valverde", "Santa Prisca", "Nuevo Rico", "Parador", "Aldovia",
              "Cordinia", "Belgravia", "Corto Maltese", "Isla Nublar", "Krasnovia", "Utopica",
              "Atopia", "Ostopia", "Dystopia", "Eutopia", "Mitopia",
              # consonant-vowel names (seeded once, kept as text so the set stays frozen)
              "Otujewoh", "Gazar", "Uhubudac", "Ubonoj", "Obatis", "Ikuma", "Aramo", "Ajeco",
              "Osajinam", "Sagefac", "Ezetujes", "Sebimaje", "Ufagetib", "Odadeka", "Tevugoh",
              "Kukehu", "Ovudoc", "Wikol", "Uviwedek", "Udijebal"]
"""Fictional place names for :func:`copy_probe` (57): none is a held-out name, none occurs
in the corpus's fixed lists (``corpus.BAD_COUNTRIES``; ``tests/test_demo_corpus.py``); six
share the held-out "Utopia"'s pieces."""
COPY_FRAMES = ["Name the capital of {}.", "Tell me the population of {}.",
               "I'd like an overview of {}."]


def copy_probe(target, drafter, names: list[str] | None = None, verbose: bool = False) -> dict:
    """Whether the target copies unknown place names: one tooled question per name
    (:data:`COPY_FRAMES` in turn), plain greedy; a name counts as copied when the first call
    is ``country_info`` with exactly that name and the answer contains it. Returns
    ``{"copied", "names", "rate", "failures": [[name, called name or None, answer]]}``."""
    names = names or COPY_NAMES
    fails = []
    for i, name in enumerate(names):
        q = COPY_FRAMES[i % len(COPY_FRAMES)].format(name)
        r = reply_to(target, drafter, [{"role": "user", "content": q}], True, "plain",
                     frozen_tools(), 120)
        calls = r.rounds[0].tool_calls
        got = calls[0].arguments.get("name") if calls else None
        ok = bool(calls) and calls[0].name == "country_info" and got == name and name in r.content
        if not ok:
            fails.append([name, got, r.content[:100]])
        if verbose:
            print(("ok " if ok else "BAD"), name, got, flush=True)
    n = len(names)
    return {"copied": n - len(fails), "names": n, "rate": round((n - len(fails)) / n, 3),
            "failures": fails}


# ---- speed benchmark --------------------------------------------------------------------------

def bench_set(singles: list[dict], scripts: list[dict], n_scripts: int = 4) -> list[dict]:
    """The default benchmark set: the first held-out prompt of every category, the two long
    prompts of ``python -m app bench``, and the first ``n_scripts`` scripts of distinct
    kinds. Each entry: ``{"id", "tools", "turns": [user texts]}`` or ``{"messages"}``."""
    from app.engine.bench import _long_prompts

    out, seen = [], set()
    for it in singles:
        if it["category"] not in seen:
            seen.add(it["category"])
            out.append({"id": it["id"], "tools": it["tools"],
                        "turns": [it["messages"][0]["content"]]})
    for p in _long_prompts():
        out.append({"id": p.id, "tools": p.tools, "turns": [p.messages[0]["content"]]})
    kinds = set()
    for s in scripts:
        if s["kind"] not in kinds and len(kinds) < n_scripts:
            kinds.add(s["kind"])
            out.append({"id": s["id"], "tools": True, "turns": [t["user"] for t in s["turns"]]})
    return out


def bench(target, drafter, entries: list[dict], repeats: int = 3,
          max_tokens: int = MAX_TOKENS, out: Path | None = None) -> dict:
    """Plain vs DFlash on ``entries``, ``repeats`` times (order alternating), every round of
    every turn counted: per run, tok/s = tokens / generation seconds summed over rounds; the
    ratio is the median of the paired per-run ratios (same entry, same repeat). One untimed
    warm-up run of each mode first. With ``out``, the figures so far are written there after
    every run."""
    runs = []
    for mode in ("plain", "dflash"):
        _bench_run(target, drafter, entries[0], mode, max_tokens)
    for rep in range(repeats):
        for i, e in enumerate(entries):
            order = ("plain", "dflash") if (rep + i) % 2 == 0 else ("dflash", "plain")
            got = {m: _bench_run(target, drafter, e, m, max_tokens) for m in order}
            runs.append({"id": e["id"], "repeat": rep, **got,
                         "ratio": got["dflash"]["tok_s"] / max(got["plain"]["tok_s"], 1e-9),
                         "identical": got["dflash"]["tokens_ids"] == got["plain"]["tokens_ids"]})
            if out is not None:
                out.write_text(json.dumps(_bench_figures(entries, repeats, runs), indent=1)
                               + "\n")
    return _bench_figures(entries, repeats, runs)


def _bench_figures(entries: list[dict], repeats: int, runs: list[dict]) -> dict:
    per_entry: dict[str, list[float]] = {}
    for r in runs:
        per_entry.setdefault(r["id"], []).append(r["ratio"])
    return {
        "entries": len(entries), "repeats": repeats, "runs": len(runs),
        "plain_tok_s_pooled": round(sum(r["plain"]["tokens"] for r in runs)
                                    / max(1e-9, sum(r["plain"]["gen_s"] for r in runs)), 1),
        "dflash_tok_s_pooled": round(sum(r["dflash"]["tokens"] for r in runs)
                                     / max(1e-9, sum(r["dflash"]["gen_s"] for r in runs)), 1),
        "plain_tok_s_median": _median([r["plain"]["tok_s"] for r in runs]),
        "dflash_tok_s_median": _median([r["dflash"]["tok_s"] for r in runs]),
        "ratio_median": _median([r["ratio"] for r in runs]),
        "ratio_per_entry": {k: _median(v) for k, v in per_entry.items()},
        "tau_median": _median([r["dflash"]["tau"] for r in runs]),
        "identical": all(r["identical"] for r in runs),
    }


def _bench_run(target, drafter, entry: dict, mode: str, max_tokens: int) -> dict:
    runnable = frozen_tools(dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC))
    hist: list[dict] = []
    toks, secs, acc, cyc, ids = 0, 0.0, 0, 0, []
    for u in entry["turns"]:
        hist = hist + [{"role": "user", "content": u}]
        rep = reply_to(target, drafter, hist, entry["tools"], mode, runnable, max_tokens)
        hist = hist + rep.messages
        for f in round_figures(rep):
            toks += f["tokens"]
            secs += f["gen_s"]
            acc += f["accepted"]
            cyc += f["cycles"]
        ids += rep.all_tokens
    return {"tokens": toks, "gen_s": secs, "tok_s": toks / max(secs, 1e-9),
            "tau": (acc + cyc) / cyc if cyc else None, "tokens_ids": ids}


# ---- command line -----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module doc)."""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["app-bench"]:
        from app.cli import main as app_main

        return app_main(["bench", *argv[1:]])
    p = argparse.ArgumentParser(description="evaluate the demo pair on its held-out sets")
    p.add_argument("what", nargs="?", choices=["eval", "bench", "copy"], default="eval")
    p.add_argument("--dflash", action="store_true", help="also run DFlash and compare")
    p.add_argument("--limit", type=int, default=0, help="single-turn prompts at most")
    p.add_argument("--scripts-limit", type=int, default=-1, help="scripts at most (-1: all)")
    p.add_argument("--stride", type=int, default=1, help="every STRIDE-th prompt and script")
    p.add_argument("--only", choices=["singles", "scripts"], help="evaluate one set only")
    p.add_argument("--merge", type=Path, nargs="+", help="report over --out files of earlier "
                   "runs (e.g. one --only singles and one --only scripts) instead of running")
    p.add_argument("--set", choices=SETS, default="v1", dest="set_name",
                   help="held-out set: v1 (beside the target), v2 or long (tools/demo_pair)")
    p.add_argument("--repeats", type=int, default=3, help="bench repeats")
    p.add_argument("--out", type=Path, help="write the full rows and report here (JSON)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--target", type=Path, help="target folder (default: the bundled one)")
    p.add_argument("--drafter", type=Path, help="drafter folder (default: the bundled one)")
    args = p.parse_args(argv)
    if args.merge:
        parts = [json.loads(f.read_text()) for f in args.merge]
        rows = [r for x in parts for r in x["singles"]]
        items = {i["id"]: i for i in load_set(args.set_name)[0]}
        for r in rows:  # rows written before needs_call was recorded
            if "needs_call" not in r and r["id"] in items:
                r["needs_call"] = bool(items[r["id"]]["expect"].get("calls"))
        srows = [r for x in parts for r in x["scripts"]]
        dfl = all("dflash" in r for r in rows) and all(
            "dflash" in t for x in srows for t in x["turns"])
        rep = report(rows, srows, dfl)
        if args.set_name == "long":
            rep["long"] = report_long(srows, dfl)
        rep["seconds"] = sum(x["report"]["seconds"] for x in parts)
        print(json.dumps(rep, indent=1))
        return 0
    target, drafter = load_pair(args.target, args.drafter)
    singles, scripts = load_set(args.set_name)
    if args.only == "singles":
        scripts = []
    elif args.only == "scripts":
        singles = []
    if args.what == "copy":
        print(json.dumps(copy_probe(target, drafter, verbose=args.verbose), indent=1))
        return 0
    if args.what == "bench":
        res = bench(target, drafter, bench_set(singles, scripts), args.repeats, out=args.out)
        print(json.dumps(res, indent=1))
        if args.out:
            args.out.write_text(json.dumps(res, indent=1) + "\n")
        return 0
    singles, scripts = singles[:: args.stride], scripts[:: args.stride]
    if args.limit:
        singles = singles[: args.limit]
    if args.scripts_limit >= 0:
        scripts = scripts[: args.scripts_limit]
    t0 = time.time()
    # Interleaved order (every 8th item first): a run stopped early still covers every
    # category; --out is rewritten after each item.
    singles = [singles[i] for i in sorted(range(len(singles)), key=lambda i: (i % 8, i))]
    scripts = [scripts[i] for i in sorted(range(len(scripts)), key=lambda i: (i % 4, i))]
    rows, srows = [], []

    def save():
        if args.out:
            rep = report(rows, srows, args.dflash)
            if args.set_name == "long":
                rep["long"] = report_long(srows, args.dflash)
            rep["seconds"] = round(time.time() - t0, 1)
            args.out.write_text(json.dumps({"report": rep, "singles": rows, "scripts": srows},
                                           indent=1) + "\n")

    for it in singles:
        rows.append(run_single(target, drafter, it, args.dflash))
        save()
        if args.verbose:
            r = rows[-1]
            print(json.dumps({k: r[k] for k in ("id", "ok", "why", "content")}), flush=True)
    for s in scripts:
        srows.append(run_script(target, drafter, s, args.dflash))
        save()
        if args.verbose:
            print(json.dumps({"id": s["id"], "turns": [{k: t[k] for k in ("why", "content")}
                                                      for t in srows[-1]["turns"]]}), flush=True)
    rep = report(rows, srows, args.dflash)
    if args.set_name == "long":
        rep["long"] = report_long(srows, args.dflash)
    rep["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(rep, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"report": rep, "singles": rows, "scripts": srows},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
