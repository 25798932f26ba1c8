"""One way to measure a reply, and one way to compare two decoders' replies.

``compare``, the window's Compare and reply footers, the short benchmark, ``bench`` and the
benchmarks in ``tools/`` take their figures from here, so that a speed-up printed anywhere
means the same thing:

- **time to answer** (:attr:`ReplyFigures.time_to_answer_s`): seconds from send to the last
  token of the last round, prefill and every tool round included; the tools' own execution
  time is given beside it (:attr:`ReplyFigures.tool_s`) and is part of it;
- **time to first token** of the first round, **decode tok/s** over every round (prefill
  excluded, as :class:`app.engine.events.Summary` counts it), **tau** and **acceptance**.

A ratio of two decoders (:func:`speedup`) is given two ways, each labelled: *pooled*, the
ratio of the two sides' pooled figures (total plain seconds over total DFlash seconds; total
tokens over total decode seconds per side), which is what a ratio printed next to tok/s
figures is; and the *median of paired ratios*, one ratio per reply pair (same prompt, same
repeat), which is robust to one slow outlier. Qt-free and MLX-free.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ReplyFigures:
    """The figures of one whole reply (every round).

    Units: seconds, tokens, tokens per second; ``tau`` in tokens per verify cycle and
    ``acceptance_rate`` a fraction (None for plain replies and replies without cycles).
    """

    mode: str
    time_to_answer_s: float
    tool_s: float
    ttft_s: float
    generated_tokens: int
    decode_tok_per_s: float
    tau: float | None = None
    acceptance_rate: float | None = None

    @property
    def decode_s(self) -> float:
        """Generation seconds over every round: tokens / decode tok/s (0 without a rate)."""
        return (self.generated_tokens / self.decode_tok_per_s
                if self.decode_tok_per_s > 0 else 0.0)

    @classmethod
    def of(cls, reply, wall_s: float | None = None) -> ReplyFigures:
        """The figures of ``reply`` (an ``app.chat.events.Reply``).

        ``wall_s``: the send-to-last-event seconds the caller measured around the whole reply
        (``time.perf_counter``); without it, time to answer is the rounds' generation
        seconds (prefill included, ``Summary.total_s``) plus their tools' execution seconds.
        """
        tool_s = sum(float(getattr(run.result, "duration_s", 0.0) or 0.0)
                     for r in reply.rounds for run in r.tool_runs)
        return cls.of_summary(reply.mode, reply.reply_summary, tool_s, wall_s,
                              sum(len(r.tokens) for r in reply.rounds))

    @classmethod
    def of_summary(cls, mode: str, summary, tool_s: float = 0.0, wall_s: float | None = None,
                   generated_tokens: int | None = None) -> ReplyFigures:
        """The figures of a reply known by its whole-reply ``Summary``
        (``Summary.reply_total``) and its tools' seconds: time to answer is ``wall_s``, or
        the summary's ``total_s`` (prefill and generation of every round) plus ``tool_s``.
        ``generated_tokens``: the kept tokens (default: the summary's)."""
        s = summary
        if wall_s is None:
            wall_s = s.total_s + tool_s
        return cls(mode=mode, time_to_answer_s=float(wall_s), tool_s=float(tool_s),
                   ttft_s=s.ttft_s,
                   generated_tokens=(s.generated_tokens if generated_tokens is None
                                     else generated_tokens),
                   decode_tok_per_s=s.tok_per_s, tau=s.tau, acceptance_rate=s.acceptance_rate)

    def to_dict(self) -> dict:
        """JSON-ready fields (the names above)."""
        return asdict(self)


@dataclass(frozen=True)
class SpeedUp:
    """How much faster one decoder's replies were than plain's, over ``pairs`` reply pairs.

    ``time_to_answer`` and ``decode`` are the pooled ratios (plain's total seconds over the
    other side's; the other side's pooled tok/s over plain's);
    ``median_paired_time_to_answer`` and ``median_paired_decode`` the medians of one ratio
    per pair. A ratio is None where a side has no time (or no decode rate).
    """

    pairs: int
    time_to_answer: float | None
    decode: float | None
    median_paired_time_to_answer: float | None
    median_paired_decode: float | None

    def to_dict(self) -> dict:
        """JSON-ready fields (the names above)."""
        return asdict(self)

    def line(self, name: str = "DFlash") -> str:
        """One line for a terminal or a header, e.g. "DFlash vs plain: time to answer 2.10x,
        decode 2.45x (pooled over 3 pairs; median of paired ratios 2.05x, 2.40x)"."""
        def x(v):
            return "n/a" if v is None else f"{v:.2f}x"

        text = (f"{name} vs plain: time to answer {x(self.time_to_answer)}, decode "
                f"{x(self.decode)}")
        if self.pairs > 1:
            text += (f" (pooled over {self.pairs} pairs; median of paired ratios "
                     f"{x(self.median_paired_time_to_answer)}, "
                     f"{x(self.median_paired_decode)})")
        return text


def pooled_decode_tok_per_s(figures: list[ReplyFigures]) -> float:
    """Tokens over decode seconds, summed over ``figures`` (0.0 when none has a rate)."""
    seconds = sum(f.decode_s for f in figures)
    tokens = sum(f.generated_tokens for f in figures if f.decode_tok_per_s > 0)
    return tokens / seconds if seconds > 0 else 0.0


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def speedup(plain: list[ReplyFigures], other: list[ReplyFigures]) -> SpeedUp:
    """``other``'s speed-up over ``plain``, pair by pair (``plain[i]`` and ``other[i]`` are the
    same prompt and repeat).

    Raises:
        ValueError: the lists differ in length.
    """
    if len(plain) != len(other):
        raise ValueError(f"{len(plain)} plain replies against {len(other)}: not paired")
    tp = sum(f.time_to_answer_s for f in plain)
    to = sum(f.time_to_answer_s for f in other)
    dp, do = pooled_decode_tok_per_s(plain), pooled_decode_tok_per_s(other)
    answer = [p.time_to_answer_s / o.time_to_answer_s for p, o in zip(plain, other)
              if p.time_to_answer_s > 0 and o.time_to_answer_s > 0]
    decode = [o.decode_tok_per_s / p.decode_tok_per_s for p, o in zip(plain, other)
              if p.decode_tok_per_s > 0 and o.decode_tok_per_s > 0]
    return SpeedUp(pairs=len(plain),
                   time_to_answer=tp / to if tp > 0 and to > 0 else None,
                   decode=do / dp if dp > 0 and do > 0 else None,
                   median_paired_time_to_answer=_median(answer),
                   median_paired_decode=_median(decode))


def median_figures(figures: list[ReplyFigures]) -> ReplyFigures:
    """One :class:`ReplyFigures` of several runs of the same reply: the median of each figure
    (tokens: the first run's; tau and acceptance: the median of those that have one).

    Raises:
        ValueError: ``figures`` is empty.
    """
    if not figures:
        raise ValueError("no figures to take the median of")

    def med(name):
        xs = [getattr(f, name) for f in figures if getattr(f, name) is not None]
        return statistics.median(xs) if xs else None

    return ReplyFigures(mode=figures[0].mode, time_to_answer_s=med("time_to_answer_s"),
                        tool_s=med("tool_s"), ttft_s=med("ttft_s"),
                        generated_tokens=figures[0].generated_tokens,
                        decode_tok_per_s=med("decode_tok_per_s"), tau=med("tau"),
                        acceptance_rate=med("acceptance_rate"))
