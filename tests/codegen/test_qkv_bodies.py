"""The QKV body (codegen/bodies/qkv.py) alone under TRITON_INTERPRET=1: a one-row step streamed over any number of
parts in whole tiles of 8 rows (`qkv_stream`: a q or k tile holds 4 rotary pairs) stores what a (head, split) task
a head stores (`split_head`), bit for bit, and both what torch gives: the q buffer and the new token's k and v in
the paged cache."""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from codegen.bodies.qkv import QKV_FIELDS, qkv_stream, split_head

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU)")

HQ, HKV, HD, K, BK = 4, 2, 16, 96, 32  # K: 3 chunks
POSITION, SLOT, SLOTS = 5, 3, 8


@triton.jit
def _split_kernel(desc, W, ACT, F32, I32, KV, kv_plane, heads, BK: tl.constexpr, HDP: tl.constexpr):
    for head in range(0, heads):  # one program: a task a head, K whole
        split_head(desc, head, 0, tl.arange(0, 1), tl.arange(0, 1) < 1, W, ACT, F32, I32, KV, kv_plane, 0, 1, 16, BK,
                   HDP, True, 2, True, False, False)


@triton.jit
def _stream_kernel(desc, W, ACT, F32, I32, KV, kv_plane, parts, OUT: tl.constexpr, BK: tl.constexpr,
                   TM: tl.constexpr):
    for part in range(0, parts):  # one program: the parts one after another
        qkv_stream(desc, part, parts, W, ACT, F32, I32, KV, kv_plane, 0, 1, OUT, BK, 2, TM)


def _rotate_half(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    lo, hi = y[..., :HD // 2], y[..., HD // 2:]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], -1)


@pytest.mark.parametrize("bias", [False, True])
# 16 tiles; a run of more than tm tiles takes its epilogue in passes
@pytest.mark.parametrize("parts, tm", [(1, 16), (1, 4), (2, 8), (3, 2), (7, 4), (16, 1)])
def test_streamed_qkv_matches_a_task_a_head_and_torch(parts, tm, bias):
    gen = torch.Generator().manual_seed(parts)
    heads = HQ + 2 * HKV
    w, x = torch.randn(heads * HD, K, generator=gen), torch.randn(K, generator=gen)
    b = torch.randn(heads * HD, generator=gen) if bias else torch.zeros(heads * HD)
    freqs = POSITION / 10000 ** (torch.arange(HD // 2) * 2 / HD)
    cos, sin = freqs.cos(), freqs.sin()
    rope = torch.zeros((POSITION + 1) * HD)
    rope[POSITION * HD:(POSITION + 1) * HD] = torch.cat([cos, sin])
    out = 512  # F32: the rope table, then the streamed tiles' results
    f32 = torch.cat([rope, torch.zeros(out - rope.numel() + heads * HD)])
    fields = dict(x_off=0, k=K, w_off=0, num_q_heads=HQ, num_kv_heads=HKV, head_dim=HD, rotary_dim=HD, stats_off=-1,
                  eps=0.0, bias_off=heads * HD * K if bias else -1, q_norm_off=-1, k_norm_off=-1, qk_eps=0.0,
                  q_out_off=K, layer=0, rope_off=0, has_qk_norm=0, splits=1, part_off=-1, ticket_off=-1,
                  num_tasks=heads)
    desc = torch.tensor([fields[name] for name in QKV_FIELDS], dtype=torch.int64)
    weights = torch.cat([w.flatten(), b])
    i32 = torch.tensor([POSITION, SLOT], dtype=torch.int32)
    kv_plane = SLOTS * HKV * HD

    def run(kernel, *args):
        act, kv = torch.cat([x, torch.zeros(HQ * HD)]), torch.zeros(2 * kv_plane)
        kernel[(1,)](desc, weights, act, f32.clone(), i32, kv, kv_plane, *args)
        return act[K:].view(HQ, HD), kv.view(2, SLOTS, HKV, HD)[:, SLOT]

    split_q, split_kv = run(_split_kernel, heads, BK, HD)
    q, kv = run(_stream_kernel, parts, out, BK, tm)
    assert torch.equal(q, split_q) and torch.equal(kv, split_kv)
    y = (w @ x + b).view(heads, HD)
    torch.testing.assert_close(q, _rotate_half(y[:HQ], cos, sin), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv[0], _rotate_half(y[HQ:HQ + HKV], cos, sin), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv[1], y[HQ + HKV:], rtol=1e-5, atol=1e-5)
