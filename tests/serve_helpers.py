"""Running the server in the test process on a loopback port (helpers, not tests).

:class:`RunningServer` starts a :class:`app.serve.worker.ServeWorker` (its own MLX thread),
binds 127.0.0.1 on a free port and runs uvicorn in a thread, as ``python -m app serve`` does
minus the signals; :func:`sse_events` reads a raw SSE body into its ``data:`` payloads.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from app.chat.session import PairSpec
from app.serve.api import DEFAULT_MAX_BODY_BYTES, ServeOptions
from app.serve.server import make_server
from app.serve.worker import ServeWorker, WorkerConfig


class RunningServer:
    """A server for ``spec`` on ``http://127.0.0.1:<free port>``; :meth:`close` stops it."""

    def __init__(self, spec: PairSpec, *, model_id: str = "test-model",
                 api_key: str | None = None, max_queue: int = 8,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, grace_s: float = 2.0,
                 enable_thinking: bool | None = None) -> None:
        self.worker = ServeWorker(WorkerConfig(spec=spec, max_queue=max_queue, warm_up=False,
                                               enable_thinking=enable_thinking))
        self.info = self.worker.start(timeout=300)
        self.model_id = model_id
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = make_server(self.worker, ServeOptions(model_id, api_key, max_body_bytes),
                                  "127.0.0.1", self.port, grace_s)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="uvicorn-test", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def wait_idle(self, timeout: float = 10.0) -> float:
        """Wait until the worker runs nothing and nothing waits; returns the seconds it took.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds.
        """
        t0 = time.monotonic()
        while self.worker.busy or self.worker.queued:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError("the worker is still busy")
            time.sleep(0.005)
        return time.monotonic() - t0

    def close(self) -> None:
        """Stop uvicorn (its shutdown stops the worker) and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(60)
        self.worker.stop()


def sse_events(lines: list[str]) -> list[dict | str]:
    """The ``data:`` payloads of an SSE body's lines, JSON decoded (``"[DONE]"`` as is).

    Raises:
        AssertionError: a non-empty line that is not ``data: ...``.
    """
    out: list[dict | str] = []
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
