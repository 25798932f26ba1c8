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


def test_warm_up_runs_a_lookup_reply_when_asked(tiny_hybrid, monkeypatch):
    """compare --lookup times a Lookup side: ``lookup=True`` warms that path too (its
    verify blocks are not the drafters'), after plain and the drafters, with no drafter."""
    from app.engine import generate as generate_mod

    target, drafter = tiny_hybrid
    modes, real = [], generate_mod.generate

    def spy(target, ids, cfg, drafter=None, *rest, **kw):
        modes.append((cfg.mode, drafter is not None))
        return real(target, ids, cfg, drafter, *rest, **kw)

    monkeypatch.setattr(warmup, "generate", spy)
    report = warmup.warm_up(target, [drafter], max_tokens=6)
    assert modes == [("plain", False), ("dflash", True)] and report.lookup_s is None
    modes.clear()
    report = warmup.warm_up(target, [drafter], max_tokens=6, lookup=True)
    assert modes == [("plain", False), ("dflash", True), ("lookup", False)]
    assert report.lookup_s > 0
    assert report.seconds == pytest.approx(report.plain_s + report.drafted_s[0]
                                           + report.lookup_s)


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch):
    """An empty MLX kernel cache folder of each test's own (the prebuild records its work
    there; the children inherit the variable); background children are waited for after
    the test, so none outlives it or writes into a later test's folder."""
    from app.engine.kernels import kernel_prebuild

    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    yield tmp_path / "ptx"
    for job in kernel_prebuild._BACKGROUND:
        job.wait()
    kernel_prebuild._BACKGROUND.clear()


def test_warm_up_can_build_kernels_in_child_processes_first(tiny_hybrid, kernel_cache):
    from app.engine.kernels import kernel_prebuild

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
                                                                         monkeypatch):
    from app.engine.kernels import kernel_prebuild

    def no_children(*_a, **_k):
        raise OSError("cannot start a process")

    monkeypatch.setattr(kernel_prebuild, "start", no_children)
    target, drafter = tiny_hybrid
    report = warmup.warm_up(target, [drafter], prebuild=True)
    assert report.prebuild.processes == 0 and report.prebuild.recipes == []
    assert report.prebuild.failed == ["OSError: cannot start a process"]
    assert report.tokens >= 2 and len(report.drafted_s) == 1


def test_nothing_in_the_kernel_build_stops_the_warm_up(tiny_hybrid, monkeypatch):
    from app.engine.kernels import kernel_prebuild

    def broken(*_a, **_k):
        raise AttributeError("a model without what the recipes read")

    monkeypatch.setattr(kernel_prebuild, "recipes_for", broken)
    target, drafter = tiny_hybrid
    report = warmup.warm_up(target, [drafter], prebuild=True)
    assert report.prebuild.failed == ["AttributeError: a model without what the recipes read"]
    assert report.tokens >= 2 and len(report.drafted_s) == 1


def test_the_in_process_kernel_build_counts_when_no_child_is_needed(tiny_hybrid, monkeypatch,
                                                                    kernel_cache):
    """A start whose disk-cached kernels were all built before still builds the GDN kernel
    in-process (MLX keeps it in memory only); the report's seconds include it, so "warmed
    up in N s" is the whole warm-up (on an H100 such a start took 6.8 s and reported 4.2)."""
    import time

    from app.engine.kernels import kernel_prebuild

    target, drafter = tiny_hybrid
    monkeypatch.setattr(kernel_prebuild, "built_before",
                        lambda *a: set(kernel_prebuild.recipes_for(target, [drafter])))
    monkeypatch.setattr(warmup, "build_gdn_kernel", lambda t: time.sleep(0.3) or True)
    report = warmup.warm_up(target, [drafter], prebuild=True)
    assert report.prebuild.processes == 0
    assert report.prebuild.seconds >= 0.3
    assert report.seconds >= 0.3 + report.plain_s + sum(report.drafted_s)


def test_build_gdn_kernel_passes_the_dtypes_a_reply_passes(tiny_hybrid, monkeypatch):
    import mlx.core as mx

    from app.engine.kernels import gdn_kernel

    target, _ = tiny_hybrid
    gdn = next(layer.linear_attn for layer in target.model.layers
               if hasattr(getattr(layer, "linear_attn", None), "A_log"))
    seen = []
    monkeypatch.setattr(gdn_kernel, "kernel_active", lambda: True)
    # the kernel object as MLX's CUDA backend would build it: here it records the call
    monkeypatch.setattr(gdn_kernel, "_kernel", lambda: lambda **call: seen.append(
        [x.dtype for x in call["inputs"]]) or [call["inputs"][-1]])
    if gdn.head_k_dim % 32:  # the tiny pair's key heads: the kernel does not take them
        assert warmup.build_gdn_kernel(target) is False and seen == []
        monkeypatch.setattr(gdn, "head_k_dim", 32)
    assert warmup.build_gdn_kernel(target) is True
    act = target.model.parameters()["language_model"]["model"]["norm"]["weight"].dtype
    # q, k, v, g, beta, state: g as compute_g gives it, the state as the cache holds it
    assert seen == [[act, act, act, mx.float32, act, mx.float32]]


def test_warm_layers_runs_the_layers_on_zeros_and_leaves_compile_on(tiny_hybrid, monkeypatch):
    import mlx.core as mx

    target, drafter = tiny_hybrid
    ids = prompt_ids(target)
    before = run(target, ids, drafter, mode="dflash", max_tokens=12).tokens
    calls, switches = [], []
    compiled = mx.compile(lambda x: calls.append(1) or x * 2)
    off, on = mx.disable_compile, mx.enable_compile
    monkeypatch.setattr(mx, "disable_compile", lambda: switches.append("off") or off())
    monkeypatch.setattr(mx, "enable_compile", lambda: switches.append("on") or on())
    warmup.warm_layers(target, lengths=(3, 1))
    assert switches == ["off", "on"]
    compiled(mx.ones(2))
    compiled(mx.ones(2))
    assert calls == [1]  # traced once: compile is on again
    assert run(target, ids, drafter, mode="dflash", max_tokens=12).tokens == before


def test_with_a_prebuild_a_second_drafters_kernels_build_in_the_background(kernel_cache,
                                                                            monkeypatch):
    """Where the cores are fewer than the recipes (the H100 host's fresh start: 7 recipes in
    the foreground, 5 in the background)."""
    from app.engine.kernels import kernel_prebuild
    from app.models.loader import load_drafter, load_target
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    monkeypatch.setattr(kernel_prebuild, "default_workers", lambda: 2)
    jobs = []  # the job itself: a run may reap it from _BACKGROUND once its children end
    real_background = kernel_prebuild.start_background
    monkeypatch.setattr(kernel_prebuild, "start_background",
                        lambda *a, **k: jobs.append(real_background(*a, **k)) or jobs[-1])
    t, d = demo_pair_dirs()
    target, drafter, dflash2 = load_target(t), load_drafter(d), load_drafter(demo_dflash2_dir())
    report = warmup.warm_up(target, [drafter, dflash2], max_tokens=4, prebuild=True)
    assert len(report.drafted_s) == 1  # only the first drafter's reply
    walk = [r for r in kernel_prebuild.recipes_for(target, [drafter, dflash2])
            if r not in kernel_prebuild.recipes_for(target, [drafter])]
    assert walk and report.prebuild.background == walk
    (job,) = jobs
    assert sorted(r for g in job.groups for r in g) == sorted(walk)
    for proc in job.procs:  # as in the app: nobody calls job.wait()
        proc.wait(timeout=300)
    # each child recorded its own recipes, and left no private folder behind
    assert set(walk) <= kernel_prebuild.built_before(kernel_cache)
    assert not list(kernel_cache.glob(".prebuild-*"))


def test_with_a_core_for_every_recipe_later_kernels_still_build_in_the_background(
        kernel_cache, monkeypatch):
    """Building every drafter's kernels at once where each recipe had a core made a fresh
    H100 host's start slower (12 children: prebuild 9.8 s against 7.5-8.0 s for the first
    drafter's 7; start to ready 11.0 s against 8.5-9.3 s): the later drafters' kernels are
    left to the background whatever the core count, and their first run waits for them."""
    from app.engine.kernels import kernel_prebuild
    from app.models.loader import load_drafter, load_target
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    monkeypatch.setattr(kernel_prebuild, "default_workers", lambda: 12)
    t, d = demo_pair_dirs()
    target, drafter, dflash2 = load_target(t), load_drafter(d), load_drafter(demo_dflash2_dir())
    report = warmup.warm_up(target, [drafter, dflash2], max_tokens=4, prebuild=True)
    first = kernel_prebuild.recipes_for(target, [drafter])
    walk = [r for r in kernel_prebuild.recipes_for(target, [drafter, dflash2]) if r not in first]
    assert len(first) + len(walk) <= 12  # a core for each
    assert sorted(report.prebuild.recipes) == sorted(first)
    assert report.prebuild.background == walk
    assert kernel_prebuild.wait_background_for(walk) >= 0.0
    assert not kernel_prebuild.background_running()
    assert set(walk) <= kernel_prebuild.built_before(kernel_cache)


def test_with_the_first_drafters_kernels_built_the_others_stay_in_the_background(
        kernel_cache, monkeypatch):
    """No child would run for the first drafter: starting some only for the later drafters
    would make the start wait for them, so they stay in the background."""
    from app.engine.kernels import kernel_prebuild
    from app.models.loader import load_drafter, load_target
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    monkeypatch.setattr(kernel_prebuild, "default_workers", lambda: 12)
    t, d = demo_pair_dirs()
    target, drafter, dflash2 = load_target(t), load_drafter(d), load_drafter(demo_dflash2_dir())
    first = set(kernel_prebuild.recipes_for(target, [drafter]))
    monkeypatch.setattr(kernel_prebuild, "built_before", lambda *a: first)
    report = warmup.warm_up(target, [drafter, dflash2], max_tokens=4, prebuild=True)
    walk = [r for r in kernel_prebuild.recipes_for(target, [drafter, dflash2])
            if r not in first]
    assert report.prebuild.processes == 0 and report.prebuild.background == walk


def test_session_warm_up_only_where_needed(tiny_hybrid, monkeypatch):
    from app.chat.session import ChatSession

    session = ChatSession()
    assert session.warm_up() is None  # nothing loaded
    session.target, session.drafter = tiny_hybrid
    asked = []
    real = warmup.warm_up
    monkeypatch.setattr(warmup, "warm_up",
                        lambda t, d, **kw: asked.append(kw) or real(t, d, **kw))
    assert session.warm_up() > 0  # the CPU too: both paths run once before any timing
    assert session.warm_up(force=True) > 0
    assert asked == [{"max_tokens": 4}, {}]  # short on the CPU unless forced
    monkeypatch.setattr(warmup, "needs_warm_up", lambda: True)
    assert session.warm_up() > 0


def test_session_warm_up_builds_the_unit_registry_meanwhile(tiny_hybrid, monkeypatch):
    """The first ``convert_units`` call of a session would build pint's registry (~0.5 s,
    counted as the tool's time); the warm-up builds it in a background thread instead."""
    from app.chat.session import ChatSession
    from app.chat.tools import units

    monkeypatch.setattr(units, "_registry", None)
    started = []
    real = units.build_in_background
    monkeypatch.setattr(units, "build_in_background",
                        lambda: started.append(real()) or started[-1])
    session = ChatSession()
    session.target, session.drafter = tiny_hybrid
    session.warm_up()
    assert len(started) == 1 and started[0] is not None
    started[0].join(timeout=30)
    assert units._registry is not None
    assert units.build_in_background() is None  # built: nothing to start


def test_session_measures_block_costs_once_and_then_knows_them(tiny_hybrid, monkeypatch):
    """Turning the automatic block size on after a load: the session measures the pair's cost
    model for that rollback (``costs.calibrate``) once; asked again it is known."""
    from app.chat.session import ChatSession
    from app.engine import costs

    session = ChatSession()
    assert session.measure_block_costs() is None  # nothing loaded
    session.target, session.drafter = tiny_hybrid
    measured = []
    real = costs.calibrate
    monkeypatch.setattr(costs, "calibrate",
                        lambda r, d, strategy="tape", **kw: measured.append(strategy)
                        or real(r, d, strategy, **kw))
    # the shared tiny pair may carry a model from another test: start from none
    monkeypatch.setitem(costs._MODELS, id(session.drafter.model), {})
    assert costs.known_model(session.drafter, session.target.model) is None
    assert session.measure_block_costs() > 0
    assert measured == ["tape"]
    assert costs.known_model(session.drafter, session.target.model) is not None
    session.measure_block_costs()
    assert measured == ["tape"]  # known: not measured again
    session.measure_block_costs("replay")
    assert measured == ["tape", "replay"]
    with pytest.raises(ValueError, match="rollback"):
        session.measure_block_costs("undo")


def test_the_worker_measures_block_costs_when_asked(qtbot):
    from app.ui.worker import Worker

    class Backend(_Backend):
        def measure_block_costs(self, rollback):
            self.calls.append(rollback)
            if self.fail:
                raise RuntimeError("boom")
            return 0.5

    for fail, expected in ((False, 0.5), (True, None)):
        worker = Worker(Backend(fail))
        got = []
        worker.blockCostsReady.connect(got.append)
        worker._on_block_costs("replay")
        assert got == [expected] and worker.backend.calls == ["replay"]


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


def test_the_worker_keeps_cost_models_in_its_folder_from_the_first_load(qtbot, tmp_path,
                                                                      monkeypatch):
    """The window gives the worker its data folder (``Worker.cost_dir``); the worker points
    the automatic block size's cost-model store there when a pair loads, on its own thread,
    so the window needs no MLX import before a model is asked for."""
    from app.engine import costs
    from app.ui.worker import Worker

    monkeypatch.setattr(costs, "_store", [None])
    worker = Worker(_Backend())
    worker.cost_dir = tmp_path
    assert costs._store[0] is None  # nothing before a load
    worker._on_load(PairSpec(tiny=True))
    assert costs._store[0] == tmp_path / costs.STORE_NAME


def test_a_quantized_target_is_warmed_and_its_embedding_gathers_listed(tiny_root):
    import mlx.nn as nn

    from app.engine.kernels import kernel_prebuild
    from app.models.loader import load_target
    from app.models.tiny import build_tiny_pair

    t, _ = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    target = load_target(t)
    nn.quantize(target.model, group_size=32, bits=4,
                class_predicate=lambda _, m: hasattr(m, "to_quantized")
                and m.weight.shape[-1] % 32 == 0)
    embed = target.model.language_model.model.embed_tokens
    assert embed.weight.shape[-1] == 64 // 8  # packed: narrower than the residual stream
    warmup.warm_layers(target, lengths=(2, 1))  # the width comes from the final norm
    recipes = kernel_prebuild.recipes_for(target)
    assert ("gather", ("uint32", "int32")) in recipes  # the packed weight
    assert ("gather", ("float32", "int32")) in recipes  # its scales
    assert ("silu", ("float32",)) in recipes  # the activation dtype, not the packed one


def test_session_warm_up_with_auto_block_measures_the_costs(tiny_hybrid, monkeypatch):
    """``auto_block``: the drafters' warm-up replies run with the automatic block size, so the
    pair's cost model is known before the first reply (the window asks for it when its
    Automatic block size setting is on)."""
    from app.chat.session import ChatSession
    from app.engine import costs

    session = ChatSession()
    session.target, session.drafter = tiny_hybrid
    asked = []
    real = warmup.warm_up
    monkeypatch.setattr(warmup, "warm_up",
                        lambda t, d, **kw: asked.append(kw) or real(t, d, **kw))
    assert session.warm_up(auto_block=True) > 0
    assert asked == [{"max_tokens": 4, "auto_block": True}]
    assert costs.known_model(session.drafter, session.target.model) is not None


class _AutoBackend(_Backend):
    def warm_up(self, auto_block=False):
        self.calls.append(("warm_up", auto_block))
        return 1.5


def test_the_worker_warms_up_with_auto_block_when_the_window_asks(qtbot):
    from app.ui.worker import Worker

    backend = _AutoBackend()
    worker = Worker(backend)
    said = []
    worker.loading.connect(said.append)
    worker._on_load(PairSpec(tiny=True))
    assert backend.calls == ["load", ("warm_up", False)]
    assert not any("block costs" in s for s in said)
    worker.warm_auto_block = True  # the window's Automatic block size is on
    worker._on_load(PairSpec(tiny=True))
    assert backend.calls[-1] == ("warm_up", True)
    assert any(s.startswith("Warming up") and "measuring its block costs" in s for s in said)


def test_children_started_at_load_are_waited_for_not_started_again(kernel_cache, monkeypatch):
    """On CUDA the kernel build starts before the target loads (``start_kernel_build``, from
    the files' headers), so the load overlaps it; the warm-up then waits for those children
    (still running here: stand-ins that end when waited for) and starts none for the same
    recipes."""
    from app.engine import device
    from app.engine.kernels import kernel_prebuild
    from app.models import loader
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    class Child:  # a child process that runs until someone waits for it
        returncode = 0

        def __init__(self):
            self.done = False

        def poll(self):
            return 0 if self.done else None

        def communicate(self, timeout=None):
            self.done = True
            return b"", b""

    started = []

    def start(recipes, workers=None, stderr=None):
        started.append(list(recipes))
        groups = kernel_prebuild.split(list(recipes), 3)
        return kernel_prebuild.Prebuild(0.0, groups, [Child() for _ in groups])

    monkeypatch.setattr(device, "backend", lambda mx=None: "CUDA")
    monkeypatch.setattr(kernel_prebuild, "start", start)
    t, d = demo_pair_dirs()
    d2 = demo_dflash2_dir()
    assert loader.start_kernel_build(t, d, None, d2) is True
    assert kernel_prebuild.background_running()
    assert loader.start_kernel_build(t, d) is False  # those recipes are being built already
    target = loader.load_target(t, keep_dtype=True)  # the dtypes a GPU load keeps
    drafter = loader.load_drafter(d, keep_dtype=True)
    dflash2 = loader.load_drafter(d2, keep_dtype=True)
    first = kernel_prebuild.recipes_for(target, [drafter])
    early, rest = started  # the first drafter's (and the target's), then the DFlash2 walk's
    assert sorted(early) == sorted(first)
    assert sorted(early + rest) == sorted(kernel_prebuild.recipes_for(target, [drafter, dflash2]))
    report = warmup.warm_up(target, [drafter, dflash2], max_tokens=4, prebuild=True)
    assert len(started) == 2  # nothing started twice, nothing left to the background
    assert sorted(report.prebuild.recipes) == sorted(first) and report.prebuild.failed == []
    assert report.prebuild.background == []
    assert report.prebuild.processes == 3  # the load's children for the first drafter
    assert not kernel_prebuild.children_building(first)  # waited for
    assert sorted(kernel_prebuild.building()) == sorted(rest)  # not waited for: not needed yet
    kernel_prebuild.wait_background_for(rest)
    assert not kernel_prebuild.background_running()
    assert loader.start_kernel_build(kernel_cache / "no-such-model") is False  # the load says
    assert len(started) == 2


def test_kernel_build_off_cuda_looks_at_no_folder(monkeypatch):
    """Off CUDA ``start_kernel_build`` returns False before resolving any model folder (the
    build is for MLX's CUDA backend only; the load reports a missing folder)."""
    from app.engine import device
    from app.models import loader

    looked = []
    monkeypatch.setattr(device, "backend", lambda mx=None: "CPU")
    monkeypatch.setattr(loader, "resolve_model_path", lambda p: looked.append(p) or p)
    assert loader.start_kernel_build("some/target", "some/drafter") is False
    assert looked == []
