"""A target sharded over several processes by layer ranges, on MLX's distributed layer.

Pipeline parallelism over ``mx.distributed`` (the ring backend over Ethernet or Thunderbolt,
started by ``mlx.launch`` or by :mod:`app.commands.distributed`); no transport of the app's
own. Rank 0 holds the embedding, the first layer range, the final norm and the LM head, the
drafter and the text pipeline; rank ``r > 0`` holds the layers of its range only. One forward
pass (a prefill chunk, a plain step, a verify block, a replay) crosses the group once:

    rank 0: embed -> its layers --header, hidden--> rank 1: its layers --> ... rank N-1
    rank N-1 --hidden (and the tap states of the layers ranks 1.. hold)--> rank 0: norm, head

so a DFlash cycle of ``L`` tokens crosses the network once where plain decoding crosses it
once per token. Rank 0 drives every other rank with small int32 headers (:data:`HEADER`):

* ``FORWARD``: run the next ``S`` positions through the layers; a verify pass also begins each
  rank's own :class:`~app.engine.rollback.VerifyCheckpoint` (Gated DeltaNet tapes);
* ``COMMIT n``/``RESTORE``: each rank keeps ``n`` positions of the pass (or none) with the same
  rollback code a single process runs (tape, or for ``replay`` the recurrent state put back and
  attention trimmed: rank 0 then sends the kept tokens through the pipeline as a ``FORWARD``);
* ``RESET`` (a new, empty cache for a new reply), ``DUMP`` (send the cache to rank 0, for
  tests), ``STOP`` (leave the loop).

Every exchange on rank 0 runs on one communication thread with its own MLX stream and is
waited for at most ``timeout`` seconds: a rank that dies (the ring reports a lost connection)
or stops answering raises :class:`~app.engine.errors.PeerLostError` within that time, and the
group is then unusable (:attr:`Link.lost`). Other ranks wait for rank 0 without a limit and
leave their loop when its connection is lost.
"""

from __future__ import annotations

import concurrent.futures
import math
import queue
import threading
import time
from dataclasses import dataclass, field

import mlx.core as mx

from app.engine.errors import GenerationError, PeerLostError
from app.engine.rollback import VerifyCheckpoint
from app.engine.target import TargetRunner, cache_arrays

#: int32 entries of one command header: ``[op, a, b, flags, dtype, width, ntaps, taps...]``.
HEADER = 32
MAX_TAPS = HEADER - 7

FORWARD, COMMIT, RESTORE, RESET, DUMP, STOP = 1, 2, 3, 4, 5, 6

# FORWARD flags
VERIFY = 1  # begin a verify pass (rollback checkpoint, GDN tapes)
ALL_POSITIONS = 2  # send every position back (else the last one only)
CHUNKED = 4  # the chunked GDN recurrence (fast_verify) for this pass
# RESET / COMMIT flags
FAST_VERIFY = 8
REPLAY = 16

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
CACHE_DTYPES = [mx.float32, mx.float16, mx.bfloat16, mx.int32]

DEFAULT_TIMEOUT_S = 30.0


def layer_ranges(split: list[int]) -> list[tuple[int, int]]:
    """``[(first, end), ...]`` per rank for layer counts per rank (``[12, 12]`` ->
    ``[(0, 12), (12, 24)]``)."""
    out, start = [], 0
    for n in split:
        out.append((start, start + n))
        start += n
    return out


def even_split(num_layers: int, size: int) -> list[int]:
    """Layer counts per rank for ``size`` ranks, as even as can be (the first ranks get the
    extra layers).

    Raises:
        GenerationError: fewer layers than ranks.
    """
    if size > num_layers:
        raise GenerationError(f"{num_layers} layers cannot be shared by {size} processes")
    base, extra = divmod(num_layers, size)
    return [base + (1 if r < extra else 0) for r in range(size)]


@dataclass
class Traffic:
    """What the group exchanged, counted on rank 0 (every hop of every pass, both ways).

    Attributes:
        bytes_sent: payload and header bytes put on the network by all ranks.
        messages: messages sent by all ranks.
        exchanges: forward passes and commands rank 0 issued.
        wait_s: seconds rank 0 waited on the network (its sends, the other ranks' layers and
            their sends back).
        log: one ``(op, positions, flags, bytes, wait seconds)`` per exchange of the current
            sequence, in order (``positions`` 0 for a command); a new cache starts it again.
    """

    bytes_sent: int = 0
    messages: int = 0
    exchanges: int = 0
    wait_s: float = 0.0
    log: list = field(default_factory=list)

    def add(self, op: int, nbytes: int, messages: int, positions: int = 0, flags: int = 0,
            wait_s: float = 0.0) -> None:
        """Count one exchange of ``messages`` messages and ``nbytes`` bytes."""
        self.bytes_sent += nbytes
        self.messages += messages
        self.exchanges += 1
        self.wait_s += wait_s
        self.log.append((op, positions, flags, nbytes, wait_s))


class Link:
    """One rank's end of the group: sends and receives over ``mx.distributed``.

    Args:
        group: the ``mx.distributed.Group`` (``mx.distributed.init(backend="ring")``).
        timeout: rank 0 only: seconds an exchange may take before the peers count as lost
            (None: no limit).

    On rank 0 every exchange runs on one thread that owns its own MLX CPU stream, so the
    caller's thread can stop waiting after ``timeout``; arrays handed to it must be evaluated.
    """

    def __init__(self, group, timeout: float | None = DEFAULT_TIMEOUT_S):
        self.group = group
        self.rank = group.rank()
        self.size = group.size()
        self.timeout = timeout
        self.lost: str | None = None
        self._jobs: queue.Queue | None = None
        if self.rank == 0 and self.size > 1:
            self._jobs = queue.Queue()
            # a daemon thread: one stuck on a lost peer does not hold the process's exit
            threading.Thread(target=self._serve_jobs, name="dflash-net", daemon=True).start()

    def _serve_jobs(self) -> None:
        stream = mx.new_stream(mx.cpu)  # MLX streams belong to the thread that made them
        while True:
            fn, future = self._jobs.get()
            try:
                with mx.stream(stream):
                    future.set_result(fn())
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)

    def run(self, fn, what: str):
        """Run ``fn()`` (it sends and receives and evaluates what it receives) and return its
        result; on rank 0 on the communication thread, waited for at most ``timeout``.

        Raises:
            PeerLostError: the connection to a rank was lost, or nothing came back in time.
        """
        if self.lost:
            raise PeerLostError(self.lost)
        if self._jobs is None:
            try:
                return fn()
            except RuntimeError as exc:
                self.lost = f"the connection to a process of the group was lost ({exc})"
                raise PeerLostError(self.lost) from exc

        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, future))
        try:
            return future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            self.lost = (f"a process of the group did not answer within {self.timeout:g} s "
                         f"({what}): the host dropped or hangs")
        except RuntimeError as exc:
            self.lost = f"the connection to a process of the group was lost ({what}: {exc})"
        raise PeerLostError(self.lost)  # a thread stuck on a silent peer is left behind

    def barrier(self) -> None:
        """Wait, without a time limit, until every rank of the group gets here (after loading
        its layers, which may take minutes for a large target)."""
        mx.eval(mx.distributed.all_sum(mx.zeros((1,), dtype=mx.int32), group=self.group))

    def send(self, x: mx.array, dst: int) -> None:
        """Send the evaluated array ``x`` to rank ``dst`` (inside :meth:`run`)."""
        mx.eval(mx.distributed.send(x, dst, group=self.group))

    def recv(self, shape, dtype, src: int) -> mx.array:
        """Receive an array of ``shape``/``dtype`` from rank ``src`` (inside :meth:`run`)."""
        out = mx.distributed.recv(tuple(shape), dtype, src, group=self.group)
        mx.eval(out)
        return out


def _header(op: int, a: int = 0, b: int = 0, flags: int = 0, dtype: int = 0, width: int = 0,
            taps=()) -> mx.array:
    taps = list(taps)
    if len(taps) > MAX_TAPS:
        raise GenerationError(f"at most {MAX_TAPS} tap layers can be sent, not {len(taps)}")
    values = [op, a, b, flags, dtype, width, len(taps), *taps]
    return mx.array(values + [0] * (HEADER - len(values)), dtype=mx.int32)


def _nbytes(a: mx.array) -> int:
    return int(a.size) * a.dtype.size


class DistributedRunner(TargetRunner):
    """Rank 0's :class:`~app.engine.target.TargetRunner` for a target whose layers are spread
    over a group: the same ``forward``, ``make_cache`` and rollback the engine uses on one
    process, with the other ranks' layers run by them (module docstring).

    Args:
        model: the mlx-lm model as loaded on rank 0 (its layers outside ``ranges[0]`` may be
            stand-ins without weights; ``is_linear`` must be right on every layer).
        model_type: the config's ``model_type``.
        link: rank 0's :class:`Link`.
        ranges: ``(first, end)`` layer ids per rank (:func:`layer_ranges`), rank 0's first.

    Raises:
        UnsupportedArchitectureError: as :class:`TargetRunner`.
        GenerationError: ranges that do not start at layer 0 or do not cover every layer.
    """

    def __init__(self, model, model_type: str, link: Link, ranges: list[tuple[int, int]]):
        all_layers = list(model.layers)
        if ranges[0][0] != 0 or ranges[-1][1] != len(all_layers) or len(ranges) != link.size:
            raise GenerationError(f"layer ranges {ranges} do not cover the {len(all_layers)} "
                                  f"layers over {link.size} processes")
        self.all_linear = [bool(getattr(layer, "is_linear", False)) for layer in all_layers]
        lo, hi = ranges[0]
        self.link = link
        self.ranges = list(ranges)
        self.traffic = Traffic()
        self._cache = None
        self._verifying = False
        self.fast_verify = False
        super().__init__(model, model_type)
        self.layers = all_layers[lo:hi]
        self.linear = self.all_linear[lo:hi]
        self.first_layer = lo
        self.hybrid = any(self.all_linear)
        self.num_layers = len(all_layers)

    # -- the TargetRunner interface -----------------------------------------------------
    def make_cache(self) -> list:
        """Rank 0's cache (its layers) for a new sequence; every other rank starts a new,
        empty one too (``RESET``). Only the latest cache is live on the other ranks.

        Raises:
            PeerLostError: a rank is lost.
        """
        full = super().make_cache()
        self.traffic.log.clear()
        lo, hi = self.ranges[0]
        self._cache = full[lo:hi]
        self._command(RESET, flags=FAST_VERIFY if self.fast_verify else 0)
        return self._cache

    def checkpoint(self, cache: list, strategy: str = "tape",
                   queue=mx.async_eval) -> VerifyCheckpoint:
        """The rollback unit for one verify pass on every rank (:class:`GroupCheckpoint`)."""
        return GroupCheckpoint(self, cache, strategy, queue)

    def forward(self, ids, cache, taps=None, tapes=None, all_logits=True, embeds=None):
        """As :meth:`TargetRunner.forward`, the layers of the other ranks run by them.

        Raises:
            PeerLostError: a rank died or did not answer within the link's timeout.
        """
        h = self.inner.embed_tokens(ids) if embeds is None else embeds
        verify, self._verifying = self._verifying, False
        h, captured = self.run_layers(h, cache, taps, tapes)
        S, hidden = int(h.shape[1]), int(h.shape[2])
        taps = list(taps or ())
        flags = (VERIFY if verify else 0) | (ALL_POSITIONS if all_logits or taps else 0)
        if verify and self.fast_verify:
            flags |= CHUNKED
        remote = [t for t in taps if t >= self.ranges[0][1]]
        remote.sort()
        back = S if flags & ALL_POSITIONS else 1
        header = _header(FORWARD, S, hidden, flags, DTYPES.index(h.dtype), hidden, taps)
        mx.eval(h)
        out = self._exchange(header, h, taps, (1, back, hidden * (1 + len(remote))))
        h = out[..., :hidden]
        for k, t in enumerate(remote):
            captured[t] = out[..., hidden * (k + 1): hidden * (k + 2)]
        tap_states = mx.concatenate([captured[i] for i in taps], axis=-1) if taps else None
        if not all_logits:
            h = h[:, -1:, :]
        return self.lm_head(self.inner.norm(h)), tap_states

    # -- commands -------------------------------------------------------------------------
    def _exchange(self, header: mx.array, h: mx.array, taps: list[int], back_shape) -> mx.array:
        """Send ``header`` and ``h`` ``(1, S, hidden)`` to rank 1 and receive the last rank's
        answer of ``back_shape`` (the stream, then the tap states ranks 1.. captured)."""
        link = self.link
        t0 = time.perf_counter()

        def go():
            link.send(header, 1)
            link.send(h, 1)
            return link.recv(back_shape, h.dtype, link.size - 1)

        out = link.run(go, "a forward pass")
        waited = time.perf_counter() - t0
        # every hop: a header and the stream forward (wider by the tap states each rank
        # adds), the answer back to rank 0
        S, hidden = int(h.shape[1]), int(h.shape[2])
        size, width, nbytes = h.dtype.size, hidden, 0
        for r in range(1, link.size):
            nbytes += _nbytes(header) + S * width * size
            lo, hi = self.ranges[r]
            width += hidden * sum(1 for t in taps if lo <= t < hi)
        nbytes += math.prod(back_shape) * size
        flags = int(header[3].item())
        self.traffic.add(FORWARD, nbytes, 2 * (link.size - 1) + 1, S, flags, waited)
        return out

    def _command(self, op: int, a: int = 0, b: int = 0, flags: int = 0) -> None:
        """Send a header-only command along the pipeline."""
        header = _header(op, a, b, flags)
        mx.eval(header)
        t0 = time.perf_counter()
        self.link.run(lambda: self.link.send(header, 1), "a command")
        self.traffic.add(op, _nbytes(header) * (self.link.size - 1), self.link.size - 1,
                         wait_s=time.perf_counter() - t0)

    def gather_cache(self) -> list[list[mx.array]]:
        """The live cache of every layer of the model, in layer order: rank 0's own arrays
        and those the other ranks send (``DUMP``; two-rank groups). For tests: each entry is
        a layer's arrays (GDN conv and recurrent state, or attention keys and values up to
        its offset).

        Raises:
            PeerLostError: a rank is lost.
        """
        out = [cache_state(c) for c in self._cache]
        header = _header(DUMP)
        mx.eval(header)
        link = self.link

        def go():
            link.send(header, 1)
            layers = []
            for r in range(1, link.size):
                meta = link.recv((4096,), mx.int32, r).tolist()
                k = 1
                for _ in range(meta[0]):
                    count = meta[k]
                    k += 1
                    arrays = []
                    for _ in range(count):
                        code, ndim = meta[k], meta[k + 1]
                        shape = meta[k + 2: k + 2 + ndim]
                        k += 2 + ndim
                        arrays.append(link.recv(shape, CACHE_DTYPES[code], r))
                    layers.append(arrays)
            return layers

        return out + link.run(go, "a cache dump")

    def stop(self) -> None:
        """Tell the other ranks to leave their loop (nothing when the group is lost)."""
        if self.link.lost is None and self.link.size > 1:
            try:
                self._command(STOP)
            except PeerLostError:
                pass


def cache_state(c) -> list[mx.array]:
    """One layer cache's arrays as they stand: GDN ``[conv, state]``, or attention
    ``[keys, values]`` cut to the cache's live positions (a sliding-window cache's whole
    buffer), empty before the first pass."""
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache

    if isinstance(c, ArraysCache):
        return [a for a in c.cache if a is not None]
    if getattr(c, "keys", None) is None:
        return []
    if isinstance(c, RotatingKVCache):
        return [c.keys, c.values]
    return [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]


class GroupCheckpoint(VerifyCheckpoint):
    """Rank 0's :class:`~app.engine.rollback.VerifyCheckpoint`: the verify pass it begins
    begins on every rank, and ``commit``/``restore`` run on every rank for its own layers
    (the same code), the command sent before rank 0 does its part."""

    runner: DistributedRunner

    def begin(self, ids: mx.array):
        """As :meth:`VerifyCheckpoint.begin`; the next forward is a verify pass on every
        rank."""
        self.runner._verifying = True
        return super().begin(ids)

    def commit(self, n: int) -> bool:
        """As :meth:`VerifyCheckpoint.commit`, on every rank (``replay``: the kept tokens go
        through the whole pipeline again)."""
        L = self.length
        if 1 <= n <= L:
            flags = (FAST_VERIFY if self.runner.fast_verify else 0) | (
                REPLAY if self.strategy == "replay" else 0)
            self.runner._command(COMMIT, n, L, flags)
        return super().commit(n)

    def restore(self) -> None:
        """As :meth:`VerifyCheckpoint.restore`, on every rank."""
        if self.length:
            self.runner._command(RESTORE, 0, self.length)
        super().restore()


class _ShardCheckpoint(VerifyCheckpoint):
    """A non-zero rank's checkpoint: replay's forward pass comes from rank 0."""

    def _replay(self, kept: mx.array) -> None:
        return None


class ShardWorker:
    """A rank ``r > 0``: its layers, its cache, and the loop that serves rank 0's commands.

    Args:
        model: the mlx-lm model as loaded on this rank (layers outside its range may be
            stand-ins without weights).
        model_type: the config's ``model_type``.
        link: this rank's :class:`Link`.
        ranges: ``(first, end)`` layer ids per rank.
    """

    def __init__(self, model, model_type: str, link: Link, ranges: list[tuple[int, int]]):
        runner = TargetRunner.__new__(TargetRunner)
        all_layers = list(model.layers)
        lo, hi = ranges[link.rank]
        runner.model = model
        runner.model_type = model_type
        runner.layers = all_layers[lo:hi]
        runner.linear = [bool(getattr(layer, "is_linear", False)) for layer in runner.layers]
        runner.first_layer = lo
        runner.hybrid = any(getattr(layer, "is_linear", False) for layer in all_layers)
        runner.fast_verify = False
        runner.num_layers = len(all_layers)
        self.runner = runner
        self.link = link
        self.ranges = ranges
        self._full_cache = lambda: TargetRunner.make_cache(runner)
        self.cache = self._full_cache()[lo:hi]
        self.checkpoint: VerifyCheckpoint | None = None

    def serve(self) -> str:
        """Serve commands until ``STOP`` (returns ``"stopped"``) or until the connection to
        the group is lost (returns ``"lost"``)."""
        link = self.link
        prev, nxt = link.rank - 1, (link.rank + 1) % link.size
        last = link.rank == link.size - 1
        try:
            while True:
                head = link.recv((HEADER,), mx.int32, prev)
                values = head.tolist()
                op = values[0]
                if op == FORWARD:
                    self._forward(values, prev, nxt, last)
                    continue
                if not last:
                    link.send(head, nxt)
                if op == STOP:
                    return "stopped"
                self._command(op, values)
        except RuntimeError:
            return "lost"

    def _command(self, op: int, values: list[int]) -> None:
        runner, lo_hi = self.runner, self.ranges[self.link.rank]
        flags = values[3]
        if op == RESET:
            runner.fast_verify = bool(flags & FAST_VERIFY)
            self.cache = self._full_cache()[lo_hi[0]:lo_hi[1]]
            self.checkpoint = None
        elif op == COMMIT:
            runner.fast_verify = bool(flags & FAST_VERIFY)
            self.checkpoint.strategy = "replay" if flags & REPLAY else "tape"
            self.checkpoint.commit(values[1])
            mx.eval(cache_arrays(self.cache))
        elif op == RESTORE:
            self.checkpoint.restore()
            mx.eval(cache_arrays(self.cache))
        elif op == DUMP:
            self._dump()

    def _forward(self, values: list[int], prev: int, nxt: int, last: bool) -> None:
        link, runner = self.link, self.runner
        _, S, _, flags, dtype, width, ntaps = values[:7]
        taps = values[7: 7 + ntaps]
        dt = DTYPES[dtype]
        payload = link.recv((1, S, width), dt, prev)
        hidden = values[2]
        h, carried = payload[..., :hidden], payload[..., hidden:]
        tapes = None
        if flags & VERIFY:
            self.checkpoint = _ShardCheckpoint(runner, self.cache, "tape", mx.eval)
            tapes = self.checkpoint.begin(mx.zeros((1, S), dtype=mx.int32))
        h, captured = runner.run_layers(h, self.cache, taps, tapes,
                                        chunked=bool(flags & CHUNKED))
        mine = [captured[t] for t in sorted(captured)]
        out = mx.concatenate([h, carried, *mine], axis=-1) if (mine or width > hidden) else h
        if not last:
            header = _header(FORWARD, S, hidden, flags, dtype, int(out.shape[-1]), taps)
            mx.eval(out, header, cache_arrays(self.cache))
            link.send(header, nxt)
            link.send(out, nxt)
            return
        if not flags & ALL_POSITIONS:
            out = out[:, -1:, :]
        mx.eval(out, cache_arrays(self.cache))
        link.send(out, 0)

    def _dump(self) -> None:
        link = self.link
        layers = [cache_state(c) for c in self.cache]
        meta = [len(layers)]
        for arrays in layers:
            meta.append(len(arrays))
            for a in arrays:
                meta += [CACHE_DTYPES.index(a.dtype), a.ndim, *a.shape]
        link.send(mx.array(meta + [0] * (4096 - len(meta)), dtype=mx.int32), 0)
        for arrays in layers:
            for a in arrays:
                link.send(mx.contiguous(a), 0)


def join_group(timeout: float | None = DEFAULT_TIMEOUT_S) -> Link:
    """Join the group this process was started in (``mlx.launch --backend ring``, or the
    app's own launcher: ``MLX_HOSTFILE`` and ``MLX_RANK`` in the environment) and return
    this rank's :class:`Link`.

    Raises:
        GenerationError: MLX's ring backend is not available, the group cannot be formed
            (the message says why), or it has a single process.
    """
    try:
        group = mx.distributed.init(strict=True, backend="ring")
    except RuntimeError as exc:
        raise GenerationError(f"could not join the group of processes over MLX's ring "
                              f"backend: {exc}") from exc
    if group.size() < 2:
        raise GenerationError("the group has a single process: start it with mlx.launch or "
                              "--distributed HOSTFILE naming two hosts or more")
    return Link(group, timeout)
