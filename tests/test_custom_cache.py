"""The custom-kernel disk cache (app/engine/kernels/custom_cache.py) and the prebuild recipes
that fill it. Off CUDA: the pieces (libstdc++'s string hash, MLX's verbose print, the ELF
symbol reader, the cache files, which recipes a model needs, when they are built). On MLX's
CUDA backend: MLX loads the module written here instead of compiling, and computes the same
values as with its own compile, bit for bit."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.engine.kernels import custom_cache, kernel_prebuild

ROOT = Path(__file__).resolve().parents[1]


def test_std_hash_is_libstdcxx_string_hash():
    # std::hash<std::string>{}("") with libstdc++ on a 64-bit platform
    assert custom_cache.std_hash(b"") == 6142509188972423790
    assert custom_cache.std_hash(b"a") != custom_cache.std_hash(b"b")
    name = custom_cache.module_name("custom_kernel_x_float16", "")
    assert name == "custom_kernel_x_float16_553e93901e462a6e"


def test_parse_verbose_takes_mlx_printed_name_and_source():
    source = "#include \"x.cuh\"\nnamespace mlx::core::cu {\n__global__ void k() {}\n}\n"
    printed = f"Generated source code for `custom_kernel_k_4`:\n```\n{source}\n```\n"
    gen = custom_cache.parse_verbose("noise before\n" + printed)
    assert gen == custom_cache.GeneratedSource("custom_kernel_k_4", source)
    with pytest.raises(custom_cache.CompileError, match="no generated source"):
        custom_cache.parse_verbose("something else\n")


def _elf(path: Path, symbols: dict[str, bytes]) -> None:
    """A minimal ELF64 little-endian file: sections null, .rodata (the symbols' bytes at
    address 0x1000), .symtab, .strtab."""
    rodata, strtab, syms = b"", b"\0", [struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)]
    for name, data in symbols.items():
        syms.append(struct.pack("<IBBHQQ", len(strtab), 1, 0, 1, 0x1000 + len(rodata),
                                len(data)))
        strtab += name.encode() + b"\0"
        rodata += data
    syms.append(struct.pack("<IBBHQQ", len(strtab), 1, 0, 0, 0, 9))  # undefined: skipped
    strtab += b"undefined_jit_source_zE\0"
    symtab = b"".join(syms)
    body_at = 64
    offsets = [body_at, body_at + len(rodata), body_at + len(rodata) + len(symtab)]
    shoff = offsets[2] + len(strtab)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HH", header, 0x3A, 64, 4)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 0, 1, 2, 0x1000, offsets[0], len(rodata), 0, 0, 1, 0),
                struct.pack("<IIQQQQIIQQ", 0, 2, 0, 0, offsets[1], len(symtab), 3, 0, 8, 24),
                struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, offsets[2], len(strtab), 0, 0, 1, 0)]
    path.write_bytes(bytes(header) + rodata + symtab + strtab + b"".join(sections))


def test_mlx_headers_reads_the_jit_sources_from_the_symbol_table(tmp_path):
    lib = tmp_path / "libmlx.so"
    _elf(lib, {"_ZN3mlx4coreL16jit_source_utilsE": b"// utils\n\0",
               "_ZN3mlx4coreL17jit_source_configE": b"#define X 1\n\0",
               "_ZN3mlx4core10other_thingE": b"not a header\0"})
    assert custom_cache.mlx_headers(lib) == {
        "mlx/backend/cuda/device/utils.cuh": "// utils\n",
        "mlx/backend/cuda/device/config.h": "#define X 1\n"}
    _elf(lib, {"_ZN3mlx4coreL17jit_source_configE": b"#define X 1\n\0"})
    with pytest.raises(custom_cache.CompileError, match="no jit_source_utils"):
        custom_cache.mlx_headers(lib)
    (tmp_path / "text.so").write_bytes(b"not an ELF file at all")
    with pytest.raises(custom_cache.CompileError, match="not a 64-bit"):
        custom_cache.mlx_headers(tmp_path / "text.so")


def test_write_module_writes_what_mlx_reads(tmp_path):
    ptx = custom_cache.write_module(tmp_path / "cache", "custom_kernel_k_1_abc",
                                    "mlx::core::cu::custom_kernel_k_1", "_Z3kv", "src\n",
                                    b"\x7fELFcubin")
    assert ptx == tmp_path / "cache" / "custom_kernel_k_1_abc.ptx"
    assert ptx.read_bytes() == b"\x7fELFcubin"
    # read_cached_ptx: one "name<TAB>lowered name" line per kernel
    assert ptx.with_suffix(".txt").read_text() == "mlx::core::cu::custom_kernel_k_1\t_Z3kv\n"
    assert ptx.with_suffix(".cu").read_text() == "src\n"
    assert sorted(p.name for p in ptx.parent.iterdir()) == [
        "custom_kernel_k_1_abc.cu", "custom_kernel_k_1_abc.ptx", "custom_kernel_k_1_abc.txt"]
    with pytest.raises(ValueError, match="module name"):
        custom_cache.write_module(tmp_path, "m" * 246, "k", "l", "", b"")


def test_device_capability_from_either_field():
    assert custom_cache.device_capability({"compute_capability_major": 9,
                                           "compute_capability_minor": 0}) == (9, 0)
    assert custom_cache.device_capability({"architecture": "sm_86"}) == (8, 6)
    assert custom_cache.device_capability({"architecture": "sm_120a"}) == (12, 0)
    with pytest.raises(custom_cache.CompileError):
        custom_cache.device_capability({"architecture": "apple-m3"})


def _switched_model():
    """A model with the layer kinds the recipes look at, switched as a CUDA load switches
    them: a bf16 dense projection, a 4-bit (group 64) one, attention of head size 64 and a
    Gated DeltaNet layer (key heads of 32)."""
    import mlx.core as mx
    import mlx.nn as nn

    from app.engine.kernels import row_products

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = 64
            self.q_proj = nn.Linear(128, 128, bias=False)

    class GatedDeltaNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.A_log = mx.zeros((4,))
            self.head_k_dim, self.head_v_dim, self.num_k_heads, self.num_v_heads = 32, 64, 2, 4

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()
            self.linear_attn = GatedDeltaNet()
            self.down = nn.QuantizedLinear(128, 128, bias=False, group_size=64, bits=4)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [Layer()]
            self.norm = nn.RMSNorm(128)

    model = Model()
    model.set_dtype(mx.bfloat16)
    for _, m in model.named_modules():
        swap = row_products._SWAPS.get(type(m))
        if swap is not None:
            m.__class__ = swap
    return model


def test_custom_recipes_follow_the_switched_layers_and_the_mode(monkeypatch):
    model = _switched_model()
    monkeypatch.setattr(kernel_prebuild, "_custom_on", lambda: ("all", True))
    assert sorted(kernel_prebuild.custom_recipes(model)) == [
        ("gdn", ("bfloat16", "32", "64", "2", "4")),
        ("rows", ("bfloat16", "0", "32")), ("rows", ("bfloat16", "4", "64")),
        ("rows_attention", ("bfloat16", "64"))]
    # quantized layers only: no dense instance, no attention kernel
    monkeypatch.setattr(kernel_prebuild, "_custom_on", lambda: ("quantized", False))
    assert kernel_prebuild.custom_recipes(model) == [("rows", ("bfloat16", "4", "64"))]
    monkeypatch.setattr(kernel_prebuild, "_custom_on", lambda: ("0", False))
    assert kernel_prebuild.custom_recipes(model) == []


def test_custom_recipes_off_cuda_are_none(tiny_hybrid):
    # the CPU: nothing switched, no GDN kernel, so nothing to build
    target, drafter = tiny_hybrid
    assert kernel_prebuild.custom_recipes(target.model) == []
    assert not any(r[0] in kernel_prebuild.CUSTOM
                   for r in kernel_prebuild.recipes_for(target, [drafter]))


def test_custom_recipes_from_files_predict_the_loaded_ones(tmp_path, monkeypatch):
    import mlx.core as mx

    monkeypatch.setattr(kernel_prebuild, "_custom_on", lambda: ("all", True))
    config = {"model_type": "qwen3_5",
              "quantization": {"group_size": 64, "bits": 4,
                               "model.layers.0.mlp.gate_proj": {"group_size": 32, "bits": 8}},
              "text_config": {"hidden_size": 512, "num_attention_heads": 4, "head_dim": 256,
                              "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                              "linear_num_key_heads": 16, "linear_num_value_heads": 32}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    bf = mx.zeros((2,), dtype=mx.bfloat16)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), {
        "model.embed_tokens.weight": mx.zeros((2,), dtype=mx.uint32),
        "model.embed_tokens.scales": bf, "model.embed_tokens.biases": bf,
        "model.layers.0.mlp.gate_proj.weight": mx.zeros((2,), dtype=mx.uint32),
        "model.layers.0.mlp.gate_proj.scales": bf, "model.layers.0.mlp.gate_proj.biases": bf,
        "model.layers.0.linear_attn.A_log": mx.zeros((2,)),
        "model.layers.3.self_attn.q_proj.weight": mx.zeros((2,), dtype=mx.uint32),
        "model.layers.3.self_attn.q_proj.scales": bf,
        "model.layers.3.self_attn.q_proj.biases": bf,
        "model.layers.0.linear_attn.in_proj_ba.weight": bf,  # left dense
        "model.norm.weight": bf})
    assert sorted(kernel_prebuild.custom_recipes_from_files(tmp_path)) == [
        ("gdn", ("bfloat16", "128", "128", "16", "32")),
        ("rows", ("bfloat16", "0", "32")), ("rows", ("bfloat16", "4", "64")),
        ("rows", ("bfloat16", "8", "32")), ("rows_attention", ("bfloat16", "256"))]
    monkeypatch.setattr(kernel_prebuild, "_custom_on", lambda: ("0", False))
    assert kernel_prebuild.custom_recipes_from_files(tmp_path) == []
    assert kernel_prebuild.custom_recipes_from_files(tmp_path / "missing") == []


def test_a_custom_record_counts_only_for_the_same_kernel_sources(tmp_path, monkeypatch):
    recipe = ("rows", ("bfloat16", "4", "64"))
    kernel_prebuild.mark_built([recipe, ("silu", ("bfloat16",))], tmp_path)
    assert kernel_prebuild.built_before(tmp_path) == {recipe, ("silu", ("bfloat16",))}
    # a changed kernel source: MLX names its module anew, so the record no longer counts
    monkeypatch.setattr(kernel_prebuild, "_DIGEST", ["0123456789ab"])
    assert kernel_prebuild.built_before(tmp_path) == {("silu", ("bfloat16",))}


class _Child:
    """A child process that runs until someone waits for it."""

    returncode = 0

    def __init__(self, log, recipes):
        self.done, self.log, self.recipes = False, log, recipes

    def poll(self):
        return 0 if self.done else None

    def communicate(self, timeout=None):
        if not self.done:
            self.log.append(("waited", self.recipes))
        self.done = True
        return b"", b""


def test_load_starts_the_custom_kernels_in_children_of_their_own_and_the_warm_up_waits(
        tiny_hybrid, tmp_path, monkeypatch):
    """The custom kernels get a child each at load, after MLX's kernels' children (asking
    which are on imports mlx-lm); the warm-up waits for them before its own first passes
    (which then load them from the cache), and starts none again."""
    from app.engine import device, warmup

    log = []
    custom = [("rows", ("float16", "0", "32")), ("gdn", ("float16", "32", "32", "2", "2"))]

    def start(recipes, workers=None, stderr=None):
        log.append(("start", list(recipes), workers))
        groups = kernel_prebuild.split(list(recipes), workers or 3)
        return kernel_prebuild.Prebuild(0.0, groups, [_Child(log, g) for g in groups])

    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    monkeypatch.setattr(device, "backend", lambda mx=None: "CUDA")
    monkeypatch.setattr(kernel_prebuild, "start", start)
    monkeypatch.setattr(kernel_prebuild, "custom_recipes_from_files",
                        lambda folder, dtypes=None: custom)
    monkeypatch.setattr(kernel_prebuild, "custom_recipes", lambda model: custom)
    monkeypatch.setattr(warmup, "build_gdn_kernel", lambda t: log.append(("gdn here",)))
    target, drafter = tiny_hybrid
    try:
        assert kernel_prebuild.start_early(target.path, [drafter.path]) is not None
        starts = [e for e in log if e[0] == "start"]
        assert starts[-1] == ("start", custom, 2) and len(starts) == 2  # one child each
        warmup._prebuild(target, [drafter], [])
    finally:
        for job in kernel_prebuild._BACKGROUND:
            job.wait()
        kernel_prebuild._BACKGROUND.clear()
    waits = [i for i, e in enumerate(log) if e[0] == "waited" and set(e[1]) & set(custom)]
    assert len(waits) == 2 and max(waits) < log.index(("gdn here",))
    assert sum(1 for e in log if e[0] == "start" and set(e[1]) & set(custom)) == 1


def test_children_import_the_model_files_without_transformers():
    """A prebuild child imports the project's kernel modules (they import mlx-lm's ``cache``
    and ``gated_delta`` files) without mlx-lm's package ``__init__``, which imports
    transformers (and PyTorch where installed: 15-20 s a child on a GPU host)."""
    code = textwrap.dedent("""
        import sys
        from app.engine.kernels import kernel_prebuild
        kernel_prebuild.models_without_package_init()
        from app.engine.kernels import gdn_kernel, row_attention, row_products
        kernel_prebuild.run_recipe("swiglu", ("float32",))  # mlx-lm's file loaded by path
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "torch")),
              sys.modules["mlx_lm.models.cache"].__file__.endswith("mlx_lm/models/cache.py"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True"]


def test_the_kernel_calls_pass_what_the_kernels_take(monkeypatch):
    """Each kernel's call, made through the kernel module's own function (as a reply makes
    it) and by ``instance_call`` (as a prebuild child makes it), passes the template, grid,
    block and outputs the kernel source is written for: MLX's kernel object is replaced by a
    recorder (off CUDA it cannot run)."""
    import mlx.core as mx

    from app.engine.kernels import gdn_kernel, row_attention
    from app.engine.kernels import row_products as rp

    calls = []

    def fake(**call):
        calls.append(call)
        return [mx.zeros(s, dtype=d) for s, d in zip(call["output_shapes"], call["output_dtypes"])]

    bf = mx.bfloat16
    monkeypatch.setattr(rp, "_KERNELS", {False: fake, True: fake})
    x = mx.zeros((3, 256), dtype=bf)
    rp.rows_matmul(x, mx.zeros((40, 256), dtype=bf))
    w, s, b = mx.quantize(mx.zeros((40, 256)), 64, 4)
    rp.rows_quantized_matmul(x, w, s.astype(bf), b.astype(bf), 64, 4)
    _, dense = rp.instance_call(bf)
    _, quant = rp.instance_call(bf, 4, 64)
    for call, bits, group, n in ((calls[0], 0, 32, 40), (calls[1], 4, 64, 40),
                                 (dense, 0, 32, 8), (quant, 4, 64, 8)):
        assert call["template"] == [("T", bf), ("Bits", bits), ("Gs", group), ("NT", 1),
                                    ("KSplit", 4)]
        assert call["grid"] == (32, 4 * -(-n // 8), 1) and call["threadgroup"] == (32, 4, 1)
        assert call["output_dtypes"] == [bf]
    assert calls[0]["output_shapes"] == [(3, 40)] and dense["output_shapes"] == [(1, 8)]
    assert [a.dtype for a in calls[1]["inputs"]] == [a.dtype for a in quant["inputs"]] == [
        bf, mx.uint32, bf, bf]

    monkeypatch.setattr(row_attention, "_KERNEL", [fake])
    q, k = mx.zeros((1, 8, 2, 64), dtype=bf), mx.zeros((1, 2, 5, 64), dtype=bf)
    row_attention.kernel_attention(q, k, k, 0.125)
    _, one = row_attention.instance_call(bf, 64)
    for call, heads, n in ((calls[2], 8, 2), (one, 1, 1)):
        assert call["template"] == [("T", bf), ("D", 64)]
        assert call["grid"] == (1024 * heads, n, 1) and call["threadgroup"] == (1024, 1, 1)
        assert [a.dtype for a in call["inputs"]] == [bf, bf, bf, mx.float32]
    assert calls[2]["output_shapes"] == [q.shape]

    monkeypatch.setattr(gdn_kernel, "_kernel", lambda: fake)
    f32 = mx.float32
    q, v = mx.zeros((1, 3, 2, 32), dtype=bf), mx.zeros((1, 3, 4, 16), dtype=bf)
    gdn_kernel.cuda_gated_delta(q, q, v, mx.zeros((1, 3, 4), dtype=f32),
                                mx.zeros((1, 3, 4), dtype=bf), mx.zeros((1, 4, 16, 32), dtype=f32))
    _, step = gdn_kernel.instance_call(bf, 32, 16, 2, 4)
    for call, t in ((calls[3], 3), (step, 1)):
        assert call["template"] == [("InT", bf), ("StT", f32), ("Dk", 32), ("Dv", 16),
                                    ("Hk", 2), ("Hv", 4)]
        assert call["grid"] == (32, 16, 4) and call["threadgroup"] == (32, 4, 1)
        assert call["output_shapes"] == [(1, t, 4, 16), (1, 4, 16, 32)]
        assert [a.dtype for a in call["inputs"]] == [bf, bf, bf, f32, bf, f32]


def _cuda() -> bool:
    try:
        from app.engine.kernels.row_products import on_cuda

        return on_cuda()
    except Exception:
        return False


CHILD = textwrap.dedent("""
    import json, sys
    import mlx.core as mx
    from pathlib import Path
    from app.engine.kernels import custom_cache, row_products
    kernel, call = row_products.instance_call(mx.bfloat16, 4, 64)
    if sys.argv[1] == "build":
        print(custom_cache.build(kernel, Path(sys.argv[2]), **call))
    else:
        mx.random.seed(0)
        x = mx.random.normal((3, 256)).astype(mx.bfloat16)
        w, s, b = mx.quantize(mx.random.normal((64, 256)).astype(mx.bfloat16), 64, 4)
        y = row_products.rows_quantized_matmul(x, w, s, b, 64, 4)
        print(json.dumps(y.astype(mx.float32).tolist()))
""")


def _child(*args: str, cache: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, MLX_PTX_CACHE_DIR=str(cache), PYTHONPATH=path)
    return subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


@pytest.mark.skipif(not _cuda(), reason="needs MLX's CUDA backend (compute capability 8.0+)")
def test_on_cuda_mlx_loads_the_written_module_and_computes_the_same(tmp_path):
    built = tmp_path / "built"
    out = _child("build", str(built), cache=tmp_path / "unused")
    assert out.returncode == 0, out.stderr
    ptx = Path(out.stdout.strip().splitlines()[-1])
    assert ptx.parent == built and ptx.exists()
    mine = _child("run", cache=built)
    theirs = _child("run", cache=tmp_path / "empty")  # MLX compiles it itself
    assert mine.returncode == 0 and theirs.returncode == 0, mine.stderr + theirs.stderr
    assert mine.stdout == theirs.stdout  # bit for bit
    # MLX did read the written module: with a wrong lowered name its load fails
    txt = ptx.with_suffix(".txt")
    txt.write_text(txt.read_text().split("\t")[0] + "\t_Z_no_such_kernel\n")
    assert _child("run", cache=built).returncode != 0
