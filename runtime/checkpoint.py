"""Reading an HF checkpoint directory's safetensors: one file, or shards listed in an index."""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class CheckpointIndex:
    """Which shard file holds each tensor."""

    root: Path
    shard_of: dict[str, str]

    @classmethod
    def open(cls, root: Path) -> CheckpointIndex:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"{root}: no such checkpoint directory")
        if (root / INDEX_FILE).exists():
            return cls(root, _read_index(root / INDEX_FILE))
        if (root / SINGLE_FILE).exists():
            with safe_open(root / SINGLE_FILE, framework="pt") as f:
                return cls(root, {key: SINGLE_FILE for key in f.keys()})
        raise ValueError(f"{root}: no {SINGLE_FILE} or {INDEX_FILE}")

    def shards(self) -> list[str]:
        return sorted(set(self.shard_of.values()))

    def read(self, keys: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yields the wanted tensors one at a time, shard by shard, so only one is in memory at once."""
        missing = keys - self.shard_of.keys()
        if missing:
            raise ValueError(f"{self.root}: checkpoint lacks tensor {sorted(missing)[0]!r} "
                             f"({len(missing)} missing in all)")
        for shard in self.shards():
            wanted = sorted(k for k in keys if self.shard_of[k] == shard)
            if not wanted:
                continue
            with ExitStack() as stack:
                f = stack.enter_context(safe_open(self.root / shard, framework="pt"))
                for key in wanted:
                    yield key, f.get_tensor(key)


def _read_index(path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError):
        weight_map = None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{path}: malformed index (expected a 'weight_map' object of tensor -> shard file)")
    for shard in set(weight_map.values()):
        if not (path.parent / shard).exists():
            raise ValueError(f"{path}: lists shard {shard!r}, which is missing")
    return dict(weight_map)
