"""`mul(silu(h[:, :I]), h[:, I:])` -> `silu_mul(h)`: the gated activation as one op on the fused gate/up."""
from __future__ import annotations

from ir.graph import Graph, Node, Value
from ir.passes.rewriter import Rewriter


def fuse_silu_mul(graph: Graph) -> Graph:
    producer = {v.id: node for node in graph.nodes for v in node.outputs}
    rw = Rewriter(graph)
    for node in graph.nodes:
        source = _gated_source(node, producer)
        if source is None:
            rw.keep(node)
        else:
            rw.replace(node.output, rw.emit("silu_mul", [source])[0])
    return rw.finish()


def _gated_source(node: Node, producer: dict[int, Node]) -> Value | None:
    """h when `node` is mul(silu(slice(h, 0, I)), slice(h, I, 2I)), else None."""
    if node.op != "mul":
        return None
    act, up = (producer.get(v.id) for v in node.inputs)
    if act is None or up is None or act.op != "silu":
        return None
    gate = producer.get(act.inputs[0].id)
    if gate is None or gate.op != "slice_cols" or up.op != "slice_cols":
        return None
    h = gate.inputs[0]
    half = h.shape[1] // 2
    same_source = up.inputs[0].id == h.id and h.shape[1] == 2 * half
    if same_source and (gate.attrs["start"], gate.attrs["stop"]) == (0, half) and \
            (up.attrs["start"], up.attrs["stop"]) == (half, 2 * half):
        return h
    return None
