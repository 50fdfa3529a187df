"""Mixture-of-experts ops: routing (softmax, top-k, optional renormalisation) and the experts' MLPs."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ir.dtypes import DType
from ir.ops.dense import rms_norm_reference
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


def moe_experts_inputs(attrs) -> list[str]:
    """Names of moe_experts' inputs, in order, for these attributes."""
    names = ["x", "weights", "experts", "gate_up", "down"]
    names += ["norm_w"] if attrs.get("prologue", "none") == "rms_norm" else []
    names += ["residual"] if attrs.get("has_residual", False) else []
    return names


def _experts_type(inputs, attrs):
    names = moe_experts_inputs(attrs)
    require(attrs.get("prologue", "none") in ("none", "rms_norm"), "moe_experts: unknown prologue")
    require(len(inputs) == len(names), f"moe_experts: expects inputs {names}")
    named = dict(zip(names, inputs))
    x, weights, experts, gate_up, down = (named[k] for k in ("x", "weights", "experts", "gate_up", "down"))
    num_experts, two_i, hidden = gate_up.shape
    require(x.shape[1] == hidden and down.shape == (num_experts, hidden, two_i // 2),
            "moe_experts: gate_up must be [E, 2I, H] and down [E, H, I]")
    require(weights.shape == experts.shape and weights.shape[0] == x.shape[0], "moe_experts: routing must be [T, k]")
    require("norm_w" not in named or named["norm_w"].shape == (hidden,), "moe_experts: norm_w must be [H]")
    require("residual" not in named or (named["residual"].shape == x.shape and named["residual"].dtype == x.dtype),
            "moe_experts: the residual must have x's shape and dtype")
    return [(x.shape, x.dtype)]


@register_op("moe_experts", (5, 6, 7), _experts_type)
def _moe_experts(*inputs, prologue: str = "none", eps: float = 0.0, has_residual: bool = False):
    named = dict(zip(moe_experts_inputs(dict(prologue=prologue, has_residual=has_residual)), inputs))
    x, weights, experts, gate_up, down = (named[k] for k in ("x", "weights", "experts", "gate_up", "down"))
    if prologue == "rms_norm":
        x = rms_norm_reference(x, named["norm_w"], eps=eps, group=x.shape[1])
    out = torch.zeros_like(x)
    for e in experts.unique().tolist():
        token, slot = torch.where(experts == e)
        gate, up = F.linear(x[token], gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[e]) * weights[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    return named["residual"] + out if has_residual else out


def moe_experts(x: Tensor, weights: Tensor, experts: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """sum over k of weights[t, k] * down_e(silu(gate_e x) * up_e x) with e = experts[t, k]: [T, H]
    (the passes may fold an RMSNorm of x into the op, `prologue` "rms_norm" with its weight as an input, and
    add a residual to the sum, `has_residual`: `moe_experts_inputs`)"""
    return x.tracer.emit("moe_experts", [x, weights, experts, gate_up, down], prologue="none", eps=0.0,
                         has_residual=False)[0]
