"""How fast does the megakernel's decode attention loop read keys and values with nothing else around it? (probe)

At batch 64 and 512 tokens of context, Llama-3-8B's attention reads 134 MB of keys and values a layer, 32 us at
4.2 TB/s. In the megakernel it takes ~57 us a layer (`profile_step --batch 64`: 512 tasks, a sequence and KV head
each, ~27 us a task, two waves on 264 programs), the largest gap of a b64 step. This probe runs the kernel's own
`attend` (codegen/bodies/attention.py) over the same tasks, one query token a sequence, and prints each variant's
time next to the time of its bytes at the read bandwidth measured in the same run and torch's SDPA over the same
keys and values stored contiguously. If the loop alone is as slow, the body is the lever; if not, what the kernel
does around it is.

    python -m benchmarks.explore.decode_attention                     # on an H100 / H200
    python -m benchmarks.explore.decode_attention --variants "programs=264 programs=264,stages=4"

A variant is comma-separated fields: programs (a persistent grid taking every grid-th task, as the kernel's
programs do; 0: a program a task, placed by the hardware), bkv (keys a block), stages (pipelined blocks), window
(blocks whose page ids are read at once: the pipeline drains between windows), heads (KV heads a task reads
side by side, as one wider row), tma (1: a page a block, each page's keys and values one bulk tensor copy), ids
(tma: page ids read that many at a time before their pages' loop), page (keys a page of the cache), warps,
layout (0: the kernel's cache, a token's row holding every KV head; 1: each KV head's keys contiguous) and
shuffled (1: each sequence's pages in random order, as a long-lived pool leaves them; 0: in order, as the runtime
gives them out today), bf16 (1: scores rounded to bf16 around their scaling, `attention_bf16_scores`) and bm
(query rows a block: 16, or 64 for the prefill blocks' warp-group dots, the rows past the group's heads masked).
`DOT_F32` lets the kernels run in Triton's interpreter (no bf16 dots there, and `PLACE=False`) for a check on
the CPU. Each line also gives the kernel's shared memory and registers, and how many programs the hardware put
on an SM (each program writes its SM id): with `programs=264` and room for more than two programs an SM, some SMs
may get more than the megakernel's two.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.baselines import median_ms, read_bandwidth_tbs
from benchmarks.explore.variant_fields import with_fields
from codegen.bodies.attention import attend, attend_block, attention_start
from runtime.megakernel import use_scratch_allocator

@triton.jit
def sm_id():
    """The SM this program runs on (inline PTX: GPU only)."""
    return tl.inline_asm_elementwise(asm="mov.u32 $0, %smid;", constraints="=r,r", args=[tl.program_id(0)],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def attend_tasks(Q, KV, PAGES, OUT, SMS, num_tasks, ctx, kv_plane, head_stride, row_stride, pages_per_seq, scale,
                 HKV: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr,
                 PAGE_SIZE: tl.constexpr, BKV: tl.constexpr, STAGES: tl.constexpr, WINDOW: tl.constexpr,
                 HEADS: tl.constexpr, BF16_SCORES: tl.constexpr, DOT_F32: tl.constexpr = False,
                 PLACE: tl.constexpr = True):
    """Task t: sequence t // (HKV / HEADS)'s one query token against its `ctx` keys, paged, for HEADS KV heads
    side by side (their REP query heads each, padded to BM rows); out = softmax(q k^T * scale) v in fp32. Keys
    at KV + slot * row_stride + head * head_stride, values kv_plane further. HEADS > 1 (heads contiguous in a
    row) reads the heads' keys as one row of HEADS * HD and gives each query row its own head's part of q, the
    others zero: a query row's scores are then its head's alone, and its output its head's part of the row.
    PLACE: each program writes the SM it runs on to SMS (GPU only)."""
    groups: tl.constexpr = HKV // HEADS
    d = tl.arange(0, HD * HEADS)
    d_ok = d < HD * HEADS
    r = tl.arange(0, BM)
    r_ok = r < REP * HEADS
    mine = (d[None, :] // HD == r[:, None] // REP) & r_ok[:, None]  # a row's own head's part of the row
    if PLACE:
        tl.store(SMS + tl.program_id(0), sm_id())
    t = tl.program_id(0)
    while t < num_tasks:
        b, g = t // groups, (t % groups) * HEADS
        head = g * REP + r
        q = tl.load(Q + (b * HKV * REP + head[:, None]) * HD + d[None, :] % HD, mask=mine, other=0.0)
        q_pos = tl.full((BM,), 0, tl.int32) + ctx - 1
        k_base = KV + tl.multiple_of(g * head_stride, 8)
        v_base = k_base + kv_plane
        m_i, l_i, acc = attend(q, q_pos, 0, ctx, PAGES + b * pages_per_seq, k_base, v_base, row_stride, d, d_ok,
                               scale, PAGE_SIZE, BKV, DOT_F32, STAGES, WINDOW, BF16_SCORES)
        tl.store(OUT + (b * HKV * REP + head[:, None]) * HD + d[None, :] % HD, acc / l_i[:, None], mask=mine)
        t += tl.num_programs(0)


@triton.jit
def attend_pages_tma(Q, KV, PAGES, OUT, SMS, num_tasks, ctx, kv_plane, num_slots, pages_per_seq, scale,
                     HKV: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr,
                     PAGE_SIZE: tl.constexpr, STAGES: tl.constexpr, IDS: tl.constexpr, DOT_F32: tl.constexpr = False,
                     PLACE: tl.constexpr = True):
    """`attend_tasks` (one head a task) a page a block, each page's keys and values one bulk tensor copy (TMA)
    at coordinates from the page table: no per-element address math, no masks (layout 0 only), each block folded in
    by the kernel's own `attend_block`. IDS > 0 reads the page ids IDS at a time before the pages' loop (a
    window), so that no copy waits on its page id's load."""
    row: tl.constexpr = HKV * HD
    k_desc = tl.make_tensor_descriptor(KV, shape=[num_slots, row], strides=[row, 1], block_shape=[PAGE_SIZE, HD])
    v_desc = tl.make_tensor_descriptor(KV + kv_plane, shape=[num_slots, row], strides=[row, 1],
                                       block_shape=[PAGE_SIZE, HD])
    d = tl.arange(0, HD)
    r = tl.arange(0, BM)
    r_ok = r < REP
    W: tl.constexpr = IDS if IDS > 0 else 1
    if PLACE:
        tl.store(SMS + tl.program_id(0), sm_id())
    t = tl.program_id(0)
    while t < num_tasks:
        b, g = t // HKV, t % HKV
        head = g * REP + r % REP
        q = tl.load(Q + (b * HKV * REP + head[:, None]) * HD + d[None, :], mask=r_ok[:, None], other=0.0)
        q_pos = tl.full((BM,), 0, tl.int32) + ctx - 1
        m_i, l_i, acc = attention_start(q)
        num_pages = tl.cdiv(ctx, PAGE_SIZE)
        for w0 in range(0, num_pages, W):
            if IDS > 0:
                pw = w0 + tl.arange(0, W)
                ids = tl.load(PAGES + b * pages_per_seq + pw, mask=pw < num_pages, other=0)
            for p in tl.range(w0, tl.minimum(w0 + W, num_pages), num_stages=STAGES):
                if IDS > 0:
                    slot = tl.sum(tl.where(tl.arange(0, W) == p - w0, ids, 0)) * PAGE_SIZE
                else:
                    slot = tl.load(PAGES + b * pages_per_seq + p) * PAGE_SIZE
                k = k_desc.load([slot, g * HD])
                v = v_desc.load([slot, g * HD])
                j = p * PAGE_SIZE + tl.arange(0, PAGE_SIZE)
                m_i, l_i, acc = attend_block(q, k, v, j, ctx, q_pos, m_i, l_i, acc, scale, DOT_F32, False)
        tl.store(OUT + (b * HKV * REP + head[:, None]) * HD + d[None, :], acc / l_i[:, None], mask=r_ok[:, None])
        t += tl.num_programs(0)


@dataclass(frozen=True)
class Variant:
    programs: int = 264
    bkv: int = 32
    stages: int = 3
    warps: int = 4
    layout: int = 0
    shuffled: int = 0
    window: int = 16  # key blocks whose page ids are read at once (the pipeline drains between windows)
    heads: int = 1  # KV heads a task reads side by side (layout 0 only)
    tma: int = 0  # 1: a page a block, each page one bulk tensor copy (`attend_pages_tma`; layout 0, one head)
    ids: int = 0  # tma: page ids read this many at a time before their pages' loop (0: each in the loop)
    page: int = 16  # keys a page of the cache
    bf16: int = 0  # 1: scores rounded to bf16 before and after their scaling (`attention_bf16_scores`)
    bm: int = 16  # query rows a block (the group's REP heads; the rest masked)

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        return with_fields(cls(), spec.split(","), spec)


@dataclass(frozen=True)
class Shape:
    batch: int
    ctx: int
    kv_heads: int = 8
    rep: int = 4  # query heads a KV head
    head_dim: int = 128

    @property
    def kv_bytes(self) -> int:
        return self.batch * self.kv_heads * self.ctx * self.head_dim * 2 * 2


def paged_cache(shape: Shape, k: torch.Tensor, v: torch.Tensor, variant: Variant):
    """k, v [B, HKV, ctx, D] written into a paged cache laid out as the variant says; returns (cache, page table
    [B, pages a sequence], head stride, row stride, plane) in elements."""
    page_size = variant.page
    pages_per_seq = -(-shape.ctx // page_size)
    num_pages = shape.batch * pages_per_seq
    order = torch.randperm(num_pages) if variant.shuffled else torch.arange(num_pages)
    table = order.view(shape.batch, pages_per_seq).to(torch.int32)
    slots = (table.long()[:, :, None] * page_size + torch.arange(page_size)).view(shape.batch, -1)[:, :shape.ctx]
    num_slots, hkv, hd = num_pages * page_size, shape.kv_heads, shape.head_dim
    plane = num_slots * hkv * hd
    cache = torch.zeros(2, *((num_slots, hkv, hd) if variant.layout == 0 else (hkv, num_slots, hd)),
                        dtype=k.dtype, device=k.device)
    for i, x in enumerate((k, v)):  # x [B, HKV, ctx, D]
        if variant.layout == 0:
            cache[i][slots.to(k.device)] = x.transpose(1, 2)
        else:
            cache[i][:, slots.to(k.device)] = x.transpose(0, 1)
    head_stride, row_stride = (hd, hkv * hd) if variant.layout == 0 else (num_slots * hd, hd)
    return cache, table.to(k.device), head_stride, row_stride, plane


def run(shape: Shape, variant: Variant, q, k, v, ref, bw: float) -> None:
    cache, table, head_stride, row_stride, plane = paged_cache(shape, k, v, variant)
    out = torch.empty_like(ref)
    if variant.heads > 1 and variant.layout != 0:
        raise SystemExit("heads > 1 reads a row's heads together: layout 0 only")
    num_tasks = shape.batch * shape.kv_heads // variant.heads
    grid = (variant.programs or num_tasks,)
    sms = torch.full(grid, -1, dtype=torch.int32, device=q.device)

    def launch():
        if variant.tma:
            return attend_pages_tma[grid](
                q, cache, table, out, sms, num_tasks, shape.ctx, plane, plane // (shape.kv_heads * shape.head_dim),
                table.shape[1], shape.head_dim ** -0.5, HKV=shape.kv_heads, REP=shape.rep, HD=shape.head_dim, BM=16,
                PAGE_SIZE=variant.page, STAGES=variant.stages, IDS=variant.ids, num_warps=variant.warps)
        return attend_tasks[grid](
            q, cache, table, out, sms, num_tasks, shape.ctx, plane, head_stride, row_stride, table.shape[1],
            shape.head_dim ** -0.5, HKV=shape.kv_heads, REP=shape.rep, HD=shape.head_dim, BM=variant.bm,
            PAGE_SIZE=variant.page, BKV=variant.bkv, STAGES=variant.stages, WINDOW=variant.window,
            HEADS=variant.heads, BF16_SCORES=bool(variant.bf16), num_warps=variant.warps)
    out.fill_(float("nan"))
    compiled = launch()
    err = ((out - ref).norm() / ref.norm()).item()
    per_sm = torch.bincount(sms.long().cpu())
    placed = (f"{compiled.metadata.shared // 1024} KB shared, {compiled.n_regs} regs; programs an SM "
              f"{int(per_sm[per_sm > 0].min())}-{int(per_sm.max())} on {int((per_sm > 0).sum())} SMs")
    us = median_ms(launch, q.device, num_warmup=3, num_reps=50) * 1e3
    floor = shape.kv_bytes / (bw * 1e12) * 1e6
    spec = " ".join(f"{f.name}={getattr(variant, f.name)}" for f in fields(variant))
    print(f"{spec}: {us:6.1f} us  ({100 * floor / us:5.1f}% of DRAM; "
          f"{shape.kv_bytes / us / 1e3 / (variant.programs or num_tasks):5.1f} GB/s a program)  rel err {err:.1e}; "
          f"{placed}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x512,64x4096", help="batch x context pairs")
    parser.add_argument("--variants", default="programs=264 programs=0 programs=264,stages=4 programs=264,bkv=64 "
                        "programs=264,bkv=16,stages=6 programs=264,layout=1 programs=264,shuffled=1")
    args = parser.parse_args()
    torch.manual_seed(0)
    use_scratch_allocator()  # the in-kernel tensor descriptors' global scratch (`tma`)
    bw = read_bandwidth_tbs("cuda")
    print(f"{torch.cuda.get_device_name()}: DRAM read {bw:.2f} TB/s", flush=True)
    for pair in args.shapes.split(","):
        batch, ctx = map(int, pair.split("x"))
        shape = Shape(batch, ctx + 1)  # the context and the token being decoded
        hq = shape.kv_heads * shape.rep
        q = torch.randn(batch, hq, shape.head_dim, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(batch, shape.kv_heads, shape.ctx, shape.head_dim, device="cuda").to(torch.bfloat16)
                for _ in range(2))
        ref = F.scaled_dot_product_attention(q.float()[:, :, None], k.float(), v.float(), enable_gqa=True)[:, :, 0]
        sdpa_us = median_ms(lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True),
                            q.device, num_warmup=3, num_reps=50) * 1e3
        print(f"b{batch} ctx{shape.ctx}: {shape.kv_bytes / 1e6:.1f} MB of keys and values, "
              f"{shape.kv_bytes / (bw * 1e12) * 1e6:.1f} us at the read bandwidth; torch SDPA (contiguous, GQA) "
              f"{sdpa_us:.1f} us", flush=True)
        for spec in args.variants.split():
            run(shape, Variant.parse(spec), q, k, v, ref, bw)


if __name__ == "__main__":
    main()
