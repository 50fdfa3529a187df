"""The readable text form of a graph, one line per value."""
from __future__ import annotations

from collections import Counter

from ir.graph import Graph, Node, Value


def format_graph(graph: Graph) -> str:
    lines = [f"graph {graph.meta.get('name', '')} ({len(graph.inputs)} inputs, {len(graph.params)} params, "
             f"{len(graph.nodes)} nodes)"]
    lines += [f"  %{v.id} = input {v.name} : {v.type_str}" for v in graph.inputs]
    lines += [f"  %{p.value.id} = param {p.name} : {p.value.type_str}" for p in graph.params]
    lines += [f"  {_format_node(n)}" for n in graph.nodes]
    lines += [f"  return {name} = %{v.id}" for name, v in graph.outputs.items()]
    return "\n".join(lines)


def _ref(value: Value) -> str:
    return f"@{value.name}" if value.name else f"%{value.id}"


def _format_node(node: Node) -> str:
    outs = ", ".join(f"%{v.id}" for v in node.outputs)
    args = ", ".join(_ref(v) for v in node.inputs)
    attrs = "".join(f", {k}={v}" for k, v in node.attrs.items())
    types = ", ".join(v.type_str for v in node.outputs)
    return f"{outs} = {node.op}({args}{attrs}) : {types}"


def summarize(graph: Graph) -> str:
    """One line per op kind with its count."""
    counts = Counter(node.op for node in graph.nodes)
    return "\n".join(f"  {op:<18} x{n}" for op, n in sorted(counts.items()))
