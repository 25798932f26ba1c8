"""Shared helpers for engine tests: tiny pairs, an oracle drafter, event collection, and
the cancel side of a generation for scripted stand-ins of the engine."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from app.engine.events import CycleEvent, Done, TokenEvent
from app.engine.generate import GenerationConfig, generate

PROMPT = [{"role": "user", "content": "What is the capital of France? Think first."}]

FAST = os.environ.get("DFLASH_TEST_FAST") == "1"
"""Set by ``make test-fast``: the block-size matrices run one block size (both rollbacks
still), and the dtype matrices leave out their slowest variants (``test_engine_exact``: 8-bit;
``test_prefix_across_chats``: 4-bit); ``make test`` runs them whole."""


def block_sizes(full: tuple[int, ...], fast: tuple[int, ...] = (8,)) -> tuple[int, ...]:
    """The block sizes a parametrized matrix runs: ``full``, or ``fast`` under ``make
    test-fast``."""
    return fast if FAST else full


@dataclass
class Run:
    """Everything one generation emitted."""

    tokens: list[int] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    cycles: list[CycleEvent] = field(default_factory=list)
    summary: object = None


def collect(gen, on_cycle=None) -> Run:
    """Drain a Generation into a :class:`Run`; ``on_cycle(run, gen)`` after each cycle."""
    run = Run()
    for ev in gen:
        if isinstance(ev, TokenEvent):
            run.tokens.append(ev.token_id)
            run.indices.append(ev.index)
            run.from_draft.append(ev.from_draft)
        elif isinstance(ev, CycleEvent):
            run.cycles.append(ev)
            if on_cycle:
                on_cycle(run, gen)
        elif isinstance(ev, Done):
            run.summary = ev.summary
    return run


class FakeCancel:
    """The cancel side of ``app.engine.generate.Generation`` for a scripted stand-in that
    ``app.chat.reply.run_reply`` drives: :meth:`cancel`, :meth:`cancel_on` (which run_reply
    calls with its Stop event before iterating) and :attr:`cancelled`, set once either asked
    to stop. A stand-in that checks :attr:`cancelled` where the engine checks its flag
    honours a Stop as the engine does; one that never checks it runs its script out."""

    def __init__(self) -> None:
        from app.engine.generate import _CancelFlag  # the engine's own flag

        self._flag = _CancelFlag()

    def cancel(self) -> None:
        """Ask the stand-in to stop (as ``Generation.cancel``)."""
        self._flag.set()

    def cancel_on(self, event: threading.Event) -> None:
        """Stop also once ``event`` is set (as ``Generation.cancel_on``; never sets it)."""
        self._flag.watch(event)

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called or an event given to :meth:`cancel_on` is set."""
        return self._flag.is_set()


def prompt_ids(target, messages=PROMPT) -> list[int]:
    """The rendered chat prompt for ``messages``."""
    return list(target.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def run(target, ids, drafter=None, **kw) -> Run:
    """Generate with ``GenerationConfig(**kw)`` and collect."""
    return collect(generate(target, ids, GenerationConfig(**kw), drafter))


@dataclass
class OracleConfig:
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]


class _OracleCache:
    def __init__(self):
        self.offset = 0


class OracleModel:
    """Proposes the target's own greedy continuation, corrupted on a schedule.

    Cycle ``c`` corrupts draft slot ``schedule[c % len(schedule)]`` (None: no corruption), so
    every acceptance length from 0 to L-1 occurs, full acceptance included. The pending token's
    output index is read from the context length (prompt + committed tokens in the target).
    """

    def __init__(self, reference: list[int], prompt_len: int, vocab: int, schedule: list):
        self.reference = reference
        self.prompt_len = prompt_len
        self.vocab = vocab
        self.schedule = schedule
        self.calls = 0

    def make_cache(self):
        return _OracleCache()

    def draft(self, runner, pending, length, taps, cache) -> list[int]:
        if taps is not None:
            cache.offset += taps.shape[1]
        g = cache.offset - self.prompt_len  # output index of ``pending``
        ref = self.reference
        out = [ref[g + 1 + i] if g + 1 + i < len(ref) else 0 for i in range(length - 1)]
        slot = self.schedule[self.calls % len(self.schedule)]
        self.calls += 1
        if slot is not None and slot < len(out):
            out[slot] = (out[slot] + 1) % self.vocab
        return out


class OracleDrafter:
    """A LoadedDrafter-like oracle (see :class:`OracleModel`)."""

    def __init__(self, reference, prompt_len, vocab, block_size, taps, schedule=None):
        schedule = schedule if schedule is not None else [None, *range(block_size - 1)]
        self.model = OracleModel(reference, prompt_len, vocab, schedule)
        self.config = OracleConfig(block_size, vocab - 1, list(taps))
        self.name = "oracle"
        self.path = Path(".")


def top2_gap(target, ids: list[int]) -> float:
    """Gap between the two largest next-token logits after ``ids`` (plain forward)."""
    logits = target.model(mx.array([ids], dtype=mx.int32))[0, -1]
    top = mx.sort(logits)[-2:].tolist()
    return top[1] - top[0]


def assert_same_or_near_tie(target, prompt, plain: list[int], spec: list[int], tol=1e-4):
    """Token ids must match; a divergence is accepted only at a near-tie (printed)."""
    if plain == spec:
        return
    n = min(len(plain), len(spec))
    d = next((i for i in range(n) if plain[i] != spec[i]), n)
    gap = top2_gap(target, prompt + plain[:d])
    print(f"divergence at {d}: plain {plain[d:d+3]} dflash {spec[d:d+3]}, top-2 gap {gap:.3g}")
    assert d < n and gap < tol, f"divergence at {d} is not a near-tie (gap {gap})"
