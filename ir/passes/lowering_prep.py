"""Passes that rewrite an optimised graph into the fused ops the megakernel's tasks implement.

`fuse_qkv_rope_store`: QKV projection -> slices -> [per-head q/k norm] -> rope -> kv_store becomes one
`qkv_rope_store` (rotary and the cache append in the projection's epilogue).
`to_fused_linear`: every remaining projection becomes a `fused_linear`, absorbing the SiLU-gating, the
residual add and the cast to fp32 that follow it.
`fuse_moe_residual`: an MoE block's residual add goes into `moe_experts` (its combine's epilogue).
"""
from __future__ import annotations

from ir.graph import Graph, Node
from ir.passes.dead_code import eliminate_dead_code
from ir.passes.rewriter import Rewriter


def fuse_qkv_rope_store(graph: Graph) -> Graph:
    producer = {v.id: n for n in graph.nodes for v in n.outputs}
    users = graph.consumers()
    matches = [m for n in graph.nodes if n.op == "kv_store" and (m := _match_qkv(n, producer, users))]
    by_projection = {m["proj"]: m for m in matches}
    absorbed = {id(node) for m in matches for node in m.values()}
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node in by_projection:
            _emit_qkv(rw, by_projection[node])
        elif id(node) not in absorbed:
            rw.keep(node)
    return rw.finish()


def _match_qkv(store: Node, producer, users) -> dict[str, Node] | None:
    cache, k_val, v_val, slots = store.inputs
    m = {"store": store, "rope_k": producer.get(k_val.id), "slice_v": producer.get(v_val.id)}
    if m["rope_k"] is None or m["rope_k"].op != "rope" or m["slice_v"] is None or m["slice_v"].op != "slice_cols":
        return None
    m["slice_k"] = producer.get(m["rope_k"].inputs[0].id)
    if m["slice_k"] is not None and m["slice_k"].op == "rms_norm":
        m["norm_k"] = m["slice_k"]
        m["slice_k"] = producer.get(m["norm_k"].inputs[0].id)
    qkv = m["slice_v"].inputs[0]
    m["proj"] = producer.get(qkv.id)
    if m["slice_k"] is None or m["slice_k"].op != "slice_cols" or m["slice_k"].inputs[0].id != qkv.id:
        return None
    if m["proj"] is None or m["proj"].op not in ("linear", "rms_norm_linear"):
        return None
    slices = users[qkv.id]
    q_slices = [s for s in slices if s.op == "slice_cols" and s.attrs["start"] == 0]
    if len(slices) != 3 or len(q_slices) != 1:
        return None
    m["slice_q"] = q_slices[0]
    after_q = users[m["slice_q"].output.id]
    if len(after_q) == 1 and after_q[0].op == "rms_norm":
        m["norm_q"] = after_q[0]
        after_q = users[m["norm_q"].output.id]
    if len(after_q) != 1 or after_q[0].op != "rope" or ("norm_q" in m) != ("norm_k" in m):
        return None
    m["rope_q"] = after_q[0]
    return m


def _emit_qkv(rw: Rewriter, m: dict[str, Node]) -> None:
    proj, rope = m["proj"], m["rope_k"]
    if proj.op == "rms_norm_linear":
        x, norm_w, w, *bias = proj.inputs
    else:
        (x, w, *bias), norm_w = proj.inputs, None
    inputs = [x, w, *bias] + ([norm_w] if norm_w is not None else [])
    if "norm_q" in m:
        inputs += [m["norm_q"].inputs[1], m["norm_k"].inputs[1]]
    cache, _, _, slots = m["store"].inputs
    inputs += [rope.inputs[1], cache, slots]
    q, new_cache = rw.emit(
        "qkv_rope_store", inputs, q_size=m["slice_q"].output.shape[1], kv_size=m["slice_v"].output.shape[1],
        head_dim=rope.attrs["head_dim"], rotary_dim=rope.attrs["rotary_dim"], theta=rope.attrs["theta"],
        scaling=rope.attrs["scaling"], eps=proj.attrs.get("eps", 0.0),
        qk_eps=m["norm_q"].attrs["eps"] if "norm_q" in m else 0.0,
        has_bias=bool(bias), has_norm=norm_w is not None, has_qk_norm="norm_q" in m)
    rw.replace(m["rope_q"].output, q)
    rw.replace(m["store"].output, new_cache)


def to_fused_linear(graph: Graph) -> Graph:
    users = graph.consumers()
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.op not in ("linear", "rms_norm_linear"):
            rw.keep(node)
            continue
        _emit_fused_linear(rw, node, users)
    return eliminate_dead_code(rw.finish())


def _emit_fused_linear(rw: Rewriter, node: Node, users) -> None:
    attrs = dict(prologue="none", gated=False, has_bias=False, has_residual=False, eps=0.0,
                 out_dtype=node.output.dtype.value)
    if node.op == "rms_norm_linear":
        x, norm_w, w, *bias = node.inputs
        attrs.update(prologue="rms_norm", eps=node.attrs["eps"])
    else:
        (x, w, *bias), norm_w = node.inputs, None
    attrs["has_bias"] = bool(bias)
    result, residual = node.output, None
    after = users[result.id]
    if len(after) == 1 and after[0].op == "silu_mul":
        attrs["gated"] = True
        result = after[0].output
        after = users[result.id]
    if len(after) == 1 and after[0].op == "add":
        add = after[0]
        residual = add.inputs[0] if add.inputs[1].id == result.id else add.inputs[1]
        attrs["has_residual"] = True
        result = add.output
        after = users[result.id]
    if len(after) == 1 and after[0].op == "cast":
        attrs["out_dtype"] = after[0].attrs["dtype"]
        result = after[0].output
    inputs = [x, w, *bias] + ([norm_w] if norm_w is not None else []) + ([residual] if residual is not None else [])
    rw.replace(result, rw.emit("fused_linear", inputs, **attrs)[0])


def fuse_moe_residual(graph: Graph) -> Graph:
    """`add(residual, moe_experts(...))`, the experts' output read by nothing else, becomes
    `moe_experts(..., residual)`."""
    users = graph.consumers()
    producer_index = {v.id: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    graph_outputs = {v.id for v in graph.outputs.values()}
    rw = Rewriter(graph)
    absorbed = set()
    for index, node in enumerate(graph.nodes):
        if id(node) in absorbed:
            continue
        is_candidate = (node.op == "moe_experts" and not node.attrs["has_residual"]
                        and node.output.id not in graph_outputs)
        after = users[node.output.id] if is_candidate else []
        if len(after) == 1 and after[0].op == "add":
            add = after[0]
            residual = add.inputs[0] if add.inputs[1].id == node.output.id else add.inputs[1]
            if producer_index.get(residual.id, -1) < index:  # the residual exists when the experts run
                rw.replace(add.output, rw.emit("moe_experts", [*node.inputs, residual],
                                               **{**node.attrs, "has_residual": True})[0])
                absorbed.add(id(add))
                continue
        rw.keep(node)
    return rw.finish()
