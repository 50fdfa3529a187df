"""The MoE bodies (codegen/bodies/moe.py) alone under TRITON_INTERPRET=1: the routing against the IR's reference
routing and the lists of pairs by expert that it appends to, the combine against its sums."""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from codegen.bodies.moe import COMBINE_FIELDS, ROUTE_FIELDS, combine_task, route_task
from ir.ops import get_op

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU)")


@triton.jit
def _route_kernel(desc, ACT, F32, I32, num_tokens, BM: tl.constexpr, EP: tl.constexpr, TOPK: tl.constexpr,
                  LOOP_ROWS: tl.constexpr):
    route_task(desc, tl.program_id(0), ACT, F32, I32, num_tokens, num_tokens, BM, EP, TOPK, LOOP_ROWS, False)


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
    combine_task(desc, tl.program_id(0), ACT, F32, num_tokens, num_tokens, BM, BN, WM, WN, TOPK, False)


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
