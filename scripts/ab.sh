#!/usr/bin/env bash
# A change against a base commit on one machine, in one GPU call: the working tree's kernels (A), the base's (B),
# then A again (its compiles are cached by then), each `benchmarks.megakernel_tpot` over the same variants
# (AB_TOOL=profile_step: `benchmarks.profile_step` over the same arguments instead).
# Timings move a few percent from one machine to the next, so compare only within one such call.
#
#   bash scripts/ab.sh prepare REV                  # here: the base's packages into ab-base/ (git-ignored)
#   bash scripts/ab.sh run 1x512 64x512 ttft512     # on the GPU machine, with the run's carry: ["ab-base"]
#
# The base's codegen, runtime, ir, models and blinkc stand in for the working tree's during B; the benchmark
# scripts stay the working tree's. Each pass runs under AB_LIMIT seconds (default 180). AB_PASSES=2 leaves out
# "A again": an MoE model's pass takes ~250 s (three kernels compiled side by side ~110-140 s, 30B random weights
# ~30 s), so `AB_PASSES=2 AB_LIMIT=270 bash scripts/ab.sh run --preset qwen3-30b-a3b 1x512 8x512` fits one call.
set -uo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(codegen runtime ir models blinkc)
mode=${1:-}
shift || true

if [[ $mode == prepare ]]; then
  rev=${1:?usage: bash scripts/ab.sh prepare REV}
  rm -rf ab-base && mkdir ab-base
  git archive "$rev" "${PACKAGES[@]}" | tar x -C ab-base
  git rev-parse --short "$rev" > ab-base/REV
  echo "ab-base/ holds ${PACKAGES[*]} at $(cat ab-base/REV); pass carry [\"ab-base\"] to the run"
  exit 0
fi
if [[ $mode != run || $# -eq 0 ]]; then
  echo "usage: bash scripts/ab.sh prepare REV | bash scripts/ab.sh run VARIANT..." >&2
  exit 2
fi
if [[ ! -f ab-base/REV ]]; then
  echo "no ab-base/: run 'bash scripts/ab.sh prepare REV' first and carry ab-base" >&2
  exit 2
fi

export PYTHONPATH=. PYTHONUNBUFFERED=1 BLINK_CACHE_DIR=${BLINK_CACHE_DIR:-/tmp/blink-cache}
change=$(mktemp -d)
cp -r "${PACKAGES[@]}" "$change/"
swap_in() {  # the packages of the folder $1 in place of the tree's, files the other side lacks included
  rm -rf "${PACKAGES[@]}" && cp -r "${PACKAGES[@]/#/$1/}" .
}
trap 'swap_in "$change"' EXIT  # whatever happens, the tree ends as it began
pass() {
  echo "== $1"
  timeout "${AB_LIMIT:-180}" python -m "benchmarks.${AB_TOOL:-megakernel_tpot}" "${@:2}" 2>&1 | grep -v Warning |
    sed "s/^/$1 | /"
}
pass "A change" "$@"
swap_in ab-base
pass "B $(cat ab-base/REV)" "$@"
swap_in "$change"
if [[ ${AB_PASSES:-3} -gt 2 ]]; then
  pass "A again" "$@"
fi
