"""Weights of a traced graph: the placement table, loading from a checkpoint, random weights from a seed."""
from __future__ import annotations

from pathlib import Path

import torch

from ir import Graph
from runtime.checkpoint import CheckpointIndex
from runtime.weights import WeightSpec, checkpoint_shapes, place_weights, random_reader, random_tensor


def weight_specs(graph: Graph) -> list[WeightSpec]:
    return [WeightSpec(p.name, p.shape, p.value.dtype.torch, tuple((s.key, s.index) for s in p.sources))
            for p in graph.params]


def load_weights(graph: Graph, checkpoint_dir: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    return place_weights(weight_specs(graph), CheckpointIndex.open(checkpoint_dir).read, device)


def random_checkpoint_tensors(graph: Graph, seed: int, std: float = 0.02, dtype: torch.dtype = torch.bfloat16):
    """Yields (checkpoint key, tensor) for every tensor an HF checkpoint of this model holds."""
    for key, shape in checkpoint_shapes(weight_specs(graph)).items():
        yield key, random_tensor(key, shape, seed, std).to(dtype)


def random_weights(graph: Graph, seed: int, std: float = 0.02, device: str | torch.device = "cpu"
                   ) -> dict[str, torch.Tensor]:
    """The weights a random checkpoint written with the same seed would load to (on the CPU), without a disk."""
    specs = weight_specs(graph)
    return place_weights(specs, random_reader(checkpoint_shapes(specs), seed, std, torch.bfloat16, device), device)
