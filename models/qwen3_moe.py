"""Qwen3-MoE: Qwen3 attention; sparse MoE MLPs except in `mlp_only_layers` (dense) per decoder_sparse_step."""
from models.definition import ModelDefinition
from models.hf_config import get_field, parse_common


def parse_config(d):
    return parse_common(
        d, "Qwen3MoeForCausalLM", qk_norm=True,
        num_experts=get_field(d, "num_experts", int),
        num_experts_per_tok=get_field(d, "num_experts_per_tok", int),
        moe_intermediate_size=get_field(d, "moe_intermediate_size", int),
        norm_topk_prob=get_field(d, "norm_topk_prob", bool, False),
        decoder_sparse_step=get_field(d, "decoder_sparse_step", int, 1),
        mlp_only_layers=tuple(get_field(d, "mlp_only_layers", list, None) or ()),
    )


def forward(tr, cfg, step, caches):
    from models.blocks import decoder_lm, gated_mlp, qkv_separate, sparse_moe

    return decoder_lm(tr, cfg, step, caches, qkv_separate,
                      lambda layer: sparse_moe if cfg.is_moe_layer(layer) else gated_mlp)


QWEN3_MOE = ModelDefinition("qwen3_moe", "qwen3", ("Qwen3MoeForCausalLM",), parse_config, forward)
