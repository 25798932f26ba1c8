"""The parallel kernel build before a warm-up (app/engine/kernels/kernel_prebuild.py).

Its recipes must build the very modules a reply compiles. MLX names a fused (``mx.compile``)
kernel after its graph and dtypes on every backend alike (``build_lib_name``), and the CPU
backend writes its compiled kernels to ``$TMPDIR/mlx/<version>/cpu`` as the CUDA one writes its
own to ``.../ptx``: so a CPU run compares the names a recipe builds with those a real reply
builds, in float16 as the bundled pair runs on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.kernels import kernel_prebuild as kp
from app.models.loader import load_drafter, load_target
from app.paths import demo_pair_dirs

ROOT = Path(__file__).resolve().parents[1]

REPLY = """
from app.engine.generate import GenerationConfig, generate
from app.models.loader import load_drafter, load_target
from app.paths import demo_pair_dirs
t, d = demo_pair_dirs()
target, drafter = load_target(t, keep_dtype=True), load_drafter(d, keep_dtype=True)
ids = list(target.tokenizer.encode("What is the capital of France?"))
for mode, dr in (("plain", None), ("dflash", drafter)):
    for _ in generate(target, ids, GenerationConfig(mode=mode, max_tokens=20), dr):
        pass
"""


def _compiled_names(tmp: Path) -> set[str]:
    """Fused-kernel names the CPU backend compiled under ``tmp`` (variant suffixes cut)."""
    files = tmp.glob("mlx/*/cpu/*.cpp")
    return {re.sub(r"_(contiguous|strided_\d+)$", "", f.stem) for f in files}


def _run(code_or_args: list[str], tmp: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, *code_or_args], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def float16_pair():
    t, d = demo_pair_dirs()
    return load_target(t, keep_dtype=True), load_drafter(d, keep_dtype=True)


def test_recipes_for_the_bundled_pair_in_float16(float16_pair):
    target, drafter = float16_pair
    assert kp.recipes_for(target, [drafter, None]) == [
        ("gather", ("float16", "int32")), ("gather", ("float16", "uint32")),
        ("gather", ("uint32", "uint32")), ("silu", ("float16",)), ("swiglu", ("float16",)),
        ("precise_swiglu", ("float16",)), ("compute_g", ("float16", "float16", "float16")),
    ]


def test_a_dflash2_drafter_adds_its_candidate_walk(float16_pair):
    from app.paths import demo_dflash2_dir

    target, drafter = float16_pair
    dflash2 = load_drafter(demo_dflash2_dir(), keep_dtype=True)
    extra = [r for r in kp.recipes_for(target, [drafter, dflash2])
             if r not in kp.recipes_for(target, [drafter])]
    # the codebooks are float16 here, as the embedding: their gathers are listed already.
    # ("int32", "int32"): the composed walk's table, which a fresh H100 compiled in the first
    # DFlash2 reply (7.8 s) while the others had been built
    assert extra == [("gather_axis", ("float32", "uint32")), ("gather_axis", ("uint32", "uint32")),
                     ("gather_axis", ("float32", "int32")), ("gather_axis", ("int32", "int32")),
                     ("gather", ("float32", "uint32")), ("gather2", ("int32", "uint32"))]
    for kind, dtypes in extra:
        kp.run_recipe(kind, dtypes)  # each runs


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="MLX compiles CPU kernels with g++ (without it, compile is off)")
def test_fused_recipes_build_the_kernels_a_reply_compiles(float16_pair, tmp_path):
    target, drafter = float16_pair
    fused = [r for r in kp.recipes_for(target, [drafter]) if r[0] != "gather"]
    (tmp_path / "reply").mkdir()
    (tmp_path / "recipes").mkdir()
    _run(["-c", REPLY], tmp_path / "reply")
    _run(["-m", "app.engine.kernels.kernel_prebuild", json.dumps(fused)], tmp_path / "recipes")
    reply, built = _compiled_names(tmp_path / "reply"), _compiled_names(tmp_path / "recipes")
    assert len(built) == len(fused) == 4
    assert built <= reply, built - reply


def test_split_deals_slow_kinds_first_to_the_least_loaded_group():
    recipes = [("gather", ("float16", "int32")), ("silu", ("float16",)),
               ("gather", ("uint32", "uint32")), ("compute_g", ("float16",) * 3),
               ("swiglu", ("float16",))]
    groups = kp.split(recipes, 2)
    assert groups == [[("silu", ("float16",)), ("swiglu", ("float16",))],
                      [("compute_g", ("float16",) * 3), ("gather", ("float16", "int32")),
                       ("gather", ("uint32", "uint32"))]]
    assert kp.split(recipes, 8) == [[r] for r in sorted(recipes, key=lambda r: r[0] not in kp._SLOW)]
    assert kp.split([], 4) == []


def test_children_run_their_recipes_and_a_failure_is_reported_not_raised(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    job = kp.start([("silu", ("float32",)), ("no_such_kind", ("float32",))], workers=2)
    report = job.wait(timeout_s=300)
    assert report.processes == 2
    assert len(report.failed) == 1 and "no_such_kind" in report.failed[0]
    assert "unknown kernel recipe" in report.failed[0]
    # a child records its recipes only when all of them ran
    assert kp.built_before() == {("silu", ("float32",))}
    assert not list(tmp_path.glob(".prebuild-*"))  # no private folder left behind


def test_the_record_of_built_recipes(tmp_path, monkeypatch):
    import mlx.core as mx

    assert kp.built_before(tmp_path) == set()
    kp.mark_built([("silu", ("float16",))], tmp_path)
    kp.mark_built([("gather", ("float16", "int32")), ("silu", ("float16",))], tmp_path)
    assert kp.built_before(tmp_path) == {("silu", ("float16",)),
                                         ("gather", ("float16", "int32"))}
    record = tmp_path / kp.MARKER
    (record / "0.0.1--silu--bfloat16").touch()  # another MLX version's kernels
    (record / "stray-file").touch()
    (record / f"{mx.__version__}--no_such_kind--float16").touch()
    assert len(kp.built_before(tmp_path)) == 2
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "mine"))
    assert kp.ptx_cache_dir() == tmp_path / "mine"
    kp.mark_built([("silu", ("float32",))], tmp_path / "not" / "there")  # created
    assert kp.built_before(tmp_path / "not" / "there") == {("silu", ("float32",))}
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    kp.mark_built([("silu", ("float32",))], blocker)  # cannot be written: no error
    assert kp.built_before(blocker) == set()


def test_publish_moves_each_module_whole(tmp_path):
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir()
    shared.mkdir()
    for ext, text in ((".ptx", "code"), (".txt", "kernel\tmangled"), (".cu", "source")):
        (private / f"gather_float16_int32_1{ext}").write_text(text)
    (private / "half.txt").write_text("a module whose .ptx was never written")
    assert kp.publish(private, shared) == 1
    assert sorted(f.name for f in shared.iterdir()) == [
        "gather_float16_int32_1.cu", "gather_float16_int32_1.ptx", "gather_float16_int32_1.txt"]
    assert (shared / "gather_float16_int32_1.txt").read_text() == "kernel\tmangled"
    assert [f.name for f in private.iterdir()] == ["half.txt"]  # not published


def test_run_recipe_rejects_an_unknown_kind():
    with pytest.raises(KeyError, match="unknown kernel recipe 'nope'"):
        kp.run_recipe("nope", ("float32",))


def test_prebuild_switch(monkeypatch):
    monkeypatch.setenv("DFLASH_KERNEL_PREBUILD", "0")
    assert kp.enabled() is False
    monkeypatch.setenv("DFLASH_KERNEL_PREBUILD", "1")
    assert kp.enabled() is True
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert kp.enabled() is False


def test_a_drafted_run_waits_for_background_children_building_its_kernels(monkeypatch):
    """A DFlash2 reply sent right after a fresh host's warm-up compiled its walk's kernels
    itself, one after another (12.7-13.4 s on an H100), while children were building the
    same ones side by side in the background. It now waits for the children that hold one of
    its recipes, and only those (a reply that needs none of them does not wait; the warm-up
    does not wait for another drafter's children)."""
    class Proc:
        def __init__(self):
            self.done = False
            self.waited = 0
            self.timeouts = []

        def poll(self):
            return 0 if self.done else None

        def communicate(self, timeout=None):
            self.waited += 1
            self.timeouts.append(timeout)
            self.done = True
            return b"", b""

        returncode = 0

    walk, other = ("gather_axis", ("int32", "int32")), ("silu", ("float16",))
    procs = [Proc(), Proc()]
    import time

    job = kp.Prebuild(time.perf_counter(), [[walk], [other]], procs)
    monkeypatch.setattr(kp, "_BACKGROUND", [job])
    assert kp.wait_background_for([("gather", ("float16", "int32"))]) == 0.0
    assert [p.waited for p in procs] == [0, 0] and kp.background_running()
    kp.wait_background_for([walk, ("gather", ("float16", "int32"))], most_s=5.0)
    assert [p.waited for p in procs] == [1, 0]  # only the child with its recipe
    assert kp.building() == {other} and kp.background_running()
    kp.wait_background_for([other], most_s=5.0)
    assert [p.waited for p in procs] == [1, 1]
    assert all(0 < t <= 5.0 for p in procs for t in p.timeouts)  # at most most_s
    assert not kp.background_running()


def _from_files_and_loaded(target_dir, drafter_dirs) -> tuple[list, list]:
    target = load_target(target_dir, keep_dtype=True, keep_quantized=True)  # as on a GPU
    drafters = [load_drafter(d, keep_dtype=True) for d in drafter_dirs]
    return (sorted(kp.recipes_from_files(target_dir, drafter_dirs)),
            sorted(kp.recipes_for(target, drafters)))


def test_recipes_read_from_the_files_equal_the_loaded_bundled_pairs():
    """The recipes started before a load (from the safetensors headers) are those the loaded
    pair needs: float16 target, DFlash drafter, DFlash2 drafter with its backbone folder."""
    from app.paths import demo_dflash2_dir

    t, d = demo_pair_dirs()
    for drafters in ([d], [d, demo_dflash2_dir()], [demo_dflash2_dir()], []):
        from_files, loaded = _from_files_and_loaded(t, drafters)
        assert from_files == loaded, drafters


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3", "llama"])
def test_recipes_read_from_the_files_equal_the_loaded_tiny_pairs(tmp_path, family):
    """float32 tiny pairs of each family (hybrid and dense), and the hybrid one converted to
    bfloat16 and to 4-bit with bfloat16 scales (mlx-lm's convert, as mlx-community's)."""
    from app.models.tiny import build_tiny_pair

    t_dir, d_dir = build_tiny_pair(tmp_path / "f32", family, seed=2, block_size=8,
                                   hidden_size=128)
    assert _from_files_and_loaded(t_dir, [d_dir])[0] == _from_files_and_loaded(t_dir, [d_dir])[1]
    if family != "qwen3_5":
        return
    from mlx_lm.convert import convert

    for name, kw in (("bf16", {}), ("q4", {"quantize": True, "q_bits": 4,
                                         "q_group_size": 64})):
        convert(str(t_dir), str(tmp_path / name), dtype="bfloat16", **kw)
        from_files, loaded = _from_files_and_loaded(tmp_path / name, [d_dir])
        assert from_files == loaded, name
        assert ("gather", ("bfloat16", "int32")) in loaded  # the embedding (or its scales)


def test_unreadable_files_give_fewer_recipes_not_an_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    (tmp_path / "config.json").write_text("{not json")
    assert kp.tensor_dtypes(tmp_path) == {}
    assert kp.recipes_from_files(tmp_path, [tmp_path / "missing"]) == [
        ("gather", ("uint32", "uint32")), ("silu", ("float32",)), ("swiglu", ("float32",))]
