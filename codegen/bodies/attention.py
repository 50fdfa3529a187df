"""Paged causal attention of one sequence and one KV head (all query heads of its group, every query
token of the step): flash-attention's online softmax over the sequence's pages."""
import triton
import triton.language as tl

from codegen.bodies.common import round_to, word, word8, word_f32

ATTENTION_FIELDS = ("q_off", "out_off", "num_heads", "num_kv_heads", "head_dim", "layer", "scale")
NEG = tl.constexpr(-1.0e30)


@triton.jit
def attention_task(desc, tile, ACT, I32, KV, kv_plane, num_seqs, SEQ_STARTS: tl.constexpr,
                   CONTEXT_LENS: tl.constexpr, SEQ_REQ: tl.constexpr, REQ_PAGES: tl.constexpr,
                   PAGES_PER_SEQ: tl.constexpr, PAGE_SIZE: tl.constexpr, BM: tl.constexpr, BKV: tl.constexpr,
                   HDP: tl.constexpr, DOT_F32: tl.constexpr):
    q_off, out_off, H, HKV = word8(desc, 0), word8(desc, 1), word(desc, 2), word(desc, 3)
    HD, layer, scale = word8(desc, 4), word(desc, 5), word_f32(desc, 6)
    kv_plane = tl.multiple_of(kv_plane, 8)
    dt: tl.constexpr = ACT.dtype.element_ty
    b = tile // HKV
    g = tile % HKV
    if b < num_seqs:
        start = tl.load(I32 + SEQ_STARTS + b)
        q_len = tl.load(I32 + SEQ_STARTS + b + 1) - start
        ctx = tl.load(I32 + CONTEXT_LENS + b)
        pages = I32 + REQ_PAGES + tl.load(I32 + SEQ_REQ + b) * PAGES_PER_SEQ
        rep = H // HKV
        d = tl.arange(0, HDP)
        d_ok = d < HD
        k_base = KV + (layer * 2) * kv_plane + g * HD
        v_base = k_base + kv_plane
        for m0 in range(0, q_len * rep, BM):
            r = m0 + tl.arange(0, BM)
            r_ok = r < q_len * rep
            tok = start + r // rep
            head = g * rep + r % rep
            q_pos = ctx - q_len + r // rep
            q_ptr = ACT + q_off + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :]
            q = tl.load(q_ptr, mask=r_ok[:, None] & d_ok[None, :], other=0.0)
            m_i = tl.full((BM,), NEG, tl.float32)
            l_i = tl.zeros((BM,), tl.float32)
            acc = tl.zeros((BM, HDP), tl.float32)
            for j0 in range(0, ctx, BKV):
                j = j0 + tl.arange(0, BKV)
                j_ok = j < ctx
                page = tl.load(pages + j // PAGE_SIZE, mask=j_ok, other=0).to(tl.int64)
                slot = page * PAGE_SIZE + j % PAGE_SIZE
                kv_mask = j_ok[:, None] & d_ok[None, :]
                k = tl.load(k_base + slot[:, None] * (HKV * HD) + d[None, :], mask=kv_mask, other=0.0)
                v = tl.load(v_base + slot[:, None] * (HKV * HD) + d[None, :], mask=kv_mask, other=0.0)
                if DOT_F32:
                    s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                s = round_to(round_to(s, dt) * scale, dt)
                s = tl.where((j[None, :] <= q_pos[:, None]) & j_ok[None, :], s, NEG)
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                if DOT_F32:
                    pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p.to(dt), v)
                acc = acc * alpha[:, None] + pv
                m_i = m_new
            out = acc / l_i[:, None]
            out_ptr = ACT + out_off + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :]
            tl.store(out_ptr, out.to(dt), mask=r_ok[:, None] & d_ok[None, :])
