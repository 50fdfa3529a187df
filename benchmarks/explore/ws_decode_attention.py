"""Does decode attention read the paged cache at the read bandwidth when a loader warp streams the pages? (Gluon)

At batch 64 and 512 tokens of context Llama-3-8B's attention reads 134 MB a layer (32 us at 4.2 TB/s) and takes
~50 us of a layer in the megakernel, 44 alone (`decode_attention.py`'s loop): a program's chain of dependent loads
(page ids, then keys) and its one warp group's copies bound it, and keys through tensor descriptors did not help
while the page ids were loads the copies waited on (sessions 48 and 50). Here a loader warp reads IDS of a
sequence's page ids in one load, then copies each page's keys and values (TMA boxes of [PAGE, HD], or two of [PAGE,
HD / 2]) into a ring of STAGES slots of BLOCK keys; it waits only for a free slot, so it runs on into the next task
while the consumers finish this one. The default partition folds each slot into the online softmax of the task's
query heads (a KV head's four, one decoding token) and stores the normalised output, either
- on the tensor cores (MMA 1): scores [64, BLOCK] = q k^T by `wgmma` over the two column halves (the four rows
  padded to a warp group's 64), the softmax on the scores' own layout, the two output halves += p v; or
- on the CUDA cores (MMA 0): each warp keeps its own softmax state over the slot's keys it holds, merged across
  warps once a task.

One program an SM, a task a (sequence, KV head), every P-th task a program, the same tasks and cache as
`decode_attention.py` (layout 0: a token's row holds every KV head). Checked against SDPA in fp32; timed (CUDA
graphs, as `ws_prefill.py`) against the bytes at the read bandwidth measured in the same run, the megakernel's own
loop (`decode_attention.py`'s default variant) and torch's SDPA over contiguous keys, in the same call.

    python -m benchmarks.explore.ws_decode_attention --variants 64/4/4/0/1     # on an H100 / H200
    python -m benchmarks.explore.ws_decode_attention --compile-only          # here, no GPU: compile for sm_90

A variant is BLOCK/STAGES/warps[/MODE[/MMA]]; MODE 1 (timing only) hands each slot back unused (the loader's bound),
2 hands over slots with nothing copied (the consumers' bound).
"""
import argparse

import torch
import torch.nn.functional as F
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks.explore.gluon_probe import compile_sm90, graph_ms, use_global_scratch

LOG2E = gl.constexpr(1.4426950408889634)  # scores in units of raw dot products: exp(x scale) = 2^(x scale LOG2E)


@gluon.jit
def _loader(kv, pages, k_ring, v_ring, ready, empty, num_tasks, ctx, num_slots, kv_plane, pages_per_seq, pid, P,
            HKV: gl.constexpr, HD: gl.constexpr, PAGE: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr,
            IDS: gl.constexpr, MODE: gl.constexpr):
    """Copies every slot's pages, each page's keys and values as HALVES boxes of [PAGE, HD / HALVES] (the ring's
    slot s is HALVES buffers, s * HALVES + h, of [BLOCK, HD / HALVES] each)."""
    HALVES: gl.constexpr = k_ring.type.shape[0] // STAGES
    HW: gl.constexpr = HD // HALVES
    layout: gl.constexpr = k_ring.type.layout
    k_desc = tma.make_tensor_descriptor(kv, [num_slots, HKV * HD], [HKV * HD, 1], [PAGE, HW], layout)
    v_desc = tma.make_tensor_descriptor(kv + kv_plane, [num_slots, HKV * HD], [HKV * HD, 1], [PAGE, HW], layout)
    ids_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    PER: gl.constexpr = BLOCK // PAGE  # pages a slot
    num_pages = gl.cdiv(ctx, PAGE)
    i = 0
    for t in range(pid, num_tasks, P):
        b = t // HKV
        col = (t % HKV) * HD
        for w0 in range(0, num_pages, IDS):  # IDS page ids in one load, then their pages' copies
            pw = w0 + gl.arange(0, IDS, layout=ids_layout)
            ids = gl.load(pages + b * pages_per_seq + pw, mask=pw < num_pages, other=0)
            for p0 in range(w0, gl.minimum(w0 + IDS, num_pages), PER):
                s = i % STAGES
                mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                if MODE == 2:  # timing only: the slot handed over with nothing copied into it
                    mbarrier.arrive(ready.index(s), count=1)
                else:
                    # a slot's every page is copied (a barrier expects a constant count of bytes): past the
                    # sequence's last page, page id 0's keys, which the consumer masks
                    mbarrier.expect(ready.index(s), 2 * BLOCK * HD * 2)
                    for q in gl.static_range(PER):
                        slot = gl.sum(gl.where(pw == p0 + q, ids, 0), axis=0) * PAGE
                        for h in gl.static_range(HALVES):
                            tma.async_copy_global_to_shared(
                                k_desc, [slot, col + h * HW], ready.index(s),
                                k_ring.index(s * HALVES + h).slice(q * PAGE, PAGE, dim=0))
                            tma.async_copy_global_to_shared(
                                v_desc, [slot, col + h * HW], ready.index(s),
                                v_ring.index(s * HALVES + h).slice(q * PAGE, PAGE, dim=0))
                i += 1


@gluon.jit
def _fold(k, v, ok, q, m, l, acc, c):
    """One query row's online softmax state after a slot's keys, each warp its own (m, l: [W, 1], acc: [W, 1, HD])
    over the slot's keys it holds (k, v: [W, R, HD]), so that no reduction crosses warps until the task's end, and
    every value keeps a layout of the [W, R, HD] tile's (no conversion through shared memory). Scores in units of
    raw dot products; c = scale x log2(e)."""
    s = gl.sum(k * gl.expand_dims(gl.expand_dims(q, 0), 0), axis=2)  # [W, R]
    m_new = gl.maximum(m, gl.max(gl.where(ok, s, -1.0e30), axis=1, keep_dims=True))
    p = gl.where(ok, gl.exp2((s - m_new) * c), 0.0)
    alpha = gl.exp2((m - m_new) * c)
    acc = acc * gl.expand_dims(alpha, 2) + gl.sum(gl.expand_dims(p, 2) * v, axis=1, keep_dims=True)
    return m_new, l * alpha + gl.sum(p, axis=1, keep_dims=True), acc


@gluon.jit
def _merge(m, l, acc, c):
    """A query row's output [HD] from its warps' states (one cross-warp reduction a task)."""
    w = gl.exp2((m - gl.max(m, axis=0, keep_dims=True)) * c)  # [W, 1]
    return gl.sum(gl.sum(acc * gl.expand_dims(w, 2), axis=0), axis=0) / gl.sum(gl.sum(l * w, axis=0), axis=0)


@gluon.jit
def _consumer(q_ptr, out, k_ring, v_ring, ready, empty, num_tasks, ctx, scale, pid, P, HKV: gl.constexpr,
              HD: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr):
    W: gl.constexpr = gl.num_warps()
    R: gl.constexpr = BLOCK // W  # a warp's keys of a slot
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 2, 16], [W, 1, 1], [2, 1, 0])  # [W, R, HD]
    scores: gl.constexpr = gl.SliceLayout(2, L3)  # [W, R]
    d = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(0, L3)))
    key = (gl.arange(0, W, layout=gl.SliceLayout(1, scores))[:, None] * R
           + gl.arange(0, R, layout=gl.SliceLayout(0, scores))[None, :])
    c = scale * LOG2E
    i = 0
    for t in range(pid, num_tasks, P):
        head = t * 4  # (sequence b, KV head g) -> query heads b * H + g * 4 .. + 3 (REP 4)
        q0 = gl.load(q_ptr + (head + 0) * HD + d).to(gl.float32)
        q1 = gl.load(q_ptr + (head + 1) * HD + d).to(gl.float32)
        q2 = gl.load(q_ptr + (head + 2) * HD + d).to(gl.float32)
        q3 = gl.load(q_ptr + (head + 3) * HD + d).to(gl.float32)
        m0 = gl.full([W, 1], -1.0e30, gl.float32, scores)
        m1 = gl.full([W, 1], -1.0e30, gl.float32, scores)
        m2 = gl.full([W, 1], -1.0e30, gl.float32, scores)
        m3 = gl.full([W, 1], -1.0e30, gl.float32, scores)
        l0 = gl.zeros([W, 1], gl.float32, scores)
        l1 = gl.zeros([W, 1], gl.float32, scores)
        l2 = gl.zeros([W, 1], gl.float32, scores)
        l3 = gl.zeros([W, 1], gl.float32, scores)
        a0 = gl.zeros([W, 1, HD], gl.float32, L3)
        a1 = gl.zeros([W, 1, HD], gl.float32, L3)
        a2 = gl.zeros([W, 1, HD], gl.float32, L3)
        a3 = gl.zeros([W, 1, HD], gl.float32, L3)
        for j in range(0, ctx, BLOCK):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            k = k_ring.index(s).reshape([W, R, HD]).load(L3).to(gl.float32)
            v = v_ring.index(s).reshape([W, R, HD]).load(L3).to(gl.float32)
            fence_async_shared()  # the slot's reads before the loader's next copies into it
            mbarrier.arrive(empty.index(s), count=1)
            if MODE != 1:  # (1, timing only: the slot handed back unused)
                ok = (j + key) < ctx
                # (a slot's last pages may hold another sequence's keys: their values zeroed, their scores masked)
                v = gl.where(gl.expand_dims(ok, 2), v, 0.0)
                m0, l0, a0 = _fold(k, v, ok, q0, m0, l0, a0, c)
                m1, l1, a1 = _fold(k, v, ok, q1, m1, l1, a1, c)
                m2, l2, a2 = _fold(k, v, ok, q2, m2, l2, a2, c)
                m3, l3, a3 = _fold(k, v, ok, q3, m3, l3, a3, c)
            i += 1
        gl.store(out + (head + 0) * HD + d, _merge(m0, l0, a0, c))
        gl.store(out + (head + 1) * HD + d, _merge(m1, l1, a1, c))
        gl.store(out + (head + 2) * HD + d, _merge(m2, l2, a2, c))
        gl.store(out + (head + 3) * HD + d, _merge(m3, l3, a3, c))


@gluon.jit
def _consumer_mma(q_ptr, out, k_ring, v_ring, ready, empty, num_tasks, ctx, scale, pid, P, HKV: gl.constexpr,
                  HD: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr):
    """The task's four query rows (padded to 64, a warp group's wgmma) against each slot's keys on the tensor cores:
    scores [64, BLOCK] = q k^T over the two column halves, then the online softmax on the scores' own layout, then
    the two output halves [64, 64] += p v. A warp group (4 warps) a program."""
    HW: gl.constexpr = HD // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HW, 16])
    q_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    qr = gl.arange(0, 64, layout=gl.SliceLayout(1, q_dot))
    qd = gl.arange(0, HW, layout=gl.SliceLayout(0, q_dot))
    keys = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, s_layout))
    orow = gl.arange(0, 64, layout=rows_o)
    od = gl.arange(0, HW, layout=gl.SliceLayout(0, o_layout))
    c = scale * LOG2E
    i = 0
    for t in range(pid, num_tasks, P):
        head = t * 4  # (sequence b, KV head g) -> query heads b * H + g * 4 .. + 3 (REP 4)
        q_rows = q_ptr + (head + qr[:, None]) * HD + qd[None, :]
        q0 = gl.load(q_rows, mask=qr[:, None] < 4, other=0.0)  # [64, HW], rows past the group's four zero
        q1 = gl.load(q_rows + HW, mask=qr[:, None] < 4, other=0.0)
        m = gl.full([64], -1.0e30, gl.float32, rows_s)
        l = gl.zeros([64], gl.float32, rows_s)
        o0 = gl.zeros([64, HW], gl.float32, o_layout)
        o1 = gl.zeros([64, HW], gl.float32, o_layout)
        for j in range(0, ctx, BLOCK):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            if MODE != 1:  # (1, timing only: the slot handed back unused)
                sc = warpgroup_mma(q0, k_ring.index(2 * s).permute((1, 0)), gl.zeros([64, BLOCK], gl.float32, s_layout),
                                   is_async=True)
                sc = warpgroup_mma(q1, k_ring.index(2 * s + 1).permute((1, 0)), sc, is_async=True)
                sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
                ok = (j + keys) < ctx
                sc = gl.where(ok[None, :], sc, -1.0e30)
                m_new = gl.maximum(m, gl.max(sc, axis=1))
                p = gl.exp2((sc - m_new[:, None]) * c)
                alpha = gl.exp2((m - m_new) * c)
                l = l * alpha + gl.sum(p, axis=1)
                m = m_new
                a = gl.convert_layout(alpha, rows_o)[:, None]
                pb = gl.convert_layout(p.to(gl.bfloat16), p_dot)
                o0 = warpgroup_mma(pb, v_ring.index(2 * s), o0 * a, is_async=True)
                o1 = warpgroup_mma(pb, v_ring.index(2 * s + 1), o1 * a, is_async=True)
                o0, o1 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1))
            fence_async_shared()
            mbarrier.arrive(empty.index(s), count=1)
            i += 1
        inv = 1.0 / gl.convert_layout(l, rows_o)[:, None]
        o_rows = out + (head + orow[:, None]) * HD + od[None, :]
        gl.store(o_rows, o0 * inv, mask=orow[:, None] < 4)
        gl.store(o_rows + HW, o1 * inv, mask=orow[:, None] < 4)


@gluon.jit
def ws_attend(q, kv, pages, out, num_tasks, ctx, num_slots, kv_plane, pages_per_seq, scale, HKV: gl.constexpr,
              HD: gl.constexpr, PAGE: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr, IDS: gl.constexpr,
              LOADER_REGS: gl.constexpr, MODE: gl.constexpr, MMA: gl.constexpr):
    """Task t: sequence t // HKV's one decoding token, its KV head t % HKV's four query heads, against ctx keys.
    MMA: the scores and the values' sum on the tensor cores (`wgmma`, the four rows padded to 64), the slots in two
    column halves of 64 (a 128-byte swizzle's width); else on the CUDA cores. MODE (timing only, wrong results): 1,
    the consumers hand each slot back unused (the loader's and the copies' bound); 2, the loader hands over empty
    slots (the consumers' bound)."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    if MMA:
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, HD // 2], gl.bfloat16)
        k_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 2, BLOCK, HD // 2], layout)
        v_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 2, BLOCK, HD // 2], layout)
    else:
        plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
        k_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK, HD], plain)
        v_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK, HD], plain)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer_mma if MMA else _consumer, (q, out, k_ring, v_ring, ready, empty, num_tasks, ctx, scale, pid, P,
                                               HKV, HD, BLOCK, STAGES, MODE)),
        (_loader, (kv, pages, k_ring, v_ring, ready, empty, num_tasks, ctx, num_slots, kv_plane, pages_per_seq, pid,
                   P, HKV, HD, PAGE, BLOCK, STAGES, IDS, MODE)),
    ], [1], [LOADER_REGS])


def options(block, stages, warps, mode=0, mma=0, ids=32, page=16, hkv=8, hd=128):
    return dict(HKV=hkv, HD=hd, PAGE=page, BLOCK=block, STAGES=stages, IDS=ids, LOADER_REGS=40, MODE=mode, MMA=mma,
                num_warps=warps,
                maxnreg=65536 // ((warps + 4) * 32) // 8 * 8)


def variants(spec):
    """'64/4/8,64/4/8/1,64/4/4/0/1,...' -> [(keys a slot, stages, consumer warps, MODE, MMA)]."""
    return [tuple(int(x) for x in v.split("/")) + (0, ) * (5 - len(v.split("/"))) for v in spec.split(",")]


def compile_only(specs):
    sig = {"q": "*bf16", "kv": "*bf16", "pages": "*i32", "out": "*fp32", "num_tasks": "i32", "ctx": "i32",
           "num_slots": "i32", "kv_plane": "i32", "pages_per_seq": "i32", "scale": "fp32"}
    for block, stages, warps, mode, mma in specs:
        compile_sm90(ws_attend, sig, options(block, stages, warps, mode, mma),
                     f"{block} keys a slot, {stages} stages, {warps} warps, mode {mode}, wgmma {mma}")


def run_gpu(specs, shapes, reps):
    from benchmarks.baselines import read_bandwidth_tbs
    from benchmarks.explore.decode_attention import Shape, Variant, attend_tasks, paged_cache
    dev = "cuda"
    use_global_scratch(dev)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = read_bandwidth_tbs(dev)
    print(f"{torch.cuda.get_device_name()}: DRAM read {bw:.2f} TB/s, {sms} SMs", flush=True)
    torch.manual_seed(0)
    for pair in shapes.split(","):
        batch, ctx = map(int, pair.split("x"))
        shape = Shape(batch, ctx + 1)  # the context and the token being decoded
        hq = shape.kv_heads * shape.rep
        q = torch.randn(batch, hq, shape.head_dim, device=dev).to(torch.bfloat16)
        k, v = (torch.randn(batch, shape.kv_heads, shape.ctx, shape.head_dim, device=dev).to(torch.bfloat16)
                for _ in range(2))
        ref = F.scaled_dot_product_attention(q.float()[:, :, None], k.float(), v.float(), enable_gqa=True)[:, :, 0]
        floor = shape.kv_bytes / (bw * 1e12) * 1e6
        print(f"b{batch} ctx{shape.ctx}: {shape.kv_bytes / 1e6:.1f} MB of keys and values, {floor:.1f} us at the "
              f"read bandwidth", flush=True)
        cache, table, head_stride, row_stride, plane = paged_cache(shape, k, v, Variant())
        num_slots = plane // (shape.kv_heads * shape.head_dim)
        out = torch.empty_like(ref)
        num_tasks = batch * shape.kv_heads
        sm_ids = torch.empty(264, dtype=torch.int32, device=dev)

        def triton_loop():  # the megakernel's loop as `decode_attention.py`'s default variant runs it
            attend_tasks[(264, )](q, cache, table, out, sm_ids, num_tasks, shape.ctx, plane, head_stride, row_stride,
                                  table.shape[1], shape.head_dim ** -0.5, HKV=shape.kv_heads, REP=shape.rep,
                                  HD=shape.head_dim, BM=16, PAGE_SIZE=16, BKV=32, STAGES=3, WINDOW=16, HEADS=1,
                                  BF16_SCORES=False, num_warps=4)
        out.fill_(float("nan"))
        triton_loop()
        err = ((out - ref).norm() / ref.norm()).item()
        us = graph_ms(triton_loop, reps) * 1e3
        print(f"RESULT the megakernel's loop (264 programs, 32-key blocks, 3 stages): {us:6.1f} us "
              f"({100 * floor / us:5.1f}% of DRAM) rel err {err:.1e}", flush=True)
        sdpa_us = graph_ms(lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True), reps) * 1e3
        print(f"RESULT torch SDPA (keys contiguous, GQA): {sdpa_us:6.1f} us ({100 * floor / sdpa_us:5.1f}% of DRAM)",
              flush=True)
        for block, stages, warps, mode, mma in specs:
            opts = options(block, stages, warps, mode, mma)

            def launch():
                ws_attend[(sms, )](q, cache, table, out, num_tasks, shape.ctx, num_slots, plane, table.shape[1],
                                   shape.head_dim ** -0.5, **opts)
            out.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            err = ((out - ref).norm() / ref.norm()).item()
            us = graph_ms(launch, reps) * 1e3
            what = ("", ", slots handed back unused", ", nothing copied")[mode] + (", wgmma" if mma else "")
            print(f"RESULT ws {block} keys a slot, {stages} stages, {warps} warps{what}: {us:6.1f} us "
                  f"({100 * floor / us:5.1f}% of DRAM) rel err {err:.1e}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--variants", default="64/4/4/0/1,128/3/4/0/1,64/4/8", help="BLOCK/STAGES/warps[/MODE[/MMA]], "
                        "comma-separated")
    parser.add_argument("--shapes", default="64x512,64x4096,1x512", help="batch x context pairs")
    parser.add_argument("--reps", type=int, default=20, help="launches a CUDA graph (timings: its replays)")
    args = parser.parse_args()
    if args.compile_only:
        compile_only(variants(args.variants))
    else:
        run_gpu(variants(args.variants), args.shapes, args.reps)


if __name__ == "__main__":
    main()
