"""The reference executor: runs a graph op by op with the registry's torch implementations.

It is the oracle for every later test, so it does nothing clever: it walks the nodes in order, looks each
op up and calls its reference implementation. State inputs (the KV caches) are updated in place.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from ir.graph import Graph, Value
from ir.ops.registry import get_op


def execute(graph: Graph, params: Mapping[str, torch.Tensor], inputs: Mapping[str, torch.Tensor]
            ) -> dict[str, torch.Tensor]:
    """Runs one step. `params` by weight name, `inputs` by input name; returns the named outputs.

    Params are looked up when a node reads them, so `params` may be a mapping that makes each weight on
    demand (an fp32 copy of a bf16 weight, say) without holding them all at once.
    """
    env: dict[int, torch.Tensor] = {}
    for value in graph.inputs:
        env[value.id] = _checked(value, inputs.get(value.name), "input")
    is_param = {p.value.id for p in graph.params}

    def read(value: Value) -> torch.Tensor:
        return _checked(value, params.get(value.name), "param") if value.id in is_param else env[value.id]

    for node in graph.nodes:
        result = get_op(node.op).reference(*(read(v) for v in node.inputs), **node.attrs)
        results = result if isinstance(result, tuple) else (result,)
        for value, tensor in zip(node.outputs, results, strict=True):
            env[value.id] = tensor
    return {name: env[value.id] for name, value in graph.outputs.items()}


def _checked(value: Value, tensor: torch.Tensor | None, kind: str) -> torch.Tensor:
    if tensor is None:
        raise ValueError(f"missing {kind} {value.name!r}")
    if tensor.dtype != value.dtype.torch:
        raise ValueError(f"{kind} {value.name!r}: expected {value.dtype.value}, got {tensor.dtype}")
    if len(tensor.shape) != len(value.shape) or any(
        isinstance(d, int) and d != n for d, n in zip(value.shape, tensor.shape)
    ):
        raise ValueError(f"{kind} {value.name!r}: expected shape {value.type_str}, got {list(tensor.shape)}")
    return tensor
