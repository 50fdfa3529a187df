"""The IR's data: typed values, nodes (one op applied to values), weights and the graph that holds them.

Shapes mix integers and symbolic dimensions (strings): `T` tokens in the step, `B` sequences, `L` rows
that need logits, `P` pages per sequence in the page table, `N` pages in the KV pool.
A graph is immutable; passes build new ones.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ir.dtypes import DType

Dim = int | str
Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class Value:
    """One SSA value. `name` is the weight's name for params and the input's name for inputs."""

    id: int
    shape: Shape
    dtype: DType
    name: str = ""

    @property
    def type_str(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class Source:
    """One checkpoint tensor and the part of a param it fills.

    `index` addresses the param's leading dimensions: an int picks one entry (stacked experts), a
    (start, stop) pair a slice (fused projections); `()` means the whole param.
    """

    key: str
    index: tuple[int | tuple[int, int], ...] = ()

    def region(self) -> tuple[int | slice, ...]:
        return tuple(i if isinstance(i, int) else slice(*i) for i in self.index)


@dataclass(frozen=True)
class Param:
    """A weight of the model: its IR value and where its bytes come from in an HF checkpoint."""

    value: Value
    sources: tuple[Source, ...]

    @property
    def name(self) -> str:
        return self.value.name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.value.shape)

    @property
    def num_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def num_bytes(self) -> int:
        return self.num_elements * self.value.dtype.itemsize


@dataclass(frozen=True, eq=False)
class Node:
    op: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def output(self) -> Value:
        (out,) = self.outputs
        return out


@dataclass(frozen=True, eq=False)
class Graph:
    """`inputs` are the step's tensors (token ids, page tables, KV caches); `outputs` are named."""

    inputs: tuple[Value, ...]
    params: tuple[Param, ...]
    nodes: tuple[Node, ...]
    outputs: Mapping[str, Value]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(name)

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        yield from (p.value for p in self.params)
        for node in self.nodes:
            yield from node.outputs

    def consumers(self) -> dict[int, list[Node]]:
        """Value id -> the nodes that read it, in program order."""
        users: dict[int, list[Node]] = {v.id: [] for v in self.values()}
        for node in self.nodes:
            for v in node.inputs:
                users[v.id].append(node)
        return users

    def num_param_bytes(self) -> int:
        return sum(p.num_bytes for p in self.params)
