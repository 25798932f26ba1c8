"""Prefix reuse across turns, hybrid (recurrent) targets included.

After each reply the target's cache (attention K/V and Gated DeltaNet states) and the drafter's
context cache are kept with the token ids they cover. On the next message the longest common
prefix (LCP) between those ids and the newly rendered prompt is found and only the rest is
prefilled.

Attention caches can be trimmed to any length; recurrent states cannot. So the GDN arrays are
snapshotted at turn boundaries (the end of the history before the generation prompt, the end of
the prompt, the end of the reply): a forward pass replaces those arrays, so a snapshot only keeps
references. A prefix is resumed from the largest snapshot that is still a prefix of the new
prompt; when the chat template rewrote earlier text (e.g. stripped earlier reasoning) that is an
earlier snapshot, and with none the prefill starts cold. Never a wrong state.

Snapshot memory is bounded (``max_snapshot_bytes``); the oldest snapshots go first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from app.engine.target import cache_arrays


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _Snapshot:
    position: int
    arrays: list  # per layer: list of GDN arrays (conv, state), or None for attention layers
    nbytes: int


@dataclass
class PromptCache:
    """Caches kept between turns for one target (and optionally its drafter).

    Attributes:
        max_snapshot_bytes: memory bound for recurrent-state snapshots (bytes).
        ids: token ids the target cache covers (``len(ids)`` positions).
        target_cache: the target's cache list (None before the first turn).
        drafter_cache: the drafter's context caches; ``drafter_len`` positions are covered.
    """

    max_snapshot_bytes: int = 512 * 1024 * 1024
    ids: list[int] = field(default_factory=list)
    target_cache: list | None = None
    drafter_cache: list | None = None
    drafter_len: int = 0
    snapshots: list[_Snapshot] = field(default_factory=list)

    @property
    def snapshot_bytes(self) -> int:
        """Bytes held by snapshots (shown in the window)."""
        return sum(s.nbytes for s in self.snapshots)

    def clear(self) -> None:
        """Forget everything (model switch, memory pressure)."""
        self.ids, self.target_cache, self.drafter_cache = [], None, None
        self.drafter_len = 0
        self.snapshots = []

    # -- used by the generator -------------------------------------------------------------
    def prepare(self, prompt: list[int], need_drafter: bool) -> int:
        """Position the kept caches for ``prompt``; returns how many prompt tokens are reused.

        The caches then cover exactly ``prompt[:returned]``; the caller prefills the rest. At
        least the last prompt token is always prefilled (its logits give the first token).
        With nothing reusable the caches are dropped (the caller makes fresh ones), as when a
        sliding-window (rotating) cache would have to be cut back after it has rotated.
        """
        if self.target_cache is None:
            return 0
        limit = min(common_prefix(self.ids, prompt), len(prompt) - 1)
        if need_drafter:
            limit = min(limit, self.drafter_len if self.drafter_cache is not None else 0)
        linear = [isinstance(c, ArraysCache) for c in self.target_cache]
        start = limit
        if any(linear):
            # The current state is usable as is only when nothing needs cutting.
            usable = [s for s in self.snapshots if s.position <= limit]
            if len(self.ids) == limit:
                start = limit
            elif usable:
                snap = max(usable, key=lambda s: s.position)
                start = snap.position
                for c, arrays in zip(self.target_cache, snap.arrays):
                    if arrays is not None:
                        c.cache = list(arrays)
            else:
                start = 0
        if start and any(not lin and c.offset > start and not c.is_trimmable()
                         for c, lin in zip(self.target_cache, linear)):
            # A sliding-window cache that has rotated no longer holds the rows before its
            # window: cutting it back would leave stale rows (mlx-lm's trim only moves offsets).
            start = 0
        if start == 0:
            self.clear()
            return 0
        for c, lin in zip(self.target_cache, linear):
            if not lin and c.offset > start:
                c.trim(c.offset - start)
        if self.drafter_cache is not None:
            if self.drafter_len >= start:
                for c in self.drafter_cache:
                    c.trim(c.offset - start)
                self.drafter_len = start
            else:
                self.drafter_cache, self.drafter_len = None, 0
        self.ids = self.ids[:start]
        self.snapshots = [s for s in self.snapshots if s.position <= start]
        return start

    def snapshot(self, position: int, cache: list) -> None:
        """Keep the recurrent arrays of ``cache`` as the state after ``position`` tokens."""
        arrays, nbytes = [], 0
        for c in cache:
            if isinstance(c, ArraysCache):
                kept = list(c.cache)
                arrays.append(kept)
                nbytes += sum(a.nbytes for a in kept if a is not None)
            else:
                arrays.append(None)
        if not any(a is not None for a in arrays):
            return  # dense model: attention trims, no snapshot needed
        self.snapshots = [s for s in self.snapshots if s.position != position]
        self.snapshots.append(_Snapshot(position, arrays, nbytes))
        self.snapshots.sort(key=lambda s: s.position)
        while self.snapshot_bytes > self.max_snapshot_bytes and len(self.snapshots) > 1:
            self.snapshots.pop(0)

    def store(self, ids: list[int], cache: list, drafter_cache: list | None,
              drafter_len: int) -> None:
        """Keep the caches after a reply; ``ids`` are the tokens the target cache holds."""
        mx.eval(cache_arrays(cache) + (cache_arrays(drafter_cache) if drafter_cache else []))
        self.ids = list(ids)
        self.target_cache = cache
        if drafter_cache is not None:  # else the kept one still covers a prefix (prepare)
            self.drafter_cache, self.drafter_len = drafter_cache, drafter_len
        self.snapshot(len(ids), cache)

