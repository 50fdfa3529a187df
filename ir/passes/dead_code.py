"""Dropping nodes whose results nothing reads (the caches' writes are read by attention, so they stay)."""
from __future__ import annotations

from ir.graph import Graph
from ir.passes.rewriter import Rewriter


def eliminate_dead_code(graph: Graph) -> Graph:
    live = {v.id for v in graph.outputs.values()}
    kept = []
    for node in reversed(graph.nodes):
        if any(v.id in live for v in node.outputs):
            kept.append(node)
            live.update(v.id for v in node.inputs)
    rw = Rewriter(graph)
    for node in reversed(kept):
        rw.keep(node)
    return rw.finish()
