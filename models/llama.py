"""Llama-3 / 3.1: separate q/k/v and gate/up projections; default or llama3-scaled rope."""
from models.definition import ModelDefinition
from models.hf_config import parse_common


def parse_config(d):
    return parse_common(d, "LlamaForCausalLM")


def forward(tr, cfg, step, caches):
    from models.blocks import decoder_lm, gated_mlp, qkv_separate

    return decoder_lm(tr, cfg, step, caches, qkv_separate, lambda layer: gated_mlp)


LLAMA = ModelDefinition("llama", "llama3", ("LlamaForCausalLM",), parse_config, forward)
