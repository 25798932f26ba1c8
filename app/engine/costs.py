"""What a DFlash cycle costs on this machine: the cost model the block-size controller uses.

A cycle of block length ``L`` (the pending token and ``L - 1`` drafts; ``L = 1`` is one plain
step of the target, no draft) costs

* ``draft(L, ctx)``: the drafter's pass over the block (DFlash: one forward and the LM head;
  DFlash2: the same plus the candidate selector's walk), 0 for ``L = 1``;
* ``verify(L, ctx)``: the target's forward over the ``L`` tokens with tap capture (and, for a
  hybrid target, the Gated DeltaNet tapes of the rollback unit); for ``L = 1`` a plain step;
* ``rollback(L)``: putting the target cache back to what was accepted
  (:class:`app.engine.rollback.VerifyCheckpoint`, measured keeping half the block); paid only
  when a draft is rejected.

``ctx`` is the number of positions already in the target cache. Attention work grows with
``L * ctx`` and the rest does not depend on ``ctx``, so each stage is modelled, per measured
``L``, as a straight line in ``ctx`` through the figures measured at two context lengths
(extrapolated past the longer one, never below the shorter one's figure), and linearly
between the measured block lengths.

:func:`calibrate` measures those figures on the loaded pair: the target's cache is filled
with zero keys and values of ``ctx`` positions (no prefill is run: the cost of attention
depends on the length, not the values) and the drafter's context cache with ``ctx`` zero
rows; then each stage runs on it and the fastest of ``repeats`` runs is kept. On the bundled
demo pair on a 2-core CPU it takes about a quarter of a second (``tools/bench_auto.py``
prints it). The figures are milliseconds of wall time, the device waited for after each
stage. What the engine then measures per cycle corrects them online
(:class:`app.engine.block_control.BlockController`).

:class:`CostModel` is a plain record (``to_dict`` / ``from_dict``); :func:`model_for` keeps
one per loaded pair in memory for the life of the models (measured on the first reply that
asks for the automatic block size). With a store set (:func:`set_store`: the CLI sets the
app-data folder), measured models are also written to ``cost_models.json`` there, keyed by
the target and drafter folders, the rollback strategy and the device, and a later process
reads them instead of measuring again (:func:`stored_models` lists them; ``python -m app
models --json`` shows them as ``cost_models``).
"""

from __future__ import annotations

import json
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

from app.engine.errors import GenerationError

CALIBRATION_LENGTHS = (1, 2, 8, 16)
"""Block lengths measured (those up to the drafter's block size, plus that size)."""

CALIBRATION_CONTEXTS = (64, 2048)
"""Context lengths (positions in the target cache) measured."""


@dataclass
class CostModel:
    """Measured milliseconds of a cycle's stages by block length and context length.

    Attributes:
        lengths: the measured block lengths, ascending, starting at 1.
        contexts: the two measured context lengths (positions), ascending.
        verify_ms: ``[context index][length index]``: ms of the target's pass over ``L``
            tokens (``L = 1``: a plain step).
        draft_ms: the same for the drafter's pass (0 for ``L = 1``).
        rollback_ms: ``[length index]``: ms of a rollback after a pass of ``L`` tokens
            (0 for ``L = 1``); independent of the context.
        device: the device the figures were measured on (``app.engine.device``'s words).
        calibration_s: wall seconds the measurement took.
    """

    lengths: list[int]
    contexts: list[int]
    verify_ms: list[list[float]]
    draft_ms: list[list[float]]
    rollback_ms: list[float]
    device: str = ""
    calibration_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.lengths or self.lengths[0] != 1 or sorted(set(self.lengths)) != \
                list(self.lengths):
            raise ValueError(f"lengths must be ascending from 1, got {self.lengths}")
        if len(self.contexts) != 2 or self.contexts[0] >= self.contexts[1]:
            raise ValueError(f"contexts must be two ascending lengths, got {self.contexts}")
        n = len(self.lengths)
        for name in ("verify_ms", "draft_ms"):
            rows = getattr(self, name)
            if len(rows) != 2 or any(len(r) != n for r in rows):
                raise ValueError(f"{name} must be 2 rows of {n} figures")
        if len(self.rollback_ms) != n:
            raise ValueError(f"rollback_ms must hold {n} figures")
        self._lines: dict[tuple[str, int], tuple[float, float]] = {}  # _at's, by stage, L

    @property
    def max_length(self) -> int:
        """The longest measured block."""
        return self.lengths[-1]

    def _at(self, stage: str, length: int, ctx: int) -> float:
        # the controller asks for every length every cycle: the interpolation in the block
        # length (independent of ctx) is kept per (stage, length)
        key = (stage, length)
        line = self._lines.get(key)
        if line is None:
            lo, hi = (self._in_length(r, length) for r in getattr(self, stage))
            c0, c1 = self.contexts
            line = self._lines[key] = (lo, max(0.0, (hi - lo) / (c1 - c0)))
        lo, slope = line
        return lo + slope * max(0, ctx - self.contexts[0])

    def _in_length(self, row: list[float], length: int) -> float:
        ls = self.lengths
        if length <= ls[0]:
            return row[0]
        for i in range(1, len(ls)):
            if length <= ls[i]:
                a, b = ls[i - 1], ls[i]
                return row[i - 1] + (row[i] - row[i - 1]) * (length - a) / (b - a)
        # past the longest measured block: the last segment's slope
        if len(ls) == 1:
            return row[0]
        a, b = ls[-2], ls[-1]
        return row[-1] + (row[-1] - row[-2]) * (length - b) / (b - a)

    def verify(self, length: int, ctx: int) -> float:
        """ms of the target's pass over ``length`` tokens after ``ctx`` cached positions."""
        return self._at("verify_ms", length, ctx)

    def draft(self, length: int, ctx: int) -> float:
        """ms of the drafter's pass for a block of ``length`` (0 for ``length <= 1``)."""
        return 0.0 if length <= 1 else self._at("draft_ms", length, ctx)

    def rollback(self, length: int) -> float:
        """ms of a rollback after a pass of ``length`` tokens (0 for ``length <= 1``)."""
        return 0.0 if length <= 1 else self._in_length(self.rollback_ms, length)

    def to_dict(self) -> dict:
        """JSON-ready dict (``from_dict`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        """The model ``to_dict`` wrote.

        Raises:
            ValueError: a missing key or malformed figures.
        """
        try:
            return cls(lengths=[int(x) for x in d["lengths"]],
                       contexts=[int(x) for x in d["contexts"]],
                       verify_ms=[[float(x) for x in r] for r in d["verify_ms"]],
                       draft_ms=[[float(x) for x in r] for r in d["draft_ms"]],
                       rollback_ms=[float(x) for x in d["rollback_ms"]],
                       device=str(d.get("device", "")),
                       calibration_s=float(d.get("calibration_s", 0.0)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a cost model: {exc}") from None


def _fill_target_cache(runner, ctx: int, taps: list[int]) -> list:
    """A target cache holding ``ctx`` positions: one real step, then zero keys/values."""
    cache = runner.make_cache()
    ids = mx.array([[1]], dtype=mx.int32)
    out = runner.forward(ids, cache, taps=taps, all_logits=False)
    mx.eval(out[0])
    from app.engine.target import cache_arrays

    if ctx > 1:
        for c, lin in zip(cache, runner.linear):
            if lin or getattr(c, "keys", None) is None:
                continue
            k = c.keys[..., :1, :]
            shape = (*k.shape[:2], ctx - 1, k.shape[3])
            v_shape = (*c.values.shape[:2], ctx - 1, c.values.shape[3])
            c.update_and_fetch(mx.zeros(shape, dtype=k.dtype),
                               mx.zeros(v_shape, dtype=c.values.dtype))
    mx.eval(cache_arrays(cache))
    return cache


def _fill_drafter_cache(dmodel, ctx: int, width: int) -> list:
    """A drafter context cache holding ``ctx`` zero rows (a stand-in without
    ``extend_context`` gets its own empty cache)."""
    dcache = dmodel.make_cache()
    extend = getattr(dmodel, "extend_context", None)
    if extend is not None:
        fc = getattr(dmodel, "fc", None)
        dtype = fc.weight.dtype if fc is not None else mx.float32
        extend(mx.zeros((1, ctx, width), dtype=dtype), dcache)
        mx.eval([a for c in dcache for a in (getattr(c, "keys", None),
                                             getattr(c, "values", None)) if a is not None])
    return dcache


class _Stages:
    """The target's stages of one cycle of block ``ids`` ``(1, L)`` on ``cache``, each
    waited for and leaving the cache at its context length (a sliding-window layer's one
    position longer after each 1-token step; the GDN state is not restored: only times
    matter here)."""

    def __init__(self, runner, cache: list, taps: list[int], strategy: str, ids: mx.array):
        self.runner, self.cache, self.taps, self.strategy, self.ids = (
            runner, cache, taps, strategy, ids)

    def verify(self):
        """The pass (a plain step for L = 1, which is trimmed at once: returns None), else
        its :class:`~app.engine.rollback.VerifyCheckpoint`, not yet committed."""
        from app.engine.rollback import VerifyCheckpoint
        from app.engine.target import trim_attention

        runner, cache, ids = self.runner, self.cache, self.ids
        if ids.shape[1] == 1:
            logits, vt = runner.forward(ids, cache, taps=self.taps)
            mx.eval(mx.argmax(logits[0], axis=-1), vt)
            # back to the context length; a sliding-window cache keeps the step: a 1-token
            # step writes its ring buffer in place, which a trim cannot undo, and the next
            # multi-token pass puts the buffer back in temporal order (one position more in
            # a window costs nothing measurable)
            trim_attention(cache, [lin or isinstance(c, RotatingKVCache)
                                   for c, lin in zip(cache, runner.linear)], 1)
            return None
        ck = VerifyCheckpoint(runner, cache, self.strategy, mx.eval)
        logits, vt = runner.forward(ids, cache, taps=self.taps, tapes=ck.begin(ids))
        choice = mx.argmax(logits[0], axis=-1)
        mx.eval(mx.cumprod(ids[0, 1:] == choice[:-1]).sum(), choice, vt)
        return ck

    def verify_and_undo(self) -> None:
        """:meth:`verify`, then the whole pass dropped (timed together)."""
        ck = self.verify()
        if ck is not None:
            ck.restore()

    def rollback(self) -> float:
        """Seconds of committing half of a verify pass (the pass itself not timed); the kept
        positions are then trimmed."""
        from app.engine.target import cache_arrays, trim_attention

        ck = self.verify()
        keep = max(1, int(self.ids.shape[1]) // 2)
        t0 = time.perf_counter()
        ck.commit(keep)  # queue=mx.eval waits for it
        dt = time.perf_counter() - t0
        trim_attention(self.cache, self.runner.linear, keep)
        mx.eval(cache_arrays(self.cache))
        return dt


def _wait(drafts) -> None:
    """Wait for a drafter's lazy output (a host list, as a test's stand-in returns, is
    already there)."""
    if isinstance(drafts, mx.array):
        mx.eval(drafts)


def _best(fn, repeats: int) -> float:
    """Fastest of ``repeats`` runs of ``fn`` (which waits for its own work), in ms."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def calibrate(runner, drafter, strategy: str = "tape", lengths: tuple[int, ...] | None = None,
              contexts: tuple[int, int] = CALIBRATION_CONTEXTS, repeats: int = 2) -> CostModel:
    """Measure the stages of a cycle on ``runner``'s target and ``drafter`` (module doc).

    Args:
        runner: the target's :class:`~app.engine.target.TargetRunner`.
        drafter: a ``LoadedDrafter`` (DFlash or DFlash2; its ``model.draft`` is timed).
        strategy: the rollback strategy whose cost is measured (``tape`` or ``replay``).
        lengths: block lengths to measure; default :data:`CALIBRATION_LENGTHS` up to the
            drafter's block size, plus that size.
        contexts: the two context lengths (positions) measured.
        repeats: runs per figure; the fastest is kept.

    Returns:
        A :class:`CostModel` (ms).

    Raises:
        GenerationError: ``lengths`` not starting at 1, or contexts not two ascending
            lengths >= 1.
    """
    from app.engine.device import device_description

    t_start = time.perf_counter()
    block = int(drafter.config.block_size)
    if lengths is None:
        lengths = tuple(sorted({x for x in CALIBRATION_LENGTHS if x <= block} | {block}))
    if not lengths or lengths[0] != 1:
        raise GenerationError(f"calibration lengths must start at 1, got {lengths}")
    if len(contexts) != 2 or not 1 <= contexts[0] < contexts[1]:
        raise GenerationError(f"calibration contexts must be two ascending lengths, got "
                              f"{contexts}")
    taps = list(drafter.config.target_layer_ids)
    dmodel = drafter.model
    verify_rows, draft_rows = [], []
    rollback = [0.0] * len(lengths)
    mask = int(drafter.config.mask_token_id)
    for ci, ctx in enumerate(contexts):
        cache = _fill_target_cache(runner, ctx, taps)
        dcache = _fill_drafter_cache(dmodel, ctx, len(taps) * runner.hidden_size)
        vrow, drow = [], []
        for li, L in enumerate(lengths):
            ids = mx.array([[1] + [mask] * (L - 1)], dtype=mx.int32)
            stage = _Stages(runner, cache, taps, strategy, ids)
            vrow.append(_best(stage.verify_and_undo, repeats))
            if L > 1:
                if ci == 0:  # the rollback does not depend on the context
                    rollback[li] = min(stage.rollback() for _ in range(max(1, repeats))) * 1e3
                drow.append(_best(lambda L=L, d=dcache: _wait(dmodel.draft(runner, 1, L, None,
                                                                           d)), repeats))
            else:
                drow.append(0.0)
        verify_rows.append(vrow)
        draft_rows.append(drow)

    return CostModel(list(lengths), list(contexts), verify_rows, draft_rows, rollback,
                     device=device_description(), calibration_s=time.perf_counter() - t_start)


_MODELS: dict[int, dict] = {}
"""``id(drafter.model)`` -> ``{(id(target model), strategy): CostModel}``; an entry goes when
its drafter model is freed (MLX modules are dicts, so not weak-dictionary keys)."""


def _per_drafter(drafter) -> dict:
    key = id(drafter.model)
    if key not in _MODELS:
        _MODELS[key] = {}
        weakref.finalize(drafter.model, _MODELS.pop, key, None)
    return _MODELS[key]


STORE_NAME = "cost_models.json"
"""The file, in the store folder, that keeps measured cost models between processes."""

_store: list[Path | None] = [None]


def set_store(folder: str | Path | None) -> None:
    """Keep measured cost models in ``folder``/:data:`STORE_NAME` (None: in memory only)."""
    _store[0] = Path(folder) / STORE_NAME if folder else None


def _pair_key(target_path, drafter, strategy: str, device: str) -> str | None:
    dpath = getattr(drafter, "path", None)
    if not target_path or not dpath:
        return None
    return " | ".join((str(Path(target_path).resolve()), str(Path(dpath).resolve()),
                       strategy, device))


def _read_store(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # a speed aid only: unreadable means measure again
        return {}
    return data if isinstance(data, dict) else {}


def stored_models(folder: str | Path) -> list[dict]:
    """The cost models stored in ``folder`` (:func:`set_store`), each ``{"target",
    "drafter", "rollback", "device", **CostModel.to_dict()}``; [] when none (or unreadable)."""
    out = []
    for key, model in _read_store(Path(folder) / STORE_NAME).items():
        parts = key.split(" | ")
        if len(parts) == 4 and isinstance(model, dict):
            out.append({"target": parts[0], "drafter": parts[1], "rollback": parts[2],
                        **model, "device": parts[3]})
    return out


def model_for(runner, target_model, drafter, strategy: str = "tape",
              target_path=None) -> CostModel:
    """The :class:`CostModel` of the loaded pair (``target_model``, ``drafter``) for rollback
    ``strategy``: from memory; else, with a store set and ``target_path`` given, the one
    stored for this pair and device; else measured by :func:`calibrate` (and stored). Kept
    in memory as long as the drafter's model lives."""
    per_drafter = _per_drafter(drafter)
    key = (id(target_model), strategy)
    model = per_drafter.get(key)
    if model is not None:
        return model
    store = _store[0]
    skey = None
    if store is not None:
        from app.engine.device import device_description

        skey = _pair_key(target_path, drafter, strategy, device_description())
    stored = _read_store(store).get(skey) if skey else None
    if stored is not None:
        try:
            model = CostModel.from_dict(stored)
        except ValueError:
            model = None
    if model is None:
        model = calibrate(runner, drafter, strategy)
        if skey:
            data = _read_store(store)
            data[skey] = model.to_dict()
            try:
                store.parent.mkdir(parents=True, exist_ok=True)
                store.write_text(json.dumps(data, indent=1))
            except OSError:
                pass  # kept in memory; the next process measures again
    per_drafter[key] = model
    return model


def remember(drafter, target_model, model: CostModel, strategy: str = "tape") -> None:
    """Keep ``model`` as the pair's cost model (what :func:`model_for` then returns without
    measuring; for tests and for figures stored from an earlier run)."""
    _per_drafter(drafter)[(id(target_model), strategy)] = model


def remember_state(drafter, target_model, state: dict, kind: str = "greedy") -> None:
    """Keep a block controller's learned state (``BlockController.state``) for the pair's
    next reply of the same ``kind`` (``"greedy"``, or ``"sampled"`` for replies with
    temperature or a repetition penalty, whose acceptance differs), in memory, as long as the
    drafter's model lives."""
    _per_drafter(drafter)[("state", id(target_model), kind)] = state


def known_state(drafter, target_model, kind: str = "greedy") -> dict | None:
    """The pair's last kept controller state of ``kind``, or None."""
    return _MODELS.get(id(drafter.model), {}).get(("state", id(target_model), kind))


def known_model(drafter, target_model, strategy: str = "tape") -> CostModel | None:
    """The pair's measured :class:`CostModel` if :func:`model_for` has measured it, else
    None (nothing is measured)."""
    return _MODELS.get(id(drafter.model), {}).get((id(target_model), strategy))
