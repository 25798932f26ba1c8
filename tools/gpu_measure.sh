#!/usr/bin/env bash
# The GPU measurements of docs/performance.md ("MLX on CUDA"), on a host where MLX's CUDA build
# was installed under /tmp/site (pip install --target /tmp/site of the mlx-cuda-13, mlx, mlx-lm
# and pint wheels; this project's sessions carry them in parts, see .gpu/4/install.sh). Run from the project root, each stage as one command of at most
# ten minutes, back to back on the same host:
#
#   bash tools/gpu_measure.sh fresh   # the host's first MLX process: load + warm-up + first
#                                     # replies, then the kernel tests and bench_gpu variants
#   bash tools/gpu_measure.sh exact   # exactness report and engine tests on the GPU
#   bash tools/gpu_measure.sh bench   # python -m app bench (block 16) on the GPU
#   bash tools/gpu_measure.sh profile # tools/profile_verify.py: a verify pass part by part
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
  profile)
    stamp "tools/profile_verify.py (Qwen3.5-4B shape, bf16 and 4-bit)"
    timeout 300 $py tools/profile_verify.py --repeats 10 --out "$O/profile.json" >/dev/null
    stamp done
    ;;
  *)
    echo "usage: bash tools/gpu_measure.sh fresh|exact|bench|profile" >&2; exit 2 ;;
esac
