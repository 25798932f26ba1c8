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


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """An empty MLX kernel cache folder of this test's own (the prebuild records its work
    there; the children inherit the variable)."""
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_warm_up_can_build_kernels_in_child_processes_first(tiny_hybrid, kernel_cache):
    from app.engine import kernel_prebuild

    target, drafter = tiny_hybrid
    assert warmup.warm_up(target, [drafter]).prebuild is None  # only on CUDA by default
    report = warmup.warm_up(target, [drafter], prebuild=True)
    built = report.prebuild
    assert built.failed == [] and built.processes >= 1 and built.background == []
    assert sorted(built.recipes) == sorted(kernel_prebuild.recipes_for(target, [drafter]))
    assert report.seconds == pytest.approx(built.seconds + report.plain_s
                                           + sum(report.drafted_s))
    assert warmup.build_gdn_kernel(target) is False  # the CUDA kernel is not active here
    assert kernel_prebuild.built_before(kernel_cache) == set(built.recipes)
    again = warmup.warm_up(target, [drafter], prebuild=True).prebuild
    assert again.processes == 0 and again.recipes == []  # recorded: nothing to build


def test_a_prebuild_that_cannot_start_leaves_the_warm_up_to_the_replies(tiny_hybrid,
                                                                         kernel_cache,
                                                                         monkeypatch):
    from app.engine import kernel_prebuild

    def no_children(*_a, **_k):
        raise OSError("cannot start a process")

    monkeypatch.setattr(kernel_prebuild, "start", no_children)
    target, drafter = tiny_hybrid
    report = warmup.warm_up(target, [drafter], prebuild=True)
    assert report.prebuild.processes == 0 and report.prebuild.recipes == []
    assert report.tokens >= 2 and len(report.drafted_s) == 1


def test_warm_layers_runs_the_layers_on_zeros_and_leaves_compile_on(tiny_hybrid):
    import mlx.core as mx

    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    before = run(target, ids, drafter, mode="dflash", max_tokens=12).tokens
    calls = []
    compiled = mx.compile(lambda x: calls.append(1) or x * 2)
    warmup.warm_layers(target, lengths=(3, 1))
    compiled(mx.ones(2))
    compiled(mx.ones(2))
    assert calls == [1]  # traced once: compile is on again
    assert run(target, ids, drafter, mode="dflash", max_tokens=12).tokens == before


def test_with_a_prebuild_a_second_drafters_kernels_build_in_the_background(kernel_cache):
    from app.engine import kernel_prebuild
    from app.engine.loader import load_drafter, load_target
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    target, drafter, dflash2 = load_target(t), load_drafter(d), load_drafter(demo_dflash2_dir())
    report = warmup.warm_up(target, [drafter, dflash2], max_tokens=4, prebuild=True)
    assert len(report.drafted_s) == 1  # only the first drafter's reply
    walk = [r for r in kernel_prebuild.recipes_for(target, [drafter, dflash2])
            if r not in kernel_prebuild.recipes_for(target, [drafter])]
    assert walk and report.prebuild.background == walk
    job = kernel_prebuild._BACKGROUND[-1]
    assert sorted(r for g in job.groups for r in g) == sorted(walk)
    assert job.wait().failed == []
    assert set(walk) <= kernel_prebuild.built_before(kernel_cache)  # recorded by wait


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
