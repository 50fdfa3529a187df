"""The pass pipelines, in order: PIPELINE (graph optimisations) and LOWERING_PREP (into the fused ops
the megakernel implements). Each pass is a pure `Graph -> Graph`; the graph is verified after each."""
from __future__ import annotations

from collections.abc import Callable

from ir.graph import Graph
from ir.passes.dead_code import eliminate_dead_code
from ir.passes.fold_rms_norm import fold_rms_norm
from ir.passes.fuse_projections import fuse_gate_up, fuse_qkv
from ir.passes.fuse_silu_mul import fuse_silu_mul
from ir.passes.lowering_prep import fuse_moe_residual, fuse_qkv_rope_store, to_fused_linear
from ir.verify import verify

Pass = Callable[[Graph], Graph]

PIPELINE: tuple[Pass, ...] = (
    fuse_qkv,
    fuse_gate_up,
    fuse_silu_mul,
    fold_rms_norm,
    eliminate_dead_code,
)


LOWERING_PREP: tuple[Pass, ...] = (
    fuse_qkv_rope_store,
    to_fused_linear,
    fuse_moe_residual,
    eliminate_dead_code,
)


def run_pipeline(graph: Graph, passes: tuple[Pass, ...] = PIPELINE) -> Graph:
    verify(graph)
    for run in passes:
        graph = verify(run(graph))
    return graph
