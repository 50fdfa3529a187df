"""What a model family provides: how to read its config and how to trace its forward step.

A family's module imports the blocks (and through them the ops' torch reference code) inside `forward`:
resolving a model to its config, all a compile answered from the cache does, then needs no torch.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from models.config import ModelConfig

if TYPE_CHECKING:
    from ir import Tensor, Tracer
    from models.blocks import Step


@dataclass(frozen=True)
class ModelDefinition:
    name: str
    tokenizer_style: str  # special tokens and chat template of random checkpoints: llama3, phi3, qwen3
    architectures: tuple[str, ...]  # HF `architectures` names served by this definition
    parse_config: Callable[[dict[str, Any]], ModelConfig]
    forward: Callable[[Tracer, ModelConfig, Step, list[Tensor]], Tensor]  # -> fp32 logits [L, V]
