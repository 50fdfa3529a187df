"""`ModelConfig`: what a model definition needs from an HF `config.json`, checked on the way in."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ir.dtypes import DType


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict[str, Any] | None = None  # llama3 parameters, or None for default rope
    partial_rotary_factor: float = 1.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    dtype: DType = DType.bf16
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("config.json: num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"config.json: partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        if self.num_experts and self.moe_intermediate_size <= 0:
            raise ValueError("config.json: moe_intermediate_size must be positive")
        if self.rotary_dim % 2 or self.rotary_dim == 0:
            raise ValueError(f"config.json: rotary dim {self.rotary_dim} must be even and positive")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError("config.json: num_experts_per_tok must be in 1..num_experts")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)


def read_config_json(checkpoint_dir: Path) -> dict[str, Any]:
    path = Path(checkpoint_dir) / "config.json"
    if not Path(checkpoint_dir).is_dir():
        raise ValueError(f"{checkpoint_dir}: no such checkpoint directory")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (not an HF checkpoint directory?)") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
