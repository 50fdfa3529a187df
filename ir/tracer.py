"""Tracing: model code calls ops on `Tensor` proxies and the `Tracer` records the graph.

    tr = Tracer()
    ids = tr.input("input_ids", ("T",), DType.i32)
    w = tr.param("model.embed_tokens.weight", (vocab, hidden), DType.bf16)
    x = ops.embedding(ids, w)          # records a node, returns a Tensor
    graph = tr.finish({"hidden": x})
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ir.dtypes import DType
from ir.graph import Graph, Node, Param, Shape, Source, Value
from ir.ops.registry import get_op


@dataclass(frozen=True, eq=False)
class Tensor:
    """A traced value together with the tracer that owns it."""

    value: Value
    tracer: Tracer

    @property
    def shape(self) -> Shape:
        return self.value.shape

    @property
    def dtype(self) -> DType:
        return self.value.dtype


class Tracer:
    def __init__(self) -> None:
        self._next_id = 0
        self._inputs: list[Value] = []
        self._params: dict[str, Param] = {}
        self._nodes: list[Node] = []

    def _new_value(self, shape: Shape, dtype: DType, name: str = "") -> Value:
        value = Value(self._next_id, tuple(shape), dtype, name)
        self._next_id += 1
        return value

    def input(self, name: str, shape: Shape, dtype: DType) -> Tensor:
        if any(v.name == name for v in self._inputs):
            raise ValueError(f"input {name!r} declared twice")
        value = self._new_value(shape, dtype, name)
        self._inputs.append(value)
        return Tensor(value, self)

    def param(self, name: str, shape: Sequence[int], dtype: DType,
              sources: Sequence[Source] | None = None) -> Tensor:
        """Declares a weight; declaring the same name again (tied weights) returns the same value."""
        if name in self._params:
            existing = self._params[name]
            if existing.shape != tuple(shape) or existing.value.dtype != dtype:
                raise ValueError(f"param {name!r} redeclared as {dtype.value}{list(shape)}")
            return Tensor(existing.value, self)
        value = self._new_value(tuple(int(d) for d in shape), dtype, name)
        self._params[name] = Param(value, tuple(sources) if sources else (Source(name),))
        return Tensor(value, self)

    def emit(self, op: str, inputs: Sequence[Tensor], **attrs: Any) -> tuple[Tensor, ...]:
        """Records one node; its output types come from the op's shape rule."""
        for t in inputs:
            if t.tracer is not self:
                raise ValueError(f"{op}: input traced by another tracer")
        in_values = tuple(t.value for t in inputs)
        out_types = get_op(op).infer(in_values, attrs)
        outputs = tuple(self._new_value(shape, dtype) for shape, dtype in out_types)
        self._nodes.append(Node(op, in_values, outputs, dict(attrs)))
        return tuple(Tensor(v, self) for v in outputs)

    def finish(self, outputs: Mapping[str, Tensor], meta: Mapping[str, Any] | None = None) -> Graph:
        return Graph(
            inputs=tuple(self._inputs),
            params=tuple(self._params.values()),
            nodes=tuple(self._nodes),
            outputs={name: t.value for name, t in outputs.items()},
            meta=dict(meta or {}),
        )
