"""Is DFlash faster here? Plain decoding speeds measured since the app started, and the
speed-up of a DFlash reply against a comparable one.

A :class:`PlainSample` is one plain measurement (a plain reply, the plain side of a Compare,
the short benchmark's plain run) with what makes speeds comparable: the pair, the weights'
dtype, Max tokens and the prompt's length. :meth:`Baselines.match` gives a DFlash reply a
baseline only from samples with the same pair, dtype and Max tokens, at a prompt length within
±50% (the speed of both paths depends on all four), and only once there are at least
:data:`MIN_SAMPLES` of them: the median of the newest :data:`WINDOW` (one plain reply's speed
moves by 2x between runs on a busy machine; a median of several does not). A Compare's
drafting side is instead compared with its own plain side (:meth:`SpeedUp.paired`): the same
prompt, run back to back. :class:`SlowStreak` watches the last three DFlash
replies and gives the advice when each was slower than its comparable plain speed: try Plain
or a smaller block (:attr:`SlowStreak.NOTE`) when the chat was short, or start a new chat
(:data:`LONG_CHAT_NOTE`) when one of them had a long prompt (:func:`long_context`), since a
model's drafts are accepted less, and its answers go astray, in a chat longer than those it
was trained on; a smaller block does not help there. Qt-free and MLX-free.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

from app.engine.modes import DRAFTING_MODES

CONTEXT_TOLERANCE = 0.5
"""A baseline's prompt length may differ by this fraction of the reply's (±50%)."""

MIN_SAMPLES = 3
"""Comparable plain measurements needed before a footer shows a speed-up."""

WINDOW = 5
"""A baseline is the median of at most this many newest comparable measurements."""


@dataclass(frozen=True)
class PlainSample:
    """One plain decoding speed: ``tok_per_s`` over a prompt of ``context_tokens`` with
    ``max_tokens``, on ``pair`` (target and drafter paths) in ``dtype``; ``source`` says
    where it was measured ("plain reply", "Compare", "short benchmark"). A baseline made of
    several (:meth:`Baselines.match`) has their median speed and prompt length, ``samples``
    their number and ``source`` their sources joined ("plain reply, Compare")."""

    pair: str
    dtype: str
    max_tokens: int
    context_tokens: int
    tok_per_s: float
    source: str
    samples: int = 1


@dataclass(frozen=True)
class SpeedUp:
    """A DFlash reply's tok/s over its baseline's (``ratio``), and the baseline."""

    ratio: float
    baseline: PlainSample

    def label(self) -> str:
        """The footer's text, e.g. "~1.9x plain"."""
        return f"~{self.ratio:.1f}x plain"

    def to_dict(self) -> dict:
        """JSON-ready fields (stored with the reply, read back by :meth:`from_dict`)."""
        return {"ratio": self.ratio, "baseline": asdict(self.baseline)}

    @classmethod
    def from_dict(cls, d: dict | None) -> SpeedUp | None:
        """The speed-up stored by :meth:`to_dict` (None for None or a record it cannot
        read)."""
        if not isinstance(d, dict) or not isinstance(d.get("baseline"), dict):
            return None
        try:
            return cls(float(d["ratio"]), PlainSample(**{
                f.name: d["baseline"][f.name] for f in fields(PlainSample)
                if f.name in d["baseline"] or f.name != "samples"}))
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def paired(cls, tok_per_s: float, plain: PlainSample) -> SpeedUp | None:
        """A Compare's drafting side against its own plain side (None without two rates)."""
        if tok_per_s <= 0 or plain.tok_per_s <= 0:
            return None
        return cls(tok_per_s / plain.tok_per_s, plain)

    def tooltip(self) -> str:
        """What the ratio is against, in words."""
        b = self.baseline
        head = (f"DFlash decoded about {self.ratio:.2f} times as fast (tok/s, reading the "
                "prompt not counted) as plain decoding did here. ")
        where = (f"on the same pair ({b.dtype or 'dtype unknown'}, Max tokens {b.max_tokens})")
        if b.samples > 1:
            return (head + f"Baseline: {b.tok_per_s:.1f} tok/s plain, the median of the last "
                    f"{b.samples} plain measurements ({b.source}) {where} with prompts of "
                    f"about {b.context_tokens:,} tokens.")
        return (head + f"Baseline: {b.tok_per_s:.1f} tok/s plain, measured by a {b.source} "
                f"{where} with a {b.context_tokens:,}-token prompt.")


NO_BASELINE = f"no plain baseline yet (needs {MIN_SAMPLES} plain runs of similar length)"
"""The footer's text when no comparable plain speed was measured (plain replies and the plain
sides of Compares count; docs/window.md gives the rule)."""


@dataclass
class Baselines:
    """Plain speeds measured since the app started (newest last)."""

    samples: list[PlainSample] = field(default_factory=list)

    def add(self, sample: PlainSample) -> None:
        """Keep one measurement (a zero speed is not a measurement and is dropped)."""
        if sample.tok_per_s > 0:
            self.samples.append(sample)

    def clear(self) -> None:
        """Forget every measurement (a pair was loaded: baselines are measured since)."""
        self.samples.clear()

    def match(self, pair: str, dtype: str, max_tokens: int,
              context_tokens: int) -> PlainSample | None:
        """The comparable baseline for a reply (see the module doc): of the samples with the
        same pair, dtype and Max tokens whose prompt length is within ±50% of
        ``context_tokens``, the newest :data:`WINDOW`, as one :class:`PlainSample` with their
        median speed and prompt length; None with fewer than :data:`MIN_SAMPLES`."""
        found = [s for s in self.samples
                 if (s.pair, s.dtype, s.max_tokens) == (pair, dtype, max_tokens)
                 and abs(s.context_tokens - context_tokens) <= CONTEXT_TOLERANCE * context_tokens]
        found = found[-WINDOW:]
        if len(found) < MIN_SAMPLES:
            return None
        sources = list(dict.fromkeys(s.source for s in found))
        return PlainSample(pair, dtype, max_tokens,
                           int(statistics.median(s.context_tokens for s in found)),
                           statistics.median(s.tok_per_s for s in found),
                           ", ".join(sources), len(found))

    def speedup(self, tok_per_s: float, pair: str, dtype: str, max_tokens: int,
                context_tokens: int) -> SpeedUp | None:
        """A DFlash reply's :class:`SpeedUp` (None without a comparable baseline)."""
        base = self.match(pair, dtype, max_tokens, context_tokens)
        if base is None or tok_per_s <= 0:
            return None
        return SpeedUp(tok_per_s / base.tok_per_s, base)


LONG_CONTEXT_SHARE = 0.5
"""A prompt longer than this fraction of the usable context (the context, or the chat length
the model was trained on when smaller) counts as a long chat (:func:`long_context`)."""

LONG_CHAT_NOTE = ("Long chats degrade this model: in this chat its drafts are accepted less "
                  "and its answers may go astray, so DFlash was slower than plain and a "
                  "smaller block will not help. Start a new chat (File › New chat).")
"""The advice when DFlash was slower in a long chat (:meth:`SlowStreak.advice`)."""


def long_context(prompt_tokens: int, context_length: int, trained: int | None = None,
                 left_out: bool = False) -> bool:
    """Whether a reply's context was long enough to be the cause of a slow or wrong reply:
    earlier turns were left out of its prompt (``left_out``), or its prompt (``prompt_tokens``,
    its last round's) took more than :data:`LONG_CONTEXT_SHARE` of the usable context, the
    smaller of ``context_length`` and the chat length the model was trained on
    (``trained``, tokens; None or 0: not stated). A zero ``context_length`` is unknown."""
    if left_out:
        return True
    usable = [int(x) for x in (context_length, trained) if x]
    return bool(usable) and prompt_tokens > LONG_CONTEXT_SHARE * min(usable)


@dataclass
class SlowStreak:
    """The speed-ups of the last DFlash replies; :attr:`slow` when the last ``n`` were each
    below 1.0x (a reply without a baseline breaks the streak), and which of them had a long
    context (:func:`long_context`)."""

    n: int = 3
    ratios: list[float | None] = field(default_factory=list)
    long: list[bool] = field(default_factory=list)

    def add(self, ratio: float | None, long_context: bool = False) -> None:
        """One DFlash reply's ratio (None: no baseline) and whether its context was long."""
        self.ratios = (self.ratios + [ratio])[-self.n:]
        self.long = (self.long + [bool(long_context)])[-self.n:]

    def advice(self) -> str | None:
        """What to say about the streak: None unless :attr:`slow`; :data:`LONG_CHAT_NOTE`
        when one of its replies had a long context (the context, not DFlash's settings, is
        the likely cause then); else :attr:`NOTE`."""
        if not self.slow:
            return None
        return LONG_CHAT_NOTE if any(self.long) else self.NOTE

    @property
    def slow(self) -> bool:
        """True when the last ``n`` DFlash replies were all slower than plain."""
        return len(self.ratios) == self.n and all(r is not None and r < 1.0
                                                  for r in self.ratios)

    NOTE = ("DFlash was slower than plain for the last 3 replies on this pair. Try Plain, or a "
            "smaller block size in File › Settings.")


UNFIT_ACCEPTANCE = 0.05
"""A reply whose drafts the target accepted less often than this (a fraction) suggests a
drafter that does not fit the target: a drafter trained for it accepts most (the demo pair
about 70-90%), while one made for another target, or with untrained weights, accepts almost
none (acceptance ~0, tau 1.0: the symptom reported in vLLM #49559 and vllm-ascend #11374)."""

UNFIT_MIN_CYCLES = 3
"""Cycles a reply needs before its acceptance says anything about the drafter."""


FitVerdict = Literal["fits", "unfit", "unknown"]
"""Whether a drafter fits its target by its acceptance: ``fits``, ``unfit`` (below
:data:`UNFIT_ACCEPTANCE`), or ``unknown`` (fewer than :data:`UNFIT_MIN_CYCLES` cycles, or no
rate)."""


def fit_verdict(acceptance_rate: float | None, cycles: int) -> FitVerdict:
    """The one rule for a drafter's fit, for a reply and for the probe after a load
    (:mod:`app.chat.drafter_probe`): ``unfit`` when ``acceptance_rate`` (a fraction of the
    drafted tokens) is below :data:`UNFIT_ACCEPTANCE` over at least :data:`UNFIT_MIN_CYCLES`
    ``cycles``; ``fits`` at or above it over as many; else ``unknown``."""
    if acceptance_rate is None or cycles < UNFIT_MIN_CYCLES:
        return "unknown"
    return "unfit" if acceptance_rate < UNFIT_ACCEPTANCE else "fits"


def unfit_note_text(drafter_name: str | None, acceptance_rate: float, accepted: int,
                    drafted: int, cycles: int, where: str = "in this reply") -> str:
    """The lasting note naming a drafter that does not fit its target, shown after a reply
    (:func:`unfit_drafter_note`) and after a load whose probe says so (``where`` "on a short
    probe after loading"): its acceptance (a fraction), ``accepted`` of ``drafted`` tokens
    over ``cycles`` cycles."""
    name = f"The drafter {drafter_name}" if drafter_name else "The drafter"
    return (f"{name} had {acceptance_rate * 100:.0f}% of its drafts accepted {where} ("
            f"{accepted} of {drafted} over {cycles} cycles): it "
            "probably does not fit this target (made for another model, or not a trained "
            "drafter), and DFlash is slower than plain with it. Choose a drafter made for this "
            "target in Models, or use Plain.")


def unfit_drafter_note(summary, drafter_name: str | None, greedy: bool = True) -> str | None:
    """The note for a DFlash or DFlash2 reply whose drafter looks unfit for the target, or
    None: :func:`fit_verdict` says ``unfit`` (acceptance below :data:`UNFIT_ACCEPTANCE` over
    at least :data:`UNFIT_MIN_CYCLES` cycles). ``summary``: the reply's
    ``app.engine.events.Summary`` (whole reply). ``greedy`` False (a sampled reply): None,
    since sampling lowers any drafter's acceptance (the bundled pair's fell to 1% at
    temperature 2); the greedy probe after a load judges the fit instead."""
    if summary is None or summary.mode not in DRAFTING_MODES or not greedy:
        return None
    rate = summary.acceptance_rate
    if fit_verdict(rate, summary.cycles) != "unfit":
        return None
    return unfit_note_text(drafter_name, rate, summary.accepted, summary.drafted,
                           summary.cycles)
