#!/bin/bash
# One device command: train the demo pair for each shape given, in parallel on one GPU,
# and pack each result (float16 weights, configs, logs) as <=15 MiB pieces under $OUT.
# Usage: bash tools/demo_pair/gpu_train.sh "SHAPE1 SHAPE2" [extra train.py args...]
# Per-shape extra args come from the environment: ARGS_<shape with - as _>; DATA names the
# prepared data folder (default build/demo_pair).
set -u
shapes=$1; shift
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
# flash-linear-attention (carried as wheels in .whl/) for the Gated DeltaNet kernels, if it runs.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
  first=${shapes%% *}
  timeout 120 python3 tools/demo_pair/gpu_fla_check.py "$first" > /tmp/fla.log 2>&1
  rc=$?
  grep -v Warn /tmp/fla.log | tail -3
  if [ $rc -ne 0 ]; then echo "fla check failed: torch reference kernels"; unset PYTHONPATH; fi
fi
pids=()
for s in $shapes; do
  v="ARGS_${s//-/_}"
  python3 tools/demo_pair/train.py --data "${DATA:-build/demo_pair}" --out /tmp/out/$s --device cuda \
    --shape "$s" "$@" ${!v:-} > "$OUT/log-$s.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for s in $shapes; do
  if [ -f /tmp/out/$s/demo-dflash/model.safetensors ]; then
    tar -C /tmp/out/$s -cf /tmp/$s.tar .
    split -b 15M -d /tmp/$s.tar "$OUT/$s.tar.part"
  fi
  echo "kernel fallbacks: $(grep -c "falling back" "$OUT/log-$s.txt")"
  grep -v "falling back" "$OUT/log-$s.txt" | tail -40
done
ls -la "$OUT"
