"""``python -m app bench``: plain vs DFlash (tape and replay rollback) in one run, as ratios.

Every prompt goes through the target's chat template (:func:`app.chat.templates.render_prompt`)
and then through each mode: ``plain``, and for every block size B ``dflash+tape@B`` and
``dflash+replay@B`` (greedy; with ``--fast-verify`` also ``dflash+tape@B+fast``, the near-exact
chunked verify). Modes are interleaved (the order rotates from one prompt and
repeat to the next) and repeated, after one untimed warm-up run per mode. Per mode the report
gives the median tok/s (generation only, prefill excluded, as :class:`~app.engine.events.Summary`
counts it), the median time to first token, the acceptance rate and tau (definitions in
:mod:`app.engine.events`), replays, the time shares of draft / verify / rollback, the peak
memory, and the ratio to plain computed pair by pair (same prompt, same repeat; the median of
those ratios). Every mode's token ids are checked against plain's for the same prompt; per
prompt the report gives ``identical``, ``first_divergence`` and, where they differ, the target's
top-two logit gap there (``top2_gap``, :func:`app.engine.compare.near_tie`).

``--scaling`` adds cost per generated token against prompt length (128..4096 tokens) and
against generated length, plain and DFlash. Tau at lengths the model pair never saw in
training is not meaningful (the cost figures are), and the report says so.

``--json`` prints one object ``{"header", "modes", "tape_vs_replay_rollback", "scaling",
"identical_tokens", "goals"}``; ``--out DIR`` writes ``bench.json``, ``runs.csv``,
``summary.csv`` and PNG plots (matplotlib, imported only then); without ``--json`` and
``--out`` they go to ``benchmarks/<UTC time>/`` in the app-data folder.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.compare import first_divergence, near_tie

DEFAULT_BLOCK_SIZES = "4,8,16"
DEFAULT_REPEATS = 2
DEFAULT_MAX_TOKENS = 128
#: Held-out prompts used by default (the first of each category, in file order, up to this).
DEFAULT_HELDOUT = 6
SCALING_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
SCALING_MAX_TOKENS = 32
SCALING_GENERATED = 256
SCALING_WINDOW = 32
TAU_NOTE = ("end tokens ignored; tau and acceptance at prompt or output lengths the model "
            "pair never saw in training are not meaningful; the cost figures are")

_BUILTIN_PROMPTS = [
    "What is the capital of France, and what currency does it use?",
    "What is 17 times 23?",
    "Name five capitals in Europe.",
    "Hello! How are you today?",
]

_LONG_TOPICS = [
    ("Here are my travel notes. Summarise them in three sentences.",
     "Day {i}: we visited the old town, walked along the river, tried the local bread, "
     "counted {n} bridges and wrote down the opening hours of the museum. "),
    ("Below is a list of measurements. Tell me which one is the largest and convert it "
     "to miles.",
     "Measurement {i} was {n} kilometres, taken at noon in clear weather. "),
]


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: OpenAI-style ``messages``; ``tools`` (show the built-in tools to
    the template); ``enable_thinking`` (None: the template's default)."""

    id: str
    messages: list[dict]
    tools: bool = False
    enable_thinking: bool | None = None


@dataclass(frozen=True)
class Mode:
    """A decoding mode: ``name`` (``plain``, ``dflash+tape@8``, ``dflash+tape@8+fast``...),
    engine ``mode``, ``rollback``, ``block`` (None for plain) and ``fast`` (the engine's
    near-exact ``fast_verify``)."""

    name: str
    mode: str
    rollback: str = "tape"
    block: int | None = None
    fast: bool = False
    selector: bool = True  # DFlash2 modes: False = the candidate selector's bigram term off


@dataclass
class RunRecord:
    """One timed generation: its tokens, the engine's summary and each token's wall time
    (seconds since the generation started, ``time.perf_counter``)."""

    mode: Mode
    prompt_id: str
    repeat: int
    prompt_tokens: int
    tokens: list[int]
    summary: Any
    token_times: list[float] = field(default_factory=list)


class BenchError(Exception):
    """Bad benchmark input (prompt file, block sizes); exit code 2 with the message."""


# ------------------------------------------------------------------------------ arguments
def _block_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"block sizes must be integers like 4,8,16: {text!r}") from None
    if not sizes or any(b < 1 for b in sizes):
        raise argparse.ArgumentTypeError(f"block sizes must be positive: {text!r}")
    return sorted(set(sizes))


def _positive(text: str) -> int:
    from app.commands.generation import int_at_least

    return int_at_least(1)(text)


def register(subparsers) -> None:
    """Add the ``bench`` subcommand (sets ``func`` to :func:`run_bench`)."""
    p = subparsers.add_parser(
        "bench", help="benchmark plain vs DFlash (tape and replay) with ratios and plots",
        description="Run a prompt set through plain decoding and DFlash with tape and replay "
        "rollback at several block sizes, interleaved and repeated; report medians, ratios to "
        "plain (pair by pair) and whether every mode produced the same tokens.",
    )
    p.add_argument("--model", help="target folder or cached repo id (default: the bundled "
                   "demo pair, else a tiny random pair)")
    p.add_argument("--draft-model", help="DFlash drafter folder or cached repo id")
    p.add_argument("--dflash2-model", default=None,
                   help="a DFlash2 drafter: adds dflash2+tape@B and dflash2+tape@B+nosel "
                   "(selector off) beside the DFlash modes")
    p.add_argument("--prompts", type=Path, help="JSON file: a list of strings or of "
                   "{id, messages, tools, enable_thinking} objects; or a text file, one "
                   "prompt per line (default: the demo pair's held-out prompts + long ones)")
    p.add_argument("--block-sizes", type=_block_sizes, default=_block_sizes(DEFAULT_BLOCK_SIZES),
                   help=f"comma-separated DFlash block sizes (default {DEFAULT_BLOCK_SIZES}; "
                   "sizes above the drafter's are dropped)")
    p.add_argument("--repeats", type=_positive, default=DEFAULT_REPEATS,
                   help=f"timed runs per prompt and mode (default {DEFAULT_REPEATS})")
    p.add_argument("--max-tokens", type=_positive, default=DEFAULT_MAX_TOKENS,
                   help=f"generated tokens at most per run (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--out", type=Path, help="folder for bench.json, CSV files and PNG plots "
                   "(default: benchmarks/<UTC time> in the app-data folder, none with --json)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--fast-verify", action="store_true", help="also run dflash+tape@B+fast: "
                   "the near-exact chunked verify (can change tokens; reported per prompt)")
    p.add_argument("--scaling", action="store_true", help="also measure cost per token "
                   "against prompt length (128..4096) and against generated length")
    p.add_argument("--multi-turn", action="store_true",
                   help="time to first token of turns 2..5 after a long history, cold vs "
                   "reused prefix (prefix reuse)")
    p.add_argument("--history-tokens", type=_positive, default=3800,
                   help="history length for --multi-turn (default 3800 tokens)")
    p.set_defaults(func=run_bench)


# ------------------------------------------------------------------------------ prompts
def _long_prompts(n_words: int = 600) -> list[BenchPrompt]:
    out = []
    for k, (ask, line) in enumerate(_LONG_TOPICS):
        body, i = [], 1
        while sum(len(x.split()) for x in body) < n_words:
            body.append(line.format(i=i, n=(i * 7) % 23 + 2))
            i += 1
        out.append(BenchPrompt(f"long-{k}", [{"role": "user", "content": ask + "\n\n"
                                              + "".join(body)}]))
    return out


def _prompt_from_obj(obj: Any, i: int) -> BenchPrompt:
    if isinstance(obj, str):
        if not obj.strip():
            raise BenchError(f"prompt {i} is empty")
        return BenchPrompt(f"p{i}", [{"role": "user", "content": obj}])
    if not isinstance(obj, dict):
        raise BenchError(f"prompt {i} is neither a string nor an object")
    msgs = obj.get("messages")
    if msgs is None and isinstance(obj.get("prompt"), str):
        msgs = [{"role": "user", "content": obj["prompt"]}]
    if not isinstance(msgs, list) or not msgs:
        raise BenchError(f"prompt {i} has no 'messages' list (or 'prompt' string)")
    think = obj.get("enable_thinking")
    return BenchPrompt(str(obj.get("id", f"p{i}")), msgs, bool(obj.get("tools", False)),
                       None if think is None else bool(think))


def load_prompts(path: Path) -> list[BenchPrompt]:
    """Prompts from a JSON list (strings or objects with ``messages``/``prompt``, ``id``,
    ``tools``, ``enable_thinking``) or a text file (one prompt per non-empty line).

    Raises:
        BenchError: unreadable file, malformed JSON, no prompts, a malformed entry.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"cannot read the prompt file {path}: {exc}") from None
    if Path(path).suffix.lower() == ".json" or text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, list):
            raise BenchError(f"{path} must hold a JSON list of prompts")
        prompts = [_prompt_from_obj(o, i) for i, o in enumerate(data)]
    else:
        prompts = [_prompt_from_obj(line, i)
                   for i, line in enumerate(x for x in text.splitlines() if x.strip())]
    if not prompts:
        raise BenchError(f"{path} holds no prompts")
    return prompts


def default_prompts(target_dir: Path | None) -> tuple[list[BenchPrompt], str]:
    """The default set and where it came from: up to :data:`DEFAULT_HELDOUT` held-out prompts
    of the demo pair (``heldout_prompts.json`` in the target folder; one per category first),
    or a few built-in prompts, plus two long prompts (~600 words)."""
    held = Path(target_dir) / "heldout_prompts.json" if target_dir else None
    if held is not None and held.is_file():
        items = load_prompts(held)
        data = json.loads(held.read_text(encoding="utf-8"))
        cats: dict[str, int] = {}
        firsts, rest = [], []
        for p, raw in zip(items, data):
            cat = raw.get("category", p.id) if isinstance(raw, dict) else p.id
            (rest if cat in cats else firsts).append(p)
            cats[cat] = 1
        chosen = (firsts + rest)[:DEFAULT_HELDOUT]
        source = f"{held} ({len(chosen)} of {len(items)}) + 2 long prompts"
    else:
        chosen = [BenchPrompt(f"builtin-{i}", [{"role": "user", "content": t}])
                  for i, t in enumerate(_BUILTIN_PROMPTS)]
        source = "built-in prompts + 2 long prompts"
    return chosen + _long_prompts(), source


def render(target, prompt: BenchPrompt) -> list[int]:
    """Prompt ids through the target's chat template (built-in tool definitions when
    ``prompt.tools``)."""
    from app.chat.templates import render_prompt

    tools = None
    if prompt.tools:
        try:
            from app.chat.tools import tool_schemas

            tools = tool_schemas()
        except ImportError:
            tools = None
    return render_prompt(target.tokenizer, prompt.messages, tools=tools,
                         enable_thinking=prompt.enable_thinking).ids


# ------------------------------------------------------------------------------ running
def make_modes(block_sizes: list[int], fast: bool = False, dflash2: bool = False,
               dflash: bool = True) -> list[Mode]:
    """``plain`` then, per block size, ``dflash+tape@B`` and ``dflash+replay@B`` (and, with
    ``fast``, ``dflash+tape@B+fast``); with ``dflash2`` also ``dflash2+tape@B`` and
    ``dflash2+tape@B+nosel`` (the DFlash2 drafter with its selector's bigram term off);
    ``dflash=False`` leaves the DFlash modes out (only a DFlash2 drafter is given)."""
    modes = [Mode("plain", "plain")]
    for b in block_sizes:
        if dflash:
            modes.append(Mode(f"dflash+tape@{b}", "dflash", "tape", b))
            modes.append(Mode(f"dflash+replay@{b}", "dflash", "replay", b))
            if fast:
                modes.append(Mode(f"dflash+tape@{b}+fast", "dflash", "tape", b, fast=True))
        if dflash2:
            modes.append(Mode(f"dflash2+tape@{b}", "dflash2", "tape", b))
            modes.append(Mode(f"dflash2+tape@{b}+nosel", "dflash2", "tape", b, selector=False))
    return modes


def run_one(target, drafter, ids: list[int], mode: Mode, max_tokens: int,
            prompt_id: str = "", repeat: int = 0, drafter2=None) -> RunRecord:
    """One greedy generation in ``mode``; returns its :class:`RunRecord`. ``dflash2`` modes
    run ``drafter2`` (a DFlash2 drafter), or ``drafter`` when that is one.

    Raises:
        RuntimeError: the generation ended with an error (its message).
    """
    from app.engine.events import Done, TokenEvent
    from app.engine.generate import GenerationConfig, generate

    cfg = GenerationConfig(mode=mode.mode, max_tokens=max_tokens, block_size=mode.block,
                           rollback=mode.rollback, fast_verify=mode.fast,
                           selector=mode.selector)
    chosen = {"dflash": drafter, "dflash2": drafter2 or drafter}.get(mode.mode)
    gen = generate(target, ids, cfg, chosen)
    tokens, times, summary = [], [], None
    t0 = time.perf_counter()
    for ev in gen:
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token_id)
            times.append(time.perf_counter() - t0)
        elif isinstance(ev, Done):
            summary = ev.summary
    if summary is None or summary.stop_cause == "error":
        raise RuntimeError(f"{mode.name}: {getattr(summary, 'error', 'no summary')}")
    return RunRecord(mode, prompt_id, repeat, len(ids), tokens, summary, times)


def run_matrix(target, drafter, prompts: list[tuple[str, list[int]]], modes: list[Mode],
               repeats: int, max_tokens: int, progress=None, drafter2=None) -> list[RunRecord]:
    """Warm each mode up once (untimed), then run every (repeat, prompt, mode), the mode order
    rotating by one at each step so that no mode always runs first or after the same one.
    ``drafter2``: the DFlash2 drafter of ``dflash2`` modes (see :func:`run_one`)."""
    warm_ids = prompts[0][1]
    for m in modes:
        run_one(target, drafter, warm_ids, m, min(8, max_tokens), drafter2=drafter2)
    records = []
    step = 0
    total = repeats * len(prompts) * len(modes)
    for r in range(repeats):
        for pid, ids in prompts:
            k = step % len(modes)
            for m in modes[k:] + modes[:k]:
                records.append(run_one(target, drafter, ids, m, max_tokens, pid, r,
                                       drafter2=drafter2))
                if progress:
                    progress(len(records), total, records[-1])
            step += 1
    return records


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else None


def aggregate(records: list[RunRecord], modes: list[Mode]) -> dict[str, dict]:
    """Per mode figures (see the module docstring); keys match ``--json``'s ``modes``."""
    plain = {(r.prompt_id, r.repeat): r for r in records if r.mode.name == "plain"}
    out: dict[str, dict] = {}
    for m in modes:
        rs = [r for r in records if r.mode.name == m.name]
        ss = [r.summary for r in rs]
        ratios, identical, prompts = [], True, {}
        for r in rs:
            base = plain.get((r.prompt_id, r.repeat))
            if base is None:
                continue
            identical &= r.tokens == base.tokens
            div = first_divergence(base.tokens, r.tokens)
            seen = prompts.setdefault(r.prompt_id, {"identical": True, "first_divergence": None,
                                                    "top2_gap": None})
            if div is not None and seen["identical"]:
                seen.update(identical=False, first_divergence=div)
            if base.summary.tok_per_s > 0 and r.summary.tok_per_s > 0:
                ratios.append(r.summary.tok_per_s / base.summary.tok_per_s)
        drafted = sum(s.drafted for s in ss)
        cycles = sum(s.cycles for s in ss)
        busy = sum(s.draft_s + s.verify_s + s.rollback_s for s in ss)
        replays = sum(s.replays for s in ss)
        rollback_s = sum(s.rollback_s for s in ss)
        dflash = m.mode in ("dflash", "dflash2")
        out[m.name] = {
            "mode": m.mode,
            "rollback": m.rollback if dflash else None,
            "block_size": m.block,
            "runs": len(rs),
            "generated_tokens": sum(s.generated_tokens for s in ss),
            # A run that ended on its first token has no generation time: left out.
            "tok_per_s": _median([s.tok_per_s for s in ss if s.tok_per_s > 0]),
            "ttft_s": _median([s.ttft_s for s in ss]),
            "acceptance_rate": (sum(s.accepted for s in ss) / drafted) if drafted else None,
            "tau": (sum(s.generated_tokens - 1 for s in ss) / cycles) if cycles else None,
            "cycles": cycles,
            "replays": replays,
            "draft_share": (sum(s.draft_s for s in ss) / busy) if dflash and busy else None,
            "verify_share": (sum(s.verify_s for s in ss) / busy) if dflash and busy else None,
            "rollback_share": (rollback_s / busy) if dflash and busy else None,
            "rollback_ms_per_replay": (1000 * rollback_s / replays) if replays else None,
            "peak_memory_bytes": max((s.peak_memory_bytes for s in ss), default=0),
            "ratio_to_plain": _median(ratios),
            "identical_tokens": identical,
            "fast_verify": m.fast,
            "prompts": prompts,
        }
        if m.mode == "dflash2":
            out[m.name]["selector"] = m.selector
    return out


def dflash2_vs_dflash(modes: dict[str, dict]) -> dict[str, dict]:
    """Per block size with DFlash2 modes: tau and tok/s of ``dflash+tape@B``,
    ``dflash2+tape@B`` and ``dflash2+tape@B+nosel`` (selector off), the DFlash2/DFlash tau
    ratio (issue 22's goal: >= 1.1) and whether DFlash2's tokens equal plain's."""
    out = {}
    for name, fig in modes.items():
        if fig["mode"] != "dflash2" or not fig.get("selector", True):
            continue
        b = fig["block_size"]
        base = modes.get(f"dflash+tape@{b}", {})
        nosel = modes.get(f"{name}+nosel", {})
        t1, t2 = base.get("tau"), fig["tau"]
        out[str(b)] = {
            "dflash_tau": t1, "dflash2_tau": t2, "dflash2_nosel_tau": nosel.get("tau"),
            "tau_ratio": (t2 / t1) if t1 and t2 else None,
            "dflash_tok_per_s": base.get("tok_per_s"), "dflash2_tok_per_s": fig["tok_per_s"],
            "dflash2_nosel_tok_per_s": nosel.get("tok_per_s"),
            "dflash2_identical_tokens": fig["identical_tokens"],
        }
    return out


def add_top2_gaps(target, figures: dict[str, dict], records: list[RunRecord],
                  rendered: dict) -> None:
    """Fill ``top2_gap`` of every divergent prompt in :func:`aggregate`'s figures: the target's
    top-two logit gap after the prompt and plain's tokens up to the divergence.

    ``rendered``: prompt id -> its prompt token ids. Needs the engine thread (one target
    forward per divergence)."""
    plain = {r.prompt_id: r for r in records if r.mode.name == "plain" and r.repeat == 0}
    for fig in figures.values():
        for pid, p in fig.get("prompts", {}).items():
            d = p["first_divergence"]
            if d is None or pid not in plain:
                continue
            tokens = plain[pid].tokens
            tie = near_tie(target, rendered[pid], tokens[:d],
                           {"plain": tokens[d] if d < len(tokens) else None}, d)
            p["top2_gap"] = tie["gap"]


def tape_vs_replay(modes: dict[str, dict]) -> dict[str, float | None]:
    """Per block size: tape's rollback ms per replay over replay's (goal: at most 1/5)."""
    out = {}
    for name, fig in modes.items():
        if fig["rollback"] != "tape" or fig.get("fast_verify") or fig["mode"] != "dflash":
            continue
        other = modes.get(name.replace("+tape@", "+replay@"))
        a = fig["rollback_ms_per_replay"]
        b = other["rollback_ms_per_replay"] if other else None
        out[str(fig["block_size"])] = (a / b) if a is not None and b else None
    return out


def goals(result: dict) -> dict:
    """Issue 11's goals, reported (never asserted): DFlash + tape >= 2x plain with identical
    tokens (best block size); tape rollback <= 1/5 of replay rollback per replay (every block
    size); per-token cost growth from the shortest to the longest prompt, DFlash <= plain
    (with ``--scaling``). Values are None when not measured."""
    tapes = {k: v for k, v in result["modes"].items()
             if v["rollback"] == "tape" and not v.get("fast_verify") and v["mode"] == "dflash"}
    ratios = [v["ratio_to_plain"] for v in tapes.values() if v["ratio_to_plain"] is not None]
    best = max(ratios) if ratios else None
    tvr = [v for v in result["tape_vs_replay_rollback"].values() if v is not None]
    out: dict[str, Any] = {
        "best_tape_ratio_to_plain": best,
        "tape_2x_plain_identical": None if best is None
        else bool(best >= 2.0 and result["identical_tokens"]),
        "worst_tape_over_replay_rollback": max(tvr) if tvr else None,
        "tape_rollback_le_fifth_of_replay": bool(max(tvr) <= 0.2) if tvr else None,
        "plain_cost_growth": None, "dflash_cost_growth": None,
        "dflash_growth_le_plain": None,
    }
    sc = result.get("scaling")
    rows = [r for r in (sc or {}).get("context", [])
            if r.get("plain_ms_per_token") and r.get("dflash_ms_per_token")]
    if len(rows) >= 2:
        g_plain = rows[-1]["plain_ms_per_token"] / rows[0]["plain_ms_per_token"]
        g_dflash = rows[-1]["dflash_ms_per_token"] / rows[0]["dflash_ms_per_token"]
        out.update(plain_cost_growth=g_plain, dflash_cost_growth=g_dflash,
                   dflash_growth_le_plain=bool(g_dflash <= g_plain))
    return out


# ------------------------------------------------------------------------------ scaling
def _exact_length_prompt(target, n: int) -> list[int]:
    """Chat-template prompt ids of exactly ``n`` tokens (filler text cut to fit)."""
    from app.chat.templates import render_prompt

    mark = "\u2063FILL\u2063"
    text = render_prompt(target.tokenizer, [{"role": "user", "content": mark}]).text
    pre, post = text.split(mark, 1)
    enc = target.tokenizer.encode
    head = list(enc(pre + "Read these notes and answer briefly.\n", add_special_tokens=False))
    tail = list(enc("\nWhat was the largest number?" + post, add_special_tokens=False))
    room = n - len(head) - len(tail)
    if room < 0:
        return (head + tail)[-n:]
    filler: list[int] = []
    i = 0
    while len(filler) < room:
        filler += list(enc(f"Note {i}: the river was {i % 17 + 3} metres deep at the bridge. ",
                           add_special_tokens=False))
        i += 1
    return head + filler[:room] + tail


def _window_costs(times: list[float], window: int) -> list[tuple[int, float]]:
    """(window end index, ms per token) over consecutive windows of generated tokens (the
    first token, which includes the prefill, starts the clock)."""
    out = []
    for end in range(window, len(times), window):
        start = end - window
        out.append((end, 1000 * (times[end] - times[start]) / window))
    return out


def run_scaling(target, drafter, block: int, lengths=SCALING_LENGTHS,
                max_tokens: int = SCALING_MAX_TOKENS,
                generated: int = SCALING_GENERATED, repeats: int = 1) -> dict:
    """Cost per generated token against prompt length and against generated length.

    Each point is the median of ``repeats`` runs, plain and DFlash + tape alternating. End
    tokens are ignored here (``target.eos_token_ids`` emptied on a copy) so that every run
    generates its full length; the text after an end token is meaningless, its cost is not.
    A length whose prompt + output would exceed the target's ``context_length`` is cut to fit
    (4096 becomes 4064 for a 4096-token model with 32 new tokens).
    Returns ``{"block_size", "note", "repeats", "context": [...], "generated": {"plain": [...],
    "dflash": [...]}}``; costs in ms per generated token (prefill excluded).
    """
    import dataclasses

    modes = [Mode("plain", "plain"), Mode(f"dflash+tape@{block}", "dflash", "tape", block)]
    # End tokens are ignored so that every run reaches its length (cost figures only).
    target = dataclasses.replace(target, eos_token_ids=set())

    def key(m: Mode) -> str:
        return "plain" if m.mode == "plain" else "dflash"

    ctx = []
    done: set[int] = set()
    for n in lengths:
        n = min(n, target.context_length - max_tokens)  # the longest fits the context
        if n < 16 or n in done:
            continue
        done.add(n)
        ids = _exact_length_prompt(target, n)
        runs: dict[str, list] = {"plain": [], "dflash": []}
        for _ in range(repeats):
            for m in modes:
                runs[key(m)].append(run_one(target, drafter, ids, m, max_tokens).summary)
        row: dict[str, Any] = {"prompt_tokens": len(ids)}
        for k, ss in runs.items():
            tps = _median([s.tok_per_s for s in ss if s.tok_per_s > 0])
            row[f"{k}_ms_per_token"] = 1000 / tps if tps else None
            row[f"{k}_prefill_s"] = _median([s.ttft_s for s in ss])
        row["dflash_tau"] = _median([s.tau for s in runs["dflash"]])
        ctx.append(row)
    ids = _exact_length_prompt(target, 128)
    gen_tokens = min(generated, max(1, target.context_length - len(ids)))
    windows: dict[str, list] = {"plain": [], "dflash": []}
    for _ in range(repeats):
        for m in modes:
            r = run_one(target, drafter, ids, m, gen_tokens)
            windows[key(m)].append(_window_costs(r.token_times, SCALING_WINDOW))
    gen: dict[str, list] = {}
    for k, per_run in windows.items():
        n_win = min(len(w) for w in per_run) if per_run else 0
        gen[k] = [{"generated": per_run[0][i][0],
                   "ms_per_token": _median([w[i][1] for w in per_run])} for i in range(n_win)]
    return {"block_size": block, "note": TAU_NOTE, "repeats": repeats, "context": ctx,
            "generated": gen}


# ------------------------------------------------------------------------------ report
def header(target, drafter, tpath: str, dpath: str | None, settings: dict) -> dict:
    """App, MLX and mlx-lm versions, device, BLAS in use, model paths and the settings."""
    import os
    from importlib.metadata import version

    import mlx.core as mx

    from app import __version__
    from app.engine.blas import blas_description

    try:
        mlx_lm_version = version("mlx-lm")
    except Exception:  # pragma: no cover - reported, not raised
        mlx_lm_version = "unknown"
    return {
        "app": __version__,
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm_version,
        "python": platform.python_version(),
        "device": f"{mx.default_device()} on {platform.system()} {platform.machine()}, "
                  f"{os.cpu_count()} CPUs",
        "blas": blas_description(),
        "target": str(tpath),
        "drafter": str(dpath) if dpath else None,
        "drafter_block_size": drafter.config.block_size if drafter else None,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **settings,
    }


def _fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


def text_report(result: dict) -> str:
    """A plain-text table of the per-mode figures, preceded by the header."""
    h = result["header"]
    lines = [f"DFlash Chat {h['app']} | mlx {h['mlx']} | mlx-lm {h['mlx_lm']} | {h['device']}",
             f"BLAS: {h['blas']}",
             f"target: {h['target']}", f"drafter: {h['drafter']}",
             f"prompts: {h['prompts']} | repeats {h['repeats']} | max tokens {h['max_tokens']}",
             ""]
    cols = ("mode", "tok/s", "x plain", "TTFT ms", "accept", "tau", "replays", "draft%",
            "verify%", "rollb%", "rb ms/rep", "peak MB", "same")
    lines.append("{:<18}{:>8}{:>8}{:>9}{:>8}{:>6}{:>8}{:>8}{:>8}{:>8}{:>10}{:>8}{:>6}"
                 .format(*cols))

    def pct(v):
        return _fmt(None if v is None else 100 * v, ".0f")

    for name, f in result["modes"].items():
        lines.append("{:<18}{:>8}{:>8}{:>9}{:>8}{:>6}{:>8}{:>8}{:>8}{:>8}{:>10}{:>8}{:>6}".format(
            name, _fmt(f["tok_per_s"], ".1f"), _fmt(f["ratio_to_plain"]),
            _fmt(None if f["ttft_s"] is None else 1000 * f["ttft_s"], ".1f"),
            _fmt(f["acceptance_rate"]), _fmt(f["tau"]), f["replays"], pct(f["draft_share"]),
            pct(f["verify_share"]), pct(f["rollback_share"]), _fmt(f["rollback_ms_per_replay"]),
            _fmt(f["peak_memory_bytes"] / 2**20, ".0f"), "yes" if f["identical_tokens"] else "NO"))
    tvr = result.get("tape_vs_replay_rollback") or {}
    if tvr:
        lines.append("")
        lines.append("tape/replay rollback cost per replay: " + ", ".join(
            f"B={b}: {_fmt(v)}" for b, v in tvr.items()) + " (goal <= 0.20)")
    for b, v in (result.get("dflash2_vs_dflash") or {}).items():
        lines.append(f"DFlash2 vs DFlash at B={b}: tau {_fmt(v['dflash2_tau'])} vs "
                     f"{_fmt(v['dflash_tau'])} ({_fmt(v['tau_ratio'])}x, goal >= 1.10), selector "
                     f"off {_fmt(v['dflash2_nosel_tau'])}; tok/s {_fmt(v['dflash2_tok_per_s'], '.1f')}"
                     f" vs {_fmt(v['dflash_tok_per_s'], '.1f')}")
    lines.append(f"identical tokens in every mode: {'yes' if result['identical_tokens'] else 'NO'}")
    for name, f in result["modes"].items():
        for pid, p in (f.get("prompts") or {}).items():
            if not p["identical"]:
                lines.append(f"  {name} differs from plain on {pid} at token "
                             f"{p['first_divergence']} (top-two logit gap {_fmt(p['top2_gap'], '.3g')})")
    g = result.get("goals")
    if g:
        lines.append(f"goal DFlash+tape >= 2x plain: best {_fmt(g['best_tape_ratio_to_plain'])}x"
                     f" -> {g['tape_2x_plain_identical']}; goal tape rollback <= 1/5 replay: "
                     f"worst {_fmt(g['worst_tape_over_replay_rollback'])} -> "
                     f"{g['tape_rollback_le_fifth_of_replay']}")
        if g["dflash_growth_le_plain"] is not None:
            lines.append(f"goal cost growth with context DFlash <= plain: plain "
                         f"{_fmt(g['plain_cost_growth'])}x, DFlash {_fmt(g['dflash_cost_growth'])}x"
                         f" -> {g['dflash_growth_le_plain']}")
    sc = result.get("scaling")
    if sc:
        lines.append("")
        lines.append(f"cost per generated token vs prompt length (DFlash block {sc['block_size']};"
                     f" {sc['note']})")
        lines.append("{:>8}{:>12}{:>12}{:>8}".format("prompt", "plain ms", "dflash ms", "tau"))
        for row in sc["context"]:
            lines.append("{:>8}{:>12}{:>12}{:>8}".format(
                row["prompt_tokens"], _fmt(row["plain_ms_per_token"]),
                _fmt(row["dflash_ms_per_token"]), _fmt(row.get("dflash_tau"))))
    return "\n".join(lines)


def _run_rows(records: list[RunRecord]) -> list[dict]:
    rows = []
    for r in records:
        s = r.summary
        rows.append({
            "mode": r.mode.name, "block_size": r.mode.block, "rollback": r.mode.rollback
            if r.mode.mode in ("dflash", "dflash2") else "", "prompt_id": r.prompt_id, "repeat": r.repeat,
            "prompt_tokens": r.prompt_tokens, "generated_tokens": s.generated_tokens,
            "tok_per_s": s.tok_per_s, "ttft_s": s.ttft_s, "cycles": s.cycles,
            "drafted": s.drafted, "accepted": s.accepted, "tau": s.tau, "replays": s.replays,
            "draft_s": s.draft_s, "verify_s": s.verify_s, "rollback_s": s.rollback_s,
            "peak_memory_bytes": s.peak_memory_bytes, "stop_cause": s.stop_cause,
        })
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def write_outputs(result: dict, records: list[RunRecord], out: Path) -> list[Path]:
    """Write ``bench.json``, ``runs.csv``, ``summary.csv`` and the PNG plots into ``out``
    (created); returns the written paths. Raises ``OSError`` when the folder is unwritable."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "bench.json", out / "runs.csv", out / "summary.csv"]
    written[0].write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    _write_csv(written[1], _run_rows(records))
    _write_csv(written[2], [{"name": k, **v} for k, v in result["modes"].items()])
    written += plot_results(result, records, out)
    return written


def plot_results(result: dict, records: list[RunRecord], out: Path) -> list[Path]:
    """PNG plots: tok/s by mode and block size, accepted-length histograms and (with scaling)
    cost per token against context and generated length. Imports matplotlib (Agg) lazily."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    h = result["header"]
    subtitle = f"{Path(h['target']).name} | {h['device']} | BLAS: {h['blas'].split(' (')[0]}"
    paths = []
    modes = result["modes"]
    blocks = sorted({f["block_size"] for f in modes.values() if f["block_size"]})
    plain = modes.get("plain", {}).get("tok_per_s")

    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.38
    for j, rb in enumerate(("tape", "replay")):
        vals = [modes.get(f"dflash+{rb}@{b}", {}).get("tok_per_s") or 0 for b in blocks]
        xs = [i + (j - 0.5) * width for i in range(len(blocks))]
        bars = ax.bar(xs, vals, width, label=f"DFlash + {rb}")
        for b, bar in zip(blocks, bars):
            ratio = modes.get(f"dflash+{rb}@{b}", {}).get("ratio_to_plain")
            if ratio is not None:
                ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2,
                                              bar.get_height()), ha="center", va="bottom",
                            fontsize=8)
    if plain:
        ax.axhline(plain, color="black", linestyle="--", label=f"plain ({plain:.1f})")
    tops = [f.get("tok_per_s") or 0 for f in modes.values()]
    ax.set_ylim(0, 1.3 * max(tops + [1e-9]))  # room above the bars for the legend
    ax.set_xticks(range(len(blocks)), [f"block {b}" for b in blocks])
    ax.set_ylabel("tokens / s (median, prefill excluded)")
    ax.set_title(f"Decoding speed by mode and block size\n{subtitle}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    fig.tight_layout()
    paths.append(out / "tok_per_s.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, max(1, len(blocks)), figsize=(3.2 * max(1, len(blocks)), 3.4),
                             squeeze=False)
    for ax, b in zip(axes[0], blocks or [None]):
        lengths = [a for r in records if r.mode.name == f"dflash+tape@{b}"
                   for a in r.summary.accepted_lengths]
        if b is not None:
            ax.hist(lengths, bins=[x - 0.5 for x in range(b + 1)], color="tab:blue")
            ax.set_title(f"block {b}", fontsize=9)
        ax.set_xlabel("accepted drafts per cycle")
    axes[0][0].set_ylabel("cycles")
    fig.suptitle(f"Accepted length (DFlash + tape)\n{subtitle}", fontsize=9)
    fig.tight_layout()
    paths.append(out / "accepted_length.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    sc = result.get("scaling")
    if sc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        xs = [r["prompt_tokens"] for r in sc["context"]]
        for key in ("plain", "dflash"):
            a1.plot(xs, [r[f"{key}_ms_per_token"] for r in sc["context"]], marker="o",
                    label=key if key == "plain" else f"DFlash + tape @{sc['block_size']}")
            g = sc["generated"].get(key, [])
            a2.plot([p["generated"] for p in g], [p["ms_per_token"] for p in g], marker=".",
                    label=key if key == "plain" else f"DFlash + tape @{sc['block_size']}")
        a1.set_xscale("log", base=2)
        a1.set_xlabel("prompt tokens")
        a2.set_xlabel(f"generated tokens (windows of {SCALING_WINDOW})")
        for a in (a1, a2):
            a.set_ylabel("ms per generated token")
            a.legend(fontsize=8)
        fig.suptitle(f"Cost per token against context length\n{subtitle}\n({sc['note']})",
                     fontsize=8)
        fig.tight_layout()
        paths.append(out / "cost_per_token.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


# ------------------------------------------------------------------------------ command
def _long_history(tokenizer, n_tokens: int) -> list[dict]:
    """A synthetic conversation whose rendered prompt holds about ``n_tokens`` tokens."""
    lines = [p.messages[0]["content"] for p in _long_prompts(120)]
    msgs: list[dict] = []
    i = 0
    while True:
        msgs.append({"role": "user", "content": f"Question {i + 1}: summarise this.\n"
                     + lines[i % len(lines)]})
        msgs.append({"role": "assistant", "content": lines[(i + 1) % len(lines)]})
        i += 1
        if len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True)) >= n_tokens:
            return msgs[:-2] if len(msgs) > 2 else msgs  # stay under n_tokens


def run_multi_turn(args) -> int:
    """``bench --multi-turn`` (issue 13): time to first token for turns 2..5 of a conversation
    with a ~4k-token history, cold (everything prefilled) vs reused (the previous turn's cache
    through :class:`~app.engine.prefix.PromptCache`), plain and DFlash. Goal: reused TTFT under
    20% of cold."""
    from app.chat.reply import ReplySettings, collect_reply
    from app.commands.generation import CommandError, resolve_pair
    from app.engine.blas import warn_if_slow_blas
    from app.engine.errors import EngineError
    from app.engine.loader import check_pair, load_drafter, load_target
    from app.engine.prefix import PromptCache

    try:
        tpath, dpath = resolve_pair(args, need_drafter=True)
        target, drafter = load_target(tpath), load_drafter(dpath)
        check_pair(target, drafter)
    except (CommandError, EngineError) as exc:
        _err(f"error: {exc}")
        return 2
    warn_if_slow_blas(sys.stderr, load_mlx=True)
    n_history = min(args.history_tokens, target.context_length - 200)
    history = _long_history(target.tokenizer, n_history)
    asks = ["What is the capital of France?", "And of Peru?", "Name a currency.",
            "Thanks! One more: the capital of Japan?", "Goodbye."]
    rows = []
    for mode in ("plain", "dflash"):
        settings = ReplySettings(mode=mode, max_tokens=min(args.max_tokens, 24))
        session = PromptCache()
        convo = list(history)
        for turn, ask in enumerate(asks, start=1):
            convo.append({"role": "user", "content": ask})
            warm = collect_reply(target, drafter, convo, settings, session=session)
            if turn >= 2:
                cold_settings = ReplySettings(mode=mode, max_tokens=1)
                cold = collect_reply(target, drafter, convo, cold_settings)
                rows.append({
                    "mode": mode, "turn": turn,
                    "prompt_tokens": warm.summary.prompt_tokens,
                    "reused_tokens": warm.summary.reused_tokens,
                    "cold_ttft_s": cold.summary.ttft_s, "reused_ttft_s": warm.summary.ttft_s,
                    "ratio": warm.summary.ttft_s / cold.summary.ttft_s,
                })
                if not args.json:
                    r = rows[-1]
                    _err(f"{mode:<6} turn {turn}: {r['prompt_tokens']} prompt tokens, "
                         f"{r['reused_tokens']} reused; TTFT cold {r['cold_ttft_s']:.3f} s, "
                         f"reused {r['reused_ttft_s']:.3f} s ({r['ratio']:.0%})")
            convo += warm.messages
    head = header(target, drafter, tpath, dpath, {"history_tokens": n_history, "turns": "2..5"})
    result = {"header": head, "turns": rows,
              "goal_reused_under_20pct": all(r["ratio"] < 0.2 for r in rows)}
    if args.json:
        print(json.dumps(result))
    else:
        print("multi-turn TTFT (reused / cold): " + ", ".join(
            f"{r['mode']} t{r['turn']} {r['ratio']:.0%}" for r in rows))
    return 0


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench(args) -> int:
    """The ``bench`` command; returns the exit code (0 ok, 2 bad input or model files)."""
    if args.multi_turn:
        return run_multi_turn(args)
    from app.commands.generation import CommandError, resolve_pair
    from app.engine.blas import warn_if_slow_blas
    from app.engine.errors import EngineError
    from app.engine.loader import check_pair, load_drafter, load_target

    try:
        tpath, dpath = resolve_pair(args, need_drafter=True)
        target = load_target(tpath)
        drafter = load_drafter(dpath)
        check_pair(target, drafter)
        drafter2 = None
        if getattr(args, "dflash2_model", None):
            drafter2 = load_drafter(args.dflash2_model)
            if getattr(drafter2.config, "kind", "dflash") != "dflash2":
                raise CommandError(f"--dflash2-model {args.dflash2_model} is not a DFlash2 "
                                   "drafter")
            check_pair(target, drafter2)
        if args.prompts:
            prompts, source = load_prompts(args.prompts), str(args.prompts)
        else:
            prompts, source = default_prompts(Path(tpath) if Path(tpath).is_dir() else None)
        rendered = [(p.id, render(target, p)) for p in prompts]
    except (CommandError, EngineError, BenchError) as exc:
        _err(f"error: {exc}")
        return 2
    warn_if_slow_blas(sys.stderr, load_mlx=True)
    only_v2 = getattr(drafter.config, "kind", "dflash") == "dflash2"
    limit = min(d.config.block_size for d in (drafter, drafter2) if d is not None)
    blocks = [b for b in args.block_sizes if b <= limit]
    if len(blocks) < len(args.block_sizes):
        _err(f"note: block sizes above the drafter's {limit} dropped "
             f"({', '.join(str(b) for b in args.block_sizes if b > limit)})")
    if not blocks:
        blocks = [limit]
    modes = make_modes(blocks, fast=args.fast_verify and not only_v2,
                       dflash2=only_v2 or drafter2 is not None, dflash=not only_v2)
    settings = {"prompts": source, "prompt_count": len(prompts), "repeats": args.repeats,
                "max_tokens": args.max_tokens, "block_sizes": blocks,
                "modes_order": "interleaved, rotating", "greedy": True,
                "fast_verify_modes": bool(args.fast_verify)}
    if drafter2 is not None:
        settings["dflash2_drafter"] = str(args.dflash2_model)
    head = header(target, drafter, tpath, dpath, settings)

    def progress(i, n, rec):
        if not args.json:
            _err(f"[{i}/{n}] {rec.mode.name:<18} {rec.prompt_id:<22} "
                 f"{rec.summary.tok_per_s:7.1f} tok/s")

    t0 = time.perf_counter()
    records = run_matrix(target, drafter, rendered, modes, args.repeats, args.max_tokens,
                         progress, drafter2=drafter2)
    figures = aggregate(records, modes)
    add_top2_gaps(target, figures, records, dict(rendered))
    result: dict[str, Any] = {
        "header": head,
        "modes": figures,
        "tape_vs_replay_rollback": tape_vs_replay(figures),
        "identical_tokens": all(f["identical_tokens"] for f in figures.values()),
        "scaling": None,
    }
    if any(f["mode"] == "dflash2" for f in figures.values()):
        result["dflash2_vs_dflash"] = dflash2_vs_dflash(figures)
    if args.scaling:
        if not args.json:
            _err("scaling: cost per token against prompt and generated length ...")
        result["scaling"] = run_scaling(target, drafter, max(blocks), repeats=args.repeats)
    result["goals"] = goals(result)
    result["header"]["wall_s"] = round(time.perf_counter() - t0, 1)
    out = args.out
    if out is None and not args.json:
        from app.paths import default_data_dir

        out = default_data_dir() / "benchmarks" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    written: list[Path] = []
    if out is not None:
        try:
            written = write_outputs(result, records, out)
        except OSError as exc:
            _err(f"error: cannot write the results to {out}: {exc}")
            return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(text_report(result))
        if written:
            print("wrote " + ", ".join(str(p) for p in written))
    return 0
