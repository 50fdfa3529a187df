"""Maps HF `architectures` names to model definitions, and resolves a model reference (preset name or
checkpoint directory) to a definition and a config."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.config import ModelConfig, read_config_json
from models.definition import ModelDefinition
from models.llama import LLAMA
from models.phi3 import PHI3
from models.presets import preset_config, preset_names
from models.qwen3 import QWEN3
from models.qwen3_moe import QWEN3_MOE

ARCHITECTURES: dict[str, ModelDefinition] = {
    arch: definition for definition in (LLAMA, PHI3, QWEN3, QWEN3_MOE) for arch in definition.architectures
}


@dataclass(frozen=True)
class ResolvedModel:
    definition: ModelDefinition
    config: ModelConfig
    hf_config: dict[str, Any]  # the config.json as written, for checkpoints we write ourselves
    checkpoint_dir: Path | None  # None for a preset without weights


def definition_for(hf_config: dict[str, Any]) -> ModelDefinition:
    archs = hf_config.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise ValueError("config.json: missing 'architectures'")
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    raise ValueError(f"unsupported architecture {archs[0]!r} (supported: {', '.join(sorted(ARCHITECTURES))})")


def resolve_model(ref: str | Path) -> ResolvedModel:
    """`ref` is a preset name (e.g. "llama3-8b") or an HF checkpoint directory."""
    path = Path(ref)
    if str(ref) in preset_names() and not path.is_dir():
        hf_config, checkpoint = preset_config(str(ref)), None
    elif path.is_dir():
        hf_config, checkpoint = read_config_json(path), path
    else:
        raise ValueError(f"{ref}: neither a preset ({', '.join(preset_names())}) nor a checkpoint directory")
    definition = definition_for(hf_config)
    return ResolvedModel(definition, definition.parse_config(hf_config), hf_config, checkpoint)
