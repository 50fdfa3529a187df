"""The op registry: one entry per op with its shape rule and its reference implementation.

The reference implementations (torch, any device) are the living definition of each op: the reference
executor runs them, and every lowering is tested against them. Lowerings live in `codegen`, keyed by the
same op names.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ir.dtypes import DType
from ir.graph import Shape, Value

OutType = tuple[Shape, DType]
InferFn = Callable[[Sequence[Value], Mapping[str, Any]], list[OutType]]
ReferenceFn = Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: InferFn
    reference: ReferenceFn  # reference(*input_tensors, **attrs)
    num_inputs: tuple[int, ...]  # accepted input counts (e.g. linear with or without bias)


_REGISTRY: dict[str, OpDef] = {}


def register_op(name: str, num_inputs: int | tuple[int, ...], infer: InferFn) -> Callable[[ReferenceFn], ReferenceFn]:
    """Decorates the reference implementation of op `name`."""
    counts = (num_inputs,) if isinstance(num_inputs, int) else tuple(num_inputs)

    def wrap(reference: ReferenceFn) -> ReferenceFn:
        if name in _REGISTRY:
            raise ValueError(f"op {name!r} registered twice")
        _REGISTRY[name] = OpDef(name, _checked(name, counts, infer), reference, counts)
        return reference

    return wrap


def _checked(name: str, counts: tuple[int, ...], infer: InferFn) -> InferFn:
    def run(inputs: Sequence[Value], attrs: Mapping[str, Any]) -> list[OutType]:
        if len(inputs) not in counts:
            raise ValueError(f"{name}: takes {' or '.join(map(str, counts))} inputs, got {len(inputs)}")
        return infer(inputs, attrs)

    return run


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}") from None


def registered_ops() -> list[str]:
    return sorted(_REGISTRY)


def require(cond: bool, message: str) -> None:
    """Shape rules state their preconditions with this."""
    if not cond:
        raise ValueError(message)
