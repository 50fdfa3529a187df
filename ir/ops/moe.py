"""Mixture-of-experts ops: routing (softmax, top-k, optional renormalisation) and the experts' MLPs."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ir.dtypes import DType
from ir.ops.registry import register_op, require

if TYPE_CHECKING:
    from ir.tracer import Tensor


def _route_type(inputs, attrs):
    (logits,) = inputs
    k = attrs["top_k"]
    require(len(logits.shape) == 2 and 0 < k <= logits.shape[1], "moe_route: logits must be [T, E], 0 < k <= E")
    return [((logits.shape[0], k), logits.dtype), ((logits.shape[0], k), DType.i32)]


@register_op("moe_route", 1, _route_type)
def _moe_route(logits, *, top_k: int, normalize: bool):
    probs = logits.softmax(-1, dtype=torch.float32)
    weights, experts = probs.topk(top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(logits.dtype), experts.to(torch.int32)


def moe_route(logits: Tensor, *, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """router logits [T, E] -> (weights [T, k], expert ids i32[T, k])"""
    weights, experts = logits.tracer.emit("moe_route", [logits], top_k=int(top_k), normalize=bool(normalize))
    return weights, experts


def _experts_type(inputs, attrs):
    x, weights, experts, gate_up, down, *residual = inputs
    num_experts, two_i, hidden = gate_up.shape
    require(x.shape[1] == hidden and down.shape == (num_experts, hidden, two_i // 2),
            "moe_experts: gate_up must be [E, 2I, H] and down [E, H, I]")
    require(weights.shape == experts.shape and weights.shape[0] == x.shape[0], "moe_experts: routing must be [T, k]")
    require(all(r.shape == x.shape and r.dtype == x.dtype for r in residual),
            "moe_experts: the residual must have x's shape and dtype")
    return [(x.shape, x.dtype)]


@register_op("moe_experts", (5, 6), _experts_type)
def _moe_experts(x, weights, experts, gate_up, down, residual=None):
    out = torch.zeros_like(x)
    for e in experts.unique().tolist():
        token, slot = torch.where(experts == e)
        gate, up = F.linear(x[token], gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[e]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return out if residual is None else residual + out


def moe_experts(x: Tensor, weights: Tensor, experts: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """sum over k of weights[t, k] * down_e(silu(gate_e x) * up_e x) with e = experts[t, k]: [T, H]
    (lowering preparation may give the op a sixth input, a residual added to that sum)"""
    return x.tracer.emit("moe_experts", [x, weights, experts, gate_up, down])[0]
