"""The kernel's interface, shared by the compiler and the manifest writer: its name, its arguments and
their types, and the resource report. Imports no Triton, so a cached compile stays cheap."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

KERNEL_NAME = "blink_megakernel"
# The kernel's arguments in order; pointers are specialised as 16-byte aligned so loads vectorise.
ARGS = ("TASKS", "DESCS", "W", "ACT", "F32", "I32", "KV", "EVENTS", "PROFILE", "kv_plane", "num_tasks", "max_steps")


# The host-driven executor's kernels (runtime/host_driven.py: the template's `{KERNEL_NAME}_plan` and `_group`) and
# their arguments in order
HOST_KERNELS = {"plan": ("I32", "F32", "step"),
                "group": ("TASKS", "DESCS", "W", "ACT", "F32", "I32", "KV", "kv_plane", "first_task", "step", "parts")}


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


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]
