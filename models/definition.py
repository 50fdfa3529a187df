"""What a model family provides: how to read its config and how to trace its forward step."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ir import Tensor, Tracer
from models.blocks import Step
from models.config import ModelConfig


@dataclass(frozen=True)
class ModelDefinition:
    name: str
    tokenizer_style: str  # special tokens and chat template of random checkpoints: llama3, phi3, qwen3
    architectures: tuple[str, ...]  # HF `architectures` names served by this definition
    parse_config: Callable[[dict[str, Any]], ModelConfig]
    forward: Callable[[Tracer, ModelConfig, Step, list[Tensor]], Tensor]  # -> fp32 logits [L, V]
