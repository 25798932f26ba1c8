"""The row-stable products of app/engine/kernels/row_products.py.

On the CPU (CI): the switch leaves a model alone off CUDA, the subclasses compute what their
bases compute when no row product applies, and bad shapes get a ValueError. On MLX's CUDA
backend (the H200 host, ``tools/gpu_measure.sh rows``): the kernel agrees with a float32
product on the CPU and each row of a 16-row call equals that row multiplied alone, bit for
bit, however many 8-column tiles a block takes.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from app.engine.kernels import row_products as rp


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 128)
        self.proj = nn.Linear(128, 96, bias=False)
        self.out = nn.Linear(96, 128, bias=True)


def _f32(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def test_switch_leaves_a_model_alone_off_cuda(monkeypatch):
    monkeypatch.setattr(rp, "on_cuda", lambda: False)
    model = _Tiny()
    assert rp.use_row_stable_products(model) == 0
    assert type(model.proj) is nn.Linear


def test_switch_leaves_a_model_alone_when_asked_on_cuda(monkeypatch):
    """``DFLASH_ROW_PRODUCTS=0``: a CUDA model keeps MLX's layer classes (nothing to pay)."""
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "0")
    model = _Tiny()
    assert rp.use_row_stable_products(model) == 0
    assert type(model.proj) is nn.Linear and type(model.embed) is nn.Embedding


def test_switch_is_on_by_default_on_cuda(monkeypatch):
    """Exact by default: unset, a CUDA model's products are switched to the row kernel."""
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.delenv("DFLASH_ROW_PRODUCTS", raising=False)
    model = _Tiny()
    assert rp.use_row_stable_products(model) == 3
    assert type(model.proj) is rp.RowStableLinear


def test_switch_keeps_parameters_and_is_idempotent(monkeypatch):
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "all")
    model = _Tiny()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p == "proj")
    before = dict(tree_flatten(model.parameters()))
    assert rp.use_row_stable_products(model) == 3
    assert rp.use_row_stable_products(model) == 0
    assert type(model.proj) is rp.RowStableQuantizedLinear
    assert type(model.out) is rp.RowStableLinear
    assert type(model.embed) is rp.RowStableEmbedding
    assert isinstance(model.out, nn.Linear)
    after = dict(tree_flatten(model.parameters()))
    assert before.keys() == after.keys()


def test_mode_reads_the_environment_and_is_all_by_default(monkeypatch):
    monkeypatch.delenv("DFLASH_ROW_PRODUCTS", raising=False)
    assert rp.mode() == "all"
    for value in rp.MODES:
        monkeypatch.setenv("DFLASH_ROW_PRODUCTS", value)
        assert rp.mode() == value
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "fast")
    assert rp.mode() == "all"


def test_switched_modules_compute_as_their_bases_when_off(monkeypatch):
    """With DFLASH_ROW_PRODUCTS=0, or more than 16 rows, they are their base classes' call."""
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    mx.random.seed(3)
    model = _Tiny()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p == "proj")
    model.set_dtype(mx.bfloat16)
    x = mx.random.normal((1, 4, 128)).astype(mx.bfloat16)
    want_out = model.out(model.proj(x))
    want_head = model.embed.as_linear(x)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "all")
    assert rp.use_row_stable_products(model) == 3
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "0")
    assert np.array_equal(_f32(model.out(model.proj(x))), _f32(want_out))
    assert np.array_equal(_f32(model.embed.as_linear(x)), _f32(want_head))
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "all")
    big = mx.random.normal((1, 17, 128)).astype(mx.bfloat16)  # more rows than a block
    assert np.array_equal(_f32(model.embed.as_linear(big)),
                          _f32(nn.Embedding.as_linear(model.embed, big)))


def test_a_subclass_of_a_switched_layer_calls_the_base_product(monkeypatch):
    """A switched layer's fallback names its base: a subclass of the switched class (as
    tools/probe_rows.py makes) once recursed into itself."""
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "all")
    layer = nn.Linear(128, 96, bias=False)
    rp.use_row_stable_products(layer)
    layer.__class__ = type("Probe", (type(layer),), {})
    x = mx.random.normal((1, 17, 128))  # more rows than the kernel takes: the base's product
    assert np.array_equal(_f32(layer(x)), _f32(x @ layer["weight"].T))


def test_dense_products_the_kernel_does_not_take():
    bf = mx.bfloat16
    assert rp._dense_fits(mx.zeros((1, 1, 128), bf), mx.zeros((96, 128), bf))
    # float32, K not a multiple of 128, or more than 16 rows: MLX's own product
    assert not rp._dense_fits(mx.zeros((1, 1, 128)), mx.zeros((96, 128)))
    assert not rp._dense_fits(mx.zeros((1, 1, 96), bf), mx.zeros((96, 96), bf))
    assert not rp._dense_fits(mx.zeros((1, 17, 128), bf), mx.zeros((96, 128), bf))


class _FakeKernel:
    """Stands in for ``mx.fast.cuda_kernel`` on the CPU: records each call, returns zeros."""

    def __init__(self):
        self.calls = []

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        self.calls.append(dict(inputs=inputs, template=dict(template), grid=grid,
                               shape=output_shapes[0]))
        return [mx.zeros(output_shapes[0], output_dtypes[0])]


@pytest.mark.parametrize("way,dense_rows,quantized_rows", [
    ("0", (), ()), ("all", (1, 16), (1, 16)), ("quantized", (), (1, 16)),
    ("quantized-verify", (), (16,))])
def test_each_mode_takes_the_products_it_names(monkeypatch, way, dense_rows, quantized_rows):
    monkeypatch.setattr(rp, "_kernel", lambda quantized: _FakeKernel())
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", way)
    model = _Tiny()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p == "proj")
    model.set_dtype(mx.bfloat16)
    rp.use_row_stable_products(model)
    for rows in (1, 16):
        x = mx.zeros((1, rows, 128), mx.bfloat16)
        assert (rp._plan(model.embed, x) is not None) == (rows in dense_rows), (way, rows)
        assert (rp._plan(model.proj, x) is not None) == (rows in quantized_rows), (way, rows)


def test_a_plan_is_built_once_per_dtype_and_width_and_follows_a_new_weight(monkeypatch):
    fake = _FakeKernel()
    monkeypatch.setattr(rp, "_kernel", lambda quantized: fake)
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "quantized")
    layer = nn.QuantizedLinear(256, 80, bias=True, group_size=64, bits=4)
    layer.update({"bias": mx.arange(80, dtype=mx.float32) + 1})
    layer.set_dtype(mx.bfloat16)
    rp.use_row_stable_products(layer)
    x = mx.zeros((1, 16, 256), mx.bfloat16)
    y = layer(x)
    first = rp._plan(layer, x)
    assert layer(x[:, :1]).shape == (1, 1, 80) and rp._plan(layer, x[:, :1]) is first
    assert y.shape == (1, 16, 80) and len(fake.calls) == 2
    assert np.array_equal(_f32(y)[0, 5], _f32(layer["bias"]))  # the stub's zeros + the bias
    call = fake.calls[0]
    assert call["inputs"][0].shape == x.shape  # x goes in as it is: no reshape
    assert call["template"] == {"T": mx.bfloat16, "Bits": 4, "Gs": 64, "NT": rp.TILES,
                                "KSplit": rp.K_SPLIT}
    assert call["grid"] == (32, rp.K_SPLIT * math.ceil(80 / (8 * rp.TILES)), 1)
    assert call["shape"] == (1, 16, 80)
    layer.update({"weight": mx.array(layer["weight"])})  # new weights: a new plan
    assert rp._plan(layer, x) is not first and rp._plan(layer, x).inputs[0] is layer["weight"]
    plan = rp._plan(layer, x)
    layer.update({"scales": layer["scales"] * 2})  # new scales alone: a new plan too
    assert rp._plan(layer, x) is not plan and rp._plan(layer, x).inputs[1] is layer["scales"]
    assert rp._plan(layer, mx.zeros((1, 17, 256), mx.bfloat16)) is None  # prefill
    assert rp._plan(layer, mx.zeros((1, 2, 256))) is None  # float32: MLX's product
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "0")
    assert rp._plan(layer, x) is None


class _MatmulKernel(_FakeKernel):
    """A CPU stand-in that computes the product (dense weights): ``x @ w.T``."""

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        super().__call__(inputs=inputs, template=template, grid=grid, threadgroup=threadgroup,
                         output_shapes=output_shapes, output_dtypes=output_dtypes)
        return [(inputs[0] @ inputs[1].T).astype(output_dtypes[0])]


def test_a_plan_replays_its_kernel_call_once_traced_per_row_count(monkeypatch):
    """Each call of a plan goes through ``mx.compile``: the kernel's Python front end runs
    once per input shape (the trace), not once per call, and the replay gives the same
    values as a direct call."""
    fake = _MatmulKernel()
    monkeypatch.setattr(rp, "_kernel", lambda quantized: fake)
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "all")
    mx.random.seed(5)
    layer = nn.Linear(128, 24, bias=False)
    layer.set_dtype(mx.bfloat16)
    rp.use_row_stable_products(layer)
    for step in range(3):
        for rows in (1, 16):
            x = mx.random.normal((1, rows, 128)).astype(mx.bfloat16)
            got = layer(x)
            want = x @ layer["weight"].T
            assert np.array_equal(_f32(got), _f32(want)), (step, rows)
    assert [c["shape"] for c in fake.calls] == [(1, 1, 24), (1, 16, 24)]


def test_a_layer_called_before_its_cast_takes_the_kernel_once_cast(monkeypatch):
    """A bfloat16 call before ``set_dtype(bfloat16)`` finds no plan (float32 scales); the
    cast gives the layer new scales, so the next call works the answer out again instead of
    keeping that None."""
    monkeypatch.setattr(rp, "_kernel", lambda quantized: _FakeKernel())
    monkeypatch.setattr(rp, "on_cuda", lambda: True)
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "quantized")
    layer = nn.QuantizedLinear(256, 80, bias=False, group_size=64, bits=4)
    rp.use_row_stable_products(layer)
    assert rp._plan(layer, mx.zeros((1, 2, 256), mx.bfloat16)) is None
    layer.set_dtype(mx.bfloat16)
    assert rp._plan(layer, mx.zeros((1, 2, 256), mx.bfloat16)) is not None


def test_bad_shapes_raise_value_error():
    bf = mx.bfloat16
    with pytest.raises(ValueError, match="at most 16 rows"):
        rp.rows_matmul(mx.zeros((17, 128), bf), mx.zeros((8, 128), bf))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        rp.rows_matmul(mx.zeros((1, 128)), mx.zeros((8, 128)))
    with pytest.raises(ValueError, match="bits 3"):
        rp.rows_quantized_matmul(mx.zeros((1, 128), bf), mx.zeros((8, 12), mx.uint32),
                                 mx.zeros((8, 2), bf), mx.zeros((8, 2), bf), 64, 3)
    with pytest.raises(ValueError, match="biases must be given"):
        rp.rows_quantized_matmul(mx.zeros((1, 128), bf), mx.zeros((8, 16), mx.uint32),
                                 mx.zeros((8, 2), bf), None, 64, 4)
    with pytest.raises(ValueError, match=r"\(uint32, 2-D\)"):  # a dense weight: not packed
        rp.rows_quantized_matmul(mx.zeros((1, 128), bf), mx.zeros((8, 16), bf),
                                 mx.zeros((8, 2), bf), mx.zeros((8, 2), bf), 64, 4)


def test_kernel_source_names_what_the_calls_pass():
    assert "x_shape[x_ndim - 1]" in rp.SOURCE and "w_shape[0]" in rp.SOURCE
    for name in ("NT", "KSplit", "Bits", "Gs"):
        assert name in rp.SOURCE
    assert "mma.sync.aligned.m16n8k16" in rp.HEADER



@pytest.mark.parametrize("text", [rp.HEADER, rp.SOURCE])
def test_the_kernel_is_built_from_its_source_less_comments(text):
    """``compact`` drops comments, indentation and blank lines and nothing else: the tokens
    are those of the source with its comments removed, and preprocessor lines stay lines."""
    short = rp.compact(text)
    uncommented = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
    assert short.split() == uncommented.split()
    assert "//" not in short and len(short) < 0.75 * len(text)
    assert "#pragma unroll" in short.splitlines()


cuda = pytest.mark.skipif(not rp.on_cuda(), reason="needs MLX's CUDA backend")


def _reference(x: mx.array, w: mx.array) -> np.ndarray:
    """``x @ w.T`` in float32 on the CPU (MLX's float32 matmul on CUDA rounds to TF32)."""
    return np.array(mx.matmul(x.astype(mx.float32), w.astype(mx.float32).T, stream=mx.cpu))


@cuda
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("n,k", [(96, 128), (2561, 2560), (1024, 9216)])
@pytest.mark.parametrize("tiles", [1, 2, 4])
def test_dense_kernel_matches_matmul_and_rows_are_independent(dtype, n, k, tiles, monkeypatch):
    monkeypatch.setattr(rp, "TILES", tiles)
    mx.random.seed(0)
    w = (0.05 * mx.random.normal((n, k))).astype(dtype)
    x = mx.random.normal((1, 16, k)).astype(dtype)
    y = rp.rows_matmul(x, w)
    assert y.shape == (1, 16, n) and y.dtype == dtype
    assert np.allclose(_f32(y), _reference(x, w), atol=0.05, rtol=2e-2)
    for rows in (1, 2, 5, 8, 16):
        part = rp.rows_matmul(x[:, :rows], w)
        assert np.array_equal(_f32(part)[0], _f32(y)[0, :rows]), rows
    one = rp.rows_matmul(x[:, 9:10], w)
    assert np.array_equal(_f32(one)[0, 0], _f32(y)[0, 9])


@cuda
@pytest.mark.parametrize("bits,group", [(4, 64), (4, 32), (8, 64), (4, 128)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_quantized_kernel_matches_and_rows_are_independent(bits, group, dtype):
    mx.random.seed(1)
    n, k = 2560, 2560
    w = (0.05 * mx.random.normal((n, k))).astype(dtype)
    wq, scales, biases = mx.quantize(w, group_size=group, bits=bits)
    x = mx.random.normal((1, 16, k)).astype(dtype)
    y = rp.rows_quantized_matmul(x, wq, scales, biases, group, bits)
    assert y.shape == (1, 16, n) and y.dtype == dtype
    dq = mx.dequantize(wq, scales, biases, group_size=group, bits=bits)
    assert np.allclose(_f32(y), _reference(x, dq), atol=0.1, rtol=2e-2)
    for rows in (1, 2, 5, 8, 16):
        part = rp.rows_quantized_matmul(x[:, :rows], wq, scales, biases, group, bits)
        assert np.array_equal(_f32(part)[0], _f32(y)[0, :rows]), rows
    one = rp.rows_quantized_matmul(x[:, 9:10], wq, scales, biases, group, bits)
    assert np.array_equal(_f32(one)[0, 0], _f32(y)[0, 9])


@cuda
def test_a_layers_traced_calls_equal_the_kernel_called_directly(monkeypatch):
    """A switched layer calls the kernel through ``mx.compile``; the replay gives the direct
    call's values bit for bit, for 1 and 16 rows and again on a second call."""
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "all")
    mx.random.seed(2)
    layer = nn.QuantizedLinear(2560, 1024, bias=False, group_size=64, bits=4)
    layer.set_dtype(mx.bfloat16)
    assert rp.use_row_stable_products(layer) == 1
    for _ in range(2):
        for rows in (1, 16):
            x = mx.random.normal((1, rows, 2560)).astype(mx.bfloat16)
            direct = rp.rows_quantized_matmul(x, layer["weight"], layer["scales"],
                                              layer["biases"], 64, 4)
            assert np.array_equal(_f32(layer(x)), _f32(direct)), rows


def test_a_gpu_without_the_kernels_tensor_cores_keeps_mlxs_products(monkeypatch):
    """The kernel's MMA needs compute capability 8.0: a Turing GPU (7.5), or an MLX that does
    not say, is not switched."""
    monkeypatch.setattr(rp, "backend", lambda: "CUDA")
    for info, want in (({"compute_capability_major": 7}, False),
                       ({"compute_capability_major": 9}, True), ({}, False),
                       ({"architecture": "sm_90"}, True), ({"architecture": "sm_75"}, False),
                       ({"architecture": "x86_64"}, False)):
        monkeypatch.setattr(rp, "_CAPABILITY", [])
        monkeypatch.setattr(mx, "device_info", lambda info=info: info)
        assert rp.on_cuda() is want
    monkeypatch.setattr(rp, "backend", lambda: "CPU")
    assert rp.on_cuda() is False


def test_version_text_says_which_kernels_a_cuda_target_takes(monkeypatch):
    from app.cli import version_text

    monkeypatch.setattr(rp, "backend", lambda: "CPU")
    assert rp.describe() is None
    assert not any(ln.startswith("products and attention") for ln in version_text().splitlines())
    monkeypatch.setattr(rp, "backend", lambda: "CUDA")
    monkeypatch.setattr(rp, "_CAPABILITY", [9])
    monkeypatch.delenv("DFLASH_ROW_PRODUCTS", raising=False)
    assert "the row kernels (DFLASH_ROW_PRODUCTS=all, the default)" in version_text()
    monkeypatch.setenv("DFLASH_ROW_PRODUCTS", "0")
    assert rp.describe().endswith("DFlash may leave plain decoding's tokens")
    monkeypatch.setattr(rp, "_CAPABILITY", [7])
    assert "need compute capability 8.0" in rp.describe()
