"""Projection bodies (codegen/bodies/linear.py) alone under TRITON_INTERPRET=1: the batch-1 GEMV's work streamed
over any number of parts (`gemv_stream`, its tiles shared between parts finished by the last to arrive, or whole
tiles a part) gives what a task a tile (`gemv_row`) gives, and both what torch gives; so do a batched step's
blocks."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import codegen.bodies.linear as linear
from codegen.bodies.linear import LINEAR_FIELDS, OUT_ALIGNED, OUT_F32, gemv_row, gemv_stream, split_block

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU)")

BN, BK = 16, 64


@triton.jit
def _stream_kernel(desc, W, ACT, F32, parts, out_off, part_off, ticket_off, BN: tl.constexpr, BK: tl.constexpr,
                   TM: tl.constexpr, WHOLE: tl.constexpr = 0):
    for part in range(0, parts):  # one program: the parts one after another, as a grid of one runs them
        gemv_stream(desc, part, parts, W, ACT, F32, out_off, part_off, ticket_off, BN, BK, TM, 2, WHOLE)


@triton.jit
def _row_kernel(desc, W, ACT, F32, BN: tl.constexpr, BK: tl.constexpr):
    gemv_row(desc, tl.program_id(0), W, ACT, F32, BN, BK, 2)


def _case(n: int, k: int, gated: bool, out_f32: bool):
    """Arenas and a descriptor for x [k] times w [n, k] (+ a residual and the output's sum of squares, unless
    the output is fp32 logits). Returns (desc, W, ACT, F32, the expected output, where it goes)."""
    gen = torch.Generator().manual_seed(n * 1000 + k)
    w, x = torch.randn(n, k, generator=gen), torch.randn(k, generator=gen)
    width = n // 2 if gated else n
    residual = torch.randn(width, generator=gen)
    y = w @ x
    if gated:  # rows interleaved gate, up: output j is silu(row 2j) * row 2j + 1
        y = F.silu(y[0::2]) * y[1::2]
    act = torch.cat([x, residual, torch.zeros(width)])
    res_off, out_off = k, k + width
    # F32: [0, 2048) the parts' partials, tickets at 2048, whole tiles' results at 2304, the sum of squares at 3000,
    # logits at 3072
    f32 = torch.zeros(4096)
    fields = dict(x_off=0, x_stride=k, k=k, w_off=0, n=n, out_off=3072 if out_f32 else out_off, out_stride=width,
                  out_kind=OUT_F32 if out_f32 else OUT_ALIGNED, gated=int(gated), stats_off=-1, eps=0.0,
                  res_off=-1 if out_f32 else res_off, res_stride=width, bias_off=-1,
                  out_stats_off=-1 if out_f32 else 3000, rows_kind=0, splits=1, part_off=-1, ticket_off=-1,
                  prefill_part_off=-1, prefill_ticket_off=-1, prefill_tasks=-(-n // BN), route_rel=0, route_ticket=-1)
    desc = torch.tensor([fields[name] for name in LINEAR_FIELDS], dtype=torch.int64)
    if not out_f32:
        y = y + residual
    out = (f32, 3072) if out_f32 else (act, out_off)
    return desc, w.flatten().clone(), act, f32, y, out


@pytest.mark.parametrize("gated, out_f32", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("n, k", [(72, 200), (64, 512)])  # a last tile of 8 rows and a last chunk of 8 columns
@pytest.mark.parametrize("parts", [1, 2, 3, 7, "units"])  # "units": a part a unit, tiles shared by 4 parts
@pytest.mark.parametrize("whole", [False, True])  # whole tiles a part where every part has one (parts 2 and 3)
def test_streamed_gemv_matches_a_task_a_tile(n, k, gated, out_f32, parts, whole):
    tiles, chunks = -(-n // BN), -(-k // BK)
    parts = tiles * chunks if parts == "units" else parts
    desc, w, act, f32, expected, (out, out_off) = _case(n, k, gated, out_f32)
    width = expected.numel()
    row_act, row_f32 = act.clone(), f32.clone()  # the tile-a-task GEMV, for its rounding
    _row_kernel[(tiles,)](desc, w, row_act, row_f32, BN, BK)
    row_out = (row_f32 if out_f32 else row_act)[out_off:out_off + width]

    # epilogues of 2 tiles; whole: a part may take up to 16 MB past an even share
    _stream_kernel[(1,)](desc, w, act, f32, parts, 2304, 0, 2048, BN, BK, 2, (16 << 20) if whole else 0)
    streamed = out[out_off:out_off + width]
    if whole and parts <= tiles:  # no part stored a partial of a tile it shared
        assert f32[:2048].eq(0).all()
    torch.testing.assert_close(streamed, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(streamed, row_out, rtol=1e-5, atol=1e-5)
    assert f32[2048:2048 + parts].eq(0).all(), "every shared tile's ticket is zeroed again"
    if not out_f32:  # the sum of squares of the stored row, for the norm that reads it
        torch.testing.assert_close(f32[3000], row_f32[3000], rtol=1e-5, atol=1e-4)


@triton.jit
def _batched_kernel(desc, W, ACT, F32, I32, num_tasks, num_rows, BM: tl.constexpr, BNB: tl.constexpr,
                    BNW: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    for tile in range(0, num_tasks):  # one program: the group's tasks one after another
        split_block(desc, tile, num_tasks, num_rows, W, ACT, F32, I32, BM, BNB, BNW, BK, True, 2, False, EVEN_K, EVEN_N)


@pytest.mark.parametrize("even_k, even_n", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("splits, slice_rows", [(1, 0), (4, 0), (4, 4)])  # blocks whole, or each block's K split
def test_batched_blocks_match_torch(splits, slice_rows, even_k, even_n, monkeypatch):  # over 4 tasks
    """A batched decode step's blocks (`split_block`): the K loop without a K mask (`EVEN_K`, every chunk whole)
    gives what the masked one gives, and both what torch gives; whole blocks of 128 columns over 200 outputs
    leave the last block 56 columns past the end. With `EVEN_N` too (256 outputs), the weights load unmasked.
    slice_rows: a split block's rows summed and finished in slices of that many (`split_slices`; one program
    here, so the last split takes every slice: 4 rows and then 1)."""
    monkeypatch.setattr(linear, "SPLIT_SLICE_ROWS", tl.constexpr(slice_rows))
    rows, n, k, bnb = 5, 128 if splits > 1 else 256 if even_n else 200, 256, 64
    gen = torch.Generator().manual_seed(splits)
    w, x = torch.randn(n, k, generator=gen) / k ** 0.5, torch.randn(rows, k, generator=gen)
    residual = torch.randn(rows, n, generator=gen)
    y = x @ w.T + residual
    res_off, out_off = rows * k, rows * k + rows * n
    act = torch.cat([x.flatten(), residual.flatten(), torch.full((rows * n,), float("nan"))])
    f32 = torch.zeros(64 + n // bnb * splits * 16 * bnb)  # the sum of squares at 0, tickets at 32, partials at 64
    fields = dict(x_off=0, x_stride=k, k=k, w_off=0, n=n, out_off=out_off, out_stride=n, out_kind=OUT_ALIGNED,
                  gated=0, stats_off=-1, eps=0.0, res_off=res_off, res_stride=n, bias_off=-1, out_stats_off=0,
                  rows_kind=0, splits=splits, part_off=64, ticket_off=32, prefill_part_off=-1, prefill_ticket_off=-1,
                  prefill_tasks=-(-n // BN), route_rel=0, route_ticket=-1)
    desc = torch.tensor([fields[name] for name in LINEAR_FIELDS], dtype=torch.int64)
    i32 = torch.zeros(16, dtype=torch.int32)  # the control words (a wait in `split_slices` reads the abort flag)
    _batched_kernel[(1,)](desc, w.flatten().clone(), act, f32, i32, n // BN, rows, 16, bnb, 2 * bnb, even_k, even_n)
    torch.testing.assert_close(act[out_off:].view(rows, n), y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(f32[:rows], (y * y).sum(1), rtol=1e-4, atol=1e-3)
    if splits > 1:  # every split of every block took its ticket (the planner zeroes them every step)
        assert f32[32:32 + n // bnb].eq(splits).all()
