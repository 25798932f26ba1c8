"""The window's "Serve on localhost" switch: the loaded pair over the OpenAI-compatible API
(``app/serve``, docs/serve.md), generated on the window's own worker thread.

The window's worker already owns MLX, so the server gets no thread of its own for it:
:class:`WindowJobs` is the server's bounded job queue, and each submitted job asks the worker
(``Worker.serveRequested``) to take one job and run it on the window's ``ChatSession``
(:meth:`app.serve.worker.JobQueue.run`), between the window's own replies. uvicorn runs on a
thread of its own with its event loop (:class:`WindowServer`); it never touches MLX.

The server listens on 127.0.0.1 only (no API key in the window), on the port in the
``serve/port`` setting (default 8080). Loading another pair, unloading it or closing the
window stops serving. :class:`ServeController` is the window's switch for it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel

from app.chat.session import ModelInfo
from app.serve.api import ServeOptions
from app.serve.server import DEFAULT_PORT, MAX_PORT, DrainingServer, make_server
from app.serve.worker import JobQueue
from app.ui.messages import MessageBar
from app.ui.state import WindowState
from app.ui.worker import Worker

log = logging.getLogger("app.ui.window")

SERVE_HOST = "127.0.0.1"
"""The window serves on loopback only."""
SERVE_TIP = "Serve the loaded pair on 127.0.0.1 (OpenAI API)."
"""The Serve on localhost action's tooltip while not serving."""


class WindowJobs(JobQueue):
    """The server's job queue, run by the window's worker thread: :meth:`submit` queues a job
    and calls ``request_run`` (which emits ``Worker.serveRequested`` with this queue), so the
    worker takes exactly one job per submitted one.

    Args:
        info: the loaded pair the jobs run on.
        request_run: asks the worker thread to run one job of this queue (any thread).
        max_queue: jobs that may wait (beyond it: 429).
    """

    def __init__(self, info: ModelInfo, request_run: Callable[[], None],
                 max_queue: int = 8) -> None:
        super().__init__(max_queue)
        self.info = info
        self._request_run = request_run

    def submit(self, job) -> None:
        """Queue ``job`` and ask the worker to run it (see :meth:`JobQueue.submit` for the
        errors raised)."""
        super().submit(job)
        self._request_run()


class WindowServer:
    """uvicorn serving ``jobs`` on ``127.0.0.1:port`` from a thread of its own.

    Raises:
        OSError: the port cannot be bound (in use); nothing is started then.
        RuntimeError: uvicorn did not start within 10 s.
    """

    def __init__(self, jobs: WindowJobs, model_id: str, port: int = DEFAULT_PORT) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((SERVE_HOST, port))
        except OSError:
            sock.close()
            raise
        self.jobs = jobs
        self.port = sock.getsockname()[1]
        self.server: DrainingServer = make_server(jobs, ServeOptions(model_id), SERVE_HOST,
                                                  self.port, grace_s=2.0)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="serve-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the server did not start")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, the base URL clients use."""
        return f"http://{SERVE_HOST}:{self.port}/v1"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, refuse the queued jobs, cancel the running one after 2 s, and wait
        up to ``timeout`` seconds for uvicorn's thread."""
        self.jobs.drain()
        self.server.should_exit = True
        self.thread.join(timeout)


class ServeController:
    """The "Serve on localhost" switch (File menu).

    Args:
        state: the window's state (the loaded ``model``, a ``loading`` pair, ``qs`` for the
            ``serve/port`` setting).
        worker: the window's :class:`app.ui.worker.Worker`, which runs the server's jobs.
        messages: where failures and the serving URL are said.
        action: the checkable File › Serve on localhost action (kept in step with serving).
        label: a status-bar label that says "Serving <url>" while it serves (hidden
            otherwise), or None.

    Attributes:
        serving: the running server, None when not serving.
    """

    def __init__(self, state: WindowState, worker: Worker, messages: MessageBar,
                 action: QAction, label: QLabel | None = None) -> None:
        self.state = state
        self.worker = worker
        self.messages = messages
        self.action = action
        self.label = label  # the status bar's lasting "Serving <url>" while it serves
        self.serving: WindowServer | None = None
        action.toggled.connect(self.toggle_serving)

    def toggle_serving(self, on: bool) -> None:
        """The menu action's slot: start or stop serving."""
        if on:
            self.start_serving()
        else:
            self.stop_serving()

    def start_serving(self, port: int | None = None) -> str | None:
        """Serve the loaded pair on 127.0.0.1 (``port``, else the ``serve/port`` setting);
        returns the base URL, or None when it could not start (the banner says why)."""
        if self.serving is not None:
            return self.serving.url
        info = self.state.model
        if self.state.loading is not None:
            self._serve_failed("A model is loading: serve it once it is loaded.")
            return None
        if info is None:
            self._serve_failed("Load a model first: the server serves the loaded pair.")
            return None
        if port is None:
            try:
                port = int(self.state.qs.value("serve/port", DEFAULT_PORT))
            except (TypeError, ValueError):
                port = DEFAULT_PORT
        if not 0 <= port <= MAX_PORT:  # bind would raise OverflowError, past the handler below
            self._serve_failed(f"Cannot serve on port {port}: a TCP port is 0 to {MAX_PORT} (set "
                               "serve/port in the settings file).")
            return None
        jobs = WindowJobs(info, lambda: self.worker.serveRequested.emit(jobs))
        try:
            self.serving = WindowServer(jobs, info.target_name, port)
        except (OSError, RuntimeError) as exc:
            self._serve_failed(f"Cannot serve on {SERVE_HOST}:{port}: {exc}. Another program "
                               "may use the port (set serve/port in the settings file).")
            return None
        self._set_checked(True)
        url = self.serving.url
        self.messages.flash(f"Serving {info.target_name} on {url} (OpenAI-compatible)", 10000)
        self.action.setToolTip(f"Serving on {url}; click to stop.")
        if self.label is not None:
            self.label.setText(f"Serving {url}")
            self.label.setToolTip(f"The loaded pair is served on {url} (OpenAI-compatible); "
                                  "File › Serve on localhost stops it.")
            self.label.show()
        log.info("serving %s on %s", info.target_name, url)
        return url

    def stop_serving(self, why: str = "") -> None:
        """Stop serving (no-op when not serving); ``why`` is flashed in the status bar."""
        server, self.serving = self.serving, None
        self._set_checked(False)
        if self.label is not None:
            self.label.hide()
        if server is None:
            return
        server.stop()
        self.action.setToolTip(SERVE_TIP)
        self.messages.flash(f"Stopped serving{': ' + why if why else ''}", 6000)

    def _serve_failed(self, message: str) -> None:
        self._set_checked(False)
        self.messages.show_banner(message)

    def _set_checked(self, on: bool) -> None:
        if self.action.isChecked() != on:
            self.action.blockSignals(True)
            self.action.setChecked(on)
            self.action.blockSignals(False)
