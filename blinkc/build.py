"""The build behind a compile the cache does not answer: model -> graph -> passes -> tasks -> Triton source ->
cubin (ptxas) + manifest + task tables, written into the cache entry that `blinkc.compile_model` names.

Everything heavy lives here (torch, the tracer and the ops' reference code, Triton, jinja2): a cache hit
imports none of it.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from blinkc.env import cache_dir
from blinkc.weights import weight_specs
from codegen.check import check_schedule
from codegen.compile import compile_cubin, resource_usage
from codegen.config import CompileConfig
from codegen.kernel_abi import KERNEL_NAME, signature, source_hash
from codegen.lower import Lowering, lower
from codegen.render import render_kernel
from ir import DType, Graph
from ir.ops.attention import rope_inv_freq
from ir.passes.pipeline import LOWERING_PREP, PIPELINE, run_pipeline
from models.trace import trace_model
from runtime.artifact import FORMAT, VERSION, Artifact

if TYPE_CHECKING:
    from models.registry import ResolvedModel


def build_graph(model: ResolvedModel, config: CompileConfig, dtype: DType | None = None) -> Graph:
    cfg = dataclasses.replace(model.config, dtype=dtype) if dtype else model.config
    graph = trace_model(model.definition, cfg, page_size=config.page_size)
    return run_pipeline(graph, PIPELINE + LOWERING_PREP)


def build_into(entry: Path, model: ResolvedModel, config: CompileConfig, dtype: DType | None, model_dtype: str,
               arch: int, progress: Callable[[str], None]) -> None:
    """Builds the artifact into the cache entry `entry` (a folder, made whole or not at all: several processes
    may build the same key at once)."""
    graph = build_graph(model, config, dtype)
    progress(f"traced {model.definition.name}: {len(graph.nodes)} nodes after passes")
    lw = lower(graph, config)
    check_schedule(lw.tasks, lw.sample)
    source = render_kernel(lw, model.definition.name)
    progress(f"lowered to {len(lw.tasks.tasks)} tasks in {len(lw.tasks.event_names)} groups; schedule checked")
    entry.parent.mkdir(parents=True, exist_ok=True)  # a build of its own: others of the same key may run beside
    tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".", suffix=".tmp", dir=entry.parent))
    try:
        (tmp / "model.cubin.py").write_text(source)
        kernel_meta, cubin = {"triton_metadata": None, "resources": None}, None
        beside = _compile_beside(tmp / "model.cubin.py", lw, config, model_dtype, arch)
        if not config.interpret:
            cubins = cache_dir() / "cubins" / entry.name  # the artifact's key
            if (cubins / "metadata.json").exists():
                progress(f"the sm_{arch} cubin from the cache ({cubins})")
                cubin, triton_metadata = (cubins / "model.cubin").read_bytes(), json.loads(
                    (cubins / "metadata.json").read_text())
            else:
                progress(f"compiling for sm_{arch} with Triton {version('triton')}...")
                cubin, metadata = compile_cubin(tmp / "model.cubin.py", model_dtype, arch, config.num_warps,
                                               config.max_registers, config.pin_thread_ids, progress)
                triton_metadata = json.loads(json.dumps(metadata, default=vars))
                _keep_cubin(cubins, cubin, triton_metadata)
            for future in beside:
                future.result()  # (an error there is the build's)
            if beside:
                progress("the Gluon kernels and the host-driven ones compiled beside it")
            (tmp / "model.cubin").write_bytes(cubin)
            # the cubin lists only its static shared memory; a program also takes Triton's dynamic allocation
            used = resource_usage(tmp / "model.cubin")
            used = dataclasses.replace(used, shared_bytes=used.shared_bytes + triton_metadata["shared"])
            kernel_meta = {"triton_metadata": triton_metadata, "resources": dataclasses.asdict(used)}
        manifest = _manifest(model, config, lw, graph, kernel_meta, model_dtype, source)
        Artifact(manifest, _tables(lw), tmp / "model.cubin.py", None).save(tmp / "model.cubin", cubin)
        shutil.rmtree(entry, ignore_errors=True)  # what a build that stopped halfway left
        try:
            tmp.rename(entry)
        except OSError:  # a build of the same key beside this one got there first: the same artifact
            if not (entry / "model.cubin.json").exists():
                raise
    finally:  # gone after the rename; otherwise what a failed (or beaten) build wrote
        shutil.rmtree(tmp, ignore_errors=True)


HOPPER_SMS = 132  # an H100 SXM's or an H200's: the GPU the Gluon kernels are compiled ahead of time for


def _compile_beside(source_path: Path, lw: Lowering, config: CompileConfig, model_dtype: str,
                    arch: int) -> list[Future]:
    """Where the runtime will run requests on the Gluon kernels (a Hopper target, bf16: `Megakernel._gluon`), what
    it launches besides the kernel, compiled into the cache in processes of their own beside the kernel's compile, so
    that a build's time stays about the kernel's and the runtime compiles nothing: the host-driven executor's kernels
    (a prefill step's plan, embedding, logits row and sampling: `runtime.host_driven.precompile_source`) and the Gluon
    ones (`runtime.gluon.precompile_runner`, for HOPPER_SMS SMs). Not from a process whose Triton is the
    interpreter's (the CPU tests': a spawned process inherits it, and cannot compile then); the runtime's `precompile`
    compiles the host-driven kernels at the first load that needs them, Triton's JIT the Gluon ones."""
    if config.interpret or arch != 90 or model_dtype != "bf16" or os.environ.get("TRITON_INTERPRET") == "1":
        return []
    from runtime.gluon import precompile_runner
    from runtime.host_driven import _inlined, host_folder, precompile_source

    inlined = _inlined(source_path)
    room = tuple(lw.layout.regions[name].size if name in lw.layout.regions else 0
                 for name in ("prefill_parts", "tickets:prefill"))
    tables = (lw.tasks.task_table(), lw.tasks.desc_table().tolist(), config.to_dict(), HOPPER_SMS, room)
    runners = ["one", "batch"] if config.max_batch > 1 else ["one"]  # (a process each: ~15 and ~22 s of CPU)
    jobs = [(precompile_runner, which, *tables) for which in runners]
    if not host_folder(inlined, arch)[1]:
        jobs.append((precompile_source, inlined, signature(model_dtype), arch))
    pool = ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn"))
    try:
        return [pool.submit(*job) for job in jobs]
    finally:
        pool.shutdown(wait=False)  # (the compiles run on; the processes end with them)


def _keep_cubin(directory: Path, cubin: bytes, triton_metadata: dict) -> None:
    """The cubin and Triton's metadata of an artifact, cached apart from it (`cubins/KEY` beside `artifacts/KEY`):
    a build that finds them skips Triton's passes and ptxas, over a minute for a full-size model, and redoes only
    the seconds of tracing, lowering and tables. A few MB against the artifact's ~20 (its tables), so that kernels
    compiled on a machine without a GPU (the key holds no device) can travel to one that has it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".", suffix=".tmp", dir=directory.parent))
    try:
        (tmp / "model.cubin").write_bytes(cubin)
        (tmp / "metadata.json").write_text(json.dumps(triton_metadata))
        tmp.rename(directory)
    except OSError:  # a build of the same key beside this one kept it first
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _manifest(model: ResolvedModel, config: CompileConfig, lw: Lowering, graph: Graph, kernel_meta: dict,
              model_dtype: str, source: str) -> dict:
    cfg = model.config
    specs = [[s.name, list(s.shape), model_dtype, [[k, list(i)] for k, i in s.sources]] for s in weight_specs(graph)]
    return {
        "format": FORMAT, "version": VERSION,
        "kernel": {"name": KERNEL_NAME, "cubin": kernel_meta["triton_metadata"] is not None,
                   "num_warps": config.num_warps, "signature": signature(model_dtype),
                   "source_sha256": source_hash(source),
                   "triton_version": version("triton"), "triton_metadata": kernel_meta["triton_metadata"],
                   "resources": kernel_meta["resources"], "max_programs_per_sm": config.programs_per_sm},
        "config": config.to_dict(),
        "model": {"name": model.definition.name, "architecture": cfg.architecture, "dtype": model_dtype,
                  "vocab_size": cfg.vocab_size, "num_layers": cfg.num_hidden_layers,
                  "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                  "eos_token_ids": list(cfg.eos_token_ids), "hf_config": model.hf_config,
                  "logits_region": f"v{graph.outputs['logits'].id}"},
        # the source is filled in per compile; transforms: weights placed folded or interleaved (codegen/lower.py)
        "weights": {"source": None, "specs": specs, "transforms": lw.transforms},
        "tokenizer": None,
        "num_tasks": len(lw.tasks.tasks),
        "layout": lw.layout.to_dict(),
        "events": lw.tasks.event_names,
    }


def _tables(lw: Lowering) -> dict[str, torch.Tensor]:
    tables = {"tasks": lw.tasks.task_table(), "descs": lw.tasks.desc_table()}
    for region, (rotary_dim, theta, scaling) in lw.rope_tables.items():
        tables[region] = rope_inv_freq(rotary_dim, theta, scaling)
    return tables
