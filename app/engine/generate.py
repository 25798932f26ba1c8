"""Plain and DFlash generation, emitting the same event types (``app.engine.events``).

The DFlash cycle (Chen et al. 2026; ``shared/DFLASH_NOTES.md``, "The algorithm, one cycle"):

1. Prefill the prompt through the target, keeping the tap states of every prompt position; the
   first token comes from the last logits and is *pending* (not in the target cache).
2. Draft: the drafter turns ``[pending] + [mask] * (L-1)`` into L-1 draft tokens (argmax of the
   target's LM head over the drafter's states).
3. Verify: the target runs ``[pending] + drafts`` against its cache, giving logits and taps at
   every position.
4. Accept: greedy, ``accepted`` = index of the first draft that differs from the target's argmax
   (L-1 if none); with sampling, the target *samples* each position (its logits processors see
   the true history) and drafts are accepted while they equal the sample, which leaves the
   output distribution exactly that of plain sampling (the notes' option 1). Commit
   ``drafts[:accepted] + [target's token at accepted]``.
5. Roll back to ``prefix + accepted + 1`` positions: attention caches are trimmed; recurrent
   (Gated DeltaNet) layers are restored to their pre-verify state and, under ``tape``, re-run
   through the recurrence only over the committed positions (``GDNTape.rollback``), or, under
   ``replay``, the committed tokens go through the whole target again (the seed fix).
6. The next draft is conditioned on the verify taps of the committed positions.

DFlash2 drafters (:mod:`app.engine.dflash2`, ``drafter.config.kind == "dflash2"``) run the same
cycle; their draft is the candidate selector's walk. Greedy, acceptance is the rule of step 4
(exact in the same sense). With temperature > 0 the walk samples its proposal and keeps its
probabilities ``q``; a draft ``x`` is then accepted with probability ``min(1, p(x) / q(x))``
and a rejected slot draws from ``max(p - q, 0)`` over the whole vocabulary
(:func:`app.engine.dflash2.accept_sampled`; standard speculative sampling, exact in
distribution). The DFlash rule above is unchanged for DFlash drafters.

The bonus token is never in the target cache at the end of a cycle; an end token inside a
committed block ends generation there; no token is dropped because its id is ``mask_token_id``.

One host read per cycle (greedy): the draft is queued (``mx.async_eval``), the verify pass is
built on it, and acceptance is computed on the device (:func:`greedy_acceptance`: the
cumulative product of ``drafts == argmax``, summed). The host then reads one small array,
the accepted count and the target's choices (:func:`host_read`), which is all it needs to
emit the committed tokens and size the rollback. The rollback is queued, not waited for; the
next cycle's draft and verify are built on the rolled-back caches and their work is queued
behind it, so the only wait of a cycle is that read. Sampled runs read the drafts and choose
each position on the host as before (the logits processors need the token history).
``GenerationConfig.stage_timing`` waits after each stage instead, to time draft, verify and
rollback separately (more syncs, the same tokens).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from app.engine import costs as _costs
from app.engine import dflash2 as _d2
from app.engine.block_control import BlockController
from app.engine.errors import GenerationError
from app.engine.events import CycleEvent, Done, Summary, TokenEvent
from app.engine.kernels import gdn_kernel, kernel_prebuild
from app.engine.lookup import DEFAULT_BLOCK, DraftLength, NgramIndex
from app.engine.modes import DRAFTING_MODES, MODES, ROLLBACKS, Mode, ModeName, drafter_mode
from app.engine.prefix import PromptCache
from app.engine.rollback import VerifyCheckpoint
from app.engine.target import TargetRunner, cache_arrays
from app.engine.threads import check_engine_thread


@dataclass
class GenerationConfig:
    """Settings for one generation (both paths take the same ones).

    Attributes:
        mode: ``plain``, ``dflash``, ``dflash2`` or ``lookup``. ``dflash`` runs whichever
            draft the drafter has (a DFlash2 drafter gives a DFlash2 run, reported as
            ``dflash2``); ``dflash2`` requires a DFlash2 drafter; ``lookup`` drafts by prompt
            lookup (:mod:`app.engine.lookup`) and needs no drafter.
        max_tokens: generated tokens at most (the end token counts). Its default is the
            app's (``app.chat.settings.SPECS["max_tokens"]``, which the engine cannot import:
            ``tests/test_settings.py`` holds the two equal).
        block_size: DFlash block size (1..the drafter's ``block_size``; None = the drafter's);
            in ``lookup`` mode the pending token plus at most ``block_size - 1`` looked-up
            drafts (None = :data:`app.engine.lookup.DEFAULT_BLOCK`).
        rollback: ``tape`` (re-run the recurrence only) or ``replay`` (re-run the target).
        temperature, top_p, top_k, min_p: mlx-lm's ``make_sampler`` settings; 0 = greedy.
            The engine refuses only what the sampler cannot run (e.g. a temperature below 0
            or not finite); the app's settings offer a narrower range (temperature 0 to 2,
            ``app.chat.settings.SPECS``), which lies inside this one.
        repetition_penalty: mlx-lm's ``make_logits_processors`` setting (None = off).
        repetition_context_size: tokens the penalty looks back over (mlx-lm's default 20).
        seed: seeds ``mx.random`` at the start for a reproducible sampled run.
        prefill_step: prompt tokens per prefill chunk (both paths use the same chunks).
        fast_verify: opt-in, near-exact. Verify passes run the Gated DeltaNet recurrence in
            the chunked (parallel-in-time) form of :mod:`app.engine.gdn_chunked` instead of
            mlx-lm's step loop. Its rounding differs from the step loop's and reaches the
            attention K/V and the deeper layers' inputs of the committed positions, so tokens
            and cached state can differ from plain decoding (measured: 4-bit targets diverge
            within 40 tokens in about 1 run in 3; float32 caches differ by up to 5e-5). Off
            (the default) the verify pass runs the same per-position arithmetic as one-token
            steps. Only hybrid targets are affected.
        selector: DFlash2 only: False scores the selector's candidates by their logits alone
            (no bigram term: "selector off", for comparisons). Exactness does not depend on it.
        stage_timing: DFlash only, for measurements: wait for the device after the draft,
            the verify and the rollback of every cycle so that ``CycleEvent.draft_s``,
            ``verify_s`` and ``rollback_s`` are each stage's compute time. Off (the default)
            a greedy cycle waits once, at its host read: ``draft_s`` and ``rollback_s`` are
            then the seconds spent queueing those stages and ``verify_s`` holds the wait for
            the device (the previous rollback, the draft, the verify). Tokens and caches do not
            depend on it.
        lookup_drafts: opt-in, DFlash drafters only (not DFlash2): in a cycle where prompt
            lookup (:mod:`app.engine.lookup`) matches the last 3 tokens and offers a whole
            block of drafts, and the drafter's previous block was not wholly accepted, those
            looked-up tokens are verified instead of the drafter's block (the drafter does not
            run that cycle; its context catches up at its next draft). Exact as any draft
            (verify and rollback are the same); ``Summary.lookup_cycles`` counts such cycles.
        auto_block: opt-in, ``dflash`` and ``dflash2``: the block length is chosen before
            each cycle (:class:`app.engine.block_control.BlockController`), from 1 (no draft:
            one plain step of the target) up to ``block_size`` (None: the drafter's), to
            maximise expected tokens per second from the recent acceptance lengths and the
            pair's measured costs (:mod:`app.engine.costs`, measured on the first such reply
            of a loaded pair, about a second on the bundled demo pair on a CPU); a reply starts
            from what the pair's previous such reply learned (greedy and sampled replies
            apart). Exact as any
            block size (the verify pass decides every token); ``CycleEvent.block`` and
            ``Summary.block_lengths`` record the blocks used. Ignored by ``plain`` and
            ``lookup`` (whose draft length adapts by its own rule).
    """

    mode: ModeName = Mode.PLAIN.value
    max_tokens: int = 512
    block_size: int | None = None
    rollback: Literal["tape", "replay"] = "tape"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    seed: int | None = None
    prefill_step: int = 512
    fast_verify: bool = False
    selector: bool = True
    stage_timing: bool = False
    lookup_drafts: bool = False
    auto_block: bool = False

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax with no logits processor."""
        return self.temperature <= 0 and not self.repetition_penalty


class _CancelFlag:
    """A :class:`threading.Event`-like flag (``set``, ``is_set``) that also reads as set
    once any watched event is: a generation's own cancel plus its caller's stop request."""

    def __init__(self) -> None:
        self._own = threading.Event()
        self._watched: list[threading.Event] = []

    def set(self) -> None:
        self._own.set()

    def watch(self, event: threading.Event) -> None:
        self._watched.append(event)

    def is_set(self) -> bool:
        return self._own.is_set() or any(e.is_set() for e in self._watched)


class Generation:
    """An iterator of :class:`TokenEvent`, :class:`CycleEvent` and a final :class:`Done`.

    Iterate it on the thread that owns MLX. :meth:`cancel` may be called from any thread; it
    takes effect before the next DFlash cycle or plain-path token, or during the prefill after
    the chunk in hand (``GenerationConfig.prefill_step`` positions; the kept caches are then
    dropped), and the run then ends with ``Done`` whose ``stop_cause`` is ``cancelled``. An
    unexpected exception ends the run with ``stop_cause == "error"`` and the message in
    ``summary.error``; that summary is the run's own (``partial``: its mode and what it
    counted before the failure).
    """

    def __init__(self, body, partial: Summary | None = None):
        self._cancel = _CancelFlag()
        self._body = body
        self._partial = partial
        self.summary: Summary | None = None

    def cancel(self) -> None:
        """Ask the generation to stop (thread-safe)."""
        self._cancel.set()

    def cancel_on(self, event: threading.Event) -> None:
        """Stop also when ``event`` is set (from any thread), checked wherever :meth:`cancel`
        is: between prefill chunks too, where the run yields no event a caller could react
        to. ``event`` itself is never set here (a stop string's :meth:`cancel` leaves it
        alone). Call before iterating."""
        self._cancel.watch(event)

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancel.is_set()

    def __iter__(self) -> Iterator:
        summary = None
        try:
            for ev in self._body(self._cancel):
                if isinstance(ev, Done):
                    summary = ev.summary
                yield ev
        except PrefillCancelled:  # the caches were dropped (_clear_on_error)
            summary = self._partial if self._partial is not None else Summary()
            summary.stop_cause = "cancelled"
            yield Done(summary)
        except Exception as exc:  # surfaced as a Done(error), never a crash of the caller
            summary = self._partial if self._partial is not None else Summary()
            summary.stop_cause = "error"
            summary.error = f"{type(exc).__name__}: {exc}"
            if summary.cycles:
                summary.set_rates(max(0, summary.generated_tokens - 1))
            yield Done(summary)
        self.summary = summary


def _make_choose(config: GenerationConfig):
    """A function ``(logits (V,), history list[int]) -> int`` applying processors + sampler."""
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    sampler = make_sampler(config.temperature, config.top_p, config.min_p, 1, config.top_k)
    processors = make_logits_processors(
        None, config.repetition_penalty, config.repetition_context_size
    )

    def choose(logits: mx.array, history: list[int]) -> int:
        logits = logits[None]
        if processors:
            tokens = mx.array(history, dtype=mx.int32)
            for proc in processors:
                logits = proc(tokens, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return int(sampler(logprobs).item())

    return choose


def host_read(a: mx.array) -> list:
    """Wait for ``a`` and copy it to the host: the DFlash cycle's one host synchronisation.

    Args:
        a: a small lazy array (here the ``(L + 1,)`` int32 of :func:`greedy_acceptance`).

    Returns:
        ``a.tolist()``: Python ints for an integer array.
    """
    return a.tolist()


def greedy_acceptance(drafts: mx.array | None, logits: mx.array) -> mx.array:
    """Greedy acceptance on the device, lazily: ``[accepted, *argmax(logits)]``.

    Args:
        drafts: ``(L-1,)`` int32 draft tokens, or None when nothing was drafted (L = 1).
        logits: ``(L, V)`` the verify pass's logits at the block's positions (the pending
            token and the drafts).

    Returns:
        ``(L + 1,)`` int32: element 0 is ``accepted``, the index of the first draft that
        differs from the target's argmax (L-1 when none does), i.e. the sum of the cumulative
        product of ``drafts == argmax[:L-1]``; elements 1..L are the target's argmax token at
        each block position (the committed tokens are ``argmax[:accepted + 1]``). Argmax ties
        go to the lowest id, as ``mx.argmax`` on one-token steps.
    """
    choice = mx.argmax(logits, axis=-1).astype(mx.int32)
    if drafts is None or drafts.shape[0] == 0:
        accepted = mx.zeros((1,), dtype=mx.int32)
    else:
        match = (drafts.astype(mx.int32) == choice[: drafts.shape[0]]).astype(mx.int32)
        accepted = mx.cumprod(match).sum(keepdims=True).astype(mx.int32)
    return mx.concatenate([accepted, choice])


def sampled_acceptance(choose, logits: mx.array, drafts: list[int],
                       history: list[int]) -> tuple[int, int]:
    """Acceptance of ``drafts`` when the target samples (or any ``choose`` other than the
    device argmax): the target's choice at each block position, drafts accepted while they
    equal it. Exact in distribution, since every kept token is the target's own sample.

    Args:
        choose: ``choose(logits_row, history) -> int``, the target's token at one position.
        logits: ``(1, L, V)`` the verify pass's logits (evaluated), L >= len(drafts) + 1.
        drafts: the drafted tokens (may be empty).
        history: the tokens so far (prompt and reply), for penalties.

    Returns:
        ``(accepted, bonus)``: drafts accepted, and the target's token after them.
    """
    for i in range(len(drafts) + 1):
        y = choose(logits[0, i], history + drafts[:i])
        if i == len(drafts) or drafts[i] != y:
            return i, y
    raise AssertionError("unreachable")  # the loop returns at i == len(drafts) at the latest


def cut_at_end_token(committed: list[int], flags: list[bool],
                     eos: set[int]) -> tuple[list[int], list[bool], str | None]:
    """``committed`` (and its drafted ``flags``) cut after the first end token in ``eos``,
    with the stop cause ``"end_token"``; unchanged with None when there is none."""
    for j, tok in enumerate(committed):
        if tok in eos:
            return committed[: j + 1], flags[: j + 1], "end_token"
    return committed, flags, None


def _emit_cycle(s, committed: list[int], flags: list[bool], cycle, stop: str | None,
                max_tokens: int):
    """Yield one drafting cycle's committed tokens (``TokenEvent``, ``flags``: drafted or
    not) and its ``CycleEvent`` (counted as far as an end token inside the block:
    ``CycleEvent.kept``), adding them to the summary ``s``. Returns True when the run ends
    there: ``stop`` (e.g. ``"end_token"``) or ``max_tokens`` reached, with ``s.stop_cause``
    set; use as ``if (yield from _emit_cycle(...)): break``."""
    for tok, flag in zip(committed, flags):
        yield TokenEvent(tok, s.generated_tokens, flag)
        s.generated_tokens += 1
    cycle = cycle.kept(len(committed))
    s.add_cycle(cycle)
    yield cycle
    if stop or s.generated_tokens >= max_tokens:
        s.stop_cause = stop or "length"
        return True
    return False


def _chunks(start: int, end: int, step: int, cuts: list[int]) -> list[tuple[int, int]]:
    """Split ``[start, end)`` into chunks of at most ``step`` that also break at ``cuts``."""
    edges = sorted({start, end, *(c for c in cuts if start < c < end)})
    out = []
    for a, b in zip(edges, edges[1:]):
        out += [(i, min(i + step, b)) for i in range(a, b, step)]
    return out


class PrefillCancelled(Exception):
    """A cancel was asked while the prompt was being prefilled: raised between two chunks by
    :func:`_prefill`; the kept caches, which hold part of the prompt, are dropped
    (:func:`_clear_on_error`) and the run ends with ``stop_cause == "cancelled"``."""


def _prefill(forward, ids: list[int], start: int, step: int, want_taps: bool, snap=None,
             cuts: list[int] = (), cancel: threading.Event | None = None):
    """Run ``ids[start:]`` in chunks (breaking at ``cuts``); ``snap(pos)`` after each cut and
    at the end. Returns (last logits (V,), taps of the prefilled positions or None).

    Raises:
        PrefillCancelled: ``cancel`` was set when a chunk before the last one ended.
    """
    taps_parts = []
    logits = None
    chunks = _chunks(start, len(ids), step, list(cuts))
    for a, b in chunks:
        chunk = mx.array([ids[a:b]], dtype=mx.int32)
        logits, taps = forward(chunk, b == len(ids))
        if want_taps:
            taps_parts.append(taps)
            mx.eval(taps)
        mx.eval(logits)
        if snap is not None and (b in cuts or b == len(ids)):
            snap(b)
        if cancel is not None and cancel.is_set() and b < len(ids):
            raise PrefillCancelled(f"cancelled after prefilling {b} of {len(ids)} positions")
    taps_all = None
    if want_taps:
        taps_all = taps_parts[0] if len(taps_parts) == 1 else mx.concatenate(taps_parts, 1)
    return logits[0, -1], taps_all


def _summary_common(s: Summary, t_start: float, t_first: float | None, t_end: float) -> None:
    s.total_s = t_end - t_start
    s.ttft_s = (t_first - t_start) if t_first is not None else 0.0
    s.prefill_s = s.ttft_s
    gen_time = t_end - t_first if t_first is not None else 0.0
    s.tok_per_s = (s.generated_tokens - 1) / gen_time if s.generated_tokens > 1 and gen_time > 0 else 0.0
    s.peak_memory_bytes = int(mx.get_peak_memory())


def _check_sampling(config: GenerationConfig, target) -> None:
    """Refuse sampling settings that mlx-lm's sampler would reject mid-generation.

    Raises:
        GenerationError: naming the setting and its valid range.
    """
    import math

    def bad(name, value, valid):
        raise GenerationError(f"{name} {value!r} is invalid: it must be {valid}")

    if not config.temperature >= 0 or math.isinf(config.temperature):
        bad("temperature", config.temperature, "a number >= 0")
    if not 0 < config.top_p <= 1:
        bad("top_p", config.top_p, "in (0, 1]")
    if not 0 <= config.min_p <= 1:
        bad("min_p", config.min_p, "in [0, 1]")
    vocab = int(target.model.model.embed_tokens.weight.shape[0])
    if not 0 <= config.top_k < vocab:
        bad("top_k", config.top_k, f"0 (off) or below the vocabulary size {vocab}")
    if config.repetition_penalty is not None and not config.repetition_penalty > 0:
        bad("repetition_penalty", config.repetition_penalty, "a number > 0")
    if config.seed is not None and not 0 <= config.seed < 2**63:
        bad("seed", config.seed, "an integer in [0, 2**63)")


def generate(
    target,
    prompt_ids: list[int],
    config: GenerationConfig,
    drafter=None,
    session: PromptCache | None = None,
    boundaries: list[int] = (),
) -> Generation:
    """Start a generation (lazily: nothing runs until the result is iterated).

    Args:
        target: :class:`~app.models.loader.LoadedTarget`.
        prompt_ids: the rendered prompt's token ids (non-empty).
        config: :class:`GenerationConfig`.
        drafter: :class:`~app.models.loader.LoadedDrafter`, required for ``mode="dflash"``
            and ``"dflash2"`` (``lookup`` and ``plain`` need none).
        session: a :class:`~app.engine.prefix.PromptCache` kept across turns: the common prefix
            with its ids is reused, and the caches are stored back at the end.
        boundaries: prompt positions (e.g. the end of the history before the generation
            prompt) where the recurrent state is snapshotted for later reuse.

    Raises:
        GenerationError: empty prompt, no drafter for DFlash, ``dflash2`` without a DFlash2
            drafter, a block size outside
            1..drafter block size, an unknown mode or rollback strategy.
        UnsupportedArchitectureError: DFlash or lookup on a target family without tap
            capture.
    """
    check_engine_thread()
    if not prompt_ids:
        raise GenerationError("the prompt is empty")
    if getattr(target, "shard", None) is not None:
        session = None  # the other ranks keep no prefix cache: every reply prefills
    _check_sampling(config, target)
    if config.max_tokens < 1:
        raise GenerationError("max_tokens must be at least 1")
    if config.mode == Mode.PLAIN:
        summary = Summary(mode="plain", prompt_tokens=len(prompt_ids))
        return Generation(
            lambda cancel: _clear_on_error(
                _plain_body(target, list(prompt_ids), config, cancel, session, boundaries,
                            drafter, summary),
                session, getattr(target, "shard", None),
            ),
            summary,
        )
    if config.mode not in DRAFTING_MODES:
        raise GenerationError(f"unknown mode {config.mode!r} ({', '.join(MODES)})")
    if config.rollback not in ROLLBACKS:
        raise GenerationError(f"unknown rollback strategy {config.rollback!r} (tape or replay)")
    if config.mode == Mode.LOOKUP:
        block = config.block_size or DEFAULT_BLOCK
        if block < 1:
            raise GenerationError(f"block size {block} must be at least 1")
        runner = target_runner(target, config.fast_verify)
        summary = Summary(mode="lookup", prompt_tokens=len(prompt_ids))
        return Generation(
            lambda cancel: _clear_on_error(
                _lookup_body(target, runner, list(prompt_ids), config, block, cancel, session,
                             boundaries, summary),
                session, getattr(target, "shard", None),
            ),
            summary,
        )
    if drafter is None:
        raise GenerationError("DFlash needs a drafter; load one or use plain mode")
    if config.mode == Mode.DFLASH2 and drafter_mode(drafter) is not Mode.DFLASH2:
        raise GenerationError(
            "DFlash2 mode needs a DFlash2 drafter (DFlash2DraftModel); this one is DFlash: "
            "use mode dflash"
        )
    block = config.block_size or drafter.config.block_size
    if not 1 <= block <= drafter.config.block_size:
        raise GenerationError(
            f"block size {block} is outside 1..{drafter.config.block_size} for this drafter"
        )
    runner = target_runner(target, config.fast_verify)
    v2 = drafter_mode(drafter) is Mode.DFLASH2
    summary = Summary(mode="dflash2" if v2 else "dflash", prompt_tokens=len(prompt_ids))
    return Generation(
        lambda cancel: _clear_on_error(
            _dflash_body(
                target, runner, drafter, list(prompt_ids), config, block, cancel, session,
                boundaries, summary,
            ),
            session, getattr(target, "shard", None),
        ),
        summary,
    )


def target_runner(target, fast_verify: bool = False) -> TargetRunner:
    """The :class:`TargetRunner` for ``target``: a new one, or for a target sharded over a
    group of processes (``target.shard``, :mod:`app.engine.distributed`) its one runner, set
    to ``fast_verify``.

    Raises:
        UnsupportedArchitectureError: a family without tap capture.
    """
    shard = getattr(target, "shard", None)
    if shard is not None:
        shard.fast_verify = bool(fast_verify) and shard.hybrid
        return shard
    return TargetRunner(target.model, target.model_type, fast_verify=fast_verify)


def _network_wait(runner: TargetRunner) -> float:
    """Seconds a sharded target's runner has waited on its group so far (0 in one
    process)."""
    traffic = getattr(runner, "traffic", None)
    return traffic.wait_s if traffic is not None else 0.0


def _checkpoint(runner: TargetRunner, cache: list, strategy: str, queue) -> VerifyCheckpoint:
    """The rollback unit of ``runner``'s verify passes (a sharded target's rolls back on
    every rank)."""
    make = getattr(runner, "checkpoint", None)
    return make(cache, strategy, queue) if make is not None else VerifyCheckpoint(
        runner, cache, strategy, queue)


def _start(session: PromptCache | None, prompt: list[int], need_drafter: bool) -> int:
    """Reused prompt tokens (0 without a session or a usable prefix)."""
    return session.prepare(prompt, need_drafter) if session is not None else 0


def _clear_on_error(body: Iterator, session: PromptCache | None, shard=None) -> Iterator:
    """Run ``body``; if it fails, drop the kept caches, which may be half-updated. For a
    target sharded over a group (``shard``, :mod:`app.engine.distributed`), the run's
    network figures go into its ``Done`` summary (``network_wait_s``, ``network_bytes``)."""
    start = (shard.traffic.wait_s, shard.traffic.bytes_sent) if shard is not None else None
    try:
        for ev in body:
            if start is not None and isinstance(ev, Done):
                ev.summary.network_wait_s = shard.traffic.wait_s - start[0]
                ev.summary.network_bytes = shard.traffic.bytes_sent - start[1]
            yield ev
    except BaseException:
        if session is not None:
            session.clear()
        raise


def _begin(config: GenerationConfig, summary: Summary):
    """Common start of both paths: seed, peak-memory reset, the sampler; returns
    ``(summary, choose, start time)`` (``summary`` is the run's, made by :func:`generate`
    so that a run that fails still reports its mode and counts)."""
    if config.seed is not None:
        mx.random.seed(config.seed)
    mx.reset_peak_memory()
    choose = None if config.greedy else _make_choose(config)
    return summary, choose, time.perf_counter()


def _tap_keeper(target, drafter, session: PromptCache | None, start: int):
    """For a plain generation with a drafter loaded and a kept session: ``(runner, taps)`` when
    plain decoding should record the drafter's tap states, so that a later DFlash turn reuses
    the prefix (its drafter context covers the plain turn too); else None.

    Only when the drafter's kept context covers exactly the reused prefix (or nothing is
    reused), since the taps of reused positions are not kept anywhere."""
    if drafter is None or session is None or not hasattr(drafter.model, "extend_context"):
        return None
    if start and session.drafter_cache is None:
        return None
    try:
        runner = target_runner(target)
    except Exception:  # a family without tap capture: plain as usual
        return None
    return runner, list(drafter.config.target_layer_ids)


def _shared_kernel_runner(target) -> TargetRunner | None:
    """For plain decoding of a hybrid target while the project's CUDA GDN kernel is active
    (:func:`app.engine.kernels.gdn_kernel.kernel_active`): a :class:`TargetRunner`, so that plain steps
    run the same recurrence kernel as DFlash's verify passes (bit-for-bit the same tokens and
    state). Else None: mlx-lm's model call, which on the CPU and Apple GPUs computes exactly
    what the runner computes. A target sharded over a group (``target.shard``) always runs
    through its runner."""
    if getattr(target, "shard", None) is not None:
        return target.shard
    if not gdn_kernel.kernel_active():
        return None
    try:
        runner = TargetRunner(target.model, target.model_type)
    except Exception:  # a family without tap capture: mlx-lm's call
        return None
    return runner if runner.hybrid else None


def _plain_body(target, prompt, config, cancel, session, boundaries, drafter=None,
                summary: Summary | None = None) -> Iterator:
    model = target.model
    eos = target.eos_token_ids
    s, choose, t_start = _begin(config, summary or Summary(mode="plain",
                                                           prompt_tokens=len(prompt)))
    s.reused_tokens = start = _start(session, prompt, False)
    keeper = _tap_keeper(target, drafter, session, start)
    shared = None if keeper is not None else _shared_kernel_runner(target)
    if start:
        cache = session.target_cache
    elif getattr(target, "shard", None) is not None:
        cache = target.shard.make_cache()  # every rank starts an empty cache
    else:
        cache = make_prompt_cache(model)
    snap = (lambda pos: session.snapshot(pos, cache)) if session is not None else None
    kept: list[mx.array] = []  # tap states of every position fed to the target, in order

    def step(ids: mx.array) -> mx.array:
        """Logits ``(1, S, V)`` of feeding ``ids`` ``(1, S)``; records their taps if kept."""
        if shared is not None:
            return shared.forward(ids, cache)[0]
        if keeper is None:
            return model(ids, cache=cache)
        logits, taps = keeper[0].forward(ids, cache, taps=keeper[1])
        kept.append(taps)
        return logits

    def fwd(chunk, last):
        logits = step(chunk)
        if kept:
            mx.eval(kept[-1])
        return logits, None

    logits, _ = _prefill(fwd, prompt, start, config.prefill_step, False, snap, boundaries,
                         cancel)
    history = list(prompt)
    cache_ids = list(prompt)
    t_first = None
    pending = mx.argmax(logits) if choose is None else None
    while True:
        if choose is None:
            # Greedy: queue the next forward on the not-yet-read token before reading it, so
            # building the graph overlaps the computation (as mlx-lm's generate_step does).
            ahead = s.generated_tokens + 1 < config.max_tokens and not cancel.is_set()
            current = pending
            if ahead:
                pending = mx.argmax(step(current.reshape(1, 1))[0, -1])
                mx.async_eval(pending, *kept[-1:])
            y = int(current.item())
            if ahead:
                cache_ids.append(y)
        else:
            y = choose(logits, history)
        if t_first is None:
            t_first = time.perf_counter()
        history.append(y)
        yield TokenEvent(y, s.generated_tokens, False)
        s.generated_tokens += 1
        if y in eos:
            s.stop_cause = "end_token"
            break
        if s.generated_tokens >= config.max_tokens:
            s.stop_cause = "length"
            break
        if cancel.is_set():
            s.stop_cause = "cancelled"
            break
        if choose is not None:
            logits = step(mx.array([[y]], dtype=mx.int32))[0, -1]
            cache_ids.append(y)
    t_end = time.perf_counter()
    if session is not None:
        # the target's other drafters' contexts follow this turn too (PromptCache.update_kept)
        session.update_kept(start, cache_ids, kept, keeper[1] if keeper is not None else ())
        if keeper is not None and kept:
            # the drafter's context over this turn: what a DFlash turn after it reuses
            dcache = session.drafter_cache if start else drafter.model.make_cache()
            drafter.model.extend_context(mx.concatenate(kept, axis=1), dcache)
            session.store(cache_ids, cache, dcache, int(dcache[0].offset))
        else:
            session.store(cache_ids, cache, None, 0)
    _summary_common(s, t_start, t_first, t_end)
    yield Done(s)


def _dflash_body(target, runner: TargetRunner, drafter, prompt, config, block: int, cancel,
                 session, boundaries, summary: Summary | None = None) -> Iterator:
    if kernel_prebuild.background_running():  # MLX's CUDA backend, right after a warm-up
        kernel_prebuild.wait_background_for(kernel_prebuild.recipes_for(target, [drafter]))
    dmodel, dcfg = drafter.model, drafter.config
    eos = target.eos_token_ids
    taps = dcfg.target_layer_ids
    v2 = drafter_mode(dcfg) is Mode.DFLASH2
    # DFlash2 at temperature > 0: sampled walk + min(1, p/q) acceptance (module docstring)
    speculative = v2 and config.temperature > 0
    probs = _d2.make_target_probs(config) if speculative else None
    # opt-in: the block length per cycle from acceptance and measured costs (GenerationConfig);
    # the pair's first such reply measures the costs here, before the reply's clock starts
    control = None
    if config.auto_block:
        control = BlockController(_costs.model_for(runner, target.model, drafter,
                                                   config.rollback, getattr(target, "path", None)),
                                  block)
        kind = "greedy" if config.greedy else "sampled"
        control.restore(_costs.known_state(drafter, target.model, kind))  # the last reply
    s, choose, t_start = _begin(config, summary or Summary(
        mode="dflash2" if v2 else "dflash", prompt_tokens=len(prompt)))
    s.fast_verify = runner.fast_verify
    s.stage_timing = config.stage_timing
    s.reused_tokens = start = _start(session, prompt, True)
    if start:
        cache, dcache = session.target_cache, session.drafter_cache
    else:
        cache, dcache = runner.make_cache(), dmodel.make_cache()
    snap = (lambda pos: session.snapshot(pos, cache)) if session is not None else None

    def fwd(chunk, last):
        return runner.forward(chunk, cache, taps=taps, all_logits=False)

    logits, ctx_taps = _prefill(fwd, prompt, start, config.prefill_step, True, snap, boundaries,
                               cancel)
    # tap states of every position this turn adds, for the other drafters' kept contexts
    # (PromptCache.update_kept); held only when there are such contexts
    turn_taps = [ctx_taps] if session is not None and session.kept_contexts else None
    extend = getattr(dmodel, "extend_context", None)
    if extend is not None:  # the drafter's context over the prompt is prefill work too
        extend(ctx_taps, dcache)
        mx.eval(cache_arrays(dcache))
        ctx_taps = None
    # tap states the drafter has not read yet, joined when it next drafts (a run of plain
    # steps under the automatic block size adds one part per step)
    ctx_parts: list[mx.array] = [] if ctx_taps is None else [ctx_taps]
    s.auto_block = control is not None
    history = list(prompt)
    cache_ids = list(prompt)
    pending = int(mx.argmax(logits).item()) if choose is None else choose(logits, history)
    t_first = time.perf_counter()
    history.append(pending)
    yield TokenEvent(pending, 0, False)
    s.generated_tokens = 1
    if pending in eos:
        s.stop_cause = "end_token"
    elif s.generated_tokens >= config.max_tokens:
        s.stop_cause = "length"
    else:
        # Greedy (DFlash or DFlash2): acceptance is computed on the device and the host reads
        # one small array per cycle (module docstring, "One host read per cycle").
        on_device = choose is None and not speculative
        staged = config.stage_timing
        queue = mx.eval if staged else mx.async_eval
        checkpoint = _checkpoint(runner, cache, config.rollback, queue)
        # opt-in: long prompt-lookup matches replace the drafter's block (GenerationConfig)
        index = NgramIndex(history) if config.lookup_drafts and not v2 else None
        last_full = True  # the drafter's previous block was wholly accepted
        # auto: a plain step already queued on the previous plain step's lazy token, as plain
        # decoding queues its next step (its logits and taps), or None
        ahead = None
        while True:
            if cancel.is_set():
                s.stop_cause = "cancelled"
                break
            remaining = config.max_tokens - s.generated_tokens
            ctx_len = len(cache_ids)
            if ahead is not None:  # decided by the previous cycle: a plain step
                L = 1
            elif control is not None:
                L = control.choose(ctx_len, remaining)
            else:
                L = min(block, remaining)
            # why this length, for the window's live panel (auto only; the choice made it)
            why = control.last.reason if control is not None and control.last is not None \
                else ""
            waited = _network_wait(runner)
            # Draft (queued; the host reads its tokens only where acceptance is on the host)
            t0 = time.perf_counter()
            if L > 1 and len(ctx_parts) > 1:
                ctx_parts = [mx.concatenate(ctx_parts, axis=1)]
            ctx_taps = ctx_parts[0] if ctx_parts else None
            block_ids = mx.array([pending], dtype=mx.int32)
            proposed = cand = q = None
            looked: list[int] = []
            if index is not None and L > 1 and not last_full:
                looked, n_match = index.match(L - 1)
                if n_match < index.max_n or len(looked) < L - 1:
                    looked = []
            if looked:
                proposed = mx.array(looked, dtype=mx.int32)
                s.lookup_cycles += 1
            elif L > 1 and v2:
                proposed, cand, q = dmodel.propose(
                    runner, pending, L, ctx_taps, dcache,
                    temperature=config.temperature if speculative else 0.0,
                    selector=config.selector,
                )
                queue(proposed, cand, *([] if q is None else [q]))
            elif L > 1:
                proposed = mx.array(dmodel.draft(runner, pending, L, ctx_taps, dcache))
                queue(proposed)  # computes while the verify graph is built below
            if proposed is not None:
                proposed = proposed.astype(mx.int32)
                block_ids = mx.concatenate([block_ids, proposed])
                if not looked:  # the drafter read the context; else it catches up next time
                    ctx_parts = []
            n_drafts = L - 1 if proposed is not None else 0
            # Verify (without drafts: one plain step, nothing to roll back)
            verify_ids = block_ids[None]
            if ahead is not None:
                (vlogits, vtaps), ahead = ahead, None
            else:
                vlogits, vtaps = runner.forward(
                    verify_ids, cache, taps=taps,
                    tapes=checkpoint.begin(verify_ids) if proposed is not None else None)
            t1 = time.perf_counter()
            if on_device:
                packed = greedy_acceptance(proposed, vlogits[0])
                queue(packed, vtaps)
                if (control is not None and proposed is None and not staged and remaining > 1
                        and not cancel.is_set() and control.choose(ctx_len + 1, remaining - 1) == 1):
                    # the next cycle is a plain step too: queue it on this step's lazy token
                    # before reading it, so building it overlaps the computation
                    ahead = runner.forward(packed[1:2].reshape(1, 1), cache, taps=taps)
                    queue(*ahead)
                accepted, *choice = host_read(packed)  # the cycle's one host synchronisation
                bonus = choice[accepted]
                drafts = choice[:accepted]  # the accepted drafts equal the target's choices
            else:
                drafts: list[int] = proposed.tolist() if proposed is not None else []
                mx.eval(vlogits, vtaps)
                if speculative:
                    accepted, bonus = _d2.accept_sampled(
                        probs, vlogits[0], drafts, cand, q, history, choose
                    ) if drafts else (0, choose(vlogits[0, 0], history))
                else:
                    accepted, bonus = sampled_acceptance(choose, vlogits, drafts[: L - 1],
                                                         history)
            t2 = time.perf_counter()
            committed, flags, stop = cut_at_end_token(drafts[:accepted] + [bonus],
                                                      [True] * accepted + [False], eos)
            # Keep prefix + len(committed) positions: the pending token and the committed ones
            # but the last (an accepted end token leaves no later draft in the cache). The
            # rollback is queued, not waited for: the next cycle's draft and verify are built
            # on it and its work runs before theirs.
            n = len(committed)
            replayed = checkpoint.commit(n) if proposed is not None else False
            t3 = time.perf_counter()
            if control is not None and not looked:
                control.update(L, n_drafts, accepted, t3 - t0, ctx_len)
            # taps of the positions now in the target cache; kept until the drafter reads them
            kept = vtaps[:, :n]
            if turn_taps is not None:
                turn_taps.append(kept)
            ctx_parts.append(kept)
            cache_ids.append(pending)
            cache_ids.extend(committed[: n - 1])
            history.extend(committed)
            if index is not None:
                index.extend(committed)
                if not looked:
                    last_full = accepted >= n_drafts
            pending = committed[-1]
            cycle = CycleEvent(s.cycles, n_drafts, accepted, accepted + 1, replayed,
                               t1 - t0, t2 - t1, t3 - t2, _network_wait(runner) - waited,
                               block=L, reason=why)
            if (yield from _emit_cycle(s, committed, flags, cycle, stop, config.max_tokens)):
                break
        if ahead is not None:  # the queued step fed the last token: the cache holds it
            cache_ids.append(pending)
            kept = ahead[1][:, :1]
            ctx_parts.append(kept)
            if turn_taps is not None:
                turn_taps.append(kept)
    if session is not None:
        session.update_kept(start, cache_ids, turn_taps or [], taps)
        if ctx_parts and extend is not None:
            extend(ctx_parts[0] if len(ctx_parts) == 1 else mx.concatenate(ctx_parts, axis=1),
                   dcache)
        if extend is not None:
            session.store(cache_ids, cache, dcache, int(dcache[0].offset))
        else:
            session.store(cache_ids, cache, None, 0)
    if control is not None:
        _costs.remember_state(drafter, target.model, control.state(), kind)
    s.set_rates(s.generated_tokens - 1)  # the prefill's first token is not a cycle's
    _summary_common(s, t_start, t_first, time.perf_counter())
    yield Done(s)


def _lookup_body(target, runner: TargetRunner, prompt, config, block: int, cancel, session,
                 boundaries, summary: Summary) -> Iterator:
    """Lookup mode: the DFlash cycle with prompt-lookup drafts (:mod:`app.engine.lookup`)
    instead of a drafter's, as many as :class:`~app.engine.lookup.DraftLength` allows. A
    cycle whose lookup finds nothing is one plain step of the pending token (no verify pass,
    no rollback; a cycle with 0 drafts)."""
    eos = target.eos_token_ids
    s, choose, t_start = _begin(config, summary)
    s.fast_verify = runner.fast_verify
    s.stage_timing = config.stage_timing
    s.reused_tokens = start = _start(session, prompt, False)
    cache = session.target_cache if start else runner.make_cache()
    snap = (lambda pos: session.snapshot(pos, cache)) if session is not None else None

    def fwd(chunk, last):
        return runner.forward(chunk, cache, all_logits=False)

    logits, _ = _prefill(fwd, prompt, start, config.prefill_step, False, snap, boundaries,
                         cancel)
    history = list(prompt)
    cache_ids = list(prompt)
    pending = int(mx.argmax(logits).item()) if choose is None else choose(logits, history)
    t_first = time.perf_counter()
    history.append(pending)
    index = NgramIndex(history)
    length = DraftLength(block - 1)
    yield TokenEvent(pending, 0, False)
    s.generated_tokens = 1
    if pending in eos:
        s.stop_cause = "end_token"
    elif s.generated_tokens >= config.max_tokens:
        s.stop_cause = "length"
    else:
        staged = config.stage_timing
        queue = mx.eval if staged else mx.async_eval
        checkpoint = _checkpoint(runner, cache, config.rollback, queue)
        while True:
            if cancel.is_set():
                s.stop_cause = "cancelled"
                break
            remaining = config.max_tokens - s.generated_tokens
            L = min(block, remaining)
            waited = _network_wait(runner)
            t0 = time.perf_counter()
            drafts_in, _ = index.match(min(L - 1, length.value))
            ids = mx.array([[pending, *drafts_in]], dtype=mx.int32)
            t1 = time.perf_counter()
            if drafts_in:  # a verify pass: the rollback unit keeps what is accepted
                vlogits, _ = runner.forward(ids, cache, tapes=checkpoint.begin(ids))
            else:  # nothing to verify: one plain step
                vlogits, _ = runner.forward(ids, cache)
            if choose is None:
                packed = greedy_acceptance(mx.array(drafts_in, dtype=mx.int32) if drafts_in
                                           else None, vlogits[0])
                accepted, *choice = host_read(packed)  # the cycle's one host synchronisation
                bonus = choice[accepted]
            else:
                mx.eval(vlogits)
                accepted, bonus = sampled_acceptance(choose, vlogits, drafts_in, history)
            t2 = time.perf_counter()
            committed, flags, stop = cut_at_end_token(drafts_in[:accepted] + [bonus],
                                                      [True] * accepted + [False], eos)
            n = len(committed)
            replayed = checkpoint.commit(n) if drafts_in else False
            length.update(len(drafts_in), accepted)
            t3 = time.perf_counter()
            cache_ids.append(pending)
            cache_ids.extend(committed[: n - 1])
            history.extend(committed)
            index.extend(committed)
            pending = committed[-1]
            cycle = CycleEvent(s.cycles, len(drafts_in), accepted, accepted + 1, replayed,
                               t1 - t0, t2 - t1, t3 - t2, _network_wait(runner) - waited,
                               block=len(drafts_in) + 1)
            if (yield from _emit_cycle(s, committed, flags, cycle, stop, config.max_tokens)):
                break
    if session is not None:
        session.update_kept(start, cache_ids, [], ())
        session.store(cache_ids, cache, None, 0)
    s.set_rates(s.generated_tokens - 1)  # the prefill's first token is not a cycle's
    _summary_common(s, t_start, t_first, time.perf_counter())
    yield Done(s)
