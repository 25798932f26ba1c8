"""Prompt-lookup drafts: n-gram matching over the prompt and the reply so far.

Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding",
https://github.com/apoorvumang/prompt-lookup-decoding; also mlx-lm's and transformers'
``prompt_lookup_num_tokens``): when a reply copies text that is already in its context (a
list being repeated, a tool result being restated, code being edited), the tokens that
followed an earlier occurrence of the last few tokens are a good guess of the next ones. No
drafter model is involved; the guesses are verified by the target exactly as DFlash drafts
are (``app.engine.generate``), so the output is plain decoding's.

:class:`NgramIndex` keeps, for every n-gram of length ``min_n..max_n`` whose next token is
known, the position of its latest occurrence; a query for the last ``n`` tokens (``n`` from
``max_n`` down to ``min_n``, the first that matches wins) is then a dictionary look-up, and
each appended token costs ``max_n - min_n + 1`` insertions.

How many looked-up tokens a cycle verifies adapts to how the last ones fared
(:class:`DraftLength`): a rejected draft costs verify work (on a CPU a 16-token pass costs
about twice a one-token step), so after a miss only ``accepted + 1`` tokens are drafted, and
each fully accepted draft doubles the next one up to the block. A reply that copies soon
drafts whole blocks again; one that does not costs little more than plain decoding.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.engine.modes import DEFAULT_BLOCK_SIZE

MAX_NGRAM = 3
"""The longest suffix looked up (tokens)."""

MIN_NGRAM = 1
"""The shortest suffix looked up (tokens)."""

DEFAULT_BLOCK = DEFAULT_BLOCK_SIZE
"""Lookup mode's block size when none is set (the pending token and up to 15 drafts): the
engine's one default block size, that of the published DFlash drafters."""


class DraftLength:
    """The number of looked-up tokens the next cycle verifies (at most ``limit``).

    Starts at ``start``; after a cycle, :meth:`update` doubles it when every draft was
    accepted and sets it to ``accepted + 1`` otherwise (never below 1, never above
    ``limit``). The rule is this module's own, in the spirit of transformers' "heuristic"
    assistant schedule (``num_assistant_tokens`` +2 on a full accept, -1 otherwise), with
    faster growth since copied text tends to run long.

    Raises:
        ValueError: ``limit < 0``.
    """

    def __init__(self, limit: int, start: int = 4) -> None:
        if limit < 0:
            raise ValueError(f"the draft limit must be >= 0, got {limit}")
        self.limit = limit
        self.value = max(0, min(limit, max(1, start)))

    def update(self, drafted: int, accepted: int) -> None:
        """Adapt after a cycle that verified ``drafted`` drafts and accepted ``accepted``
        (a cycle without drafts changes nothing)."""
        if drafted <= 0:
            return
        grown = self.value * 2 if accepted >= drafted else accepted + 1
        self.value = max(1, min(self.limit, grown)) if self.limit else 0


class NgramIndex:
    """The latest earlier occurrence of every short n-gram of a growing token sequence.

    Args:
        tokens: the sequence so far (token ids), e.g. the prompt.
        max_n, min_n: the suffix lengths looked up, longest first (``1 <= min_n <= max_n``).

    Raises:
        ValueError: ``min_n`` or ``max_n`` out of range.
    """

    def __init__(self, tokens: Iterable[int] = (), max_n: int = MAX_NGRAM,
                 min_n: int = MIN_NGRAM) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min_n <= max_n, got "
                             f"{min_n}..{max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        # n-gram tuple -> index just past its latest occurrence that has a next token
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens``, indexing each n-gram that now has a next token."""
        for tok in tokens:
            end = len(self.tokens)  # the n-grams ending just before ``tok`` get it as next
            for n in range(self.min_n, self.max_n + 1):
                if n <= end:
                    self._next[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(int(tok))

    def match(self, limit: int) -> tuple[list[int], int]:
        """The draft for the sequence so far: ``limit`` tokens that followed the latest
        earlier occurrence of its last ``n`` tokens, for the largest ``n`` in
        ``max_n..min_n`` that occurs earlier.

        A continuation that reaches the end of the sequence goes on as a copy of itself (as
        an LZ77 match longer than its distance does): the text since the occurrence is then
        taken to repeat with that period (``... a b a b`` proposes ``a b a b ...``).

        Returns:
            ``(drafts, n)``: ``limit`` proposed token ids and the matched suffix length;
            ``([], 0)`` when no suffix occurs earlier or ``limit < 1``.
        """
        toks = self.tokens
        if limit < 1:
            return [], 0
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            start = self._next.get(tuple(toks[len(toks) - n:]))
            if start is not None:
                drafts = toks[start:start + limit]
                period = len(toks) - start
                while len(drafts) < limit:
                    drafts.append(drafts[len(drafts) - period])
                return drafts, n
        return [], 0


def lookup_drafts(tokens: list[int], limit: int, max_n: int = MAX_NGRAM,
                  min_n: int = MIN_NGRAM) -> list[int]:
    """:meth:`NgramIndex.match` over ``tokens`` in one call (the drafts only)."""
    return NgramIndex(tokens, max_n, min_n).match(limit)[0]
