"""The one long-lived worker thread that owns MLX: loading, generation, unloading.

The GUI thread never imports ``mlx``, ``app.engine.loader``, ``app.engine.generate`` or
``app.chat.reply``; it talks to :class:`Worker` through queued signals and reads back
:class:`UiEvent` batches. The worker flushes events at most every ``FLUSH_S`` seconds (and at
the end of a reply) so the GUI is not woken once per token; the window then renders on its own
30-50 ms timer.

The backend (Qt-free) does the actual work: :class:`app.chat.session.ChatSession` (loading,
prompt fitting, ``app.chat.reply.run_reply``, the benchmark, token texts); tests swap in
scripted backends that emit the engine's real event dataclasses (:mod:`app.engine.events`).

Thread checks: :func:`assert_not_gui_thread` raises :class:`app.engine.errors.WrongThreadError`
when called on the thread that owns the ``QApplication``; the worker calls it before every
engine entry point.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from app.chat.session import TINY_PAIR, ChatSession, ModelInfo, Notice
from app.chat.turns import ReplyResult
from app.engine.errors import EngineError, WrongThreadError
from app.engine.events import CycleEvent, Done, Summary, TokenEvent

log = logging.getLogger(__name__)

__all__ = ["TINY_PAIR", "ModelInfo", "ReplyResult", "UiEvent", "Worker", "WorkerThread"]

FLUSH_S = 0.02
"""Seconds between event batches sent to the GUI thread (50 per second at most)."""


# --------------------------------------------------------------------------- thread checks
_worker_thread_ident: int | None = None


def is_gui_thread() -> bool:
    """True when the caller runs on the thread that owns the ``QCoreApplication``."""
    app = QCoreApplication.instance()
    if app is None:
        return False
    return QThread.currentThread() is app.thread()


def assert_not_gui_thread(what: str) -> None:
    """Raise :class:`WrongThreadError` when ``what`` (an engine entry point) runs on the GUI
    thread. MLX arrays are bound to the thread that made them (DESIGN.md), so every MLX call
    belongs on the worker."""
    from app.engine.threads import check_engine_thread

    check_engine_thread()
    if is_gui_thread():
        raise WrongThreadError(f"{what} called on the GUI thread; it must run on the worker")


def worker_thread_ident() -> int | None:
    """``threading.get_ident()`` of the running worker thread (None before it starts)."""
    return _worker_thread_ident


# --------------------------------------------------------------------------- UI events
@dataclass(frozen=True)
class UiEvent:
    """One event handed to the GUI thread.

    ``kind`` is one of: ``token`` (data: :class:`TokenEvent`), ``cycle`` (:class:`CycleEvent`),
    ``content`` / ``reasoning`` (str delta), ``tool_call`` (dict: id, name, arguments),
    ``tool_result`` (dict: id, name, result, error, duration_s), ``round`` (dict: index,
    prompt_tokens, mode), ``warning`` / ``notice`` (str, the latter shown as a message),
    ``engine_done`` (:class:`Summary`), ``done`` (:class:`ReplyResult`), ``error`` (str message).
    ``tag`` says which side of a Compare turn the event belongs to ("plain" / "dflash"), or
    "" for an ordinary reply.
    """

    kind: str
    data: Any
    tag: str = ""


# --------------------------------------------------------------------------- backends
class Backend(Protocol):
    """What the worker needs from the engine side (all calls happen on the worker thread)."""

    def load(self, target: str, drafter: str | None) -> ModelInfo:
        """Load a pair; raises :class:`EngineError` subclasses with user-facing messages."""

    def unload(self) -> None:
        """Drop the loaded pair."""

    def reply(
        self, messages: list[dict], settings: dict, cancel: threading.Event
    ) -> Iterator[Any]:
        """Events of one reply (engine and ``app.chat.reply`` events); stops soon after
        ``cancel`` is set."""

    def pieces(self, tokens: list[int]) -> list[str]:
        """Text of each token (same length as ``tokens``)."""

    def memory_bytes(self) -> int:
        """MLX active memory in bytes (0 when unknown)."""


def _dict_of(obj: Any) -> dict:
    if isinstance(obj, dict):
        return dict(obj)
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


# --------------------------------------------------------------------------- translation
def _text_of(ev: Any) -> str:
    for name in ("text", "delta", "content"):
        v = getattr(ev, name, None)
        if isinstance(v, str):
            return v
    return ""


def _tool_call_dict(obj: Any) -> dict:
    """A tool call (``app.chat.pipeline.ToolCall``, a ``ToolRun`` or a dict) as the dict the
    tool pane shows: id, name, arguments, result, error, duration_s."""
    if hasattr(obj, "to_dict"):
        d = obj.to_dict()
    elif isinstance(obj, dict):
        d = dict(obj)
    else:
        d = _dict_of(obj)
    return {
        "id": str(d.get("id") or ""),
        "name": str(d.get("name") or "?"),
        "arguments": d.get("arguments"),
        "result": d.get("result"),
        "error": d.get("error"),
        "duration_s": d.get("duration_s"),
    }


def translate(ev: Any) -> UiEvent | None:
    """Turn an engine event or an ``app.chat.reply`` event into a :class:`UiEvent` (None for
    events the window does not show). Reply events are matched by class name so this module
    does not import the chat pipeline: ``ContentDelta``, ``ReasoningDelta``,
    ``ToolCallDelta`` (.call), ``ToolResultEvent`` (.run), ``RoundStarted``,
    ``PipelineWarning``, ``ReplyDone`` (.reply)."""
    if isinstance(ev, UiEvent):
        return ev
    if isinstance(ev, TokenEvent):
        return UiEvent("token", ev)
    if isinstance(ev, CycleEvent):
        return UiEvent("cycle", ev)
    if isinstance(ev, Done):
        return UiEvent("engine_done", ev.summary)
    if isinstance(ev, Notice):
        return UiEvent("notice", ev.message)
    name = type(ev).__name__
    if name == "ContentDelta":
        return UiEvent("content", _text_of(ev))
    if name == "ReasoningDelta":
        return UiEvent("reasoning", _text_of(ev))
    if name == "ToolCallDelta":
        return UiEvent("tool_call", _tool_call_dict(ev.call))
    if name == "ToolResultEvent":
        return UiEvent("tool_result", _tool_call_dict(ev.run))
    if name == "RoundStarted":
        return UiEvent("round", {"index": ev.index, "prompt_tokens": ev.prompt_tokens,
                                 "mode": ev.mode})
    if name == "PipelineWarning":
        return UiEvent("warning", str(getattr(ev, "message", "")))
    if name == "ReplyDone":
        return UiEvent("reply_done", ev.reply)
    return None


def result_from_reply(reply: Any, settings: dict, pieces_fn: Callable[[list[int]], list[str]]
                      ) -> ReplyResult:
    """A :class:`ReplyResult` from ``app.chat.reply.Reply`` (duck-typed). Tool calls of every
    round are listed with their results."""
    tokens = [int(t) for t in (getattr(reply, "tokens", None) or [])]
    from_draft = [bool(b) for b in (getattr(reply, "from_draft", None) or [])]
    rounds = list(getattr(reply, "rounds", None) or [])
    calls: list[dict] = []
    for rnd in rounds:
        runs = {r.call.id: r for r in (getattr(rnd, "tool_runs", None) or [])}
        for call in rnd.tool_calls:
            d = _tool_call_dict(call)
            if call.id in runs:
                d.update({k: v for k, v in _tool_call_dict(runs[call.id]).items()
                          if k in ("result", "error", "duration_s")})
            calls.append(d)
    if not rounds:
        calls = [_tool_call_dict(c) for c in (getattr(reply, "tool_calls", None) or [])]
    summary = getattr(reply, "summary", None)
    warnings = getattr(reply, "warnings", None) or []
    note = "; ".join(str(w.get("message", w)) if isinstance(w, dict) else str(w)
                     for w in warnings)
    return ReplyResult(
        content=str(getattr(reply, "content", "") or ""),
        reasoning=str(getattr(reply, "reasoning", "") or ""),
        tool_calls=calls,
        finish_reason=str(getattr(reply, "finish_reason", "stop") or "stop"),
        tokens=tokens,
        from_draft=from_draft + [False] * (len(tokens) - len(from_draft)),
        pieces=pieces_fn(tokens),
        summary=summary if isinstance(summary, Summary) else None,
        rounds=max(1, len(rounds)),
        mode=str(getattr(reply, "mode", None) or settings.get("mode", "plain")),
        block_size=settings.get("block_size"),
        rollback=settings.get("rollback", "tape"),
        note=note,
        messages=[dict(m) for m in (getattr(reply, "messages", None) or [])],
    )


# --------------------------------------------------------------------------- the worker
class Worker(QObject):
    """Owns the backend on its own thread. Connect to its signals with queued connections
    (automatic across threads); call :meth:`cancel` directly from any thread.

    Signals:
        loading(str): a load started (the message to show).
        loaded(object): :class:`ModelInfo` after a successful load.
        piecesReady(object): ``{key: list[str]}`` answering ``piecesRequested``.
        loadFailed(str): a user-facing message; the previous pair (if any) stays loaded.
        events(int, list): request id and a batch of :class:`UiEvent`.
        finished(int): the request id; no more events follow for it.
        memory(int): MLX active memory in bytes.
        benchDone(object) / benchFailed(str): answer ``benchRequested(max_tokens)`` with the
            dict of :meth:`ChatSession.benchmark`, or a user-facing message.
    """

    loading = Signal(str)
    loaded = Signal(object)
    loadFailed = Signal(str)
    events = Signal(int, list)
    finished = Signal(int)
    memory = Signal(object)

    piecesReady = Signal(object)
    benchDone = Signal(object)
    benchFailed = Signal(str)

    # requests (queued from the GUI thread)
    piecesRequested = Signal(object)
    loadRequested = Signal(str, str)
    replyRequested = Signal(int, list, object, list)
    unloadRequested = Signal()
    benchRequested = Signal(int)

    def __init__(self, backend: Backend | None = None) -> None:
        super().__init__()
        self.backend: Backend = backend or ChatSession()
        self._cancel = threading.Event()
        self._cancelled: set[int] = set()
        self.loadRequested.connect(self._on_load)
        self.replyRequested.connect(self._on_reply)
        self.unloadRequested.connect(self._on_unload)
        self.piecesRequested.connect(self._on_pieces)
        self.benchRequested.connect(self._on_bench)

    def cancel(self, req_id: int | None = None) -> None:
        """Ask a reply to stop (thread-safe; takes effect within one cycle/token). With
        ``req_id`` a request still waiting in the queue is stopped too when it starts."""
        if req_id is not None:
            self._cancelled.add(req_id)
        self._cancel.set()

    @Slot(str, str)
    def _on_load(self, target: str, drafter: str) -> None:
        global _worker_thread_ident
        _worker_thread_ident = threading.get_ident()
        self.loading.emit(f"Loading {target}…")
        try:
            info = self.backend.load(target, drafter or None)
        except EngineError as exc:
            self.loadFailed.emit(str(exc))
            return
        except Exception as exc:  # a bug or an unexpected file problem: still a message
            log.exception("load failed")
            self.loadFailed.emit(f"{type(exc).__name__}: {exc}")
            return
        self.loaded.emit(info)
        self.memory.emit(self.backend.memory_bytes())

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

    @Slot()
    def _on_unload(self) -> None:
        try:
            self.backend.unload()
        finally:
            self.memory.emit(self.backend.memory_bytes())

    @Slot(int, list, object, list)
    def _on_reply(self, req_id: int, messages: list, settings: object, tags: list) -> None:
        """Run one reply per tag (["" ] normally, ["plain", "dflash"] for Compare)."""
        global _worker_thread_ident
        _worker_thread_ident = threading.get_ident()
        self._cancel = threading.Event()
        if req_id in self._cancelled:
            self._cancel.set()
        try:
            for tag in tags:
                s = dict(settings)
                if tag:
                    s["mode"] = tag
                self._run_one(req_id, messages, s, tag)
                if self._cancel.is_set():
                    break
        finally:
            self.memory.emit(self.backend.memory_bytes())
            self.finished.emit(req_id)

    def _run_one(self, req_id: int, messages: list, settings: dict, tag: str) -> None:
        batch: list[UiEvent] = []
        last = time.monotonic()
        result: ReplyResult | None = None
        last_summary: Summary | None = None
        tokens: list[int] = []
        flags: list[bool] = []
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[str, dict] = {}

        def flush() -> None:
            nonlocal batch, last
            if batch:
                self.events.emit(req_id, batch)
                batch = []
            last = time.monotonic()

        try:
            for raw in self.backend.reply(messages, settings, self._cancel):
                ev = translate(raw)
                if ev is None:
                    continue
                ev = UiEvent(ev.kind, ev.data, tag)
                if ev.kind == "token":
                    tokens.append(ev.data.token_id)
                    flags.append(ev.data.from_draft)
                elif ev.kind == "content":
                    content.append(ev.data)
                elif ev.kind == "reasoning":
                    reasoning.append(ev.data)
                elif ev.kind in ("tool_call", "tool_result"):
                    key = ev.data["id"] or f"{ev.data['name']}#{len(calls)}"
                    merged = calls.setdefault(key, {})
                    merged.update({k: v for k, v in ev.data.items() if v is not None})
                elif ev.kind == "engine_done":
                    last_summary = ev.data
                elif ev.kind == "reply_done":
                    result = result_from_reply(ev.data, settings, self.backend.pieces)
                    continue
                batch.append(ev)
                if time.monotonic() - last >= FLUSH_S:
                    flush()
        except EngineError as exc:
            batch.append(UiEvent("error", str(exc), tag))
        except Exception as exc:
            log.exception("generation failed")
            batch.append(UiEvent("error", f"Generation failed: {type(exc).__name__}: {exc}", tag))
        if result is None:  # no ReplyDone (an error, or a scripted backend): build it here
            finish = "stop"
            if last_summary is not None:
                finish = {"end_token": "stop", "length": "length", "cancelled": "cancelled",
                          "error": "error"}.get(last_summary.stop_cause, "stop")
            elif self._cancel.is_set():
                finish = "cancelled"
            if any(e.kind == "error" for e in batch):
                finish = "error"
            result = ReplyResult(
                content="".join(content),
                reasoning="".join(reasoning),
                tool_calls=list(calls.values()),
                finish_reason=finish,
                tokens=tokens,
                from_draft=flags,
                pieces=self.backend.pieces(tokens),
                summary=last_summary,
                mode=settings.get("mode", "plain"),
                block_size=settings.get("block_size"),
                rollback=settings.get("rollback", "tape"),
            )
        batch.append(UiEvent("done", result, tag))
        flush()


class WorkerThread:
    """Starts a :class:`Worker` on a dedicated :class:`QThread` and stops it cleanly.

    ``stop()`` cancels any reply, quits the thread's event loop and waits (never
    ``QThread.terminate()``)."""

    def __init__(self, backend: Backend | None = None) -> None:
        self.thread = QThread()
        self.thread.setObjectName("mlx-worker")
        self.worker = Worker(backend)
        self.worker.moveToThread(self.thread)
        self.thread.start()

    def stop(self, timeout_ms: int = 30000) -> bool:
        """Cancel, quit and join the thread; True when it ended within ``timeout_ms``.

        A model load cannot be interrupted; when the thread is still busy after
        ``timeout_ms`` this keeps waiting (a QThread destroyed while running aborts the
        process) and returns False once it has ended."""
        self.worker.cancel()
        self.thread.quit()
        if self.thread.wait(timeout_ms):
            return True
        log.warning("worker still busy after %d ms (loading?); waiting for it", timeout_ms)
        self.thread.wait()
        return False
