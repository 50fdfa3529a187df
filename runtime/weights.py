"""Weight placement: each model weight is allocated once at its final place and filled from checkpoint
tensors as they stream in, so the model is never held twice in memory.

A `WeightSpec` is the declarative name mapping: which checkpoint tensors fill which part of a weight
(whole, a slice of rows for fused projections, one entry of a stack of experts).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

Index = tuple[int | tuple[int, int], ...]


@dataclass(frozen=True)
class WeightSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    sources: tuple[tuple[str, Index], ...]  # (checkpoint key, region of this weight it fills)

    def region(self, index: Index) -> tuple[int | slice, ...]:
        return tuple(i if isinstance(i, int) else slice(*i) for i in index)


Reader = Callable[[set[str]], Iterator[tuple[str, torch.Tensor]]]


def place_weights(specs: Iterable[WeightSpec], reader: Reader, device: str | torch.device = "cpu"
                  ) -> dict[str, torch.Tensor]:
    """Allocates every weight on `device` and fills it.

    `reader(keys) -> iterator of (key, tensor)` streams checkpoint tensors (CheckpointIndex.read); every
    region of every weight must be filled exactly once.
    """
    specs = list(specs)
    out = {s.name: torch.empty(s.shape, dtype=s.dtype, device=device) for s in specs}
    targets: dict[str, list[tuple[WeightSpec, Index]]] = {}
    for spec in specs:
        for key, index in spec.sources:
            targets.setdefault(key, []).append((spec, index))
    filled = {s.name: 0 for s in specs}
    for key, tensor in reader(set(targets)):
        for spec, index in targets[key]:
            dest = out[spec.name][spec.region(index)]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(f"checkpoint tensor {key!r} has shape {list(tensor.shape)}, "
                                 f"{spec.name} expects {list(dest.shape)}")
            dest.copy_(tensor)
            filled[spec.name] += dest.numel()
    for spec in specs:
        if filled[spec.name] != out[spec.name].numel():
            raise ValueError(f"weight {spec.name}: checkpoint sources fill {filled[spec.name]} of "
                             f"{out[spec.name].numel()} elements")
    return out
