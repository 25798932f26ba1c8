"""The server's answers to requests that cannot run, over real loopback HTTP on a tiny random
pair: text that is not valid UTF-8 (a JSON-escaped lone surrogate) is a 400 naming its field,
and a worker that fails while preparing a reply (its first event a ``JobFailed``) gives an
OpenAI-shaped 500, streamed or not; no request ends in the handler's AssertionError, and the
server answers the next request."""

from __future__ import annotations

import logging

import httpx
import pytest
from serve_helpers import RunningServer

from app.chat.session import PairSpec

URL = "/v1/chat/completions"
OK = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
      "mode": "plain"}

# the raw bodies keep the JSON escape as a client sends it ("\ud800" in the JSON text)
SURROGATE_BODIES = [
    ('{"messages": [{"role": "user", "content": "\\ud800 hi"}]}', "messages[0].content"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": '
     '[{"id": "c", "function": {"name": "f", "arguments": "{\\"x\\": \\"\\\\udc00\\"}"}}]}], '
     '"max_tokens": 3}', "messages[1].tool_calls[0].function.arguments.x"),
    ('{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\udfff"]}', "stop[0]"),
]


@pytest.fixture(scope="module")
def server(tiny_paths):
    """The tiny pair served on a free loopback port."""
    srv = RunningServer(PairSpec(*tiny_paths), model_id="tiny")
    yield srv
    srv.close()


def _no_unhandled_error(caplog) -> None:
    unhandled = [r for r in caplog.records if r.name == "app.serve.api"
                 and r.getMessage() == "unhandled error"]
    assert not unhandled, unhandled[0].exc_info


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("body, param", SURROGATE_BODIES,
                         ids=[p for _, p in SURROGATE_BODIES])
def test_text_that_is_not_utf8_is_a_400_naming_its_field(server, caplog, body, param, stream):
    """``{"messages": [{"role": "user", "content": "\\ud800 hi"}]}`` was answered with 500
    "internal server error" (the tokenizer's TypeError, then the handler's AssertionError)."""
    if stream:
        body = body[:-1] + ', "stream": true}'
    r = httpx.post(server.url + URL, content=body.encode(), timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"].startswith(f"{param} is not valid UTF-8 text: it holds a lone "
                                       "surrogate (U+")
    _no_unhandled_error(caplog)
    ok = httpx.post(server.url + URL, json=OK, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_worker_failing_before_the_reply_starts_is_an_openai_500(server, caplog,
                                                                    monkeypatch, stream):
    """When preparing the reply fails unexpectedly, the worker's first event is
    ``JobFailed``: the handler asserted ``JobStarted`` and answered "internal server error"
    through its AssertionError. It is the worker's message as an OpenAI error now, before
    any stream began."""
    def broken(session, req):
        raise RuntimeError("the tokenizer broke")

    records = len(server.worker.records)
    with monkeypatch.context() as patch:
        patch.setattr(server.worker, "_prepare", broken)
        with caplog.at_level(logging.ERROR):
            r = httpx.post(server.url + URL, json={**OK, "stream": stream}, timeout=60)
    assert r.status_code == 500, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"error": {
        "message": "internal error while generating; see the server log",
        "type": "server_error", "param": None, "code": "generation_failed"}}
    _no_unhandled_error(caplog)
    assert any(rec.name == "app.serve.worker" and rec.exc_info is not None
               and "the tokenizer broke" in str(rec.exc_info[1]) for rec in caplog.records)
    server.wait_idle(10)
    assert server.worker.records[-1].outcome == "failed"
    assert len(server.worker.records) == records + 1
    ok = httpx.post(server.url + URL, json=OK, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
