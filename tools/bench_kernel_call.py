"""Host cost of one product under each way into MLX's CUDA backend (JSON; a benchmark, nothing
asserted).

    python tools/bench_kernel_call.py [--calls 2000] [--chain 64] [--ptx FILE] [--out FILE]
    python tools/bench_kernel_call.py --write-cu rows.cu   # then, where nvcc is:
    nvcc -std=c++17 -arch=compute_80 -ptx rows.cu -o rows.ptx   # the --ptx file

Issue #21: ``app/engine/kernels/row_products.py``'s kernel multiplies 16 rows in a third of MLX's GPU
time, but each ``mx.fast.cuda_kernel`` call cost about 16 us more host time than one of MLX's
own operations, and a step of a Qwen3.5-4B-shaped target makes ~250 products. This script
takes that cost apart on one 2560 x 2560 weight (bf16, and 4-bit affine with group 64):

* ``build_us``: microseconds to build one product's lazy graph (nothing run), per way:
  ``mlx`` (``mx.quantized_matmul`` / ``x @ w.T``), ``plan`` (the module's cached kernel call,
  through ``mx.compile``, weights as inputs), ``plan_constants`` (the same with the weights
  as constants of the trace), ``layer`` (the switched layer's call, as the model makes it),
  ``launch`` (the kernel object called with prebuilt arguments, no trace),
  ``trivial`` (a one-line ``cuda_kernel``: the front end's fixed cost), ``precompiled_trivial``
  (``mx.fast.precompiled_cuda_kernel`` on a 1 KB PTX), ``precompiled`` (the row kernel's PTX
  from ``--ptx``, if given), ``compiled_mlx`` (MLX's product through ``mx.compile``) and
  ``compiled_group4`` (four products sharing x in one compiled function, per product);
* ``encode_us`` / ``run_us``: microseconds per product inside ``mx.async_eval`` of 256
  independent 1-row products built beforehand (where MLX's CUDA backend does its per-operation
  host work: for a custom kernel it hashes the whole kernel source on every call), and until
  they have all run;
* ``chain_us``: microseconds per product of ``--chain`` dependent products built and run
  (1 and 16 rows), for the ways that compute the product.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: A copy kernel in PTX (nvcc 13.0, ``-arch=compute_80 -ptx``): the smallest precompiled call.
TRIVIAL_PTX = r"""
.version 8.0
.target sm_80
.address_size 64

.visible .entry dflash_copy(
	.param .u64 dflash_copy_param_0,
	.param .u64 dflash_copy_param_1,
	.param .u32 dflash_copy_param_2
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .f32 	%f<2>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [dflash_copy_param_0];
	ld.param.u64 	%rd2, [dflash_copy_param_1];
	ld.param.u32 	%r2, [dflash_copy_param_2];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	cvta.to.global.u64 	%rd3, %rd1;
	mul.wide.s32 	%rd4, %r1, 4;
	add.s64 	%rd5, %rd3, %rd4;
	ld.global.f32 	%f1, [%rd5];
	cvta.to.global.u64 	%rd6, %rd2;
	add.s64 	%rd7, %rd6, %rd4;
	st.global.f32 	[%rd7], %f1;
$L__BB0_2:
	ret;
}
"""


def cuda_source() -> str:
    """The row kernel (``app/engine/kernels/row_products.py``'s HEADER and SOURCE) as a stand-alone CUDA
    file for ``nvcc``: ``rows_bf16_q4_g64(x, w, scales, biases, y, M, K, N)`` and
    ``rows_bf16_dense(x, w, y, M, K, N)``, with M, K, N as scalars instead of MLX's shapes."""
    from app.engine.kernels import row_products as rp

    shapes = """    int M = 1;
    for (int d = 0; d < x_ndim - 1; ++d) {
      M *= x_shape[d];
    }
    const int K = x_shape[x_ndim - 1];
    const int N = w_shape[0];"""
    if shapes not in rp.SOURCE:
        raise SystemExit("the kernel no longer reads its sizes as this script expects")
    bf = "__nv_bfloat16"
    return ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + rp.HEADER
            + "template <typename T, int Bits, int Gs, int NT, int KSplit, typename W>\n"
            "__device__ __forceinline__ void body(const T* x, const W* w, const T* scales, "
            "const T* biases, T* y, int M, int K, int N) {\n"
            + rp.SOURCE.replace(shapes, "") + "}\n"
            f'extern "C" __global__ void rows_bf16_q4_g64(const {bf}* x, const unsigned int* w, '
            f"const {bf}* s, const {bf}* b, {bf}* y, int M, int K, int N) {{\n"
            f"  body<{bf}, 4, 64, {rp.TILES}, {rp.K_SPLIT}>(x, w, s, b, y, M, K, N);\n}}\n"
            f'extern "C" __global__ void rows_bf16_dense(const {bf}* x, const {bf}* w, {bf}* y, '
            f"int M, int K, int N) {{\n  body<{bf}, 0, 32, {rp.TILES}, {rp.K_SPLIT}>(x, w, "
            f"(const {bf}*)nullptr, (const {bf}*)nullptr, y, M, K, N);\n}}\n")


def per_call_us(fn, calls: int) -> float:
    """Median over 5 rounds of the microseconds one ``fn()`` takes (graph building only)."""
    fn()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append(1e6 * (time.perf_counter() - t0) / calls)
    return sorted(rounds)[2]


def chain_us(prod, x, n: int) -> float:
    """Microseconds per product of ``n`` dependent products ``x = prod(x)`` built and run
    (median of 5)."""
    import mlx.core as mx

    def once():
        y = x
        for _ in range(n):
            y = prod(y)
        mx.eval(y)

    once()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        once()
        rounds.append(1e6 * (time.perf_counter() - t0) / n)
    return sorted(rounds)[2]


def encode_us(fn, inputs: list) -> tuple[float, float]:
    """``(encode, run)``: microseconds per product spent inside ``mx.async_eval`` for
    ``len(inputs)`` independent products built beforehand (the backend's per-operation work:
    kernel lookup, arguments, graph node) and per product until all have run (median of 5)."""
    import mlx.core as mx

    mx.eval([fn(v) for v in inputs[:2]])
    enc, run = [], []
    for _ in range(5):
        outs = [fn(v) for v in inputs]
        t0 = time.perf_counter()
        mx.async_eval(outs)
        t1 = time.perf_counter()
        mx.eval(outs)
        t2 = time.perf_counter()
        enc.append(1e6 * (t1 - t0) / len(inputs))
        run.append(1e6 * (t2 - t0) / len(inputs))
    return sorted(enc)[2], sorted(run)[2]


def measure_dtype(label: str, calls: int, chain: int, ptx_text: bytes | None) -> dict:
    """The figures of one weight (``bfloat16`` or ``4bit``), per way (see the module doc)."""
    import os

    import mlx.core as mx
    import mlx.nn as nn

    from app.engine.kernels import row_products as rp

    k = n = 2560
    mx.random.seed(0)
    dtype = mx.bfloat16
    w = (mx.random.normal((n, k)) * 0.02).astype(dtype)
    if label == "4bit":
        layer = nn.QuantizedLinear(k, n, bias=False, group_size=64, bits=4)
        qw, s, b = mx.quantize(w, group_size=64, bits=4)
        layer.update({"weight": qw, "scales": s, "biases": b})
        mlx_prod = lambda v: mx.quantized_matmul(v, qw, s, b, True, 64, 4)  # noqa: E731
        pc_name, pc_inputs = "rows_bf16_q4_g64", [qw, s, b]
    else:
        layer = nn.Linear(k, n, bias=False)
        layer.update({"weight": w})
        mlx_prod = lambda v: v @ w.T  # noqa: E731
        pc_name, pc_inputs = "rows_bf16_dense", [w]
    mx.eval(layer.parameters())
    layer.__class__ = rp._SWAPS[type(layer)]
    os.environ["DFLASH_ROW_PRODUCTS"] = "all"
    ways = {"mlx": mlx_prod, "layer": layer}
    x1 = mx.zeros((1, 1, k), dtype)
    plan = rp._plan(layer, x1)
    ways["launch"] = plan.launch
    ways["plan_constants"] = mx.compile(lambda v: plan.launch(v))
    ways["plan"] = plan
    ways["compiled_mlx"] = mx.compile(mlx_prod)
    if ptx_text is not None:
        def pre(v, _n=pc_name, _i=pc_inputs):
            rows = v.size // k
            return mx.fast.precompiled_cuda_kernel(
                name=_n, compiled_source=ptx_text, inputs=[v, *_i],
                output_shapes=[(*v.shape[:-1], n)], output_dtypes=[dtype],
                scalars=[rows, k, n], grid=(32, 4 * (n // 8), 1),
                threadgroup=(32, 4, 1))[0]
        ways["precompiled"] = pre
    four = mx.compile(lambda v: [plan(v), plan(v + 0), plan(v * 1), plan(v - 0)])
    mlx_four = mx.compile(lambda v: [mlx_prod(v), mlx_prod(v + 0), mlx_prod(v * 1),
                                     mlx_prod(v - 0)])
    xr = mx.random.normal((1, 16, k)).astype(dtype)
    mx.eval(xr)
    block = {"build_us": {}, "encode_us": {}, "run_us": {}, "chain1_us": {}, "chain16_us": {},
             "max_abs_vs_plan": {}}
    singles = [mx.random.normal((1, 1, k)).astype(dtype) for _ in range(256)]
    mx.eval(singles)
    for name, fn in ways.items():
        ref = plan(xr) if name != "mlx" else None
        out = fn(xr)
        if ref is not None:
            block["max_abs_vs_plan"][name] = float(mx.max(mx.abs(
                out.astype(mx.float32) - ref.astype(mx.float32))).item())
        block["build_us"][name] = per_call_us(lambda fn=fn: fn(x1), calls)
        block["encode_us"][name], block["run_us"][name] = encode_us(fn, singles)
        x16 = xr / 16
        block["chain1_us"][name] = chain_us(fn, x1 + 0.01, chain)
        block["chain16_us"][name] = chain_us(fn, x16, chain)
        print(label, name, json.dumps({kk: v.get(name) for kk, v in block.items()}),
              file=sys.stderr, flush=True)
    block["build_us"]["compiled_group4_per_product"] = per_call_us(
        lambda: four(x1), calls) / 4
    block["build_us"]["compiled_mlx_group4_per_product"] = per_call_us(
        lambda: mlx_four(x1), calls) / 4
    os.environ.pop("DFLASH_ROW_PRODUCTS", None)
    return block


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--chain", type=int, default=64)
    p.add_argument("--ptx", type=Path, help="the row kernel as PTX (extern \"C\" rows_<dtype>_"
                   "q4_g64 / rows_<dtype>_dense with scalars M, K, N)")
    p.add_argument("--write-cu", type=Path, help="write the kernel as a CUDA file and stop")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.write_cu:
        args.write_cu.write_text(cuda_source())
        return 0

    import mlx.core as mx

    k = n = 2560
    result = {"device": str(mx.default_device()), "mlx": mx.__version__, "k": k, "n": n}
    triv_in = mx.zeros((32,), mx.float32)
    trivial = mx.fast.cuda_kernel(name="dflash_triv", input_names=["x"], output_names=["y"],
                                  source="y[threadIdx.x] = x[threadIdx.x];")
    trivial_8k = mx.fast.cuda_kernel(name="dflash_triv8k", input_names=["x"],
                                     output_names=["y"], header="//" + " " * 8000 + "\n",
                                     source="y[threadIdx.x] = x[threadIdx.x];")
    ptx = TRIVIAL_PTX.encode()
    fixed = {
        "trivial": lambda: trivial(inputs=[triv_in], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                                   output_shapes=[(32,)], output_dtypes=[mx.float32]),
        "trivial_8k": lambda: trivial_8k(inputs=[triv_in], grid=(32, 1, 1),
                                         threadgroup=(32, 1, 1), output_shapes=[(32,)],
                                         output_dtypes=[mx.float32]),
        "precompiled_trivial": lambda: mx.fast.precompiled_cuda_kernel(
            name="dflash_copy", compiled_source=ptx, inputs=[triv_in],
            output_shapes=[(32,)], output_dtypes=[mx.float32], scalars=[32],
            grid=(32, 1, 1), threadgroup=(32, 1, 1)),
        "precompiled_trivial_25k": lambda: mx.fast.precompiled_cuda_kernel(
            name="dflash_copy", compiled_source=ptx + b"\n//" + b" " * 25000 + b"\n",
            inputs=[triv_in], output_shapes=[(32,)], output_dtypes=[mx.float32],
            scalars=[32], grid=(32, 1, 1), threadgroup=(32, 1, 1)),
        "zeros_like": lambda: mx.zeros_like(triv_in),
        "add": lambda: triv_in + triv_in,
    }
    mx.eval(fixed["trivial"]()[0], fixed["precompiled_trivial"]()[0])
    result["fixed_build_us"] = {name: per_call_us(fn, args.calls) for name, fn in fixed.items()}
    print(json.dumps(result["fixed_build_us"]), file=sys.stderr, flush=True)
    def first(fn):  # one output array of a fixed way (the kernels return a list)
        out = fn()
        return out[0] if isinstance(out, list) else out

    result["fixed_encode_us"] = {name: encode_us(lambda _v, fn=fn: first(fn), [None] * 256)[0]
                                 for name, fn in fixed.items()}
    print(json.dumps(result["fixed_encode_us"]), file=sys.stderr, flush=True)

    ptx_text = args.ptx.read_bytes() if args.ptx else None
    for label in ("bfloat16", "4bit"):
        result[label] = measure_dtype(label, args.calls, args.chain, ptx_text)
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
