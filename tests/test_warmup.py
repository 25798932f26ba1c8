"""Warm-up after a load (issue #21): what it runs, that it leaves no state, and how the worker
shows it. On this CPU nothing needs warming (``needs_warm_up`` is False); the GPU case is
simulated by patching that answer."""

from __future__ import annotations

import pytest
from engine_fixtures import prompt_ids, run

from app.chat.session import PairSpec
from app.engine import warmup


def test_nothing_to_warm_on_the_cpu():
    assert warmup.needs_warm_up() is False


def test_warm_up_runs_plain_and_each_drafter_and_leaves_replies_unchanged(tiny_hybrid):
    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    before = run(target, ids, drafter, mode="dflash", max_tokens=20).tokens
    report = warmup.warm_up(target, [drafter, None])
    assert len(report.drafted_s) == 1
    # plain + one DFlash reply of 2 * block + 1 tokens each, unless an end token came first
    assert 2 <= report.tokens <= 2 * (2 * drafter.config.block_size + 1)
    assert report.seconds == pytest.approx(report.plain_s + report.drafted_s[0])
    assert run(target, ids, drafter, mode="dflash", max_tokens=20).tokens == before


def test_session_warm_up_only_where_needed(tiny_hybrid, monkeypatch):
    from app.chat.session import ChatSession

    session = ChatSession()
    assert session.warm_up() is None  # nothing loaded
    session.target, session.drafter = tiny_hybrid
    assert session.warm_up() is None  # the CPU
    assert session.warm_up(force=True) > 0
    monkeypatch.setattr(warmup, "needs_warm_up", lambda: True)
    assert session.warm_up() > 0


class _Backend:
    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def load(self, spec):
        self.calls.append("load")
        return "info"

    def warm_up(self):
        self.calls.append("warm_up")
        if self.fail:
            raise RuntimeError("kernel build failed")
        return 1.5

    def memory_bytes(self):
        return 0


@pytest.mark.parametrize("fail", [False, True])
def test_the_worker_says_it_warms_up_and_loads_even_if_that_fails(qtbot, monkeypatch, fail):
    from app.ui.worker import Worker

    monkeypatch.setattr(warmup, "needs_warm_up", lambda: True)
    backend = _Backend(fail)
    worker = Worker(backend)
    said, loaded = [], []
    worker.loading.connect(said.append)
    worker.loaded.connect(lambda info: loaded.append((info, list(backend.calls))))
    worker._on_load(PairSpec(tiny=True))
    assert backend.calls == ["load", "warm_up"]
    assert loaded == [("info", ["load", "warm_up"])]  # loaded only after the warm-up
    assert any(s.startswith("Warming up") for s in said)


def test_the_worker_says_nothing_on_the_cpu(qtbot):
    from app.ui.worker import Worker

    backend = _Backend()
    worker = Worker(backend)
    said = []
    worker.loading.connect(said.append)
    worker._on_load(PairSpec(tiny=True))
    assert not any(s.startswith("Warming up") for s in said)
    assert backend.calls == ["load", "warm_up"]  # asked; the session answers None there
