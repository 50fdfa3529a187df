"""Static analysis of a graph: parameter counts and the bytes one decode step must read.

At decode every weight is read once per step except the embedding table (one row per sequence) and
stacked experts (only the experts the batch routes to: at most batch * top_k of them). The KV cache adds
each sequence's context for every attention. This is the numerator of the roofline.
"""
from __future__ import annotations

from dataclasses import dataclass

from ir.graph import Graph


@dataclass(frozen=True)
class DecodeBytes:
    weights: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache


def num_parameters(graph: Graph) -> int:
    return sum(p.num_elements for p in graph.params)


def decode_bytes(graph: Graph, batch: int, context: int) -> DecodeBytes:
    """Bytes read by one decode step of `batch` sequences that each hold `context` tokens."""
    read = {p.name: p.num_bytes for p in graph.params}
    kv = 0
    for node in graph.nodes:
        if node.op == "embedding":
            table = node.inputs[1]
            if not _is_read_whole_elsewhere(graph, table.id, node):
                read[table.name] = min(batch, table.shape[0]) * table.shape[1] * table.dtype.itemsize
        elif node.op == "moe_experts":
            num_experts = node.inputs[3].shape[0]
            active = min(num_experts, batch * node.inputs[1].shape[1])
            for stacked in node.inputs[3:5]:  # gate_up and down (then a norm weight, a residual: `moe_experts_inputs`)
                read[stacked.name] = read[stacked.name] * active // num_experts
        elif node.op == "paged_attention":
            cache = node.inputs[1]
            kv += 2 * context * cache.shape[3] * cache.shape[4] * cache.dtype.itemsize * batch
    return DecodeBytes(sum(read.values()), kv)


def _is_read_whole_elsewhere(graph: Graph, value_id: int, node) -> bool:
    """True for tied embeddings: the LM head reads the whole table anyway."""
    return any(other is not node and value_id in {v.id for v in other.inputs} for other in graph.nodes)
