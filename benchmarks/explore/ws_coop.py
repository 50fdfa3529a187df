"""Cooperative prefill tiles and two decode streams in one warp-specialized program an SM. (Gluon)

Session 59's probes each ran one half of this well: one stream of [128, 256] tiles on 8 consumer warps reached
cuBLAS (`ws_prefill.py`), and two streams of a loader warp and a 4-warp consumer each put the one-row GEMV at 94%
of the bandwidth but their two rings left the tiles 0.79-0.85x cuBLAS (`ws_pingpong.py`). This probe is the mix the
port would build, cuBLAS's cooperative kernel with the decode split:

- two consumer warp groups, each a partition of its own (the default partition and a worker), and two loader warps;
- one ring of STAGES slots of a [128, 64] activation chunk and a [256, 64] weight chunk. A prefill tile is both
  warp groups' [128, 256]: loader 0 fills a slot, each warp group multiplies its 64 rows by the whole weight chunk
  (`wgmma`), and the slot's `empty` barrier counts both; each stores its half of the tile;
- for decode the weight slots' bytes are seen as 2 x DS chunks of [GR, 256] (`_reinterpret`): stream s (loader s,
  warp group s) takes units 2p + s, then every 2P-th, through its own DS chunks and barriers, as two of today's
  programs.

Shapes, checks and timings as `ws_prefill.py`.

    python -m benchmarks.explore.ws_coop --tokens 2048               # on an H100 / H200
    python -m benchmarks.explore.ws_coop --compile-only              # here, no GPU: compile for sm_90

A variant is STAGES/DS/GR (the tiles' slots; the decode chunks a stream and their rows).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks.explore.gluon_probe import gemv_consume, gemv_load, projection_main
from benchmarks.explore.ws_prefill import _tile

BM, BN, BK, GK = (gl.constexpr(v) for v in (128, 256, 64, 256))  # a tile, a K chunk; a decode chunk's columns


@gluon.jit
def _tiles(y_desc, a_ring, b_ring, ready, empty, c_smem, side, num_m, num_n, K, pid, P, STAGES: gl.constexpr,
           GROUP: gl.constexpr, GATED: gl.constexpr):
    """Warp group `side`'s 64 rows of every tile of the program: a [64, BN] accumulator a tile."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, BN, 16])
    OUT: gl.constexpr = BN // 2 if GATED else BN
    HM: gl.constexpr = BM // 2
    i = 0
    for t in range(pid, num_m * num_n, P):
        m, n, ks = _tile(t, num_m, num_n, 1, GROUP)
        acc = gl.zeros([HM, BN], gl.float32, acc_layout)
        for k in range(0, K, BK):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(s).slice(side * HM, HM, dim=0), b_ring.index(s).permute((1, 0)), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > 0)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
        if GATED:
            gate, up = gl.split(gl.reshape(acc, [HM, OUT, 2]))
            y = gate / (1.0 + gl.exp(-gate)) * up
        else:
            y = acc
        tma.store_wait(pendings=0)
        c_smem.store(y.to(gl.bfloat16))
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [m * BM + side * HM, n * OUT], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _consumer(y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, c_tiles, side, num_m, num_n, N,
              K, pid, P, run_prefill, STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr,
              DS: gl.constexpr):
    if run_prefill:
        _tiles(y_desc, a_ring, b_ring, ready, empty, c_tiles.index(side), side, num_m, num_n, K, pid, P, STAGES,
               GROUP, GATED)
    else:
        gemv_consume(xv, yv, g_ring, d_ready, d_empty, side * DS, 0, 2 * pid + side, 2 * P, N, K, DS)


@gluon.jit
def _load(x_desc, w_desc, g_desc, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, side, num_m, num_n, N, K,
          pid, P, run_prefill, STAGES: gl.constexpr, GROUP: gl.constexpr, DS: gl.constexpr):
    """Loader `side`: the tiles' chunks (loader 0 alone), or its stream's decode chunks."""
    if run_prefill:
        if side == 0:
            i = 0
            for t in range(pid, num_m * num_n, P):
                m, n, ks = _tile(t, num_m, num_n, 1, GROUP)
                for k in range(0, K, BK):
                    s = i % STAGES
                    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), (BM + BN) * BK * 2)
                    tma.async_copy_global_to_shared(x_desc, [m * BM, k], ready.index(s), a_ring.index(s))
                    tma.async_copy_global_to_shared(w_desc, [n * BN, k], ready.index(s), b_ring.index(s))
                    i += 1
    else:
        gemv_load(g_desc, g_ring, d_ready, d_empty, side * DS, 0, 2 * pid + side, 2 * P, N, K, DS)


@gluon.jit
def _stream0(y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, c_tiles, num_m, num_n, N, K,
             pid, P, run_prefill, STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr, DS: gl.constexpr):
    """The default partition: warp group 0."""
    _consumer(y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, c_tiles, 0, num_m, num_n, N,
              K, pid, P, run_prefill, STAGES, GROUP, GATED, DS)


@gluon.jit
def _worker(x_desc, w_desc, g_desc, y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, c_tiles,
            num_m, num_n, N, K, pid, P, run_prefill, STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr,
            DS: gl.constexpr, ROLE: gl.constexpr):
    """ROLE 0: warp group 1; 1, 2: loader 0, loader 1 (the workers share one signature)."""
    if ROLE == 0:
        _consumer(y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, c_tiles, 1, num_m, num_n,
                  N, K, pid, P, run_prefill, STAGES, GROUP, GATED, DS)
    else:
        _load(x_desc, w_desc, g_desc, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, ROLE - 1, num_m, num_n,
              N, K, pid, P, run_prefill, STAGES, GROUP, DS)


@gluon.jit
def ws_coop(x, w, y, xv, yv, M, N, K, run_prefill, STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr,
            DS: gl.constexpr, GR: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    """run_prefill 1: y[M, N'] = x @ w^T over [BM, BN] tiles (N' = N, or N / 2 gated); 0: yv[N] = w @ xv."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    OUT: gl.constexpr = BN // 2 if GATED else BN
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM // 2, OUT], gl.bfloat16)
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    x_desc = tma.make_tensor_descriptor(x, [M, K], [K, 1], [BM, BK], a_layout)
    w_desc = tma.make_tensor_descriptor(w, [N, K], [K, 1], [BN, BK], b_layout)
    g_desc = tma.make_tensor_descriptor(w, [N, K], [K, 1], [GR, GK], plain)
    y_desc = tma.make_tensor_descriptor(y, [M, N // 2 if GATED else N], [N // 2 if GATED else N, 1], [BM // 2, OUT],
                                        c_layout)
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_layout)
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], b_layout)
    gl.static_assert(2 * DS * GR * GK <= STAGES * BN * BK, "the decode view must fit in the weights' slots")
    g_ring = b_ring._reinterpret(gl.bfloat16, [2 * DS, GR, GK], plain)
    c_tiles = gl.allocate_shared_memory(gl.bfloat16, [2, BM // 2, OUT], c_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    d_ready = gl.allocate_shared_memory(gl.int64, [2 * DS, 1], mbarrier.MBarrierLayout())
    d_empty = gl.allocate_shared_memory(gl.int64, [2 * DS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both warp groups read every tile's slot
    for s in gl.static_range(2 * DS):
        mbarrier.init(d_ready.index(s), count=1)
        mbarrier.init(d_empty.index(s), count=1)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    gl.warp_specialize([
        (_stream0, (y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty, c_tiles, num_m, num_n,
                    N, K, pid, P, run_prefill, STAGES, GROUP, GATED, DS)),
        (_worker, (x_desc, w_desc, g_desc, y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty,
                   c_tiles, num_m, num_n, N, K, pid, P, run_prefill, STAGES, GROUP, GATED, DS, 0)),
        (_worker, (x_desc, w_desc, g_desc, y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty,
                   c_tiles, num_m, num_n, N, K, pid, P, run_prefill, STAGES, GROUP, GATED, DS, 1)),
        (_worker, (x_desc, w_desc, g_desc, y_desc, xv, yv, a_ring, b_ring, g_ring, ready, empty, d_ready, d_empty,
                   c_tiles, num_m, num_n, N, K, pid, P, run_prefill, STAGES, GROUP, GATED, DS, 2)),
    ], [4, 1, 1], [CONSUMER_REGS, LOADER_REGS, LOADER_REGS])


def variants(spec):
    return [tuple(int(x) for x in v.split("/")) for v in spec.split(",")]


def options(stages, ds, gr, gated, group=8):
    return dict(STAGES=stages, GROUP=group, GATED=gated, DS=ds, GR=gr, CONSUMER_REGS=232, LOADER_REGS=24,
                num_warps=4, maxnreg=160)


def main():
    projection_main(__doc__, ws_coop, options, variants, "3/6/16,3/3/32", "STAGES/DS/GR, comma-separated",
                    "one program an SM, two consumer warp groups and two loader warps")


if __name__ == "__main__":
    main()
