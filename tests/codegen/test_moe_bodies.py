"""The MoE routing and grouping bodies (codegen/bodies/moe.py) alone under TRITON_INTERPRET=1, against the
IR's reference routing and a stable sort."""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from codegen.bodies.moe import ROUTE_FIELDS, group_pairs, route_task
from ir.ops import get_op

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU)")


@triton.jit
def _group_kernel(I32, num_tokens, top_k, num_experts, offsets_off, entries_off, active_off, num_active_off,
                  EP: tl.constexpr, CH: tl.constexpr):
    group_pairs(I32, 0, num_experts, top_k, offsets_off, entries_off, active_off, num_active_off, num_tokens, EP, CH)


@triton.jit
def _route_kernel(desc, ACT, F32, I32, num_tokens, BM: tl.constexpr, EP: tl.constexpr, TOPK: tl.constexpr,
                  CH: tl.constexpr, LOOP_ROWS: tl.constexpr):
    route_task(desc, tl.program_id(0), ACT, F32, I32, num_tokens, BM, EP, TOPK, CH, LOOP_ROWS)


@pytest.mark.parametrize("loop_rows", [0, 8])  # 8: tasks of up to 8 tokens route them one at a time
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("num_tokens, num_experts, top_k", [(1, 128, 8), (21, 6, 2), (5, 64, 6)])
def test_routing_matches_the_reference_and_the_last_task_groups(normalize, num_tokens, num_experts, top_k,
                                                                loop_rows):
    logits = torch.randn(num_tokens, num_experts, generator=torch.Generator().manual_seed(num_experts))
    pairs, block, num_tasks = num_tokens * top_k, 16, 3  # a third task has no tokens at either size
    act = torch.cat([logits.flatten(), torch.zeros(pairs)])
    regions = _regions(pairs, num_experts)
    i32 = torch.full((regions["num_active_off"] + 1,), -1, dtype=torch.int32)
    layout = dict(logits_off=0, num_experts=num_experts, top_k=top_k, normalize=int(normalize),
                  weights_off=logits.numel(), ids_off=0, **regions, ticket_off=0, num_tasks=num_tasks)
    desc = torch.tensor([layout[name] for name in ROUTE_FIELDS], dtype=torch.int64)
    _route_kernel[(num_tasks,)](desc, act, torch.zeros(1), i32, num_tokens, block,
                                triton.next_power_of_2(num_experts), 8, 32, loop_rows)
    weights, ids = get_op("moe_route").reference(logits, top_k=top_k, normalize=normalize)
    assert i32[:pairs].view(num_tokens, top_k).tolist() == ids.tolist()
    torch.testing.assert_close(act[logits.numel():].view(num_tokens, top_k), weights, rtol=1e-6, atol=1e-7)
    _check_grouping(i32, ids.flatten(), regions, num_experts)


def _regions(pairs: int, num_experts: int) -> dict[str, int]:
    """Where the grouping writes in the I32 words, after the `pairs` expert ids."""
    return dict(offsets_off=pairs, entries_off=pairs + num_experts + 1, active_off=2 * pairs + num_experts + 1,
                num_active_off=2 * pairs + 2 * num_experts + 1)


def _check_grouping(i32: torch.Tensor, ids: torch.Tensor, regions: dict[str, int], num_experts: int) -> None:
    counts = torch.bincount(ids.long(), minlength=num_experts)
    offsets = i32[regions["offsets_off"]:regions["offsets_off"] + num_experts + 1]
    assert offsets.tolist() == [0, *torch.cumsum(counts, 0).tolist()]
    entries = i32[regions["entries_off"]:regions["entries_off"] + len(ids)]
    assert entries.tolist() == torch.sort(ids, stable=True).indices.tolist()
    active = torch.nonzero(counts).flatten().tolist()
    assert int(i32[regions["num_active_off"]]) == len(active)
    assert i32[regions["active_off"]:regions["active_off"] + len(active)].tolist() == active


@pytest.mark.parametrize("num_tokens, top_k, num_experts, chunk", [
    (1, 8, 128, 32),  # a batch-1 decode step of Qwen3-30B-A3B
    (37, 3, 6, 16),  # pairs over several chunks, some experts unused
    (5, 2, 5, 4),
])
def test_grouping_is_a_stable_counting_sort(num_tokens, top_k, num_experts, chunk):
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]).flatten()
    ids = ids.clamp(max=num_experts - 2)  # leaves the last expert without pairs
    regions = _regions(num_tokens * top_k, num_experts)
    i32 = torch.full((regions["num_active_off"] + 1,), -7, dtype=torch.int32)
    i32[:len(ids)] = ids.to(torch.int32)
    _group_kernel[(1,)](i32, num_tokens, top_k, num_experts, *regions.values(), triton.next_power_of_2(num_experts),
                        chunk)
    _check_grouping(i32, ids, regions, num_experts)
