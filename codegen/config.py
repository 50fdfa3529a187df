"""`CompileConfig`: everything that changes the generated kernel (and so the compile-cache key)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from codegen.bodies import OUTLINE_GROUPS


@dataclass(frozen=True)
class CompileConfig:
    max_batch: int = 8  # requests per launch = sequences per step
    # prefill chunk budget: a longer prompt prefills over several steps, each reading every weight again. H200,
    # Llama-3-8B, max_batch 8, 256 / 2,048 (session 54): TTFT 512 24.60 / 17.12 ms, 2000 101.94 / 59.42; TPOT b1
    # ctx512 4.74 / 4.78, b8 5.15 / 5.30 (from 512 the prefill tiles take 128 rows: `prefill_rows`)
    max_tokens_per_step: int = 2048
    max_model_len: int = 2048  # prompt + generated tokens of one request
    max_new_tokens: int = 1024
    page_size: int = 16
    interpret: bool = False  # Triton interpreter on CPU: grid of one program, fp32 dot operands
    num_warps: int = 4
    block_n: int = 16  # output columns per projection tile
    # input columns per chunk of the batch-1 GEMV (two chunks in flight). Llama-3-8B, 512 / 1024, one call each,
    # with pinned thread ids and parked state: H200 b1 ctx512 4.83 / 4.88 and 4.82 / 4.89 ms, ctx4096 5.04 / 5.11,
    # b8 6.86 / 6.90; H100 b1 6.05 / 6.09, ctx4096 6.32 / 6.35, b8 7.15 / 7.19. (Before both, 1024 was the faster
    # where every input is 4 chunks or more: H100 b1 6.61 against 6.71 ms.) Qwen3-30B-A3B (inputs of 2048), H100:
    # 6.48 / 6.65
    block_k: int = 512
    expert_block_n: int = 64  # output columns per MoE expert tile (most expert slots are idle at decode)
    # input columns per chunk of an expert tile's K loop, and its pipelining depth. Qwen3-30B-A3B on the
    # H100: b1 7.67 ms at (64, 3), 7.66 at (128, 3), 7.45 at (64, 4); b8 19.38 at (64, 3), 19.39 at (128, 4)
    expert_block_k: int = 64
    expert_stages: int = 4
    # token rows of an expert's dot blocks where it has more than block_m rows in a step (a prefill); 0: 128 where
    # a step prefills 1,024 tokens or more, else 64 (`expert_prefill_rows`; `prefill_m`'s rule for the projections
    # starts at 512, not measured for experts); block_m: none.
    # Each block reads its expert's whole weight slice, so 16-row blocks read it again for every 16 tokens. They
    # pipeline at most 3 stages deep (codegen/render.py). H200, Qwen3-30B-A3B, one call each: 64 / 16 rows TPOT
    # b1 ctx512 4.05 / 4.01 ms, b8 11.90 / 11.40 (spills 264 -> 302 B a thread), TTFT 2048 165.09 against 387
    # (at 16 and session 38's code; a torch prefill, an eager loop over the experts, 283), 512 47.81 against 100.
    # After gate/up's gating epilogue, 128 / 64 rows: TTFT 2048 84.84 / 99.03, 512 26.37 / 30.11, TPOT b1 4.06 /
    # 3.92 (spills 56 -> 102), b8 11.25 / 11.01 (268 -> 284)
    expert_prefill_m: int = 0
    # a prefill step whose experts average more than block_m rows takes its expert blocks claimed one at a time
    # by whichever task of their columns is free (`codegen.bodies.moe.claimed_blocks`), instead of each slot's
    # share of the experts. H200, Qwen3-30B-A3B, on / off in one call: TTFT 2048 65.13 / 85.60 ms, 512 22.55 /
    # 30.74; but TPOT b1 ctx512 4.15 / 3.93, b8 11.64 / 11.35, though decode steps never run the claims (the code
    # costs the decode bodies registers: benchmarks/explore/NOTES.md, session 40). Off, the kernel is the one
    # before the claims existed: for decode-heavy serving, `--set expert_claims=0`
    expert_claims: bool = True
    # output columns of those claimed blocks (a multiple of expert_block_n). H200, Qwen3-30B-A3B, 128 / 64
    # columns in one call: TTFT 2048 65.13 / 66.84 ms, 512 22.55 / 24.67; TPOT b1 ctx512 4.16 / 4.18. (As static
    # slots' shares, 128 columns lost: TTFT 2048 88.76 against 84.43 at 64.)
    expert_prefill_n: int = 128
    # rows of a claimed block that holds an expert's last rows where they fit in it (a power of two, at least
    # block_m): a [128, N] block computes every row, valid or not, and at 2,048 tokens Qwen3-30B-A3B's experts
    # average 128 rows, so about half of them had a second block of a few rows. 0 or expert_prefill_m: off.
    # H200, one call, 64 / off: TTFT 2048 57.93 / 59.80 ms (again from the cache: 58.64, 58.51 / 59.87), b8
    # ctx512 11.37 / 11.55. Kernels of 64-row blocks (under 1,024 tokens a step, b1 ctx512's) are unchanged
    expert_tail_m: int = 64
    # an expert of one token takes it as a GEMV where the step's expert tiles fit in one wave (few tokens).
    # H200, Qwen3-30B-A3B ctx512, on / off: b1 4.95 / 5.09 ms, b8 14.43 / 14.51 (a GEMV for every expert of
    # up to 2 tokens, whatever the wave: b1 5.02, b8 15.71 against 14.49: at b8 the dots' throughput wins)
    expert_gemv: bool = True
    # a step that only decodes combines each MoE layer's experts (the weighted sum onto the residual) in down's
    # tasks: the last of a column tile's slot tasks to finish combines that tile's columns (a ticket a tile), and
    # the combine group, kept for steps that prefill, idles. One hand-off a layer fewer at decode. 1 on, 0 off,
    # -1 on where max_batch is 1. H200, Qwen3-30B-A3B ctx512, one call, on / off: b1 4.16 / 4.19 ms (with
    # routing in the router too: 4.15), b8 11.98 / 11.74 (the last slot task of a tile waits out the others)
    moe_combine_in_down: int = -1
    # ... and routes its tokens in the router's tasks: the last of them to finish routes them one after another
    # (`router_routes`), the routing group kept for steps that prefill. Only where max_batch is at most
    # route_loop_rows (a decode step's tokens are routed in turn on one program, not a token a task). 1 on, 0 off,
    # -1 on where max_batch is 1. H200, one call, on / off: b1 4.16 / 4.19 ms, b4 9.05 / 8.68, b8 12.89 / 11.74
    # (the one program routing every token serially is on the critical path). Both on / both off, b1: 4.15 / 4.19
    # and 4.17 / 4.20 (two calls); TTFT 2048 58.44 / 58.36, 512 21.30 / 21.50 (their kernels are max_batch 1)
    moe_route_in_router: int = -1
    # a routing task with at most this many tokens routes them one at a time: a 16-row block's code is ten
    # times one row's, and a layer's one routing program fetches it cold (codegen/bodies/moe.py, route_task).
    # H200, Qwen3-30B-A3B ctx512, one build, 8 / 0: b1 4.96 / 5.96 ms, b8 14.28 / 14.30 (16: 14.35), b64 30.70 / 30.97
    route_loop_rows: int = 8
    block_m: int = 16  # token rows per dot (the minimum tl.dot takes)
    block_k_dot: int = 64  # input columns per tensor-core chunk of the batched blocks and prefill tiles
    qkv_block_m: int = 64  # token rows per QKV block: up to this many, heads split K; beyond, row blocks
    # rows of QKV's prefill tiles; 0: the projections' (`prefill_rows`), at least qkv_block_m. H200, Llama-3-8B,
    # 64 / 128 rows beside 128-row projections, one call, twice each (session 53): TTFT 512 17.05, 16.84 / 16.55,
    # 16.65 ms, 2048 59.49, 59.79 / 58.66, 59.14; TPOT b1 ctx512 4.52, 4.52 / 4.53, 4.52, b64 6.61 / 6.61
    qkv_prefill_m: int = 0
    # input columns per chunk of those split heads' dots (more than block_m rows). H200, Llama-3-8B ctx512, 64 / 32
    # (the rule before: 2048 // qkv_block_m): b64 8.04 / 8.19 ms, b32 7.09 / 7.25; spills 200 / 216 B a thread
    qkv_batch_k: int = 64
    attention_block_m: int = 64  # query rows (tokens x heads of a KV group) per prefill attention block
    # token rows of the projections' tensor-core tiles beyond rows_max rows: a step of up to wide_m rows
    # (batched decode) takes blocks of batch_n columns, each block's K split over batch_n // block_n tasks;
    # a longer one (prefill) shares [prefill_m, wide_n] tiles among the group's tasks. TTFT 512 at wide_n 64 /
    # 128 (H100, session 5): 33.04 / 26.66 ms, at prefill_m 64 / 128: 25.76 / 30.57 (128 rows spill: 338 -> 758 B
    # a thread). wide_m 0: 32 rows where max_batch is at most 32, else 64 (`wide_rows`); the QKV heads' dots
    # take the same rows. H200, Llama-3-8B b32 ctx512, 32 / 64: 6.63 / 7.13 ms (b24 6.59 / 6.99 with 64-row QKV
    # dots for both). A step of up to wide_m rows also prefills on them, so fewer rows cost short prompts: the
    # default kernel (max_batch 8) at 16 / 32 rows (session 55), TTFT of a 24-token prompt 9.64, 9.20 / 6.23 ms
    # (the prefill tiles' 128 rows instead), for b8 5.13 / 5.35 (before narrow_batch_rows, below)
    wide_m: int = 0
    # ... and a step of at most this many rows takes blocks of this many rows instead, where the kernel's are more:
    # a batch of a few sequences (in the default kernel, every decode step), a kernel for many with a few running.
    # 0: never. H200, Llama-3-8B ctx512, a kernel for 64, 16 / 0 in one call (session 55): b8 5.16 / 5.37 ms, b16
    # 5.27 / 5.43, b64 6.75, 6.74 / 6.80, 6.74 (spills alike). The default kernel (32-row blocks) with 16, against
    # 16-row blocks throughout (session 56, one call): b8 5.11, 5.11 / 5.09, b2 4.96, 4.95 / 4.93, TTFT of a 24-token
    # prompt 6.13, 5.67 / 8.93 (its 32-row blocks, before: 5.33, 5.34 at b8)
    narrow_batch_rows: int = 16
    # prefill_m 0: 128 rows where a step prefills 512 tokens or more (max_tokens_per_step), else 64
    # (`prefill_rows`). [128, 128] tiles read a third fewer bytes from L2 a flop than [64, 128], and a prefill's
    # projection groups are bound by what their programs read from L2 together (benchmarks/explore/NOTES.md,
    # session 53); but their accumulator (128 registers a thread) spills elsewhere in the kernel (58 -> 194 B) and
    # their 96 KB of shared memory a program shrink L1. H200, Llama-3-8B, 64 / 128 rows, one call (session 53,
    # twice each): TTFT 512 19.15 / 17.27 ms and 18.73 / 17.05, TPOT b1 ctx512 4.51 / 4.52 and 4.50 / 4.52 (the same
    # kernel); TTFT 128 in a 128-token kernel 9.24 / 10.10 and 8.92 / 9.55, so below 512 it keeps 64. Session 33:
    # TTFT 2048 69.68 / 62.16 and 70.50 / 62.92, 1024 32.87 / 29.71; b8 5.38 / 5.46, b64 7.28 / 7.39 and 7.26 /
    # 7.34. 128 rows at 2 stages (64 KB): TTFT 2048 77.21, b1 4.73. H100 (with the epilogue in halves): TTFT 2048
    # 78.37 / 68.69, b64 9.24 / 9.39. (At 512 tokens they cost b1 6% before the carveout fix, session 36, and saved
    # TTFT 512 only 4% before gate/up's tiles were gated whole, session 47)
    prefill_m: int = 0
    # ... and a prefill step of at most this many tokens takes tiles of 64 rows (QKV's at least qkv_block_m) where
    # the kernel's have more: a short prompt in a kernel whose budget gives 128 rows (the CLI's default) has too
    # few such tiles for the programs. 0: never. Off, since the second set of tiles costs the decode bodies
    # registers: H200, Llama-3-8B, the CLI's default kernel (max_batch 8, 2,048 tokens a step), 256 / 0 in one
    # call (session 56): TTFT of 128 tokens 9.37, 9.79 / 10.66 ms, of 256 12.78, 13.06 / 12.36 (so at most 128 if
    # on), TPOT b1 ctx512 4.68, 4.68 / 4.63, b8 level; the benchmarks' b64 kernel 6.81, 6.85 / 6.68 and TTFT 2048
    # 59.11, 58.84 / 58.12 (stack 664 -> 1,176 B; QKV's tiles alone 1,152, the projections' alone 1,096). Where
    # a 128-token prefill's layer goes (`profile_step --prefill --context 128`, critical us, 64 / 128 rows): QKV
    # 48 / 66, o_proj 36 / 53, gate/up 98 / 85, down 58 / 74
    short_prefill_tokens: int = 0
    # input columns per chunk of the prefill tiles (QKV's too); 0: block_k_dot. H100, 128-row tiles, TTFT 2048:
    # chunks of 64 at 3 stages (96 KB) 72.48 ms; of 32 at 4 / 5 / 6 stages (64 / 80 / 96 KB) 78.47 / 80.27 / 82.47
    prefill_block_k: int = 0
    wide_n: int = 128
    # batch_n 64 (each block's K split over 4 tasks) reads each input column half as often as 32: H200,
    # Llama-3-8B b64 ctx512, 64 at 4 batch stages 8.22 / 8.24 ms against 32 at 6 stages 8.64 / 8.78 (one call
    # each); 64 at 3 / 5 stages 8.76 / 8.15 (5: 80 KB of shared memory), 128 at 3 stages 9.23, 64 at 4 stages
    # through TMA 8.56; H100 b64 9.79 against 9.75 (32 at 6 stages). (Before pinned thread ids and parked state
    # it lost on the H100: 64 at 6 / 4 stages 11.61 / 10.76 ms against 32 at 6 10.58.)
    batch_n: int = 64
    # columns of the batched blocks of a group that runs them whole (no K split: gate/up, an LM head); 0: batch_n.
    # H200, Llama-3-8B ctx512, 128 / 64: b8 5.47 / 5.63 ms, b32 5.92 / 6.09, b64 7.43 / 7.55 (b64's 64-row blocks
    # then take 96 KB of shared memory at batch_stages 4; at 3, 7.65), b1 4.75 / 4.75
    whole_batch_n: int = 128
    # K splits of each batched block (at most batch_n // block_n); 0: the fewest that give a group a task for
    # every program (`codegen.lower.linear_splits`). Tasks of the group past its blocks' splits end at once
    batch_splits: int = 0
    block_kv: int = 32  # keys per attention block
    decode_block_kv: int = 0  # keys per block of a decoding sequence's attention; 0: `codegen.lower.decode_block_kv`
    # attention's scores rounded to bf16 before and after their scaling, as eager attention stores them; off, they
    # stay fp32 as in SDPA's and flash attention's kernels (codegen/bodies/attention.py, `attend`): 6% fewer
    # instructions in the decode key loop, 15% in prefill's. H200, Llama-3-8B, on / off in one call: b64 ctx512
    # 7.25 / 7.14 ms, b1 4.59 / 4.58, TTFT 2048 62.38 / 61.75, 512 19.15 / 19.29; in another, TTFT 512 19.44 /
    # 18.60, b8 5.35 / 5.36, b32 5.77 / 5.75. The GPU tests' error to fp32 falls (b1 0.065 against 0.075)
    attention_bf16_scores: bool = False
    # the QKV epilogue also writes the step's keys and values to rows of their own, and a prefill's attention
    # reads the step's keys from there through tensor descriptors (a bulk copy a block: no per-thread addresses,
    # and no barrier for every thread's copies before the QK dot), the keys of earlier steps from the pages as
    # before (`codegen.bodies.attention.attend_step`). The loop alone, H200, 2,048 tokens (benchmarks/explore/
    # prefill_attention.py): 102 against 127 us; 132 against 163 at a prefill's clocks. In the kernel (H200,
    # Llama-3-8B, `profile_step --prefill --context 2048`) attention takes 142 us a layer against 175, but the
    # kernel's spills grow (TTFT 2048 194 -> 212 B, b64 112 -> 186, b1 56 -> 82) and the other groups slow by
    # about as much: TTFT 2048 59.93 / 59.20 ms against 60.37 / 59.96 in one call, level in another; b64 and b1
    # level. Longer prompts gain more: 4096 128.47 / 129.18 against 131.25 / 130.68, 8192 296.75 / 300.38
    # against 310.90 / 311.50 (those two with a descriptor an item, since made once a task). Off by default: in
    # kernels of 4,096-token steps it costs b64 ctx512 2% (6.76 / 6.82 against 6.65 / 6.67 ms; spills 108 -> 188 B)
    # for TTFT 4096 -0.7% (130.72 against 131.69), b1 level (benchmarks/explore/NOTES.md, sessions 48 and 49)
    attention_step_keys: bool = False
    # software pipelining depth of the projections' K loops: the GEMV and dots up to block_m rows, the
    # batched decode blocks ([wide_m + batch_n] x block_k_dot each), the prefill tiles ([prefill_m + wide_n] x
    # block_k_dot each). 72 KB of shared memory for the last two; at 48 KB (prefill 2 stages) on the H100,
    # b1 7.05 / b8 8.39 ms against 7.14 / 8.57, but TTFT 512 34.70 ms against 26.15. (batch_stages: see batch_n.)
    num_stages: int = 3
    batch_stages: int = 4
    # steps of 2 .. rows_gemv rows take the GEMV, a row at a time over each weight chunk, instead of the
    # tensor-core dots (0: none); the dots over up to block_m rows pipeline rows_stages deep (0: num_stages).
    # H100, Llama-3-8B ctx512, against the dots at 3 stages: b2 rows_gemv 2 7.41-7.44 ms against 7.83 (4 / 8:
    # 10.38 / 18.36 at b4 / b8: a row at a time is compute-bound there, and stages the rows' inputs past 73.7 KB
    # of shared memory); rows_stages 4 at b4, b8, b16 7.52 / 7.60 / 7.99 against 7.76 / 7.84 / 8.29; the dots
    # over K chunks of 128 (half the GEMV's, at most 256) at 8 stages 7.83 (b8). Compiled in only where rows_max
    # is 2 or more: under rows_max 1 no step reaches it, and without it the default kernel (max_batch 8) spills
    # 210 B against 216, H200 b8 5.34 / 5.35 ms against 5.46, b1 and b2 level (session 55)
    rows_gemv: int = 2
    # steps of up to rows_max rows (at most block_m) take the GEMV or those dots, more the batched blocks, which
    # read each input column once for every batch_n weight rows instead of every block_n. H200, Llama-3-8B
    # ctx512, rows_max 2 / 16: b4 6.07 / 6.78 ms, b8 6.18 / 6.84 (4: 6.18), b16 6.43 / 7.06, b1 4.80 / 4.81. And
    # 2 / 1 (session 54, the default kernel: max_batch 8, 2,048 tokens a step, one call): b2 6.13, 6.13 / 5.14,
    # 5.15 (two rows' GEMV against the batched blocks' 32 rows), b1 4.58 / 4.58, b4 5.22 / 5.21
    rows_max: int = 1
    rows_stages: int = 4  # (the QKV heads' few-row dots stay at num_stages: 2 / 4 gave b8 7.74 / 7.67 against 7.59)
    prefill_stages: int = 3
    # ... and of attention's key loop. H100, with claimed tasks (one call): 3 / 2 stages b1 6.77 / 6.75 ms,
    # b8 7.94 / 7.94, b64 10.93 / 11.18, TTFT 512 23.05 / 23.21, 2048 84.11 / 84.43 (before them, session 5:
    # b1 7.08 / 7.00, b64 15.78 / 15.76). With the page ids read an iteration ahead (keys and values then
    # double-buffered), 3 / 4 stages: b1 6.71 / 6.96, b64 10.56 / 11.10 (4: 82 KB of shared memory a program)
    attention_stages: int = 3
    # keys whose page ids attention reads at once (a window; the key loop's pipeline drains between windows), a
    # decoding sequence's and a prefill block's. H200, Llama-3-8B, 512 / 1,024 / 2,048 keys a decode window: b64
    # ctx512 (32-key blocks) 7.41 / 7.47 / 7.36 ms, ctx4096 (64-key blocks) - / 14.46 / 14.16; b1 ctx512 4.69 at 512,
    # 4.72 at 2,048. Alone (`benchmarks/explore/decode_attention.py`, 264 programs, 32-key blocks): b64 ctx513 58.3 /
    # 52.1 / 45.9 us, ctx4097 303 / 282 / 281. Prefill windows of 512 / 1,024 / 2,048 keys: TTFT 512 19.61 / 19.80 ms,
    # 2048 72.26 / 72.26 / 72.27
    decode_window_keys: int = 2048
    prefill_window_keys: int = 512
    # ... and of the loop that merges a decode's context splits, a query row an iteration (every split of the
    # row in one load). H100, b1 at 512 / 4096 tokens of context: 1 / 4 stages 6.90 / 7.02, 7.33 / 7.46 ms
    merge_stages: int = 1
    # ... or the splits only store their partials, and a group of its own (a task a sequence and query head)
    # merges them. H100, Llama-3-8B, against the last split merging its (sequence, KV head)'s: b1 ctx512 6.50 /
    # 6.58 ms, ctx4096 6.86 / 6.98, b2 7.26 / 7.40, b8 7.62 / 7.69
    attention_merge_group: bool = True
    # the batched decode blocks, the prefill tiles load through tensor descriptors made in the kernel (TMA)
    # instead of masked pointer tiles: fewer instructions a chunk (benchmarks/explore/tma_tiles.py), 256 B of
    # global scratch a program. H100: TTFT 512 / 2048 24.05 / 90.03 ms against 24.29 / 94.85 with pointer
    # tiles; b64 13.91 against 13.52 with the batched blocks' (their spills grow)
    batch_tma: bool = False
    prefill_tma: bool = True
    # K splits of a prefill step's projection tiles when there are too few tiles for the group's tasks (a
    # short prompt: 128 tokens give o_proj 64 [prefill_m, wide_n] tiles for 256 tasks, each streaming 1 MB of
    # weights alone); the last split of a tile sums the fp32 parts and runs the epilogue. 0: as many as give
    # each task at most one split, each at least 8 chunks of block_k_dot; n: n wherever the scratch holds them.
    # H200, Llama-3-8B, a 128-token prompt in the CLI's default kernel (o_proj's and down's 32 tiles split 8 ways),
    # twice each in one call (session 56): 0 10.74, 10.65 ms; 4 10.63, 10.45; 2 11.21, 11.17
    prefill_splits: int = 0
    # one in this many rounds of a prefill step's projection tiles (a round: a tile for each of the group's first
    # tasks, one a program), rounded down, goes to its later tasks, a tile each, claimed by whichever program is
    # free first; the rounds before are the first tasks' share (codegen/bodies/linear.py, `linear_task`). Where a
    # group has no more tasks than programs, every tile is theirs. H200, Llama-3-8B, gate/up's tiles (7 / 14 / 28
    # rounds at 512 / 1,024 / 2,048 tokens) with the last 0 / 1 / 2 / 3 / 4 / 6 / 8 rounds claimed, one call:
    # TTFT 512 18.40 / 18.44-18.69 / 18.56, 1024 33.72 / 32.99-33.69 / 34.10 / 34.11, 2048 - / 70.26-71.33 /
    # 69.29 / 68.72-69.25 / 69.04 / 70.19 / 69.53; before, every tile in claimed tasks of 1 (512) or 4 (2,048):
    # 18.75, 34.88, 69.55
    prefill_claimed_part: int = 8
    # a projection with fewer column tiles (tasks) than half the programs gets tasks past them that only prefill
    # steps run, up to a program each for its prefill tiles and their K splits (`codegen.lower._prefill_tasks`):
    # Qwen3-30B-A3B's router (8 tasks) and o_proj (128). None in Llama-3-8B, Phi-4 or Qwen3-32B, whose narrowest
    # projection has 256 or more. H200, Qwen3-30B-A3B, on / off in one call: TTFT 2048 59.36 / 62.46 ms, 512
    # 21.31 / 21.51; TPOT b1 ctx512 4.12 / 4.07, b8 11.63 / 11.51 (the decode steps skip the extra tasks)
    narrow_prefill_tasks: bool = True
    moe_slots: int = 0  # expert slots per MoE layer; 0: min(experts, max_batch * top_k)
    # an MoE layer's RMSNorm folded into its experts' gate/up (their weights' columns scaled by the norm's, each
    # row's products by its 1/rms: the layer has no norm group), or run as a group whose output they read (the
    # router folds it in either way). H200, Qwen3-30B-A3B ctx512, folded / a group, one call: b1 4.94 / 5.13 ms,
    # b8 14.77-14.94 / 14.53-14.60 (spills 204 -> 238 B). A b8 kernel with the group and this code was not timed
    moe_fold_norm: bool = True
    attention_splits: int = 0  # tasks per (sequence, KV head) at decode; 0: ~256 tasks per layer
    sample_splits: int = 0  # tasks per sequence for greedy sampling; 0: one per ~8192 logits
    qkv_splits: int = 0  # tasks per QKV head at decode (split K, last one runs the epilogue); 0: ~one wave
    # programs the kernel runs on where that many fit co-resident (2 per SM of a 132-SM H100/H200): the groups'
    # task counts are sized for it, and the launch takes no more. H100, Llama-3-8B, 256 (gate/up's 1,792 tasks
    # then 7 whole waves, down's and o_proj's 256 one) against 264: b1 6.44 / 6.45 ms, b64 10.96 / 10.88, TTFT
    # 512 22.28 / 22.38
    target_programs: int = 264
    # the most programs the launch puts on an SM (fewer where they do not fit), and a cap on a thread's
    # registers (0: none; Triton takes 255). H100, 3 programs an SM at 168 registers (596 B of spills, grid
    # 396, target_programs 396): b1 8.31 ms against 7.06, b64 13.89 against 12.38, TTFT 512 23.77 against 23.33
    programs_per_sm: int = 2
    max_registers: int = 0
    # programs take every task from one ticket counter instead of the launch's schedule (a group's first wave
    # on programs i % P, the rest claimed by whichever program is done first: codegen/tasks.py, `schedule`):
    # slower on the H100, with acquire-release tickets (b1 7.22 -> 8.46 ms, b8 9.38 -> 12.72) and relaxed
    # ones alike (b1 7.02 -> 8.24, b8 8.31 -> 11.30, b64 12.42 -> 14.47); likely because a group of one
    # wave's tasks can land two to an SM while other SMs idle, where i % P spreads them
    dynamic_tasks: bool = False
    # a one-row step of a projection of at least stream_waves tiles a program shares out its (tile, K chunk)
    # units evenly, a contiguous range a program, instead of a tile a task (codegen/bodies/linear.py,
    # `gemv_stream`): K chunks of stream_block_k, pipelined stream_stages deep, the epilogue stream_tiles tiles
    # at a time. 1: on, 0: off, -1: on where max_batch is at most stream_max_batch and a layer's projection streams
    # (not an LM head alone: H200, Qwen3-30B-A3B b1 5.23 / 5.07 ms on / off). What the balance gains (H200,
    # Llama-3-8B b1: gate/up 62.8 against 67.7 us a layer, the LM head 248 against 267) the body, compiled in,
    # takes back from the batched steps' registers where their blocks have 64 rows (`wide_rows`). H200,
    # Llama-3-8B ctx512, off / on, twice each in one call (session 54): b64 6.65, 6.74 / 6.84, 6.89 ms (spills 154
    # -> 240 B), b32 5.70, 5.69 / 5.71, 5.69; the default kernel (max_batch 8, 2,048 tokens a step) b1 4.77, 4.77 /
    # 4.58, 4.58, b8 5.30, 5.31 / 5.31, 5.30. (Session 30, on / off: b1 4.62 / 4.70, b8 5.36 / 5.30, b64 7.57 /
    # 7.35; TTFT 512 20.18 / 19.79 and 19.72 / 20.08, 2048 73.25 / 72.60; with the GEMV bodies outlined,
    # `outline=rows`: b1 4.69, b8 5.34, b64 7.36.) The H100 loses: b1 6.12 / 6.01 and 6.12 / 5.99 (session 30), so
    # a kernel for one there wants `blinkc compile --set stream_gemv=0`.
    stream_gemv: int = -1
    stream_max_batch: int = 32
    stream_waves: int = 4
    stream_block_k: int = 256
    stream_stages: int = 5
    stream_tiles: int = 16
    # ... and its parts take whole tiles, none shared, where the parts of the most tiles then stream at most this
    # many KB past an even share (0: never): a tile shared by two parts costs each a ticket, and the last of them
    # the tile's epilogue, at the group's end (`codegen.bodies.linear.gemv_stream`). H200, Llama-3-8B b1 ctx512, 64 /
    # 0 / 128 in one call: 4.57 / 4.65 / 4.57 ms (gate/up's parts take 7 tiles or 6 where 6.79 is even, 28 KB past
    # it; the LM head's 31 or 30 for 30.36, 83 KB: the same either way). Without the tail (no settles, no epilogue:
    # wrong results) 4.42 against 4.59 whole, 4.44 without the settles alone: they were the tail's cost
    stream_whole_kb: int = 64
    prefetch_kb: int = 32  # weights each projection/QKV task asks L2 for before waiting on its inputs
    # ... and each task of a projection of attention's output (o_proj), which could bring its weights into L2
    # while attention, which reads little, runs. Measured, it does not pay (those requests may delay attention's
    # own loads, which are on the critical path). H200, Llama-3-8B, 0 / 128 KB in one call: b1 ctx512 4.76 / 4.78
    # ms (twice; 32 KB: 4.74), ctx4096 4.96 / 5.02, b8 6.14 / 6.16, b64 8.10 / 8.11; session 13 5.21 / 5.26 (H200);
    # H100 (session 10) 6.73 / 6.71
    prefetch_attention_kb: int = 0
    # task bodies compiled as functions of their own (`noinline`), comma-separated groups of
    # codegen.bodies.OUTLINE_GROUPS (why, and which cannot be: there). The GEMV and few-row bodies (`rows`) by
    # default, for the compile's sake: Triton's Coalesce pass walks the whole kernel function for each of its
    # tensor loads and stores, about half a cold compile, and a body of its own takes its accesses and its code out
    # of that function. The Llama-3-8B default kernel's cold compile, 2-core CPU machine: 117 s with every body
    # inlined, 82 with `rows`, 77 with `rows,decode_attention` (benchmarks/explore/NOTES.md, session 57). Decode
    # does not feel `rows`: H200, ctx512, none / rows, each twice in one call: the default kernel b1 4.65, 4.66 /
    # 4.66, 4.66 ms, b8 5.17 / 5.15, TTFT 512 17.13, 17.12 / 17.00, 16.88; b64 6.66, 6.67 / 6.68, 6.66;
    # Qwen3-30B-A3B b1 4.09, 4.09 / 4.06, 4.06. `decode_attention` too costs b64 and MoE: rows / rows,
    # decode_attention b64 6.61, 6.60 / 6.71, 6.69, Qwen3-30B-A3B b1 4.06 / 4.13. (Session 24, before the
    # step's state was parked: none / rows,small,decode_attention / rows,decode_attention: Qwen3-30B-A3B b1 5.46 /
    # 7.74 / 6.20 ms.)
    outline: str = "rows"
    # every thread-id read stays where the lowering put it, so no body's index math is hoisted out of the task
    # loop and spilled (codegen/llir.py); Llama-3-8B: 976 -> 416 B of spills a thread
    pin_thread_ids: bool = True
    # the worker loop parks its state (the task's group, claim, signal, the next task's row...) in a line of
    # memory a program while a body runs, instead of ptxas spilling it a copy a thread: its reloads then hit
    # L1 however little shared memory leaves of it. H100, Llama-3-8B ctx512, parked / not: b1 6.08 / 6.31 ms,
    # b8 7.19 / 7.34, b64 9.75 / 9.93, TTFT 512 21.62 / 22.76 (dynamic_tasks: never parked)
    park_state: bool = True
    # activation buffers share regions where one's groups all follow the last users of another
    # (`codegen.lower.shared_activations`); off: every buffer a region of its own, as the first pass lays them out
    share_activations: bool = True
    # the norms' sums of squares in fp64 (`codegen.bodies.common.norm_sums`): every column tile of a value adds its
    # rows' partial sums by atomics, whose order varies from launch to launch, so in fp32 a sum's last bits vary,
    # and with them now and then a bf16 rounding downstream and a greedy token where two logits tie. fp64 sums 256
    # fp32 partials exactly where they lie within a factor 2^21 of each other; where not, it rounds in the 53rd
    # bit, which seldom moves the sum rounded to fp32. H200, one 2,048-token prompt launched again and again
    # (`benchmarks/explore/repeat.py`), Qwen3-30B-A3B: fp32, every launch's logits differ from the first's (up to
    # 0.07, 130k of 152k entries) and the first token flips between two tied logits; fp64, 7 of 7 launches
    # bit-identical. Cost in one call, fp64 / fp32: Llama-3-8B b1 ctx512 4.64 / 4.62 ms, b64 7.10 / 7.12, TTFT
    # 2048 61.88 / 61.43; Qwen3-30B-A3B b1 4.19 / 4.12, TTFT 2048 58.21 / 58.66
    exact_norm_sums: bool = True
    # a wait polls its event with volatile loads and acquires once the count is there (`codegen.bodies.sync.
    # wait_event`), instead of an acquiring atomic a poll: every program's polls of one event are atomics on one
    # address, which an L2 slice serializes. No gain: H200, Llama-3-8B ctx512, off / on in one call (session 63)
    # b1 4.53 / 4.63 ms, b64 6.65 / 6.69 (a wait's atomics are not its cost)
    poll_loads: bool = False
    # a split-K block of more rows (QKV's heads and the batched projections' blocks in steps of many sequences)
    # is finished in slices of this many rows, each split taking its share after waiting for the others where the
    # launch has a program for every split, instead of the last split finishing every row (`codegen.bodies.common.
    # split_slices`; 0: never; a power of two). Only in kernels of more sequences than a slice has rows: the b1 and
    # b8 kernels keep the last split. The last split's epilogue of a [64, 64] block, ~32 elements a thread of
    # straight-line code on one program, was 0.49 ms of a b64 step. H200, Llama-3-8B ctx512, 16 / 0 in one call:
    # b64 6.58 / 7.07 ms and 6.67 / 7.05, b32 5.62 / 5.72, b8 5.25 / 5.29; b1 4.54 / 4.50 and TTFT 512 18.80 /
    # 18.77 (in a kernel of max_batch 1 only short prefills have such blocks)
    split_slice_rows: int = 16
    # the prefill tiles' residual loads and activation stores through tensor descriptors (`store_outputs`; with
    # prefill_tma), instead of pointer tiles in the products' register layout, which move 2 bytes a thread an
    # instruction. A timing-only build without the prefill tiles' epilogue took Llama-3-8B TTFT 2048 from 62.0 to
    # 54.5 ms (H200), and ncu puts 17% of its warp samples in those lines. A first form (the tiles in a for loop,
    # which kept the stores' staging buffers beside the K loop's: 123 KB of shared memory, one program an SM)
    # passed the GPU's prefill tests and lost, TTFT 2048 87.1 against 62.3 ms. This form keeps the kernels' shared
    # memory (CPU builds: 98,328 B at 2,048 tokens a step, 73,752 at 512) and passes the GPU's prefill tests, but
    # does not pay: TTFT level (2048: 62.00 / 61.46 against 61.25 / 61.94 ms) and b64 ctx512 ~1% slower (6.78 /
    # 6.77 against 6.70 / 6.73), one call on an H200. On top of gated_tma: TTFT 2048 58.97 / 58.26 against 58.82 /
    # 59.65, b64 6.74 / 6.73 against 6.70 / 6.69 (benchmarks/explore/NOTES.md, sessions 46 and 47)
    epilogue_tma: bool = False
    # gate/up's 128-row prefill tiles gated over all their rows at once, which halves their columns before any
    # address is made (the other projections' epilogues run a half at a time, `row_halves`), and stored through a
    # tensor descriptor (with prefill_tma). Llama-3-8B, H200, one call: TTFT 2048 58.82 / 59.65 ms against 61.07 /
    # 61.95, b64 ctx512 6.70 / 6.69 against 6.67 / 6.65 (its spills 130 -> 162 B). Gated whole but stored through
    # pointers, as the halves are, it was level: 62.81 / 63.17 against 62.45 / 62.99 (benchmarks/explore/NOTES.md,
    # session 47)
    gated_tma: bool = True
    spin_limit: int = 1 << 26  # spins before a wait is reported as a hang
    profile: bool = False  # record each task's start, end of waits and end in step `profile_step` (GPU only)
    profile_step: int = 2

    def __post_init__(self) -> None:
        if self.short_prefill_tokens < 0:
            raise ValueError(f"short_prefill_tokens must be at least 0, got {self.short_prefill_tokens}")
        if self.prefill_splits < 0:
            raise ValueError(f"prefill_splits must be at least 0, got {self.prefill_splits}")
        for name in ("max_batch", "max_tokens_per_step", "max_model_len", "max_new_tokens", "page_size",
                     "target_programs", "programs_per_sm", "num_stages", "batch_stages", "prefill_stages",
                     "attention_stages", "merge_stages", "expert_stages", "stream_waves", "stream_stages",
                     "prefill_claimed_part"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name, where in (("stream_gemv", "max_batch is at most stream_max_batch"),
                            ("moe_combine_in_down", "max_batch is 1"), ("moe_route_in_router", "max_batch is 1")):
            if getattr(self, name) not in (-1, 0, 1):
                raise ValueError(f"{name} must be 1 (on), 0 (off) or -1 (on where {where}), got {getattr(self, name)}")
        if self.rows_gemv < 0 or self.rows_gemv & (self.rows_gemv - 1):
            raise ValueError(f"rows_gemv must be 0 or a power of two, got {self.rows_gemv}")
        if not 1 <= self.rows_max <= self.block_m:
            raise ValueError(f"rows_max must be between 1 and block_m, got {self.rows_max}")
        for name in ("rows_stages", "route_loop_rows", "batch_splits", "stream_whole_kb", "stream_max_batch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")
        if self.stream_whole_kb > 4096:  # (the kernel weighs it times the parts in int32)
            raise ValueError(f"stream_whole_kb must be at most 4096, got {self.stream_whole_kb}")
        for name in ("block_n", "expert_block_n", "expert_block_k", "block_k", "block_k_dot", "prefill_block_k",
                     "block_m", "qkv_block_m", "attention_block_m", "wide_m", "prefill_m", "wide_n", "batch_n",
                     "whole_batch_n", "block_kv", "decode_block_kv", "page_size", "stream_tiles", "stream_block_k",
                     "qkv_batch_k", "decode_window_keys", "prefill_window_keys", "expert_prefill_m",
                     "expert_prefill_n", "expert_tail_m", "split_slice_rows", "qkv_prefill_m", "narrow_batch_rows"):
            value = getattr(self, name)
            # 0: another field's value, or a choice of the lowering's
            zero_ok = name in ("prefill_block_k", "wide_m", "narrow_batch_rows", "prefill_m", "whole_batch_n",
                               "decode_block_kv", "expert_prefill_m", "expert_tail_m", "split_slice_rows",
                               "qkv_prefill_m")
            if (value <= 0 or value & (value - 1)) and not (zero_ok and value == 0):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if min(self.block_m, self.qkv_block_m, self.attention_block_m) < 16:
            raise ValueError("block_m, qkv_block_m and attention_block_m must be at least 16 (tl.dot)")
        if 0 < self.narrow_batch_rows < 16:
            raise ValueError(f"narrow_batch_rows must be 0 or at least 16 (tl.dot), got {self.narrow_batch_rows}")
        if self.qkv_prefill_m and not 16 <= self.qkv_prefill_m <= 128:  # (tl.dot; an epilogue of two halves at most)
            raise ValueError(f"qkv_prefill_m must be 0 or between 16 and 128, got {self.qkv_prefill_m}")
        unknown = set(filter(None, self.outline.split(","))) - set(OUTLINE_GROUPS)
        if unknown:
            raise ValueError(f"outline: unknown groups {sorted(unknown)}; known: {sorted(OUTLINE_GROUPS)}")
        if self.max_tokens_per_step < self.max_batch:
            raise ValueError("max_tokens_per_step must be at least max_batch (one decode token each)")

    @property
    def expert_prefill_rows(self) -> int:
        """Rows of an expert's prefill blocks (`expert_prefill_m`, or its default for max_tokens_per_step)."""
        return self.expert_prefill_m or (128 if self.max_tokens_per_step >= 1024 else 64)

    @property
    def expert_tail_rows(self) -> int:
        """Rows of the claimed expert blocks that hold an expert's last rows (`expert_tail_m`), where they fit."""
        rows = self.expert_prefill_rows
        return self.expert_tail_m if self.block_m <= self.expert_tail_m < rows else rows

    @property
    def wide_rows(self) -> int:
        """Rows of the batched decode blocks (`wide_m`, or its default for max_batch)."""
        return self.wide_m or (32 if self.max_batch <= 32 else 64)

    @property
    def prefill_rows(self) -> int:
        """Rows of the projections' prefill tiles (`prefill_m`, or its default for max_tokens_per_step)."""
        return self.prefill_m or (128 if self.max_tokens_per_step >= 512 else 64)

    @property
    def short_prefill(self) -> int:
        """`short_prefill_tokens` where it applies: the kernel's prefill tiles have more than 64 rows."""
        return self.short_prefill_tokens if self.prefill_rows > 64 else 0

    @property
    def qkv_prefill_rows(self) -> int:
        """Rows of QKV's prefill tiles (`qkv_prefill_m`, or the projections' and at least qkv_block_m)."""
        return self.qkv_prefill_m or max(self.qkv_block_m, self.prefill_rows)

    @property
    def streams_gemv(self) -> bool:
        """Whether one-row steps may stream their projections (`stream_gemv`, -1 read as max_batch at most
        stream_max_batch; `codegen.lower.Lowering.streamed_widths` says which do)."""
        return self.stream_gemv == 1 or (self.stream_gemv == -1 and self.max_batch <= self.stream_max_batch)

    @property
    def combines_in_down(self) -> bool:
        """Whether a step that only decodes combines its MoE layers in down's tasks (`moe_combine_in_down`)."""
        return self._switch(self.moe_combine_in_down)

    @property
    def routes_in_router(self) -> bool:
        """Whether a step that only decodes routes its MoE layers in the router's tasks (`moe_route_in_router`,
        and only where max_batch is at most route_loop_rows)."""
        return self._switch(self.moe_route_in_router) and self.max_batch <= self.route_loop_rows

    def _switch(self, value: int) -> bool:
        """A switch of 1 (on), 0 (off) or -1 (on where max_batch is 1)."""
        return value == 1 or (value == -1 and self.max_batch == 1)

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

    def to_dict(self) -> dict:
        return {**asdict(self), "max_pages_per_seq": self.max_pages_per_seq}
