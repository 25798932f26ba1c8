"""CORS for browser clients, opt-in (``serve --cors [ORIGINS]``): off by default, requests from
web pages refused and, for programs, OPTIONS and every response as before; on, every answer
(errors and the 500 of an unexpected fault included) carries ``Access-Control-Allow-Origin``
(``*`` or the listed origin the request came from) and ``Access-Control-Expose-Headers``,
and preflights to ``/v1/*`` get 204 with the allowed methods and headers, before the API key
is asked for. The application is driven in process (Starlette's test client) on a job queue
that answers at once, or refuses: no model is loaded."""

from __future__ import annotations

import argparse

import pytest
from serve_helpers import sse_events
from starlette.testclient import TestClient

from app.chat.session import ModelInfo
from app.engine.events import Summary
from app.serve.api import ServeOptions, create_app
from app.serve.protocol import CompletionResult
from app.serve.worker import (
    JobFinished,
    JobQueue,
    JobStarted,
    JobTextDelta,
    QueueFullError,
    ShuttingDownError,
)

URL = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}]}
PAGE = "http://localhost:5173"
BASE = "http://127.0.0.1:18431"
"""Where the test client sends its requests (``Host: 127.0.0.1:18431``), as programs reach a
server listening on loopback."""
PREFLIGHT = {"Origin": PAGE, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
CORS_KEYS = {"access-control-allow-origin", "access-control-allow-methods",
             "access-control-allow-headers", "access-control-max-age",
             "access-control-expose-headers"}
SAFELISTED = {"cache-control", "content-language", "content-length", "content-type", "expires",
              "last-modified", "pragma"}
"""Response headers a page reads without ``Access-Control-Expose-Headers`` (Fetch's
CORS-safelisted response-header names)."""
NOT_FOR_PAGES = {"vary", "x-accel-buffering"}
"""Headers the server sends for caches and proxies, not for the page's script."""


class InstantJobs(JobQueue):
    """A job queue that answers every job at once on the submitting thread: ``Hello``."""

    def __init__(self) -> None:
        super().__init__()
        self.info = ModelInfo(target_name="m", target_path="/m")  # loaded, to the API

    def submit(self, job) -> None:
        """Deliver the whole reply's events to ``job`` now."""
        result = CompletionResult(content="Hello", reasoning="", tool_calls=[],
                                  finish_reason="stop", block_size=None, completion_tokens=2,
                                  summary=Summary(mode="plain", prompt_tokens=3,
                                                  generated_tokens=2, stop_cause="end_token"))
        for event in (JobStarted(3, "plain", None, 16), JobTextDelta("content", "Hello"),
                      JobFinished(result)):
            job.deliver(event)


class RefusingJobs(InstantJobs):
    """A job queue whose :meth:`submit` raises ``error``: the queue's refusals
    (:class:`QueueFullError`, :class:`ShuttingDownError`) or a fault the API does not expect
    (a server bug, answered 500 by Starlette's last-resort handler)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def submit(self, job) -> None:
        """Raise ``error``."""
        raise self.error


def client(jobs: JobQueue | None = None, **options) -> TestClient:
    """The API for ``ServeOptions("m", **options)`` on ``jobs`` (default
    :class:`InstantJobs`); a handler's unexpected exception is answered (500), not raised
    into the test."""
    return TestClient(create_app(jobs or InstantJobs(), ServeOptions("m", **options)),
                      base_url=BASE, raise_server_exceptions=False)


def exposed(response) -> set[str]:
    """The header names (lower case) ``response``'s ``Access-Control-Expose-Headers`` lets a
    page read."""
    value = response.headers.get("access-control-expose-headers", "")
    return {name.strip().lower() for name in value.split(",") if name.strip()}


# ------------------------------------------------------------------------------ off
@pytest.mark.parametrize("key", [None, "sesame"])
def test_off_by_default_options_and_responses_are_as_before(key):
    """Without --cors, for programs (no ``Origin``) nothing changes: OPTIONS is a method the
    routes do not allow (405 with ``Allow``; 401 first on /v1 when a key is set), and no
    response names an origin."""
    c = client(api_key=key)
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    r = c.options(URL)
    if key:
        assert r.status_code == 401
    else:
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["message"] == \
            f"method OPTIONS is not allowed on {URL}; use POST"
    r = c.options(URL, headers=auth)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert c.options("/health").status_code == 405
    for r in (c.get("/v1/models", headers=auth), c.post(URL, json=BODY, headers=auth),
              c.get("/health")):
        assert r.status_code == 200
        assert not CORS_KEYS & set(r.headers) and "vary" not in r.headers


@pytest.mark.parametrize("key", [None, "sesame"])
def test_without_cors_web_pages_are_refused_before_the_key(key):
    """A page on another origin could otherwise make the model run with a ``text/plain``
    POST, which browsers send without a preflight: every request with an ``Origin`` the
    server does not allow gets 403 naming it and the option that allows it (before the key
    is asked for). A page on the server's own host and port is served."""
    c = client(api_key=key)
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    for r in (c.post(URL, content=b'{"messages": [{"role": "user", "content": "hi"}]}',
                     headers={"Origin": PAGE, "Content-Type": "text/plain", **auth}),
              c.post(URL, json=BODY, headers={"Origin": "null"}),
              c.get("/v1/models", headers={"Origin": PAGE, **auth}),
              c.get("/health", headers={"Origin": PAGE}),
              c.options(URL, headers=PREFLIGHT)):
        assert r.status_code == 403, r.request
        error = r.json()["error"]
        origin = r.request.headers["origin"]
        assert error["code"] == "origin_not_allowed"
        # "null" (a file, a sandboxed frame) cannot be listed: only '*' allows it
        assert (f"--cors {origin}" if origin != "null" else "--cors '*'") in error["message"]
        assert not CORS_KEYS & set(r.headers)
    own = {"Origin": BASE, **auth}  # the test client's Host
    assert c.post(URL, json=BODY, headers=own).status_code == 200
    assert c.post(URL, json=BODY, headers={**own, "Origin": "http://127.0.0.1:81"}
                  ).status_code == 403


# ------------------------------------------------------------------------------ on
@pytest.mark.parametrize("key", [None, "sesame"])
def test_any_origin_preflight_gets_204_before_the_key_and_responses_allow_it(key):
    c = client(api_key=key, cors_origins=("*",))
    for path in (URL, "/v1/models", "/v1/models/m"):
        r = c.options(path, headers=PREFLIGHT)  # browsers send no Authorization here
        assert r.status_code == 204 and r.content == b""
        assert r.headers["access-control-allow-origin"] == "*"
        assert r.headers["access-control-allow-methods"] == "GET, POST, OPTIONS"
        assert r.headers["access-control-allow-headers"] == "Authorization, Content-Type"
        assert int(r.headers["access-control-max-age"]) > 0
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    r = c.post(URL, json=BODY, headers={"Origin": PAGE, **auth})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello"
    assert r.headers["access-control-allow-origin"] == "*"
    with c.stream("POST", URL, json={**BODY, "stream": True},
                  headers={"Origin": PAGE, **auth}) as r:
        assert r.headers["access-control-allow-origin"] == "*"
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    # errors too, so that a page can read why (401, 404, 400), and /health
    if key:
        r = c.post(URL, json=BODY, headers={"Origin": PAGE})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "*"
    r = c.post(URL, json={**BODY, "model": "other"}, headers={"Origin": PAGE, **auth})
    assert r.status_code == 404 and r.headers["access-control-allow-origin"] == "*"
    r = c.post(URL, content=b"{", headers={"Origin": PAGE, **auth})
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "*"
    assert c.get("/health").headers["access-control-allow-origin"] == "*"
    # OPTIONS outside /v1 is not a preflight the API answers: as before
    assert c.options("/health", headers=PREFLIGHT).status_code == 405


def test_listed_origins_are_echoed_and_others_get_no_grant():
    c = client(cors_origins=(PAGE, "https://chat.example"))
    r = c.options(URL, headers=PREFLIGHT)
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == PAGE
    assert r.headers["vary"] == "Origin, Access-Control-Request-Headers"
    r = c.get("/v1/models", headers={"Origin": "https://chat.example"})
    assert r.headers["access-control-allow-origin"] == "https://chat.example"
    assert r.headers["vary"] == "Origin"
    # another origin: its preflight is refused with a message, its requests carry no grant
    r = c.options(URL, headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    error = r.json()["error"]
    assert error["code"] == "origin_not_allowed" and "https://evil.example" in error["message"]
    assert "--cors" in error["message"]
    r = c.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert r.headers["vary"] == "Origin"
    # no Origin (not a browser): served, nothing granted
    r = c.get("/v1/models")
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("origins, granted", [(("*",), "*"), ((PAGE,), PAGE)])
def test_an_unexpected_error_is_a_500_the_allowed_page_can_read(caplog, origins, granted):
    """A handler's unexpected exception is answered 500 by Starlette's outermost error
    handler: with --cors that answer carries the grant like any other, else the page sees
    only a CORS failure; without an ``Origin`` nothing changes (no grant unless ``*``, as
    for every response)."""
    c = client(RefusingJobs(RuntimeError("a bug")), cors_origins=origins)
    r = c.post(URL, json=BODY, headers={"Origin": PAGE})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert r.headers["access-control-allow-origin"] == granted
    assert "retry-after" in exposed(r)
    if granted != "*":
        assert r.headers["vary"] == "Origin"
    r = c.post(URL, json=BODY)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert ("access-control-allow-origin" in r.headers) == (granted == "*")
    assert "unhandled error" in caplog.text


def test_an_unexpected_error_without_cors_is_as_before():
    r = client(RefusingJobs(RuntimeError("a bug"))).post(URL, json=BODY)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert not CORS_KEYS & set(r.headers) and "vary" not in r.headers


@pytest.mark.parametrize("origins", [("*",), (PAGE,)])
def test_every_answer_to_an_allowed_page_is_granted_and_exposes_what_it_sends(origins):
    """429 (with ``Retry-After``), 503, 401, 405, 404, 400, a reply and a stream: each
    carries ``Access-Control-Allow-Origin``, and ``Access-Control-Expose-Headers`` names
    every header it sends that is not CORS-safelisted, so a page's script can read
    ``Retry-After`` (fetch hides the others)."""
    page = {"Origin": PAGE}
    auth = {**page, "Authorization": "Bearer sesame"}
    full = client(RefusingJobs(QueueFullError("the queue is full")), cors_origins=origins)
    stopping = client(RefusingJobs(ShuttingDownError("the server is shutting down")),
                      cors_origins=origins)
    c = client(api_key="sesame", cors_origins=origins)
    answers = {429: full.post(URL, json=BODY, headers=page),
               503: stopping.post(URL, json=BODY, headers=page),
               401: c.post(URL, json=BODY, headers=page),
               405: c.get(URL, headers=auth),
               404: c.post(URL, json={**BODY, "model": "other"}, headers=auth),
               400: c.post(URL, content=b"{", headers=auth),
               200: c.post(URL, json=BODY, headers=auth)}
    assert answers[429].headers["retry-after"] == "1"
    assert answers[401].headers["www-authenticate"] == "Bearer"
    assert answers[405].headers["allow"] == "POST"
    with c.stream("POST", URL, json={**BODY, "stream": True}, headers=auth) as r:
        assert sse_events(list(r.iter_lines()))[-1] == "[DONE]"
        answers[0] = r
    for status, r in answers.items():
        assert r.status_code == (status or 200), status
        assert r.headers["access-control-allow-origin"] == origins[0], status
        sent = {name for name in r.headers if not name.startswith("access-control-")}
        assert sent - SAFELISTED - NOT_FOR_PAGES <= exposed(r), status
    assert {"retry-after", "www-authenticate", "allow"} <= exposed(answers[0])


def test_pages_not_allowed_and_preflights_are_not_told_what_to_expose():
    """Expose-Headers goes with a grant on an actual answer: an origin not listed gets none
    (its 403 included), and a preflight's 204 has no use for it (fetch reads it from the
    answer itself)."""
    c = client(cors_origins=(PAGE,))
    r = c.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "access-control-expose-headers" not in r.headers
    r = c.options(URL, headers=PREFLIGHT)
    assert r.status_code == 204 and "access-control-expose-headers" not in r.headers
    r = c.get("/v1/models")
    assert r.status_code == 200 and "access-control-expose-headers" not in r.headers


# ------------------------------------------------------------------------------ preflight
SDK_HEADERS = ("authorization, content-type, x-stainless-os, x-stainless-lang, "
               "x-stainless-retry-count, openai-organization, openai-project")
"""What the official OpenAI JS SDK asks for in a preflight's ``Access-Control-Request-Headers``."""


def allowed_headers(response) -> set[str]:
    """The header names (lower case) a preflight answer's ``Access-Control-Allow-Headers``
    lets the page send."""
    value = response.headers.get("access-control-allow-headers", "")
    return {name.strip().lower() for name in value.split(",") if name.strip()}


@pytest.mark.parametrize("origins, vary", [(("*",), "Access-Control-Request-Headers"),
                                           ((PAGE,), "Origin, Access-Control-Request-Headers")])
def test_a_preflight_allows_the_headers_the_page_asks_for(origins, vary):
    """The OpenAI JS SDK sends ``X-Stainless-*`` (and ``OpenAI-Organization``...) headers: a
    fixed ``Authorization, Content-Type`` failed its preflight. An allowed origin gets the
    headers it asked for, plus those two; the answer varies with the request's headers."""
    c = client(cors_origins=origins)
    r = c.options(URL, headers={**PREFLIGHT, "Access-Control-Request-Headers": SDK_HEADERS})
    assert r.status_code == 204
    assert allowed_headers(r) == {h.strip() for h in SDK_HEADERS.split(",")}
    assert r.headers["vary"] == vary
    r = c.options(URL, headers={**PREFLIGHT, "Access-Control-Request-Headers": "X-Stainless-Arch"})
    assert allowed_headers(r) == {"authorization", "content-type", "x-stainless-arch"}
    # nothing asked: the two an OpenAI client sends; a name that is not a header name: left out
    r = c.options(URL, headers={"Origin": PAGE, "Access-Control-Request-Method": "POST"})
    assert allowed_headers(r) == {"authorization", "content-type"}
    r = c.options(URL, headers={**PREFLIGHT,
                                "Access-Control-Request-Headers": "x-ok, bad name, x\u00e9".encode("latin-1")})
    assert allowed_headers(r) == {"authorization", "content-type", "x-ok"}
    assert r.headers["vary"] == vary


def test_a_refused_origin_is_told_the_whole_list_the_same_way_for_both_requests():
    """``--cors https://evil.example`` would replace the list: the 403 (of a preflight and of
    a request alike) shows the list with the origin added."""
    c = client(cors_origins=(PAGE, "https://chat.example"))
    evil = {"Origin": "https://evil.example"}
    pre = c.options(URL, headers={**PREFLIGHT, **evil}).json()["error"]
    get = c.get("/v1/models", headers=evil).json()["error"]
    assert pre == get and pre["code"] == "origin_not_allowed"
    assert f"--cors {PAGE},https://chat.example,https://evil.example" in pre["message"]
    off = client().get("/v1/models", headers=evil).json()["error"]
    assert "--cors https://evil.example" in off["message"]


def test_the_servers_own_loopback_origin_gets_its_preflight_too():
    """A page on the server's own (loopback) host and port is served; with CORS on, its
    preflight is answered 204 too, as its requests are (it was 403)."""
    c = client(cors_origins=(PAGE,))
    r = c.options(URL, headers={**PREFLIGHT, "Origin": BASE})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == BASE
    r = c.post(URL, json=BODY, headers={"Origin": BASE})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == BASE


# ------------------------------------------------------------------------------ Host
REBIND = "attacker.example:18431"


@pytest.mark.parametrize("cors", [None, ("*",), (PAGE,)])
def test_a_loopback_server_refuses_a_host_that_is_not_loopback(cors):
    """DNS rebinding: a page at http://attacker.example:18431 whose name now resolves to
    127.0.0.1 sends ``Host: attacker.example:18431`` (and, being same-origin there, often no
    ``Origin``): refused 403 ``host_not_allowed``, naming the host and the address to use."""
    c = client(cors_origins=cors)
    for headers in ({"Host": REBIND, "Origin": f"http://{REBIND}"}, {"Host": REBIND}):
        for r in (c.post(URL, json=BODY, headers=headers), c.get("/v1/models", headers=headers),
                  c.get("/health", headers=headers)):
            assert r.status_code == 403, (r.request.url, r.text)
            error = r.json()["error"]
            assert error["code"] == "host_not_allowed" and error["type"] == "permission_error"
            assert REBIND in error["message"] and "http://127.0.0.1:18431" in error["message"]
            assert "localhost" in error["message"]


@pytest.mark.parametrize("host", ["127.0.0.1:18431", "localhost:18431", "LocalHost:18431",
                                  "localhost", "[::1]:18431", "127.0.0.2:18431",
                                  "localhost.:18431"])
def test_a_loopback_server_serves_loopback_hosts(host):
    c = client()
    assert c.post(URL, json=BODY, headers={"Host": host}).status_code == 200
    # and a page on that very host and port (its own origin)
    r = c.post(URL, json=BODY, headers={"Host": host, "Origin": f"http://{host}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("cors", [("*",), (PAGE,)])
def test_a_loopback_server_refuses_a_rebinding_pages_preflight(cors):
    """With --cors on, a preflight from a page under a rebound name (``Host:
    attacker.example:18431``) was answered 204 with a grant, while its request then got 403:
    it gets the same 403 ``host_not_allowed`` now, with no ``Access-Control-Allow-*``
    header. Preflights to loopback names are answered as before."""
    c = client(cors_origins=cors)
    for origin in (f"http://{REBIND}", PAGE, None):
        headers = {**PREFLIGHT, "Host": REBIND}
        if origin is None:
            del headers["Origin"]
        else:
            headers["Origin"] = origin
        for path in (URL, "/v1/models"):
            r = c.options(path, headers=headers)
            assert r.status_code == 403, (origin, path, r.text)
            error = r.json()["error"]
            assert error["code"] == "host_not_allowed" and REBIND in error["message"]
            assert not {h for h in r.headers if h.startswith("access-control-allow-")}, \
                r.headers
    for host in ("127.0.0.1:18431", "localhost:18431", "[::1]:18431"):
        r = c.options(URL, headers={**PREFLIGHT, "Host": host})
        assert r.status_code == 204, (host, r.text)
        assert r.headers["access-control-allow-origin"] == cors[0]


def test_a_rebinding_preflight_is_refused_whatever_the_middleware_order():
    """:class:`CorsHeaders` on a loopback server refuses a preflight for a host that is not
    loopback itself, so the answer does not hang on where :class:`HostGuard` stands (inside
    it, outside it, or not there); on a server beyond loopback it answers any host, as
    before."""
    from starlette.responses import PlainTextResponse

    from app.serve.api import CorsHeaders, HostGuard

    inner = PlainTextResponse("served")
    for stack in (CorsHeaders(HostGuard(inner), ("*",), loopback_only=True),
                  HostGuard(CorsHeaders(inner, ("*",), loopback_only=True)),
                  CorsHeaders(inner, ("*",), loopback_only=True)):
        c = TestClient(stack, base_url=BASE)
        r = c.options(URL, headers={**PREFLIGHT, "Host": REBIND})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
        assert "access-control-allow-origin" not in r.headers
        r = c.options(URL, headers=PREFLIGHT)
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "*"
    c = TestClient(CorsHeaders(inner, ("*",)), base_url=BASE)
    r = c.options(URL, headers={**PREFLIGHT, "Host": REBIND})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "*"


def test_a_server_on_another_host_answers_preflights_for_any_host():
    c = client(host="0.0.0.0", api_key="k", cors_origins=("*",))
    r = c.options(URL, headers={**PREFLIGHT, "Host": "box.lan:18431"})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "*"


def test_a_server_on_another_host_takes_any_host_but_only_listed_pages():
    """Listening beyond loopback (which needs an API key) the Host check is off; the
    same-origin exemption counts only for loopback hosts, so a page there must be listed."""
    c = client(host="0.0.0.0", api_key="k")
    auth = {"Authorization": "Bearer k"}
    assert c.get("/v1/models", headers={"Host": "box.lan:18431", **auth}).status_code == 200
    r = c.get("/v1/models", headers={"Host": "box.lan:18431", "Origin": "http://box.lan:18431",
                                     **auth})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"


def test_make_server_tells_the_app_where_it_listens():
    """``make_server``'s host decides the check, whatever the options say."""
    from app.serve.server import make_server
    for host, status in (("127.0.0.1", 403), ("0.0.0.0", 200)):
        server = make_server(InstantJobs(), ServeOptions("m", api_key="k"), host, 18431)
        c = TestClient(server.config.app, base_url=BASE)
        r = c.get("/v1/models", headers={"Host": REBIND, "Authorization": "Bearer k"})
        assert r.status_code == status


# ------------------------------------------------------------------------------ messages
def test_a_lone_surrogate_in_a_part_type_is_a_400():
    """The 400 echoed the part's type, a lone surrogate: encoding the answer failed (500)."""
    c = client()
    r = c.post(URL, content=b'{"messages":[{"role":"user","content":[{"type":"\\ud800"}]}]}',
               headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].content[0]"


def test_an_error_answer_encodes_any_message():
    from app.serve.api import error_response
    from app.serve.protocol import ApiError
    response = error_response(ApiError(400, "bad \ud800 and \u00e9"))
    import json
    assert json.loads(response.body)["error"]["message"] == "bad \ud800 and \u00e9"


# ------------------------------------------------------------------------------ the CLI
def parse(*argv: str) -> argparse.Namespace:
    from app.cli import build_parser

    return build_parser().parse_args(["serve", *argv])


def test_the_cors_option_reads_any_or_a_list_of_origins():
    assert parse().cors is None
    assert parse("--cors").cors == ("*",)
    assert parse("--cors", "--port", "0").cors == ("*",)
    assert parse("--cors", "*").cors == ("*",)
    assert parse("--cors", f"{PAGE}, HTTPS://Chat.Example:8443").cors == (
        PAGE, "https://chat.example:8443")
    assert parse("--cors", "http://[::1]:3000").cors == ("http://[::1]:3000",)


@pytest.mark.parametrize("value, message", [
    ("http://localhost:3000/", "no path"),
    ("http://localhost:3000/app", "no path"),
    ("localhost:3000", "scheme://host[:port]"),
    ("", "no origin"),
    (" , ", "no origin"),
    ("*,http://a.example", "alone"),
    ("http://a.example:port", "scheme://host[:port]"),
])
def test_a_bad_origin_is_refused_naming_it(capsys, value, message):
    with pytest.raises(SystemExit) as exc:
        parse("--cors", value)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--cors" in err and message in err


def test_help_describes_cors(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--cors [ORIGINS]" in text
    assert "Access-Control-Allow-Origin" in text and "off by default" in text


def test_serve_hands_the_origins_to_the_api_and_says_so(capsys, monkeypatch, tmp_path):
    """``serve --cors URL`` reaches :class:`ServeOptions` and the start line (the worker and
    uvicorn replaced: nothing is loaded or served)."""
    import app.serve.server as server_mod
    import app.serve.worker as worker_mod
    from app.cli import main

    seen = {}

    class Worker:
        def __init__(self, config):
            pass

        def start(self):
            return ModelInfo(target_name="m", target_path="/m")

        def stop(self):
            pass

    class Server:
        started = True

        def __init__(self, worker, options, host, port, grace, started, log_level):
            seen["options"], self.on_started = options, started

        def run(self, sockets):
            self.on_started(("127.0.0.1", 8080))

    import app.engine.costs as costs_mod

    monkeypatch.setattr(costs_mod, "set_store", lambda folder: None)
    monkeypatch.setattr(worker_mod, "ServeWorker", Worker)
    monkeypatch.setattr(server_mod, "make_server", Server)
    monkeypatch.delenv("DFLASH_API_KEY", raising=False)
    data = ["--data-dir", str(tmp_path)]
    assert main([*data, "serve", "--port", "0", "--cors", PAGE]) == 0
    assert seen["options"].cors_origins == (PAGE,)
    out = capsys.readouterr().out
    assert f"; CORS allows {PAGE};" in out
    assert main([*data, "serve", "--port", "0"]) == 0
    assert seen["options"].cors_origins is None
    assert "CORS" not in capsys.readouterr().out
    # any origin and no key: the server says what that opens
    assert main([*data, "serve", "--port", "0", "--cors"]) == 0
    captured = capsys.readouterr()
    assert seen["options"].cors_origins == ("*",) and "CORS allows *" in captured.out
    assert "any web page" in captured.err

