"""The shared vocabulary every model definition is built from.

Blocks declare their weights under HF's parameter names (so checkpoint mapping stays a table) and
trace ops on the `Step` inputs. Shapes: `T` tokens in the step, `H` hidden size.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ir import DType, Source, Tensor, Tracer, ops
from models.config import ModelConfig


@dataclass(frozen=True)
class Step:
    """The traced inputs of one scheduler step (see ir/ops/attention.py for their meaning)."""

    input_ids: Tensor  # i32[T]
    positions: Tensor  # i32[T]
    seq_starts: Tensor  # i32[B+1]
    context_lens: Tensor  # i32[B]
    page_table: Tensor  # i32[B, P]
    slot_mapping: Tensor  # i32[T]
    logits_indices: Tensor  # i32[L]: the token rows whose logits the step returns


def declare_step(tr: Tracer) -> Step:
    i32 = DType.i32
    return Step(
        input_ids=tr.input("input_ids", ("T",), i32),
        positions=tr.input("positions", ("T",), i32),
        seq_starts=tr.input("seq_starts", ("B+1",), i32),
        context_lens=tr.input("context_lens", ("B",), i32),
        page_table=tr.input("page_table", ("B", "P"), i32),
        slot_mapping=tr.input("slot_mapping", ("T",), i32),
        logits_indices=tr.input("logits_indices", ("L",), i32),
    )


def linear(tr: Tracer, name: str, x: Tensor, out_features: int, bias: bool, dtype: DType) -> Tensor:
    """`name`.weight [out, in] (and `name`.bias [out])."""
    w = tr.param(f"{name}.weight", (out_features, x.shape[1]), dtype)
    b = tr.param(f"{name}.bias", (out_features,), dtype) if bias else None
    return ops.linear(x, w, b)


def rms_norm(tr: Tracer, name: str, x: Tensor, cfg: ModelConfig, group: int | None = None) -> Tensor:
    w = tr.param(f"{name}.weight", (group or x.shape[1],), cfg.dtype)
    return ops.rms_norm(x, w, cfg.rms_norm_eps, group)


QKV = tuple[Tensor, Tensor, Tensor]
QKVProjection = Callable[[Tracer, str, Tensor, ModelConfig], QKV]


def qkv_separate(tr: Tracer, prefix: str, x: Tensor, cfg: ModelConfig) -> QKV:
    """Llama/Qwen: q_proj, k_proj, v_proj."""
    return tuple(linear(tr, f"{prefix}.{name}", x, size, cfg.attention_bias, cfg.dtype)
                 for name, size in (("q_proj", cfg.q_size), ("k_proj", cfg.kv_size), ("v_proj", cfg.kv_size)))


def qkv_fused(tr: Tracer, prefix: str, x: Tensor, cfg: ModelConfig) -> QKV:
    """Phi-3: one qkv_proj whose rows are q, then k, then v."""
    qkv = linear(tr, f"{prefix}.qkv_proj", x, cfg.q_size + 2 * cfg.kv_size, cfg.attention_bias, cfg.dtype)
    q_end, k_end = cfg.q_size, cfg.q_size + cfg.kv_size
    return ops.slice_cols(qkv, 0, q_end), ops.slice_cols(qkv, q_end, k_end), ops.slice_cols(qkv, k_end, qkv.shape[1])


def attention(tr: Tracer, prefix: str, x: Tensor, step: Step, cache: Tensor, cfg: ModelConfig,
              project_qkv: QKVProjection) -> Tensor:
    """Grouped-query attention over the paged KV cache, with optional per-head q/k RMSNorm (Qwen3)."""
    q, k, v = project_qkv(tr, prefix, x, cfg)
    if cfg.qk_norm:
        q = rms_norm(tr, f"{prefix}.q_norm", q, cfg, group=cfg.head_dim)
        k = rms_norm(tr, f"{prefix}.k_norm", k, cfg, group=cfg.head_dim)
    rotary = dict(head_dim=cfg.head_dim, rotary_dim=cfg.rotary_dim, theta=cfg.rope_theta, scaling=cfg.rope_scaling)
    q, k = ops.rope(q, step.positions, **rotary), ops.rope(k, step.positions, **rotary)
    cache = ops.kv_store(cache, k, v, step.slot_mapping)
    o = ops.paged_attention(q, cache, step.seq_starts, step.context_lens, step.page_table,
                            num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                            head_dim=cfg.head_dim, scale=cfg.head_dim ** -0.5)
    return linear(tr, f"{prefix}.o_proj", o, cfg.hidden_size, cfg.attention_bias, cfg.dtype)


def gated_mlp(tr: Tracer, prefix: str, x: Tensor, cfg: ModelConfig) -> Tensor:
    """Llama/Qwen: down_proj(silu(gate_proj(x)) * up_proj(x))."""
    gate = linear(tr, f"{prefix}.gate_proj", x, cfg.intermediate_size, cfg.mlp_bias, cfg.dtype)
    up = linear(tr, f"{prefix}.up_proj", x, cfg.intermediate_size, cfg.mlp_bias, cfg.dtype)
    return linear(tr, f"{prefix}.down_proj", ops.mul(ops.silu(gate), up), cfg.hidden_size, cfg.mlp_bias, cfg.dtype)


def gated_mlp_fused(tr: Tracer, prefix: str, x: Tensor, cfg: ModelConfig) -> Tensor:
    """Phi-3: gate_up_proj whose first half of rows is the gate."""
    size = cfg.intermediate_size
    gate_up = linear(tr, f"{prefix}.gate_up_proj", x, 2 * size, cfg.mlp_bias, cfg.dtype)
    h = ops.mul(ops.silu(ops.slice_cols(gate_up, 0, size)), ops.slice_cols(gate_up, size, 2 * size))
    return linear(tr, f"{prefix}.down_proj", h, cfg.hidden_size, cfg.mlp_bias, cfg.dtype)


def sparse_moe(tr: Tracer, prefix: str, x: Tensor, cfg: ModelConfig) -> Tensor:
    """Qwen3-MoE: router `gate`, softmax, top-k (renormalised if norm_topk_prob), experts' gated MLPs.

    The checkpoint stores each expert's gate/up/down separately; the experts' weights are stacked
    into [E, 2I, H] and [E, H, I] params as they load.
    """
    num, size, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    logits = linear(tr, f"{prefix}.gate", x, num, False, cfg.dtype)
    weights, experts = ops.moe_route(logits, top_k=cfg.num_experts_per_tok, normalize=cfg.norm_topk_prob)
    expert = f"{prefix}.experts.{{}}"
    gate_up = tr.param(f"{prefix}.experts.gate_up_proj", (num, 2 * size, hidden), cfg.dtype, [
        Source(f"{expert.format(e)}.{name}.weight", (e, (lo, lo + size)))
        for e in range(num) for name, lo in (("gate_proj", 0), ("up_proj", size))])
    down = tr.param(f"{prefix}.experts.down_proj", (num, hidden, size), cfg.dtype, [
        Source(f"{expert.format(e)}.down_proj.weight", (e,)) for e in range(num)])
    return ops.moe_experts(x, weights, experts, gate_up, down)


MLP = Callable[[Tracer, str, Tensor, ModelConfig], Tensor]


def decoder_lm(tr: Tracer, cfg: ModelConfig, step: Step, caches: list[Tensor], project_qkv: QKVProjection,
               mlp_for_layer: Callable[[int], MLP]) -> Tensor:
    """The pre-norm decoder stack shared by every family; returns fp32 logits [L, V]."""
    embed = tr.param("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size), cfg.dtype)
    x = ops.embedding(step.input_ids, embed)  # x: [T, H]
    for i, cache in enumerate(caches):
        layer = f"model.layers.{i}"
        h = rms_norm(tr, f"{layer}.input_layernorm", x, cfg)
        x = ops.add(x, attention(tr, f"{layer}.self_attn", h, step, cache, cfg, project_qkv))
        h = rms_norm(tr, f"{layer}.post_attention_layernorm", x, cfg)
        x = ops.add(x, mlp_for_layer(i)(tr, f"{layer}.mlp", h, cfg))
    x = ops.gather_rows(x, step.logits_indices)  # only the rows that need logits: [L, H]
    x = rms_norm(tr, "model.norm", x, cfg)
    if cfg.tie_word_embeddings:
        head = embed
    else:
        head = tr.param("lm_head.weight", (cfg.vocab_size, cfg.hidden_size), cfg.dtype)
    return ops.cast(ops.linear(x, head), DType.f32)
