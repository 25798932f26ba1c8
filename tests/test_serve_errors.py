"""The server's answers to requests that cannot run, over real loopback HTTP on a tiny random
pair: text that is not valid UTF-8 (a JSON-escaped lone surrogate) is a 400 naming its field,
and a worker that fails while preparing a reply (its first event a ``JobFailed``) gives an
OpenAI-shaped 500, streamed or not; no request ends in the handler's AssertionError, and the
server answers the next request."""

from __future__ import annotations

import logging

import httpx
import pytest
from serve_helpers import RunningServer, sse_events

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


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_the_engine_fails_midway_is_a_500_not_a_stop(server, monkeypatch, stream):
    """The engine turns an exception into ``Done(stop_cause="error")``; the server answered it
    with 200 and ``finish_reason: "stop"`` (streamed: a normal finish chunk), so a client took
    a broken reply for a whole one. Now: 500 with the engine's message, streamed an ``error``
    event after what was sent, then ``[DONE]``."""
    import app.engine.generate as gen

    real = gen._make_choose

    def failing(config):
        choose = real(config)
        calls = []

        def after_three(logits, history):
            calls.append(1)
            if len(calls) > 3:
                raise RuntimeError("the sampler broke")
            return choose(logits, history)
        return after_three

    body = {**OK, "max_tokens": 20, "temperature": 1.0, "seed": 1, "stream": stream}
    with monkeypatch.context() as patch:
        patch.setattr(gen, "_make_choose", failing)
        r = httpx.post(server.url + URL, json=body, timeout=60)
    if stream:
        assert r.status_code == 200
        events = sse_events(r.text.split("\n"))
        assert events[-1] == "[DONE]"
        error = events[-2]["error"]
        assert not any(e["choices"][0].get("finish_reason") for e in events[:-2]
                       if isinstance(e, dict) and e.get("choices"))
    else:
        assert r.status_code == 500, r.text
        error = r.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "generation_failed"
    assert "RuntimeError: the sampler broke" in error["message"]
    server.wait_idle(10)
    assert server.worker.records[-1].outcome == "failed"
    ok = httpx.post(server.url + URL, json=OK, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


@pytest.mark.parametrize("stream", [False, True])
def test_top_k_past_the_vocabulary_is_a_400_before_any_chunk(server, stream):
    """``top_k`` at the vocabulary's size or above (within the documented 0-100000) failed in
    the engine: a 500 ``generation_failed``, which the OpenAI client retries twice; streamed,
    an error event after the role chunk."""
    vocab = server.worker.session.target.vocab_size
    error = _error(httpx.post(server.url + URL, json={
        **OK, "temperature": 1.0, "top_k": vocab, "stream": stream}, timeout=60), 400)
    assert error["param"] == "top_k" and error["type"] == "invalid_request_error"
    assert f"below the vocabulary size {vocab:,}" in error["message"]
    r = httpx.post(server.url + URL, json={**OK, "temperature": 1.0, "top_k": vocab - 1},
                   timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, param, words", [
    ({"tool_choice": "auto"}, "tool_choice", "tool_choice needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
     "tool_choice needs tools"),
    ({"stream_options": {"include_usage": True}}, "stream_options",
     "stream_options is only allowed with \"stream\": true"),
], ids=["choice-auto-no-tools", "choice-named-no-tools", "stream-options-no-stream"])
def test_fields_that_need_another_field_are_refused(server, body, param, words):
    """OpenAI answers 400 for ``tool_choice`` without ``tools`` and ``stream_options`` without
    ``stream``; they were accepted and ignored."""
    error = _error(httpx.post(server.url + URL, json={**OK, **body}, timeout=60), 400)
    assert error["param"] == param and words in error["message"]


def test_json_nested_too_deep_is_a_400(server, caplog):
    """A body nested 100,000 levels deep raised ``RecursionError`` in the JSON decoder: a 500
    and a traceback in the log."""
    body = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with caplog.at_level(logging.ERROR):
        error = _error(httpx.post(server.url + URL, content=body.encode(), timeout=60,
                                  headers={"Content-Type": "application/json"}), 400)
    assert "nested too deeply" in error["message"]
    _no_unhandled_error(caplog)


def test_a_wrong_method_is_a_405_that_names_the_allowed_one(server):
    r = httpx.get(server.url + URL, timeout=60)
    error = _error(r, 405)
    assert r.headers["allow"] == "POST"
    assert error["message"] == "method GET is not allowed on /v1/chat/completions; use POST"
    r = httpx.post(server.url + "/v1/models", timeout=60)
    assert _error(r, 405)["message"].endswith("use GET")
    assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}  # in no fixed order
