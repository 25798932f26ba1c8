#!/usr/bin/env bash
# The GPU measurements of docs/performance.md ("Figures"; earlier ones in
# docs/history/performance-log.md, "MLX on CUDA"), on a host where MLX's CUDA build
# was installed under /tmp/site (pip install --target /tmp/site of the mlx-cuda-13, mlx, mlx-lm
# and pint wheels; this project's sessions carry them in parts, see .gpu/4/install.sh). Run from the project root, each stage as one command of at most
# ten minutes, back to back on the same host:
#
#   bash tools/gpu_measure.sh fresh   # the host's first MLX process: load + warm-up + first
#                                     # replies, then the kernel tests and bench_gpu variants
#   bash tools/gpu_measure.sh exact   # exactness report and engine tests on the GPU
#   bash tools/gpu_measure.sh bench   # python -m app bench (block 16) on the GPU
#   bash tools/gpu_measure.sh profile # tools/profile_verify.py: a verify pass part by part
#   bash tools/gpu_measure.sh kernels # tools/bench_small_m.py: one kernel, 1 row against 16
#   bash tools/gpu_measure.sh trace   # tools/trace_verify.py: kernels and GPU busy time
#   bash tools/gpu_measure.sh rows    # the row mode (app/engine/kernels/row_products.py, row_attention.py): its
#                                     # tests, trace and launch under DFLASH_ROW_PRODUCTS
#   bash tools/gpu_measure.sh probe   # tools/probe_rows.py (which operation's result depends
#                                     # on the row count) and the exactness report, row kernel on
#   bash tools/gpu_measure.sh calls   # tools/bench_kernel_call.py: host cost of one product
#   bash tools/gpu_measure.sh launch  # tools/bench_launch.py under MLX's launch settings
#                                     # (CUDA graphs on/off, ops per graph), one process each
#   bash tools/gpu_measure.sh warmup  # load + warm-up with an empty kernel cache (as on a fresh
#                                     # host), with and without the parallel kernel build
#   bash tools/gpu_measure.sh serve   # tools/bench_serve.py: the server against in process
#                                     # (plain, DFlash); the MLX wheel bundle has no starlette
#                                     # or uvicorn, so carry pure-Python copies as .gpu/serve-site:
#                                     # mkdir -p .gpu/serve-site && cp -r .venv/lib/python3*/
#                                     # site-packages/{starlette,uvicorn,h11,anyio,sniffio,click,
#                                     # idna,typing_extensions.py} .gpu/serve-site/
#
# Results go to $OUT (or /tmp/gpu-out): JSON and text files named after what made them.
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
O=${OUT:-/tmp/gpu-out}; mkdir -p "$O"
py=python3
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

case "${1:-}" in
  fresh)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    stamp "fresh process: load, warm-up, first replies (demo pair)"
    timeout 230 $py tools/bench_gpu.py --shapes demo --repeats 5 \
      --pair-dtypes float32,bfloat16,float16 --out "$O/fresh.json" >/dev/null
    stamp "kernel tests"
    timeout 120 $py -m pytest -q -p no:cacheprovider tests/test_gdn_kernel.py 2>&1 | tail -15
    stamp "bench_gpu: GDN kernel (default)"
    timeout 200 $py tools/bench_gpu.py --repeats 10 --out "$O/bench_gpu.json" >/dev/null
    stamp "bench_gpu: mlx-lm's ops loop (DFLASH_GDN_KERNEL=0), demo pair"
    DFLASH_GDN_KERNEL=0 timeout 100 $py tools/bench_gpu.py --shapes demo --repeats 10 \
      --out "$O/bench_gpu_ops.json" >/dev/null
    stamp "bench_gpu: cuDNN attention off (MLX_CUDA_USE_CUDNN_SDPA=0)"
    MLX_CUDA_USE_CUDNN_SDPA=0 timeout 150 $py tools/bench_gpu.py --repeats 10 \
      --out "$O/bench_gpu_nocudnn.json" >/dev/null
    stamp done
    ;;
  exact)
    stamp "exactness report (default)"
    timeout 200 $py tools/exactness_report.py > "$O/exact.txt" 2>&1; tail -25 "$O/exact.txt"
    stamp "exactness report (cuDNN attention off)"
    MLX_CUDA_USE_CUDNN_SDPA=0 timeout 150 $py tools/exactness_report.py > "$O/exact_nocudnn.txt" 2>&1
    tail -25 "$O/exact_nocudnn.txt"
    stamp "engine tests on the GPU"
    timeout 200 $py -m pytest -q -p no:cacheprovider tests/test_engine_exact.py \
      tests/test_engine_syncs.py tests/test_gdn_kernel.py > "$O/pytest_gpu.txt" 2>&1
    tail -30 "$O/pytest_gpu.txt"
    stamp done
    ;;
  bench)
    stamp "python -m app bench --block-sizes 16 --repeats 2"
    timeout 500 $py -m app bench --block-sizes 16 --repeats 2 --json > "$O/app_bench.json" 2>"$O/app_bench.err"
    tail -5 "$O/app_bench.err"
    stamp done
    ;;
  serve)
    stamp "tools/bench_serve.py --modes plain dflash --repeats 2 (PYTHONPATH + .gpu/serve-site)"
    PYTHONPATH=$PYTHONPATH:$PWD/.gpu/serve-site timeout 400 $py tools/bench_serve.py \
      --modes plain dflash --repeats 2 --max-tokens 128 --json "$O/serve.json" > "$O/serve.txt" 2>&1
    tail -8 "$O/serve.txt"
    stamp done
    ;;
  profile)
    stamp "tools/profile_verify.py (Qwen3.5-4B shape, bf16 and 4-bit)"
    timeout 300 $py tools/profile_verify.py --repeats 10 --out "$O/profile.json" >/dev/null
    stamp done
    ;;
  kernels)
    stamp "tools/bench_small_m.py (Qwen3.5-4B shapes, bf16 and 4-bit; attention with cuDNN off, on)"
    timeout 90 $py tools/bench_small_m.py --out "$O/small_m.json" >/dev/null
    MLX_CUDA_USE_CUDNN_SDPA=1 timeout 60 $py tools/bench_small_m.py --dtypes "" \
      --out "$O/small_m_cudnn.json" >/dev/null
    stamp done
    ;;
  trace)
    stamp "tools/trace_verify.py (Qwen3.5-4B shape, bf16 and 4-bit; needs PyTorch for CUPTI)"
    # TAG names the output files (e.g. one per DFLASH_ROW_PRODUCTS setting)
    timeout 150 $py tools/trace_verify.py --out "$O/trace${TAG:-}.json" >/dev/null \
      2>"$O/trace${TAG:-}.err"
    $py -c "import json; d=json.load(open('$O/trace${TAG:-}.json')); [print(k, S, round(d[k][S]['wall_ms'], 2), d[k][S]['kernels'], round(d[k][S]['gpu_busy_ms'], 2), [(t['count'], round(t['ms'], 3), t['kernel'][:40]) for t in d[k][S]['top'][:4]]) for k in ('bfloat16', '4bit') for S in ('S1', 'S16')]"
    stamp done
    ;;
  rows)
    stamp "row product tests"
    timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_row_products.py tests/test_row_attention.py \
      > "$O/pytest_rows.txt" 2>&1; tail -15 "$O/pytest_rows.txt"
    DFLASH_ROW_PRODUCTS=all TAG=_all bash "$0" trace
    DFLASH_ROW_PRODUCTS=quantized-verify TAG=_qverify bash "$0" trace
    DFLASH_ROW_PRODUCTS=0 TAG=_off bash "$0" trace
    # default: the row mode (all) since 2026-12-03; 0: MLX's own kernels
    SETTINGS=${SETTINGS:-"default DFLASH_ROW_PRODUCTS=0 DFLASH_ROW_PRODUCTS=quantized-verify \
      default DFLASH_ROW_PRODUCTS=0 DFLASH_ROW_PRODUCTS=quantized-verify"} bash "$0" launch
    ;;
  probe)
    stamp "row tests; tools/probe_rows.py: which operation depends on the row count"
    timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_row_products.py tests/test_row_attention.py \
      > "$O/pytest_rows.txt" 2>&1; tail -4 "$O/pytest_rows.txt"
    for way in 0 all; do
      DFLASH_ROW_PRODUCTS=$way timeout 120 $py tools/probe_rows.py 2>&1 | grep -v INFO
    done | tee "$O/probe.txt"
    stamp "exactness report, DFLASH_ROW_PRODUCTS=all"
    DFLASH_ROW_PRODUCTS=all timeout 200 $py tools/exactness_report.py > "$O/exact_all.txt" 2>&1
    tail -22 "$O/exact_all.txt"
    stamp done
    ;;
  calls)
    stamp "tools/bench_kernel_call.py (PTX=FILE adds the precompiled row kernel)"
    timeout 200 $py tools/bench_kernel_call.py ${PTX:+--ptx "$PTX"} --out "$O/kcall.json" \
      >/dev/null 2>"$O/kcall.err"; tail -15 "$O/kcall.err"
    stamp done
    ;;
  launch)
    # One process per setting: MLX reads these variables once. SETTINGS overrides the list;
    # a setting may join several variables with commas.
    for setting in ${SETTINGS:-default MLX_USE_CUDA_GRAPHS=0 MLX_MAX_OPS_PER_BUFFER=20 \
        MLX_MAX_OPS_PER_BUFFER=400}; do
      stamp "tools/bench_launch.py, $setting"
      name=$(echo "$setting" | tr '=,' '__')
      [ "$setting" = default ] && setting=
      setting=${setting//,/ }  # A=1,B=2: two variables in one process
      # the host's first MLX process also builds every kernel (on host 14 it ran past 150 s)
      env $setting timeout 300 $py tools/bench_launch.py --out "$O/launch_$name.json" \
        >/dev/null 2>"$O/launch_$name.err" || { tail -3 "$O/launch_$name.err"; continue; }
      $py -c "import json; d=json.load(open('$O/launch_$name.json')); [print(k, {n: round(v, 2) for n, v in d[k].items()}) for k in ('bfloat16', '4bit') if k in d]"
    done
    stamp done
    ;;
  warmup)
    # An empty MLX_PTX_CACHE_DIR stands for a fresh host: every kernel is compiled again.
    # fresh: the app's warm-up (parallel kernel build first); serial: without that build
    # (DFLASH_KERNEL_PREBUILD=0); again: a second process on the first one's kernels;
    # fresh-nolayers (only when named in VARIANTS): fresh without warm_layers.
    first=$(mktemp -d)
    for variant in ${VARIANTS:-fresh serial again}; do
      case $variant in
        fresh) dir=$first; extra= ;;
        serial) dir=$(mktemp -d); extra="DFLASH_KERNEL_PREBUILD=0" ;;
        fresh-nolayers) dir=$(mktemp -d); extra="DFLASH_WARM_LAYERS=0" ;;
        again) dir=$first; extra= ;;
      esac
      stamp "load + warm-up, $variant (MLX_PTX_CACHE_DIR=$dir $extra)"
      env MLX_PTX_CACHE_DIR="$dir" $extra timeout 200 $py tools/bench_gpu.py --shapes "" \
        --repeats 3 --out "$O/warmup_$variant.json" >/dev/null
      $py - "$O/warmup_$variant.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["load"]
keys = ("load_s", "warm_up_s", "warm_up_parts", "cold_plain_tok_per_s", "cold_dflash_tok_per_s",
        "cold_plain_ttft_s", "cold_dflash_ttft_s", "cold_identical")
print({k: d[k] for k in keys})
print("modules compiled in the warm-up:", d["kernels_compiled_in_warm_up"]["modules"],
      "after it:", d["kernels_compiled_after"]["modules"])
PY
    done
    stamp done
    ;;
  *)
    echo "usage: bash tools/gpu_measure.sh fresh|exact|bench|profile|kernels|trace|rows|launch|warmup" >&2; exit 2 ;;
esac
