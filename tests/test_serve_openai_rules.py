"""OpenAI's rules the server keeps on the bundled demo pair, over real loopback HTTP: a reply
names only the tools the request offered (the demo model writes a ``current_time`` call to a
time question whatever it is shown), the messages are sent whole (no turn left out while
they fit the context), a stop string is told apart from a cancel in ``dflash.stop_cause``,
and system messages are kept (several leading ones joined, a later one refused)."""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import RunningServer, sse_events

from app.chat.session import PairSpec
from app.paths import bundled_pair

PAIR = bundled_pair()
pytestmark = pytest.mark.skipif(PAIR is None, reason="the bundled demo pair is not in this "
                                "checkout")

URL = "/v1/chat/completions"
TIME = [{"role": "user", "content": "What is the local time in Anchorage?"}]


@pytest.fixture(scope="module")
def server():
    """The demo target and its DFlash drafter on a free loopback port."""
    srv = RunningServer(PairSpec(str(PAIR[0]), str(PAIR[1])), model_id="demo")
    yield srv
    srv.close()


def _post(server, **body) -> dict:
    r = httpx.post(server.url + URL, json={"model": "demo", "max_tokens": 80, **body},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _tools(*names: str) -> list[dict]:
    from app.chat.tools import tool_schemas

    return [t for t in tool_schemas() if not names or t["function"]["name"] in names]


@pytest.mark.parametrize("offer", ["no tools", "tool_choice none", "another tool named"])
def test_a_call_to_a_tool_not_offered_is_text_not_a_tool_call(server, offer):
    """The demo model answers a time question with a ``current_time`` call. It was returned
    as a tool call with no ``tools`` in the request, with ``tool_choice: "none"`` and with
    ``tool_choice`` naming ``calculator``: a client got a call to a function it does not
    have (``content: null``). It is the model's text now, finish reason ``stop``."""
    extra = {"no tools": {},
             "tool_choice none": {"tools": _tools(), "tool_choice": "none"},
             "another tool named": {"tools": _tools(), "tool_choice": {
                 "type": "function", "function": {"name": "calculator"}}}}[offer]
    for stream in (False, True):
        if stream:
            with httpx.stream("POST", server.url + URL, timeout=120, json={
                    "model": "demo", "max_tokens": 80, "messages": TIME, "stream": True,
                    **extra}) as r:
                events = sse_events(r.read().decode().split("\n"))
            chunks = [e for e in events[:-1] if e["choices"]]
            assert not any("tool_calls" in c["choices"][0]["delta"] for c in chunks)
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            choice = _post(server, messages=TIME, **extra)["choices"][0]
            assert "tool_calls" not in choice["message"]
            content, finish = choice["message"]["content"], choice["finish_reason"]
        assert finish == "stop"
        assert "current_time" in content and "America/Anchorage" in content
    # offered, the same call is a tool call
    choice = _post(server, messages=TIME, tools=_tools("current_time"))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "current_time"


def test_messages_that_fit_the_context_are_sent_whole(server):
    """A 4,064-token conversation with ``max_tokens`` 8 fits the 4,096-token context: its
    first two turns were left out (``prompt_tokens`` 2,064) because the window's cap at the
    chat length the demo model was trained on (4,023) applied to the server too, and nothing
    said so. A server sends what the client sent, or refuses it."""
    from app.chat.templates import render_prompt

    messages = []
    for i in range(4):
        messages += [{"role": "user", "content": f"Note {i}: " + " a" * 980},
                     {"role": "assistant", "content": "OK."}]
    messages += [{"role": "user", "content": " b" * 30}, {"role": "assistant", "content": "OK."},
                 {"role": "user", "content": "What is the capital of France?"}]
    tokens = len(render_prompt(server.worker.session.target.tokenizer, messages).ids)
    assert 4023 < tokens <= 4096 - 8  # over the trained chat length, within the context
    body = _post(server, messages=messages, max_tokens=8, mode="plain")
    assert body["usage"]["prompt_tokens"] == tokens


def test_a_stop_string_is_its_own_stop_cause(server):
    """``dflash.stop_cause`` said ``cancelled`` when a stop string ended the reply, which is
    also what a reply cut by the server's shutdown says."""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    body = _post(server, messages=question, stop=["Paris"], max_tokens=60)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["dflash"]["stop_cause"] == "stop_string"
    assert "Paris" not in (body["choices"][0]["message"]["content"] or "")
    whole = _post(server, messages=question, max_tokens=60)
    assert "Paris" in whole["choices"][0]["message"]["content"]
    assert whole["dflash"]["stop_cause"] in ("end_token", "length")


def test_leading_system_messages_are_joined_and_a_later_one_is_refused(server):
    """``[system A, system B, user]`` rendered only A, and ``[user, system]`` dropped the
    system message (the chat template shows one system message, first): both were answered
    with 200 as if all was sent."""
    user = {"role": "user", "content": "Hello!"}
    two = _post(server, messages=[{"role": "system", "content": "Be brief."},
                                  {"role": "developer", "content": "Answer in English."}, user],
                max_tokens=4)
    one = _post(server, messages=[{"role": "system", "content": "Be brief.\n\nAnswer in "
                                   "English."}, user], max_tokens=4)
    alone = _post(server, messages=[{"role": "system", "content": "Be brief."}, user],
                  max_tokens=4)
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"] \
        > alone["usage"]["prompt_tokens"]
    r = httpx.post(server.url + URL, timeout=60, json={
        "model": "demo", "max_tokens": 4,
        "messages": [user, {"role": "system", "content": "Be brief."}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[1].role"
    assert "system messages must come before the conversation" in error["message"]
