"""Weight placement: each model weight is allocated once at its final place and filled from checkpoint
tensors as they stream in, so the model is never held twice in memory.

A `WeightSpec` is the declarative name mapping: which checkpoint tensors fill which part of a weight
(whole, a slice of rows for fused projections, one entry of a stack of experts).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
import zlib
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


def place_weights(specs: Iterable[WeightSpec], reader: Reader, device: str | torch.device = "cpu",
                  destinations: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Allocates every weight on `device` and fills it.

    `reader(keys) -> iterator of (key, tensor)` streams checkpoint tensors (CheckpointIndex.read); every
    region of every weight must be filled exactly once. `destinations` (weight name -> tensor, e.g. views
    into one packed buffer) are filled in place instead of allocating.
    """
    specs = list(specs)
    for spec in specs:
        _check_exact_cover(spec)
    out = dict(destinations) if destinations is not None else \
        {s.name: torch.empty(s.shape, dtype=s.dtype, device=device) for s in specs}
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


def transform_weight(dst: torch.Tensor, src: torch.Tensor, scale_columns: torch.Tensor | None = None,
                     interleave_rows: bool = False, chunk_rows: int = 8192) -> None:
    """Writes `src` into `dst` (the same tensor or a copy's place) in the form a kernel reads it: each
    column multiplied by `scale_columns` (in fp32, rounded once) and/or the rows of its two halves
    interleaved (row 2j = row j, row 2j + 1 = row half + j). Works in row chunks: no fp32 copy of the whole.
    A stacked weight ([experts, rows, columns]) has its columns scaled as rows of one matrix, and each
    matrix's halves interleaved apart."""
    if src.dim() > 2 and interleave_rows:
        for i in range(src.shape[0]):
            transform_weight(dst[i], src[i], scale_columns, interleave_rows, chunk_rows)
        return
    if src.dim() > 2:
        src, dst = src.reshape(-1, src.shape[-1]), dst.view(-1, dst.shape[-1])
    rows = src.shape[0]
    order = torch.arange(rows, device=src.device)
    if interleave_rows:
        if rows % 2:
            raise ValueError(f"cannot interleave the halves of {rows} rows")
        order = order.view(2, rows // 2).t().reshape(-1)
        if dst.data_ptr() == src.data_ptr():
            src = src.clone()  # rows move: read them from a copy
    for start in range(0, rows, chunk_rows):
        part = src[order[start:start + chunk_rows]]
        if scale_columns is not None:
            part = (part.float() * scale_columns.float()).to(dst.dtype)
        dst[start:start + chunk_rows] = part


def _check_exact_cover(spec: WeightSpec) -> None:
    """Every element of the weight is filled by exactly one source (checked on the indexed dims only)."""
    depth = max(len(index) for _, index in spec.sources) if spec.sources else 0
    coverage = torch.zeros(spec.shape[:depth], dtype=torch.int32)
    for _, index in spec.sources:
        coverage[spec.region(index)] += 1
    if not bool((coverage == 1).all()):
        what = "overlap" if bool((coverage > 1).any()) else "leave a part unfilled"
        raise ValueError(f"weight {spec.name}: its checkpoint sources {what}")


def random_tensor(key: str, shape: tuple[int, ...], seed: int, std: float, device: str | torch.device = "cpu"
                  ) -> torch.Tensor:
    """Deterministic per (seed, key, device kind): N(0, std) for matrices and biases, 1 + N(0, 0.1) for
    norm weights. Generated where it will live, so a 60 GB model needs no host memory or disk."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    values = torch.randn(shape, generator=gen, device=device)
    return 1.0 + 0.1 * values if key.endswith("norm.weight") else std * values


def random_reader(shapes: dict[str, tuple[int, ...]], seed: int, std: float, dtype: torch.dtype,
                  device: str | torch.device = "cpu") -> Reader:
    """A reader that makes up the checkpoint tensors `shapes` names (see `random_tensor`)."""
    def read(keys: set[str]):
        for key in sorted(keys):
            yield key, random_tensor(key, shapes[key], seed, std, device).to(dtype)
    return read


def checkpoint_shapes(specs: Iterable[WeightSpec]) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape, as an HF checkpoint of these weights stores it."""
    shapes = {}
    for spec in specs:
        probe = torch.empty(spec.shape, dtype=torch.int8, device="meta")
        for key, index in spec.sources:
            shapes[key] = tuple(probe[spec.region(index)].shape)
    return shapes
