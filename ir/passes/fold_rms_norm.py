"""Folding a full-row RMSNorm into the prologue of the projections that read it: `rms_norm_linear`.

Applies when every reader of the norm's output is a linear taking it as its input; the norm is then
computed where the projection loads its input row and never written out.
"""
from __future__ import annotations

from ir.graph import Graph
from ir.passes.rewriter import Rewriter


def fold_rms_norm(graph: Graph) -> Graph:
    users = graph.consumers()
    foldable = {
        node.output.id: node for node in graph.nodes
        if node.op == "rms_norm" and node.attrs["group"] == node.output.shape[1]
        and users[node.output.id]
        and all(u.op == "linear" and u.inputs[0].id == node.output.id for u in users[node.output.id])
        and node.output.id not in {v.id for v in graph.outputs.values()}
    }
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.op == "rms_norm" and node.output.id in foldable:
            continue  # the norm itself: folded into its readers
        norm = foldable.get(node.inputs[0].id) if node.op == "linear" else None
        if norm is None:
            rw.keep(node)
            continue
        x, norm_w = norm.inputs
        (out,) = rw.emit("rms_norm_linear", [x, norm_w, *node.inputs[1:]], eps=norm.attrs["eps"])
        rw.replace(node.output, out)
    return rw.finish()
