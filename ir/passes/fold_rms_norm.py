"""Folding a full-row RMSNorm into the prologue of the ops that read it: a linear becomes
`rms_norm_linear`, an MoE's experts `moe_experts` with the "rms_norm" prologue.

Applies when every reader of the norm's output takes it as its input (x); the norm is then computed where
the reader loads its input row and never written out. (An MoE layer's norm has two readers, the router and
the experts: folded into both, it is not a task group of its own.)
"""
from __future__ import annotations

from ir.graph import Graph, Node
from ir.passes.rewriter import Rewriter


def _reads_as_input(node: Node, value_id: int) -> bool:
    """Whether `node` reads the value as its input row alone, in a form that can take the norm as a prologue."""
    if node.inputs[0].id != value_id or any(v.id == value_id for v in node.inputs[1:]):
        return False
    return node.op == "linear" or (node.op == "moe_experts" and node.attrs["prologue"] == "none")


def fold_rms_norm(graph: Graph) -> Graph:
    users = graph.consumers()
    foldable = {
        node.output.id: node for node in graph.nodes
        if node.op == "rms_norm" and node.attrs["group"] == node.output.shape[1]
        and users[node.output.id]
        and all(_reads_as_input(u, node.output.id) for u in users[node.output.id])
        and node.output.id not in {v.id for v in graph.outputs.values()}
    }
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.op == "rms_norm" and node.output.id in foldable:
            continue  # the norm itself: folded into its readers
        norm = foldable.get(node.inputs[0].id) if node.op in ("linear", "moe_experts") else None
        if norm is None:
            rw.keep(node)
            continue
        x, norm_w = norm.inputs
        if node.op == "linear":
            (out,) = rw.emit("rms_norm_linear", [x, norm_w, *node.inputs[1:]], eps=norm.attrs["eps"])
        else:  # the norm's weight after the five inputs, before a residual (`moe_experts_inputs`)
            (out,) = rw.emit("moe_experts", [x, *node.inputs[1:5], norm_w, *node.inputs[5:]],
                             **{**node.attrs, "prologue": "rms_norm", "eps": norm.attrs["eps"]})
        rw.replace(node.output, out)
    return rw.finish()
