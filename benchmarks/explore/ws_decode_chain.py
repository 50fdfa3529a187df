"""Does a batch-1 step's projection chain gain as one persistent Gluon kernel, weights streamed across groups? (Gluon)

The host-driven executor launches each one-row projection as a kernel of its own (`codegen/gluon/gemv.py`): o_proj's
32 MB take ~17 us where the bandwidth says 8, gate/up 60 us (94% of the bandwidth), down 35 (83%). A group kernel
pays a launch's fixed costs (program start, tensor descriptors, the ring's first fill) and ends with a tail where
programs idle; the next group's weights do not start streaming until it has ended. The persistent megakernel runs the
groups as one kernel with event counters. This probe runs a layer's o_proj -> gate/up -> down that way: two programs
an SM walk the three groups' units of 32 weight rows in order (each its contiguous share, as `linear_gemv`); the
loader warp streams every group's weight boxes without ever waiting on an event (weights depend on nothing), so
gate/up's first boxes arrive while o_proj's last units finish; the consumers wait on the previous group's counter
(every program's units done) before reading the row, which they read themselves (`_unit` with X_GLOBAL), not through
the ring.

The units, their products and epilogues are `codegen.gluon.gemv`'s; the arenas are `ws_chain.arenas` at one token.
Checked against the three `linear_gemv` launches back to back on the same arenas (the same units and products: o_proj's
outputs should match bit for bit; its sums of squares only to their atomics' order, which may move a rounding of
gate/up's and down's), both timed from CUDA graphs.

    python -m benchmarks.explore.ws_decode_chain              # on an H100 / H200
    python -m benchmarks.explore.ws_decode_chain --compile-only   # here, no GPU: compile for sm_90
"""
import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from benchmarks.explore.gluon_probe import compile_sm90, launches_against, probe_header
from benchmarks.explore.ws_chain import _wait, arenas
from codegen.gluon import gemv
from codegen.gluon.gemv import GK, SLOT_ROWS, _epilogue, _inv_rms, _units, _unit
from codegen.gluon.linear import WORDS as LINEAR_WORDS, _norm_sums
from codegen.tasks import DESC_WORDS

GROUPS = gl.constexpr(3)  # o_proj, gate/up, down: descriptor rows 0, 1, 2
WORDS_A_ROW = gl.constexpr(DESC_WORDS)
RING_WORDS = gemv.WORDS  # (x_off, k, w_off, n, out_off, out_kind, stats_off, eps, res_off, bias_off, out_stats_off)


@gluon.jit
def _weights(DESCS, W, g, GR: gl.constexpr):
    """Group g's weight as a tensor descriptor of [GR, GK] boxes, its K and its units."""
    desc = DESCS + g * WORDS_A_ROW
    K, N = gl.load(desc + RING_WORDS[1]).to(gl.int32), gl.load(desc + RING_WORDS[3]).to(gl.int32)
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    w_desc = tma.make_tensor_descriptor(W + gl.load(desc + RING_WORDS[2]), [N, K], [K.to(gl.int64), 1], [GR, GK],
                                        plain)
    return w_desc, K, gl.cdiv(N, GR)


@gluon.jit
def _loader(DESCS, W, w_ring, ready, empty, SLOTS_: gl.constexpr):
    """Every group's weight boxes of this program's units into the ring, one group after another, never waiting for
    anything but a free slot."""
    GR: gl.constexpr = w_ring.type.shape[1]
    BOXES: gl.constexpr = w_ring.type.shape[0] // SLOTS_
    i = 0
    for g in gl.static_range(GROUPS):
        w_desc, K, units = _weights(DESCS, W, g, GR)
        u0, u1 = _units(units)
        for u in range(u0, u1):
            for k0 in range(0, K, BOXES * GK):
                s = i % SLOTS_
                mbarrier.wait(empty.index(s), ((i // SLOTS_) & 1) ^ 1)
                mbarrier.expect(ready.index(s), BOXES * GR * GK * 2)
                for b in gl.static_range(BOXES):
                    tma.async_copy_global_to_shared(w_desc, [u * GR, k0 + b * GK], ready.index(s),
                                                    w_ring.index(s * BOXES + b))
                i += 1


@gluon.jit
def _consumer(DESCS, W, ACT, F32, EVENTS, w_ring, ready, empty, SLOTS_: gl.constexpr, NORM_F64: gl.constexpr):
    """Each group's units once every program has finished the group before (its counter at the programs' count),
    the row read from the activations; a group done, its counter moves on."""
    GR: gl.constexpr = w_ring.type.shape[1]
    vec: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])
    i = 0
    for g in gl.static_range(GROUPS):
        desc = DESCS + g * WORDS_A_ROW
        x_off, K = gl.load(desc + RING_WORDS[0]), gl.load(desc + RING_WORDS[1]).to(gl.int32)
        N, out_off = gl.load(desc + RING_WORDS[3]).to(gl.int32), gl.load(desc + RING_WORDS[4])
        stats_off = gl.load(desc + RING_WORDS[6])
        eps = gl.load(desc + RING_WORDS[7]).to(gl.float64, bitcast=True).to(gl.float32)
        res_off, bias_off, out_stats_off = gl.load(desc + RING_WORDS[8]), gl.load(desc + RING_WORDS[9]), \
            gl.load(desc + RING_WORDS[10])
        if g > 0:
            _wait(EVENTS, g - 1, gl.num_programs(0))
        inv = _inv_rms(F32, stats_off, K, eps, NORM_F64)
        sq = gl.to_tensor(0.0)
        u0, u1 = _units(gl.cdiv(N, GR))
        for u in range(u0, u1):
            y, i = _unit(w_ring, w_ring, ACT + x_off, ready, empty, i, K, SLOTS_, vec, True)
            sq += _epilogue(y, u, inv, W, ACT, F32, N, out_off, res_off, bias_off, g == 1, 0)
        if out_stats_off >= 0:
            out_sums = _norm_sums(F32, out_stats_off, NORM_F64)
            gl.atomic_add(out_sums, sq.to(out_sums.dtype.element_ty))
        gl.thread_barrier()  # every thread's stores before the signal releases them
        gl.atomic_add(EVENTS + g, 1, sem="release", scope="gpu")


@gluon.jit
def decode_chain(DESCS, W, ACT, F32, EVENTS, GR: gl.constexpr, SLOTS_: gl.constexpr, NORM_F64: gl.constexpr,
                 LOADER_REGS: gl.constexpr):
    """Descriptor rows 0, 1, 2 of DESCS (o_proj, gate/up, down: LINEAR_FIELDS) over one row; EVENTS: a counter a
    group, zero at the launch."""
    BOXES: gl.constexpr = SLOT_ROWS // GR
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    w_ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS_ * BOXES, GR, GK], plain)
    ready = gl.allocate_shared_memory(gl.int64, [SLOTS_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS_, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(SLOTS_):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer, (DESCS, W, ACT, F32, EVENTS, w_ring, ready, empty, SLOTS_, NORM_F64)),
        (_loader, (DESCS, W, w_ring, ready, empty, SLOTS_)),
    ], [1], [LOADER_REGS])


SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "EVENTS": "*i32"}


def options(rows: int) -> dict:
    return dict(GR=rows, SLOTS_=gemv.SLOTS, NORM_F64=True, LOADER_REGS=gemv.LOADER_REGS, **gemv.LAUNCH)


def run_gpu(rows: int, reps: int) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    probe_header(f"batch-1 o_proj -> gate/up -> down in {rows}-row units: one persistent kernel against three "
                 f"GEMV kernels")
    descs, warena, act, f32, outputs = arenas(1, "cuda")
    programs = gemv.PER_SM * sms
    events = torch.zeros(GROUPS.value, dtype=torch.int32, device="cuda")
    widths = [int(descs[g, LINEAR_WORDS.value[4]]) for g in range(GROUPS.value)]  # each group's weight rows

    def groups():
        f32.zero_()
        for g, gated in enumerate((False, True, False)):
            units, grid = gemv.grid(widths[g], rows, sms)
            gemv.linear_gemv[(grid, )](descs, warena, act, f32, g, units,
                                       **gemv.constexprs(rows, gated, 0, True), **gemv.LAUNCH)

    def persistent():
        f32.zero_()
        events.zero_()
        decode_chain[(programs, )](descs, warena, act, f32, events, **options(rows))
    groups_ms, chain_ms, errs = launches_against(groups, persistent, act, outputs, reps)
    weight_bytes = sum(w * int(descs[g, LINEAR_WORDS.value[2]]) * 2 for g, w in enumerate(widths))
    print(f"RESULT b1 o_proj -> gate/up -> down ({weight_bytes / 1e6:.0f} MB of weights): three GEMV kernels "
          f"{groups_ms * 1e3:6.1f} us ({weight_bytes / groups_ms / 1e9:.2f} TB/s), one persistent kernel "
          f"{chain_ms * 1e3:6.1f} us ({weight_bytes / chain_ms / 1e9:.2f} TB/s, {groups_ms / chain_ms:.2f}x); "
          f"outputs' largest difference {', '.join(f'{k} {v:.1e}' for k, v in errs.items())}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    rows = SLOT_ROWS.value  # (the row read by the consumers: a slot of one box)
    if args.compile_only:
        compile_sm90(decode_chain, SIGNATURE, options(rows), f"b1 o_proj -> gate/up -> down, {rows}-row units")
    else:
        run_gpu(rows, args.reps)


if __name__ == "__main__":
    main()
