"""Benchmark runners: prompt ids in, figures out (no argparse, no files, no chat templates).

:func:`run_matrix` runs every prompt through each :class:`BenchRun` (``plain``, and for every block
size B ``dflash+tape@B`` and ``dflash+replay@B``, greedy), interleaved and repeated after one
untimed warm-up run per mode (with ``fast`` also ``dflash+tape@B+fast``, the near-exact chunked
verify); :func:`aggregate` gives per mode the median tok/s (generation
only, prefill excluded, as :class:`~app.engine.events.Summary` counts it), the median time to
first token, the acceptance rate and tau (definitions in :mod:`app.engine.events`), replays,
the time shares of draft / verify / rollback, the peak memory, the ratio to plain computed pair
by pair (same prompt, same repeat; the median of those ratios: ``ratio_to_plain``) and whether
every mode's token ids equal plain's. Beside the medians, the pooled figures that
``app.chat.measure`` defines for every speed-up the app prints: ``pooled_tok_per_s`` (all
tokens over all generation seconds, ``Summary.pool``) and ``pooled_ratio_to_plain`` (the ratio
of those), and time to answer (``time_to_answer_s``, the median of each run's prefill plus
generation seconds; ``answer_ratio_to_plain``, plain's total seconds over the mode's, and
``median_answer_ratio_to_plain``, the median of paired ratios). :func:`run_scaling` measures cost per generated token against prompt length
and against generated length. The ``bench`` command (:mod:`app.commands.bench`) renders the
prompts, calls these and writes the report, CSV files and plots.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.compare import first_divergence, near_tie
from app.engine.events import Summary
from app.engine.modes import DRAFTING_MODES, Mode

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
class BenchRun:
    """One column of the benchmark: ``name`` (``plain``, ``dflash+tape@8``,
    ``dflash+tape@8+fast``...), the decoding ``mode`` (:class:`app.engine.modes.Mode`),
    ``rollback``, ``block`` (None for plain and for the automatic block size), ``fast`` (the
    engine's near-exact ``fast_verify``) and ``auto`` (the automatic block size,
    ``GenerationConfig.auto_block``: ``dflash+tape@auto``)."""

    name: str
    mode: Mode
    rollback: str = "tape"
    block: int | None = None
    fast: bool = False
    selector: bool = True  # DFlash2 modes: False = the candidate selector's bigram term off
    auto: bool = False


@dataclass
class RunRecord:
    """One timed generation: its tokens, the engine's summary and each token's wall time
    (seconds since the generation started, ``time.perf_counter``)."""

    mode: BenchRun
    prompt_id: str
    repeat: int
    prompt_tokens: int
    tokens: list[int]
    summary: Any
    token_times: list[float] = field(default_factory=list)


class BenchError(Exception):
    """Bad benchmark input (prompt file, block sizes); exit code 2 with the message."""


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


# ------------------------------------------------------------------------------ running
def make_modes(block_sizes: list[int], fast: bool = False, dflash2: bool = False,
               dflash: bool = True, auto: bool = False) -> list[BenchRun]:
    """``plain`` then, per block size, ``dflash+tape@B`` and ``dflash+replay@B`` (and, with
    ``fast``, ``dflash+tape@B+fast``); with ``dflash2`` also ``dflash2+tape@B`` and
    ``dflash2+tape@B+nosel`` (the DFlash2 drafter with its selector's bigram term off);
    ``dflash=False`` leaves the DFlash modes out (only a DFlash2 drafter is given); ``auto``
    adds ``dflash+tape@auto`` (and ``dflash2+tape@auto``): the automatic block size."""
    modes = [BenchRun("plain", Mode.PLAIN)]
    for b in block_sizes:
        if dflash:
            modes.append(BenchRun(f"dflash+tape@{b}", Mode.DFLASH, "tape", b))
            modes.append(BenchRun(f"dflash+replay@{b}", Mode.DFLASH, "replay", b))
            if fast:
                modes.append(BenchRun(f"dflash+tape@{b}+fast", Mode.DFLASH, "tape", b, fast=True))
        if dflash2:
            modes.append(BenchRun(f"dflash2+tape@{b}", Mode.DFLASH2, "tape", b))
            modes.append(BenchRun(f"dflash2+tape@{b}+nosel", Mode.DFLASH2, "tape", b, selector=False))
    if auto and dflash:
        modes.append(BenchRun("dflash+tape@auto", Mode.DFLASH, "tape", None, auto=True))
    if auto and dflash2:
        modes.append(BenchRun("dflash2+tape@auto", Mode.DFLASH2, "tape", None, auto=True))
    return modes


def run_one(target, drafter, ids: list[int], mode: BenchRun, max_tokens: int,
            prompt_id: str = "", repeat: int = 0, drafter2=None,
            stage_timing: bool = False) -> RunRecord:
    """One greedy generation in ``mode``; returns its :class:`RunRecord`. ``dflash2`` modes
    run ``drafter2`` (a DFlash2 drafter), or ``drafter`` when that is one. ``stage_timing``:
    the engine's ``GenerationConfig.stage_timing`` (a wait after each stage, so that the
    draft / verify / rollback seconds are each stage's own; off, a greedy cycle waits once
    and its rollback seconds are only the time spent queueing the rollback).

    Raises:
        RuntimeError: the generation ended with an error (its message).
    """
    from app.engine.events import Done, TokenEvent
    from app.engine.generate import GenerationConfig, generate

    cfg = GenerationConfig(mode=mode.mode, max_tokens=max_tokens, block_size=mode.block,
                           rollback=mode.rollback, fast_verify=mode.fast,
                           selector=mode.selector, stage_timing=stage_timing,
                           auto_block=mode.auto)
    chosen = {Mode.DFLASH: drafter, Mode.DFLASH2: drafter2 or drafter}.get(mode.mode)
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


def run_matrix(target, drafter, prompts: list[tuple[str, list[int]]], modes: list[BenchRun],
               repeats: int, max_tokens: int, progress=None, drafter2=None,
               stage_timing: bool = False) -> list[RunRecord]:
    """Warm each mode up once (untimed), then run every (repeat, prompt, mode), the mode order
    rotating by one at each step so that no mode always runs first or after the same one.
    ``drafter2``: the DFlash2 drafter of ``dflash2`` modes (see :func:`run_one`)."""
    warm_ids = prompts[0][1]
    extra = {} if drafter2 is None else {"drafter2": drafter2}
    if stage_timing:
        extra["stage_timing"] = True
    for m in modes:
        run_one(target, drafter, warm_ids, m, min(8, max_tokens), **extra)
    records = []
    step = 0
    total = repeats * len(prompts) * len(modes)
    for r in range(repeats):
        for pid, ids in prompts:
            k = step % len(modes)
            for m in modes[k:] + modes[:k]:
                records.append(run_one(target, drafter, ids, m, max_tokens, pid, r, **extra))
                if progress:
                    progress(len(records), total, records[-1])
            step += 1
    return records


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if a and b and a > 0 and b > 0 else None


def aggregate(records: list[RunRecord], modes: list[BenchRun]) -> dict[str, dict]:
    """Per mode figures (see the module docstring); keys match ``--json``'s ``modes``."""
    plain = {(r.prompt_id, r.repeat): r for r in records if r.mode.name == "plain"}
    out: dict[str, dict] = {}
    for m in modes:
        rs = [r for r in records if r.mode.name == m.name]
        ss = [r.summary for r in rs]
        ratios, answer_ratios, identical, prompts = [], [], True, {}
        paired_base, paired = [], []
        for r in rs:
            base = plain.get((r.prompt_id, r.repeat))
            if base is None:
                continue
            paired_base.append(base.summary)
            paired.append(r.summary)
            if base.summary.total_s > 0 and r.summary.total_s > 0:
                answer_ratios.append(base.summary.total_s / r.summary.total_s)
            identical &= r.tokens == base.tokens
            div = first_divergence(base.tokens, r.tokens)
            seen = prompts.setdefault(r.prompt_id, {"identical": True, "first_divergence": None,
                                                    "top2_gap": None})
            if div is not None and seen["identical"]:
                seen.update(identical=False, first_divergence=div)
            if base.summary.tok_per_s > 0 and r.summary.tok_per_s > 0:
                ratios.append(r.summary.tok_per_s / base.summary.tok_per_s)
        pooled = Summary.pool(ss, m.mode)
        cycles, replays, rollback_s = pooled.cycles, pooled.replays, pooled.rollback_s
        busy = pooled.draft_s + pooled.verify_s + pooled.rollback_s
        dflash = m.mode in DRAFTING_MODES
        out[m.name] = {
            "mode": m.mode,
            "rollback": m.rollback if dflash else None,
            "block_size": m.block,
            "runs": len(rs),
            "generated_tokens": sum(s.generated_tokens for s in ss),
            # A run that ended on its first token has no generation time: left out.
            "tok_per_s": _median([s.tok_per_s for s in ss if s.tok_per_s > 0]),
            "ttft_s": _median([s.ttft_s for s in ss]),
            "acceptance_rate": pooled.acceptance_rate,
            "tau": pooled.tau,
            "cycles": cycles,
            "replays": replays,
            "draft_share": (pooled.draft_s / busy) if dflash and busy else None,
            "verify_share": (pooled.verify_s / busy) if dflash and busy else None,
            "rollback_share": pooled.rollback_share if dflash else None,
            "rollback_ms_per_replay": (1000 * rollback_s / replays) if replays else None,
            "peak_memory_bytes": max((s.peak_memory_bytes for s in ss), default=0),
            "ratio_to_plain": _median(ratios),
            "pooled_tok_per_s": pooled.tok_per_s or None,
            "pooled_ratio_to_plain": _ratio(Summary.pool(paired, m.mode).tok_per_s,
                                            Summary.pool(paired_base, "plain").tok_per_s),
            "time_to_answer_s": _median([s.total_s for s in ss]),
            "answer_ratio_to_plain": _ratio(sum(s.total_s for s in paired_base),
                                            sum(s.total_s for s in paired)),
            "median_answer_ratio_to_plain": _median(answer_ratios),
            "identical_tokens": identical,
            "fast_verify": m.fast,
            "prompts": prompts,
            "auto_block": m.auto,
            "mean_block": _mean([b for s in ss for b in s.block_lengths]) if m.auto else None,
        }
        if m.mode is Mode.DFLASH2:
            out[m.name]["selector"] = m.selector
    return out


def dflash2_vs_dflash(modes: dict[str, dict]) -> dict[str, dict]:
    """Per block size with DFlash2 modes: tau and tok/s of ``dflash+tape@B``,
    ``dflash2+tape@B`` and ``dflash2+tape@B+nosel`` (selector off), the DFlash2/DFlash tau
    ratio (the goal: >= 1.1) and whether DFlash2's tokens equal plain's. ``*_tok_per_s`` are
    the median runs' tok/s; ``*_pooled_tok_per_s`` the pooled figures the bench table shows
    (all tokens over all generation seconds)."""
    out = {}
    for name, fig in modes.items():
        if fig.get("mode") != "dflash2" or not fig.get("selector", True):
            continue
        b = fig["block_size"] or "auto"
        base = modes.get(f"dflash+tape@{b}", {})
        nosel = modes.get(f"{name}+nosel", {})
        t1, t2 = base.get("tau"), fig["tau"]
        out[str(b)] = {
            "dflash_tau": t1, "dflash2_tau": t2, "dflash2_nosel_tau": nosel.get("tau"),
            "tau_ratio": (t2 / t1) if t1 and t2 else None,
            "dflash_tok_per_s": base.get("tok_per_s"), "dflash2_tok_per_s": fig["tok_per_s"],
            "dflash2_nosel_tok_per_s": nosel.get("tok_per_s"),
            "dflash_pooled_tok_per_s": base.get("pooled_tok_per_s"),
            "dflash2_pooled_tok_per_s": fig.get("pooled_tok_per_s"),
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
        if fig["rollback"] != "tape" or fig.get("fast_verify") or fig.get("mode") == "dflash2" \
                or fig.get("auto_block"):
            continue
        other = modes.get(name.replace("+tape@", "+replay@"))
        a = fig["rollback_ms_per_replay"]
        b = other["rollback_ms_per_replay"] if other else None
        out[str(fig["block_size"])] = (a / b) if a is not None and b else None
    return out


def goals(result: dict) -> dict:
    """The bench's goals, reported (never asserted): DFlash + tape >= 2x plain with identical
    tokens (best block size); tape rollback <= 1/5 of replay rollback per replay (every block
    size); per-token cost growth from the shortest to the longest prompt, DFlash <= plain
    (with ``--scaling``). Values are None when not measured."""
    tapes = {k: v for k, v in result["modes"].items()
             if v["rollback"] == "tape" and not v.get("fast_verify")
             and v.get("mode") != "dflash2"}
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
    mark = "\u2063FILL\u2063"
    text = target.tokenizer.apply_chat_template([{"role": "user", "content": mark}],
                                                tokenize=False, add_generation_prompt=True)
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

    modes = [BenchRun("plain", Mode.PLAIN), BenchRun(f"dflash+tape@{block}", Mode.DFLASH, "tape", block)]
    # End tokens are ignored so that every run reaches its length (cost figures only).
    target = dataclasses.replace(target, eos_token_ids=set())

    def key(m: BenchRun) -> str:
        return "plain" if m.mode is Mode.PLAIN else "dflash"

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
    """App, MLX and mlx-lm versions, device (and its name: :mod:`app.engine.device`), BLAS
    in use, model paths, how a quantized target's weights are used (``target_weights``:
    ``LoadedTarget.weights_note``, None when unquantized) and the settings."""
    import os
    from importlib.metadata import version

    import mlx.core as mx

    from app import __version__
    from app.engine.blas import blas_description
    from app.engine.device import device_description

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
        "device_name": device_description(mx),
        "blas": blas_description(),
        "target": str(tpath),
        "target_weights": getattr(target, "weights_note", "") or None,
        "drafter": str(dpath) if dpath else None,
        "drafter_block_size": drafter.config.block_size if drafter else None,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **settings,
    }


