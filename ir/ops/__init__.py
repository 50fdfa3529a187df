"""Ops: the registry, and the functions that model code calls to trace each op."""
from ir.ops.attention import kv_store, paged_attention, rope, rope_inv_freq
from ir.ops.dense import (add, cast, embedding, gather_rows, linear, mul, rms_norm, silu, silu_mul,
                          slice_cols)
from ir.ops import fused  # noqa: F401  (registers the fused ops)
from ir.ops.moe import moe_experts, moe_route
from ir.ops.registry import OpDef, get_op, register_op, registered_ops

__all__ = [
    "OpDef", "add", "cast", "embedding", "gather_rows", "get_op", "kv_store", "linear", "moe_experts",
    "moe_route", "mul", "paged_attention", "register_op", "registered_ops", "rms_norm", "rope",
    "rope_inv_freq", "silu", "silu_mul", "slice_cols",
]
