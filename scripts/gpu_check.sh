#!/usr/bin/env bash
# Everything the GPU lease must check, in one call, each step under its own timeout. Logs go to $OUT.
#   bash scripts/gpu_check.sh [quick|tests|bench|profile|measure|final|variants|repeat|verify|matrix|stalls|gluon|chain|chain-decode|chain-loop|one-request|batch-chain|batch-probe|session67|stream|user-path|chain-probe|b64-variants|b64-stalls|b64-spills|trees|gluon-tests|batch|pairs|all]
set -uo pipefail
# BLINK_CACHE_DIR: kernels compiled on the CPU machine and carried here (benchmarks/megakernel_tpot.py, --compile-only)
export PYTHONPATH=. PYTHONUNBUFFERED=1 BLINK_CACHE_DIR=${BLINK_CACHE_DIR:-/tmp/blink-cache}
OUT=${OUT:-/tmp/blink-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
# the power and clocks all through the call (some H200s hold a b64 decode loop at their 700 W cap, session 76)
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader -lms 100 \
  > "$OUT/smi.csv" 2>/dev/null & SMI=$!
trap 'kill $SMI 2>/dev/null; python -m benchmarks.explore.smi_summary "$OUT/smi.csv"' EXIT
# (a step past its limit gets SIGINT first, so that pytest can still print why each test failed; SIGKILL 30 s later)
step() { local limit=$1 start=$SECONDS; shift; echo "== $*"; timeout -s INT -k 30 "$limit" "$@" 2>&1 | tee -a "$OUT/gpu_check.log" | tail -30
          local rc=${PIPESTATUS[0]}; echo "== $(( SECONDS - start )) s, exit $rc"; return "$rc"; }
mode=${1:-all}
if [[ $mode == quick ]]; then
  step 240 python -m pytest -q -x -s -m gpu tests/gpu -k "llama3-8b-1]" -p no:cacheprovider
  step 200 python -m benchmarks.megakernel_tpot 1x512
fi
if [[ $mode == tests || $mode == all ]]; then
  step "${TEST_LIMIT:-420}" python -m pytest -q -s -m gpu tests/gpu -k "${CASES:-}" -p no:cacheprovider
fi
if [[ $mode == bench || $mode == all ]]; then
  step "${BENCH_LIMIT:-240}" python -m benchmarks.decode --decode "${DECODE:-1x512,8x512,64x512}" --ttft "${TTFT:-128,512}" --json "$OUT/decode.json"
fi
if [[ $mode == profile ]]; then
  step "${BENCH_LIMIT:-150}" python -m benchmarks.profile_step --context 512
fi
if [[ $mode == measure ]]; then
  step 150 python -m pytest -q -x -s -m gpu tests/gpu -k "llama3-8b-1]" -p no:cacheprovider
  step 150 python -m benchmarks.profile_step --context 512
  step "${BENCH_LIMIT:-270}" python -m benchmarks.decode --decode "${DECODE:-1x512,8x512,64x512}" --ttft "${TTFT:-128,512}" --json "$OUT/decode.json"
fi
if [[ $mode == final ]]; then
  step 150 python -m pytest -q -x -s -m gpu tests/gpu -k "llama3-8b-1]" -p no:cacheprovider
  step 150 python -m benchmarks.profile_step --context 512
fi
if [[ $mode == variants ]]; then  # [PRESET=qwen3-30b-a3b] VARIANTS="1x512 1x512:attention_stages=3 ttft512", compiled side by side
  step "${VARIANT_LIMIT:-500}" python -m benchmarks.megakernel_tpot --preset "${PRESET:-llama3-8b}" ${VARIANTS:-1x512}
fi

if [[ $mode == repeat ]]; then  # [PRESET=.. PROMPT=2048 RUNS=20 SET="--set f=v"]: one kernel's logits launch after launch
  step "${REPEAT_LIMIT:-400}" python -m benchmarks.explore.repeat --preset "${PRESET:-qwen3-30b-a3b}" \
    --prompt-len "${PROMPT:-2048}" --runs "${RUNS:-20}" ${SET:-}
fi

if [[ $mode == matrix ]]; then  # the whole decode table, one model per call: MATRIX=llama or MATRIX=moe
  # (TORCH_EXPERTS=gathered|looped|grouped: how MoE's torch baselines run the experts; benchmarks/decode.py)
  if [[ ${MATRIX:-llama} == llama ]]; then
    step "${BENCH_LIMIT:-580}" python -m benchmarks.decode --decode "${DECODE:-1x512,8x512,32x512,64x512,1x4096,8x4096,32x4096,64x4096}" \
      --ttft "${TTFT-128,512,2048}" --json "$OUT/matrix-llama.json"
  else
    step "${BENCH_LIMIT:-580}" python -m benchmarks.decode --preset qwen3-30b-a3b --decode "${DECODE:-1x512,8x512}" \
      --ttft "${TTFT-}" --torch-experts "${TORCH_EXPERTS:-auto}" --json "$OUT/matrix-moe.json"
  fi
fi

if [[ $mode == verify ]]; then  # one ~8-minute call: correctness at every batch, then the decode table
  step 170 python -m pytest -q -x -s -m gpu tests/gpu -k "${CASES:-llama3-8b}" -p no:cacheprovider
  step "${BENCH_LIMIT:-400}" python -m benchmarks.decode --decode "${DECODE:-1x512,8x512,64x512}" --ttft "${TTFT-512}" --json "$OUT/decode.json"
fi

if [[ $mode == stalls ]]; then  # STALLS="64x512 ttft512": ncu's warp-state samples per body line, each variant
  step 300 python -m benchmarks.stall_profile compile ${STALLS:-64x512 ttft512}
  for variant in ${STALLS:-64x512 ttft512}; do
    name=stalls-$(echo "$variant" | tr ':=,' '---')
    step "${NCU_LIMIT:-240}" ncu --metrics group:smsp__pcsamp_warp_stall_reasons --warp-sampling-interval "${INTERVAL:-14}" \
      --clock-control none -k regex:blink_megakernel --launch-skip 1 --launch-count 1 -f -o "$OUT/$name" \
      python -m benchmarks.stall_profile launch "$variant" --source-out "/tmp/$name.py"
    step 150 python -m benchmarks.stall_profile summarize "$OUT/$name.ncu-rep" --tsv "$OUT/$name.tsv" --source "/tmp/$name.py" ||
      ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.csv"  # no ncu_report module
  done
fi

if [[ $mode == gluon ]]; then  # the Gluon bodies (codegen/gluon): each covered group against the Triton one, timed
  # (a Gluon kernel whose barrier waits on a wrong phase hangs: the bodies not yet run first, alone, and the rest only
  # if that ended well)
  # (the prompts' rows, PROMPTS=2048,512 GLUON_LIMIT=420, wanted a call of their own: in session 62 they and a decode
  # row took more than 330 s, most likely the host-driven `_group` kernels' JIT compiles, a minute a config; those
  # come from BLINK_CACHE_DIR now, compiled by `gluon_groups --compile-only`)
  step 200 python -m benchmarks.gluon_groups --prompts "" --decode "${FIRST-64x512}" &&
    step "${GLUON_LIMIT:-240}" python -m benchmarks.gluon_groups --prompts "${PROMPTS-}" --decode "${DECODE-1x512}"
  step 120 python -m benchmarks.explore.ws_decode_chain
fi
if [[ $mode == chain ]]; then  # a prefill step's Gluon groups as one persistent launch (codegen/gluon/chain.py): the GPU
  # tests first (a wrong phase hangs: their timeout ends it), then the prompts' rows with it beside the group kernels
  step "${TEST_LIMIT:-300}" python -m pytest -q -x -s -m gpu tests/gpu -k chain -p no:cacheprovider &&
    step "${GLUON_LIMIT:-300}" python -m benchmarks.gluon_groups --prompts "${PROMPTS-2048,512}" --decode ""
fi
if [[ $mode == chain-decode ]]; then  # the one-row chain (`chain.decode_chain`): where its programs are if it stops,
  # then its decode row (a step's layers through it against the group kernels) and its GPU tests
  step "${CHAIN_LIMIT:-100}" python -m benchmarks.explore.chain_probe --mode on
  step "${BENCH_LIMIT:-200}" python -m benchmarks.gluon_groups --prompts "" --decode 1x512 --one-row-chain on
  step "${TEST_LIMIT:-330}" python -m pytest -q -s -m gpu tests/gpu -k "${CASES:-gemv_for_one_sequence or chain or decode_attention}" -p no:cacheprovider
fi
if [[ $mode == chain-loop ]]; then  # the one-row loop over steps (`chain.decode_chain` with a step's plan and sampling,
  # session 65, first run in session 66): where its programs are if it stops (and nothing more then: every later step would run
  # it again into its timeout), else its TPOT beside the others and its GPU tests (greedy first, then sampling)
  step "${CHAIN_LIMIT:-100}" python -m benchmarks.explore.chain_probe --mode loop --steps 8 && {
    step "${BENCH_LIMIT:-200}" python -m benchmarks.gluon_groups --prompts "" --decode 1x512
    step "${TEST_LIMIT:-300}" python -m pytest -q -s -m gpu tests/gpu -k "${CASES:-gemv_for_one_sequence or loop_samples}" \
      -p no:cacheprovider; }
fi
if [[ $mode == one-request ]]; then  # one request on the Gluon kernels through the runtime (`Megakernel._gluon`,
  # session 66): its test against the reference and the compiled kernel alone, then the benchmark's batch-1 and TTFT rows
  step "${TEST_LIMIT:-240}" python -m pytest -q -s -m gpu tests/gpu -p no:cacheprovider \
    -k "${CASES:-one_request_on_the_gluon or matches_reference_on_gpu and llama3-8b-1]}"
  step "${BENCH_LIMIT:-300}" python -m benchmarks.decode --decode "${DECODE:-1x512,1x4096}" --ttft "${TTFT-512,2048}" \
    --json "$OUT/decode.json"
fi
if [[ $mode == batch-chain ]]; then  # a batched decode step's layers as one persistent launch (`batch.batch_chain`,
  # session 67): its GPU tests first (a wrong phase hangs: the step's timeout ends it), then its decode rows
  step "${TEST_LIMIT:-280}" python -m pytest -q -x -s -m gpu tests/gpu -k "${CASES:-batched_decode_steps}" \
    -p no:cacheprovider &&
    step "${BENCH_LIMIT:-280}" python -m benchmarks.gluon_groups --prompts "" --decode "${DECODE-64x512,8x512}"
fi
if [[ $mode == batch-probe ]]; then  # ... where its time goes (each kind of group's, from the programs' clocks), one
  # step and the loop over steps, then the decode rows (the chain and the loop against the persistent megakernel)
  [[ -n ${PROBE_TESTS:-} ]] && step 240 python -m pytest -q -x -s -m gpu tests/gpu -k "$PROBE_TESTS" -p no:cacheprovider
  step "${CHAIN_LIMIT:-120}" python -m benchmarks.explore.chain_probe --mode on --batch "${BATCH:-64}" --repeats 5 \
    --probes "${PROBES:-}"
  step "${CHAIN_LIMIT:-120}" python -m benchmarks.explore.chain_probe --mode loop --batch "${BATCH:-64}" --steps 8
  step "${BENCH_LIMIT:-280}" python -m benchmarks.gluon_groups --prompts "" --decode "${DECODE-64x512,8x512}"
fi
if [[ $mode == session67 ]]; then  # the one-row loop again after its step groups took the step's rows (`step.copy_rows`,
  # `step.sample`), the batch-1 rows, then the batched loop's steps
  step "${TEST_LIMIT:-300}" python -m pytest -q -s -m gpu tests/gpu -p no:cacheprovider \
    -k "one_request_on_the_gluon or gemv_for_one_sequence or loop_samples"
  step "${BENCH_LIMIT:-200}" python -m benchmarks.decode --decode 1x512 --ttft 512 --json "$OUT/decode.json"
  step "${CHAIN_LIMIT:-100}" python -m benchmarks.explore.chain_probe --mode loop --batch 64 --steps 8
fi
if [[ $mode == stream ]]; then  # what a b64 step's projections stream at (session 68): a weight alone through TMA
  # boxes of each pattern, then the batched chain's groups (TILES: a layer's table column patterns to time besides)
  step 120 python -m benchmarks.explore.tma_stream
  step "${CHAIN_LIMIT:-180}" python -m benchmarks.explore.chain_probe --mode on --batch 64 --repeats 5 \
    --tiles "${TILES:-1,0,1,0,1/0,0,0,0,0}"
fi
if [[ $mode == user-path ]]; then  # what a user does on a fresh machine: a cold compile (the kernel, the host-driven
  # and the Gluon kernels beside it), one from the cache, then `blinkc run` twice (session 66)
  export BLINK_CACHE_DIR=/tmp/fresh TRITON_CACHE_DIR=/tmp/fresh/triton; B="python -m blinkc.cli"
  step 200 $B compile llama3-8b --random-weights -o /tmp/l8.cubin
  step 30 $B compile llama3-8b --random-weights -o /tmp/l8b.cubin
  for i in 1 2; do step 120 bash -c "time $B run /tmp/l8.cubin --prompt 'The quick brown fox jumps over the lazy dog' \
    --max-tokens 32 --json"; done
fi
if [[ $mode == b64-variants ]]; then  # candidates for a b64 step, one call (compiled on the CPU machine:
  # `precompile_gluon --traced --probes 2,4,16 --variants-of <the b64 artifact>`): the batched chain's groups, then
  # with each timing-only PROBE (`batch.batch_chain`: 2 no partials exchanged, 4 no products, 16 no barriers, ..)
  # and (TILES) a layer's table column patterns, then (TESTS=1) the batched loop's GPU tests, which a patch under
  # test (benchmarks/explore/patches) must pass before it lands
  step "${CHAIN_LIMIT:-300}" python -m benchmarks.explore.chain_probe --mode on --batch 64 --repeats 5 \
    --probes "${PROBES-2,4,16}" --tiles "${TILES-}"
  if [[ ${TESTS:-0} == 1 ]]; then
    step 260 python -m pytest -q -x -s -m gpu tests/gpu -k "batched_decode_steps or batched_loop_samples" -p no:cacheprovider
  fi
fi
if [[ $mode == trees ]]; then  # working trees side by side in one call (NOTES "Session 70": `git archive` HEAD into
  # each, a patch applied in each with `patch -p1`, each precompiled into one cache from its own directory, the cache's
  # cubins and the trees carried): TREES="dir dir ..", each tree's batched chain timed (PROBES too), then (TESTS_IN=dir)
  # the batched loop's GPU tests in one of them
  for tree in ${TREES:-}; do
    echo "== tree $tree"
    (cd "$tree" && step "${CHAIN_LIMIT:-120}" python -m benchmarks.explore.chain_probe --mode on --batch 64 --repeats 5 \
      --probes "${PROBES-}")
  done
  if [[ -n ${TESTS_IN:-} ]]; then
    (cd "$TESTS_IN" && step "${TEST_LIMIT:-260}" python -m pytest -q -x -s -m gpu tests/gpu -p no:cacheprovider \
      -k "${TESTS_K:-batched_decode_steps or batched_loop_samples}")
  fi
fi
if [[ $mode == b64-stalls ]]; then  # why a b64 step's programs stream at ~27 GB/s (session 69): one launch of the
  # batched chain under ncu, its warps' stall reasons per line of codegen/gluon (the consumers waiting on `ready`:
  # starved of bytes; the loader on `empty`: held by the consumers; `events.wait`: a group's barrier), DRAM and L2
  step "${NCU_LIMIT:-300}" ncu --metrics group:smsp__pcsamp_warp_stall_reasons,dram__bytes_read.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct \
    --warp-sampling-interval "${INTERVAL:-14}" --clock-control none -k regex:batch_chain --launch-count 1 -f \
    -o "$OUT/b64-stalls" python -m benchmarks.explore.chain_probe --mode on --batch 64 --repeats 1
  step 150 python -m benchmarks.stall_profile summarize "$OUT/b64-stalls.ncu-rep" --tsv "$OUT/b64-stalls.tsv" ||
    ncu -i "$OUT/b64-stalls.ncu-rep" --page source --csv --print-source sass > "$OUT/b64-stalls.csv"
  timeout 60 ncu -i "$OUT/b64-stalls.ncu-rep" --page raw --csv 2>/dev/null | grep -E "dram__|gpu__time|lts__t_sector_hit" | head
fi
if [[ $mode == b64-spills ]]; then  # which spill instructions one launch of the batched chain runs and how long
  # their loads' readers wait (ncu's per-instruction counters; read here with `benchmarks/explore/spill_profile.py`
  # and the carried kernel.cubin, session 77)
  step "${NCU_LIMIT:-300}" ncu --section SourceCounters --clock-control none -k regex:batch_chain --launch-count 1 -f \
    -o "$OUT/b64-spills" python -m benchmarks.explore.chain_probe --mode on --batch 64 --repeats 1
  timeout 200 ncu -i "$OUT/b64-spills.ncu-rep" --page source --csv --print-source sass | gzip -9 > "$OUT/b64-spills.csv.gz"
  rm -f "$OUT/b64-spills.ncu-rep"
fi
if [[ $mode == chain-probe ]]; then  # ... read back where its programs stop (`benchmarks/explore/chain_probe.py`)
  step "${CHAIN_LIMIT:-100}" python -m benchmarks.explore.chain_probe --mode gemv ${PROBE_ARGS:-}
  step "${CHAIN_LIMIT:-100}" python -m benchmarks.explore.chain_probe --mode on ${PROBE_ARGS:-}
fi
if [[ $mode == gluon-tests ]]; then  # ... and through the host-driven executor against the reference (a call of its own)
  step "${TEST_LIMIT:-560}" python -m pytest -q -s -m gpu tests/gpu -k "${CASES:-gluon}" -p no:cacheprovider
fi
if [[ $mode == pairs ]]; then  # QKV in pair tiles (session 74): the batched chain with them and with QKV's whole-K tiles
  # of 32 rows (`--tiles 1,0,1,1,1`) in the same run, the batched loop's GPU tests, then the decode rows
  step "${CHAIN_LIMIT:-150}" python -m benchmarks.explore.chain_probe --mode on --batch 64 --repeats "${REPEATS:-3}" \
    --tiles "${TILES:-1,0,1,1,1}"
  step "${TEST_LIMIT:-330}" python -m pytest -q -s -m gpu tests/gpu -p no:cacheprovider -k "${CASES:-batched_decode_steps \
or batched_loop_samples or batch_on_the_gluon or matches_reference_on_gpu and (llama3-8b-8] or llama3-8b-64])}" &&
    step "${BENCH_LIMIT:-200}" python -m benchmarks.decode --decode "${DECODE:-64x512,8x512}" --ttft "${TTFT-}" \
      --json "$OUT/decode.json"
fi
if [[ $mode == batch ]]; then  # a batch through the runtime on the Gluon kernels (`runtime.gluon.Batch`, session 73): its
  # tests (the runner's own, the reference checks at 2, 8 and 64 requests, one request's), then the decode rows
  step "${TEST_LIMIT:-330}" python -m pytest -q -s -m gpu tests/gpu -p no:cacheprovider -k "${CASES:-batch_on_the_gluon \
or one_request_on_the_gluon_kernels or matches_reference_on_gpu and (llama3-8b-2] or llama3-8b-8] or llama3-8b-64])}" &&
    step "${BENCH_LIMIT:-260}" python -m benchmarks.decode --decode "${DECODE:-8x512,64x512}" --ttft "${TTFT-}" \
      --json "$OUT/decode.json"
fi
