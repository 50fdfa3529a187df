"""The verifier: a graph is well formed before and after every pass.

Checks: every value is defined once before it is used, every op is registered and its recorded output
types are what its shape rule gives now, outputs are defined, and every param's checkpoint sources fit
inside it.
"""
from __future__ import annotations

from ir.graph import Graph, Param
from ir.ops.registry import get_op


class VerifyError(ValueError):
    pass


def verify(graph: Graph) -> Graph:
    """Raises VerifyError with the first problem found; returns the graph for chaining."""
    defined: set[int] = set()

    def define(value_id: int, what: str) -> None:
        if value_id in defined:
            raise VerifyError(f"value %{value_id} defined twice ({what})")
        defined.add(value_id)

    for value in graph.inputs:
        define(value.id, f"input {value.name}")
    for param in graph.params:
        define(param.value.id, f"param {param.name}")
        _verify_sources(param)
    for node in graph.nodes:
        for value in node.inputs:
            if value.id not in defined:
                raise VerifyError(f"{node.op} reads %{value.id} before it is defined")
        expected = get_op(node.op).infer(node.inputs, node.attrs)
        actual = [(v.shape, v.dtype) for v in node.outputs]
        if expected != actual:
            raise VerifyError(f"{node.op}: recorded types {actual} but the shape rule gives {expected}")
        for value in node.outputs:
            define(value.id, node.op)
    for name, value in graph.outputs.items():
        if value.id not in defined:
            raise VerifyError(f"output {name!r} is not defined")
    return graph


def _verify_sources(param: Param) -> None:
    if not param.sources:
        raise VerifyError(f"param {param.name} has no checkpoint source")
    for source in param.sources:
        if len(source.index) > len(param.shape):
            raise VerifyError(f"param {param.name}: source {source.key} indexes too many dims")
        for dim, index in zip(param.shape, source.index):
            lo, hi = (index, index + 1) if isinstance(index, int) else index
            if not 0 <= lo < hi <= dim:
                raise VerifyError(f"param {param.name}: source {source.key} index {index} outside [0, {dim})")
