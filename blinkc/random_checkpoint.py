"""`blinkc weights --random`: a real HF-format checkpoint directory with random weights.

config.json, generation_config.json, safetensors shards (with model.safetensors.index.json when there
is more than one), and a locally trained tokenizer with the family's special tokens and chat template.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from blinkc.random_tokenizer import write_random_tokenizer
from blinkc.weights import random_checkpoint_tensors
from models.registry import definition_for
from models.trace import trace_model
from runtime.checkpoint import INDEX_FILE, SINGLE_FILE


def write_random_checkpoint(hf_config: dict[str, Any], out_dir: Path, seed: int = 0, std: float = 0.02,
                            max_shard_bytes: int = 2 << 30) -> Path:
    definition = definition_for(hf_config)
    cfg = definition.parse_config(hf_config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(_generation_config(hf_config), indent=2) + "\n")
    graph = trace_model(definition, cfg)
    _write_shards(random_checkpoint_tensors(graph, seed, std, cfg.dtype.torch), out_dir, max_shard_bytes)
    write_random_tokenizer(out_dir, definition.tokenizer_style, cfg.vocab_size)
    return out_dir


def _generation_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    return {"bos_token_id": hf_config.get("bos_token_id"), "eos_token_id": hf_config.get("eos_token_id"),
            "do_sample": False}


def _write_shards(tensors, out_dir: Path, max_shard_bytes: int) -> None:
    """Writes shards of at most `max_shard_bytes` as they fill (a larger tensor gets a shard of its own),
    then names them `model-0000i-of-0000n` once n is known."""
    written: list[tuple[Path, list[str], int]] = []
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = 0

    def flush() -> None:
        path = out_dir / f".shard-{len(written)}.tmp"
        save_file(shard, path, metadata={"format": "pt"})
        written.append((path, list(shard), shard_bytes))
        shard.clear()

    for key, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + nbytes > max_shard_bytes:
            flush()
            shard_bytes = 0
        shard[key] = tensor
        shard_bytes += nbytes
    flush()
    if len(written) == 1:
        written[0][0].rename(out_dir / SINGLE_FILE)
        return
    weight_map = {}
    for i, (path, keys, _) in enumerate(written):
        name = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        path.rename(out_dir / name)
        weight_map.update({key: name for key in keys})
    index = {"metadata": {"total_size": sum(n for _, _, n in written)}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
