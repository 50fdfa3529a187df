"""Tracing a model definition into a verified IR graph of one scheduler step."""
from __future__ import annotations

from ir import Graph, Tracer
from ir.verify import verify
from models.blocks import declare_step
from models.config import ModelConfig
from models.definition import ModelDefinition


def trace_model(definition: ModelDefinition, cfg: ModelConfig, page_size: int = 16) -> Graph:
    """The graph takes the step inputs and one KV cache per layer (`kv_cache.{i}`), returns `logits`."""
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    tr = Tracer()
    step = declare_step(tr)
    cache_shape = (2, "N", page_size, cfg.num_key_value_heads, cfg.head_dim)
    caches = [tr.input(f"kv_cache.{i}", cache_shape, cfg.dtype) for i in range(cfg.num_hidden_layers)]
    logits = definition.forward(tr, cfg, step, caches)
    meta = {"name": definition.name, "page_size": page_size, "num_layers": cfg.num_hidden_layers}
    return verify(tr.finish({"logits": logits}, meta))
