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
    for spec in specs:
        _check_exact_cover(spec)
    out = {s.name: torch.empty(s.shape, dtype=s.dtype, device=device) for s in specs}
    targets: dict[str, list[tuple[WeightSpec, Index]]] = {}
    for spec in specs:
        for key, index in spec.sources:
            targets.setdefault(key, []).append((spec, index))
    for key, tensor in reader(set(targets)):
        for spec, index in targets[key]:
            dest = out[spec.name][spec.region(index)]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(f"checkpoint tensor {key!r} has shape {list(tensor.shape)}, "
                                 f"{spec.name} expects {list(dest.shape)}")
            dest.copy_(tensor)
    return out


def _check_exact_cover(spec: WeightSpec) -> None:
    """Every element of the weight is filled by exactly one source (checked on the indexed dims only)."""
    depth = max(len(index) for _, index in spec.sources) if spec.sources else 0
    coverage = torch.zeros(spec.shape[:depth], dtype=torch.int32)
    for _, index in spec.sources:
        coverage[spec.region(index)] += 1
    if not bool((coverage == 1).all()):
        what = "overlap" if bool((coverage > 1).any()) else "leave a part unfilled"
        raise ValueError(f"weight {spec.name}: its checkpoint sources {what}")
