"""A projection's prefill in Gluon: a LINEAR group's whole output in [128, BN] tiles, with its epilogue.

It computes what the group's Triton tasks compute in a step that prefills (codegen/bodies/linear.py, `prefill_tiles`
and `kept_epilogue`), from the same descriptor row (`LINEAR_FIELDS`) and arenas: the input rows times the placed
weight (an RMSNorm's weight folded into it), then each row scaled by 1/rms from its producer's sums of squares, the
bias, a rounding to bf16, gate/up's silu(gate) * up rounded as the Triton body rounds it (the placed weight's rows
alternate gate, up), the residual added and rounded again, the store, and the stored rows' sums of squares added
into F32 for the norm that reads them (fp64 with `exact_norm_sums`).

One program an SM, two partitions: a loader warp (40 registers) copies [128, 64] input and [BN, 64] weight chunks
into a ring of STAGES slots by TMA, running ahead across tiles; the default partition's two warp groups multiply a
tile's chunks on `wgmma` with one product in flight and run its epilogue through shared memory (the residual's tile
copied by TMA into the staging buffer while the products run, the outputs stored from it by one TMA copy). Tiles go to
programs in
a grouped order (GROUP row blocks take each column block in turn), so the programs running at once share weights in
L2. Rows and columns past the ends are TMA's: read as zeros, not written.

A step of 2 to 64 rows (a batched decode step) has too few tiles for the SMs: with STREAM_K the programs share the
flattened (tile, K chunk) space instead (stream-K, codegen/gluon/tiles.py), on [64, 128] tiles (`STREAMK`: one
consumer warp group, the ring's room in 8 stages).

H200, Llama-3-8B's first step in the host-driven executor (`benchmarks/gluon_groups.py`, session 60; 32 layers):
at 2,048 tokens o_proj 3,316 us against the Triton groups' 4,766, gate/up 20,103 against 27,435, down 9,691 against
11,362; at 512 tokens 1,141 against 2,071, 5,969 against 7,515, 2,894 against 3,739.
"""
from __future__ import annotations

from dataclasses import dataclass

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from codegen.bodies.linear import LINEAR_FIELDS, OUT_ALIGNED
from codegen.gluon.tiles import ALIGN, _region, operands, ring, streamk_loader, streamk_range, streamk_step, tile_at
from codegen.gluon.tiles import tile_loader, tile_product
from codegen.tasks import DESC_WORDS

# the descriptor words the kernel reads, in this order (WORDS: their indices in the row)
USED = ("x_off", "x_stride", "k", "w_off", "n", "out_off", "out_stride", "stats_off", "eps", "res_off", "res_stride",
        "bias_off", "out_stats_off")
WORDS = gl.constexpr(tuple(LINEAR_FIELDS.index(f) for f in USED))
# a tile's rows; a chunk's columns of K (a 128-byte swizzle holds 64 bf16 columns)
BM, BK = gl.constexpr(128), gl.constexpr(64)
CONSUMER_WARPS, LOADER_REGS = 8, 40

SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "desc_index": "i32",
             "rows_at": "i32", "parts_at": "i64", "tickets_at": "i64"}


@gluon.jit
def _round(x):
    """fp32 values rounded to bf16 and back, as storing them would (`round_to`)."""
    return x.to(gl.bfloat16).to(gl.float32)


@gluon.jit
def _norm_sums(F32, off, NORM_F64: gl.constexpr):
    """The rows' sums of squares at F32 word `off` (`norm_sums`: two words a row in fp64)."""
    if NORM_F64:
        return (F32 + off).to(gl.pointer_type(gl.float64), bitcast=True)
    else:
        return F32 + off


@gluon.jit
def _epilogue(y, m0, n0, num_rows, N, K, W, F32, o_desc, c_smem, res_bar, phase, stats_off, eps, res_off, bias_off,
              out_stats_off, GATED: gl.constexpr, NORM_F64: gl.constexpr):
    """`kept_epilogue` and `store_outputs` of the fp32 products y [BM, BN] of rows m0 .. and weight rows n0 ..; the
    residual's tile is in c_smem once res_bar's phase `phase` completes."""
    BM: gl.constexpr = y.type.shape[0]
    BN: gl.constexpr = y.type.shape[1]
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, y.type.layout))
    cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, y.type.layout))
    if stats_off >= 0:
        sums = gl.load(_norm_sums(F32, stats_off, NORM_F64) + rows, mask=rows < num_rows, other=1.0).to(gl.float32)
        y = y * gl.rsqrt(sums / K.to(gl.float32) + eps)[:, None]
    if bias_off >= 0:
        y = y + gl.load(W + _region(bias_off) + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
    y = _round(y)
    if GATED:  # columns alternate gate, up: output column j is silu(y[:, 2j]) * y[:, 2j + 1]
        gate, up = gl.split(gl.reshape(y, [BM, BN // 2, 2]))
        y = _round(_round(gate / (1.0 + gl.exp(-gate))) * up)
        rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, y.type.layout))
        cols = n0 // 2 + gl.arange(0, BN // 2, layout=gl.SliceLayout(0, y.type.layout))
        N = N // 2
    if res_off >= 0:
        mbarrier.wait(res_bar.index(0), phase)
        y = _round(c_smem.load(y.type.layout).to(gl.float32) + y)
        gl.thread_barrier()  # every warp's read of the residual before any writes over it
    c_smem.store(y.to(gl.bfloat16))
    fence_async_shared()
    if GATED:
        tma.async_copy_shared_to_global(o_desc, [m0, n0 // 2], c_smem)
    else:
        tma.async_copy_shared_to_global(o_desc, [m0, n0], c_smem)
    if out_stats_off >= 0:  # (rows and columns past the ends are zeros: their products' inputs were)
        mask = (rows < num_rows)[:, None] & (cols < N)[None, :]
        sums = _norm_sums(F32, out_stats_off, NORM_F64)
        sq = gl.sum(gl.where(mask, y * y, 0.0), axis=1)
        # relaxed: the group's signal (`chain._signal`) publishes them; acq_rel (Triton's default), each thread's
        # waited for the one before, ~4 us of a b64 o_proj's epilogue and ~2 of down's (the H200, session 72)
        gl.atomic_add(sums + rows, sq.to(sums.dtype.element_ty), mask=rows < num_rows, sem="relaxed")


@gluon.jit
def _residual(r_desc, c_smem, res_bar, m, n, res_off, OUT: gl.constexpr):
    """Tile (m, n)'s residual on its way into the staging buffer, once the tile before has left it."""
    BM: gl.constexpr = c_smem.type.shape[0]
    tma.store_wait(pendings=0)
    if res_off >= 0:
        mbarrier.expect(res_bar.index(0), BM * OUT * 2)
        tma.async_copy_global_to_shared(r_desc, [m * BM, n * OUT], res_bar.index(0), c_smem)


@gluon.jit
def _consumer(W, F32, a_ring, b_ring, ready, empty, o_desc, r_desc, c_smem, res_bar, num_m, num_n, num_rows, N, K,
              stats_off, eps, res_off, bias_off, out_stats_off, parts_at, tickets_at, STAGES: gl.constexpr,
              GROUP: gl.constexpr, GATED: gl.constexpr, NORM_F64: gl.constexpr, STREAM_K: gl.constexpr):
    """Each tile's products and epilogue: whole tiles, the residual asked for before the products; or (STREAM_K)
    the fragments of this program's range, a tile's epilogue by the program that finishes it
    (`tiles.finish_fragment`), its residual asked for then."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    OUT: gl.constexpr = BN // 2 if GATED else BN
    i = 0
    phase = 0
    if STREAM_K:
        c, c1, KC, total, P = streamk_range(num_m, num_n, K, BK)
        while c < c1:
            finish, acc, m, n, i, c = streamk_step(a_ring, b_ring, ready, empty, i, c, c1, KC, total, P, K, num_m,
                                                   num_n, num_rows, F32, parts_at, tickets_at, STAGES, GROUP)
            if finish:
                _residual(r_desc, c_smem, res_bar, m, n, res_off, OUT)
                _epilogue(acc, m * BM, n * BN, num_rows, N, K, W, F32, o_desc, c_smem, res_bar, phase, stats_off,
                          eps, res_off, bias_off, out_stats_off, GATED, NORM_F64)
                phase ^= (res_off >= 0).to(gl.int32)
    else:
        i, phase = consume_tiles(W, F32, a_ring, b_ring, ready, empty, o_desc, r_desc, c_smem, res_bar, num_m, num_n,
                                 num_rows, N, K, stats_off, eps, res_off, bias_off, out_stats_off, i, phase, STAGES,
                                 GROUP, GATED, NORM_F64)
    tma.store_wait(pendings=0)


@gluon.jit
def consume_tiles(W, F32, a_ring, b_ring, ready, empty, o_desc, r_desc, c_smem, res_bar, num_m, num_n, num_rows, N, K,
                  stats_off, eps, res_off, bias_off, out_stats_off, i, phase, STAGES: gl.constexpr,
                  GROUP: gl.constexpr, GATED: gl.constexpr, NORM_F64: gl.constexpr):
    """This program's whole tiles of the group, from ring slot i on and the residual's barrier at `phase`: each
    tile's residual asked for before its products, then its epilogue. Returns the next slot and phase."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    OUT: gl.constexpr = BN // 2 if GATED else BN
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, n = tile_at(t, num_m, num_n, GROUP)
        _residual(r_desc, c_smem, res_bar, m, n, res_off, OUT)  # (on its way while the products run)
        acc, i = tile_product(a_ring, b_ring, ready, empty, i, K, STAGES)
        _epilogue(acc, m * BM, n * BN, num_rows, N, K, W, F32, o_desc, c_smem, res_bar, phase, stats_off, eps,
                  res_off, bias_off, out_stats_off, GATED, NORM_F64)
        phase ^= (res_off >= 0).to(gl.int32)
    return i, phase


@gluon.jit
def row(desc):
    """The descriptor row's words the consumers read: K, N, stats_off, eps, res_off, bias_off, out_stats_off."""
    K = gl.load(desc + WORDS[2]).to(gl.int32)  # (a copy's coordinates are 32-bit)
    N = gl.load(desc + WORDS[4]).to(gl.int32)
    eps = gl.load(desc + WORDS[8]).to(gl.float64, bitcast=True).to(gl.float32)
    return K, N, gl.load(desc + WORDS[7]), eps, gl.load(desc + WORDS[9]), gl.load(desc + WORDS[11]), \
        gl.load(desc + WORDS[12])


@gluon.jit
def inputs(desc, W, ACT, num_rows, BM: gl.constexpr, BN: gl.constexpr):
    """Tensor descriptors of the descriptor row's input rows ([BM, BK] boxes) and weight ([BN, BK])."""
    K, N = gl.load(desc + WORDS[2]).to(gl.int32), gl.load(desc + WORDS[4]).to(gl.int32)
    return operands(ACT + gl.load(desc + WORDS[0]), gl.load(desc + WORDS[1]), num_rows, W + gl.load(desc + WORDS[3]),
                    N, K, BM, BN, BK)


@gluon.jit
def outputs(desc, ACT, num_rows, BM: gl.constexpr, OUT: gl.constexpr, c_layout: gl.constexpr, GATED: gl.constexpr):
    """Tensor descriptors of the descriptor row's output rows and residual, [BM, OUT] boxes in c_layout (OUT: the
    tile's output columns, half its weight rows where GATED)."""
    N = gl.load(desc + WORDS[4]).to(gl.int32)
    n_out = N // 2 if GATED else N
    out_off, out_stride = gl.load(desc + WORDS[5]), gl.load(desc + WORDS[6])
    res_off, res_stride = gl.maximum(gl.load(desc + WORDS[9]), 0), gl.load(desc + WORDS[10])
    o_desc = tma.make_tensor_descriptor(ACT + out_off, [num_rows, n_out], [out_stride, 1], [BM, OUT], c_layout)
    r_desc = tma.make_tensor_descriptor(ACT + res_off, [num_rows, n_out], [res_stride, 1], [BM, OUT], c_layout)
    return o_desc, r_desc


@gluon.jit
def linear_prefill(DESCS, W, ACT, F32, I32, desc_index, rows_at, parts_at, tickets_at, BM: gl.constexpr,
                   BN: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr,
                   NORM_F64: gl.constexpr, DESC_WORDS: gl.constexpr, LOADER_REGS: gl.constexpr, STREAM_K: gl.constexpr):
    """Row desc_index of DESCS (a LINEAR group's descriptor) over the I32[rows_at] rows of the step. GATED: the
    descriptor's `gated` word (the output's width depends on it); NORM_F64: the norms' sums are fp64. STREAM_K: the
    programs share the (tile, K chunk) space (codegen/gluon/tiles.py; a step of STREAMK_ROWS rows at most), the cut
    tiles' partials and tickets at F32[parts_at] and F32[tickets_at] (`prefill_parts`, `tickets:prefill`: no other
    group runs beside it in the host-driven executor); else each program takes whole tiles."""
    desc = DESCS + desc_index * DESC_WORDS
    num_rows = gl.load(I32 + rows_at)
    K, N, stats_off, eps, res_off, bias_off, out_stats_off = row(desc)
    x_desc, w_desc = inputs(desc, W, ACT, num_rows, BM, BN)
    OUT: gl.constexpr = BN // 2 if GATED else BN
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, OUT], gl.bfloat16)
    o_desc, r_desc = outputs(desc, ACT, num_rows, BM, OUT, c_layout, GATED)
    c_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, OUT], c_layout)
    res_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(res_bar.index(0), count=1)
    a_ring, b_ring, ready, empty = ring(BM, BN, BK, STAGES)
    num_m = gl.cdiv(num_rows, BM)
    num_n = gl.cdiv(N, BN)
    gl.warp_specialize([
        (_consumer, (W, F32, a_ring, b_ring, ready, empty, o_desc, r_desc, c_smem, res_bar, num_m, num_n, num_rows, N,
                     K, stats_off, eps, res_off, bias_off, out_stats_off, parts_at, tickets_at, STAGES, GROUP, GATED,
                     NORM_F64, STREAM_K)),
        (streamk_loader if STREAM_K else tile_loader,
         (x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, STAGES, GROUP)),
    ], [1], [LOADER_REGS])


@dataclass(frozen=True)
class Tiles:
    """A launch's tile shape: BN columns a tile, STAGES slots in the ring, BM rows (a consumer warp a 16 of them)."""
    bn: int
    stages: int
    bm: int = BM.value

    def constexprs(self, gated: bool, norm_f64: bool, stream_k: bool = False) -> dict:
        return dict(BM=self.bm, BN=self.bn, STAGES=self.stages, GROUP=8, GATED=gated, NORM_F64=norm_f64,
                    DESC_WORDS=DESC_WORDS, LOADER_REGS=LOADER_REGS, STREAM_K=stream_k)

    def launch(self) -> dict:
        """The launch options: the consumers' warps and the loader's one are allocated as a warp group each more,
        and maxnreg caps what the consumers may take back from the loader's share (255 at most)."""
        warps = self.bm // 16
        return dict(num_warps=warps, maxnreg=min(65536 // ((warps + 4) * 32) // 8 * 8, 248))


WIDE, NARROW = Tiles(256, 3), Tiles(128, 4)
# stream-K's: a step of STREAMK_ROWS rows at most, so 64-row tiles (one consumer warp group) and the ring's room
# in stages: a stream's bytes in flight bound it (H200, session 63, Llama-3-8B at 64 rows: [128, 128] tiles and 5
# stages, 80 KB of weights in flight an SM, ran gate/up in 3,484 us over 32 layers, these 64-row ones, 128 KB, 2,385)
STREAMK = Tiles(128, 8, bm=64)
# H200, session 60 (`benchmarks/gluon_groups.py --tiles`, Llama-3-8B's 32 layers): o_proj at 2,048 tokens, 2 rounds
# of wide tiles or 4 of narrow ones, 3,399 against 3,711 us; gate/up at 2,048 (14 or 28 rounds) 20,754 against
# 21,946; at 512 tokens (4 or 7 rounds) 6,016 against 5,969
NARROW_COST = 0.55
LAUNCH = WIDE.launch()  # (the tile bodies' 8 consumer warps whatever BN)


def tiles_for(num_rows: int, n: int, programs: int) -> Tiles:
    """The tile shape whose rounds of `programs` tiles end first, a [128, 128] tile taking NARROW_COST of a [128, 256]
    one's time: the wide tiles are faster a product, the narrow ones waste less of a group's last round."""
    def rounds(tiles: Tiles) -> int:
        return -(-(-(-num_rows // BM.value) * -(-n // tiles.bn)) // programs)
    return NARROW if rounds(NARROW) * NARROW_COST < rounds(WIDE) else WIDE


def unsupported(words: list[int]) -> str | None:
    """Why a LINEAR descriptor's group cannot run here (None: it can): the outputs are not bf16 rows of a multiple
    of 8 columns, a router (its outputs feed the experts' routing), or an operand TMA cannot address (offsets and
    strides of 16 bytes)."""
    f = dict(zip(LINEAR_FIELDS, words))
    if f["out_kind"] != OUT_ALIGNED:
        return "its outputs are not bf16 rows a multiple of 8 wide"
    if f["route_ticket"] >= 0:
        return "it routes (a MoE router)"
    if f["rows_kind"] != 0:
        return "it reads the sequences' last rows, not the step's tokens"
    for name in ("x_off", "x_stride", "k", "w_off", "out_off", "out_stride"):
        if f[name] % 8:
            return f"{name} {f[name]} is not a multiple of 8 elements"
    if f["res_off"] >= 0 and (f["res_off"] % 8 or f["res_stride"] % 8):
        return "its residual's rows are not 16-byte aligned"
    if f["bias_off"] >= 0 and f["bias_off"] % ALIGN.value:  # (a region's offset, `_region`)
        return f"bias_off {f['bias_off']} is not a multiple of {ALIGN.value} elements"
    return None
