"""Compiling the rendered megakernel: the Triton source to a cubin for a target (no GPU needed: Triton's
bundled ptxas does it), and the resource usage that decides how many programs fit on an SM."""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from codegen.render import KERNEL_NAME
from runtime.artifact import import_source

# The kernel's arguments in order; pointers are specialised as 16-byte aligned so loads vectorise.
ARGS = ("TASKS", "DESCS", "W", "ACT", "F32", "I32", "KV", "EVENTS", "PROFILE", "kv_plane", "num_tasks", "max_steps")


def signature(model_dtype: str) -> dict[str, str]:
    t = {"bf16": "*bf16", "f16": "*fp16", "f32": "*fp32"}[model_dtype]
    return {"TASKS": "*i64", "DESCS": "*i64", "W": t, "ACT": t, "F32": "*fp32", "I32": "*i32", "KV": t,
            "EVENTS": "*i32", "PROFILE": "*i64", "kv_plane": "i64", "num_tasks": "i32", "max_steps": "i32"}


@dataclass(frozen=True)
class Resources:
    registers: int
    stack_bytes: int  # per thread: spills and local arrays
    shared_bytes: int

    def __str__(self) -> str:
        return f"{self.registers} registers, {self.stack_bytes} B stack (spills), {self.shared_bytes} B shared memory"


def compile_cubin(source_path: Path, model_dtype: str, arch: int, num_warps: int):
    """-> (cubin bytes, Triton's metadata dict)."""
    fn = getattr(import_source(source_path), KERNEL_NAME)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(ARGS) if name.isupper()}
    src = ASTSource(fn, signature(model_dtype), {}, attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    metadata = {k: v for k, v in kernel.metadata._asdict().items()}
    metadata["target"] = {"backend": "cuda", "arch": arch, "warp_size": 32}
    return kernel.asm["cubin"], metadata


def resource_usage(cubin_path: Path) -> Resources:
    """Registers, stack and shared memory of the kernel, read from the cubin with cuobjdump."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    out = subprocess.run([str(tool), "--dump-resource-usage", str(cubin_path)], capture_output=True, text=True,
                         check=True).stdout
    found = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", out))
    return Resources(int(found.get("REG", 0)), int(found.get("STACK", 0)), int(found.get("SHARED", 0)))
