"""Bytes a decode step reads: every weight once, except the embedding table (one row per sequence, unless
the LM head reads it whole) and stacked experts (only those the batch can route to), plus the KV cache."""
from __future__ import annotations

from ir.analysis import decode_bytes, num_parameters
from ir.passes.pipeline import LOWERING_PREP, run_pipeline
from models.registry import resolve_model
from models.trace import trace_model


def graph(preset: str):
    model = resolve_model(preset)
    return run_pipeline(trace_model(model.definition, model.config)), model.config


def test_llama3_8b_reads_its_weights_less_the_embedding_table_plus_the_cache():
    g, cfg = graph("llama3-8b")
    read = decode_bytes(g, batch=1, context=512)
    table = cfg.vocab_size * cfg.hidden_size * 2
    assert read.weights == g.num_param_bytes() - table + cfg.hidden_size * 2
    assert read.kv_cache == 2 * 512 * cfg.num_key_value_heads * cfg.head_dim * 2 * cfg.num_hidden_layers
    assert num_parameters(g) == 8_030_261_248


def test_moe_reads_only_the_experts_a_batch_can_route_to():
    g, cfg = graph("qwen3-30b-a3b")
    expert_bytes = 3 * cfg.moe_intermediate_size * cfg.hidden_size * 2 * cfg.num_hidden_layers  # per expert
    one, two = decode_bytes(g, batch=1, context=1), decode_bytes(g, batch=2, context=1)
    assert two.weights - one.weights == cfg.num_experts_per_tok * expert_bytes + cfg.hidden_size * 2
    everything = decode_bytes(g, batch=64, context=1)  # 64 * 8 routes cover all 128 experts
    table = cfg.vocab_size * cfg.hidden_size * 2
    assert everything.weights == g.num_param_bytes() - table + 64 * cfg.hidden_size * 2
    lowered = run_pipeline(g, LOWERING_PREP)  # the experts take the residual add as a sixth input
    assert decode_bytes(lowered, batch=1, context=1) == one


def test_tied_embeddings_are_read_whole_by_the_lm_head():
    g, _ = graph("tiny-phi")
    assert decode_bytes(g, batch=1, context=8).weights == g.num_param_bytes()
