"""Prefix reuse across turns and across conversations, hybrid (recurrent) targets included.

After each reply the target's cache (attention K/V and Gated DeltaNet states) and the drafter's
context cache are kept with the token ids they cover: the *working state*. On the next prompt
the longest common prefix (LCP) between those ids and the newly rendered prompt is found and
only the rest is prefilled.

Attention caches can be trimmed to any length; recurrent states cannot. So the GDN arrays are
snapshotted at known boundaries (the end of the system + tools preamble, the end of the history
before the generation prompt, the end of the prompt, the end of the reply): a forward pass
replaces those arrays, so a snapshot only keeps references. A prefix is resumed from the
largest snapshot that is still a prefix of the new prompt; when the chat template rewrote
earlier text (e.g. stripped earlier reasoning) that is an earlier snapshot, and with none the
prefill starts cold. Never a wrong state.

Across conversations: before the working state is cut back (a new chat that shares only the
preamble, a regenerate, a Compare's next side), an uncut copy of it is kept in a
least-recently-used list of saved states, and a prompt that a saved state covers further than
the working one resumes from a copy of that saved state (returning to an earlier chat, or
continuing from a Compare side that did not run last). Copies share MLX arrays, which are
immutable values: a copy holds its own cache objects over slices of the same buffers, so its
next write allocates a new buffer and the saved state is never changed. The saved states'
memory is bounded (``max_bytes``, arrays counted once however many states share them); the
least recently used go first. A dense (attention-only) target needs no snapshots at all.

Snapshot memory within one state is bounded too (``max_snapshot_bytes``); the oldest snapshots
go first.

A target with two drafters (DFlash and DFlash2) has one context per drafter: the one not running
is put aside (:meth:`PromptCache.switch_drafter`; one that has not run yet is registered
empty by :meth:`PromptCache.keep_context`) and extended with each turn's tap states
(:meth:`PromptCache.update_kept`), plain turns included, so switching drafters, or a first
turn of the other drafter after plain turns, does not cost a cold prefill. A saved state keeps
its drafters' contexts too, so DFlash and DFlash2 reuse as much of it as plain decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from app.engine.target import cache_arrays

DEFAULT_MAX_BYTES = 2 * 1024**3
"""The saved states' memory bound (bytes) when none is given: 2 GiB, or less on a machine
with little memory (:func:`default_max_bytes`)."""


PREFIX_CACHE_ENV = "DFLASH_PREFIX_CACHE_MB"
"""Environment variable that sets the bound in MiB (``python -m app --prefix-cache-mb`` sets
it; 0 keeps only the last reply's state)."""


def default_max_bytes(total_memory: int | None = None) -> int:
    """The default bound for saved prefix states, in bytes: :data:`PREFIX_CACHE_ENV` MiB when
    set to a whole number >= 0, else a tenth of the machine's memory, at least 256 MiB and at
    most :data:`DEFAULT_MAX_BYTES`.

    Args:
        total_memory: bytes of memory (None: read from the OS; unknown gives the maximum).
    """
    import os

    raw = os.environ.get(PREFIX_CACHE_ENV, "").strip()
    if raw.isdigit():
        return int(raw) * 1024**2
    if total_memory is None:
        try:
            total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total_memory = 0
    if not total_memory:
        return DEFAULT_MAX_BYTES
    return int(min(DEFAULT_MAX_BYTES, max(256 * 1024**2, total_memory // 10)))


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
class SavedState:
    """A working state kept for later reuse (a conversation the user may come back to).

    Attributes:
        ids: token ids the target cache covers.
        target_cache, drafter_cache, drafter_len, snapshots, kept_contexts: as on
            :class:`PromptCache`; ``active_key`` / ``active_drafter``: whose context
            ``drafter_cache`` is.
        used: ``time.monotonic()`` of the last save or reuse (least recently used go first).
    """

    ids: list[int]
    target_cache: list
    drafter_cache: list | None
    drafter_len: int
    snapshots: list[_Snapshot]
    kept_contexts: dict
    active_key: object = None
    active_drafter: object = None
    used: float = 0.0


def _clone_cache(c):
    """A new cache object holding the same positions as ``c`` over the same (immutable) MLX
    arrays, so that writes to either never show in the other; None for a cache type this
    module cannot copy (then the state is not saved).

    ``KVCache`` and the drafter's context cache get slices of exactly their valid rows, so
    their next append allocates a new buffer; ``ArraysCache`` gets a new list of the same
    arrays (a forward pass replaces list entries, never the arrays)."""
    from app.engine.drafter import DraftContextCache

    if type(c) is KVCache:
        out = KVCache()
        if c.keys is not None and c.offset:
            out.keys = c.keys[..., : c.offset, :]
            out.values = c.values[..., : c.offset, :]
        out.offset = c.offset
        return out
    if type(c) is ArraysCache:
        out = ArraysCache(len(c.cache))
        out.cache = list(c.cache)
        out.left_padding, out.lengths = c.left_padding, c.lengths
        return out
    if type(c) is DraftContextCache:
        out = DraftContextCache(c.window, margin=c.margin)
        if c.keys is not None and c.size:
            out.keys = c.keys[..., : c.size, :]
            out.values = c.values[..., : c.size, :]
        out.offset, out.start = c.offset, c.start
        return out
    return None


def _clone_list(caches: list | None) -> list | None:
    """:func:`_clone_cache` of every cache in a list; raises ``TypeError`` when one cannot be
    copied."""
    if caches is None:
        return None
    out = [_clone_cache(c) for c in caches]
    if any(o is None for o in out):
        raise TypeError("a cache in this list cannot be copied")
    return out


def _cache_list_arrays(caches) -> list:
    """Every array a cache list holds, drafter context caches included."""
    out = []
    for c in caches or ():
        if isinstance(c, ArraysCache):
            out.extend(a for a in c.cache if a is not None)
        else:
            out.extend(a for a in (getattr(c, "keys", None), getattr(c, "values", None))
                       if a is not None)
    return out


def _state_arrays(target_cache, drafter_cache, snapshots, kept_contexts) -> list:
    """Every array one state holds (its caches, snapshots and kept contexts)."""
    out = _cache_list_arrays(target_cache) + _cache_list_arrays(drafter_cache)
    for s in snapshots:
        for arrays in s.arrays:
            out.extend(a for a in (arrays or ()) if a is not None)
    for kept in kept_contexts.values():
        out.extend(_cache_list_arrays(kept.cache))
    return out


def _context_reach(ids, drafter_cache, drafter_len, kept_contexts, active_key, key) -> int:
    """Positions of ``ids`` the context of drafter ``key`` covers in one state (0: none)."""
    if key == active_key:
        return drafter_len if drafter_cache is not None else 0
    kept = kept_contexts.get(key)
    if kept is None:
        return 0
    return min(kept.length, common_prefix(kept.ids, ids))


@dataclass
class PromptCache:
    """Caches kept between turns for one target (and optionally its drafters).

    The attributes below are the *working state*, the one the next generation continues;
    :attr:`saved` holds earlier states for other conversations (module docstring).

    Attributes:
        max_snapshot_bytes: memory bound for one state's recurrent-state snapshots (bytes).
        max_bytes: memory bound for the saved states, the working state included (bytes;
            0 keeps no saved state: reuse only from the working state).
        ids: token ids the target cache covers (``len(ids)`` positions).
        target_cache: the target's cache list (None before the first turn).
        drafter_cache: the running drafter's context caches; ``drafter_len`` positions are
            covered. ``active_key`` / ``active_drafter`` name that drafter (set by
            :meth:`switch_drafter`).
        kept_contexts: the context caches of the target's other drafters (a pair with a DFlash
            and a DFlash2 drafter), put aside by :meth:`switch_drafter` and kept in step with
            the target by :meth:`update_kept`: key -> :class:`KeptContext`.
        reuse_cap: the most prompt tokens the next :meth:`prepare` may reuse (once; None: no
            cap), set by :meth:`cap_next_reuse`.
        saved: :class:`SavedState` list, least recently used first.
        last_source: where the last :meth:`prepare` resumed from: ``"working"``, ``"saved"``
            or ``"none"`` (shown in figures and tests).
    """

    max_snapshot_bytes: int = 512 * 1024 * 1024
    max_bytes: int = field(default_factory=default_max_bytes)
    ids: list[int] = field(default_factory=list)
    target_cache: list | None = None
    drafter_cache: list | None = None
    drafter_len: int = 0
    snapshots: list[_Snapshot] = field(default_factory=list)
    kept_contexts: dict = field(default_factory=dict)
    reuse_cap: int | None = None
    active_key: object = None
    active_drafter: object = None
    saved: list[SavedState] = field(default_factory=list)
    last_source: str = "none"

    @property
    def snapshot_bytes(self) -> int:
        """Bytes held by the working state's snapshots (shown in the window)."""
        return sum(s.nbytes for s in self.snapshots)

    @property
    def nbytes(self) -> int:
        """Bytes of every array the working and saved states hold, each array counted once
        however many states share it."""
        seen: dict[int, int] = {}
        states = [(self.target_cache, self.drafter_cache, self.snapshots, self.kept_contexts)]
        states += [(s.target_cache, s.drafter_cache, s.snapshots, s.kept_contexts)
                   for s in self.saved]
        for state in states:
            for a in _state_arrays(*state):
                seen[id(a)] = a.nbytes
        return sum(seen.values())

    def clear(self) -> None:
        """Forget the working state (after a failed generation: it may be half-updated).
        Saved states stay: they were never touched by it."""
        self.ids, self.target_cache, self.drafter_cache = [], None, None
        self.drafter_len = 0
        self.snapshots = []
        self.kept_contexts = {}

    def clear_all(self) -> None:
        """Forget the working state and every saved one (memory pressure, a model switch)."""
        self.clear()
        self.saved = []

    def switch_drafter(self, old_key, new_key, old_drafter=None, new_drafter=None) -> None:
        """Make another drafter's context the active one (``drafter_cache``), keeping the
        current one aside under ``old_key``.

        Args:
            old_key, new_key: keys of the drafter that ran last and of the one about to run
                (``old_key`` None: the current context is dropped).
            old_drafter: the drafter that ran last (a ``LoadedDrafter``: its ``model`` and
                ``config.target_layer_ids``), so that :meth:`update_kept` can extend its
                context while the other one runs; None keeps nothing.
            new_drafter: the drafter about to run (kept as :attr:`active_drafter`, so a saved
                state can put this context aside in turn); None when unknown.

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
        self.active_key, self.active_drafter = new_key, new_drafter
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

    def resize(self, max_bytes: int) -> None:
        """Set :attr:`max_bytes` (bytes, >= 0) and drop saved states over it at once, the
        least recently used first."""
        self.max_bytes = max(0, int(max_bytes))
        self._evict()

    # -- choosing where to resume ----------------------------------------------------------
    def _reach(self, ids, target_cache, drafter_cache, drafter_len, snapshots, kept_contexts,
               active_key, prompt, need_drafter, cap) -> int:
        """How many tokens of ``prompt`` one state can give back (no state is changed)."""
        if target_cache is None:
            return 0
        limit = min(common_prefix(ids, prompt), len(prompt) - 1)
        if cap is not None:
            limit = min(limit, cap)
        if need_drafter:
            limit = min(limit, _context_reach(ids, drafter_cache, drafter_len, kept_contexts,
                                              active_key, self.active_key))
        linear = [isinstance(c, ArraysCache) for c in target_cache]
        start = limit
        if any(linear) and len(ids) != limit:
            usable = [s.position for s in snapshots if s.position <= limit]
            start = max(usable) if usable else 0
        if start and any(not lin and c.offset > start and not c.is_trimmable()
                         for c, lin in zip(target_cache, linear)):
            start = 0  # a rotated sliding-window cache cannot be cut back (prepare)
        return max(0, start)

    def _working_fields(self) -> tuple:
        return (self.ids, self.target_cache, self.drafter_cache, self.drafter_len,
                self.snapshots, self.kept_contexts, self.active_key)

    def _saved_fields(self, s: SavedState) -> tuple:
        return (s.ids, s.target_cache, s.drafter_cache, s.drafter_len, s.snapshots,
                s.kept_contexts, s.active_key)

    def _copy_working(self) -> SavedState | None:
        """A :class:`SavedState` over copies of the working state's caches (None when one
        of them cannot be copied)."""
        try:
            kept = {k: KeptContext(v.model, v.tap_layers, _clone_list(v.cache), v.length,
                                   list(v.ids)) for k, v in self.kept_contexts.items()}
            return SavedState(list(self.ids), _clone_list(self.target_cache),
                              _clone_list(self.drafter_cache), self.drafter_len,
                              list(self.snapshots), kept, self.active_key,
                              self.active_drafter, time.monotonic())
        except TypeError:
            return None

    def _covered_by(self, s: SavedState, other: SavedState) -> bool:
        """True when ``other`` can give back everything ``s`` can (``s`` is redundant)."""
        n = len(s.ids)
        if n > len(other.ids) or other.ids[:n] != s.ids:
            return False
        hybrid = any(isinstance(c, ArraysCache) for c in other.target_cache)
        if hybrid and n != len(other.ids) and not any(p.position == n for p in other.snapshots):
            return False
        for key in {s.active_key, *s.kept_contexts}:
            mine = _context_reach(s.ids, s.drafter_cache, s.drafter_len, s.kept_contexts,
                                  s.active_key, key)
            theirs = _context_reach(other.ids, other.drafter_cache, other.drafter_len,
                                    other.kept_contexts, other.active_key, key)
            if theirs < mine:
                return False
        return True

    def _save(self, state: SavedState) -> None:
        """Add ``state`` to :attr:`saved` (dropping saved states it covers), then evict the
        least recently used while over :attr:`max_bytes`."""
        if self.max_bytes <= 0:
            return
        self.saved = [s for s in self.saved if not self._covered_by(s, state)]
        if any(self._covered_by(state, s) for s in self.saved):
            return
        self.saved.append(state)
        self._evict()

    def _evict(self) -> None:
        """Drop the least recently used saved states while :attr:`nbytes` is over
        :attr:`max_bytes`."""
        self.saved.sort(key=lambda s: s.used)
        while self.saved and (self.max_bytes <= 0 or self.nbytes > self.max_bytes):
            self.saved.pop(0)

    def _load(self, s: SavedState) -> None:
        """Make a copy of the saved state ``s`` the working state (``s`` stays saved), with
        the running drafter's context active."""
        key, drafter = self.active_key, self.active_drafter
        self.ids = list(s.ids)
        self.target_cache = _clone_list(s.target_cache)
        self.drafter_cache = _clone_list(s.drafter_cache)
        self.drafter_len = s.drafter_len
        self.snapshots = list(s.snapshots)
        self.kept_contexts = {k: KeptContext(v.model, v.tap_layers, _clone_list(v.cache),
                                             v.length, list(v.ids))
                              for k, v in s.kept_contexts.items()}
        self.active_key, self.active_drafter = s.active_key, s.active_drafter
        s.used = time.monotonic()
        if s.active_key != key:
            self.switch_drafter(s.active_key, key, s.active_drafter, drafter)
        self.active_key, self.active_drafter = key, drafter

    # -- used by the generator -------------------------------------------------------------
    def prepare(self, prompt: list[int], need_drafter: bool) -> int:
        """Position the kept caches for ``prompt``; returns how many prompt tokens are reused.

        The working state or a copy of the saved state that gives back the most is used
        (:attr:`last_source` says which); before the working state is cut back, an uncut
        copy of it is saved. The caches then cover exactly ``prompt[:returned]``; the caller
        prefills the rest. At least the last prompt token is always prefilled (its logits
        give the first token). With nothing reusable the working caches are dropped (the
        caller makes fresh ones), as when a sliding-window (rotating) cache would have to be
        cut back after it has rotated.
        """
        cap, self.reuse_cap = self.reuse_cap, None
        here = self._reach(*self._working_fields(), prompt, need_drafter, cap)
        best, best_n = None, here
        for s in self.saved:
            n = self._reach(*self._saved_fields(s), prompt, need_drafter, cap)
            if n > best_n:
                best, best_n = s, n
        if best is not None:
            if self.target_cache is not None:
                copy = self._copy_working()
                if copy is not None:
                    self._save(copy)
            self._load(best)
            self.last_source = "saved"
        elif self.target_cache is not None and here < len(self.ids):
            copy = self._copy_working()  # the working state is cut below: keep it whole
            if copy is not None:
                self._save(copy)
            self.last_source = "working" if here else "none"
        else:
            self.last_source = "working" if here else "none"
        start = best_n
        if start == 0:
            kept = self.kept_contexts  # other drafters' contexts check their own tokens
            self.clear()
            self.kept_contexts = kept
            return 0
        linear = [isinstance(c, ArraysCache) for c in self.target_cache]
        if any(linear) and len(self.ids) != start:
            snap = next(s for s in self.snapshots if s.position == start)
            for c, arrays in zip(self.target_cache, snap.arrays):
                if arrays is not None:
                    c.cache = list(arrays)
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
        self._evict()
