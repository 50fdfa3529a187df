"""Does a batch-1 step's projection chain gain as one persistent Gluon kernel, weights streamed across groups? (Gluon)

The host-driven executor launches each one-row projection as a kernel of its own (`codegen/gluon/gemv.py`): o_proj's
32 MB take ~12 us where the bandwidth says 8. A group kernel pays a launch's fixed costs (program start, tensor
descriptors, the ring's first fill) and ends with a tail where programs idle. The persistent megakernel runs the groups
as one kernel with event counters. This probe runs a layer's o_proj -> gate/up -> down that way, `layers` times over
in one launch: two programs an SM walk the groups' units (a unit: GR weight rows over all of K); the loader warp
posts each unit's index to the consumers through a small queue in shared memory, then streams its weight boxes with
the row's beside them (the row once the group before is done: its event at the programs' count); the consumers
multiply, acquire the event themselves after the first unit's products (the norm's sums and the residual that the
epilogue reads), and signal the group's event when done. Variants: units in contiguous shares, or claimed one at a
time from a counter a group (all of them, or a share each first and then the last eighth or quarter claimed: a
program that ends its share early takes more), each claim asked for while the unit before streams; the first unit's
first ring slots' weight boxes copied before the wait, their row's boxes after it (EARLY: the weights do not depend
on the event, and the ring holds 96 KB of them a program); no waits at all (WAIT false: wrong outputs, what the
events cost). Traced variants stamp the global timer four times a group a program (`report_trace`).

H200, session 62 (one launch of 32 layers, a layer's 386 MB): 108.9-111.2 us a layer, 3.5 TB/s, 84-86% of the
measured read bandwidth and 1.05-1.11x the 96 GEMV kernels; without its waits 98.8 us (94%, as fast as the weights
alone with no products: the products cost nothing, the 96 events ~10 us a layer). The row read by the consumers from
L2 (a box ahead) rather than through the ring: 236 us. The loader never waiting (the row copied whole into shared
memory by the consumers after the event): 111.6. Units claimed one at a time, each claim after the unit before:
no better (32-row 123 us, 8-row 115). Boxes read as 16 KB contiguous (a blocked weight layout): no change.
Session 63: the loaders see an event 0.7 us after its last signal; polling with acquire loads instead of atomics
(110.1 against 110.0), asking L2 for a unit's first 1 or 4 KB a row before the wait (109.9, 113.8), and waiting for
the row a 256-column chunk at a time (110.7) gained nothing (those variants are in git history, 0a0c827).
Session 64: 8-row shares with the last eighth claimed 108.0-108.4 (gate/up's ends 3.3 us before and 1.6 after the
median program's, against 17.8 and 3.1 with shares alone: the spread evened, 1% gained; the rest of the claimed
variants are in git history, ca7031a); with EARLY **105.2** (87% of the bandwidth, 1.14x the GEMV kernels; without
waits 96.8), 32-row shares 110.7 -> 107.9: the first products come 3.8-12.7 us after the event instead of 7.7-19.0.

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

from benchmarks.explore.gluon_probe import compile_sm90, graph_ms, launches_against, probe_header
from benchmarks.explore.ws_chain import _wait, arenas
from benchmarks.explore.ws_prefill import _pop, _push
from codegen.gluon import gemv
from codegen.gluon.gemv import GK, SLOT_ROWS, _epilogue, _inv_rms, _units, _unit, copy_row, fill_slot
from codegen.gluon.linear import WORDS as LINEAR_WORDS, _norm_sums
from codegen.tasks import DESC_WORDS

GROUPS = gl.constexpr(3)  # o_proj, gate/up, down: descriptor rows 0, 1, 2
WORDS_A_ROW = gl.constexpr(DESC_WORDS)
RING_WORDS = gemv.WORDS  # (x_off, k, w_off, n, out_off, out_kind, stats_off, eps, res_off, bias_off, out_stats_off)


@gluon.jit
def _weights(DESCS, W, ACT, g, GR: gl.constexpr):
    """Group g's weight and row as tensor descriptors of [GR, GK] and [1, GK] boxes, its K and its units."""
    desc = DESCS + g * WORDS_A_ROW
    K, N = gl.load(desc + RING_WORDS[1]).to(gl.int32), gl.load(desc + RING_WORDS[3]).to(gl.int32)
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    w_desc = tma.make_tensor_descriptor(W + gl.load(desc + RING_WORDS[2]), [N, K], [K.to(gl.int64), 1], [GR, GK],
                                        plain)
    x_desc = tma.make_tensor_descriptor(ACT + gl.load(desc + RING_WORDS[0]), [1, K], [K.to(gl.int64), 1], [1, GK],
                                        plain)
    return w_desc, x_desc, K, gl.cdiv(N, GR)


@gluon.jit
def _proxy_fence(x):
    """Orders this thread's generic accesses before its later async-proxy (TMA) ones."""
    return gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _stamp(TRACE, event, events, k: gl.constexpr, ON: gl.constexpr):
    """The global timer (ns) at TRACE[program, event, k] (k: 0 the loader past its wait, 1 the consumers given the
    group's first unit, 2 past its products and their own wait, 3 the group done)."""
    if ON:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [event], dtype=gl.int64, is_pure=False,
                                        pack=1)
        gl.store(TRACE + (gl.program_id(0) * events + event) * 4 + k, now)


@gluon.jit
def _share(units, CLAIMED: gl.constexpr, TAIL: gl.constexpr):
    """This program's contiguous share u0 .. u1 of a group's units, and where the claimed units start: CLAIMED 0
    none claimed (`gemv._units`), 1 all of them, 2 the last units // TAIL, after every program's share."""
    if CLAIMED == 0:
        u0, u1 = _units(units)
        tail = units
    elif CLAIMED == 1:
        u0, u1, tail = 0, 0, 0
    else:
        tail = units - units // TAIL
        u0, u1 = _units(tail)
    return u0, u1, tail


@gluon.jit
def _ask(CLAIMS, event):
    """The group's claim counter taken once (lane 0 of the loader's warp), left a tensor: the warp waits for the atomic
    only where `_got` reads it, so a claim asked a unit ahead costs the stream nothing."""
    lane = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    return gl.atomic_add(CLAIMS + event + lane * 0, gl.full_like(lane, 1), mask=lane == 0, sem="relaxed", scope="gpu")


@gluon.jit
def _got(asked):
    """The counter's value that `_ask` took."""
    lane = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    return gl.max(gl.where(lane == 0, asked, 0), axis=0)


@gluon.jit
def _loader(DESCS, W, ACT, EVENTS, CLAIMS, TRACE, layers, w_ring, x_ring, ready, empty, queue, q_ready, q_empty,
            SLOTS_: gl.constexpr, WAIT: gl.constexpr, CLAIMED: gl.constexpr, TAIL: gl.constexpr,
            TRACING: gl.constexpr, EARLY: gl.constexpr):
    """Each group's units, group after group, layer after layer: a unit's index into the queue, then its weight's
    boxes with the row's beside them into the ring; the row once the group before is done (its event at the
    programs' count); a group's end as -1 in the queue. Its share's units first, then (CLAIMED) units claimed from
    the group's counter, each asked for while the unit before it is copied (a program's first claim, with no share,
    before the wait: claims depend on no event)."""
    GR: gl.constexpr = w_ring.type.shape[1]
    BOXES: gl.constexpr = w_ring.type.shape[0] // SLOTS_
    i = 0
    q = 0
    for layer in range(layers):
        for g in gl.static_range(GROUPS):
            event = layer * GROUPS + g
            w_desc, x_desc, K, units = _weights(DESCS, W, ACT, g, GR)
            u, u1, tail = _share(units, CLAIMED, TAIL)
            asked = gl.zeros([32], gl.int32, gl.BlockedLayout([1], [32], [1], [0]))
            if u >= u1:
                u = tail + _got(_ask(CLAIMS, event)) if CLAIMED > 0 else units
            k_first = 0  # where the first unit's copies go on from
            pushed = False
            if WAIT and event > 0:
                if EARLY and u < units:  # the first unit's first slots' weights now, their row's boxes after the wait
                    _push(queue, q_ready, q_empty, q, u, queue.type.shape[0])
                    q += 1
                    pushed = True
                    i0 = i
                    k_first = gl.minimum(SLOTS_ * BOXES * GK, K)
                    for k0 in range(0, k_first, BOXES * GK):
                        i = fill_slot(w_desc, x_desc, w_ring, x_ring, ready, empty, i, u, k0, SLOTS_, False)
                    _wait(EVENTS, event - 1, gl.num_programs(0))
                    _proxy_fence(K)
                    for k0 in range(0, k_first, BOXES * GK):
                        copy_row(x_desc, x_ring, ready, i0 + k0 // (BOXES * GK), k0, SLOTS_)
                else:
                    _wait(EVENTS, event - 1, gl.num_programs(0))
                    _proxy_fence(K)  # the row's generic stores before this thread's bulk copies of it
            _stamp(TRACE, event, layers * GROUPS, 0, TRACING)
            while u < units:
                if not pushed:
                    _push(queue, q_ready, q_empty, q, u, queue.type.shape[0])
                    q += 1
                pushed = False
                share_ends = u + 1 >= u1
                if CLAIMED > 0 and share_ends:
                    asked = _ask(CLAIMS, event)
                for k0 in range(k_first, K, BOXES * GK):
                    i = fill_slot(w_desc, x_desc, w_ring, x_ring, ready, empty, i, u, k0, SLOTS_, True)
                k_first = 0
                if not share_ends:
                    u += 1
                elif CLAIMED > 0:
                    u = tail + _got(asked)
                else:
                    u = units
            _push(queue, q_ready, q_empty, q, -1, queue.type.shape[0])
            q += 1


@gluon.jit
def _consumer(DESCS, W, ACT, F32, EVENTS, TRACE, layers, w_ring, x_ring, ready, empty, queue, q_ready, q_empty,
              SLOTS_: gl.constexpr, NORM_F64: gl.constexpr, WAIT: gl.constexpr, TRACING: gl.constexpr):
    """Each group's units as the loader posts them, until its -1; a group done, its event moves on. The loader
    waited for the group before (its row is in the first unit's products); the norm's sums and the residual that the
    epilogue reads want the consumers' own acquire, after the first unit's products (one poll: the count is there).
    WAIT false: no waits anywhere (wrong outputs; what the events cost)."""
    vec: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])
    i = 0
    q = 0
    for layer in range(layers):
        for g in gl.static_range(GROUPS):
            desc = DESCS + g * WORDS_A_ROW
            K, N = gl.load(desc + RING_WORDS[1]).to(gl.int32), gl.load(desc + RING_WORDS[3]).to(gl.int32)
            out_off, stats_off = gl.load(desc + RING_WORDS[4]), gl.load(desc + RING_WORDS[6])
            eps = gl.load(desc + RING_WORDS[7]).to(gl.float64, bitcast=True).to(gl.float32)
            res_off, bias_off, out_stats_off = gl.load(desc + RING_WORDS[8]), gl.load(desc + RING_WORDS[9]), \
                gl.load(desc + RING_WORDS[10])
            event = layer * GROUPS + g
            inv = gl.to_tensor(1.0)
            sq = gl.to_tensor(0.0)
            first = True
            u = _pop(queue, q_ready, q_empty, q, queue.type.shape[0])
            q += 1
            _stamp(TRACE, event, layers * GROUPS, 1, TRACING)
            while u >= 0:
                y, i = _unit(w_ring, x_ring, ready, empty, i, K, SLOTS_, vec)
                if first:
                    if WAIT and event > 0:
                        _wait(EVENTS, event - 1, gl.num_programs(0))
                    inv = _inv_rms(F32, stats_off, K, eps, NORM_F64)
                    first = False
                    _stamp(TRACE, event, layers * GROUPS, 2, TRACING)
                sq += _epilogue(y, u, inv, W, ACT, F32, N, out_off, res_off, bias_off, g == 1, 0)
                u = _pop(queue, q_ready, q_empty, q, queue.type.shape[0])
                q += 1
            if out_stats_off >= 0:
                out_sums = _norm_sums(F32, out_stats_off, NORM_F64)
                gl.atomic_add(out_sums, sq.to(out_sums.dtype.element_ty))
            gl.thread_barrier()  # every thread's stores before the signal releases them
            _stamp(TRACE, event, layers * GROUPS, 3, TRACING)
            gl.atomic_add(EVENTS + event, 1, sem="release", scope="gpu")


@gluon.jit
def decode_chain(DESCS, W, ACT, F32, EVENTS, CLAIMS, TRACE, layers, GR: gl.constexpr, SLOTS_: gl.constexpr,
                 NORM_F64: gl.constexpr, LOADER_REGS: gl.constexpr, WAIT: gl.constexpr, CLAIMED: gl.constexpr,
                 TAIL: gl.constexpr, TRACING: gl.constexpr, EARLY: gl.constexpr):
    """Descriptor rows 0, 1, 2 of DESCS (o_proj, gate/up, down: LINEAR_FIELDS) over one row, `layers` times over
    (the same weights: a layer's 386 MB do not stay in L2); EVENTS and CLAIMS: a counter a group a layer, zero at the
    launch. CLAIMED: a program's units, past its contiguous share, claimed one at a time from the group's counter
    (`_share`)."""
    BOXES: gl.constexpr = SLOT_ROWS // GR
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    w_ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS_ * BOXES, GR, GK], plain)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS_ * BOXES, 1, GK], plain)
    ready = gl.allocate_shared_memory(gl.int64, [SLOTS_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS_, 1], mbarrier.MBarrierLayout())
    QUEUE: gl.constexpr = 4
    queue = gl.allocate_shared_memory(gl.int32, [QUEUE, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [QUEUE, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [QUEUE, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(SLOTS_):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    for s in gl.static_range(QUEUE):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer, (DESCS, W, ACT, F32, EVENTS, TRACE, layers, w_ring, x_ring, ready, empty, queue, q_ready,
                     q_empty, SLOTS_, NORM_F64, WAIT, TRACING)),
        (_loader, (DESCS, W, ACT, EVENTS, CLAIMS, TRACE, layers, w_ring, x_ring, ready, empty, queue, q_ready,
                   q_empty, SLOTS_, WAIT, CLAIMED, TAIL, TRACING, EARLY)),
    ], [1], [LOADER_REGS])


SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "EVENTS": "*i32", "CLAIMS": "*i32",
             "TRACE": "*i64", "layers": "i32"}


def options(rows: int, claimed: int = 0, tail: int = 8, tracing: bool = False, wait: bool = True,
            early: bool = False) -> dict:
    return dict(GR=rows, SLOTS_=gemv.SLOTS, NORM_F64=True, LOADER_REGS=gemv.LOADER_REGS, WAIT=wait, CLAIMED=claimed,
                TAIL=tail, TRACING=tracing, EARLY=early, **gemv.LAUNCH)


# (label, options, traced): each checked at one layer and timed at LAYERS
VARIANTS = (("32-row units", dict(rows=32), False),
            ("32-row units, weights before the wait", dict(rows=32, early=True), True),
            ("8-row units, the last eighth claimed", dict(rows=8, claimed=2), False),
            ("8-row units, the last eighth claimed, weights before the wait", dict(rows=8, claimed=2, early=True),
             True),
            ("16-row units, weights before the wait", dict(rows=16, early=True), False))
LAYERS = 32  # a whole model's worth of the chain (Llama-3-8B's layers), in one launch against 3 x 32 launches


def report_trace(trace: torch.Tensor, programs: int, layers: int) -> None:
    """Where a traced launch's time went, group by group (`_stamp`'s times; medians over the layers past the first):
    how long each group ran from the event before it completing to its own; over the programs that had units in it,
    the spread of their ends (the last past the median, the first before it) and how long they idled until the
    event completed; how long the loaders took to see the event before complete, and the consumers to have their
    first products after."""
    raw = trace.view(programs, layers * GROUPS.value, 4).cpu()
    stamped = raw > 0
    # us from the first stamp (ns since the epoch are past a double's 53 bits)
    t = (raw - raw[stamped].min()).double() / 1e3
    done = t[:, :, 3].max(dim=0).values  # each event's completion: its last program's signal
    names = ("o_proj", "gate/up", "down")
    print(f"  where the time goes (traced, {layers} layers; us, medians over layers 1-{layers - 1}; ends and idling "
          f"over the programs with units in the group):", flush=True)
    total = 0.0
    for g in range(GROUPS.value):
        events = [layer * GROUPS.value + g for layer in range(1, layers)]
        run = torch.tensor([done[e] - done[e - 1] for e in events])
        # (programs without a unit in the group stamp no products: their k = 2 is the zero it was cleared to)
        ends = [t[:, e, 3][stamped[:, e, 2]] for e in events]
        late = torch.tensor([end.max() - end.median() for end in ends])
        early = torch.tensor([end.median() - end.min() for end in ends])
        idle = torch.tensor([(done[e] - end).mean() for e, end in zip(events, ends)])
        seen = torch.stack([t[:, e, 0] - done[e - 1] for e in events])
        first = torch.cat([(t[:, e, 2] - t[:, e, 0])[stamped[:, e, 2]] for e in events])
        total += run.median().item()
        print(f"    {names[g]:8s} event to event {run.median():6.1f}; ends: the last past the median "
              f"{late.median():5.1f}, the first before it {early.median():5.1f}, idle till the event "
              f"{idle.median():5.1f} on average; the loaders past the event before: median {seen.median():5.2f}, 90th "
              f"{seen.quantile(0.9):5.2f}; first products after it {first.median():5.2f}", flush=True)
    print(f"    a layer {total:6.1f}", flush=True)


def run_gpu(reps: int) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = probe_header("batch-1 o_proj -> gate/up -> down: one persistent kernel against three GEMV kernels")
    descs, warena, act, f32, outputs = arenas(1, "cuda")
    programs = gemv.PER_SM * sms
    events = torch.zeros(GROUPS.value * LAYERS, dtype=torch.int32, device="cuda")
    claims = torch.zeros_like(events)
    trace = torch.zeros(programs * GROUPS.value * LAYERS * 4, dtype=torch.int64, device="cuda")
    widths = [int(descs[g, LINEAR_WORDS.value[4]]) for g in range(GROUPS.value)]  # each group's weight rows
    weight_bytes = sum(w * int(descs[g, LINEAR_WORDS.value[2]]) * 2 for g, w in enumerate(widths))

    def group(g):  # as the host-driven executor launches it
        rows = gemv.rows_for(widths[g], sms)
        units, grid = gemv.grid(widths[g], rows, sms)
        gemv.linear_gemv[(grid, )](descs, warena, act, f32, g, units,
                                   **gemv.constexprs(rows, g == 1, 0, True), **gemv.LAUNCH)

    def groups(layers=1):
        f32.zero_()
        for _ in range(layers):
            for g in range(GROUPS.value):
                group(g)

    each = [graph_ms(lambda g=g: group(g), reps) * 1e3 for g in range(GROUPS.value)]
    sums = graph_ms(lambda: torch.sum(warena[:weight_bytes // 2]), reps) * 1e3
    print(f"  each GEMV kernel alone (o_proj, gate/up, down): {', '.join(f'{t:.1f}' for t in each)} us; torch.sum "
          f"over as many bytes {sums:.1f} us ({weight_bytes / sums / 1e6:.2f} TB/s)", flush=True)
    many_ms = graph_ms(lambda: groups(LAYERS), max(2, reps // 8)) / LAYERS
    print(f"  {LAYERS} times over, a layer: {LAYERS * 3} GEMV kernels {many_ms * 1e3:6.1f} us "
          f"({weight_bytes / many_ms / 1e9:.2f} TB/s)", flush=True)
    for label, extra, traced in VARIANTS:
        def persistent(wait=True, layers=1, tracing=False):
            f32.zero_()
            events.zero_()
            claims.zero_()
            decode_chain[(programs, )](descs, warena, act, f32, events, claims, trace, layers,
                                       **options(**extra, tracing=tracing, wait=wait))
        groups_ms, chain_ms, errs = launches_against(groups, persistent, act, outputs, reps)
        long_ms = graph_ms(lambda: persistent(True, LAYERS), max(2, reps // 8)) / LAYERS
        free_ms = graph_ms(lambda: persistent(False, LAYERS), max(2, reps // 8)) / LAYERS
        print(f"RESULT b1 o_proj -> gate/up -> down ({weight_bytes / 1e6:.0f} MB of weights), {label}: one layer "
              f"{chain_ms * 1e3:6.1f} us against three GEMV kernels' {groups_ms * 1e3:6.1f} "
              f"({groups_ms / chain_ms:.2f}x), "
              f"outputs' largest difference {', '.join(f'{k} {v:.1e}' for k, v in errs.items())}; {LAYERS} layers in "
              f"one launch {long_ms * 1e3:6.1f} us a layer ({weight_bytes / long_ms / 1e9:.2f} TB/s, "
              f"{weight_bytes / long_ms / 1e9 / bw:.0%} of the read bandwidth; {many_ms / long_ms:.2f}x the GEMV "
              f"kernels), without its waits (outputs wrong) {free_ms * 1e3:6.1f} us", flush=True)
        if traced:
            trace.zero_()
            persistent(True, LAYERS, tracing=True)
            torch.cuda.synchronize()
            report_trace(trace, programs, LAYERS)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.compile_only:
        for label, extra, traced in VARIANTS:
            compile_sm90(decode_chain, SIGNATURE, options(**extra), label)
            if traced:
                compile_sm90(decode_chain, SIGNATURE, options(**extra, tracing=True), f"{label}, traced")
    else:
        run_gpu(args.reps)


if __name__ == "__main__":
    main()
