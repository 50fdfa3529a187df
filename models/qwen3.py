"""Qwen3 dense: Llama's shape plus per-head RMSNorm of q and k before rope, and an explicit head_dim."""
from models.definition import ModelDefinition
from models.hf_config import parse_common


def parse_config(d):
    return parse_common(d, "Qwen3ForCausalLM", qk_norm=True)


def forward(tr, cfg, step, caches):
    from models.blocks import decoder_lm, gated_mlp, qkv_separate

    return decoder_lm(tr, cfg, step, caches, qkv_separate, lambda layer: gated_mlp)


QWEN3 = ModelDefinition("qwen3", "qwen3", ("Qwen3ForCausalLM",), parse_config, forward)
