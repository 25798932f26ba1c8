"""The automatic block size: before each DFlash cycle, the block length that promises the most
tokens per second.

A cycle of block length ``L`` (the pending token and ``L - 1`` drafts; ``L = 1`` drafts
nothing and is one plain step of the target) commits on average

    E[tokens | L] = 1 + sum_{j=1}^{L-1} prod_{i<=j} p_i

tokens, where ``p_i`` is the probability that draft ``i`` is accepted given that drafts
``1..i-1`` were (its conditional acceptance rate), and costs

    cost(L) = draft(L) + verify(L) + rollback(L) * P(some draft rejected)

milliseconds at the current context length (:class:`app.engine.costs.CostModel`, corrected by
what the cycles measure). :class:`BlockController` picks the ``L`` in ``1..max_block`` with
the largest ``E[tokens | L] / cost(L)`` (among drafted blocks within :data:`TIE` of the best,
the longest).

The rates are estimated from the recent cycles: after a cycle that drafted ``d`` tokens and
accepted ``a``, positions ``1..a`` saw an acceptance and position ``a + 1`` (if ``a < d``) a
rejection; each moves its rate by an exponential moving average (weight :attr:`alpha`).
Positions the cycle did not reach are censored (not observed): their rates drift back
toward the optimistic prior (weight :attr:`decay` per cycle), so that after a run of short
blocks, or of plain steps, longer blocks are tried again when the text turns predictable. A
position no cycle has reached yet is never credited above the rate of the position before it
(which must be passed to reach it): a drafter whose first draft is rejected every time is not
credited with the prior at the positions it never reaches.

Costs are corrected online: each cycle's measured wall time (one host wait per cycle, so the
time is the device's) over the model's prediction moves a correction factor by an
exponential moving average, one factor for plain steps and one for drafted blocks (the two
differ in what they run: no drafter, no tapes).

The engine keeps a pair's controller state between replies (``app.engine.costs``,
``remember_state``): a reply starts from the rates and corrections the previous one of the
same kind (greedy, or sampled) ended with, not from the prior.

Exactness does not depend on the controller: whatever ``L`` it picks, the target's verify pass
decides every token (``app.engine.generate``).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.costs import CostModel

PRIOR = 0.9
"""The optimistic conditional acceptance rate a position starts at and drifts back to."""

DECAY = 0.01
"""The per-cycle pull of an unobserved position's rate back toward the prior: after drafts
stop paying (every draft rejected), blocks are tried again after about a hundred plain steps
on the demo pair, which costs a few percent over plain decoding when they still do not pay."""

TIE = 0.02
"""Blocks whose expected rate is within this share of the best one's count as ties, and the
longest of them is taken: the estimates are noisy, and a longer block observes the acceptance
of more positions (those past a block are never observed)."""

COST_ALPHA = 0.1
"""The weight of one cycle's measured/predicted time in the online cost correction (0: the
cost model as measured, no correction; tests use it to make choices independent of
timing)."""


@dataclass(frozen=True)
class Choice:
    """One decision: ``block`` (the cycle's length L), its ``expected`` tokens, ``cost_ms``
    (corrected) and ``rate`` (expected tokens per ms), and the plain step's rate beside it
    (``plain_rate``, tokens per ms) for the reason a panel shows."""

    block: int
    expected: float
    cost_ms: float
    rate: float
    plain_rate: float

    @property
    def reason(self) -> str:
        """One line: why this block (e.g. ``"block 6: 3.1 tok in 22 ms, 1.70x a plain
        step"``; for a plain step ``"block 1 (a plain step): 12 ms a token, no drafted block
        expected to do better"``)."""
        if self.block <= 1:
            return (f"block 1 (a plain step): {self.cost_ms:.0f} ms a token, no drafted block "
                    f"expected to do better")
        gain = self.rate / self.plain_rate if self.plain_rate > 0 else float("nan")
        return (f"block {self.block}: {self.expected:.1f} tok in {self.cost_ms:.0f} ms, "
                f"{gain:.2f}x a plain step")


class BlockController:
    """Per-cycle block length from acceptance estimates and a cost model (module doc).

    Args:
        costs: the pair's :class:`~app.engine.costs.CostModel` (ms).
        max_block: the largest block allowed (the drafter's block size or the one set).
        prior: the optimistic conditional acceptance rate (0..1) positions start at.
        alpha: the weight of one observation in a position's rate (0..1].
        decay: the per-cycle pull of an unobserved position's rate toward ``prior`` (0..1;
            None: :data:`DECAY`).
        cost_alpha: the weight of one cycle's measured/predicted time in the correction
            (0..1; 0 turns the correction off; None: :data:`COST_ALPHA`).

    Raises:
        ValueError: ``max_block < 1`` or a rate/weight outside its range.
    """

    def __init__(self, costs: CostModel, max_block: int, prior: float = PRIOR,
                 alpha: float = 0.15, decay: float | None = None,
                 cost_alpha: float | None = None) -> None:
        if max_block < 1:
            raise ValueError(f"max_block must be at least 1, got {max_block}")
        cost_alpha = COST_ALPHA if cost_alpha is None else cost_alpha
        decay = DECAY if decay is None else decay
        for name, v, lo_open in (("prior", prior, False), ("alpha", alpha, True),
                                 ("decay", decay, False), ("cost_alpha", cost_alpha, False)):
            if not (0 < v <= 1 if lo_open else 0 <= v <= 1):
                raise ValueError(f"{name} must be in {'(0, 1]' if lo_open else '[0, 1]'}, "
                                 f"got {v}")
        self.costs = costs
        self.max_block = max_block
        self.prior, self.alpha, self.decay, self.cost_alpha = prior, alpha, decay, cost_alpha
        self.rates = [prior] * (max_block - 1)  # rates[i]: draft i + 1 accepted given the rest
        self.seen = [False] * (max_block - 1)  # whether a cycle has reached position i + 1
        self.step_scale = 1.0  # measured / predicted, plain steps
        self.block_scale = 1.0  # measured / predicted, drafted blocks
        self.last: Choice | None = None

    def state(self) -> dict:
        """What this controller learned (the rates and the cost corrections), for the next
        reply of the same pair to start from (:meth:`restore`)."""
        return {"rates": list(self.rates), "seen": list(self.seen),
                "step_scale": self.step_scale, "block_scale": self.block_scale}

    def restore(self, state: dict | None) -> None:
        """Start from a :meth:`state` of an earlier run (None: nothing to restore). Rates of
        positions that run did not have start at the prior."""
        if not state:
            return
        rates = [min(1.0, max(0.0, float(p))) for p in state.get("rates", [])]
        n = len(self.rates)
        self.rates = (rates + [self.prior] * n)[:n]
        seen = [bool(x) for x in state.get("seen", [])]
        self.seen = (seen + [False] * n)[:n]
        self.step_scale = float(state.get("step_scale", 1.0))
        self.block_scale = float(state.get("block_scale", 1.0))

    def expected_tokens(self, length: int) -> float:
        """``E[tokens | L]`` under the current rates (1 for ``L = 1``)."""
        total, run = 1.0, 1.0
        for p in self.rates[: max(0, length - 1)]:
            run *= p
            total += run
        return total

    def full_acceptance(self, length: int) -> float:
        """The probability that all ``length - 1`` drafts are accepted (1 for ``L = 1``)."""
        run = 1.0
        for p in self.rates[: max(0, length - 1)]:
            run *= p
        return run

    def predicted_ms(self, length: int, ctx: int, full: float | None = None) -> float:
        """The model's ms for a cycle of ``length`` at ``ctx`` (uncorrected): the draft, the
        verify, and the rollback weighted by the chance that a draft is rejected (``full``:
        :meth:`full_acceptance` of ``length`` when the caller has it)."""
        c = self.costs
        full = self.full_acceptance(length) if full is None else full
        return c.draft(length, ctx) + c.verify(length, ctx) + c.rollback(length) * (1.0 - full)

    def cost_ms(self, length: int, ctx: int, full: float | None = None) -> float:
        """:meth:`predicted_ms` times the online correction of its kind."""
        scale = self.step_scale if length <= 1 else self.block_scale
        return self.predicted_ms(length, ctx, full) * scale

    def choose(self, ctx: int, limit: int | None = None) -> int:
        """The block length for the next cycle (``1..min(max_block, limit)``).

        Args:
            ctx: positions in the target cache (prompt and committed tokens).
            limit: a further cap (e.g. the tokens left before ``max_tokens``).
        """
        top = self.max_block if limit is None else max(1, min(self.max_block, limit))
        plain_cost = self.cost_ms(1, ctx)
        plain_rate = 1.0 / plain_cost if plain_cost > 0 else float("inf")
        options = [Choice(1, 1.0, plain_cost, plain_rate, plain_rate)]
        # one pass over the lengths: the running product is full_acceptance(length) and the
        # running sum expected_tokens(length), as those methods compute them (a hot path)
        expected, full = 1.0, 1.0
        for length in range(2, top + 1):
            full *= self.rates[length - 2]
            expected += full
            cost = self.cost_ms(length, ctx, full)
            rate = expected / cost if cost > 0 else float("inf")
            options.append(Choice(length, expected, cost, rate, plain_rate))
        best = max(options, key=lambda c: c.rate)
        if best.block > 1:  # the longest block within TIE of the best: it observes more
            best = max((c for c in options[1:] if c.rate >= (1 - TIE) * best.rate),
                       key=lambda c: c.block)
        self.last = best
        return best.block

    def update(self, length: int, drafted: int, accepted: int, seconds: float | None = None,
               ctx: int = 0) -> None:
        """Learn from a finished cycle.

        Args:
            length: the cycle's block length (as chosen).
            drafted: drafts verified (``length - 1``, or 0 for a plain step).
            accepted: drafts accepted (``0..drafted``).
            seconds: the cycle's measured wall seconds, or None (no cost correction).
            ctx: positions in the target cache when the cycle began (for the prediction).
        """
        observed = min(drafted, accepted + 1)
        for i in range(len(self.rates)):
            if i < observed:
                hit = 1.0 if i < accepted else 0.0
                self.rates[i] += self.alpha * (hit - self.rates[i])
                self.seen[i] = True
            else:
                self.rates[i] += self.decay * (self.prior - self.rates[i])
                if i > 0 and not self.seen[i]:  # never seen: no better than the one before
                    self.rates[i] = min(self.rates[i], self.rates[i - 1])
        if seconds is not None and seconds > 0:
            predicted = self.predicted_ms(length, ctx)
            if predicted > 0:
                ratio = min(2.0, max(0.5, seconds * 1e3 / predicted))
                if length <= 1:
                    self.step_scale += self.cost_alpha * (ratio - self.step_scale)
                else:
                    self.block_scale += self.cost_alpha * (ratio - self.block_scale)
