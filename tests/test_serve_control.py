"""The server's control paths on a tiny random pair (its replies run to max_tokens, so they
can be cut): a client leaving cancels its generation within a cycle and frees the worker,
the queue's bound (429), Bearer auth (401), a public host refused without a key, and
SIGTERM ending a real ``python -m app serve`` process cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from serve_helpers import RunningServer, sse_events

from app.chat.session import PairSpec
from app.serve.server import ServeConfigError, check_host, is_loopback

openai = pytest.importorskip("openai")

URL = "/v1/chat/completions"
LONG = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3000, "mode": "plain"}
"""A reply of 3,000 tokens: about 15 s on a 2-core CPU, so every test below cuts it."""


@pytest.fixture(scope="module")
def server(tiny_paths):
    """The tiny pair served with an API key and a queue of 1."""
    srv = RunningServer(PairSpec(*tiny_paths), model_id="tiny", api_key="sesame", max_queue=1)
    yield srv
    srv.close()


AUTH = {"Authorization": "Bearer sesame"}


def _last_record(server):
    return server.worker.records[-1]


def test_a_client_that_leaves_a_stream_cancels_its_generation(server):
    n = len(server.worker.records)
    with httpx.stream("POST", server.url + URL, json={**LONG, "stream": True}, headers=AUTH,
                      timeout=60) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 5:
                break
        assert server.worker.busy
    left = time.monotonic()
    freed = server.wait_idle(10)
    assert freed < 2.0  # the cancel flag is read every token: far less than the 15 s reply
    assert len(server.worker.records) == n + 1
    record = _last_record(server)
    assert record.outcome == "finished" and record.cancelled
    assert record.finish_reason == "cancelled" and 3 <= record.generated_tokens < 3000
    # the worker takes the next request at once
    r = httpx.post(server.url + URL, json={**LONG, "max_tokens": 4}, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert time.monotonic() - left < 10


def test_a_client_that_gives_up_on_a_whole_reply_cancels_it(server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + URL, json={**LONG, "mode": "dflash"}, headers=AUTH,
                   timeout=httpx.Timeout(60, read=0.8))
    assert server.wait_idle(10) < 3.0
    record = _last_record(server)
    assert record.cancelled and record.finish_reason == "cancelled"
    assert record.generated_tokens < 3000


def test_a_full_queue_answers_429_and_the_worker_goes_on(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
    answers: list[httpx.Response] = []
    with httpx.Client(timeout=60) as waiting_client:
        with httpx.stream("POST", server.url + URL, json={**LONG, "stream": True},
                          headers=AUTH, timeout=60) as running:
            lines = running.iter_lines()  # kept: closing the iterator closes the connection
            next(lines)  # the first reply runs
            # one request may wait (max_queue=1): send it from a thread
            waiting = waiting_client.build_request("POST", server.url + URL, headers=AUTH,
                                                   json={**LONG, "max_tokens": 3})
            t = threading.Thread(target=lambda: answers.append(waiting_client.send(waiting)))
            t.start()
            deadline = time.monotonic() + 10
            while server.worker.queued < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.worker.queued == 1
            with pytest.raises(openai.RateLimitError) as exc:
                client.chat.completions.create(model="tiny", max_tokens=3, messages=[
                    {"role": "user", "content": "hi"}])
            assert exc.value.status_code == 429 and exc.value.code == "queue_full"
            assert exc.value.response.headers["retry-after"] == "1"
            assert "busy: 1 request is already waiting; retry later" in exc.value.message
            assert server.worker.busy and not answers  # both still there
        # the running stream was left: the waiting request is answered next
        t.join(20)
    assert answers and answers[0].status_code == 200
    assert answers[0].json()["usage"]["completion_tokens"] == 3


def test_the_api_key_is_required_on_v1_and_health_stays_open(server):
    body = {**LONG, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
        r = httpx.post(server.url + URL, json=body, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
    reply = client.chat.completions.create(model="tiny", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.usage.completion_tokens == 2 and reply.choices[0].finish_reason == "length"


def test_plain_and_dflash_agree_on_the_tiny_pair_too(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
    texts = {}
    for mode in ("plain", "dflash"):
        r = client.chat.completions.create(model="tiny", max_tokens=40, extra_body={
            "mode": mode}, messages=[{"role": "user", "content": "The capital of France"}])
        texts[mode] = (r.choices[0].message.content, r.usage.completion_tokens)
        assert r.model_extra["dflash"]["mode"] == mode
    assert texts["plain"] == texts["dflash"]


# ------------------------------------------------------------------------------ hosts
@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True),
                                            ("::1", True), ("127.0.0.2", True),
                                            ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.10", False), ("example.org", False)])
def test_a_public_host_needs_an_api_key(host, loopback):
    assert is_loopback(host) is loopback
    if loopback:
        check_host(host, None)
    else:
        with pytest.raises(ServeConfigError, match="--api-key"):
            check_host(host, None)
        check_host(host, "key")


def test_serve_refuses_a_public_host_without_a_key_in_one_line(capsys, monkeypatch):
    from app.cli import main

    monkeypatch.delenv("DFLASH_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --host 0.0.0.0 would accept requests from other machines")
    assert len(err.splitlines()) == 1


# ------------------------------------------------------------------------------ SIGTERM
def test_sigterm_cancels_the_running_reply_and_exits_cleanly(tiny_paths, tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "--data-dir", str(tmp_path), "serve", "--port", "0",
         "--model", tiny_paths[0], "--draft-model", tiny_paths[1], "--grace", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        line = proc.stdout.readline()
        assert line.startswith("Serving "), line + proc.stderr.read()
        url = line.split(" on ", 1)[1].split("/v1", 1)[0]
        lines = []
        with httpx.stream("POST", url + URL, json={**LONG, "model": None, "stream": True},
                          timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 6:
                    proc.send_signal(signal.SIGTERM)
                    t0 = time.monotonic()
            ended = time.monotonic() - t0
        events = sse_events(lines)
        assert events[-1] == "[DONE]"  # the stream ends as a stream, not cut off
        assert events[-2]["dflash"]["stop_cause"] == "cancelled"
        assert events[-2]["dflash"]["generated_tokens"] < 3000
        assert ended < 5  # the 0.5 s grace, then a cycle
        code = proc.wait(20)
        err = proc.stderr.read()
        assert code == 0, err
        assert "Stopped." in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stop_lets_the_running_reply_finish_and_refuses_the_waiting_one(tiny_paths):
    srv = RunningServer(PairSpec(*tiny_paths), model_id="tiny", grace_s=60)
    try:
        waiting: list[httpx.Response] = []
        lines = []
        with httpx.stream("POST", srv.url + URL, timeout=60,
                          json={**LONG, "max_tokens": 200, "stream": True}) as r:
            it = r.iter_lines()
            lines.append(next(it))
            t = threading.Thread(target=lambda: waiting.append(httpx.post(
                srv.url + URL, json={**LONG, "max_tokens": 2}, timeout=60)))
            t.start()
            deadline = time.monotonic() + 10
            while srv.worker.queued < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            srv.server.handle_exit(signal.SIGTERM, None)  # what SIGTERM does
            lines.extend(it)
        events = sse_events(lines)
        assert events[-1] == "[DONE]"
        figures = events[-2]["dflash"]
        assert figures["stop_cause"] == "length" and figures["generated_tokens"] == 200
        t.join(30)
        assert waiting[0].status_code == 503
        assert waiting[0].json()["error"]["code"] == "shutting_down"
        srv.thread.join(30)
        assert not srv.thread.is_alive() and not srv.worker.alive
        with pytest.raises(httpx.ConnectError):
            httpx.get(srv.url + "/health", timeout=5)
    finally:
        srv.close()


def test_a_next_turn_sent_the_moment_the_answer_arrives_is_prefilled_ahead(monkeypatch):
    """After a final answer the worker prefills what the client's next request starts with,
    when no request waits. A client that sends its next turn the moment it reads the answer
    (as a script does, or the test suite under load) used to race that check and find its
    history read again from the system prompt; the check is now made before the answer goes
    out."""
    from types import SimpleNamespace

    from app.chat.events import ReplyDone
    from app.chat.settings import ReplySettings
    from app.serve.worker import Job, JobFinished, JobQueue, JobStarted

    prefilled = []

    class Session:
        def reply(self, messages, settings, cancel=None, fit=True):
            summary = SimpleNamespace(stop_cause="eos", error=None)
            yield ReplyDone(SimpleNamespace(
                content="Lima.", reasoning="", tool_calls=[], finish_reason="stop",
                summary=summary, tokens=[1, 2], reasoning_tokens=0,
                messages=[{"role": "assistant", "content": "Lima."}]))

        def prefill_after(self, messages, settings, fit=True):
            prefilled.append(messages)
            return object()

    jobs = JobQueue()
    monkeypatch.setattr(jobs, "_prepare", lambda session, req: (
        ReplySettings(max_tokens=8), JobStarted(prompt_tokens=3, mode="plain", block_size=None,
                                               max_tokens=8)))
    turn = [{"role": "user", "content": "Capital of Peru?"}]

    def deliver(event):  # the client: its next turn goes in as soon as it has the answer
        if isinstance(event, JobFinished):
            jobs._queue.put_nowait(Job(SimpleNamespace(messages=turn), lambda e: None))

    jobs.run(Session(), Job(SimpleNamespace(messages=turn), deliver))
    assert jobs.prefilled == 1
    assert prefilled == [[*turn, {"role": "assistant", "content": "Lima."}]]
