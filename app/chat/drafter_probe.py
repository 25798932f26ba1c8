"""Does a drafter fit its target? A short greedy probe run when a pair is loaded.

:func:`probe_drafter` runs at most :data:`PROBE_CYCLES` greedy DFlash (or DFlash2) cycles on
one fixed short chat prompt (:data:`PROBE_TEXT`, rendered with the target's chat template)
and counts what the target accepted. The verdict uses the same rule and threshold as the live
check after a reply (:func:`app.chat.baseline.fit_verdict`: acceptance below
``UNFIT_ACCEPTANCE`` over at least ``UNFIT_MIN_CYCLES`` cycles is ``unfit``), and an unfit
probe's note is the live check's text (:func:`app.chat.baseline.unfit_note_text`).

Bounded work: one prefill of the ~20-token prompt and :data:`PROBE_CYCLES` draft + verify
cycles, i.e. at most ``1 + PROBE_CYCLES * block_size`` tokens (49 with blocks of 16), and only
``PROBE_CYCLES`` tokens for a drafter the target never agrees with. The bundled demo pair
takes about 0.2-0.3 s on a 2-core CPU (docs/performance.md, "Drafter probe"). No prompt cache
is touched and nothing is stored. Qt-free; call it on the thread that owns MLX.

One short prompt says little about a drafter that fits (acceptance depends on the text), but
a drafter made for another model or with untrained weights accepts almost nothing on any
prompt, and that is what the probe is for.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app.chat.baseline import FitVerdict, fit_verdict, unfit_note_text

PROBE_TEXT = "Briefly, how does a language model work?"
"""The probe's user message (one general question every chat model answers at some length)."""

PROBE_CYCLES = 3
"""Cycles the probe runs at most (the live check's ``UNFIT_MIN_CYCLES``: enough for a
verdict)."""

PROBE_WHERE = "on a short probe after loading"
"""How the unfit note says where the acceptance was measured."""


@dataclass(frozen=True)
class DrafterProbe:
    """What :func:`probe_drafter` measured for one target + drafter pair.

    Attributes:
        target_path, drafter_path: the folders (resolved, as str), which key the result.
        drafter_name: the drafter's display name.
        verdict: ``fits``, ``unfit`` or ``unknown`` (:func:`app.chat.baseline.fit_verdict`;
            ``unknown`` also when the probe could not run: ``error`` says why).
        cycles: DFlash cycles run (at most :data:`PROBE_CYCLES`).
        drafted, accepted: draft tokens proposed and accepted over them.
        acceptance_rate: ``accepted / drafted`` (a fraction; None when nothing was drafted).
        tau: mean tokens committed per cycle (None without a cycle).
        tokens: tokens generated (the prefill's first one included).
        seconds: wall seconds of the whole probe (prefill included).
        error: why the probe did not run ("" when it did).
    """

    target_path: str
    drafter_path: str
    drafter_name: str
    verdict: FitVerdict
    cycles: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float | None = None
    tau: float | None = None
    tokens: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """``(target_path, drafter_path)``: what :func:`pair_key` gives for this pair."""
        return (self.target_path, self.drafter_path)

    def label(self) -> str:
        """One line for the Models window and ``models``' text output, e.g. "drafter fit:
        71% accepted on a probe" or "does not fit this target: 0% accepted on a probe"."""
        if self.verdict == "fits":
            return f"drafter fit: {self.acceptance_rate * 100:.0f}% accepted on a probe"
        if self.verdict == "unfit":
            return (f"does not fit this target: {self.acceptance_rate * 100:.0f}% accepted "
                    "on a probe")
        if self.error:
            return f"fit unknown: the probe failed ({self.error})"
        return (f"fit unknown: the probe ended after {self.cycles} cycle"
                f"{'' if self.cycles == 1 else 's'}")

    def note(self) -> str | None:
        """The window's lasting note for an unfit drafter (the live check's text,
        :func:`app.chat.baseline.unfit_note_text`), else None."""
        if self.verdict != "unfit":
            return None
        return unfit_note_text(self.drafter_name, self.acceptance_rate, self.accepted,
                               self.drafted, self.cycles, PROBE_WHERE)

    def to_dict(self) -> dict:
        """JSON-ready fields (``models --json --probe``'s ``drafter_probes`` entries), plus
        ``label``."""
        return {**asdict(self), "label": self.label()}


def pair_key(target_path: str | Path, drafter_path: str | Path) -> tuple[str, str]:
    """The key of a pair's probe: both folders resolved, as str (a catalog entry and a loaded
    model name the same folder the same way)."""
    return (str(Path(target_path).resolve()), str(Path(drafter_path).resolve()))


def probe_prompt(target) -> list[int]:
    """:data:`PROBE_TEXT` as the target's chat-template prompt ids (the plain encoding for a
    tokenizer without a template)."""
    from app.engine.warmup import user_prompt_ids

    return user_prompt_ids(target, PROBE_TEXT)


def probe_drafter(target, drafter, cycles: int = PROBE_CYCLES) -> DrafterProbe:
    """Run the probe (see the module doc) on a loaded pair.

    Args:
        target: ``app.models.loader.LoadedTarget``.
        drafter: ``app.models.loader.LoadedDrafter`` (DFlash or DFlash2) that fits it
            (``loader.check_pair`` passed).
        cycles: cycles at most (default :data:`PROBE_CYCLES`).

    Returns:
        A :class:`DrafterProbe`. Never raises for a pair that cannot run DFlash (an
        ``EngineError`` such as a target family without tap capture): its verdict is then
        ``unknown`` with the message in ``error``.

    Raises:
        app.engine.errors.WrongThreadError: called on the GUI thread.
    """
    from app.engine.drafter import DEFAULT_BLOCK_SIZE
    from app.engine.errors import EngineError, WrongThreadError
    from app.engine.events import CycleEvent, Done
    from app.engine.generate import GenerationConfig, generate

    target_path, drafter_path = pair_key(target.path, drafter.path)
    block = int(getattr(drafter.config, "block_size", None) or DEFAULT_BLOCK_SIZE)
    config = GenerationConfig(mode="dflash", max_tokens=1 + cycles * block)
    seen: list[CycleEvent] = []
    tokens = 0
    error = ""
    t0 = time.perf_counter()
    try:
        run = generate(target, probe_prompt(target), config, drafter)
        for ev in run:
            if isinstance(ev, CycleEvent):
                seen.append(ev)
                if len(seen) >= cycles:
                    break
            elif isinstance(ev, Done):
                tokens = ev.summary.generated_tokens
                if ev.summary.stop_cause == "error":
                    error = ev.summary.error or "error"
    except WrongThreadError:
        raise
    except EngineError as exc:
        error = str(exc)
    seconds = time.perf_counter() - t0
    drafted = sum(c.drafted for c in seen)
    accepted = sum(c.accepted for c in seen)
    committed = sum(c.committed for c in seen)
    rate = accepted / drafted if drafted else None
    verdict: FitVerdict = "unknown" if error else fit_verdict(rate, len(seen))
    return DrafterProbe(
        target_path, drafter_path, str(drafter.name), verdict, len(seen), drafted, accepted,
        rate, committed / len(seen) if seen else None, tokens or (1 + committed if seen else 0),
        seconds, error)
