"""How fast a program an SM streams a weight through TMA boxes of one shape or another, with nothing else to do: is the
batched step's ~3.4 TB/s (gate/up in [64, 128] stream-K tiles or whole-K [224, 64] chunks, session 68) the boxes'
pattern (128 bytes of a row a box, 8 KB apart: each a new DRAM page) or something else in the kernel?

Each program reads its whole-K block of ROWS rows of a [N, K] bf16 weight in chunks of GROUPS row boxes by RUN column
boxes (a row's RUN boxes copied one after another), K fastest, into a ring of STAGES chunks, and only waits for them
(no products). A variant: `box_rows x box_cols [sw|plain] run G groups, S stages [rR | rRw]`: with rR, each chunk also
copies R rows of a small [R, K] input (L2-resident, the same for every program, as a batched step's narrow tiles read
the step's rows beside their weights) in `run` boxes of [R, box_cols] into a ring of its own on the same barrier; with
rRw, one unswizzled box of [R, run x box_cols]. A probe, not part of the kernel:

    python -m benchmarks.explore.tma_stream                     # gate/up's [28672, 4096], 128 programs of 224 rows
"""
from __future__ import annotations

import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from benchmarks.baselines import median_ms, read_bandwidth_tbs, tb_per_s


@gluon.jit
def _issue(w_desc, x_desc, ring, x_ring, bars, c, r0, KC, BOX_R: gl.constexpr, BOX_C: gl.constexpr,
           RUN: gl.constexpr, GROUPS: gl.constexpr, STAGES: gl.constexpr, X_ROWS: gl.constexpr, X_BOXES: gl.constexpr):
    """Chunk c of the program's block (rows from r0; KC chunks a row group) into ring slot c % STAGES, and (X_ROWS)
    the input's columns beside it in X_BOXES boxes."""
    s = c % STAGES
    rows = r0 + (c // KC) * GROUPS * BOX_R
    cols = (c % KC) * RUN * BOX_C
    mbarrier.expect(bars.index(s), (GROUPS * BOX_R + X_ROWS) * RUN * BOX_C * 2)
    for g in gl.static_range(GROUPS):
        for r in gl.static_range(RUN):
            tma.async_copy_global_to_shared(w_desc, [rows + g * BOX_R, cols + r * BOX_C], bars.index(s),
                                            ring.index((s * GROUPS + g) * RUN + r))
    if X_ROWS:
        for r in gl.static_range(X_BOXES):
            tma.async_copy_global_to_shared(x_desc, [0, cols + r * (RUN // X_BOXES) * BOX_C], bars.index(s),
                                            x_ring.index(s * X_BOXES + r))


@gluon.jit
def stream(w_desc, x_desc, K, ROWS: gl.constexpr, BOX_R: gl.constexpr, BOX_C: gl.constexpr, RUN: gl.constexpr,
           GROUPS: gl.constexpr, STAGES: gl.constexpr, X_ROWS: gl.constexpr, X_BOXES: gl.constexpr):
    ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * GROUPS * RUN, BOX_R, BOX_C], w_desc.layout)
    X_COLS: gl.constexpr = RUN // X_BOXES * BOX_C
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * X_BOXES, X_ROWS + 8 * (X_ROWS == 0), X_COLS],
                                       x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    r0 = gl.program_id(0) * ROWS
    KC = K // (RUN * BOX_C)
    chunks = (ROWS // (GROUPS * BOX_R)) * KC
    for c in range(0, gl.minimum(chunks, STAGES)):
        _issue(w_desc, x_desc, ring, x_ring, bars, c, r0, KC, BOX_R, BOX_C, RUN, GROUPS, STAGES, X_ROWS, X_BOXES)
    for c in range(0, chunks):
        mbarrier.wait(bars.index(c % STAGES), (c // STAGES) & 1)
        if c + STAGES < chunks:  # (the slot's bytes are not read: it is free again at once)
            _issue(w_desc, x_desc, ring, x_ring, bars, c + STAGES, r0, KC, BOX_R, BOX_C, RUN, GROUPS, STAGES, X_ROWS,
                   X_BOXES)


def parse(variant: str) -> dict:
    """`32x64 sw 1 7 6 [r64|r64w]`: box rows x columns, swizzled (sw) or not (plain), run, groups, stages, and the
    input's rows beside each chunk (in `run` boxes, or w: one unswizzled box)."""
    box, swizzle, run, groups, stages, *rows = variant.split()
    box_r, box_c = (int(v) for v in box.split("x"))
    x_rows = int(rows[0][1:].rstrip("w")) if rows else 0
    wide = bool(rows) and rows[0].endswith("w")
    return dict(BOX_R=box_r, BOX_C=box_c, swizzle=swizzle == "sw", RUN=int(run), GROUPS=int(groups),
                STAGES=int(stages), X_ROWS=x_rows, X_BOXES=1 if wide else int(run), x_swizzle=not wide)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="28672x4096")
    parser.add_argument("--programs", type=int, default=128)
    parser.add_argument("--variants", default="32x64 sw 1 7 6/32x64 sw 2 7 3/32x64 sw 4 1 10/32x64 sw 8 1 5/"
                        "16x256 plain 2 1 10/32x64 sw 1 7 3/32x64 sw 1 7 4")
    args = parser.parse_args()
    n, k = (int(v) for v in args.shape.split("x"))
    rows = n // args.programs
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    inputs = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
    bandwidth = read_bandwidth_tbs("cuda")
    print(f"device {torch.cuda.get_device_name()}; a [{n}, {k}] bf16 weight ({n * k * 2 / 1e6:.0f} MB), "
          f"{args.programs} programs of {rows} rows; read bandwidth {bandwidth:.2f} TB/s (torch.sum)", flush=True)
    for variant in args.variants.split("/"):
        v = parse(variant)
        if rows % (v["GROUPS"] * v["BOX_R"]) or k % (v["RUN"] * v["BOX_C"]):
            raise SystemExit(f"{variant!r}: its chunks do not tile a program's {rows} rows of {k} columns")
        swizzle = 128 if v["swizzle"] else 0
        layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)
        desc = TensorDescriptor.from_tensor(weight, [v["BOX_R"], v["BOX_C"]], layout)
        x_cols = v["RUN"] // v["X_BOXES"] * v["BOX_C"]
        x_layout = gl.NVMMASharedLayout(swizzle_byte_width=swizzle if v["x_swizzle"] else 0, element_bitwidth=16,
                                        rank=2)
        x_desc = TensorDescriptor.from_tensor(inputs, [v["X_ROWS"] or 8, x_cols], x_layout)
        chunk = v["BOX_R"] * v["BOX_C"] * v["RUN"] * v["GROUPS"] * 2

        def run():
            stream[(args.programs, )](desc, x_desc, k, rows, v["BOX_R"], v["BOX_C"], v["RUN"], v["GROUPS"],
                                      v["STAGES"], v["X_ROWS"], v["X_BOXES"], num_warps=4)
        ms = median_ms(run, torch.device("cuda"), num_warmup=3, num_reps=20)
        moved = args.programs * rows * k * 2
        print(f"  {variant:<26} chunk {chunk // 1024:>3} KB, {chunk * v['STAGES'] // 1024:>3} KB in flight: "
              f"{ms * 1e3:7.1f} us, {tb_per_s(moved, ms):.2f} TB/s ({tb_per_s(moved, ms) / bandwidth:.0%})",
              flush=True)


if __name__ == "__main__":
    main()
