"""The one long-lived worker thread that owns MLX: loading, generation, unloading.

The GUI thread never imports ``mlx``, ``app.models.loader``, ``app.engine.generate`` or
``app.chat.reply``; it talks to :class:`Worker` through queued signals and reads back
:class:`UiEvent` batches. The worker flushes events at most every ``FLUSH_S`` seconds (and at
the end of a reply) so the GUI is not woken once per token; the window then renders on its own
30-50 ms timer.

The backend (Qt-free) does the actual work: :class:`app.chat.session.ChatSession` (loading,
prompt fitting, ``app.chat.reply.run_reply``, the benchmark, token texts); tests swap in
scripted backends that emit the engine's real event dataclasses (:mod:`app.engine.events`).
A reply is stored here too, on this thread, by ``app.chat.stored_turn.run_turn`` (the user
message, the reply rows, their growth, their final state with the tool rounds); the window
never writes a reply, it reads the store back when ``TurnStored`` arrives.

Thread checks: the window marks the GUI thread (``app.engine.threads``); the engine's entry
points and :func:`assert_not_gui_thread` raise :class:`app.engine.errors.WrongThreadError`
there.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.chat.events import (
    ReplyDone,
    ReplyFinished,
    RoundFinished,
    SaveFailed,
    StopStringHit,
    TaggedEvent,
    TurnStored,
)
from app.chat.session import ChatSession, ModelInfo, PairSpec
from app.chat.settings import ReplySettings
from app.chat.storage import Store
from app.chat.stored_turn import TurnRequest, run_turn
from app.engine.errors import DrafterAsTargetError, EngineError, WrongThreadError

log = logging.getLogger(__name__)

__all__ = ["Backend", "UiEvent", "Worker", "WorkerThread", "assert_not_gui_thread", "at_exit"]

FLUSH_S = 0.02
"""Seconds between event batches sent to the GUI thread (50 per second at most)."""


# --------------------------------------------------------------------------- program end
def at_exit(obj: object, method: str) -> Callable[[], None]:
    """Register ``obj.method()`` to run when the program ends (``atexit``), holding ``obj``
    only weakly; returns the hook, for ``atexit.unregister`` once it ran another way. A
    failure in it is logged: the program is ending anyway."""
    ref = weakref.ref(obj)

    def hook() -> None:
        target = ref()
        if target is None:
            return
        try:
            getattr(target, method)()
        except RuntimeError as exc:  # its Qt object is gone already: nothing left to stop
            log.debug("%s at exit: %s", method, exc)
        except Exception:
            log.exception("%s at exit", method)

    atexit.register(hook)
    return hook


def load_error_text(exc: EngineError) -> str:
    """What the window says of a failed load: the error's message, except where that names
    command-line flags (a drafter given as the target), which the window says in its own
    terms."""
    if isinstance(exc, DrafterAsTargetError):
        return (f"{Path(exc.folder).name} is a DFlash drafter, not a target model: in File › "
                "Models…, choose it as the drafter of a target model")
    return str(exc)


# --------------------------------------------------------------------------- thread checks
def assert_not_gui_thread(what: str) -> None:
    """Raise :class:`WrongThreadError` when ``what`` (an engine entry point) runs on the GUI
    thread, which the window marks with ``app.engine.threads.forbid_engine_on_current_thread``
    (the one guard: the engine's loading and generation check the same mark)."""
    from app.engine.threads import check_engine_thread

    try:
        check_engine_thread()
    except WrongThreadError:
        raise WrongThreadError(
            f"{what} called on the GUI thread; it must run on the worker") from None


# --------------------------------------------------------------------------- UI events
UiEvent = TaggedEvent
"""One event handed to the GUI thread: a typed ``event`` and the ``tag`` of the side of a
Compare turn it belongs to ("plain" / "dflash" / "dflash2"; "" for an ordinary reply or the
whole turn).

``event`` is one of the engine's ``TokenEvent`` / ``CycleEvent`` / ``Done``, the reply's
``ContentDelta`` / ``ReasoningDelta`` / ``ToolCallDelta`` / ``ToolResultEvent`` /
``RoundStarted`` / ``RoundResumed`` / ``PipelineWarning`` (:mod:`app.chat.events`), the
session's ``Notice``, or
the stored turn's ``TurnBegun`` / ``TurnNotStarted`` / ``ReplyFinished`` / ``ReplyFailed`` /
``SaveFailed`` / ``TurnStored`` (:mod:`app.chat.stored_turn`). The window handles them with ``isinstance``.
"""


# --------------------------------------------------------------------------- backends
class Backend(Protocol):
    """What the worker needs from the engine side (all calls happen on the worker thread)."""

    def load(self, spec: PairSpec) -> ModelInfo:
        """Load a pair; raises :class:`EngineError` subclasses with user-facing messages."""

    def unload(self) -> None:
        """Drop the loaded pair."""

    def reply(
        self, messages: list[dict], settings: ReplySettings, cancel: threading.Event
    ) -> Iterator[Any]:
        """Events of one reply (engine and ``app.chat.reply`` events) run with ``settings``
        (the typed record the window built, as ``TurnRequest.settings`` carried it, or a
        Compare side's ``dataclasses.replace`` of it); stops soon after
        ``cancel`` is set. A backend that can continue a reply Max tokens cut also takes a
        ``resume`` keyword (an ``app.chat.events.ResumeRound``) and has ``made_by(mode)``
        (:meth:`app.chat.session.ChatSession.made_by`); one without them (the scripted
        session) stores no Continue record, and Continue is refused."""

    def pieces(self, tokens: list[int]) -> list[str]:
        """Text of each token (same length as ``tokens``)."""

    def memory_bytes(self) -> int:
        """MLX active memory in bytes (0 when unknown)."""

    def top2_gap(self, plain: Any, dflash: Any) -> float | None:
        """The target's top-two logit gap where two replies (``app.chat.reply.Reply``) to the
        same messages first differ; None when they do not or it cannot be computed."""


_NOT_SHOWN = (RoundFinished, StopStringHit, ReplyDone)
"""Reply events the window does not show (their effect arrives with other events)."""

_FLUSH_NOW = (ReplyFinished, TurnStored, SaveFailed)
"""Events sent at once rather than with the next batch."""


# --------------------------------------------------------------------------- the worker
class Worker(QObject):
    """Owns the backend on its own thread. Connect to its signals with queued connections
    (automatic across threads); call :meth:`cancel` directly from any thread.

    Signals:
        loading(str): a load started (the message to show).
        loaded(object): :class:`ModelInfo` after a successful load.
        piecesReady(object): ``{key: list[str]}`` answering ``piecesRequested``.
        loadFailed(str, bool): a user-facing message, and whether the previous pair is still
            loaded (``backend.has_model()``; backends without it keep what they had).
        (requests) loadRequested(PairSpec): load this pair (``backend.load(spec)``);
            replyRequested(int, TurnRequest): store and generate one turn
            (``app.chat.stored_turn.run_turn`` on the worker's store).
        events(int, list): request id and a batch of :class:`UiEvent`.
        finished(int): the request id; no more events follow for it.
        memory(int): MLX active memory in bytes.
        benchDone(object) / benchFailed(str): answer ``benchRequested(max_tokens)`` with the
            dict of :meth:`ChatSession.benchmark`, or a user-facing message.
        (request) prefillRequested(int, object, str): conversation id, the last reply's
            :class:`~app.chat.settings.ReplySettings` and system prompt: prefill what that conversation's next turn starts with
            (:meth:`ChatSession.prefill_next_turn`) while the user writes; nothing is emitted
            (a backend without it, or a failure, only skips it: the next turn prefills more).
        (request) preambleRequested(object, str): reply settings (``ReplySettings``) and
            system prompt of a new chat: prefill its system prompt and tools (:meth:`ChatSession.prefill_new_chat`)
            after a load, so the first reply prefills only its message; emits nothing.
        (request) serveRequested(JobQueue): run one job of the window's server queue
            (``app.ui.serve_flow``) on this thread; its answer goes to the job's callback.
        (request) blockCostsRequested(str): the automatic block size was turned on with a
            pair loaded: measure its cost models for that rollback now
            (:meth:`ChatSession.measure_block_costs`); answered by blockCostsReady(object),
            the seconds spent or None.
    """

    loading = Signal(str)
    loaded = Signal(object)
    probed = Signal(object)
    loadFailed = Signal(str, bool)
    events = Signal(int, list)
    finished = Signal(int)
    memory = Signal(object)

    piecesReady = Signal(object)
    benchDone = Signal(object)
    benchFailed = Signal(str)

    # requests (queued from the GUI thread)
    piecesRequested = Signal(object)
    loadRequested = Signal(object)
    replyRequested = Signal(int, object)
    unloadRequested = Signal()
    benchRequested = Signal(int)
    prefillRequested = Signal(int, object, str)
    preambleRequested = Signal(object, str)
    serveRequested = Signal(object)
    blockCostsRequested = Signal(str)
    blockCostsReady = Signal(object)

    def __init__(self, backend: Backend | None = None, store: Store | None = None) -> None:
        super().__init__()
        self.backend: Backend = backend or ChatSession()
        self.store = store if store is not None else Store(":memory:")
        """Where replies are stored (the window's store; shared with the GUI thread, see
        ``app.chat.storage`` on thread safety)."""
        self.cost_dir: Path | None = None
        """The folder the automatic block size's measured cost models are kept in
        (``app.engine.costs.set_store``; None: in memory only). Set from the GUI thread
        before ``loadRequested``; applied on this thread when a pair loads, so the window
        does not import MLX before a model is asked for."""
        self.warm_auto_block = False
        """Warm up with the automatic block size (``ChatSession.warm_up(auto_block=True)``:
        the pair's cost model is measured then, not in the first reply). Set from the GUI
        thread before ``loadRequested`` (the window's settings have it on); read on this one."""
        self._cancel = threading.Event()
        self._interrupted = threading.Event()
        self._cancelled: set[int] = set()
        self.loadRequested.connect(self._on_load)
        self.replyRequested.connect(self._on_reply)
        self.unloadRequested.connect(self._on_unload)
        self.piecesRequested.connect(self._on_pieces)
        self.benchRequested.connect(self._on_bench)
        self.prefillRequested.connect(self._on_prefill)
        self.preambleRequested.connect(self._on_preamble)
        self.serveRequested.connect(self._on_serve)
        self.blockCostsRequested.connect(self._on_block_costs)

    def cancel(self, req_id: int | None = None, interrupted: bool = False) -> None:
        """Ask a reply to stop (thread-safe; takes effect within one cycle/token). With
        ``req_id`` a request still waiting in the queue is stopped too when it starts;
        ``interrupted`` (the app quits) stores the reply as ``interrupted``, not ``stopped``."""
        if interrupted:
            self._interrupted.set()
        if req_id is not None:
            self._cancelled.add(req_id)
        self._cancel.set()

    @Slot(object)
    def _on_load(self, spec: PairSpec) -> None:
        self.loading.emit(f"Loading {spec.label}…")
        self._use_cost_dir()
        try:
            info = self.backend.load(spec)
        except EngineError as exc:
            self.loadFailed.emit(load_error_text(exc), self._still_loaded())
            return
        except Exception as exc:  # a bug or an unexpected file problem: still a message
            log.exception("load failed")
            self.loadFailed.emit(f"{type(exc).__name__}: {exc}", self._still_loaded())
            return
        self._warm_up(spec)
        self.loaded.emit(info)
        self.memory.emit(self.backend.memory_bytes())
        self._probe()

    def _use_cost_dir(self) -> None:
        """Point the cost-model store at :attr:`cost_dir` (on this thread: the window does
        not import MLX before a model is asked for)."""
        if self.cost_dir is not None:
            from app.engine.costs import set_store

            set_store(self.cost_dir)

    def _warm_up(self, spec: PairSpec) -> None:
        """After a load: run both paths once before anything is timed (``ChatSession.warm_up``:
        short on the CPU; on a GPU backend it builds the kernels a reply needs, and the status
        bar says so). With :attr:`warm_auto_block` the drafters' warm-up replies run with the
        automatic block size, which measures the pair's cost model (``app.engine.costs``) so
        that the first reply does not. A backend without ``warm_up``, or a failure, only
        skips it."""
        warm = getattr(self.backend, "warm_up", None)
        if not callable(warm):
            return
        try:
            from app.engine.warmup import needs_warm_up

            auto = bool(self.warm_auto_block)
            if needs_warm_up():
                self.loading.emit(f"Warming up {spec.label} (building GPU kernels)…")
            elif auto:
                self.loading.emit(f"Warming up {spec.label} (measuring its block costs)…")
            seconds = warm(auto_block=True) if auto else warm()
        except Exception:  # the pair is loaded; a failed warm-up must not undo that
            log.exception("warm-up failed")
            return
        if seconds is not None:
            log.info("warm-up of %s took %.2f s", spec.label, seconds)

    def _probe(self) -> None:
        """After ``loaded``: probe the drafters' fit (``ChatSession.probe_drafters``;
        :mod:`app.chat.drafter_probe`) and emit ``probed``, so the pair is ready without
        waiting for it. A backend without ``probe_drafters``, or a failure, emits nothing."""
        probe = getattr(self.backend, "probe_drafters", None)
        if not callable(probe):
            return
        try:
            probes = tuple(probe())
        except Exception:  # the pair is loaded; a failed probe must not undo that
            log.exception("drafter probe failed")
            return
        for p in probes:
            log.info("drafter probe of %s: %s (%.2f s)", p.drafter_name, p.label(), p.seconds)
        if probes:
            self.probed.emit(probes)

    @Slot(str)
    def _on_block_costs(self, rollback: str) -> None:
        """The automatic block size was turned on with a pair loaded: measure what it needs
        now (``ChatSession.measure_block_costs``), not in the next reply, and emit
        ``blockCostsReady`` with the seconds spent (None: nothing to measure or it failed;
        the next automatic reply then measures)."""
        measure = getattr(self.backend, "measure_block_costs", None)
        seconds = None
        if callable(measure):
            self._use_cost_dir()
            try:
                seconds = measure(rollback)
            except Exception:  # the pair stays loaded; the next auto reply measures instead
                log.exception("measuring the block costs failed")
        self.blockCostsReady.emit(seconds)

    def _still_loaded(self) -> bool:
        """After a failed load: does the backend still hold a working pair?"""
        has = getattr(self.backend, "has_model", None)
        try:
            return bool(has()) if callable(has) else True
        except Exception:
            return False

    @Slot(object)
    def _on_pieces(self, jobs: object) -> None:
        """Token texts for stored replies (``{key: token ids}`` -> ``piecesReady({key:
        pieces})``), e.g. to colour drafter tokens of replies loaded from the database."""
        out = {}
        for key, tokens in dict(jobs).items():
            try:
                out[key] = self.backend.pieces(list(tokens))
            except Exception:
                log.exception("token texts")
        self.piecesReady.emit(out)

    @Slot(int)
    def _on_bench(self, max_tokens: int) -> None:
        try:
            result = self.backend.benchmark(max_tokens)
        except EngineError as exc:
            self.benchFailed.emit(str(exc))
            return
        except Exception as exc:
            log.exception("benchmark failed")
            self.benchFailed.emit(f"Benchmark failed: {type(exc).__name__}: {exc}")
            return
        finally:
            self.memory.emit(self.backend.memory_bytes())
        self.benchDone.emit(result)

    @Slot(int, object, str)
    def _on_prefill(self, conversation_id: int, settings: object, system_prompt: str) -> None:
        fn = getattr(self.backend, "prefill_next_turn", None)
        if not callable(fn):
            return
        try:
            done = fn(conversation_id, settings, system_prompt, store=self.store)
        except Exception:  # the next turn prefills what this did not
            log.exception("prefilling the next turn")
            return
        if done is not None:
            log.info("prefilled %d tokens of chat %d's next turn (%d reused) in %.2f s",
                     done.tokens, conversation_id, done.reused, done.seconds)

    @Slot(object, str)
    def _on_preamble(self, settings: object, system_prompt: str) -> None:
        fn = getattr(self.backend, "prefill_new_chat", None)
        if not callable(fn):
            return
        try:
            done = fn(settings, system_prompt)
        except Exception:  # the first reply prefills what this did not
            log.exception("prefilling a new chat's preamble")
            return
        if done is not None:
            log.info("prefilled a new chat's %d preamble tokens in %.2f s", done.tokens,
                     done.seconds)

    @Slot(object)
    def _on_serve(self, jobs: Any) -> None:
        """Run one job of the window's server queue (an ``app.serve.worker.JobQueue``) on
        the loaded session, between the window's own replies; none when it was drained."""
        job = jobs.take(block=False)
        if job is None:
            return
        me = threading.current_thread()
        if me.name.startswith("Dummy"):  # Python's name for a QThread: use the Qt one
            me.name = self.thread().objectName() or me.name
        try:
            jobs.run(self.backend, job)
        finally:
            self.memory.emit(self.backend.memory_bytes())

    @Slot()
    def _on_unload(self) -> None:
        try:
            self.backend.unload()
        finally:
            self.memory.emit(self.backend.memory_bytes())

    @Slot(int, object)
    def _on_reply(self, req_id: int, request: TurnRequest) -> None:
        """Store and generate one turn (``run_turn``), forwarding its events in batches."""
        self._cancel = threading.Event()
        self._interrupted = threading.Event()
        if req_id in self._cancelled:
            self._cancel.set()
        batch: list[UiEvent] = []
        last = time.monotonic()

        def flush() -> None:
            nonlocal batch, last
            if batch:
                self.events.emit(req_id, batch)
                batch = []
            last = time.monotonic()

        try:
            for ui in run_turn(self.store, self.backend, request, self._cancel,
                               self._interrupted):
                if isinstance(ui.event, _NOT_SHOWN):
                    continue
                batch.append(ui)
                if isinstance(ui.event, _FLUSH_NOW) or time.monotonic() - last >= FLUSH_S:
                    flush()
        finally:
            flush()
            self.memory.emit(self.backend.memory_bytes())
            self.finished.emit(req_id)


class WorkerThread:
    """Starts a :class:`Worker` on a dedicated :class:`QThread` and stops it cleanly.

    ``stop()`` cancels any reply, quits the thread's event loop and waits (never
    ``QThread.terminate()``). Should the program end without calling it (``sys.exit`` from
    a slot, a script that just ends), an ``atexit`` hook calls it before Qt's objects go: Qt
    aborts the process ("QThread: Destroyed while thread 'mlx-worker' is still running")
    when a running thread is destroyed."""

    def __init__(self, backend: Backend | None = None, store: Store | None = None) -> None:
        self.thread = QThread()
        self.thread.setObjectName("mlx-worker")
        self.worker = Worker(backend, store)
        self.worker.moveToThread(self.thread)
        self.thread.start()
        self._at_exit = at_exit(self, "stop")

    def stop(self, timeout_ms: int = 30000) -> bool:
        """Cancel, quit and join the thread; True when it ended within ``timeout_ms``.

        A model load cannot be interrupted; when the thread is still busy after
        ``timeout_ms`` this keeps waiting (a QThread destroyed while running aborts the
        process) and returns False once it has ended."""
        atexit.unregister(self._at_exit)
        self.worker.cancel()
        self.thread.quit()
        if self.thread.wait(timeout_ms):
            return True
        log.warning("worker still busy after %d ms (loading?); waiting for it", timeout_ms)
        self.thread.wait()
        return False
