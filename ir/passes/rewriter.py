"""A helper for passes: copies a graph node by node while nodes are replaced, added or dropped."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ir.graph import Graph, Node, Param, Value
from ir.ops.registry import get_op


class Rewriter:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._next_id = max(v.id for v in graph.values()) + 1
        self._remap: dict[int, Value] = {}
        self._nodes: list[Node] = []
        self._params: dict[str, Param] = {p.name: p for p in graph.params}

    def value(self, value: Value) -> Value:
        return self._remap.get(value.id, value)

    def replace(self, old: Value, new: Value) -> None:
        """Later readers of `old` read `new` instead."""
        self._remap[old.id] = new

    def keep(self, node: Node) -> None:
        inputs = tuple(self.value(v) for v in node.inputs)
        self._nodes.append(node if inputs == node.inputs else Node(node.op, inputs, node.outputs, node.attrs))

    def emit(self, op: str, inputs: Sequence[Value], **attrs: Any) -> tuple[Value, ...]:
        inputs = tuple(self.value(v) for v in inputs)
        outputs = tuple(self.new_value(shape, dtype) for shape, dtype in get_op(op).infer(inputs, attrs))
        self._nodes.append(Node(op, inputs, outputs, attrs))
        return outputs

    def new_value(self, shape, dtype, name: str = "") -> Value:
        value = Value(self._next_id, tuple(shape), dtype, name)
        self._next_id += 1
        return value

    def add_param(self, param: Param) -> Value:
        if param.name in self._params:
            raise ValueError(f"param {param.name!r} already exists")
        self._params[param.name] = param
        return param.value

    def finish(self, meta: Mapping[str, Any] | None = None) -> Graph:
        """The new graph; params that no node reads any more are dropped."""
        used = {v.id for node in self._nodes for v in node.inputs}
        params = tuple(p for p in self._params.values() if p.value.id in used)
        outputs = {name: self.value(v) for name, v in self.graph.outputs.items()}
        return Graph(self.graph.inputs, params, tuple(self._nodes), outputs, dict(meta or self.graph.meta))
