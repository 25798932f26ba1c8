"""The Starlette application: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``.

Handlers run on the event loop and never call MLX: a request becomes a
:class:`~app.serve.worker.Job` on a :class:`~app.serve.worker.JobQueue` (the
:class:`~app.serve.worker.ServeWorker`'s, or the window's), and the handler awaits the worker's events from an ``asyncio.Queue`` fed with
``loop.call_soon_threadsafe``. A client that goes away (``http.disconnect``, or the stream's
send failing) sets the job's cancel flag: the engine stops before its next token / cycle and
the worker takes the next job.

Errors are OpenAI-shaped (``{"error": {"message", "type", "param", "code"}}``): 400 malformed
JSON or fields and prompts over the context, 401 a missing or wrong Bearer key (when the
server has one), 403 a request from a web page whose origin is not allowed
(:class:`OriginGuard`) or, on a loopback server, for a host name that is not loopback
(:class:`HostGuard`), 404 an unknown model or
route, 413 a body over the limit, 429 the queue is full, 503 shutting down, 500 a failure while
generating.

CORS is off unless :attr:`ServeOptions.cors_origins` is set (``serve --cors``); then
:class:`CorsHeaders` grants the allowed origins and answers preflights (on a loopback server,
only those for a loopback ``Host``: others get :class:`HostGuard`'s 403). It wraps the whole
application (:class:`ServeApp`), so every answer to an allowed origin carries the grant,
the 500 Starlette writes for an unexpected exception included.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from app.serve import DEFAULT_HOST
from app.serve.protocol import (
    ApiError,
    ChatRequest,
    bad_request,
    chunk_object,
    completion_object,
    dflash_object,
    new_completion_id,
    openai_finish_reason,
    parse_chat_request,
    sse,
    tool_call_object,
    usage_object,
)
from app.serve.worker import (
    Job,
    JobFailed,
    JobFinished,
    JobQueue,
    JobRefused,
    JobStarted,
    JobTextDelta,
    JobToolCall,
    QueueFullError,
    ShuttingDownError,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""Request bodies above this many bytes are refused with 413 (4 MiB)."""


@dataclass
class ServeOptions:
    """How the API answers.

    Attributes:
        model_id: the id ``/v1/models`` lists and requests must name (or leave out).
        api_key: when set, every ``/v1/`` request needs ``Authorization: Bearer <key>``
            (401 otherwise); ``/health`` stays open.
        max_body_bytes: larger request bodies get 413.
        aliases: other names accepted for the model (e.g. the path it was loaded from).
        cors_origins: None (default): no CORS, responses carry no ``Access-Control-*``
            headers and OPTIONS is answered as any method the routes do not take (405);
            ``("*",)``: any origin; else the origins (``scheme://host[:port]``, as browsers
            send them) allowed (:class:`CorsHeaders`; ``serve --cors``).
        host: the address the server listens on (``make_server`` sets it from its own
            ``host``); a loopback one turns on :class:`HostGuard` (DNS-rebinding defence).
    """

    model_id: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    aliases: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] | None = None
    host: str = DEFAULT_HOST


class _ErrorJSON(JSONResponse):
    """A JSON answer whose text may hold lone surrogates (a message echoing a value from the
    request, e.g. ``"type": "\\ud800"``): they are written as JSON ``\\uXXXX`` escapes, as
    ``backslashreplace`` spells them, where Starlette's UTF-8 encoding would raise (500)."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":")).encode("utf-8", "backslashreplace")


def error_response(error: ApiError) -> JSONResponse:
    """``error`` as its status and OpenAI-style body, with its headers (and
    ``WWW-Authenticate`` on a 401); any message encodes (:class:`_ErrorJSON`)."""
    headers = {**error.headers, **({"WWW-Authenticate": "Bearer"} if error.status == 401
                                   else {})}
    return _ErrorJSON(error.body(), status_code=error.status, headers=headers or None)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); False for every
    other name or address (``0.0.0.0`` and ``::`` listen on every interface)."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, str | None]:
    """A ``Host`` header (``name[:port]``, ``[v6][:port]``) as (name, port or None)."""
    value = value.strip()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        return name + "]", rest[1:] if rest.startswith(":") else None
    name, sep, port = value.rpartition(":")
    return (name, port) if sep and port.isdigit() else (value, None)


def is_loopback_host(value: str | None) -> bool:
    """Whether a ``Host`` header names this machine's loopback (``localhost``, 127.0.0.0/8,
    ``[::1]``, with any port)."""
    return value is not None and is_loopback(split_host(value)[0])


def same_loopback_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` (an ``Origin`` header) is the server's own, as reached through
    ``host`` (the ``Host`` header), and that host is loopback.

    Why loopback only: the ``Host`` header comes from the page's own URL, so under DNS
    rebinding (a page at ``attacker.example`` whose name now resolves to 127.0.0.1) origin and
    host match for the attacker's page too; a loopback name cannot be rebound."""
    scheme, sep, rest = origin.partition("://")
    return bool(sep and host) and scheme in ("http", "https") and is_loopback_host(host) \
        and rest.lower() == host.lower()


def origin_refused(origin: str, origins: tuple[str, ...] | frozenset[str]) -> ApiError:
    """The 403 ``origin_not_allowed`` for a page at ``origin`` the server does not allow,
    the same for its preflight (:class:`CorsHeaders`) and its requests (:class:`OriginGuard`).
    It shows the whole ``--cors`` list with the origin added: ``--cors ORIGIN`` alone would
    replace the list. An opaque origin (``null``: a file, a sandboxed frame) cannot be
    listed, only allowed with ``*``."""
    listed = sorted(o for o in origins if o != "*")
    now = f"this server allows {', '.join(listed)}" if listed else "this server allows none"
    if "://" in origin:
        how = f"to allow it, start the server with --cors {','.join([*listed, origin])}"
    else:
        how = "a page with an opaque origin (null) can only be allowed with --cors '*'"
    return ApiError(403, f"requests from web pages at {origin} are not allowed: {now}; {how}",
                    type="permission_error", code="origin_not_allowed")


class BearerAuth:
    """ASGI middleware: ``/v1/`` requests need ``Authorization: Bearer <key>`` (compared in
    constant time); others pass. A missing or wrong key is answered with 401."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/v1"):
            given = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    given = value
            scheme, _, token = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._key):
                what = "no API key was given" if not given else "the API key is not valid"
                response = error_response(ApiError(
                    401, f"{what}: send the header 'Authorization: Bearer <key>' with the key "
                    "the server was started with (--api-key)", type="authentication_error",
                    code="invalid_api_key"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


CORS_ALLOW_METHODS = "GET, POST, OPTIONS"
"""``Access-Control-Allow-Methods`` of a preflight answer: the API's methods."""
CORS_ALLOW_HEADERS = ("Authorization", "Content-Type")
"""``Access-Control-Allow-Headers`` of a preflight answer always names these (what an OpenAI
client sends), then the others the preflight asked for (:func:`allow_headers`)."""
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
"""An HTTP header name (RFC 9110 token)."""


def allow_headers(requested: str | None) -> str:
    """``Access-Control-Allow-Headers`` for a preflight that asked for ``requested`` (its
    ``Access-Control-Request-Headers``, None: absent): :data:`CORS_ALLOW_HEADERS` and the
    names asked for, each once; a name that is not a header name is left out.

    Why reflect: browser SDKs add headers of their own (the OpenAI JS SDK's
    ``X-Stainless-*``, ``OpenAI-Organization``, ``OpenAI-Project``); a fixed list fails their
    preflight. The server ignores headers it does not know, so allowing them is harmless."""
    names = list(CORS_ALLOW_HEADERS)
    seen = {n.lower() for n in names}
    for name in (requested or "").split(","):
        name = name.strip()
        if HEADER_NAME.match(name) and name.lower() not in seen:
            seen.add(name.lower())
            names.append(name)
    return ", ".join(names)
CORS_MAX_AGE_S = 600
"""``Access-Control-Max-Age``: seconds a browser may reuse a preflight answer."""
CORS_EXPOSE_HEADERS = "Retry-After, WWW-Authenticate, Allow"
"""``Access-Control-Expose-Headers`` of an answer to an allowed origin: the headers this
server sends that a browser otherwise hides from the page's script (``Retry-After`` on a 429,
``WWW-Authenticate`` on a 401, ``Allow`` on a 405). The others it sends are CORS-safelisted
(``Content-Type``, ``Cache-Control``...) or meant for caches and proxies (``Vary``,
``X-Accel-Buffering``)."""


class CorsHeaders:
    """ASGI middleware for browser clients (``serve --cors``): cross-origin access to the
    API for ``origins`` (``("*",)``: any).

    * Every HTTP response gets ``Access-Control-Allow-Origin``: ``*``, or the request's
      ``Origin`` when it is listed (with ``Vary: Origin``, as the answer then depends on it;
      an origin not listed gets no grant, only the ``Vary``). A granted answer other than a
      preflight's also gets :data:`CORS_EXPOSE_HEADERS`, so the page can read
      ``Retry-After`` and the like.
    * ``OPTIONS`` to ``/v1/*`` is a preflight: answered here with 204, the allowed origin,
      :data:`CORS_ALLOW_METHODS`, the headers it asked for (:func:`allow_headers`, with
      ``Vary: Access-Control-Request-Headers``) and :data:`CORS_MAX_AGE_S`, before the API
      key is checked (browsers send none on a preflight); a preflight from an origin not
      listed gets the 403 ``origin_not_allowed`` its requests get (:func:`origin_refused`).
      ``OPTIONS`` elsewhere goes to the application as before.
    * ``loopback_only`` (a server listening on loopback): a preflight whose ``Host`` is not a
      loopback name gets the 403 ``host_not_allowed`` its requests get from
      :class:`HostGuard` (:func:`host_refused`), with no ``Access-Control-*`` header, before
      any origin check. Why here: this layer answers preflights without calling the
      application, so a :class:`HostGuard` inside it never sees them.
    * The server's own loopback origin (:func:`same_loopback_origin`), which
      :class:`OriginGuard` serves, counts as listed here too, so its preflight and its
      requests agree.

    It must wrap everything that answers, so that preflights, 401s, 403s and 500s pass
    through it: :class:`ServeApp` puts it outside Starlette's whole stack.
    """

    def __init__(self, app, origins: tuple[str, ...], loopback_only: bool = False) -> None:
        self.app = app
        self._any = "*" in origins
        self._origins = frozenset(origins)
        self._loopback_only = loopback_only

    def _allows(self, origin: str | None, host: str | None) -> bool:
        """Whether responses to a request from ``origin`` (None: no ``Origin`` header) to
        ``host`` grant access: always with ``*``, else for a listed origin or the server's own
        loopback one."""
        return self._any or (origin is not None and (
            origin in self._origins or same_loopback_origin(origin, host)))

    def _grant(self, origin: str | None, host: str | None) -> tuple[
            list[tuple[bytes, bytes]], list[str]]:
        """The headers every response to a request from ``origin`` carries, preflights'
        included, and the ``Vary`` names they bring (``Origin`` unless ``*``)."""
        if self._any:
            return [(b"access-control-allow-origin", b"*")], []
        if self._allows(origin, host):
            return [(b"access-control-allow-origin", origin.encode("latin-1"))], ["Origin"]
        return [], ["Origin"]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        host = _header(scope, b"host")
        grant, vary = self._grant(origin, host)
        if scope.get("method") == "OPTIONS" and scope.get("path", "").startswith("/v1"):
            if self._loopback_only and (refused := host_refused(scope)) is not None:
                await refused(scope, receive, send)
                return
            if origin is not None and not self._allows(origin, host):
                response: Response = error_response(origin_refused(origin, self._origins))
            else:
                response = Response(status_code=204, headers={
                    "Access-Control-Allow-Methods": CORS_ALLOW_METHODS,
                    "Access-Control-Allow-Headers": allow_headers(
                        _header(scope, b"access-control-request-headers")),
                    "Access-Control-Max-Age": str(CORS_MAX_AGE_S)})
                vary = [*vary, "Access-Control-Request-Headers"]
            response.raw_headers.extend(grant)
            if vary:
                response.raw_headers.append((b"vary", ", ".join(vary).encode()))
            await response(scope, receive, send)
            return

        if vary:
            grant.append((b"vary", ", ".join(vary).encode()))
        if self._allows(origin, host):
            grant.append((b"access-control-expose-headers", CORS_EXPOSE_HEADERS.encode()))

        async def send_granted(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *grant]}
            await send(message)

        await self.app(scope, receive, send_granted)


class ServeApp(Starlette):
    """The API's Starlette application, with :class:`CorsHeaders` for ``cors_origins``
    (None: no CORS) as its outermost layer (``loopback_only``: the server listens on
    loopback, its preflights answer loopback host names only).

    Why: Starlette builds its stack as ``ServerErrorMiddleware`` (which answers an exception
    no handler took with 500), then the middleware added, then the routes; a
    :class:`CorsHeaders` added like the others would never see that 500, and the browser
    would hide it from the page. Outside the whole stack it grants every answer.
    """

    def __init__(self, *args, cors_origins: tuple[str, ...] | None = None,
                 loopback_only: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cors_origins = cors_origins
        self.loopback_only = loopback_only

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack, inside :class:`CorsHeaders` when CORS is on."""
        stack = super().build_middleware_stack()
        if self.cors_origins is None:
            return stack
        return CorsHeaders(stack, self.cors_origins, loopback_only=self.loopback_only)


def _header(scope, name: bytes) -> str | None:
    """The first ``name`` header (lower-case bytes) of an ASGI ``scope``, decoded; None when
    absent."""
    return next((value.decode("latin-1") for key, value in scope.get("headers", ())
                 if key == name), None)


class OriginGuard:
    """ASGI middleware: a request from a web page (one with an ``Origin`` header, which
    browsers send on every cross-origin request and every POST) is refused with 403
    ``origin_not_allowed`` unless the page is on the server's own host and port, or
    ``origins`` allows it (``"*"``: any; ``serve --cors``). Programs (the OpenAI clients,
    curl) send no ``Origin`` and pass. "Its own host" counts only for a loopback ``Host``
    (:func:`same_loopback_origin`): any other name could be an attacker's, rebound.

    Why: a browser sends a ``text/plain`` POST to any address without asking first, so
    without this guard any page a user visits could make a server on ``localhost`` generate
    (it could not read the reply without CORS, but the model would run). Ollama refuses such
    requests the same way (``OLLAMA_ORIGINS``).

    Add it inside :class:`CorsHeaders` (which answers allowed preflights) and outside
    :class:`BearerAuth` (a page is told why, not asked for a key).
    """

    def __init__(self, app, origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self._any = "*" in origins
        self._origins = frozenset(origins)

    def allowed(self, origin: str, host: str | None) -> bool:
        """Whether a request from ``origin`` (its ``Origin`` header) to ``host`` (its
        ``Host`` header) is served."""
        return self._any or origin in self._origins or same_loopback_origin(origin, host)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            origin = _header(scope, b"origin")
            if origin is not None and not self.allowed(origin, _header(scope, b"host")):
                response = error_response(origin_refused(origin, self._origins))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def host_refused(scope) -> Response | None:
    """The 403 ``host_not_allowed`` for an HTTP ``scope`` whose ``Host`` header is not a
    loopback name, naming the host and the addresses to use; None when it is one, or when
    there is no ``Host`` (HTTP/1.0; no browser sends one). For a server listening on loopback
    (:class:`HostGuard`, and :class:`CorsHeaders`' preflights)."""
    host = _header(scope, b"host")
    if host is None or is_loopback_host(host):
        return None
    server = scope.get("server") or ()
    port = server[1] if len(server) > 1 and server[1] else split_host(host)[1]
    where = f":{port}" if port else ""
    return error_response(ApiError(
        403, f"requests for the host {host!r} are not served: this server listens "
        f"on loopback only and answers to loopback names, so a page under another "
        f"name (DNS rebinding) cannot use it; reach it at http://127.0.0.1{where} "
        f"or http://localhost{where}", type="permission_error", code="host_not_allowed"))


class HostGuard:
    """ASGI middleware for a server listening on loopback: a request whose ``Host`` header
    is not a loopback name (``localhost``, 127.0.0.0/8, ``[::1]``, any port) is refused with
    403 ``host_not_allowed``, naming the host and the addresses to use. A request without
    ``Host`` (HTTP/1.0; no browser sends one) passes.

    Why: DNS rebinding. A page at ``http://attacker.example:PORT`` whose name is then made to
    resolve to 127.0.0.1 reaches this server as its own origin: its requests carry
    ``Host: attacker.example:PORT`` (and, same-origin, often no ``Origin``), and it can read
    the answers. Programs (curl, the OpenAI clients) name the address they connect to,
    ``127.0.0.1:PORT`` or ``localhost:PORT``. Ollama refuses such hosts the same way.
    A server listening beyond loopback (which needs an API key) is reached under names this
    one cannot know, so :func:`create_app` adds this guard only for a loopback
    :attr:`ServeOptions.host`. Add it outside :class:`OriginGuard` and :class:`BearerAuth`.
    :class:`CorsHeaders`, which answers preflights itself, refuses them the same way on such
    a server (``loopback_only``), wherever this guard stands.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and (response := host_refused(scope)) is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def read_json(request: Request, limit: int) -> object:
    """The request body decoded as JSON, read at most ``limit`` bytes far.

    Raises:
        ApiError: 413 when the body (or its Content-Length) is over ``limit``; 400 when it is
            empty, not UTF-8, not JSON or nested more than :data:`MAX_JSON_DEPTH` levels.
    """
    length = request.headers.get("content-length", "")
    too_big = ApiError(413, f"the request body is over the server's limit of {limit:,} bytes",
                       code="request_too_large")
    if length.isdigit() and int(length) > limit:
        raise too_big
    size, parts = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        parts.append(chunk)
    raw = b"".join(parts)
    if not raw.strip():
        raise bad_request("the request body is empty: send a JSON object")
    too_deep = bad_request(f"the request body is nested too deeply (more than "
                           f"{MAX_JSON_DEPTH} levels of arrays and objects)", code="invalid_json")
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno}"
                          f" column {exc.colno}", code="invalid_json") from None
    except RecursionError:
        raise too_deep from None
    if json_depth(body) > MAX_JSON_DEPTH:
        raise too_deep
    return body


MAX_JSON_DEPTH = 100
"""Levels of nested arrays and objects a request body may have: far more than any chat
request or tool schema needs, and few enough that checking and rendering it never meets
Python's recursion limit."""


def json_depth(value: object) -> int:
    """Levels of nested arrays and objects in decoded JSON ``value`` (a scalar: 0), counted
    without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        todo.extend((child, level + 1) for child in children)
    return deepest


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Set ``job.cancel`` when the client disconnects (the body has been read, so the next
    message the server hands over is ``http.disconnect``)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


def create_app(worker: JobQueue, options: ServeOptions,
               on_shutdown: Callable[[], None] | None = None) -> ServeApp:
    """The ASGI application serving ``worker``'s loaded pair.

    Args:
        worker: the :class:`~app.serve.worker.JobQueue` whose thread runs the jobs (a started
            :class:`~app.serve.worker.ServeWorker`, or the window's queue).
        options: :class:`ServeOptions` (model id, API key, body limit, CORS).
        on_shutdown: called once when the application shuts down (lifespan), e.g.
            ``worker.stop``.
    """
    created = int(time.time())

    def model_card() -> dict:
        info = worker.info
        card = {"id": options.model_id, "object": "model", "created": created,
                "owned_by": "dflash-chat"}
        if info is not None:
            card["dflash"] = {"modes": list(info.modes), "drafter": info.drafter_name,
                              "dflash2_drafter": info.drafter2_name,
                              "block_size": info.drafter_block_size,
                              "context_length": info.context_length, "device": info.device}
        return card

    def check_model(name: str | None) -> None:
        if name is not None and name != options.model_id and name not in options.aliases:
            raise ApiError(404, f"the model {name!r} does not exist here: this server serves "
                           f"{options.model_id!r} (GET /v1/models)", type="not_found_error",
                           param="model", code="model_not_found")

    async def health(request: Request) -> Response:
        status = "ok" if worker.alive else "stopping" if worker.info else "not_loaded"
        return JSONResponse({"status": status, "model": options.model_id, "busy": worker.busy,
                             "queued": worker.queued, "served": worker.served},
                            status_code=200 if status == "ok" else 503)

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def get_model(request: Request) -> Response:
        check_model(request.path_params["model"])
        return JSONResponse(model_card())

    async def chat_completions(request: Request) -> Response:
        req = parse_chat_request(await read_json(request, options.max_body_bytes))
        check_model(req.model)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def deliver(event: object) -> None:  # on the worker thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = Job(req, deliver)
        try:
            worker.submit(job)
        except QueueFullError as exc:
            raise ApiError(429, f"{exc}; retry later", type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"}) from None
        except ShuttingDownError as exc:
            raise ApiError(503, str(exc), type="server_error", code="shutting_down") from None
        watch = asyncio.ensure_future(_watch_disconnect(request, job))
        try:
            first = await events.get()
            if not isinstance(first, JobStarted):
                raise _not_started(first)
            completion_id = new_completion_id()
            if req.stream:
                watch.cancel()  # StreamingResponse listens for the disconnect itself
                return StreamingResponse(
                    _stream(req, job, events, completion_id, options.model_id),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            while True:
                event = await events.get()
                if isinstance(event, JobFinished):
                    return JSONResponse(completion_object(event.result, completion_id,
                                                          options.model_id))
                if isinstance(event, JobFailed):
                    raise ApiError(500, event.message, type="server_error",
                                   code="generation_failed")
        except BaseException:
            job.cancel.set()  # a refused, failed or abandoned request frees the worker
            raise
        finally:
            watch.cancel()

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = (f"no route {request.method} {request.url.path}" if exc.status_code == 404
                   else str(exc.detail))
        headers = dict(exc.headers or {})
        if exc.status_code == 405 and headers.get("Allow"):
            message = (f"method {request.method} is not allowed on {request.url.path}; use "
                       f"{' or '.join(m for m in headers['Allow'].split(', ') if m != 'HEAD')}")
        return error_response(ApiError(exc.status_code, message, type=kind, headers=headers))

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return error_response(ApiError(500, "internal server error; see the server log",
                                       type="server_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await asyncio.get_running_loop().run_in_executor(None, on_shutdown)

    app = ServeApp(
        routes=[Route("/health", health, methods=["GET"]),
                Route("/v1/models", list_models, methods=["GET"]),
                Route("/v1/models/{model:path}", get_model, methods=["GET"]),
                Route("/v1/chat/completions", chat_completions, methods=["POST"])],
        exception_handlers={ApiError: api_error, HTTPException: http_error,
                            Exception: server_error},
        lifespan=lifespan,
        cors_origins=None if options.cors_origins is None else tuple(options.cors_origins),
        loopback_only=is_loopback(options.host),
    )
    if options.api_key:
        app.add_middleware(BearerAuth, api_key=options.api_key)
    app.add_middleware(OriginGuard, origins=tuple(options.cors_origins or ()))
    if is_loopback(options.host):
        app.add_middleware(HostGuard)
    return app


def _not_started(event: object) -> ApiError:
    """The error a request gets when the worker's first event for it is not
    :class:`~app.serve.worker.JobStarted`: a :class:`~app.serve.worker.JobRefused`'s own
    error (400 bad request, 499, 503...); for a :class:`~app.serve.worker.JobFailed` (the
    worker failed while preparing the reply: a server fault, logged there) a 500
    ``server_error`` with its message, for streamed requests too (nothing was sent yet)."""
    if isinstance(event, JobRefused):
        return event.error
    if isinstance(event, JobFailed):
        return ApiError(500, event.message, type="server_error", code="generation_failed")
    log.error("the worker began a request with %r instead of JobStarted", event)
    return ApiError(500, "internal server error: the worker did not start the reply; see the "
                    "server log", type="server_error")


async def _stream(req: ChatRequest, job: Job, events: asyncio.Queue, completion_id: str,
                  model: str) -> AsyncIterator[bytes]:
    """The reply as server-sent events: a role chunk, one chunk per text delta
    (``content`` or ``reasoning_content``) or tool call, the finish chunk, with
    ``include_usage`` a last chunk with no choices (the chunks before it then carry
    ``"usage": null``), then ``data: [DONE]``. The last chunk
    carries ``usage`` and ``dflash``. Leaving early (the client went away) cancels the job."""
    created = int(time.time())
    usage = {"usage": None} if req.include_usage else {}  # as OpenAI: null until the last
    try:
        yield sse(chunk_object(completion_id, model, created, {"role": "assistant",
                                                               "content": ""}, **usage))
        while True:
            event = await events.get()
            if isinstance(event, JobTextDelta):
                key = "content" if event.kind == "content" else "reasoning_content"
                yield sse(chunk_object(completion_id, model, created, {key: event.text},
                                       **usage))
            elif isinstance(event, JobToolCall):
                call = tool_call_object(completion_id, event.index, event.name,
                                        event.arguments, with_index=True)
                yield sse(chunk_object(completion_id, model, created, {"tool_calls": [call]},
                                       **usage))
            elif isinstance(event, JobFinished):
                result = event.result
                figures = {"usage": usage_object(result), "dflash": dflash_object(result)}
                reason = openai_finish_reason(result.finish_reason)
                if req.include_usage:
                    yield sse(chunk_object(completion_id, model, created, {}, reason, **usage))
                    yield sse(chunk_object(completion_id, model, created, None, **figures))
                else:
                    yield sse(chunk_object(completion_id, model, created, {}, reason,
                                           **figures))
                yield sse("[DONE]")
                return
            elif isinstance(event, JobFailed):
                error = ApiError(500, event.message, type="server_error",
                                 code="generation_failed")
                yield sse(error.body())
                yield sse("[DONE]")
                return
    finally:
        job.cancel.set()  # no-op once finished; stops the engine when the client left
