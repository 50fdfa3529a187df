#!/usr/bin/env bash
# Everything the GPU lease must check, in one call, each step under its own timeout. Logs go to $OUT.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 BLINK_CACHE_DIR=/tmp/blink-cache
OUT=${OUT:-/tmp/blink-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
step() { local limit=$1; shift; echo "== $*"; timeout "$limit" "$@" 2>&1 | tee -a "$OUT/gpu_check.log" | tail -25; }
case "${1:-all}" in
  quick)
    step 240 python -m pytest -q -x -m gpu tests/gpu -k "llama3-8b-1]" -p no:cacheprovider
    step 300 python benchmarks/megakernel_tpot.py --batch 1 --context 512 --tiles "${TILES:-16x512}" ;;
  all)
    step 1500 python -m pytest -q -m gpu tests/gpu -p no:cacheprovider
    step 300 python benchmarks/megakernel_tpot.py --batch 1 --context 512 ;;
esac
