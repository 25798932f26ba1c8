"""Warm a freshly loaded pair up: build the GPU kernels a reply needs before the user asks.

Why (issue #21): on MLX's CUDA backend every kernel shape is compiled the first time it runs;
on a fresh host the first prefill took 30 s and the first DFlash reply ran at 10-11 tok/s while
kernels were built. :func:`warm_up` runs one short plain reply and one short DFlash reply of
each loaded drafter on a fixed prompt, so the first real reply finds the step, prefill-chunk,
verify, rollback and drafter kernels built.

It leaves no state behind: no prompt cache (``session`` is None), and the models' weights are
not touched; only MLX's kernel caches grow. On the CPU there is nothing to build (no JIT
beyond what the first reply does in microseconds), so :func:`needs_warm_up` is False there and
callers skip it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from app.engine.device import backend
from app.engine.events import Done
from app.engine.generate import GenerationConfig, generate

#: The prompt of the warm-up replies (token ids are what matter; any text would do).
WARM_UP_TEXT = "Warm-up: say hello in one short sentence, then stop."


@dataclass
class WarmUpReport:
    """What :func:`warm_up` did: seconds of the plain reply and of each DFlash reply
    (``drafted_s``, one entry per drafter), and the tokens generated in all."""

    plain_s: float
    drafted_s: list[float]
    tokens: int

    @property
    def seconds(self) -> float:
        """Total seconds."""
        return self.plain_s + sum(self.drafted_s)


def needs_warm_up() -> bool:
    """True on GPU backends (Metal, CUDA), whose kernels are built on first use."""
    return backend() != "CPU"


def _prompt_ids(target) -> list[int]:
    tok = target.tokenizer
    try:
        return list(tok.apply_chat_template([{"role": "user", "content": WARM_UP_TEXT}],
                                            add_generation_prompt=True))
    except Exception:  # a tokenizer without a chat template
        return list(tok.encode(WARM_UP_TEXT))


def warm_up(target, drafters: list | tuple = (), max_tokens: int | None = None) -> WarmUpReport:
    """Run one plain and one greedy DFlash reply per drafter, to build their kernels.

    Args:
        target: a ``LoadedTarget``.
        drafters: loaded drafters (``LoadedDrafter``; None entries are skipped).
        max_tokens: new tokens per reply; default twice the largest block size plus one, so
            a full block's verify and a partial block's rollback both run.

    Returns:
        A :class:`WarmUpReport`.

    Raises:
        whatever ``generate`` raises (an ``EngineError`` for a pair that cannot run).
    """
    drafters = [d for d in drafters if d is not None]
    blocks = [int(getattr(d.config, "block_size", 16) or 16) for d in drafters]
    n = max_tokens or 2 * max(blocks or [8]) + 1
    ids = _prompt_ids(target)
    tokens = 0

    def one(mode: str, drafter) -> float:
        nonlocal tokens
        t0 = time.perf_counter()
        for ev in generate(target, ids, GenerationConfig(mode=mode, max_tokens=n), drafter):
            if isinstance(ev, Done):
                tokens += ev.summary.generated_tokens
        return time.perf_counter() - t0

    plain = one("plain", None)
    drafted = [one("dflash", d) for d in drafters]
    return WarmUpReport(plain, drafted, tokens)
