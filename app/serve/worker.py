"""Where the server's requests meet MLX: a bounded job queue and the thread that runs it.

MLX arrays are bound to the thread that made them, so the event loop never touches the
session: an HTTP handler makes a :class:`Job` (the checked request, a ``deliver`` callback and
a cancel flag) and :meth:`JobQueue.submit` puts it on a bounded queue (full:
:class:`QueueFullError`, which the API answers with 429). The thread that owns MLX takes jobs
one at a time (:meth:`JobQueue.take`) and runs each (:meth:`JobQueue.run`): it checks the
prompt against the context, runs :meth:`app.chat.session.ChatSession.reply` with the job's
cancel flag (the engine checks it every token / cycle) and hands typed events back through
``deliver``: :class:`JobRefused` (the request could not start: an
:class:`~app.serve.protocol.ApiError`) or :class:`JobStarted`, then :class:`JobTextDelta` /
:class:`JobToolCall` as the reply is written, then :class:`JobFinished` or :class:`JobFailed`
(an unexpected error while preparing sends :class:`JobFailed` alone).
``deliver`` is called on that thread; the API's posts onto its event loop with
``loop.call_soon_threadsafe``.

:class:`ServeWorker` is a :class:`JobQueue` with a thread of its own that loads the pair
(``python -m app serve``); the window's switch uses its worker thread instead
(``app.ui.serve_flow``). Tools are never run here: a reply's tool calls go to the client.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.chat.session import ChatSession, ModelInfo, PairSpec
from app.chat.settings import ReplySettings, SettingError
from app.engine.errors import EngineError
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTER_MODES, Mode, label
from app.serve.protocol import ApiError, ChatRequest, CompletionResult, bad_request

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 2048
"""Generated tokens at most when a request names no ``max_tokens`` (and the context leaves
that much room)."""


class QueueFullError(Exception):
    """The worker's queue holds as many waiting requests as it may (answered with 429)."""


class ShuttingDownError(Exception):
    """The server is stopping and takes no new requests (answered with 503)."""


# ------------------------------------------------------------------------------ events
@dataclass(frozen=True)
class JobStarted:
    """The request passed the worker's checks and its reply begins.

    ``prompt_tokens``: the rendered prompt's length; ``mode``: the decoding mode that runs;
    ``block_size``: the DFlash block size (None for plain); ``max_tokens``: the limit used."""

    prompt_tokens: int
    mode: str
    block_size: int | None
    max_tokens: int


@dataclass(frozen=True)
class JobRefused:
    """The request did not start (bad mode, prompt over the context, cancelled while queued,
    shutting down): ``error`` says why and with which status."""

    error: ApiError


@dataclass(frozen=True)
class JobTextDelta:
    """New text of the reply: ``kind`` is ``"content"`` or ``"reasoning"``."""

    kind: str
    text: str


@dataclass(frozen=True)
class JobToolCall:
    """A tool call the model wrote (complete, parsed): ``index`` its position in the reply."""

    index: int
    id: str
    name: str
    arguments: dict


@dataclass(frozen=True)
class JobFinished:
    """The reply ended (also when cancelled: ``result.finish_reason`` says so)."""

    result: CompletionResult


@dataclass(frozen=True)
class JobFailed:
    """The reply failed (an engine error after it started, or an unexpected error in the
    worker, which may come before any :class:`JobStarted`): ``message`` for the client."""

    message: str


JobEvent = JobStarted | JobRefused | JobTextDelta | JobToolCall | JobFinished | JobFailed


@dataclass
class Job:
    """One request on its way through the worker.

    Attributes:
        request: the checked request.
        deliver: called on the worker thread with each :data:`JobEvent`, in order; it must
            not block (the API's posts onto its event loop). If it raises, the job is cancelled.
        cancel: set from any thread to stop the reply (the engine stops before its next
            token / cycle; a job still queued is refused when its turn comes).
    """

    request: ChatRequest
    deliver: Callable[[Any], None]
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class JobRecord:
    """What became of one job (the last ones are kept in :attr:`ServeWorker.records`).

    ``outcome``: ``"finished"``, ``"refused"`` or ``"failed"``; ``finish_reason`` and
    ``generated_tokens`` for finished ones; ``seconds`` from the worker taking the job to its
    end; ``cancelled``: the cancel flag was set by then; ``thread``: the name of the thread
    that handled it (the MLX worker's, or the one that drained the queue)."""

    outcome: str
    finish_reason: str | None
    generated_tokens: int
    seconds: float
    cancelled: bool
    thread: str = ""


@dataclass(frozen=True)
class WorkerConfig:
    """How the worker loads and answers.

    Attributes:
        spec: the pair to load (``app.chat.session.PairSpec``).
        max_queue: requests that may wait behind the running one (>= 1); more get 429.
        enable_thinking: the chat template's thinking switch when a request does not say
            (None: the template's default).
        default_max_tokens: ``max_tokens`` when a request gives none (cut to what the
            context leaves).
        prefix_cache_bytes: the session's prefix-cache bound (None: its default).
        warm_up: run both paths once after loading (``ChatSession.warm_up``).
    """

    spec: PairSpec
    max_queue: int = 8
    enable_thinking: bool | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    prefix_cache_bytes: int | None = None
    warm_up: bool = True


_STOP = object()


def _release_streams() -> None:
    """Destroy the MLX streams this thread made (``mx.clear_streams``, MLX >= 0.31.2), so the
    process can exit cleanly after MLX ran on a thread other than the main one: without it,
    the exit sometimes aborted ("terminate called without an active exception"; see
    ml-explore/mlx#3126)."""
    import mlx.core as mx

    clear = getattr(mx, "clear_streams", None)
    if clear is not None:
        clear()


class JobQueue:
    """A bounded queue of :class:`Job` and the code that runs one on a loaded session.

    Any thread may :meth:`submit`; the thread that owns MLX takes jobs (:meth:`take`) and runs
    them (:meth:`run`) on its :class:`ChatSession`. :class:`ServeWorker` is one such thread
    of its own; the window's worker thread is another (``app.ui.serve_flow``).

    Args:
        max_queue: jobs that may wait behind the running one (>= 1).
        enable_thinking: the chat template's thinking switch when a request does not say.
        default_max_tokens: ``max_tokens`` when a request gives none.
    """

    def __init__(self, max_queue: int = 8, enable_thinking: bool | None = None,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.enable_thinking = enable_thinking
        self.default_max_tokens = default_max_tokens
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(max_queue)))
        self._lock = threading.Lock()
        self._closing = False
        self._current: Job | None = None
        self.info: ModelInfo | None = None
        """The loaded pair the jobs run on (None: nothing loaded, :meth:`submit` refuses)."""
        self.records: deque[JobRecord] = deque(maxlen=1000)
        """The last 1,000 jobs' outcomes, oldest first."""
        self.served = 0
        """Jobs taken off the queue and run so far (finished, refused or failed)."""
        self.prefilled = 0
        """Times a next turn was prefilled while no request waited (``_prefill_next``)."""

    def drain(self) -> None:
        """Take no new jobs and refuse the waiting ones (503); the running one goes on."""
        with self._lock:
            self._closing = True
            waiting = []
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not _STOP:
                    waiting.append(job)
        for job in waiting:
            self._refuse(job, ApiError(503, "the server is shutting down",
                                       type="server_error", code="shutting_down"))

    def cancel_running(self) -> None:
        """Cancel the job being generated, if any (it finishes with ``cancelled``)."""
        job = self._current
        if job is not None:
            job.cancel.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse what waits and cancel what runs (``timeout`` is for subclasses that end a
        thread)."""
        self.drain()
        self.cancel_running()

    @property
    def alive(self) -> bool:
        """True while jobs are taken (a pair is loaded and no stop began)."""
        return self.info is not None and not self._closing

    @property
    def busy(self) -> bool:
        """True while a reply is being generated."""
        return self._current is not None

    @property
    def queued(self) -> int:
        """Jobs waiting behind the running one."""
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        """Queue ``job`` (any thread; never blocks).

        Raises:
            ShuttingDownError: :meth:`drain` or :meth:`stop` was called, or no pair is loaded.
            QueueFullError: ``max_queue`` jobs already wait.
        """
        with self._lock:
            if self._closing or self.info is None:
                raise ShuttingDownError("the server is shutting down")
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                n = self._queue.maxsize
                raise QueueFullError(
                    f"the server is busy: {n} request{'s are' if n > 1 else ' is'} already "
                    "waiting") from None

    def take(self, block: bool = True) -> Job | None:
        """The next job (waiting for one when ``block``); None when the queue is empty (not
        blocking) or a stop was queued."""
        try:
            job = self._queue.get(block=block)
        except queue.Empty:
            return None
        return None if job is _STOP else job

    def run(self, session: ChatSession, job: Job) -> None:
        """Run ``job`` on ``session`` (on the thread that owns MLX): its events go to
        ``job.deliver``, its outcome to :attr:`records`. Never raises: an unexpected error is
        logged and answered with :class:`JobFailed`."""
        self._current = job
        t0 = time.perf_counter()
        try:
            self._serve(session, job, t0)
        except Exception:  # never lose the thread: the job is answered with 500
            log.exception("serving a request")
            self._record("failed", None, 0, t0, job)
            self._send(job, JobFailed("internal error while generating; see the server log"))
        finally:
            self._current = None
            self.served += 1

    def _send(self, job: Job, event: Any) -> bool:
        """Hand ``event`` to the job's client; False (and the job cancelled) when it is gone."""
        try:
            job.deliver(event)
            return True
        except Exception:
            job.cancel.set()
            return False

    def _record(self, outcome: str, reason: str | None, tokens: int, t0: float,
                job: Job) -> None:
        self.records.append(JobRecord(outcome, reason, tokens, time.perf_counter() - t0,
                                      job.cancel.is_set(), threading.current_thread().name))

    def _refuse(self, job: Job, error: ApiError) -> None:
        self.records.append(JobRecord("refused", None, 0, 0.0, job.cancel.is_set(),
                                      threading.current_thread().name))
        self._send(job, JobRefused(error))

    def _serve(self, session: ChatSession, job: Job, t0: float) -> None:
        from app.chat.events import ContentDelta, ReasoningDelta, ReplyDone, ToolCallDelta

        if job.cancel.is_set():  # the client left while it waited
            self._refuse(job, ApiError(499, "the client closed the request",
                                       code="client_closed"))
            return
        try:
            settings, started = self._prepare(session, job.request)
        except ApiError as exc:
            self._refuse(job, exc)
            return
        if not self._send(job, started):
            self._record("refused", None, 0, t0, job)
            return
        reply = None
        calls = 0
        try:
            for ev in session.reply(job.request.messages, settings, cancel=job.cancel,
                                    fit=False):  # checked against the context in _prepare
                if isinstance(ev, ContentDelta) and ev.text:
                    self._send(job, JobTextDelta("content", ev.text))
                elif isinstance(ev, ReasoningDelta) and ev.text:
                    self._send(job, JobTextDelta("reasoning", ev.text))
                elif isinstance(ev, ToolCallDelta):
                    c = ev.call
                    self._send(job, JobToolCall(calls, c.id, c.name, dict(c.arguments)))
                    calls += 1
                elif isinstance(ev, ReplyDone):
                    reply = ev.reply
        except (EngineError, ValueError) as exc:  # engine errors, a refused setting
            self._record("failed", None, 0, t0, job)
            self._send(job, JobFailed(str(exc)))
            return
        if reply is None:  # pragma: no cover - run_reply always ends with ReplyDone
            self._record("failed", None, 0, t0, job)
            self._send(job, JobFailed("the reply ended without a result"))
            return
        if reply.summary.stop_cause == "error":  # the engine failed midway (run_reply)
            self._record("failed", None, len(reply.tokens), t0, job)
            self._send(job, JobFailed(f"the reply failed while generating: "
                                      f"{reply.summary.error or 'an engine error'}"))
            return
        result = CompletionResult(
            content=reply.content, reasoning=reply.reasoning,
            tool_calls=[(c.id, c.name, dict(c.arguments)) for c in reply.tool_calls],
            finish_reason=reply.finish_reason, summary=reply.summary,
            block_size=started.block_size, completion_tokens=len(reply.tokens),
            reasoning_tokens=reply.reasoning_tokens)
        self._record("finished", reply.finish_reason, len(reply.tokens), t0, job)
        # decided before the answer goes out: a client that sends its next turn the moment it
        # reads this one must not race the check (its request starts with what is prefilled,
        # so it waits for no work of another's)
        ahead = not reply.tool_calls and not job.cancel.is_set() and self._queue.empty()
        self._send(job, JobFinished(result))
        if ahead:
            self._prefill_next(session, [*job.request.messages, *reply.messages], settings)

    def _prefill_next(self, session: ChatSession, messages: list[dict],
                      settings: ReplySettings) -> None:
        """After a final answer, with no request waiting: prefill what the client's next
        request (the same history, the answer and a new message) starts with
        (``ChatSession.prefill_after``), so that it prefills only the new message. A failure
        only costs that request a longer prefill."""
        try:
            done = session.prefill_after(messages, settings, fit=False)
        except Exception:
            log.exception("prefilling the next turn")
            return
        if done is not None:
            self.prefilled += 1

    def _prepare(self, session: ChatSession,
                 req: ChatRequest) -> tuple[ReplySettings, JobStarted]:
        """The :class:`~app.chat.settings.ReplySettings` for ``ChatSession.reply`` and the
        :class:`JobStarted` event, after checking the mode, block size and the prompt against
        the context.

        Raises:
            ApiError: 400 naming what cannot run (``context_length_exceeded`` for a prompt
                over the context).
        """
        from app.chat.history import context_limit
        from app.chat.templates import ChatTemplateError, render_prompt

        assert self.info is not None
        modes = self.info.modes
        mode = req.mode or next((m for m in DRAFTER_MODES if m in modes), Mode.PLAIN)
        if mode not in modes:
            raise bad_request(f"mode {mode!r} needs a {label(mode)} drafter, and none is loaded"
                              f" (this server offers {', '.join(modes)})", "mode",
                              "unsupported_value")
        block = None
        if mode == Mode.LOOKUP:
            block = req.block_size or DEFAULT_BLOCK
        elif mode in DRAFTER_MODES:
            own = int(session.drafter_for(mode).config.block_size)
            if req.block_size is not None and req.block_size > own:
                raise bad_request(f"block_size must be between 1 and the drafter's {own}, got "
                                  f"{req.block_size}", "block_size")
            block = req.block_size or own
        vocab = int(session.target.vocab_size)
        if req.sampling.top_k >= vocab:  # the sampler would fail once the reply began
            raise bad_request(f"top_k must be 0 (off) or below the vocabulary size {vocab:,}, "
                              f"got {req.sampling.top_k}", "top_k")
        thinking = req.enable_thinking if req.enable_thinking is not None \
            else self.enable_thinking
        try:
            prompt = render_prompt(session.target.tokenizer, req.messages, tools=req.tools,
                                   enable_thinking=thinking)
        except ChatTemplateError as exc:
            raise bad_request(str(exc), "messages") from None
        n = len(prompt.ids)
        limit = context_limit(getattr(session.target, "context_length", None) or 2**31 - 1)
        if req.max_tokens is not None and n + req.max_tokens > limit:
            raise bad_request(
                f"This model's maximum context length is {limit:,} tokens; the messages take "
                f"{n:,} and max_tokens asks for {req.max_tokens:,} more ({n + req.max_tokens:,})."
                " Shorten the messages or lower max_tokens.", "messages",
                "context_length_exceeded")
        if n >= limit:
            raise bad_request(f"This model's maximum context length is {limit:,} tokens; the "
                              f"messages take {n:,}. Shorten the messages.", "messages",
                              "context_length_exceeded")
        max_tokens = req.max_tokens or min(self.default_max_tokens, limit - n)
        try:
            settings = ReplySettings(
                mode=mode, max_tokens=max_tokens, block_size=req.block_size,
                auto_block=req.auto_block,
                stop=list(req.stop), tools=req.tools, run_tools=False,
                offered_tools_only=True,
                enable_thinking=thinking, sampling=req.sampling)
        except SettingError as exc:  # e.g. max_tokens above the app's range
            raise bad_request(str(exc), "max_tokens" if "max_tokens" in str(exc)
                              else None) from None
        return settings, JobStarted(prompt_tokens=n, mode=mode, block_size=block,
                                 max_tokens=max_tokens)


class ServeWorker(JobQueue):
    """The server's own MLX thread: it loads the pair into a :class:`ChatSession` and runs the
    queued jobs one at a time.

    Call :meth:`start` (loads the pair on the new thread and waits for it), :meth:`submit`
    from any thread, :meth:`stop` at the end. ``session_factory`` builds the session on the
    worker thread (tests may pass another).
    """

    def __init__(self, config: WorkerConfig,
                 session_factory: Callable[..., ChatSession] = ChatSession) -> None:
        super().__init__(config.max_queue, config.enable_thinking, config.default_max_tokens)
        self.config = config
        self._factory = session_factory
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.session: ChatSession | None = None
        self.load_error: BaseException | None = None

    def start(self, timeout: float | None = None) -> ModelInfo:
        """Start the thread, load the pair on it (and warm it up) and wait.

        Returns:
            The loaded pair's :class:`ModelInfo`.

        Raises:
            EngineError: the pair could not be loaded (the thread has ended).
            TimeoutError: not loaded within ``timeout`` seconds.
        """
        self._thread = threading.Thread(target=self._run, name="serve-mlx-worker",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the pair did not load within {timeout} s")
        if self.load_error is not None:
            raise self.load_error
        assert self.info is not None
        return self.info

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse what waits, cancel what runs, end the thread (wait up to ``timeout`` s)."""
        super().stop()
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:  # pragma: no cover - drained just above
            pass
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """True while the thread runs with a loaded pair and no stop began."""
        return self._thread is not None and self._thread.is_alive() and super().alive

    def _run(self) -> None:
        try:
            session = self._factory(None, prefix_cache_bytes=self.config.prefix_cache_bytes)
            info = session.load(self.config.spec)
            if self.config.warm_up:
                session.warm_up()
            self.session = session
        except BaseException as exc:  # noqa: BLE001 - reported to start()'s caller
            self.load_error = exc
            self._ready.set()
            return
        self.info = info
        self._ready.set()
        while True:
            job = self.take()
            if job is None:
                break
            self.run(session, job)
        try:
            session.unload()
            _release_streams()
        except Exception:  # pragma: no cover - the process is ending
            log.exception("unloading at shutdown")


__all__ = ["Job", "JobEvent", "JobFailed", "JobFinished", "JobQueue", "JobRecord", "JobRefused",
           "JobStarted", "JobTextDelta", "JobToolCall", "QueueFullError", "ServeWorker",
           "ShuttingDownError", "WorkerConfig"]
