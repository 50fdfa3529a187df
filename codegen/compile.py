"""Compiling the rendered megakernel: the Triton source to a cubin for a target (no GPU needed: Triton's
bundled ptxas does it), and the resource usage that decides how many programs fit on an SM."""
from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import triton
import triton.knobs as knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from codegen.kernel_abi import ARGS, HOST_KERNELS, KERNEL_NAME, Resources, signature
from codegen.llir import pinned_thread_ids
from runtime.artifact import import_source

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"  # Triton's, CPU or GPU


# Triton's stages in the order they run. A full-size kernel spends about half its cold compile in TritonGPU IR,
# nearly all of that in one pass (Coalesce: benchmarks/explore/NOTES.md, session 57).
STAGES = {"ttir": "Triton IR", "ttgir": "TritonGPU IR", "llir": "LLVM IR", "ptx": "PTX", "cubin": "cubin (ptxas)"}


def compile_kernel(fn, model_dtype: str, arch: int, num_warps: int, max_registers: int = 0,
                   pin_thread_ids: bool = True, progress: Callable[[str], None] = lambda _: None):
    """The megakernel `fn` compiled by Triton (its `asm` holds every stage). max_registers: a cap on registers a
    thread (0: none); pin_thread_ids: `codegen.llir`'s LLVM stage; progress: told each stage's time as it ends
    (nothing when Triton's cache has the kernel)."""
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(ARGS) if name.isupper()}
    src = ASTSource(fn, signature(model_dtype), {}, attrs)
    options = {"num_warps": num_warps, "maxnreg": max_registers or None}
    with pinned_thread_ids(pin_thread_ids), timed_stages(progress):
        return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


@contextlib.contextmanager
def timed_stages(progress: Callable[[str], None]):
    """Within: `triton.compile` reports each stage's seconds through `progress`, around whatever stages an enclosing
    hook (`pinned_thread_ids`) put in. The output is the same, so Triton's cache is shared."""
    inner = knobs.runtime.add_stages_inspection_hook

    def hook(backend, stages, options, language, capability) -> None:
        if inner is not None:
            inner(backend, stages, options, language, capability)
        for name, stage in list(stages.items()):
            stages[name] = _timed(STAGES.get(name, name), stage, progress)

    with knobs.runtime.scope():
        knobs.runtime.add_stages_inspection_hook = hook
        yield


def _timed(label: str, stage, progress: Callable[[str], None]):
    def run(src, metadata):
        start = time.perf_counter()
        out = stage(src, metadata)
        progress(f"{label} in {time.perf_counter() - start:.1f} s")
        return out
    return run


def compile_cubin(source_path: Path, model_dtype: str, arch: int, num_warps: int, max_registers: int = 0,
                  pin_thread_ids: bool = True, progress: Callable[[str], None] = lambda _: None):
    """-> (cubin bytes, Triton's metadata dict) of the rendered kernel at source_path (`compile_kernel`)."""
    kernel = compile_kernel(getattr(import_source(source_path), KERNEL_NAME), model_dtype, arch, num_warps,
                            max_registers, pin_thread_ids, progress)
    metadata = {k: v for k, v in kernel.metadata._asdict().items()}
    metadata["target"] = {"backend": "cuda", "arch": arch, "warp_size": 32}
    return kernel.asm["cubin"], metadata


def compile_host_kernels(source_path: Path, kernel_signature: dict[str, str], arch: int) -> dict[str, tuple]:
    """The host-driven executor's kernels in the kernel source at source_path, compiled for sm_arch as the megakernel
    is (ahead of time, no GPU needed; JIT would compile them on the GPU machine at their first launch, a minute of
    ptxas for `_group`): name -> (cubin, Triton's metadata, their signature). Arguments typed as the megakernel's
    (`kernel_signature`), the group's task, step and parts as int32; pointers 16-byte aligned; the launch's 4 warps,
    as JIT's default."""
    module = import_source(source_path)
    types = {**kernel_signature, "first_task": "i32", "step": "i32", "parts": "i32"}
    compiled = {}
    for name, args in HOST_KERNELS.items():
        fn = getattr(module, f"{KERNEL_NAME}_{name}")
        attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(args) if arg.isupper()}
        kernel_types = {arg: types[arg] for arg in args}
        kernel = triton.compile(ASTSource(fn, kernel_types, {}, attrs), target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": 4})
        metadata = {k: v for k, v in kernel.metadata._asdict().items()}
        metadata["target"] = {"backend": "cuda", "arch": arch, "warp_size": 32}
        compiled[name] = (kernel.asm["cubin"], metadata, kernel_types)
    return compiled


def resource_usage(cubin_path: Path) -> Resources:
    """Registers, stack and shared memory of the kernel, read from the cubin with cuobjdump."""
    out = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", str(cubin_path)], capture_output=True, text=True,
                         check=True).stdout
    found = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", out))
    return Resources(int(found.get("REG", 0)), int(found.get("STACK", 0)), int(found.get("SHARED", 0)))
