"""`blinkc compile`: model -> graph -> passes -> tasks -> Triton source -> cubin + manifest, cached.

The cache key holds everything that changes the code: the model config, the compile options, the
dtype, the target, Triton's version and the source of Blink's own compiler packages. A cached compile
only copies files (no tracing, lowering or Triton import).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from importlib.metadata import version
from typing import TYPE_CHECKING

import torch

from blinkc.env import cache_dir
from blinkc.weights import weight_specs
from codegen.config import CompileConfig
from codegen.kernel_abi import KERNEL_NAME, Resources, signature, source_hash
from ir import DType, Graph
from ir.ops.attention import rope_inv_freq
from ir.passes.pipeline import LOWERING_PREP, PIPELINE, run_pipeline
from models.registry import ResolvedModel
from models.trace import trace_model
from runtime.artifact import FORMAT, VERSION, Artifact, companion

if TYPE_CHECKING:
    from codegen.lower import Lowering


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
    """Writes the artifact to `out`. Cached on everything that changes the code: the model config, the
    compile options, dtype, target, Triton's version and the source of Blink's own compiler packages;
    a cache hit only copies files and fills in where the weights and the tokenizer are."""
    if arch < 90 and not config.interpret:
        raise ValueError(f"the megakernel needs sm_90 or newer (Hopper's bulk L2 prefetch and tensor copies), "
                         f"not sm_{arch}")
    start = time.perf_counter()
    model_dtype = (dtype or model.config.dtype).value
    entry = cache_dir() / "artifacts" / _cache_key(model, config, model_dtype, arch)
    cached = (entry / "model.cubin.json").exists()
    if not cached:
        _build_into(entry, model, config, dtype, model_dtype, arch, progress)
    manifest = json.loads((entry / "model.cubin.json").read_text())
    manifest["weights"]["source"] = weights.to_dict()
    manifest["tokenizer"] = str(Path(tokenizer_dir).resolve()) if tokenizer_dir else None
    _copy_artifact(entry / "model.cubin", Path(out), manifest)
    resources = manifest["kernel"]["resources"]
    return CompileResult(Path(out), Resources(**resources) if resources else None, time.perf_counter() - start,
                         cached, manifest["num_tasks"])


def compile_many(jobs: list[tuple[str, CompileConfig]]) -> float:
    """Compiles (preset, config) jobs side by side into the cache, where `compile_model` then finds them (one
    compile of a full-size model is most of a minute of single-threaded ptxas). Returns the seconds taken."""
    start = time.perf_counter()
    jobs = list(dict.fromkeys(jobs))  # a job twice would build one cache entry twice at once
    if jobs:
        workers = min(len(jobs), os.cpu_count() or 1)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_compile_job, job) for job in jobs]
            errors = [error for error in (future.exception() for future in futures) if error is not None]
        if errors:  # every other kernel is in the cache by now
            raise RuntimeError(f"{len(errors)} of {len(jobs)} compiles failed, the first: {errors[0]}") from errors[0]
    return time.perf_counter() - start


def _compile_job(job: tuple[str, CompileConfig]) -> None:
    from models.registry import resolve_model

    preset, config = job
    with tempfile.TemporaryDirectory() as out:
        try:
            compile_model(resolve_model(preset), config, Path(out) / "model.cubin", WeightsSource(seed=0))
        except Exception as error:  # its chain of causes does not cross back to the parent process: name it here
            raise RuntimeError(root_cause(error)) from error


def root_cause(error: BaseException) -> str:
    """One line for a compile error: its innermost cause, which says what went wrong (Triton's
    `CompilationError` says only where, as an excerpt of the kernel's source), and the kernel line where."""
    where = ""
    while error.__cause__ is not None:
        lines = str(error).splitlines()
        carets = [i for i, line in enumerate(lines) if i and line.strip() == "^"]
        if type(error).__name__ == "CompilationError" and carets:
            where = f" ({lines[0].rstrip(':')}: {lines[carets[0] - 1].strip()})"
        error = error.__cause__
    return f"{type(error).__name__}: {error}{where}"


def _cache_key(model: ResolvedModel, config: CompileConfig, model_dtype: str, arch: int) -> str:
    h = hashlib.sha256(json.dumps([model.hf_config, config.to_dict(), model_dtype, arch, version("triton")],
                                  sort_keys=True, default=str).encode())
    h.update(_compiler_digest())
    return h.hexdigest()[:24]


@functools.cache
def _compiler_digest() -> bytes:
    """The source of Blink's compiler packages, read once a process: the code this process builds with. (Read at
    every compile, a source edited while a long process ran keyed that process's builds, from the code it had
    imported before, as the edited code's: a later process then took a stale kernel from the cache.)"""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for package in ("codegen", "ir", "models", "blinkc"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".j2"):
                h.update(path.read_bytes())
    return h.digest()


def _build_into(entry: Path, model: ResolvedModel, config: CompileConfig, dtype: DType | None, model_dtype: str,
                arch: int, progress) -> None:
    from codegen.check import check_schedule
    from codegen.compile import compile_cubin, resource_usage
    from codegen.lower import lower
    from codegen.render import render_kernel

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
        if not config.interpret:
            cubins = cache_dir() / "cubins" / entry.name  # the artifact's key
            if (cubins / "metadata.json").exists():
                progress(f"the sm_{arch} cubin from the cache ({cubins})")
                cubin, triton_metadata = (cubins / "model.cubin").read_bytes(), json.loads(
                    (cubins / "metadata.json").read_text())
            else:
                progress(f"compiling for sm_{arch} with Triton {version('triton')} (ptxas)...")
                cubin, metadata = compile_cubin(tmp / "model.cubin.py", model_dtype, arch, config.num_warps,
                                               config.max_registers, config.pin_thread_ids)
                triton_metadata = json.loads(json.dumps(metadata, default=vars))
                _keep_cubin(cubins, cubin, triton_metadata)
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


def _keep_cubin(directory: Path, cubin: bytes, triton_metadata: dict) -> None:
    """The cubin and Triton's metadata of an artifact, cached apart from it (`cubins/KEY` beside `artifacts/KEY`):
    a build that finds them skips ptxas, its minutes of a full-size model, and redoes only the seconds of tracing,
    lowering and tables. A few MB against the artifact's ~20 (its tables), so that kernels compiled on a machine
    without a GPU (the key holds no device) can travel to one that has it."""
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


def _copy_artifact(cached: Path, out: Path, manifest: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", ".py", ".tables.safetensors"):
        source = cached.with_name(cached.name + suffix)
        if source.exists():
            shutil.copyfile(source, out.with_name(out.name + suffix))
    companion(out, ".json").write_text(json.dumps(manifest, indent=1) + "\n")


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
