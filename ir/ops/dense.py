"""Dense ops: embedding, projections, RMSNorm, activations, residual adds, row and column selection."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ir.dtypes import DType
from ir.ops.registry import register_op, require

if TYPE_CHECKING:
    from ir.tracer import Tensor


def _embedding_type(inputs, attrs):
    ids, weight = inputs
    require(ids.dtype in (DType.i32, DType.i64) and len(ids.shape) == 1, "embedding: ids must be int[T]")
    require(len(weight.shape) == 2, "embedding: weight must be [vocab, hidden]")
    return [((ids.shape[0], weight.shape[1]), weight.dtype)]


@register_op("embedding", 2, _embedding_type)
def _embedding(ids, weight):
    return weight[ids.long()]


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    """x: [T, H] = weight[ids]"""
    return ids.tracer.emit("embedding", [ids, weight])[0]


def _linear_type(inputs, attrs):
    x, w, *bias = inputs
    require(len(x.shape) == 2 and len(w.shape) == 2, "linear: x must be [T, K] and w [M, K]")
    require(x.shape[1] == w.shape[1], f"linear: x has {x.shape[1]} features, weight expects {w.shape[1]}")
    require(not bias or bias[0].shape == (w.shape[0],), "linear: bias must be [M]")
    return [((x.shape[0], w.shape[0]), x.dtype)]


@register_op("linear", (2, 3), _linear_type)
def _linear(x, w, bias=None):
    return F.linear(x, w, bias)


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """[T, K] @ [M, K]^T (+ [M]) -> [T, M]"""
    return x.tracer.emit("linear", [x, w] + ([bias] if bias is not None else []))[0]


def _rms_norm_type(inputs, attrs):
    x, w = inputs
    group = attrs["group"]
    require(len(x.shape) == 2 and w.shape == (group,), "rms_norm: x must be [T, D] and weight [group]")
    require(isinstance(x.shape[1], int) and x.shape[1] % group == 0, "rms_norm: D must be a multiple of group")
    return [(x.shape, x.dtype)]


def rms_norm_reference(x, w, *, eps: float, group: int):
    # As HF: normalise in fp32, cast back to the input dtype, then scale by the weight.
    x32 = x.float().reshape(x.shape[0], -1, group)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (w * x32.to(x.dtype)).reshape(x.shape)


register_op("rms_norm", 2, _rms_norm_type)(rms_norm_reference)


def rms_norm(x: Tensor, w: Tensor, eps: float, group: int | None = None) -> Tensor:
    """RMSNorm over the last dim, or over each `group` columns (per-head q/k norm)."""
    return x.tracer.emit("rms_norm", [x, w], eps=float(eps), group=int(group or x.shape[1]))[0]


def _rms_norm_linear_type(inputs, attrs):
    x, norm_w, w, *bias = inputs
    _rms_norm_type([x, norm_w], {"group": x.shape[1]})
    return _linear_type([x, w, *bias], attrs)


@register_op("rms_norm_linear", (3, 4), _rms_norm_linear_type)
def _rms_norm_linear(x, norm_w, w, bias=None, *, eps: float):
    return F.linear(rms_norm_reference(x, norm_w, eps=eps, group=x.shape[1]), w, bias)


def _same_type(inputs, attrs):
    a, b = inputs
    require(a.shape == b.shape and a.dtype == b.dtype, f"elementwise: {a.type_str} vs {b.type_str}")
    return [(a.shape, a.dtype)]


@register_op("add", 2, _same_type)
def _add(a, b):
    return a + b


@register_op("mul", 2, _same_type)
def _mul(a, b):
    return a * b


def add(a: Tensor, b: Tensor) -> Tensor:
    return a.tracer.emit("add", [a, b])[0]


def mul(a: Tensor, b: Tensor) -> Tensor:
    return a.tracer.emit("mul", [a, b])[0]


@register_op("silu", 1, lambda inputs, attrs: [(inputs[0].shape, inputs[0].dtype)])
def _silu(x):
    return F.silu(x)


def silu(x: Tensor) -> Tensor:
    return x.tracer.emit("silu", [x])[0]


def _silu_mul_type(inputs, attrs):
    (x,) = inputs
    require(isinstance(x.shape[1], int) and x.shape[1] % 2 == 0, "silu_mul: x must be [T, 2I]")
    return [((x.shape[0], x.shape[1] // 2), x.dtype)]


@register_op("silu_mul", 1, _silu_mul_type)
def _silu_mul(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(x: Tensor) -> Tensor:
    """[T, 2I] -> silu(x[:, :I]) * x[:, I:]"""
    return x.tracer.emit("silu_mul", [x])[0]


def _slice_cols_type(inputs, attrs):
    (x,) = inputs
    start, stop = attrs["start"], attrs["stop"]
    require(len(x.shape) == 2 and 0 <= start < stop <= x.shape[1], f"slice_cols: bad range {start}:{stop}")
    return [((x.shape[0], stop - start), x.dtype)]


@register_op("slice_cols", 1, _slice_cols_type)
def _slice_cols(x, *, start: int, stop: int):
    return x[:, start:stop].contiguous()


def slice_cols(x: Tensor, start: int, stop: int) -> Tensor:
    return x.tracer.emit("slice_cols", [x], start=int(start), stop=int(stop))[0]


def _gather_rows_type(inputs, attrs):
    x, rows = inputs
    require(rows.dtype in (DType.i32, DType.i64) and len(rows.shape) == 1, "gather_rows: rows must be int[L]")
    return [((rows.shape[0], x.shape[1]), x.dtype)]


@register_op("gather_rows", 2, _gather_rows_type)
def _gather_rows(x, rows):
    return x[rows.long()]


def gather_rows(x: Tensor, rows: Tensor) -> Tensor:
    """[T, H], int[L] -> [L, H]"""
    return x.tracer.emit("gather_rows", [x, rows])[0]


@register_op("cast", 1, lambda inputs, attrs: [(inputs[0].shape, DType(attrs["dtype"]))])
def _cast(x, *, dtype: str):
    return x.to(DType(dtype).torch)


def cast(x: Tensor, dtype: DType) -> Tensor:
    return x.tracer.emit("cast", [x], dtype=dtype.value)[0]
