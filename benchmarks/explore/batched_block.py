"""The batched decode block alone: [rows, BN] products of a projection over split K ranges, as the megakernel's
`split_block` computes them at batch 64 (x [64, K] bf16 times W [N, K] bf16; the last split of a block sums the
fp32 partials in order, with the megakernel's `sum_of_splits`), in a standalone Triton kernel whose shape can
change in seconds. Prints each variant's time and
its weight stream in TB/s next to cuBLAS's `x @ W.T` and the DRAM read bandwidth measured in the same run.
A probe for the megakernel's batched path, not part of it:

    python -m benchmarks.explore.batched_block                     # Llama-3-8B's gate/up, the default variants
    python -m benchmarks.explore.batched_block --shape 4096x14336  # down
    python -m benchmarks.explore.batched_block --variants "bn=64,splits=4 bn=128,splits=4,warps=8"
    python -m benchmarks.explore.batched_block --shape 4096x4096 --rows 8 --variants "default swap=1"

A variant is comma-separated fields of `Variant` (bn, bk, splits, stages, warps, programs (0: one per task),
tma (0/1), rotate (0/1), reduce (0/1), swap (0/1)); "default" is the megakernel's batched block at 64 columns,
4 splits. GPU only: the interpreter's bf16 dots are not numpy's to compute.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms, read_bandwidth_tbs
from benchmarks.explore.variant_fields import with_fields
from codegen.bodies.common import sum_of_splits
from codegen.bodies.linear import tile_product


@triton.jit
def split_blocks(X, W, PARTS, OUT, M, N, K, splits, part_off, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 STAGES: tl.constexpr, TMA: tl.constexpr, REDUCE: tl.constexpr, ROTATE: tl.constexpr,
                 SWAP: tl.constexpr = False):
    """Task t (block t // splits, split t % splits; programs take every grid-th task) computes the fp32 product
    of all M rows (M = BM) and the block's BN weight rows over its split's K range. Without REDUCE it stores it
    to its split's [M, N] plane of the partials at PARTS + part_off. With REDUCE, as the megakernel does, a
    whole block stores it to OUT; a split stores it to the block's slot at PARTS + part_off, and the split that
    takes the block's ticket (PARTS[block]) last sums the partials in order into OUT and zeroes the ticket for
    the next launch. M may be fewer rows than BM (the rest masked). SWAP: `swapped_product` instead."""
    num_blocks = tl.cdiv(N, BN)
    chunk = tl.cdiv(tl.cdiv(K, splits), BK) * BK
    rows = tl.arange(0, BM)
    for t in range(tl.program_id(0), num_blocks * splits, tl.num_programs(0)):
        block, split = t // splits, t % splits
        n0, k_lo = block * BN, split * chunk
        k_hi = tl.multiple_of(tl.minimum(K, k_lo + chunk), 8)  # as `split_block`: keeps the K mask vector-wide
        cols = n0 + tl.arange(0, BN)
        # the megakernel's K loop itself (`tile_product`); ROTATE: block b starts its K range b chunks in and
        # wraps around (two loops), so that the programs' loads at one moment fall on different offsets within
        # the weight rows (a power-of-two stride)
        rot = (block % tl.cdiv(k_hi - k_lo, BK)) * BK if ROTATE else 0
        if SWAP:
            acc = swapped_product(X, W, K, N, n0, k_lo, k_hi, M, BM, BN, BK, STAGES)
        else:
            acc = tile_product(0, K, K, 0, N, 0, n0, k_lo + rot, k_hi, M, W, X, BM, BN, BK, False, STAGES, TMA)
        if ROTATE:
            acc += tile_product(0, K, K, 0, N, 0, n0, k_lo, k_lo + rot, M, W, X, BM, BN, BK, False, STAGES, TMA)
        if REDUCE:
            if splits == 1:
                tl.store(OUT + rows[:, None] * N + cols[None, :], acc, mask=(rows < M)[:, None] & (cols < N)[None, :])
            else:
                last, total = sum_of_splits(PARTS, part_off, 0, block, split, splits, acc, rows, BM)
                if last:
                    tl.store(PARTS + block, 0.0)
                    tl.store(OUT + rows[:, None] * N + cols[None, :], total,
                             mask=(rows < M)[:, None] & (cols < N)[None, :])
        else:
            tl.store(PARTS + part_off + split * M * N + rows[:, None] * N + cols[None, :], acc,
                     mask=(rows < M)[:, None] & (cols < N)[None, :])


@triton.jit
def swapped_product(X, W, K, N, n0, k_lo, k_hi, num_rows, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    STAGES: tl.constexpr):
    """`tile_product` with the operands swapped: the BN weight rows are the dot's M (a warp group's wgmma takes
    64 rows of M, where up to 32 input rows as M take the mma.sync path) and the input rows its N; [BM, BN]."""
    cols = n0 + tl.arange(0, BN)
    rows = tl.arange(0, BM)
    x_rows = X + rows[:, None] * K
    w_rows = W + cols[:, None].to(tl.int64) * K
    acc = tl.zeros((BN, BM), tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        w = tl.load(w_rows + ks[None, :], mask=(cols < N)[:, None], other=0.0)
        x = tl.load(x_rows + ks[None, :], mask=(rows < num_rows)[:, None], other=0.0)
        acc += tl.dot(w, tl.trans(x))
    return tl.trans(acc)


@dataclass(frozen=True)
class Variant:
    bn: int = 64
    bk: int = 64
    splits: int = 4
    stages: int = 4
    warps: int = 4
    programs: int = 264  # 0: one program a task
    tma: int = 0
    rotate: int = 0  # 1: each block starts its K range at a different chunk
    reduce: int = 1  # the last split sums the partials (the megakernel's `sum_of_splits`); 0: stores only
    swap: int = 0  # 1: the weight rows as the dot's M (`swapped_product`)

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        return with_fields(cls(), spec.split(","), spec)

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) !=
                        f.default) or "default"


DEFAULT_VARIANTS = ("splits=1 splits=2 reduce=0 bn=128,splits=1 bn=128,splits=2 bn=32,splits=8 programs=0 "
                    "warps=8 stages=6 tma=1 bn=128,splits=4,stages=3,bk=128")


def run_variant(v: Variant, x: torch.Tensor, w: torch.Tensor, expected: torch.Tensor) -> float:
    m, k = x.shape
    n = w.shape[0]
    blocks = triton.cdiv(n, v.bn)
    part_off = -(-blocks // 16) * 16  # the blocks' tickets, then the partials (16-float aligned)
    bm = max(16, triton.next_power_of_2(m))  # the dot's rows (the partials' too), m of them real
    scratch = torch.zeros(part_off + v.splits * bm * n, device=x.device, dtype=torch.float32)
    parts = scratch[part_off:part_off + v.splits * m * n].view(v.splits, m, n)  # (without REDUCE: split-major)
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    grid = (v.programs or blocks * v.splits,)
    launch = lambda: split_blocks[grid](  # noqa: E731
        x, w, scratch, out, m, n, k, v.splits, part_off, BM=bm, BN=v.bn, BK=v.bk,
        STAGES=v.stages, TMA=bool(v.tma), REDUCE=bool(v.reduce), ROTATE=bool(v.rotate), SWAP=bool(v.swap),
        num_warps=v.warps)
    launch()
    result = out if v.reduce else parts.sum(0)
    error = (result - expected).abs().max().item() / expected.abs().max().item()
    if error > 1e-2:
        raise SystemExit(f"{v}: relative error {error:.2e} against torch")
    return median_ms(launch, x.device, num_warmup=3, num_reps=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="28672x4096", help="N x K of the weight (default: Llama-3-8B gate/up)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--variants", default="default " + DEFAULT_VARIANTS)
    args = parser.parse_args()
    device = torch.device("cuda")
    # descriptors made in a kernel need a scratch allocator
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    n, k = map(int, args.shape.split("x"))
    x = torch.randn(args.rows, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k ** 0.5
    weight_bytes = w.numel() * w.element_size()
    dram = read_bandwidth_tbs(device)
    with torch.inference_mode():
        expected = (x @ w.T).float()
        cublas = median_ms(lambda: x @ w.T, device, num_warmup=3, num_reps=30)
    print(f"{torch.cuda.get_device_name()}: [{args.rows}, {k}] x [{n}, {k}].T, {weight_bytes / 1e6:.0f} MB of "
          f"weights; DRAM read {dram:.2f} TB/s")
    print(f"cuBLAS x @ W.T | {cublas * 1e3:.1f} us | {weight_bytes / cublas / 1e9:.2f} TB/s | 1.00x")
    for spec in args.variants.split():
        v = Variant.parse("" if spec == "default" else spec)
        try:
            ms = run_variant(v, x, w, expected)
        except Exception as e:  # a shape that does not compile (shared memory, registers): say so, go on
            print(f"{v} | failed: {str(e).splitlines()[0][:120]}")
            continue
        print(f"{v} | {ms * 1e3:.1f} us | {weight_bytes / ms / 1e9:.2f} TB/s | {cublas / ms:.2f}x")


if __name__ == "__main__":
    main()
