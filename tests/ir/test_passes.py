"""Every pass keeps the graph's results: the reference executor runs the graph before and after it on
random weights and a random mixed step (prefill, continued chunk, decode over a random cache)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from blinkc.weights import random_weights
from ir import DType, Tracer, ops
from ir.executor import execute
from ir.graph import Graph
from ir.passes.dead_code import eliminate_dead_code
from ir.passes.fold_rms_norm import fold_rms_norm
from ir.passes.fuse_projections import fuse_gate_up, fuse_qkv
from ir.passes.fuse_silu_mul import fuse_silu_mul
from ir.passes.pipeline import LOWERING_PREP, PIPELINE, run_pipeline
from models.presets import TINY_PRESETS
from models.registry import resolve_model
from models.trace import trace_model
from runtime.step import SeqChunk, build_step
from tests.conftest import assert_close

PAGE_SIZE = 4


def traced(preset: str) -> Graph:
    model = resolve_model(preset)
    return trace_model(model.definition, dataclasses.replace(model.config, dtype=DType.f32), page_size=PAGE_SIZE)


def random_step(graph: Graph, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    vocab = graph.param("model.embed_tokens.weight").shape[0]
    chunks = [SeqChunk(torch.randint(vocab, (6,), generator=g).tolist(), 0, [3, 7], True),
              SeqChunk(torch.randint(vocab, (3,), generator=g).tolist(), 5, [1, 4], True),
              SeqChunk([int(torch.randint(vocab, (1,), generator=g))], 12, [0, 2, 5, 6])]
    caches = {v.name: torch.randn((2, 8, *v.shape[2:]), generator=g)
              for v in graph.inputs if v.name.startswith("kv_cache.")}
    return {**build_step(chunks, PAGE_SIZE), **caches}


def run(graph: Graph, step: dict[str, torch.Tensor]) -> torch.Tensor:
    fresh = {k: v.clone() for k, v in step.items()}  # kv_store writes the caches in place
    return execute(graph, random_weights(graph, seed=7, std=0.1), fresh)["logits"]


@pytest.mark.parametrize("preset", TINY_PRESETS)
@pytest.mark.parametrize("graph_pass", PIPELINE, ids=lambda p: p.__name__)
def test_pass_keeps_results(preset, graph_pass):
    before = traced(preset)
    after = graph_pass(before)
    step = random_step(before, seed=3)
    assert_close(run(after, step), run(before, step))


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_pipeline_keeps_results_and_fuses(preset):
    before = traced(preset)
    after = run_pipeline(before)
    step = random_step(before, seed=4)
    assert_close(run(after, step), run(before, step))
    ops = [n.op for n in after.nodes]
    users = after.consumers()
    for node in after.nodes:  # a full-row norm is left only where something else than a projection reads it
        if node.op == "rms_norm" and node.attrs["group"] == node.output.shape[1]:
            assert any(u.op != "linear" for u in users[node.output.id])
    assert "silu" not in ops and "mul" not in ops
    assert not any(p.name.endswith(("q_proj.weight", "gate_proj.weight")) for p in after.params)


def test_fuse_qkv_concatenates_rows_in_order_with_shifted_sources():
    graph = fuse_qkv(traced("tiny-llama"))
    fused = graph.param("model.layers.0.self_attn.qkv_proj.weight")
    assert fused.shape == (96 + 32 + 32, 96)
    assert [(s.key.split(".")[-2], s.index) for s in fused.sources] == [
        ("q_proj", ((0, 96),)), ("k_proj", ((96, 128),)), ("v_proj", ((128, 160),))]
    assert sum(n.op == "slice_cols" for n in graph.nodes) == 3 * 3


def test_fusions_leave_already_fused_phi_projections_alone():
    graph = traced("tiny-phi")
    assert fuse_gate_up(fuse_qkv(graph)).params == graph.params


def test_fold_rms_norm_folds_the_moe_norm_into_router_and_experts():
    graph = run_pipeline(traced("tiny-qwen3-moe"))
    assert not [n for n in graph.nodes if n.op == "rms_norm" and "layernorm" in n.inputs[1].name]
    folded = [n for n in graph.nodes if n.op == "rms_norm_linear"]
    # input norms of 3 layers, the two MoE layers' routers, the dense layer's MLP norm, the final norm
    assert len(folded) == 3 + 2 + 1 + 1
    experts = [n for n in graph.nodes if n.op == "moe_experts"]
    assert [n.attrs["prologue"] for n in experts] == ["rms_norm", "rms_norm"]
    assert [n.inputs[5].name for n in experts] == [f"model.layers.{i}.post_attention_layernorm.weight"
                                                   for i in (0, 2)]


def test_fold_rms_norm_skips_a_norm_read_by_something_else_than_an_input_row():
    tr = Tracer()
    x = tr.input("x", ("T", 8), DType.f32)
    h = ops.rms_norm(x, tr.param("n", (8,), DType.f32), 1e-6)
    graph = tr.finish({"y": ops.add(ops.linear(h, tr.param("w", (8, 8), DType.f32)), h)})
    assert [n.op for n in fold_rms_norm(graph).nodes] == ["rms_norm", "linear", "add"]


def test_dead_code_elimination_drops_unread_nodes_only():
    graph = traced("tiny-llama")
    assert len(eliminate_dead_code(graph).nodes) == len(graph.nodes)
    fused = fuse_silu_mul(fuse_gate_up(graph))
    assert any(n.op == "silu" for n in fused.nodes)
    assert not any(n.op == "silu" for n in eliminate_dead_code(fused).nodes)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_lowering_prep_keeps_results_and_fuses_into_task_ops(preset):
    before = run_pipeline(traced(preset))
    after = run_pipeline(before, LOWERING_PREP)
    step = random_step(before, seed=5)
    assert_close(run(after, step), run(before, step))
    ops = {n.op for n in after.nodes}
    assert {"qkv_rope_store", "fused_linear"} <= ops
    assert not ops & {"linear", "rms_norm_linear", "rope", "kv_store", "slice_cols", "silu_mul", "cast"}
    lm_head = [n for n in after.nodes if n.op == "fused_linear"][-1]
    assert lm_head.attrs["out_dtype"] == "f32" and lm_head.attrs["prologue"] == "rms_norm"


def test_moe_residual_add_goes_into_the_experts():
    before = run_pipeline(traced("tiny-qwen3-moe"))
    after = run_pipeline(before, LOWERING_PREP)
    experts = [n for n in after.nodes if n.op == "moe_experts"]
    assert len(experts) == 2 and all(n.attrs["has_residual"] for n in experts)  # the two MoE layers
    producers = {v.id: n for n in after.nodes for v in n.outputs}
    assert not any(n.op == "add" and producers.get(v.id, n).op == "moe_experts" for n in after.nodes for v in n.inputs)
    step = random_step(before, seed=7)
    assert_close(run(after, step), run(before, step))
