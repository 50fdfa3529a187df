"""What every prefill tile body shares: the tiles' order, the loader partition, and the consumers' K loop.

A program walks tiles pid, pid + P, ... of a [rows, N] output in the grouped order (`tile_at`). Its loader warp copies
each tile's [BM, BK] input and [BN, BK] weight chunks by TMA into a ring of STAGES slots (`ready` barriers say a
slot is full, `empty` ones that the consumers are done with it), running ahead across tiles; its consumer warp groups
multiply each slot on `wgmma` with one product in flight (`tile_product`). Both count the ring's slots from 0 across
the program's tiles, so they agree on every slot and phase without saying more to each other.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def tile_at(t, num_m, num_n, GROUP: gl.constexpr):
    """Tile t's (row block, column block): GROUP row blocks take each column block in turn, so that the programs
    running at once share a few column blocks' weights in L2."""
    per_group = GROUP * num_n
    first = (t // per_group) * GROUP
    rows = gl.minimum(num_m - first, GROUP)
    return first + (t % per_group) % rows, (t % per_group) // rows


@gluon.jit
def tile_loader(x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, STAGES: gl.constexpr,
                GROUP: gl.constexpr):
    """The loader partition: every chunk of this program's tiles into the ring, in the consumers' order."""
    i = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, n = tile_at(t, num_m, num_n, GROUP)
        i = load_tile(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, K, STAGES)


@gluon.jit
def load_tile(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, K, STAGES: gl.constexpr):
    """Tile (m, n)'s chunks into ring slots i ..; returns the next tile's first slot."""
    return load_range(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, 0, K, STAGES)


@gluon.jit
def load_range(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, k_lo, k_hi, STAGES: gl.constexpr):
    """Tile (m, n)'s chunks of K from k_lo to k_hi (multiples of BK, or K) into ring slots i ..; returns the slot
    after them."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    BK: gl.constexpr = a_ring.type.shape[2]
    for k in range(k_lo, k_hi, BK):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # (a barrier starts as if its phase 1 were done)
        mbarrier.expect(ready.index(s), (BM + BN) * BK * 2)
        tma.async_copy_global_to_shared(x_desc, [m * BM, k], ready.index(s), a_ring.index(s))
        tma.async_copy_global_to_shared(w_desc, [n * BN, k], ready.index(s), b_ring.index(s))
        i += 1
    return i


@gluon.jit
def tile_product(a_ring, b_ring, ready, empty, i, K, STAGES: gl.constexpr):
    """The consumers' fp32 [BM, BN] product of one tile, from ring slot i on; returns it and the next tile's slot."""
    return range_product(a_ring, b_ring, ready, empty, i, 0, K, STAGES)


@gluon.jit
def range_product(a_ring, b_ring, ready, empty, i, k_lo, k_hi, STAGES: gl.constexpr):
    """`tile_product` over K's chunks from k_lo to k_hi (`load_range`'s): the partial product."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    BK: gl.constexpr = a_ring.type.shape[2]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    acc = gl.zeros([BM, BN], gl.float32, acc_layout)
    for k in range(k_lo, k_hi, BK):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_ring.index(s), b_ring.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        # the product before this one is done: its slot goes back to the loader
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > k_lo)
        i += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
    return acc, i


@gluon.jit
def ring(BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The ring's slots and barriers: (a_ring [STAGES, BM, BK], b_ring [STAGES, BN, BK], ready, empty)."""
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_layout)
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], b_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return a_ring, b_ring, ready, empty


@gluon.jit
def operands(X, x_stride, num_rows, W, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """Tensor descriptors of the input [num_rows, K] rows x_stride apart at X and the weight [N, K] at W."""
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    x_desc = tma.make_tensor_descriptor(X, [num_rows, K], [x_stride, 1], [BM, BK], a_layout)
    w_desc = tma.make_tensor_descriptor(W, [N, K], [K.to(gl.int64), 1], [BN, BK], b_layout)
    return x_desc, w_desc
