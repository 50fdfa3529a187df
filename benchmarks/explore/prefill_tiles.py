"""How fast can a persistent Triton kernel run Llama-3-8B's prefill projections, by tile shape? A probe
for the megakernel's prefill tiles (today [64, 128] over 64-column chunks, 3 stages, 4 warps, two programs an
SM, TMA descriptors made in the kernel), not part of it. Each variant is a standalone persistent GEMM
(`out = x @ w.T`, bf16 in, fp32 accumulate, bf16 out) with the megakernel's loop structure: every program
takes every P-th tile, row blocks innermost. Prints TFLOP/s per shape next to cuBLAS (torch.matmul) in the
same run. GPU only:

    python -m benchmarks.explore.prefill_tiles [--tokens 512,2048] [--variants 128x128x64/3/4/2,128x128x64/3/4/1/1]

A variant is BMxBNxBK/stages/warps/programs an SM, then optional numbers (0: off):
- 7th, 1: Triton 3.6's automatic warp specialization of the K loop (`tl.range(..., warp_specialize=True)`). On
  Hopper it adds a producer warp group and splits the tile over two consumer groups, so a 4-warp kernel runs 12
  warps. On an H200 (session 20) every such variant computed wrong products in this persistent loop (the script
  prints "wrong"), so their times mean nothing.
- 8th, 1: the tile and K loops flattened into one (`tl.range(..., flatten=True)`), so that the pipeline may load
  the next tile's first chunks during this tile's epilogue.
- 9th, G: the tiles in bands of G row blocks, every column tile of a band (row blocks innermost) before the next
  band, so that fewer programs read one weight chunk at once (the weights are read once a band).
- 10th, 1: the tensor descriptors made once a tile, as the megakernel's `tile_product` makes them.
- 11th, 1: the megakernel's gate/up epilogue instead of a plain store: the product's columns alternate gate and
  up, and the tile stores silu(gate) * up (half its width), rounded to bf16 as `kept_epilogue` rounds.
- 12th, C: the tiles handed out as the megakernel's groups hand them: N / C tasks (C: the decode tiles' columns,
  16), program p runs tasks p, p + P, ..., and task j takes tiles j, j + N / C, ... (P programs). Otherwise
  program p takes tiles p, p + P, ....
- 13th, R: each tile's K loop starts at chunk ((row block + column tile) % R) * (K chunks / R) and wraps
  around, so that the programs sharing a weight chunk (other row blocks) or an input chunk (other columns) do
  not all ask for it at once when a wave starts in step.
- 14th, P / 15th, Q: the weights' / the inputs' rows are P / Q elements longer than K (views of wider
  matrices), so that the rows a chunk reads lie a stride apart that is not a power of two (8 KB at K = 4,096).

`--sustained N` times N launches back to back (the clocks a tens-of-milliseconds prefill runs at) instead of the
best of 10. H200 findings (session 32): NOTES.md.
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
def gemm(X, W, OUT, M, N, K, X_STRIDE, W_STRIDE, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
         STAGES: tl.constexpr, WS: tl.constexpr, FLAT: tl.constexpr, BAND: tl.constexpr, TILE_DESC: tl.constexpr,
         GATED: tl.constexpr, TASK_COLS: tl.constexpr, ROT: tl.constexpr):
    row_blocks = tl.cdiv(M, BM)
    xd = tl.make_tensor_descriptor(X, shape=[M, K], strides=[X_STRIDE, 1], block_shape=[BM, BK])
    wd = tl.make_tensor_descriptor(W, shape=[N, K], strides=[W_STRIDE, 1], block_shape=[BN, BK])
    tiles = row_blocks * tl.cdiv(N, BN)
    if TASK_COLS > 0:  # the megakernel's hand-out: tasks p, p + P, ...; task j's tiles j, j + N / C, ...
        num_tasks = tl.cdiv(N, TASK_COLS)
        for task in range(tl.program_id(0), num_tasks, tl.num_programs(0)):
            _tiles(X, W, OUT, M, N, K, X_STRIDE, W_STRIDE, xd, wd, row_blocks, tiles, task, num_tasks, BM, BN, BK,
                   STAGES, WS, FLAT, BAND, TILE_DESC, GATED, ROT)
    else:
        _tiles(X, W, OUT, M, N, K, X_STRIDE, W_STRIDE, xd, wd, row_blocks, tiles, tl.program_id(0), tl.num_programs(0),
               BM, BN, BK, STAGES, WS, FLAT, BAND, TILE_DESC, GATED, ROT)


@triton.jit
def _tiles(X, W, OUT, M, N, K, X_STRIDE, W_STRIDE, xd, wd, row_blocks, tiles, first, stride, BM: tl.constexpr,
           BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr, FLAT: tl.constexpr,
           BAND: tl.constexpr, TILE_DESC: tl.constexpr, GATED: tl.constexpr, ROT: tl.constexpr):
    for t in tl.range(first, tiles, stride, flatten=FLAT):
        if BAND > 0:
            band_tiles = BAND * tl.cdiv(N, BN)
            band = t // band_tiles
            rows_in_band = tl.minimum(BAND, row_blocks - band * BAND)
            local = t - band * band_tiles
            m0 = (band * BAND + local % rows_in_band) * BM
            n0 = (local // rows_in_band) * BN
        else:
            m0 = (t % row_blocks) * BM
            n0 = (t // row_blocks) * BN
        if TILE_DESC:
            xd = tl.make_tensor_descriptor(X, shape=[M, K], strides=[X_STRIDE, 1], block_shape=[BM, BK])
            wd = tl.make_tensor_descriptor(W, shape=[N, K], strides=[W_STRIDE, 1], block_shape=[BN, BK])
        acc = tl.zeros((BM, BN), tl.float32)
        if ROT > 0:
            shift = ((m0 // BM + n0 // BN) % ROT) * (tl.cdiv(K, BK) // ROT) * BK
        else:
            shift = 0
        for k0 in tl.range(0, K, BK, num_stages=STAGES, warp_specialize=WS):
            k = k0 + shift
            k = tl.where(k >= K, k - K, k)
            acc = tl.dot(xd.load([m0, k]), tl.trans(wd.load([n0, k])), acc)
        rows, cols = m0 + tl.arange(0, BM), n0 + tl.arange(0, BN)
        if GATED:
            y = acc.to(tl.bfloat16).to(tl.float32)
            gate, up = tl.split(tl.reshape(y, (BM, BN // 2, 2)))
            h = (gate / (1.0 + tl.exp(-gate))).to(tl.bfloat16).to(tl.float32) * up
            half = n0 // 2 + tl.arange(0, BN // 2)
            tl.store(OUT + rows[:, None] * (N // 2) + half[None, :], h.to(tl.bfloat16),
                     mask=(rows < M)[:, None] & (half < N // 2)[None, :])
        else:
            tl.store(OUT + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16),
                     mask=(rows < M)[:, None] & (cols < N)[None, :])


def time_ms(fn, reps: int = 10, sustained: int = 0) -> float:
    """The best of `reps` launches, or with `sustained`, the mean of that many back to back (the clocks a long
    run settles at: a prefill runs tens of milliseconds of these)."""
    fn()
    torch.cuda.synchronize()
    if sustained:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(sustained):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / sustained
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def label(variant: tuple[int, ...]) -> str:
    bm, bn, bk, stages, warps, per_sm, ws, flat, band, tile_desc, gated, cols, rot, w_pad, x_pad = variant
    options = [name for name, on in (("ws", ws), ("flat", flat), (f"band{band}", band), ("tile-desc", tile_desc),
                                     ("gated", gated), (f"tasks/{cols}", cols), (f"rot{rot}", rot),
                                     (f"wpad{w_pad}", w_pad), (f"xpad{x_pad}", x_pad)) if on]
    return " ".join([f"{bm}x{bn}x{bk} s{stages} w{warps} {per_sm}/SM", *options])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="512,2048")
    parser.add_argument("--variants", help="BMxBNxBK/stages/warps/programs an SM, comma-separated (default: the "
                                           "module's list)")
    parser.add_argument("--sustained", type=int, default=0,
                        help="time the mean of this many launches back to back instead of the best of 10")
    args = parser.parse_args()
    variants = VARIANTS if not args.variants else [
        tuple(int(v) for v in spec.replace("x", "/").split("/")) for spec in args.variants.split(",")]
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}, {sms} SMs, Triton {triton.__version__}")
    variants = [tuple(v) + (0,) * (15 - len(v)) for v in variants]
    print("tokens | shape | cuBLAS TFLOP/s | " + " | ".join(map(label, variants)))
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name, n, k in SHAPES:
            x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            flop = 2 * tokens * n * k
            ref = x @ w.T
            cells = [f"{flop / time_ms(lambda: x @ w.T, sustained=args.sustained) / 1e9:.0f}"]
            for variant in variants:
                bm, bn, bk, stages, warps, per_sm, ws, flat, band, tile_desc, gated, cols, rot, w_pad, x_pad = variant
                xv = torch.zeros(tokens, k + x_pad, device="cuda", dtype=torch.bfloat16)[:, :k].copy_(x)
                wv = torch.zeros(n, k + w_pad, device="cuda", dtype=torch.bfloat16)[:, :k].copy_(w)
                out = torch.empty(tokens, n // 2 if gated else n, device="cuda", dtype=torch.bfloat16)
                want = ref
                if gated:
                    y = ref.to(torch.bfloat16).float()
                    want = (torch.nn.functional.silu(y[:, 0::2]).to(torch.bfloat16).float() * y[:, 1::2])

                def run():
                    gemm[(sms * per_sm,)](xv, wv, out, tokens, n, k, k + x_pad, k + w_pad, bm, bn, bk, stages, bool(ws),
                                          bool(flat), band, bool(tile_desc), bool(gated), cols, rot, num_warps=warps)
                try:
                    ms = time_ms(run, sustained=args.sustained)
                    error = ((out.float() - want.float()).abs().max() / want.float().abs().max()).item()
                    cells.append(f"{flop / ms / 1e9:.0f}" + ("" if error < 1e-2 else f" (wrong: {error:.2g})"))
                except Exception as e:  # a variant that does not fit (shared memory, registers)
                    cells.append(f"failed: {type(e).__name__}")
            print(f"{tokens} | {name} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
