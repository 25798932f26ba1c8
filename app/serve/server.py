"""Running the API on uvicorn: loopback by default, a clean stop on SIGTERM / SIGINT.

:func:`check_host` refuses a host other than loopback unless an API key is set;
:func:`cors_origins` reads ``--cors``'s origins.
:class:`DrainingServer` is uvicorn's server with the stop this app wants: on the first SIGTERM
or SIGINT it stops taking requests, refuses the queued ones (503), gives the reply being
generated ``grace_s`` seconds to finish, then cancels it (the engine stops before its next
cycle; its stream still ends with a finish chunk and ``[DONE]``), closes the connections, stops
the worker thread and returns, so the process exits with status 0. A second SIGINT forces
the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import re
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import uvicorn

from app.serve import (  # noqa: F401 (re-exported)
    DEFAULT_GRACE_S,
    DEFAULT_HOST,
    DEFAULT_PORT,
    MAX_PORT,
)
from app.serve.api import ServeOptions, create_app, is_loopback
from app.serve.worker import JobQueue

log = logging.getLogger(__name__)



class ServeConfigError(ValueError):
    """The server cannot start as asked (e.g. a public host without an API key)."""


def check_host(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond this machine without a key.

    Raises:
        ServeConfigError: ``host`` is not loopback and ``api_key`` is empty.
    """
    if not is_loopback(host) and not api_key:
        raise ServeConfigError(
            f"--host {host} would accept requests from other machines: give --api-key KEY "
            "too (clients then send 'Authorization: Bearer KEY'), or keep the default "
            f"--host {DEFAULT_HOST}")


ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[^\s/:?#\[\]@]+)(:[0-9]{1,5})?\Z")
"""One web origin as browsers send it in ``Origin``: ``scheme://host[:port]``, no path."""


def cors_origins(text: str) -> tuple[str, ...]:
    """``serve --cors``'s value: ``*`` (any origin) or origins separated by commas, as
    ``("*",)`` or the origins lower-cased (browsers send scheme and host in lower case),
    each once.

    Raises:
        ServeConfigError: no origin, ``*`` among others, or an entry that is not
            ``scheme://host[:port]`` (a path or a trailing ``/`` included: the ``Origin``
            header never has one, so it would never match).
    """
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise ServeConfigError("--cors names no origin: give '*' or origins such as "
                               "http://localhost:3000, separated by commas")
    if "*" in entries:
        if len(entries) > 1:
            raise ServeConfigError("--cors: '*' allows every origin, give it alone")
        return ("*",)
    out: list[str] = []
    for entry in entries:
        origin = entry.lower()
        if not ORIGIN.match(origin):
            scheme, sep, rest = origin.partition("://")
            base = f"{scheme}://{rest.split('/', 1)[0]}"
            if sep and ORIGIN.match(base):
                raise ServeConfigError(f"--cors: {entry!r} has a path: an origin has no path, "
                                       f"not even a trailing '/' (give {base})")
            raise ServeConfigError(f"--cors: {entry!r} is not an origin: give "
                                   "scheme://host[:port], e.g. http://localhost:3000")
        if origin not in out:
            out.append(origin)
    return tuple(out)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: a free one), for uvicorn's
    ``run(sockets=[...])``; binding before the model loads makes a busy port an error at once.

    Raises:
        ServeConfigError: the address cannot be bound (in use, or not this machine's), or
            ``port`` is not a TCP port (0 to :data:`MAX_PORT`).
    """
    if not 0 <= port <= MAX_PORT:
        raise ServeConfigError(f"cannot listen on {host}:{port}: a TCP port is 0 to {MAX_PORT}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ServeConfigError(f"cannot listen on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        reason = "the port is in use" if exc.errno == errno.EADDRINUSE else str(exc)
        raise ServeConfigError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, stopping as the module doc says.

    Args:
        config: the uvicorn ``Config``.
        worker: the :class:`JobQueue` whose jobs are drained and cancelled on the stop.
        grace_s: seconds the running reply may take after the stop began.
        on_started: called with the bound (host, port) once it listens.
    """

    def __init__(self, config: uvicorn.Config, worker: JobQueue, grace_s: float,
                 on_started: Callable[[tuple[str, int]], None] | None = None) -> None:
        super().__init__(config)
        self.worker = worker
        self.grace_s = grace_s
        self.on_started = on_started
        self.address: tuple[str, int] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM start the stop (main thread only); unlike uvicorn's own, the
        signal is not raised again afterwards, so the process exits with status 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = [signal.SIGINT, signal.SIGTERM]
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:
        """The first signal starts the stop; a second SIGINT forces it."""
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, then :attr:`address` and ``on_started``."""
        await super().startup(sockets=sockets)
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                name = sock.getsockname()
                self.address = (str(name[0]), int(name[1]))
                break
            if self.address:
                break
        if self.started and self.on_started is not None and self.address is not None:
            self.on_started(self.address)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop listening, refuse the queued requests, let the running one finish for
        ``grace_s`` seconds, cancel it, then uvicorn's shutdown (connections, lifespan: the
        worker stops)."""
        for server in getattr(self, "servers", []):
            server.close()  # no new connections while the running reply finishes
        self.worker.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while self.worker.busy and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if self.worker.busy:
            why = ("a second Ctrl+C" if self.force_exit else
                   f"the {self.grace_s:g} s grace is over")
            log.warning("cancelling the running reply: %s", why)
            self.worker.cancel_running()
        await super().shutdown(sockets=sockets)


def make_server(worker: JobQueue, options: ServeOptions, host: str = DEFAULT_HOST,
                port: int = DEFAULT_PORT, grace_s: float = DEFAULT_GRACE_S,
                on_started: Callable[[tuple[str, int]], None] | None = None,
                log_level: str = "warning") -> DrainingServer:
    """A :class:`DrainingServer` serving ``create_app(worker, options)`` on ``host:port``;
    the app's shutdown calls ``worker.stop()`` (a :class:`~app.serve.worker.ServeWorker`'s
    ends its thread; the window's queue only refuses and cancels its jobs). Run it with
    ``.run()`` (or ``.run(sockets=[sock])`` on a socket already bound). ``options.host`` is
    set to ``host``: the app's :class:`~app.serve.api.HostGuard` follows where it listens."""
    options = dataclasses.replace(options, host=host)
    app = create_app(worker, options, on_shutdown=worker.stop)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, ws="none",
                            lifespan="on", timeout_graceful_shutdown=grace_s + 5,
                            server_header=False, access_log=log_level in ("info", "debug"))
    return DrainingServer(config, worker, grace_s, on_started)
