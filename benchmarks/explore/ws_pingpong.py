"""Two independent streams an SM in one warp-specialized program: the prefill tiles and the decode GEMV. (Gluon)

`ws_prefill.py` ran one stream an SM: a loader warp and 8 consumer warps on [128, 256] tiles. `ws_gemv.py` found
that the batch-1 weight chain streams at 92% of the bandwidth on two 4-warp programs an SM against 84-87% on one
8-warp program (session 59), so a warp-specialized megakernel may want two streams an SM. Here each program holds
two: stream s has its own loader warp, its own ring of STAGES slots and its own consumer warp group (4 warps: the
default partition is stream 0's, a worker partition stream 1's), and walks its own share of the work, as two of
today's programs would (program p's stream s takes tile or unit 2p + s, then every 2P-th). On tiles this is the
"ping-pong" schedule of cuBLAS and flash attention 3: while one warp group runs its epilogue, the other multiplies.

- prefill: [BM, BN] tiles of y = x @ w^T (gate/up's gated, silu(gate) * up), one warp group's `wgmma` each;
- decode: one row's GEMV, [GR, 256] weight chunks (the ring's slots seen so) multiplied on the CUDA cores.

Shapes, checks and timings as `ws_prefill.py` (Llama-3-8B's projections; CUDA graphs; cuBLAS and torch's GEMV in
the same call).

    python -m benchmarks.explore.ws_pingpong --tokens 2048         # on an H100 / H200
    python -m benchmarks.explore.ws_pingpong --compile-only        # here, no GPU: compile for sm_90

A variant is BMxBNxBK/STAGES (each stream's tile and ring).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks.explore.gluon_probe import gemv_consume, gemv_load, projection_main
from benchmarks.explore.ws_prefill import _tile

GK = gl.constexpr(256)  # a decode chunk's columns (a TMA box's widest, unswizzled)


@gluon.jit
def _load(x_desc, w_desc, g_desc, a_ring, b_ring, g_ring, ready, empty, base, num_m, num_n, N, K, first, step,
          run_prefill, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
          GROUP: gl.constexpr):
    """A stream's loader: its tiles' K chunks (prefill) or its units' weight chunks (decode) into its ring, slots
    base .. base + STAGES of the program's rings and barriers."""
    i = 0
    if run_prefill:
        for t in range(first, num_m * num_n, step):
            m, n, ks = _tile(t, num_m, num_n, 1, GROUP)
            for k in range(0, K, BK):
                s = base + i % STAGES
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), (BM + BN) * BK * 2)
                tma.async_copy_global_to_shared(x_desc, [m * BM, k], ready.index(s), a_ring.index(s))
                tma.async_copy_global_to_shared(w_desc, [n * BN, k], ready.index(s), b_ring.index(s))
                i += 1
    else:
        gemv_load(g_desc, g_ring, ready, empty, base, 0, first, step, N, K, STAGES)


@gluon.jit
def _consume(y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, base, c_smem, num_m, num_n, N, K, first, step,
             run_prefill, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
             GROUP: gl.constexpr, GATED: gl.constexpr):
    """A stream's consumer warp group: its tiles on `wgmma` (one product in flight) and their epilogues through
    c_smem and a TMA store, or its units' GEMVs."""
    i = 0
    if run_prefill:
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                              instr_shape=[16, BN, 16])
        OUT: gl.constexpr = BN // 2 if GATED else BN
        for t in range(first, num_m * num_n, step):
            m, n, ks = _tile(t, num_m, num_n, 1, GROUP)
            acc = gl.zeros([BM, BN], gl.float32, acc_layout)
            for k in range(0, K, BK):
                s = base + i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                acc = warpgroup_mma(a_ring.index(s), b_ring.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
                mbarrier.arrive(empty.index(base + (i + STAGES - 1) % STAGES), count=1, pred=k > 0)
                i += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(empty.index(base + (i + STAGES - 1) % STAGES), count=1)
            if GATED:
                gate, up = gl.split(gl.reshape(acc, [BM, OUT, 2]))
                y = gate / (1.0 + gl.exp(-gate)) * up
            else:
                y = acc
            tma.store_wait(pendings=0)
            c_smem.store(y.to(gl.bfloat16))
            fence_async_shared()
            tma.async_copy_shared_to_global(y_desc, [m * BM, n * OUT], c_smem)
        tma.store_wait(pendings=0)
    else:
        gemv_consume(xv, yv, g_ring, ready, empty, base, 0, first, step, N, K, STAGES)


@gluon.jit
def _stream0(y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, c_tiles, num_m, num_n, N, K, pid, P,
             run_prefill, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
             GROUP: gl.constexpr, GATED: gl.constexpr):
    """The default partition: stream 0's consumer."""
    _consume(y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, 0, c_tiles.index(0), num_m, num_n, N, K, 2 * pid,
             2 * P, run_prefill, BM, BN, BK, STAGES, GROUP, GATED)


@gluon.jit
def _worker(x_desc, w_desc, g_desc, y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, c_tiles, num_m, num_n,
            N, K, pid, P, run_prefill, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
            GROUP: gl.constexpr, GATED: gl.constexpr, ROLE: gl.constexpr):
    """ROLE 0: stream 1's consumer; 1, 2: stream 0's, stream 1's loader (the workers share one signature)."""
    if ROLE == 0:
        _consume(y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, STAGES, c_tiles.index(1), num_m, num_n, N,
                 K, 2 * pid + 1, 2 * P, run_prefill, BM, BN, BK, STAGES, GROUP, GATED)
    else:
        side = ROLE - 1
        _load(x_desc, w_desc, g_desc, a_rings, b_rings, g_rings, ready, empty, side * STAGES, num_m, num_n, N, K,
              2 * pid + side, 2 * P, run_prefill, BM, BN, BK, STAGES, GROUP)


@gluon.jit
def ws_pingpong(x, w, y, xv, yv, M, N, K, run_prefill, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                LOADER_REGS: gl.constexpr):
    """run_prefill 1: y[M, N'] = x @ w^T over [BM, BN] tiles (N' = N, or N / 2 gated); 0: yv[N] = w @ xv."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    OUT: gl.constexpr = BN // 2 if GATED else BN
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, OUT], gl.bfloat16)
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    GR: gl.constexpr = BN * BK // GK
    x_desc = tma.make_tensor_descriptor(x, [M, K], [K, 1], [BM, BK], a_layout)
    w_desc = tma.make_tensor_descriptor(w, [N, K], [K, 1], [BN, BK], b_layout)
    g_desc = tma.make_tensor_descriptor(w, [N, K], [K, 1], [GR, GK], plain)
    y_desc = tma.make_tensor_descriptor(y, [M, N // 2 if GATED else N], [N // 2 if GATED else N, 1], [BM, OUT],
                                        c_layout)
    # stream s's ring: slots s * STAGES .. of each (one allocation: a dimension of two streams times STAGES slots
    # would not be a power of two)
    a_rings = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BM, BK], a_layout)
    b_rings = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BN, BK], b_layout)
    g_rings = b_rings._reinterpret(gl.bfloat16, [2 * STAGES, GR, GK], plain)
    c_tiles = gl.allocate_shared_memory(gl.bfloat16, [2, BM, OUT], c_layout)
    ready = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2 * STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    gl.warp_specialize([
        (_stream0, (y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, c_tiles, num_m, num_n, N, K, pid, P,
                    run_prefill, BM, BN, BK, STAGES, GROUP, GATED)),
        (_worker, (x_desc, w_desc, g_desc, y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, c_tiles, num_m,
                   num_n, N, K, pid, P, run_prefill, BM, BN, BK, STAGES, GROUP, GATED, 0)),
        (_worker, (x_desc, w_desc, g_desc, y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, c_tiles, num_m,
                   num_n, N, K, pid, P, run_prefill, BM, BN, BK, STAGES, GROUP, GATED, 1)),
        (_worker, (x_desc, w_desc, g_desc, y_desc, xv, yv, a_rings, b_rings, g_rings, ready, empty, c_tiles, num_m,
                   num_n, N, K, pid, P, run_prefill, BM, BN, BK, STAGES, GROUP, GATED, 2)),
    ], [4, 1, 1], [CONSUMER_REGS, LOADER_REGS, LOADER_REGS])


def variants(spec):
    out = []
    for v in spec.split(","):
        tile, stages = v.split("/")
        bm, bn, bk = (int(d) for d in tile.split("x"))
        out.append((bm, bn, bk, int(stages)))
    return out


def options(bm, bn, bk, stages, gated, group=8):
    # 4 + 4 consumer warps at CONSUMER_REGS, two loader warps (a warp group's registers) at LOADER_REGS
    return dict(BM=bm, BN=bn, BK=bk, STAGES=stages, GROUP=group, GATED=gated, CONSUMER_REGS=232, LOADER_REGS=24,
                num_warps=4, maxnreg=160)


def main():
    projection_main(__doc__, ws_pingpong, options, variants, "128x128x64/3,128x128x64/2",
                    "BMxBNxBK/STAGES, comma-separated", "one program an SM, two streams (a loader warp and a 4-warp "
                    "consumer each)")


if __name__ == "__main__":
    main()
