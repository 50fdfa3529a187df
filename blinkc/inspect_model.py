"""`blinkc inspect`: what a model is, what it weighs and what one decode step must read."""
from __future__ import annotations

from ir.analysis import decode_bytes, num_parameters
from ir.graph import Graph
from ir.passes.pipeline import run_pipeline
from ir.printer import format_graph, summarize
from models.registry import ResolvedModel
from models.trace import trace_model


def inspect_report(model: ResolvedModel, *, context: int, batch: int, bandwidth_tbs: float | None,
                   show_graph: bool) -> str:
    graph = run_pipeline(trace_model(model.definition, model.config))
    cfg = model.config
    lines = [
        f"model       {model.definition.name} ({cfg.architecture}), "
        + (f"checkpoint {model.checkpoint_dir}" if model.checkpoint_dir else "preset, no weights"),
        f"shape       {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, heads {cfg.num_attention_heads}"
        f"/{cfg.num_key_value_heads} kv x {cfg.head_dim}, vocab {cfg.vocab_size}, {cfg.dtype.value}"
        + (f", {cfg.num_experts} experts top-{cfg.num_experts_per_tok}" if cfg.num_experts else ""),
        f"parameters  {num_parameters(graph) / 1e9:.3f} B ({graph.num_param_bytes() / 1e9:.2f} GB)",
        f"graph       {len(graph.nodes)} nodes after passes:",
        summarize(graph),
    ]
    lines += _decode_lines(graph, context, batch, bandwidth_tbs)
    if show_graph:
        lines += ["", format_graph(graph)]
    return "\n".join(lines)


def _decode_lines(graph: Graph, context: int, batch: int, bandwidth_tbs: float | None) -> list[str]:
    read = decode_bytes(graph, batch=batch, context=context)
    lines = [f"decode      batch {batch}, context {context}: {read.total / 1e9:.2f} GB read per step "
             f"(weights {read.weights / 1e9:.2f} GB + KV cache {read.kv_cache / 1e9:.3f} GB)"]
    if bandwidth_tbs:
        ms = read.total / (bandwidth_tbs * 1e12) * 1e3
        lines.append(f"roofline    {ms:.2f} ms per step at {bandwidth_tbs:g} TB/s "
                     f"({batch * 1e3 / ms:.0f} tokens/s)")
    return lines
