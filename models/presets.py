"""Named configurations: the exact public configs of the full-size models, and tiny ones for tests.

Each preset is an HF `config.json` dict, so a preset and a checkpoint directory go through the same
parsing. Tiny presets have irregular sizes and GQA ratios above one; their special-token ids sit at the
top of the vocabulary, where `blinkc.random_tokenizer` puts them.
"""
from __future__ import annotations

import copy
from typing import Any

_LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}
_PHI_4 = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265,
    "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17920,
    "max_position_embeddings": 16384, "num_attention_heads": 40, "num_hidden_layers": 40,
    "num_key_value_heads": 10, "original_max_position_embeddings": 16384, "pad_token_id": 100349,
    "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 250000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 100352,
}
_QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 25600,
    "max_position_embeddings": 40960, "max_window_layers": 64, "num_attention_heads": 64,
    "num_hidden_layers": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
_QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}

_TINY_LLAMA = {  # Llama-3.1 style: llama3 rope scaling
    **_LLAMA3_8B, "hidden_size": 96, "intermediate_size": 200, "num_attention_heads": 6,
    "num_key_value_heads": 2, "num_hidden_layers": 3, "max_position_embeddings": 512, "vocab_size": 1003,
    "bos_token_id": 998, "eos_token_id": 999,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64},
}
_TINY_PHI = {  # Phi-4-mini style: partial rotary, tied embeddings
    **_PHI_4, "hidden_size": 80, "intermediate_size": 176, "num_attention_heads": 5,
    "num_key_value_heads": 1, "num_hidden_layers": 2, "max_position_embeddings": 512,
    "original_max_position_embeddings": 512, "partial_rotary_factor": 0.5, "tie_word_embeddings": True,
    "vocab_size": 1013, "bos_token_id": 1009, "eos_token_id": 1011, "pad_token_id": 1009,
}
_TINY_QWEN3 = {  # head_dim != hidden_size / heads, as in the real Qwen3 models
    **_QWEN3_32B, "hidden_size": 64, "head_dim": 24, "intermediate_size": 136, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 3, "max_window_layers": 3,
    "max_position_embeddings": 512, "vocab_size": 1009, "bos_token_id": 1006, "eos_token_id": 1008,
}
_TINY_QWEN3_MOE = {  # one dense layer in the middle
    **_QWEN3_30B_A3B, "hidden_size": 64, "head_dim": 16, "intermediate_size": 112,
    "moe_intermediate_size": 40, "num_experts": 6, "num_experts_per_tok": 2, "mlp_only_layers": [1],
    "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 3, "max_window_layers": 3,
    "max_position_embeddings": 512, "vocab_size": 1021, "bos_token_id": 1018, "eos_token_id": 1020,
}

_PRESETS = {
    "llama3-8b": _LLAMA3_8B, "phi-4": _PHI_4, "qwen3-32b": _QWEN3_32B, "qwen3-30b-a3b": _QWEN3_30B_A3B,
    "tiny-llama": _TINY_LLAMA, "tiny-phi": _TINY_PHI, "tiny-qwen3": _TINY_QWEN3,
    "tiny-qwen3-moe": _TINY_QWEN3_MOE,
}
FULL_PRESETS = ("llama3-8b", "phi-4", "qwen3-32b", "qwen3-30b-a3b")
TINY_PRESETS = ("tiny-llama", "tiny-phi", "tiny-qwen3", "tiny-qwen3-moe")


def preset_names() -> list[str]:
    return list(_PRESETS)


def preset_config(name: str) -> dict[str, Any]:
    """A fresh copy of the preset's HF config dict."""
    try:
        return copy.deepcopy(_PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(_PRESETS)})") from None
