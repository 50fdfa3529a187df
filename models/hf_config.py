"""Reading the fields every family shares out of an HF `config.json` dict, with clear errors.

Both spellings in use are accepted: transformers 4's `rope_theta` + `rope_scaling` and `torch_dtype`
(what published checkpoints carry) and transformers 5's `rope_parameters` and `dtype`.
"""
from __future__ import annotations

from typing import Any

from ir.dtypes import DType
from models.config import ModelConfig

_MISSING = object()
_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def get_field(d: dict[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    value = d.get(key, default)
    if value is _MISSING:
        raise ValueError(f"config.json: missing field {key!r}")
    if value is None and default is None:
        return None
    if value is None:
        raise ValueError(f"config.json: {key} must be {kind.__name__}, got null")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"config.json: {key} must be {kind.__name__}, got {value!r}")
    return value


def _rope(d: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
    """(theta, llama3 scaling or None, partial_rotary_factor)"""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"config.json: rope_scaling must be an object or null, got {params!r}")
    theta = get_field(params, "rope_theta", float, get_field(d, "rope_theta", float, 10000.0))
    partial = get_field(params, "partial_rotary_factor", float,
                        get_field(d, "partial_rotary_factor", float, 1.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None, partial
    if kind != "llama3":
        raise ValueError(f"config.json: rope type {kind!r} is not supported (supported: default, llama3)")
    missing = [k for k in _LLAMA3_ROPE_KEYS if k not in params]
    if missing:
        raise ValueError(f"config.json: llama3 rope_scaling lacks {', '.join(missing)}")
    return theta, {k: get_field(params, k, float) for k in _LLAMA3_ROPE_KEYS}, partial


def _eos_ids(d: dict[str, Any]) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"config.json: eos_token_id must be an int or a list of ints, got {eos!r}")
    return tuple(ids)


def _reject_unsupported(d: dict[str, Any]) -> None:
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json: hidden_act {act!r} is not supported (supported: silu)")
    window = d.get("sliding_window")
    if d.get("use_sliding_window", window is not None) and window is not None:
        raise ValueError(f"config.json: sliding_window={window} is not supported (full attention only)")


def parse_common(d: dict[str, Any], architecture: str, **family: Any) -> ModelConfig:
    """Builds a ModelConfig from the shared fields plus the family's own (`family` overrides)."""
    _reject_unsupported(d)
    theta, scaling, partial = _rope(d)
    heads = get_field(d, "num_attention_heads", int)
    hidden = get_field(d, "hidden_size", int)
    if heads <= 0:
        raise ValueError(f"config.json: num_attention_heads must be positive, got {heads}")
    dtype = d.get("torch_dtype", d.get("dtype", "bfloat16"))
    if not isinstance(dtype, str):
        raise ValueError(f"config.json: torch_dtype must be a string, got {dtype!r}")
    common = dict(
        architecture=architecture,
        vocab_size=get_field(d, "vocab_size", int),
        hidden_size=hidden,
        intermediate_size=get_field(d, "intermediate_size", int),
        num_hidden_layers=get_field(d, "num_hidden_layers", int),
        num_attention_heads=heads,
        num_key_value_heads=get_field(d, "num_key_value_heads", int, heads),
        head_dim=get_field(d, "head_dim", int, None) or hidden // heads,
        rms_norm_eps=get_field(d, "rms_norm_eps", float, 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        partial_rotary_factor=partial,
        max_position_embeddings=get_field(d, "max_position_embeddings", int, 4096),
        tie_word_embeddings=get_field(d, "tie_word_embeddings", bool, False),
        attention_bias=get_field(d, "attention_bias", bool, False),
        mlp_bias=get_field(d, "mlp_bias", bool, False),
        dtype=DType.parse(dtype),
        bos_token_id=get_field(d, "bos_token_id", int, None),
        eos_token_ids=_eos_ids(d),
    )
    return ModelConfig(**{**common, **family})
