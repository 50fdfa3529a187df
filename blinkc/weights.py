"""Weights of a traced graph: the placement table, loading from a checkpoint, random weights from a seed."""
from __future__ import annotations

import zlib
from pathlib import Path

import torch

from ir import Graph
from runtime.checkpoint import CheckpointIndex
from runtime.weights import WeightSpec, place_weights


def weight_specs(graph: Graph) -> list[WeightSpec]:
    return [WeightSpec(p.name, p.shape, p.value.dtype.torch, tuple((s.key, s.index) for s in p.sources))
            for p in graph.params]


def checkpoint_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape, as an HF checkpoint of this model stores it."""
    shapes = {}
    for spec in weight_specs(graph):
        probe = torch.empty(spec.shape, dtype=torch.int8, device="meta")
        for key, index in spec.sources:
            shapes[key] = tuple(probe[spec.region(index)].shape)
    return shapes


def load_weights(graph: Graph, checkpoint_dir: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    return place_weights(weight_specs(graph), CheckpointIndex.open(checkpoint_dir).read, device)


def random_tensor(key: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    """Deterministic per (seed, key): N(0, std) for matrices and biases, 1 + N(0, 0.1) for norm weights."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    values = torch.randn(shape, generator=gen)
    return 1.0 + 0.1 * values if key.endswith("norm.weight") else std * values


def random_checkpoint_tensors(graph: Graph, seed: int, std: float = 0.02, dtype: torch.dtype = torch.bfloat16):
    """Yields (checkpoint key, tensor) for every tensor an HF checkpoint of this model holds."""
    for key, shape in checkpoint_shapes(graph).items():
        yield key, random_tensor(key, shape, seed, std).to(dtype)


def random_weights(graph: Graph, seed: int, std: float = 0.02, device: str | torch.device = "cpu"
                   ) -> dict[str, torch.Tensor]:
    """The weights a random checkpoint written with the same seed would load to, without a disk."""
    def reader(keys: set[str]):
        shapes = checkpoint_shapes(graph)
        for key in sorted(keys):
            yield key, random_tensor(key, shapes[key], seed, std).to(torch.bfloat16)

    return place_weights(weight_specs(graph), reader, device)
