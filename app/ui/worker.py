"""The one long-lived worker thread that owns MLX: loading, generation, unloading.

The GUI thread never imports ``mlx``, ``app.engine.loader``, ``app.engine.generate`` or
``app.chat.reply``; it talks to :class:`Worker` through queued signals and reads back
:class:`UiEvent` batches. The worker flushes events at most every ``FLUSH_S`` seconds (and at
the end of a reply) so the GUI is not woken once per token; the window then renders on its own
30-50 ms timer.

Backends (Qt-free) do the actual work, so tests can swap in fakes that emit the engine's real
event dataclasses (:mod:`app.engine.events`):

* :class:`EngineBackend` calls ``app.engine.loader.load_target/load_drafter/check_pair`` and
  ``app.chat.reply.run_reply`` (falling back to ``app.engine.generate.generate`` with a plain
  detokenizer while the chat pipeline is not there).

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
from dataclasses import dataclass, field
from typing import Any, Protocol

from PySide6.QtCore import QCoreApplication, QObject, QThread, Signal, Slot

from app.engine.errors import EngineError, GenerationError, WrongThreadError
from app.engine.events import CycleEvent, Done, Summary, TokenEvent

log = logging.getLogger(__name__)

TINY_PAIR = "tiny:"
"""Pseudo target path: build (or reuse) the random-weight tiny pair in the cache folder."""

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


@dataclass
class ReplyResult:
    """A finished (or stopped) reply in plain Python types (safe to hand to the GUI).

    Attributes:
        content, reasoning: final text (str).
        tool_calls: list of dicts (id, name, arguments, result, error, duration_s).
        finish_reason: "stop", "length", "tool_calls", "cancelled" or "error".
        tokens: generated token ids (list[int]); from_draft: one bool per token.
        pieces: the text of each token from mlx-lm's streaming detokenizer (list[str], same
            length as ``tokens``; "" for a token that only completes a later character).
        summary: the engine :class:`Summary` of the last round (None when no round ran).
        rounds: generation rounds (tool calls make more than one).
        mode, block_size, rollback: how the reply was generated.
        top2_gap: in a Compare, on the DFlash side of two replies that differ: the target's
            top-two logit gap at the first divergence (None otherwise).
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str = "stop"
    tokens: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    summary: Summary | None = None
    rounds: int = 1
    mode: str = "plain"
    block_size: int | None = None
    rollback: str = "tape"
    error: str | None = None
    note: str = ""
    top2_gap: float | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What the window shows about the loaded pair (plain Python values).

    ``context_length`` in tokens; ``memory_bytes`` is MLX's active memory after loading
    (0 when unknown); ``drafter_block_size`` None without a drafter.
    """

    target_name: str
    target_path: str
    drafter_name: str | None = None
    drafter_path: str | None = None
    context_length: int = 0
    model_type: str = ""
    drafter_block_size: int | None = None
    memory_bytes: int = 0
    note: str = ""
    card: str = ""
    device: str = ""
    memory_before_bytes: int = 0
    blas: str = ""


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

    def top2_gap(self, plain: Any, dflash: Any) -> float | None:
        """The target's top-two logit gap where two replies (``app.chat.reply.Reply``) to the
        same messages first differ; None when they do not or it cannot be computed."""


def _dict_of(obj: Any) -> dict:
    if isinstance(obj, dict):
        return dict(obj)
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


class EngineBackend:
    """The real backend: ``app.engine.loader`` + ``app.chat.reply`` (imported lazily, on the
    worker thread only)."""

    def __init__(self) -> None:
        self.target = None
        self.drafter = None
        self.session = None  # app.engine.prefix.PromptCache of the loaded target

    def load(self, target: str, drafter: str | None) -> ModelInfo:
        """Load ``target`` (and ``drafter`` when given) and check they fit.

        The previous pair is dropped first and MLX's buffer cache cleared (issue 9: switching
        must not hold two models in memory); ``ModelInfo.memory_before_bytes`` is MLX's active
        memory before that. Raises the engine's typed errors (:class:`ModelNotFoundError`,
        :class:`ModelLoadError`, :class:`PairMismatchError`, ...); nothing is loaded then.
        """
        assert_not_gui_thread("load_target")
        from app.engine import loader

        before = self.memory_bytes()
        self.unload()

        note = ""
        if target == TINY_PAIR:
            from app.engine.tiny import build_tiny_pair
            from app.paths import cache_dir

            t_dir, d_dir = build_tiny_pair(cache_dir() / "tiny-pair")
            target, drafter = str(t_dir), str(d_dir)
            note = ("The bundled demo pair is missing: a tiny random-weight pair is loaded "
                    "instead (its replies are gibberish).")
        new_target = loader.load_target(target)
        new_drafter = None
        if drafter:
            new_drafter = loader.load_drafter(drafter)
            loader.check_pair(new_target, new_drafter)
        self.target, self.drafter = new_target, new_drafter
        from app.engine.prefix import PromptCache

        self.session = PromptCache()
        if "vision_config" in (getattr(new_target, "config", None) or {}):
            note = (note + " " if note else "") + ("This is a multimodal checkpoint: it is "
                                                   "used for text; image input is not "
                                                   "supported.")
        card = ""
        try:
            from pathlib import Path

            readme = Path(str(new_target.path)) / "README.md"
            if readme.is_file():
                card = readme.read_text(encoding="utf-8", errors="replace")[:4000]
        except OSError:
            pass
        return ModelInfo(
            target_name=str(new_target.name),
            target_path=str(new_target.path),
            drafter_name=str(new_drafter.name) if new_drafter else None,
            drafter_path=str(new_drafter.path) if new_drafter else None,
            context_length=int(getattr(new_target, "context_length", 0) or 0),
            model_type=str(getattr(new_target, "model_type", "")),
            drafter_block_size=int(new_drafter.config.block_size) if new_drafter else None,
            memory_bytes=self.memory_bytes(),
            card=card,
            device=_mlx_device(),
            note=note,
            memory_before_bytes=before,
            blas=_blas(),
        )

    def unload(self) -> None:
        """Drop the loaded pair and clear MLX's buffer cache."""
        assert_not_gui_thread("unload")
        self.target = self.drafter = self.session = None
        import gc

        gc.collect()
        try:
            import mlx.core as mx

            mx.clear_cache()
        except Exception:  # pragma: no cover - older mlx
            pass

    def memory_bytes(self) -> int:
        """MLX active memory in bytes (0 when unavailable)."""
        try:
            import mlx.core as mx

            return int(mx.get_active_memory())
        except Exception:
            return 0

    def reply(self, messages: list[dict], settings: dict, cancel: threading.Event) -> Iterator:
        """Events of one reply (engine events, reply events, ending with the reply's done)."""
        assert_not_gui_thread("run_reply")
        if self.target is None:
            raise EngineError("no model is loaded")
        drafter = self.drafter if settings.get("mode") == "dflash" else None
        if settings.get("mode") == "dflash" and drafter is None:
            raise EngineError("DFlash needs a drafter; none is loaded for this target")
        from app.chat import reply as reply_mod

        rs = _make_reply_settings(reply_mod, settings)
        messages, notice = self._fit(messages, rs)
        events = reply_mod.run_reply(self.target, drafter, messages, rs, cancel,
                                     session=self.session)
        if notice:
            return _prepend(UiEvent("notice", notice), events)
        return iter(events)

    def top2_gap(self, plain: Any, dflash: Any) -> float | None:
        """See :meth:`Backend.top2_gap` (one target forward, on the worker thread)."""
        from app.chat.reply import divergence_near_tie

        tie = divergence_near_tie(self.target, plain, dflash) if self.target else None
        return tie["gap"] if tie else None

    def _fit(self, messages: list[dict], rs: Any) -> tuple[list[dict], str | None]:
        """Leave out the oldest turns so the prompt fits the context limit with room for
        ``max_tokens`` (``app.chat.history.fit_for_tokenizer``); returns (messages, notice).

        Raises :class:`GenerationError` when the current message alone does not fit."""
        from app.chat.history import ContextOverflowError, context_limit, fit_for_tokenizer

        limit = context_limit(getattr(self.target, "context_length", None) or None)
        kwargs = {}
        if getattr(rs, "enable_thinking", None) is not None:
            kwargs["enable_thinking"] = rs.enable_thinking
        try:
            fitted = fit_for_tokenizer(messages, self.target.tokenizer, limit,
                                       reserve=min(int(getattr(rs, "max_tokens", 0)), limit // 2),
                                       tools=getattr(rs, "tools", None), **kwargs)
        except ContextOverflowError as exc:
            raise GenerationError(str(exc)) from exc
        return fitted.messages, fitted.notice()

    def benchmark(self, max_tokens: int = 48, n_prompts: int = 3) -> dict:
        """A short ``python -m app bench`` on the loaded pair: plain, DFlash + tape and
        DFlash + replay at the drafter's block size, a few of the pair's held-out prompts,
        one repeat (``app.engine.bench``). Returns ``{"modes": {name: figures}, "accepted":
        [accepted drafts per cycle over the DFlash + tape runs], "prompts": n}``.

        Raises:
            EngineError: no model or no drafter loaded.
        """
        assert_not_gui_thread("benchmark")
        from pathlib import Path

        from app.engine import bench

        if self.target is None or self.drafter is None:
            raise EngineError("the benchmark needs a target and a DFlash drafter loaded")
        prompts, _ = bench.default_prompts(Path(str(self.target.path)))
        rendered = [(p.id, bench.render(self.target, p)) for p in prompts[:n_prompts]]
        modes = bench.make_modes([self.drafter.config.block_size])
        records = bench.run_matrix(self.target, self.drafter, rendered, modes, 1, max_tokens)
        tape = modes[1].name
        accepted = [a for r in records if r.mode.name == tape
                    for a in r.summary.accepted_lengths]
        return {"modes": bench.aggregate(records, modes), "accepted": accepted,
                "prompts": len(rendered), "block_size": self.drafter.config.block_size}

    def pieces(self, tokens: list[int]) -> list[str]:
        """Per-token text through mlx-lm's streaming detokenizer (list[str], len(tokens))."""
        if self.target is None:
            return [""] * len(tokens)
        detok = self.target.tokenizer.detokenizer
        detok.reset()
        out = []
        eos = set(getattr(self.target, "eos_token_ids", ()) or ())
        for t in tokens:
            if int(t) in eos:  # the end token is counted but not shown as text
                out.append("")
                continue
            detok.add_token(int(t))
            out.append(detok.last_segment)
        detok.finalize()
        if out:
            out[-1] += detok.last_segment
        return out


def _prepend(first: Any, rest: Iterator) -> Iterator:
    yield first
    yield from rest


def _blas() -> str:
    try:
        from app.engine.blas import blas_description

        return blas_description(load_mlx=True)
    except Exception:
        return ""


def _mlx_device() -> str:
    try:
        import mlx.core as mx

        return str(mx.default_device())
    except Exception:  # pragma: no cover
        return "unknown"


def _make_reply_settings(reply_mod: Any, settings: dict) -> Any:
    """Build ``app.chat.reply.ReplySettings`` from the window's settings dict, passing only
    the fields the dataclass declares."""
    cls = getattr(reply_mod, "ReplySettings", None)
    if cls is None:
        return settings
    settings = dict(settings)
    settings.setdefault("stop", list(settings.get("stop_strings") or []))
    if settings.get("use_tools"):
        from app.chat.tools import tool_schemas

        settings["tools"] = tool_schemas()
        settings["run_tools"] = True
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in settings.items() if k in names})
    return cls(**settings)


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
            dict of :meth:`EngineBackend.benchmark`, or a user-facing message.
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
        self.backend: Backend = backend or EngineBackend()
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
        self._replies: dict[str, Any] = {}
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
                    self._replies[tag] = ev.data
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
        plain = getattr(self, "_replies", {}).get("plain")
        if tag == "dflash" and plain is not None and tag in self._replies \
                and result.tokens != plain.all_tokens:
            gap_of = getattr(self.backend, "top2_gap", None)  # scripted backends have none
            try:
                result.top2_gap = gap_of(plain, self._replies[tag]) if gap_of else None
            except Exception:  # a figure for the header; never fails the reply
                log.exception("top-two gap")
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
