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

A target with two drafters (DFlash and DFlash2) has one context per drafter: the one not running
is put aside (:meth:`PromptCache.switch_drafter`; one that has not run yet is registered
empty by :meth:`PromptCache.keep_context`) and extended with each turn's tap states
(:meth:`PromptCache.update_kept`), plain turns included, so switching drafters, or a first
turn of the other drafter after plain turns, does not cost a cold prefill.
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
class KeptContext:
    """A drafter's context cache put aside while another drafter of the same target runs.

    Attributes:
        model: the drafter network (its ``extend_context`` appends rows).
        tap_layers: its ``target_layer_ids`` (the target layers its context is built from).
        cache: its context caches (one per drafter layer).
        length: positions covered; ``ids``: the tokens at those positions.
    """

    model: object
    tap_layers: tuple
    cache: list
    length: int
    ids: list[int]


@dataclass
class PromptCache:
    """Caches kept between turns for one target (and optionally its drafter).

    Attributes:
        max_snapshot_bytes: memory bound for recurrent-state snapshots (bytes).
        ids: token ids the target cache covers (``len(ids)`` positions).
        target_cache: the target's cache list (None before the first turn).
        drafter_cache: the drafter's context caches; ``drafter_len`` positions are covered.
        kept_contexts: the context caches of the target's other drafters (a pair with a DFlash
            and a DFlash2 drafter), put aside by :meth:`switch_drafter` and kept in step with
            the target by :meth:`update_kept`: key -> :class:`KeptContext`.
        reuse_cap: the most prompt tokens the next :meth:`prepare` may reuse (once; None: no
            cap), set by :meth:`cap_next_reuse`.
    """

    max_snapshot_bytes: int = 512 * 1024 * 1024
    ids: list[int] = field(default_factory=list)
    target_cache: list | None = None
    drafter_cache: list | None = None
    drafter_len: int = 0
    snapshots: list[_Snapshot] = field(default_factory=list)
    kept_contexts: dict = field(default_factory=dict)
    reuse_cap: int | None = None

    @property
    def snapshot_bytes(self) -> int:
        """Bytes held by snapshots (shown in the window)."""
        return sum(s.nbytes for s in self.snapshots)

    def clear(self) -> None:
        """Forget everything (model switch, memory pressure)."""
        self.ids, self.target_cache, self.drafter_cache = [], None, None
        self.drafter_len = 0
        self.snapshots = []
        self.kept_contexts = {}

    def switch_drafter(self, old_key, new_key, old_drafter=None) -> None:
        """Make another drafter's context the active one (``drafter_cache``), keeping the
        current one aside under ``old_key``.

        Args:
            old_key, new_key: keys of the drafter that ran last and of the one about to run
                (``old_key`` None: the current context is dropped).
            old_drafter: the drafter that ran last (a ``LoadedDrafter``: its ``model`` and
                ``config.target_layer_ids``), so that :meth:`update_kept` can extend its
                context while the other one runs; None keeps nothing.

        The context brought back is cut to the tokens it shares with the target cache's
        ``ids`` (:meth:`update_kept` keeps it in step; a context it could not extend covers
        less), so :meth:`prepare` reuses at most that prefix for it: never a context of other
        tokens. Without one, the next drafting turn prefills cold, as before.
        """
        if old_key is not None and old_drafter is not None and self.drafter_cache is not None:
            self.kept_contexts[old_key] = KeptContext(
                old_drafter.model, tuple(old_drafter.config.target_layer_ids),
                self.drafter_cache, self.drafter_len, list(self.ids[: self.drafter_len]))
        self.drafter_cache, self.drafter_len = None, 0
        kept = self.kept_contexts.pop(new_key, None)
        if kept is None:
            return
        n = min(kept.length, common_prefix(kept.ids, self.ids))
        if n <= 0:
            return
        for c in kept.cache:
            c.trim(c.offset - n)
        self.drafter_cache, self.drafter_len = kept.cache, n

    def keep_context(self, key, drafter) -> None:
        """Keep a context for ``drafter``, a drafter of this target that is not running now,
        under ``key`` (a no-op when one is kept there already, or ``drafter`` builds no
        context: no ``extend_context``).

        The context starts empty; :meth:`update_kept` builds it from the tap states of the
        next turn that prefills from position 0 (the first turn after a load or a
        :meth:`clear`) and keeps it in step from then on, so the first turn of ``drafter``
        after plain turns, or after the other drafter's, reuses the prefix.

        Args:
            key: the key :meth:`switch_drafter` will bring it back under.
            drafter: a ``LoadedDrafter`` (its ``model`` and ``config.target_layer_ids``).
        """
        model = drafter.model
        if key in self.kept_contexts or not hasattr(model, "extend_context"):
            return
        self.kept_contexts[key] = KeptContext(
            model, tuple(drafter.config.target_layer_ids), model.make_cache(), 0, [])

    def update_kept(self, start: int, ids: list[int], taps: list, tap_layers) -> None:
        """After a turn that reused ``start`` positions and ends with the target cache over
        ``ids``: keep every put-aside drafter context in step with the target.

        A kept context is first cut to what it shares with ``ids`` up to ``start``; one that
        then covers exactly ``start`` positions and reads the same target layers is extended
        with ``taps`` (the turn's tap states of positions ``start .. len(ids) - 1``, in order),
        so it covers ``ids`` as the running drafter's context does. A context that cannot be
        extended keeps its shorter, still valid prefix.

        Args:
            taps: ``(1, n_i, len(tap_layers) * hidden)`` arrays; empty when the turn kept none
                (plain decoding without a drafter).
            tap_layers: the target layers ``taps`` were read from.
        """
        total = sum(int(t.shape[1]) for t in taps)
        new = mx.concatenate(taps, axis=1) if taps and total == len(ids) - start else None
        for kept in self.kept_contexts.values():
            n = min(kept.length, start, common_prefix(kept.ids, ids))
            if n < kept.length:
                for c in kept.cache:
                    c.trim(c.offset - n)
                kept.length, kept.ids = n, kept.ids[:n]
            if new is not None and n == start and kept.tap_layers == tuple(tap_layers):
                kept.model.extend_context(new, kept.cache)
                mx.eval(cache_arrays(kept.cache))  # no lazy graph growing over the turns
                kept.length, kept.ids = len(ids), list(ids)

    def cap_next_reuse(self, n: int | None) -> None:
        """Let the next :meth:`prepare` reuse at most ``n`` prompt tokens (None: no cap).

        The sides of a Compare run one after another on the same prompt, and the first side's
        prefill leaves turn-boundary snapshots that the later sides could resume from; capped
        at what the first side reused, every side prefills from the same position, so their
        times to first token compare like with like. The cap is used once."""
        self.reuse_cap = None if n is None else max(0, int(n))

    # -- used by the generator -------------------------------------------------------------
    def prepare(self, prompt: list[int], need_drafter: bool) -> int:
        """Position the kept caches for ``prompt``; returns how many prompt tokens are reused.

        The caches then cover exactly ``prompt[:returned]``; the caller prefills the rest. At
        least the last prompt token is always prefilled (its logits give the first token).
        With nothing reusable the caches are dropped (the caller makes fresh ones), as when a
        sliding-window (rotating) cache would have to be cut back after it has rotated.
        """
        cap, self.reuse_cap = self.reuse_cap, None
        if self.target_cache is None:
            return 0
        limit = min(common_prefix(self.ids, prompt), len(prompt) - 1)
        if cap is not None:
            limit = min(limit, cap)
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
            kept = self.kept_contexts  # other drafters' contexts check their own tokens
            self.clear()
            self.kept_contexts = kept
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

