"""Phi-3 / Phi-4: fused qkv_proj and gate_up_proj in the checkpoint; optional partial rotary."""
from models.definition import ModelDefinition
from models.hf_config import parse_common


def parse_config(d):
    return parse_common(d, "Phi3ForCausalLM")


def forward(tr, cfg, step, caches):
    from models.blocks import decoder_lm, gated_mlp_fused, qkv_fused

    return decoder_lm(tr, cfg, step, caches, qkv_fused, lambda layer: gated_mlp_fused)


PHI3 = ModelDefinition("phi3", "phi3", ("Phi3ForCausalLM",), parse_config, forward)
