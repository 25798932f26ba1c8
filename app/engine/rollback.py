"""The rollback unit: the target cache around one verify pass, put back to what was accepted.

A DFlash cycle feeds a block of ``L`` tokens (the pending token and ``L - 1`` drafts) to the
target in one verify pass; acceptance then keeps the first ``n`` of them (``1 <= n <= L``).
Attention caches (full or sliding-window) are cut back by ``L - n`` positions. The recurrent
state of Gated DeltaNet layers cannot be cut, so it is rolled back one of two ways
(``strategy``):

* ``"tape"`` (the default): the verify pass records each GDN layer's per-position inputs
  (:class:`app.engine.target.GDNTape`); the recurrence is run again over the ``n`` kept
  positions from the state before the pass (the same per-step operations, so the state is the
  one plain decoding builds);
* ``"replay"``: the state before the pass is put back and the target runs the ``n`` kept
  tokens again (a whole forward pass: slower, kept as the reference the tape is checked
  against).

With the near-exact chunked verify (``TargetRunner(fast_verify=True)``) a fully accepted
block still re-runs the recurrence from the tape, so the state carried on is the exact step
loop's. A dense target only trims. One :class:`VerifyCheckpoint` serves one verify pass:

    checkpoint = VerifyCheckpoint(runner, cache, "tape")
    logits, taps = runner.forward(ids, cache, taps=..., tapes=checkpoint.begin(ids))
    ...                                   # acceptance: keep n of the L positions
    replayed = checkpoint.commit(n)       # the cache now holds the n kept positions

The rollback is queued, not waited for (MLX is lazy): the next cycle's work is built on it.
"""

from __future__ import annotations

import mlx.core as mx

from app.engine.errors import GenerationError
from app.engine.modes import ROLLBACKS
from app.engine.target import GDNTape, TargetRunner, cache_arrays, trim_attention


class VerifyCheckpoint:
    """The target ``cache`` before one verify pass of ``runner``, and how to keep part of it.

    Args:
        runner: the :class:`~app.engine.target.TargetRunner` that runs the pass.
        cache: the target's cache list (mlx-lm cache objects, one per layer), changed in place.
        strategy: ``"tape"`` or ``"replay"`` (module docstring).
        queue: how the rolled-back arrays are scheduled (``mx.async_eval`` by default;
            ``mx.eval`` waits for them, for per-stage timing).

    Raises:
        GenerationError: an unknown strategy.
    """

    def __init__(self, runner: TargetRunner, cache: list, strategy: str = "tape",
                 queue=mx.async_eval) -> None:
        if strategy not in ROLLBACKS:
            raise GenerationError(f"unknown rollback strategy {strategy!r} (tape or replay)")
        self.runner = runner
        self.cache = cache
        self.strategy = strategy
        self.queue = queue
        self.tapes: list[GDNTape] | None = None
        self.ids: mx.array | None = None

    def begin(self, ids: mx.array) -> list[GDNTape] | None:
        """Start a verify pass of ``ids`` ``(1, L)`` int32: returns the list to give the
        runner's ``forward`` as ``tapes`` (None for a dense target, which needs none)."""
        self.ids = ids
        self.tapes = [] if self.runner.hybrid else None
        return self.tapes

    @property
    def length(self) -> int:
        """``L``: the positions the verify pass added."""
        return 0 if self.ids is None else int(self.ids.shape[1])

    def commit(self, n: int) -> bool:
        """Keep the first ``n`` positions of the pass (``1 <= n <= L``) and drop the rest.

        Returns True when recurrent state was rolled back (a hybrid target kept fewer than
        ``L``): the cycle counts as a replay.

        Raises:
            GenerationError: ``n`` outside ``1..L``, or no pass was begun.
        """
        L = self.length
        if not 1 <= n <= L:
            raise GenerationError(f"cannot keep {n} of a {L}-position verify pass")
        runner, cache, tapes, ids = self.runner, self.cache, self.tapes, self.ids
        self.tapes = self.ids = None  # one commit per pass; the tapes go with it
        if n == L:
            if runner.fast_verify and tapes:
                # the chunked verify's state is only near-exact: carry the step loop's one
                for tape in tapes:
                    tape.rollback(n)
                self.queue(cache_arrays(cache))
            return False
        if not runner.hybrid:
            trim_attention(cache, runner.linear, L - n)
            return False
        if self.strategy == "tape":
            for tape in tapes:
                tape.rollback(n)
            trim_attention(cache, runner.linear, L - n)
        else:
            for tape in tapes:
                tape.restore()
            trim_attention(cache, runner.linear, L)
            self._replay(ids[:, :n])
        self.queue(cache_arrays(cache))
        return True

    def _replay(self, kept: mx.array) -> None:
        """Run the kept tokens ``(1, n)`` through the target again (the ``replay`` strategy),
        on the cache just put back to its state before the pass."""
        self.runner.forward(kept, self.cache, all_logits=False)

    def restore(self) -> None:
        """Drop every position of the pass: the cache as it was before it (recurrent state
        put back, attention cut by ``L``).

        Raises:
            GenerationError: no pass was begun.
        """
        L = self.length
        if L == 0:
            raise GenerationError("no verify pass to undo")
        for tape in self.tapes or ():
            tape.restore()
        trim_attention(self.cache, self.runner.linear, L)
        self.tapes = self.ids = None
        self.queue(cache_arrays(self.cache))
