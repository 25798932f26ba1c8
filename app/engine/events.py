"""Events emitted by both decoding paths (plain and DFlash): one set of types.

A generation is an iterator of these events, in this order::

    TokenEvent*  (interleaved with CycleEvent on the DFlash path)   ... Done

The first :class:`TokenEvent` is the token chosen from the prefill's last logits; on the
DFlash path each verify cycle then emits its committed tokens followed by one
:class:`CycleEvent`. The plain path emits only :class:`TokenEvent` (``from_draft=False``)
and the final :class:`Done`.

Definitions follow the DFlash paper (Chen et al. 2026, "DFlash: Block Diffusion for Flash
Speculative Decoding") and ``shared/DFLASH_NOTES.md``:

* acceptance rate = accepted draft tokens / drafted tokens (``None`` when nothing was drafted);
* tau = mean tokens committed per verify cycle (accepted + 1, at most the block size);
  the prefill's first token is not a cycle;
* both count only the tokens a reply keeps: a block cut by an end token, a stop string or
  Stop counts as far as the cut (:meth:`CycleEvent.kept`), so the accepted drafts are the
  kept tokens whose ``from_draft`` is True;
* replays = cycles whose recurrent state was rolled back and the committed tokens run again
  (through the recurrence only under ``tape``, through the whole target under ``replay``);
* rollback share = rollback seconds / (draft + verify + rollback seconds).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from app.engine.modes import DRAFTING_MODES, Mode, ModeName

StopCause = Literal["end_token", "length", "cancelled", "error", "stop_string"]
"""Why a run ended: an end token, the token limit, a cancel, an error, or (set by
``app.chat.reply.run_reply``, which cancels the engine for it) a stop string."""


@dataclass(frozen=True)
class TokenEvent:
    """One committed output token.

    Attributes:
        token_id: vocabulary id (int). The end token is emitted too when generated.
        index: 0-based position in the generated output.
        from_draft: True when the drafter proposed this token and the target accepted it;
            False for the target's own choices (prefill token, bonus/correction tokens and
            every token of the plain path).
    """

    token_id: int
    index: int
    from_draft: bool = False


@dataclass(frozen=True)
class CycleEvent:
    """One DFlash draft-verify cycle, emitted after its committed tokens.

    Attributes:
        index: 0-based cycle number.
        drafted: draft tokens proposed (block size - 1, or fewer near ``max_tokens``).
        accepted: drafts accepted by the target (0..drafted).
        committed: tokens committed this cycle (accepted + 1, less when an end token or the
            token limit cut the block).
        replayed: True when the recurrent state was rolled back and re-run this cycle.
        draft_s, verify_s, rollback_s: wall seconds spent drafting, verifying, rolling back.
            A greedy cycle waits for the device once (``app.engine.generate``, "One host read
            per cycle"): then ``draft_s`` and ``rollback_s`` are the seconds spent queueing
            those stages and ``verify_s`` includes the wait for all the queued work; with
            ``GenerationConfig.stage_timing`` each is that stage's compute time.
        network_s: for a target sharded over a group (:mod:`app.engine.distributed`), the
            seconds of this cycle rank 0 waited on the other ranks (their layers and the
            transfers; part of ``verify_s`` and ``rollback_s``); 0 in one process.
        block: the cycle's block length L (the pending token and the drafts verified: 1 for
            a plain step without drafts), as chosen before the cycle (fixed, or by the
            automatic block size, ``GenerationConfig.auto_block``); a cut (:meth:`kept`)
            leaves it as it ran. 0 where unknown (events made before it was recorded).
        reason: with the automatic block size, why the controller chose ``block``
            (``app.engine.block_control.Choice.reason``, one line, e.g. ``"block 6: 3.1 tok
            in 22 ms, 1.70x a plain step"``); "" for fixed blocks.
    """

    index: int
    drafted: int
    accepted: int
    committed: int
    replayed: bool
    draft_s: float
    verify_s: float
    rollback_s: float
    network_s: float = 0.0
    block: int = 0
    reason: str = ""

    def kept(self, n: int) -> CycleEvent | None:
        """This cycle as far as its first ``n`` committed tokens are kept (an end token, a
        stop string or Stop cut the block after them). A cut before the last committed token
        leaves only accepted drafts, so ``drafted``, ``accepted`` and ``committed`` all become
        ``n``: the drafts after the cut count neither as accepted nor as drafted. The seconds
        stay (they were spent). Itself when nothing was cut, None when nothing was kept."""
        if n >= self.committed:
            return self
        if n <= 0:
            return None
        return replace(self, drafted=min(self.drafted, n), accepted=min(self.accepted, n),
                       committed=n)


@dataclass
class Summary:
    """Figures for one finished generation (both paths fill every field).

    ``reused_tokens`` of the ``prompt_tokens`` came from the kept cache of an earlier turn
    (prefix reuse); only the rest were prefilled.

    Units: seconds, tokens, bytes. ``tok_per_s`` counts generated tokens over generation
    time only (prefill excluded: from the first token to the last). ``peak_memory_bytes``
    is ``mx.get_peak_memory()`` during the generation. ``fast_verify`` is True when the
    near-exact chunked verify ran (``GenerationConfig.fast_verify`` on a hybrid target).
    ``stage_timing`` is True when each cycle waited after every stage
    (``GenerationConfig.stage_timing``): only then are ``draft_s``, ``verify_s`` and
    ``rollback_s`` (and the shares derived from them) per-stage compute times; otherwise a
    greedy cycle waits once and ``verify_s`` holds that wait (see :class:`CycleEvent`).
    ``mode`` is ``dflash2`` when a DFlash2 drafter drafted (``app.engine.dflash2``).
    ``lookup_cycles``: DFlash cycles that verified prompt-lookup drafts instead of the
    drafter's (``GenerationConfig.lookup_drafts``; 0 otherwise).
    ``auto_block``: True when the block length was chosen per cycle
    (``GenerationConfig.auto_block``); ``block_lengths``: each cycle's block length L in order
    (:attr:`CycleEvent.block`; 1 is a plain step), as ``accepted_lengths`` holds each cycle's
    accepted drafts.
    ``network_wait_s`` and ``network_bytes``: for a target sharded over a group of processes
    (:mod:`app.engine.distributed`), the seconds rank 0 waited on the group (the other ranks'
    layers included) and the bytes put on the network, prefill included; 0 in one process.
    """

    mode: ModeName = Mode.PLAIN.value
    prompt_tokens: int = 0
    reused_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float = 0.0
    tok_per_s: float = 0.0
    cycles: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float | None = None
    tau: float | None = None
    replays: int = 0
    rollback_share: float | None = None
    draft_s: float = 0.0
    verify_s: float = 0.0
    rollback_s: float = 0.0
    prefill_s: float = 0.0
    total_s: float = 0.0
    peak_memory_bytes: int = 0
    stop_cause: StopCause = "length"
    error: str | None = None
    accepted_lengths: list[int] = field(default_factory=list)
    fast_verify: bool = False
    stage_timing: bool = False
    lookup_cycles: int = 0
    network_wait_s: float = 0.0
    network_bytes: int = 0
    auto_block: bool = False
    block_lengths: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready dict (the ``summary`` object of ``chat --json``)."""
        return asdict(self)

    # The figures arithmetic, in one place (the engine, the live panel and the bench use it).
    def add_cycle(self, ev: CycleEvent) -> None:
        """Count one DFlash cycle: its drafted and accepted tokens, replay, and seconds."""
        self.cycles += 1
        self.drafted += ev.drafted
        self.accepted += ev.accepted
        self.replays += int(ev.replayed)
        self.draft_s += ev.draft_s
        self.verify_s += ev.verify_s
        self.rollback_s += ev.rollback_s
        self.accepted_lengths.append(ev.accepted)
        self.block_lengths.append(ev.block)

    def counted_over(self, cycles: list[CycleEvent], committed: int) -> Summary:
        """A copy whose cycle counts (cycles, drafted, accepted, replays, accepted and block
        lengths) are those of ``cycles`` (the cycles as far as their tokens were kept,
        :meth:`CycleEvent.kept`) and whose rates follow (:meth:`set_rates` over ``committed``
        kept tokens after the first); the seconds stay as measured."""
        out = replace(self, cycles=0, drafted=0, accepted=0, replays=0, accepted_lengths=[],
                      block_lengths=[])
        seconds = (self.draft_s, self.verify_s, self.rollback_s)
        for ev in cycles:
            out.add_cycle(ev)
        out.draft_s, out.verify_s, out.rollback_s = seconds
        out.set_rates(committed)
        return out

    def set_rates(self, committed: int) -> None:
        """Derive ``tau`` (``committed`` tokens per cycle), ``acceptance_rate`` (accepted /
        drafted) and ``rollback_share`` (rollback / (draft + verify + rollback) seconds); None
        where the denominator is 0. ``committed``: tokens the cycles committed."""
        self.tau = committed / self.cycles if self.cycles else None
        self.acceptance_rate = self.accepted / self.drafted if self.drafted else None
        busy = self.draft_s + self.verify_s + self.rollback_s
        self.rollback_share = self.rollback_s / busy if busy > 0 else None

    @classmethod
    def pool(cls, summaries: list[Summary], mode: str = "dflash") -> Summary:
        """One summary over several runs: counts and seconds summed, rates derived from the
        sums (:meth:`set_rates`, the committed tokens being each run's generated tokens but
        its first, which the prefill produced); ``tok_per_s`` the runs' generated tokens over
        their generation seconds (each run's tokens / its tok/s, as :meth:`reply_total`
        counts them; runs without a rate left out), ``total_s`` and ``prefill_s`` summed."""
        out = cls(mode=mode)
        rated = [s for s in summaries if s.tok_per_s > 0]
        gen_s = sum(s.generated_tokens / s.tok_per_s for s in rated)
        out.tok_per_s = sum(s.generated_tokens for s in rated) / gen_s if gen_s > 0 else 0.0
        for s in summaries:
            out.total_s += s.total_s
            out.prefill_s += s.prefill_s
            out.generated_tokens += s.generated_tokens
            out.cycles += s.cycles
            out.drafted += s.drafted
            out.accepted += s.accepted
            out.replays += s.replays
            out.lookup_cycles += s.lookup_cycles
            out.network_wait_s += s.network_wait_s
            out.network_bytes += s.network_bytes
            out.auto_block = out.auto_block or s.auto_block
            out.draft_s += s.draft_s
            out.verify_s += s.verify_s
            out.rollback_s += s.rollback_s
        out.set_rates(sum(s.generated_tokens - 1 for s in summaries))
        return out

    @classmethod
    def reply_total(cls, rounds: list[Summary]) -> Summary:
        """The figures of one reply over its rounds (a tool reply runs one generation per
        round): counts, seconds, tok/s and accepted lengths as :meth:`pool` gives them; time
        to first token of the first round; the prompt of
        the last round (it holds the earlier rounds), the reuse of the first; the last
        round's stop cause. One round: that round's summary itself."""
        if len(rounds) == 1:
            return rounds[0]
        if not rounds:
            return cls()
        # the drafting mode of any round (a reply runs one mode over all its rounds)
        mode = next((r.mode for r in rounds if r.mode in DRAFTING_MODES), Mode.PLAIN.value)
        out = cls.pool(rounds, mode)
        first, last = rounds[0], rounds[-1]
        out.ttft_s = first.ttft_s
        out.prompt_tokens = last.prompt_tokens
        out.reused_tokens = first.reused_tokens
        out.peak_memory_bytes = max(r.peak_memory_bytes for r in rounds)
        out.stop_cause = last.stop_cause
        out.error = last.error
        out.accepted_lengths = [a for r in rounds for a in r.accepted_lengths]
        out.block_lengths = [b for r in rounds for b in r.block_lengths]
        return out

    @classmethod
    def continued(cls, before: Summary, after: Summary) -> Summary:
        """The figures of one generation that Max tokens cut (``before``) and that was then
        continued (``after``: the continuation's own run, whose prompt is ``before``'s
        prompt plus ``before``'s generated tokens). As :meth:`reply_total` over the two
        (counts and seconds summed, tok/s = generated tokens over the two runs' generation
        seconds, so the pause between them is not counted, time to first token and reuse of
        ``before``, ``after``'s stop cause), except the prompt: ``before``'s, since the
        continuation's prompt holds tokens counted here as generated."""
        out = cls.reply_total([before, after])
        out.prompt_tokens = before.prompt_tokens
        return out


@dataclass(frozen=True)
class Done:
    """The last event of every generation; carries the :class:`Summary`."""

    summary: Summary


Event = TokenEvent | CycleEvent | Done
