"""`blinkc compile`: model -> graph -> passes -> tasks -> Triton source -> cubin + manifest, cached.

The cache key holds everything that changes the code: the rendered source (which embeds the layout and
every compile option), the target and the Triton version. A cached compile only copies files.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from blinkc.env import cache_dir
from blinkc.weights import weight_specs
from codegen.check import check_schedule
from codegen.compile import Resources, compile_cubin, resource_usage, signature
from codegen.config import CompileConfig
from codegen.lower import Lowering, lower
from codegen.render import KERNEL_NAME, render_kernel, source_hash
from ir import DType, Graph
from ir.ops.attention import rope_inv_freq
from ir.passes.pipeline import LOWERING_PREP, PIPELINE, run_pipeline
from models.registry import ResolvedModel
from models.trace import trace_model
from runtime.artifact import FORMAT, VERSION, Artifact


@dataclass(frozen=True)
class WeightsSource:
    checkpoint_dir: Path | None = None  # None: random weights from `seed`, made where they are used
    seed: int = 0
    std: float = 0.02

    def to_dict(self) -> dict:
        if self.checkpoint_dir is not None:
            return {"kind": "checkpoint", "path": str(Path(self.checkpoint_dir).resolve())}
        return {"kind": "random", "seed": self.seed, "std": self.std}


@dataclass(frozen=True)
class CompileResult:
    path: Path
    resources: Resources | None
    seconds: float
    cached: bool
    num_tasks: int


def build_graph(model: ResolvedModel, config: CompileConfig, dtype: DType | None = None) -> Graph:
    cfg = dataclasses.replace(model.config, dtype=dtype) if dtype else model.config
    graph = trace_model(model.definition, cfg, page_size=config.page_size)
    return run_pipeline(graph, PIPELINE + LOWERING_PREP)


def compile_model(model: ResolvedModel, config: CompileConfig, out: Path, weights: WeightsSource, *,
                  arch: int = 90, dtype: DType | None = None, tokenizer_dir: Path | None = None,
                  progress: Callable[[str], None] = lambda _: None) -> CompileResult:
    start = time.perf_counter()
    graph = build_graph(model, config, dtype)
    progress(f"traced {model.definition.name}: {len(graph.nodes)} nodes after passes")
    lw = lower(graph, config)
    check_schedule(lw.tasks, lw.sample)
    source = render_kernel(lw, model.definition.name)
    progress(f"lowered to {len(lw.tasks.tasks)} tasks in {len(lw.tasks.event_names)} groups; schedule checked")
    model_dtype = (dtype or model.config.dtype).value
    key = hashlib.sha256(json.dumps([source, model_dtype, arch, triton.__version__, config.interpret]).encode()).hexdigest()[:24]
    entry = cache_dir() / "kernels" / key
    cached = (entry / "kernel.json").exists()
    if not cached:
        _compile_into(entry, source, model_dtype, arch, config, progress)
    kernel_meta = json.loads((entry / "kernel.json").read_text())
    resources = Resources(**kernel_meta["resources"]) if kernel_meta["resources"] else None
    artifact = Artifact(_manifest(model, config, lw, graph, weights, kernel_meta, tokenizer_dir, model_dtype, source),
                        _tables(lw), entry / "kernel.py", None)
    cubin = (entry / "kernel.cubin").read_bytes() if (entry / "kernel.cubin").exists() else None
    artifact.save(Path(out), cubin)
    return CompileResult(Path(out), resources, time.perf_counter() - start, cached, len(lw.tasks.tasks))


def _compile_into(entry: Path, source: str, model_dtype: str, arch: int, config: CompileConfig, progress) -> None:
    tmp = entry.with_name(entry.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "kernel.py").write_text(source)
    meta = {"triton_metadata": None, "resources": None}
    if not config.interpret:
        progress(f"compiling for sm_{arch} with Triton {triton.__version__} (ptxas)...")
        cubin, metadata = compile_cubin(tmp / "kernel.py", model_dtype, arch, config.num_warps)
        (tmp / "kernel.cubin").write_bytes(cubin)
        meta = {"triton_metadata": metadata, "resources": dataclasses.asdict(resource_usage(tmp / "kernel.cubin"))}
    (tmp / "kernel.json").write_text(json.dumps(meta, default=vars))
    shutil.rmtree(entry, ignore_errors=True)
    tmp.rename(entry)


def _manifest(model: ResolvedModel, config: CompileConfig, lw: Lowering, graph: Graph, weights: WeightsSource,
              kernel_meta: dict, tokenizer_dir: Path | None, model_dtype: str, source: str) -> dict:
    cfg = model.config
    specs = [[s.name, list(s.shape), model_dtype, [[k, list(i)] for k, i in s.sources]] for s in weight_specs(graph)]
    return {
        "format": FORMAT, "version": VERSION,
        "kernel": {"name": KERNEL_NAME, "cubin": kernel_meta["triton_metadata"] is not None,
                   "num_warps": config.num_warps, "signature": signature(model_dtype),
                   "source_sha256": source_hash(source),
                   "triton_version": triton.__version__, "triton_metadata": kernel_meta["triton_metadata"],
                   "resources": kernel_meta["resources"], "max_programs_per_sm": 2},
        "config": config.to_dict(),
        "model": {"name": model.definition.name, "architecture": cfg.architecture, "dtype": model_dtype,
                  "vocab_size": cfg.vocab_size, "num_layers": cfg.num_hidden_layers,
                  "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                  "eos_token_ids": list(cfg.eos_token_ids), "hf_config": model.hf_config,
                  "logits_region": f"v{graph.outputs['logits'].id}"},
        "weights": {"source": weights.to_dict(), "specs": specs},
        "tokenizer": str(Path(tokenizer_dir).resolve()) if tokenizer_dir else None,
        "layout": lw.layout.to_dict(),
        "events": lw.tasks.event_names,
    }


def _tables(lw: Lowering) -> dict[str, torch.Tensor]:
    tables = {"tasks": lw.tasks.task_table(), "descs": lw.tasks.desc_table()}
    for region, (rotary_dim, theta, scaling) in lw.rope_tables.items():
        tables[region] = rope_inv_freq(rotary_dim, theta, scaling)
    return tables
