"""Fusing sibling projections that read the same input into one wider projection.

`q_proj, k_proj, v_proj` -> `qkv_proj` and `gate_proj, up_proj` -> `gate_up_proj`: the fused weight's
rows are the members' rows in order (its checkpoint sources shifted accordingly), and each member's
result becomes a column slice of the fused result.
"""
from __future__ import annotations

from ir.graph import Graph, Node, Param, Source
from ir.passes.rewriter import Rewriter


def fuse_sibling_linears(graph: Graph, members: tuple[str, ...], fused: str) -> Graph:
    groups = _find_groups(graph, members)
    rw = Rewriter(graph)
    for node in graph.nodes:
        group = groups.get(node)
        if group is None:
            rw.keep(node)
        elif node is group[0]:
            _emit_fused(rw, graph, group, fused)
    return rw.finish()


def fuse_qkv(graph: Graph) -> Graph:
    return fuse_sibling_linears(graph, ("q_proj", "k_proj", "v_proj"), "qkv_proj")


def fuse_gate_up(graph: Graph) -> Graph:
    return fuse_sibling_linears(graph, ("gate_proj", "up_proj"), "gate_up_proj")


def _member_name(node: Node) -> tuple[str, str] | None:
    """(prefix, member) for a linear whose weight is a param named `{prefix}.{member}.weight`."""
    if node.op != "linear" or not node.inputs[1].name.endswith(".weight"):
        return None
    prefix, _, member = node.inputs[1].name[: -len(".weight")].rpartition(".")
    return prefix, member


def _find_groups(graph: Graph, members: tuple[str, ...]) -> dict[Node, list[Node]]:
    """Each member node -> its whole group (in `members` order) when every member reads the same input."""
    candidates: dict[tuple[int, str], dict[str, Node]] = {}
    for node in graph.nodes:
        named = _member_name(node)
        if named and named[1] in members:
            candidates.setdefault((node.inputs[0].id, named[0]), {})[named[1]] = node
    groups = {}
    for found in candidates.values():
        if set(found) == set(members) and len({len(n.inputs) for n in found.values()}) == 1:
            group = [found[m] for m in members]
            groups.update({n: group for n in group})
    return groups


def _emit_fused(rw: Rewriter, graph: Graph, group: list[Node], fused: str) -> None:
    prefix = group[0].inputs[1].name[: -len(".weight")].rpartition(".")[0]
    operands = [_concat_param(rw, graph, [n.inputs[i] for n in group], f"{prefix}.{fused}.{kind}")
                for i, kind in ((1, "weight"), (2, "bias")) if i < len(group[0].inputs)]
    (out,) = rw.emit("linear", [group[0].inputs[0], *operands])
    start = 0
    for node in group:
        width = node.output.shape[1]
        rw.replace(node.output, rw.emit("slice_cols", [out], start=start, stop=start + width)[0])
        start += width


def _concat_param(rw: Rewriter, graph: Graph, values, name: str):
    parts = [graph.param(v.name) for v in values]
    rows, sources = 0, []
    for part in parts:
        sources += [_shifted(s, rows, part.shape[0]) for s in part.sources]
        rows += part.shape[0]
    value = rw.new_value((rows, *parts[0].shape[1:]), parts[0].value.dtype, name)
    return rw.add_param(Param(value, tuple(sources)))


def _shifted(source: Source, rows: int, part_rows: int) -> Source:
    """The same checkpoint tensor, `rows` further down the leading dimension."""
    if not source.index:
        return Source(source.key, ((rows, rows + part_rows),))
    first, rest = source.index[0], source.index[1:]
    moved = first + rows if isinstance(first, int) else (first[0] + rows, first[1] + rows)
    return Source(source.key, (moved, *rest))
