"""`blinkc compile`: model -> graph -> passes -> tasks -> Triton source -> cubin + manifest, cached.

The cache key holds everything that changes the code: the model config, the compile options, the
dtype, the target, Triton's version and the source of Blink's own compiler packages. A cached compile
only copies files: no tracing, lowering, Triton or torch import (`blinkc.build` does those on a miss).
"""
from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from importlib.metadata import version

from blinkc.env import cache_dir
from codegen.config import CompileConfig
from codegen.kernel_abi import Resources
from ir import DType
from models.registry import ResolvedModel
from runtime.artifact import companion


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
        from blinkc.build import build_into

        build_into(entry, model, config, dtype, model_dtype, arch, progress)
    manifest = json.loads((entry / "model.cubin.json").read_text())
    manifest["weights"]["source"] = weights.to_dict()
    manifest["tokenizer"] = str(Path(tokenizer_dir).resolve()) if tokenizer_dir else None
    _copy_artifact(entry / "model.cubin", Path(out), manifest)
    resources = manifest["kernel"]["resources"]
    return CompileResult(Path(out), Resources(**resources) if resources else None, time.perf_counter() - start,
                         cached, manifest["num_tasks"])


def compile_many(jobs: list[tuple[str, CompileConfig]], host_driven: Collection[CompileConfig] = ()) -> float:
    """Compiles (preset, config) jobs side by side into the cache, where `compile_model` then finds them (one
    compile of a full-size model is most of a minute of single-threaded ptxas). host_driven: the configs whose
    kernels' host-driven executor is compiled too (`runtime.host_driven.precompile`). Returns the seconds taken."""
    start = time.perf_counter()
    jobs = list(dict.fromkeys(jobs))  # a job twice would build one cache entry twice at once
    if jobs:
        workers = min(len(jobs), os.cpu_count() or 1)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_compile_job, job, job[1] in host_driven) for job in jobs]
            errors = [error for error in (future.exception() for future in futures) if error is not None]
        if errors:  # every other kernel is in the cache by now
            raise RuntimeError(f"{len(errors)} of {len(jobs)} compiles failed, the first: {errors[0]}") from errors[0]
    return time.perf_counter() - start


def _compile_job(job: tuple[str, CompileConfig], host_driven: bool) -> None:
    from models.registry import resolve_model

    preset, config = job
    with tempfile.TemporaryDirectory() as out:
        try:
            result = compile_model(resolve_model(preset), config, Path(out) / "model.cubin", WeightsSource(seed=0))
            if host_driven:
                from runtime.artifact import Artifact
                from runtime.host_driven import precompile
                precompile(Artifact.load(result.path))
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
    imported before, as the edited code's: a later process then took a stale kernel from the cache.) Not
    codegen/gluon: its bodies are compiled where they run (the host-driven executor launches them), never into an
    artifact, so an edit there leaves every compiled kernel as it was; once an artifact holds a Gluon kernel, they
    belong in the key."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for package in ("codegen", "ir", "models", "blinkc"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".j2") and (root / "codegen" / "gluon") not in path.parents:
                h.update(path.read_bytes())
    return h.digest()


def _copy_artifact(cached: Path, out: Path, manifest: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", ".py", ".tables.safetensors"):
        source = cached.with_name(cached.name + suffix)
        if source.exists():
            shutil.copyfile(source, out.with_name(out.name + suffix))
    companion(out, ".json").write_text(json.dumps(manifest, indent=1) + "\n")
