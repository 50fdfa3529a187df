"""The MoE bodies (codegen/bodies/moe.py) alone under TRITON_INTERPRET=1: the routing against the IR's reference
routing and the lists of pairs by expert that it appends to, the combine against its sums, a one-token step's
experts streamed over any number of parts against torch."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from codegen.bodies.moe import COMBINE_FIELDS, EXPERT_FIELDS, ROUTE_FIELDS, combine_task, expert_stream, route_task
from codegen.tasks import float_word
from ir.ops import get_op

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU)")


@triton.jit
def _route_kernel(desc, ACT, F32, I32, num_tokens, BM: tl.constexpr, EP: tl.constexpr, TOPK: tl.constexpr,
                  LOOP_ROWS: tl.constexpr):
    route_task(desc, tl.program_id(0), ACT, F32, I32, num_tokens, BM, EP, TOPK, LOOP_ROWS)


@pytest.mark.parametrize("loop_rows", [0, 8])  # 8: tasks of up to 8 tokens route them one at a time
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("num_tokens, num_experts, top_k, num_tasks", [
    (1, 128, 8, 3),  # a batch-1 decode step of Qwen3-30B-A3B: a token a task, two tasks without one
    (21, 6, 2, 2),  # more tokens than tasks: 16 a task, the second's 5 (one at a time where loop_rows is 8)
    (5, 64, 6, 8),
])
def test_routing_matches_the_reference_and_lists_every_pair_under_its_expert(normalize, num_tokens, num_experts,
                                                                              top_k, num_tasks, loop_rows):
    logits = torch.randn(num_tokens, num_experts, generator=torch.Generator().manual_seed(num_experts))
    pairs, block, capacity = num_tokens * top_k, 16, num_tokens + 3
    act = torch.cat([logits.flatten(), torch.zeros(pairs)])
    entries_off, active_off = pairs, pairs + num_experts * capacity
    i32 = torch.full((active_off + num_experts,), -1, dtype=torch.int32)
    counts = torch.zeros(num_experts + 1, dtype=torch.int32)  # as the planner leaves them every step
    layout = dict(logits_off=0, num_experts=num_experts, top_k=top_k, normalize=int(normalize),
                  weights_off=logits.numel(), ids_off=0, counts_off=0, entries_off=entries_off,
                  active_off=active_off, capacity=capacity, num_tasks=num_tasks)
    desc = torch.tensor([layout[name] for name in ROUTE_FIELDS], dtype=torch.int64)
    _route_kernel[(num_tasks,)](desc, act, counts.view(torch.float32), i32, num_tokens, block,
                                triton.next_power_of_2(num_experts), 8, loop_rows)
    weights, ids = get_op("moe_route").reference(logits, top_k=top_k, normalize=normalize)
    assert i32[:pairs].view(num_tokens, top_k).tolist() == ids.tolist()
    torch.testing.assert_close(act[logits.numel():].view(num_tokens, top_k), weights, rtol=1e-6, atol=1e-7)

    ids = ids.flatten()
    used = torch.unique(ids).tolist()
    assert counts.tolist() == [*torch.bincount(ids, minlength=num_experts).tolist(), len(used)]
    assert sorted(i32[active_off:active_off + len(used)].tolist()) == used  # in the order they came
    for expert in used:
        listed = i32[entries_off + expert * capacity:][:int(counts[expert])]
        assert sorted(listed.tolist()) == torch.nonzero(ids == expert).flatten().tolist()


@triton.jit
def _combine_kernel(desc, ACT, F32, num_tokens, BM: tl.constexpr, BN: tl.constexpr, WM: tl.constexpr,
                    WN: tl.constexpr, TOPK: tl.constexpr):
    combine_task(desc, tl.program_id(0), ACT, F32, num_tokens, BM, BN, WM, WN, TOPK)


@pytest.mark.parametrize("num_tokens", [
    2,  # a decode step: each task its 16 columns of every row
    21,  # a prefill: [8, 32] blocks spread over the three tasks (6 of them, the last rows and columns partial)
])
def test_combine_sums_each_tokens_choices_onto_its_residual_in_either_shape(num_tokens):
    hidden, top_k = 48, 3
    gen = torch.Generator().manual_seed(num_tokens)
    y = torch.randn(num_tokens * top_k, hidden, generator=gen)
    weights = torch.rand(num_tokens, top_k, generator=gen)
    residual = torch.randn(num_tokens, hidden, generator=gen)
    act = torch.cat([y.flatten(), weights.flatten(), residual.flatten(), torch.zeros(num_tokens * hidden)])
    y_off, weights_off = 0, y.numel()
    res_off, out_off = weights_off + weights.numel(), weights_off + weights.numel() + residual.numel()
    stats = torch.zeros(num_tokens)
    layout = dict(y_off=y_off, weights_off=weights_off, top_k=top_k, hidden=hidden, out_off=out_off,
                  res_off=res_off, out_stats_off=0)
    desc = torch.tensor([layout[name] for name in COMBINE_FIELDS], dtype=torch.int64)
    _combine_kernel[(triton.cdiv(hidden, 16),)](desc, act, stats, num_tokens, 16, 16, 8, 32, 4)
    expected = residual + (y.view(num_tokens, top_k, hidden) * weights[:, :, None]).sum(1)
    out = act[out_off:].view(num_tokens, hidden)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats, (expected * expected).sum(1), rtol=1e-4, atol=1e-4)


@triton.jit
def _stream_kernel(desc, W, ACT, F32, I32, parts, out_off, part_off, ticket_off, BN: tl.constexpr,
                   BK: tl.constexpr, GATED: tl.constexpr):
    for part in range(0, parts):  # one program: the parts one after another, as a grid of one runs them
        expert_stream(desc, part, parts, W, ACT, F32, I32, out_off, part_off, ticket_off, BN, BK, 2, GATED)


@pytest.mark.parametrize("gated", [True, False])  # gate/up with its norm folded in; down, a row an entry
@pytest.mark.parametrize("parts", [1, 2, 5, 13, "units"])  # "units": a part a unit, tiles shared by 3 parts
def test_streamed_experts_match_torch(gated, parts):
    """A one-token step whose token chose experts 4, 0 and 2 (listed in that order; each expert's one entry the
    choice's place, 0, 1, 2): each of the three experts' [n, k] weights times its input row, n = 40 in tiles of
    16 (the last one half full), k = 40 in chunks of 16 (the last one half full); gate/up's rows interleave gate
    and up and store silu(gate) * up, scaled first by the token's 1/rms."""
    E, top_k, n, k, BN, BK, eps = 6, 3, 40, 40, 16, 16, 1e-5
    chosen = [4, 0, 2]
    tiles, chunks = -(-n // BN), -(-k // BK)
    units = top_k * tiles * chunks
    parts = units if parts == "units" else parts
    gen = torch.Generator().manual_seed(parts * 2 + gated)
    w = torch.randn(E, n, k, generator=gen)
    rows = torch.randn(1 if gated else top_k, k, generator=gen)  # the token's hidden state, or each entry's h
    width = n // 2 if gated else n
    act = torch.cat([rows.flatten(), torch.zeros(top_k * width)])
    out_off, capacity = rows.numel(), 4
    # I32: each expert's list of entries (capacity words), then the active list; F32: the counts (int32: each
    # expert's entries, then the active experts), the token's sum of squares, the tickets, the parts' partials,
    # the whole tiles' results
    i32 = torch.full((E * capacity + E,), -1, dtype=torch.int32)
    counts = torch.zeros(E + 1, dtype=torch.int32)
    for choice, expert in enumerate(chosen):
        i32[expert * capacity] = choice
        i32[E * capacity + choice] = expert
        counts[expert] = 1
    counts[E] = top_k
    f32 = torch.zeros(2048)
    f32[:E + 1] = counts.view(torch.float32)
    f32[8] = (rows[0] * rows[0]).sum()
    ticket_off, part_off, stream_off = 16, 128, 1536  # partials: up to 39 parts x 2 x 16
    layout = dict(x_off=0, k=k, w_off=0, n=n, out_off=out_off, top_k=top_k, counts_off=0, entries_off=0,
                  active_off=E * capacity, num_experts=E, num_slots=top_k, num_tiles=tiles, gated=int(gated),
                  stats_off=8 if gated else -1, eps=float_word(eps), capacity=capacity, claims_off=-1)
    desc = torch.tensor([layout[name] for name in EXPERT_FIELDS], dtype=torch.int64)
    _stream_kernel[(1,)](desc, w.flatten().clone(), act, f32, i32, parts, stream_off, part_off, ticket_off, BN, BK,
                         gated)

    expected = []
    for choice, expert in enumerate(chosen):
        if gated:
            y = w[expert] @ (rows[0] * torch.rsqrt(rows[0].pow(2).mean() + eps))
            expected.append(F.silu(y[0::2]) * y[1::2])
        else:
            expected.append(w[expert] @ rows[choice])
    torch.testing.assert_close(act[out_off:].view(top_k, width), torch.stack(expected), rtol=1e-4, atol=1e-4)
    assert f32[ticket_off:ticket_off + parts].eq(0).all(), "every shared tile's ticket is zeroed again"
