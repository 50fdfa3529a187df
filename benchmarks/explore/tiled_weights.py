"""Does the weights' layout in memory set how fast a program streams them? The megakernel reads each weight
chunk as BN rows x BK columns of a row-major [N, K] matrix: at batch 64 a [128, 64] chunk is 128 pieces of 128
bytes, 8 KB apart (a new DRAM row for each piece); at batch 1 a [16, 512] chunk is 16 pieces of 1 KB. Laid out
in tiles of TN rows x TK columns, each tile contiguous ([N / TN, K / TK, TN, TK]), the same chunks become a few
pieces of TN x TK x 2 bytes. This probe times both loops alone, persistent over 264 programs as in the
megakernel, against cuBLAS and the DRAM read bandwidth measured in the same run. A probe, not part of the kernel:

    python -m benchmarks.explore.tiled_weights                         # gate/up, down; b1 GEMV and b64 blocks
    python -m benchmarks.explore.tiled_weights --shapes 28672x4096 --variants "gemv,tn=16 block,tn=128"

A variant: `gemv` (one row, [bn, bk] chunks, defaults bn=16 bk=512 stages=3) or `block` (`--rows` rows times
[bn, bk] chunks on tensor cores, whole blocks, defaults bn=128 bk=64 stages=4), then fields tn (tile rows; 0:
row-major), tk (tile columns, default 64), bn, bk, stages, programs.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms, read_bandwidth_tbs
from benchmarks.explore.variant_fields import with_kind


@triton.jit
def chunk_offsets(n0, k0, K, BN: tl.constexpr, BK: tl.constexpr, TN: tl.constexpr, TK: tl.constexpr):
    """Element offsets of the [BN, BK] chunk at rows n0.., columns k0.. of a [N, K] weight: row-major (TN 0)
    or in contiguous [TN, TK] tiles, tile (i, j) at (i * K / TK + j) * TN * TK."""
    n = n0 + tl.arange(0, BN)[:, None]
    k = k0 + tl.arange(0, BK)[None, :]
    if TN == 0:
        return n.to(tl.int64) * K + k
    return ((n // TN).to(tl.int64) * (K // TK) + k // TK) * (TN * TK) + (n % TN) * TK + k % TK


@triton.jit
def gemv(X, W, Y, N, K, BN: tl.constexpr, BK: tl.constexpr, TN: tl.constexpr, TK: tl.constexpr,
         STAGES: tl.constexpr):
    """y = W x, a task of BN rows at a time, tasks pid, pid + programs, ... (the megakernel's `gemv_row`)."""
    for tile in range(tl.program_id(0), N // BN, tl.num_programs(0)):
        acc = tl.zeros((BN, BK), tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            w = tl.load(W + chunk_offsets(tile * BN, k0, K, BN, BK, TN, TK))
            x = tl.load(X + k0 + tl.arange(0, BK)).to(tl.float32)
            acc += w.to(tl.float32) * x[None, :]
        tl.store(Y + tile * BN + tl.arange(0, BN), tl.sum(acc, 1))


@triton.jit
def blocks(X, W, Y, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TN: tl.constexpr,
           TK: tl.constexpr, STAGES: tl.constexpr):
    """Y = X W^T over BM rows, a block of BN weight rows whole at a time (the megakernel's `split_block`)."""
    rows = tl.arange(0, BM)
    for block in range(tl.program_id(0), N // BN, tl.num_programs(0)):
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            w = tl.load(W + chunk_offsets(block * BN, k0, K, BN, BK, TN, TK))
            x = tl.load(X + rows[:, None] * K + k0 + tl.arange(0, BK)[None, :])
            acc += tl.dot(x, tl.trans(w))
        cols = block * BN + tl.arange(0, BN)
        tl.store(Y + rows[:, None] * N + cols[None, :], acc)


@dataclass(frozen=True)
class Variant:
    kind: str
    tn: int = 0
    tk: int = 64
    bn: int = 0
    bk: int = 0
    stages: int = 0
    programs: int = 264

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        v = with_kind(cls, spec, ("gemv", "block"))
        defaults = dict(bn=16, bk=512, stages=3) if v.kind == "gemv" else dict(bn=128, bk=64, stages=4)
        return replace(v, **{key: getattr(v, key) or value for key, value in defaults.items()})

    def __str__(self) -> str:
        return f"{self.kind} tn={self.tn} tk={self.tk} bn={self.bn} bk={self.bk} stages={self.stages}"


def tiled(w: torch.Tensor, tn: int, tk: int) -> torch.Tensor:
    n, k = w.shape
    return w.view(n // tn, tn, k // tk, tk).permute(0, 2, 1, 3).contiguous() if tn else w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="28672x4096,4096x14336", help="N x K of each weight")
    parser.add_argument("--rows", type=int, default=64, help="rows of the `block` variants")
    parser.add_argument("--variants", default="gemv gemv,tn=16 gemv,tn=128 block block,tn=128 block,tn=16 "
                                              "gemv block,tn=128")
    args = parser.parse_args()
    device = torch.device("cuda")
    dram = read_bandwidth_tbs(device)
    print(f"{torch.cuda.get_device_name()}: DRAM read {dram:.2f} TB/s")
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k ** 0.5
        weight_bytes = w.numel() * w.element_size()
        with torch.inference_mode():
            for rows in (1, args.rows):
                x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
                ms = median_ms(lambda: x @ w.T, device, num_warmup=3, num_reps=30)
                print(f"[{n}, {k}] cuBLAS, {rows} rows | {ms * 1e3:.1f} us | {weight_bytes / ms / 1e9:.2f} TB/s")
        for spec in args.variants.split():
            v = Variant.parse(spec)
            wt = tiled(w, v.tn, v.tk)
            rows = 1 if v.kind == "gemv" else args.rows
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            y = torch.empty(rows, n, device=device, dtype=torch.float32)
            if v.kind == "gemv":
                launch = lambda: gemv[(v.programs,)](x, wt, y, n, k, BN=v.bn, BK=v.bk, TN=v.tn, TK=v.tk,  # noqa: E731
                                                     STAGES=v.stages, num_warps=4)
            else:
                launch = lambda: blocks[(v.programs,)](x, wt, y, n, k, BM=rows, BN=v.bn, BK=v.bk, TN=v.tn,  # noqa: E731
                                                       TK=v.tk, STAGES=v.stages, num_warps=4)
            launch()
            expected = (x.float() @ w.float().T)
            error = (y - expected).abs().max().item() / expected.abs().max().item()
            if error > 1e-2:
                raise SystemExit(f"{v}: relative error {error:.2e}")
            ms = median_ms(launch, device, num_warmup=3, num_reps=30)
            print(f"[{n}, {k}] {v} | {ms * 1e3:.1f} us | {weight_bytes / ms / 1e9:.2f} TB/s")


if __name__ == "__main__":
    main()
