"""Presets, config parsing and tracing, checked against transformers' own configs and models."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ir.analysis import num_parameters
from models.presets import FULL_PRESETS, TINY_PRESETS, preset_config
from models.registry import resolve_model
from models.trace import trace_model

PUBLISHED_PARAMS = {"llama3-8b": 8_030_261_248, "phi-4": 14_659_507_200, "qwen3-32b": 32_762_123_264,
                    "qwen3-30b-a3b": 30_532_122_624}


@pytest.mark.parametrize("preset", FULL_PRESETS + TINY_PRESETS)
def test_traced_parameters_equal_transformers_model(preset, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(preset_config(preset)))
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    model = resolve_model(preset)
    graph = trace_model(model.definition, model.config)
    assert num_parameters(graph) == sum(p.numel() for p in hf.parameters())
    if preset in PUBLISHED_PARAMS:
        assert num_parameters(graph) == PUBLISHED_PARAMS[preset]


def test_transformers_reads_our_presets_the_way_we_do():
    for preset in FULL_PRESETS + TINY_PRESETS:
        ours = resolve_model(preset).config
        theirs = AutoConfig.for_model(**preset_config(preset))
        assert ours.head_dim == getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
        assert ours.num_key_value_heads == theirs.num_key_value_heads
        assert ours.tie_word_embeddings == theirs.tie_word_embeddings


@pytest.mark.parametrize("change,message", [
    ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope type 'longrope' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3 rope_scaling lacks"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"sliding_window": 2047}, "sliding_window=2047 is not supported"),
    ({"hidden_size": "4096"}, "hidden_size must be int"),
    ({"num_key_value_heads": 7}, "multiple of num_key_value_heads"),
    ({"torch_dtype": "float8"}, "unsupported dtype 'float8'"),
    ({"architectures": ["GPT2LMHeadModel"]}, "unsupported architecture 'GPT2LMHeadModel'"),
])
def test_unsupported_or_malformed_configs_are_clear_errors(change, message, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**preset_config("llama3-8b"), **change}))
    with pytest.raises(ValueError, match=message):
        resolve_model(tmp_path)


def test_missing_field_and_unknown_preset_are_clear_errors(tmp_path):
    config = preset_config("qwen3-30b-a3b")
    del config["num_experts"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing field 'num_experts'"):
        resolve_model(tmp_path)
    with pytest.raises(ValueError, match="neither a preset"):
        resolve_model("llama9-1t")


def test_transformers_5_rope_parameters_spelling_is_read():
    config = preset_config("tiny-llama")
    config["rope_parameters"] = {"rope_theta": 123.0, **config.pop("rope_scaling")}
    del config["rope_theta"]
    parsed = resolve_model("tiny-llama").definition.parse_config(config)
    assert parsed.rope_theta == 123.0 and parsed.rope_scaling["factor"] == 8.0


def test_moe_layer_selection_follows_mlp_only_layers_and_sparse_step():
    cfg = resolve_model("tiny-qwen3-moe").config
    assert [cfg.is_moe_layer(i) for i in range(3)] == [True, False, True]
    assert all(resolve_model("qwen3-30b-a3b").config.is_moe_layer(i) for i in range(48))
