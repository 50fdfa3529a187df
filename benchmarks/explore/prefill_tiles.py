"""How fast can a persistent Triton kernel run Llama-3-8B's prefill projections, by tile shape? A probe
for the megakernel's prefill tiles (today [64, 128] over 64-column chunks, 3 stages, 4 warps, two programs an
SM, TMA descriptors made in the kernel), not part of it. Each variant is a standalone persistent GEMM
(`out = x @ w.T`, bf16 in, fp32 accumulate, bf16 out) with the megakernel's loop structure: every program
takes every P-th tile, row blocks innermost. Prints TFLOP/s per shape next to cuBLAS (torch.matmul) in the
same run. GPU only:

    python -m benchmarks.explore.prefill_tiles [--tokens 512,2048] [--variants 128x128x64/3/4/2,128x128x64/3/4/1/1]

A seventh number 1 asks Triton 3.6 for its automatic warp specialization of the K loop (`tl.range(...,
warp_specialize=True)`). On Hopper it adds a producer warp group and splits the tile over two consumer groups, so a
4-warp kernel runs 12 warps. On an H200 (session 20) every such variant computed wrong products in this persistent
loop (the script prints "wrong"), so their times mean nothing.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

# (name, N, K) of Llama-3-8B's projections: QKV, o_proj, gate/up (interleaved), down
SHAPES = (("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
# (BM, BN, BK, stages, warps, programs an SM[, warp-specialized])
VARIANTS = ((64, 128, 64, 3, 4, 2), (128, 128, 64, 3, 4, 1), (128, 128, 64, 3, 8, 1), (128, 128, 64, 4, 8, 1),
            (128, 256, 64, 3, 8, 1), (64, 256, 64, 3, 4, 1), (128, 128, 64, 3, 8, 2), (64, 128, 64, 4, 4, 2),
            (128, 128, 64, 3, 4, 1, 1), (128, 128, 64, 4, 4, 1, 1), (128, 256, 64, 3, 4, 1, 1))


@triton.jit
def gemm(X, W, OUT, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
         WS: tl.constexpr):
    row_blocks = tl.cdiv(M, BM)
    xd = tl.make_tensor_descriptor(X, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    wd = tl.make_tensor_descriptor(W, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    for t in range(tl.program_id(0), row_blocks * tl.cdiv(N, BN), tl.num_programs(0)):
        m0 = (t % row_blocks) * BM
        n0 = (t // row_blocks) * BN
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES, warp_specialize=WS):
            acc = tl.dot(xd.load([m0, k0]), tl.trans(wd.load([n0, k0])), acc)
        rows, cols = m0 + tl.arange(0, BM), n0 + tl.arange(0, BN)
        tl.store(OUT + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16),
                 mask=(rows < M)[:, None] & (cols < N)[None, :])


def time_ms(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="512,2048")
    parser.add_argument("--variants", help="BMxBNxBK/stages/warps/programs an SM, comma-separated (default: the "
                                           "module's list)")
    args = parser.parse_args()
    variants = VARIANTS if not args.variants else [
        tuple(int(v) for v in spec.replace("x", "/").split("/")) for spec in args.variants.split(",")]
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}, {sms} SMs, Triton {triton.__version__}")
    variants = [tuple(v) + (0,) * (7 - len(v)) for v in variants]
    print("tokens | shape | cuBLAS TFLOP/s | " + " | ".join(
        f"{bm}x{bn}x{bk} s{s} w{w} {p}/SM{' ws' if ws else ''}" for bm, bn, bk, s, w, p, ws in variants))
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name, n, k in SHAPES:
            x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            flop = 2 * tokens * n * k
            ref = x @ w.T
            cells = [f"{flop / time_ms(lambda: x @ w.T) / 1e9:.0f}"]
            for bm, bn, bk, stages, warps, per_sm, ws in variants:
                out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)

                def run():
                    gemm[(sms * per_sm,)](x, w, out, tokens, n, k, bm, bn, bk, stages, bool(ws), num_warps=warps)
                try:
                    ms = time_ms(run)
                    error = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    cells.append(f"{flop / ms / 1e9:.0f}" + ("" if error < 1e-2 else f" (wrong: {error:.2g})"))
                except Exception as e:  # a variant that does not fit (shared memory, registers)
                    cells.append(f"failed: {type(e).__name__}")
            print(f"{tokens} | {name} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
