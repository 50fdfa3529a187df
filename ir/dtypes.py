"""Element types of IR values and their torch equivalents.

torch is imported only when a torch dtype is asked for: a compile that the cache answers reads dtypes and
never needs torch (whose import is most of such a command's time).
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class DType(enum.Enum):
    bf16 = "bf16"
    f16 = "f16"
    f32 = "f32"
    i32 = "i32"
    i64 = "i64"

    @property
    def torch(self) -> torch.dtype:
        import torch

        return getattr(torch, _TORCH_NAMES[self])

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

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
        for ours in cls:
            if ours.torch == dtype:
                return ours
        raise ValueError(f"unsupported torch dtype {dtype}")


_TORCH_NAMES = {DType.bf16: "bfloat16", DType.f16: "float16", DType.f32: "float32", DType.i32: "int32",
                DType.i64: "int64"}
_ITEMSIZE = {DType.bf16: 2, DType.f16: 2, DType.f32: 4, DType.i32: 4, DType.i64: 8}
_ALIASES = {
    "bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32", "float": "f32",
    "int32": "i32", "int64": "i64",
    "bf16": "bf16", "f16": "f16", "f32": "f32", "i32": "i32", "i64": "i64",
}
