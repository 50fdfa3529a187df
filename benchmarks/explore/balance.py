"""Would a batch-1 GEMV group end sooner if its last pieces went to whichever program is free, and what does a
stream cost alone? (probe, not the kernel)

`gemv_stream` shares a group's (tile, K chunk) units out evenly, one contiguous range a program. This probe
streams one [N, K] bf16 GEMV on 2 programs an SM in three ways and prints each one's span (first start to last
end, global timer), how far the last program ends after the median one, and a program's median time:

- `equal`: `gemv_stream`'s contiguous equal ranges;
- `claim:KP`: every item ([16, KP] of weights: a tile's K range of KP columns) claimed from one counter, a claim
  ahead (asked for when the item before starts);
- `hybrid:F:KP`: equal ranges over the first F of the units, then claimed items of the rest;
- `rows8`, `pairs8`: equal ranges of whole tiles of 8 rows, [8, 2 x --bk] chunks: rows 8i .. 8i + 7, or the
  rotary pairs a streamed QKV's tile holds (rows 4i .. 4i + 3 of every 128 and the 4 64 rows on).

Partial sums go to the output by relaxed fp32 atomics (the kernel would settle them; the probe times the
stream). Shapes: Llama-3-8B's gate/up, down, QKV, o_proj and LM head, or NxK (`--shapes`). Each launch follows
a 256 MB memset that flushes L2, unless `--no-flush` (then a matrix under ~50 MB is read from L2); `--touch KB`
first loads a byte every KB of the weights (every page's translation, next to nothing in L2). H200 (benchmarks/
RESULTS.md, session 44): claimed pieces lose (each restarts its pipeline; the tail they would trim is ~2 us),
and a flushed launch costs ~7.5 us more than an unflushed one whatever its size.

    python -m benchmarks.explore.balance [--modes equal,claim:1024,hybrid:0.9:1024] [--shapes gate_up,7168x4096]
        [--no-flush] [--touch KB] [--bk 256 --stages 5]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from benchmarks.explore.sm_speed import _now

BN, BK = 16, 512
SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096), "o_proj": (4096, 4096),
          "lm_head": (128256, 4096)}


@triton.jit
def _tile_piece(W, X, OUT, item, pieces, K, KP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                STAGES: tl.constexpr):
    """Item `item`: tile item // pieces over K columns (item % pieces) * KP .. + KP, its sums added to OUT."""
    lanes = tl.arange(0, BN)
    ks = tl.arange(0, BK)
    j = item // pieces
    k_lo = (item - j * pieces) * KP
    acc = tl.zeros((BN, BK), tl.float32)
    for k0 in tl.range(k_lo, k_lo + KP, BK, num_stages=STAGES):
        w = tl.load(W + (j.to(tl.int64) * BN * K + k0) + lanes[:, None] * K + ks[None, :])
        x = tl.load(X + k0 + ks).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    tl.atomic_add(OUT + j * BN + lanes, tl.sum(acc, 1), sem="relaxed")


@triton.jit
def stream(W, X, OUT, CLAIM, TIMES, K, N, static_units, KP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           STAGES: tl.constexpr):
    """Units 0 .. static_units in equal contiguous ranges (as `gemv_stream`), then [BN, KP] items of the rest
    claimed from the counter at CLAIM; TIMES[p] = (start, end)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    start = _now()
    chunks = K // BK
    lanes = tl.arange(0, BN)
    ks = tl.arange(0, BK)
    u0 = pid * static_units // programs
    u1 = (pid + 1) * static_units // programs
    acc = tl.zeros((BN, BK), tl.float32)
    for u in tl.range(u0, u1, num_stages=STAGES):
        j = u // chunks
        k0 = (u - j * chunks) * BK
        w = tl.load(W + (j.to(tl.int64) * BN * K + k0) + lanes[:, None] * K + ks[None, :])
        x = tl.load(X + k0 + ks).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        if (u - j * chunks == chunks - 1) | (u == u1 - 1):
            tl.atomic_add(OUT + j * BN + lanes, tl.sum(acc, 1), sem="relaxed")
            acc = acc * 0.0
    pieces = K // KP
    first = static_units // (KP // BK)
    items = N // BN * pieces
    if first < items:
        item = first + tl.atomic_add(CLAIM, 1)
        while item < items:
            ahead = first + tl.atomic_add(CLAIM, 1)  # the next claim's trip overlaps this item's stream
            _tile_piece(W, X, OUT, item, pieces, K, KP, BN, BK, STAGES)
            item = ahead
    tl.debug_barrier()
    tl.store(TIMES + pid * 2, start)
    tl.store(TIMES + pid * 2 + 1, _now())


@triton.jit
def stream_rows8(W, X, OUT, TIMES, K, N, PAIRED: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """`stream`'s equal ranges in tiles of 8 rows: rows 8i .. 8i + 7, or (PAIRED, the rotary pairs of a QKV
    streamed in whole tiles, every 128 rows a head) rows 4i .. 4i + 3 of a head and the 4 half a head on."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    start = _now()
    chunks = K // BK
    tiles = N // 8
    t0 = pid * tiles // programs
    t1 = (pid + 1) * tiles // programs
    lanes = tl.arange(0, 8)
    ks = tl.arange(0, BK)
    acc = tl.zeros((8, BK), tl.float32)
    for u in tl.range(t0 * chunks, t1 * chunks, num_stages=STAGES):
        j = u // chunks
        k0 = (u - j * chunks) * BK
        if PAIRED:
            head = j // 16
            i = j - head * 16
            rows = head * 128 + 4 * i + lanes % 4 + lanes // 4 * 64
        else:
            rows = j * 8 + lanes
        w = tl.load(W + k0 + rows[:, None] * K + ks[None, :])
        x = tl.load(X + k0 + ks).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        if u - j * chunks == chunks - 1:
            tl.store(OUT + rows, tl.sum(acc, 1))
            acc = acc * 0.0
    tl.debug_barrier()
    tl.store(TIMES + pid * 2, start)
    tl.store(TIMES + pid * 2 + 1, _now())


@triton.jit
def touch(W, SINK, total, STRIDE: tl.constexpr):
    """One byte every STRIDE bytes of W's first `total` (W as bytes), summed into SINK so that the loads stay:
    every page's translation asked for, next to nothing brought into L2."""
    offs = (tl.program_id(0) * 256 + tl.arange(0, 256)).to(tl.int64) * STRIDE
    v = tl.load(W + offs, mask=offs < total, other=0)
    tl.atomic_add(SINK, tl.sum(v.to(tl.int32), 0), sem="relaxed")


def parse(mode: str, units: int, K: int, bk: int = BK) -> tuple[int, int]:
    """(static units, KP) of a mode (`rows8`, `pairs8`: `stream_rows8`'s, whose chunks are [8, 2 bk])."""
    name, *args = mode.split(":")
    if name in ("equal", "rows8", "pairs8"):
        return units, bk
    kp = int(args[-1])
    if K % kp or kp % bk:
        raise ValueError(f"{mode}: KP must divide K ({K}) and be a multiple of {bk}")
    fraction = float(args[0]) if name == "hybrid" else 0.0
    per_item = kp // bk
    return int(units * fraction) // per_item * per_item, kp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="equal,claim:4096,claim:1024,hybrid:0.8:1024,hybrid:0.9:1024,"
                                            "hybrid:0.9:512,hybrid:0.95:512")
    parser.add_argument("--shapes", default="gate_up,down,qkv,lm_head")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--bk", type=int, default=BK, help="input columns a chunk (the kernel's stream_block_k: 256)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--no-flush", action="store_true", help="leave L2 (and the TLBs) as the last launch left them")
    parser.add_argument("--touch", type=int, default=0,
                        help="before each launch (after the flush), load a byte every TOUCH KB of the weights")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = 2 * sms
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    times = torch.zeros(programs * 2, device="cuda", dtype=torch.int64)
    claim = torch.zeros(1, device="cuda", dtype=torch.int32)
    sink = torch.zeros(1, device="cuda", dtype=torch.int32)
    print(f"{torch.cuda.get_device_name(0)}: {programs} programs, [{BN}, {args.bk}] chunks {args.stages} deep")
    for shape in args.shapes.split(","):
        N, K = SHAPES[shape] if shape in SHAPES else map(int, shape.split("x"))
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(K, device="cuda", dtype=torch.bfloat16)
        out = torch.zeros(N, device="cuda", dtype=torch.float32)
        ref = (w.float() @ x.float())
        units = N // BN * (K // args.bk)
        for mode in args.modes.split(","):
            try:
                static, kp = parse(mode, units, K, args.bk)
            except ValueError as e:
                print(f"  {shape} {mode}: skipped ({e})")
                continue
            spans, tails, skews, busy = [], [], [], []
            for _ in range(args.reps):
                if not args.no_flush:
                    flush.zero_()  # the weights come from DRAM
                if args.touch:
                    stride = args.touch << 10
                    total = N * K * 2
                    touch[(triton.cdiv(total // stride + 1, 256),)](w.view(torch.uint8), sink, total, STRIDE=stride)
                claim.zero_()
                out.zero_()
                if mode in ("rows8", "pairs8"):  # (the output is stored, not added)
                    stream_rows8[(programs,)](w, x, out, times, K, N, PAIRED=mode == "pairs8", BK=2 * args.bk,
                                              STAGES=args.stages, num_warps=4)
                else:
                    stream[(programs,)](w, x, out, claim, times, K, N, static, KP=kp, BN=BN, BK=args.bk,
                                        STAGES=args.stages, num_warps=4)
                torch.cuda.synchronize()
                t = times.view(programs, 2).cpu()
                spans.append(int(t[:, 1].max() - t[:, 0].min()) / 1e3)
                ends = (t[:, 1] - t[:, 0].min()).double() / 1e3
                tails.append(float(ends.max() - ends.median()))
                skews.append(int(t[:, 0].max() - t[:, 0].min()) / 1e3)
                busy.append(float((t[:, 1] - t[:, 0]).double().median()) / 1e3)
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            spans.sort()
            tails.sort()
            skews.sort()
            busy.sort()
            median = spans[len(spans) // 2]
            print(f"  {shape} [{N}, {K}] {N * K * 2 / 1e6:.0f} MB  {mode:<16} span {median:7.1f} us "
                  f"(min {spans[0]:.1f}), {N * K * 2 / median / 1e6:.2f} TB/s; last end - median end "
                  f"{tails[len(tails) // 2]:.1f} us; starts {skews[len(skews) // 2]:.1f} us apart, a program's "
                  f"median {busy[len(busy) // 2]:.1f}; static units {static}/{units}; err {err:.1e}")


if __name__ == "__main__":
    main()
