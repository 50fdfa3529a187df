"""Fused ops that the megakernel's tasks implement: the lowering-prep passes rewrite graphs into them.

`fused_linear`: an optional RMSNorm prologue on the input, the projection (+ bias), an optional SiLU-gating
of the result (`gated`: a [T, 2I] gate/up projection returns silu(gate) * up, [T, I]), an optional
residual add, and the output dtype (fp32 for logits).
`qkv_rope_store`: the fused QKV projection whose epilogue applies per-head q/k RMSNorm (Qwen3) and rotary,
appends k and v to the paged cache and returns the rotated q.
Inputs are positional, in the order the attributes announce them.
"""
from __future__ import annotations

import torch.nn.functional as F

from ir.dtypes import DType
from ir.ops.attention import _kv_store, _rope
from ir.ops.dense import rms_norm_reference
from ir.ops.registry import register_op, require

PROLOGUES = ("none", "rms_norm")


def fused_linear_inputs(attrs) -> list[str]:
    """Names of fused_linear's inputs, in order, for these attributes."""
    names = ["x", "w"]
    names += ["bias"] if attrs["has_bias"] else []
    names += ["norm_w"] if attrs["prologue"] == "rms_norm" else []
    names += ["residual"] if attrs["has_residual"] else []
    return names


def _fused_linear_type(inputs, attrs):
    require(attrs["prologue"] in PROLOGUES, f"fused_linear: unknown prologue {attrs['prologue']!r}")
    names = fused_linear_inputs(attrs)
    require(len(inputs) == len(names), f"fused_linear: expects inputs {names}")
    x, w = inputs[0], inputs[1]
    require(len(x.shape) == 2 and x.shape[1] == w.shape[1], f"fused_linear: x must be [T, {w.shape[1]}]")
    require(not attrs["gated"] or w.shape[0] % 2 == 0, "fused_linear: a gated projection needs an even width")
    out = ((x.shape[0], w.shape[0] // 2 if attrs["gated"] else w.shape[0]), DType(attrs["out_dtype"]))
    if attrs["has_residual"]:
        res = inputs[names.index("residual")]
        require(res.shape == out[0], "fused_linear: residual must match the output")
    return [out]


@register_op("fused_linear", (2, 3, 4, 5), _fused_linear_type)
def _fused_linear(*inputs, prologue: str, gated: bool, has_bias: bool, has_residual: bool, eps: float,
                  out_dtype: str):
    names = fused_linear_inputs(dict(prologue=prologue, has_bias=has_bias, has_residual=has_residual))
    named = dict(zip(names, inputs))
    x = named["x"]
    if prologue == "rms_norm":
        x = rms_norm_reference(x, named["norm_w"], eps=eps, group=x.shape[1])
    y = F.linear(x, named["w"], named.get("bias"))
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if has_residual:
        y = named["residual"] + y
    return y.to(DType(out_dtype).torch)


def qkv_rope_store_inputs(attrs) -> list[str]:
    names = ["x", "w"]
    names += ["bias"] if attrs["has_bias"] else []
    names += ["norm_w"] if attrs["has_norm"] else []
    names += ["q_norm_w", "k_norm_w"] if attrs["has_qk_norm"] else []
    return names + ["positions", "cache", "slots"]


def _qkv_type(inputs, attrs):
    names = qkv_rope_store_inputs(attrs)
    require(len(inputs) == len(names), f"qkv_rope_store: expects inputs {names}")
    x, w, cache = inputs[0], inputs[1], inputs[names.index("cache")]
    q_size, kv_size = attrs["q_size"], attrs["kv_size"]
    require(w.shape[0] == q_size + 2 * kv_size, "qkv_rope_store: weight rows must be q + 2 * kv")
    require(cache.shape[3] * cache.shape[4] == kv_size, "qkv_rope_store: cache heads mismatch")
    return [((x.shape[0], q_size), x.dtype), (cache.shape, cache.dtype)]


@register_op("qkv_rope_store", tuple(range(6, 11)), _qkv_type)
def _qkv_rope_store(*inputs, q_size: int, kv_size: int, head_dim: int, rotary_dim: int, theta: float,
                    scaling, eps: float, qk_eps: float, has_bias: bool, has_norm: bool, has_qk_norm: bool):
    names = qkv_rope_store_inputs(dict(has_bias=has_bias, has_norm=has_norm, has_qk_norm=has_qk_norm))
    named = dict(zip(names, inputs))
    x = named["x"]
    if has_norm:
        x = rms_norm_reference(x, named["norm_w"], eps=eps, group=x.shape[1])
    qkv = F.linear(x, named["w"], named.get("bias"))
    q, k, v = qkv[:, :q_size], qkv[:, q_size:q_size + kv_size], qkv[:, q_size + kv_size:]
    if has_qk_norm:
        q = rms_norm_reference(q.contiguous(), named["q_norm_w"], eps=qk_eps, group=head_dim)
        k = rms_norm_reference(k.contiguous(), named["k_norm_w"], eps=qk_eps, group=head_dim)
    rotary = dict(head_dim=head_dim, rotary_dim=rotary_dim, theta=theta, scaling=scaling)
    q = _rope(q.contiguous(), named["positions"], **rotary)
    k = _rope(k.contiguous(), named["positions"], **rotary)
    return q, _kv_store(named["cache"], k, v.contiguous(), named["slots"])
