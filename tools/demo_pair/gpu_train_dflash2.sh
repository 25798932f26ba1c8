#!/bin/bash
# One device command (about 6.5 minutes on one H200): train DFlash2 drafters for the shipped demo
# target, several variants side by side on one GPU over the same continuations, and pack the
# exports (float16 model.safetensors + config.json + train_log.json per variant) as <=15 MiB
# pieces under $OUT.
# Usage (from the repo root, with the prepared data folder and resources/ carried; DATA names
# the data folder, default build/demo_pair):
#   bash tools/demo_pair/gpu_train_dflash2.sh [SECONDS] ["VARIANT ..."] [extra train_dflash2.py args]
# SECONDS: each variant's training budget (default 240). VARIANTs (default all three):
#   l2r32        2 layers (the DFlash drafter's size), selector rank 32, backbone from demo-dflash
#   l2r32frozen  the same with the backbone frozen (only convolutions + selector trained)
#   l1r16        1 layer (layer 0 of demo-dflash), selector rank 16
# GEN_TIMEOUT, VARIANT_TIMEOUT (env): seconds before the continuations step (default 120) or a
# variant (default SECONDS + 120; worst case 8 minutes) is killed.
# Unpack: cat dflash2.tar.part* | tar -x -C DIR  ->  DIR/VARIANT/demo-dflash2/
set -u
budget=${1:-240}
variants=${2:-"l2r32 l2r32frozen l1r16"}
shift $(( $# > 2 ? 2 : $# ))
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
declare -A VARGS=(
  [l2r32]="--layers 2 --selector-rank 32 --lr 8e-4"
  [l2r32frozen]="--layers 2 --selector-rank 32 --freeze-backbone --lr 1e-3"
  [l1r16]="--layers 1 --selector-rank 16 --lr 1e-3"
)
common=(--data "${DATA:-build/demo_pair}" --device cuda --init-target resources/models/demo-target
        --init-dflash resources/models/demo-dflash --continuations /tmp/conts.npz)
t0=$(date +%s)
rm -f /tmp/conts.npz
# 1. the target's greedy continuations, once for every variant (~80 s)
timeout "${GEN_TIMEOUT:-120}" python3 tools/demo_pair/train_dflash2.py "${common[@]}" --out /tmp/out/gen \
  --gen-only --time-gen 60 "$@" > "$OUT/log-gen.txt" 2>&1
rc=$?
echo "continuations: rc $rc after $(( $(date +%s) - t0 ))s"
grep -v "falling back" "$OUT/log-gen.txt" | tail -5
[ $rc -eq 0 ] || exit $rc
# 2. the variants in parallel
pids=()
for v in $variants; do
  timeout "${VARIANT_TIMEOUT:-$(( budget + 120 ))}" python3 tools/demo_pair/train_dflash2.py "${common[@]}" \
    --out /tmp/out/$v --time-train "$budget" ${VARGS[$v]} "$@" > "$OUT/log-$v.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; echo "variant pid $p: rc $?"; done
echo "variants done after $(( $(date +%s) - t0 ))s"
# 3. pack
rm -rf /tmp/out/gen
mkdir -p /tmp/out
tar -C /tmp/out -cf /tmp/dflash2.tar .
split -b 15M -d /tmp/dflash2.tar "$OUT/dflash2.tar.part"
for v in $variants; do
  echo "== $v: kernel fallbacks $(grep -c "falling back" "$OUT/log-$v.txt")"
  grep -v "falling back" "$OUT/log-$v.txt" | grep -E "tau|drafter|budget|done|Error|error" | tail -12
done
ls -la "$OUT"
