"""Element types of IR values and their torch equivalents."""
from __future__ import annotations

import enum

import torch


class DType(enum.Enum):
    bf16 = "bf16"
    f16 = "f16"
    f32 = "f32"
    i32 = "i32"
    i64 = "i64"

    @property
    def torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    @property
    def itemsize(self) -> int:
        return _TO_TORCH[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in (DType.bf16, DType.f16, DType.f32)

    @classmethod
    def parse(cls, name: str) -> DType:
        """Accepts our short names and HF's `torch_dtype` spellings ("bfloat16", "float32", ...)."""
        key = _ALIASES.get(name, name)
        try:
            return cls(key)
        except ValueError:
            raise ValueError(f"unsupported dtype {name!r} (expected one of {sorted(_ALIASES)})") from None

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> DType:
        for ours, theirs in _TO_TORCH.items():
            if theirs == dtype:
                return ours
        raise ValueError(f"unsupported torch dtype {dtype}")


_TO_TORCH = {
    DType.bf16: torch.bfloat16,
    DType.f16: torch.float16,
    DType.f32: torch.float32,
    DType.i32: torch.int32,
    DType.i64: torch.int64,
}
_ALIASES = {
    "bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32", "float": "f32",
    "int32": "i32", "int64": "i64",
    "bf16": "bf16", "f16": "f16", "f32": "f32", "i32": "i32", "i64": "i64",
}
