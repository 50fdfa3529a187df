"""Each op's reference implementation against an independent computation, on irregular shapes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import _compute_llama3_parameters

from ir import DType, Tracer, ops
from ir.ops import get_op, rope_inv_freq
from tests.conftest import assert_close

LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}


def reference(op: str):
    return get_op(op).reference


def test_llama3_rope_frequencies_match_transformers():
    config = LlamaConfig(hidden_size=96, num_attention_heads=6, rope_theta=500000.0,
                         rope_scaling={"rope_type": "llama3", **LLAMA3_SCALING})
    expected, _ = _compute_llama3_parameters(config)
    assert torch.equal(rope_inv_freq(16, 500000.0, LLAMA3_SCALING), expected)


def test_partial_rope_leaves_the_tail_of_each_head_alone():
    x, positions = torch.randn(5, 3 * 12), torch.tensor([0, 3, 7, 100, 2])
    out = reference("rope")(x, positions, head_dim=12, rotary_dim=4, theta=10000.0, scaling=None)
    assert torch.equal(out.view(5, 3, 12)[..., 4:], x.view(5, 3, 12)[..., 4:])
    assert not torch.allclose(out.view(5, 3, 12)[1:, :, :4], x.view(5, 3, 12)[1:, :, :4])
    # rotation keeps each pair's norm: first half / second half of the rotary dims pair up
    rot_in, rot_out = x.view(5, 3, 12)[..., :4], out.view(5, 3, 12)[..., :4]
    pair_norm = lambda t: t[..., :2] ** 2 + t[..., 2:] ** 2
    assert_close(pair_norm(rot_out), pair_norm(rot_in))


def _dense_causal(q, k, v, num_heads, num_kv_heads):
    """SDPA over contiguous keys; q [n, H, D] are the last n of L positions."""
    n, length = q.shape[0], k.shape[0]
    rep = num_heads // num_kv_heads
    mask = torch.ones(n, length, dtype=torch.bool).tril(diagonal=length - n)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1),
                                         v.repeat_interleave(rep, 1).transpose(0, 1), attn_mask=mask)
    return out.transpose(0, 1)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(6, 2, 16), (4, 1, 24), (3, 3, 8)])
def test_paged_attention_matches_dense_causal_attention(num_heads, num_kv_heads, head_dim):
    page_size, num_pages = 4, 40
    q_lens, ctx_lens = [5, 1, 3, 1], [5, 9, 14, 1]  # prefill, decode, continued chunk, first token
    cache = torch.randn(2, num_pages, page_size, num_kv_heads, head_dim)
    perm = torch.randperm(num_pages).tolist()
    tables, keys, values = [], [], []
    for ctx in ctx_lens:
        pages = [perm.pop() for _ in range(-(-ctx // page_size))]
        tables.append(pages + [0] * (4 - len(pages)))
        flat = cache[:, pages].reshape(2, -1, num_kv_heads, head_dim)[:, :ctx]
        keys.append(flat[0]), values.append(flat[1])
    q = torch.randn(sum(q_lens), num_heads * head_dim)
    starts = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    out = reference("paged_attention")(q, cache, starts, torch.tensor(ctx_lens, dtype=torch.int32),
                                       torch.tensor(tables, dtype=torch.int32), num_heads=num_heads,
                                       num_kv_heads=num_kv_heads, head_dim=head_dim, scale=head_dim ** -0.5)
    for b, (n, lo) in enumerate(zip(q_lens, starts[:-1].tolist())):
        qs = q[lo:lo + n].view(n, num_heads, head_dim)
        expected = _dense_causal(qs, keys[b], values[b], num_heads, num_kv_heads).reshape(n, -1)
        assert_close(out[lo:lo + n], expected)


def test_kv_store_writes_each_token_at_its_slot():
    cache = torch.zeros(2, 6, 4, 2, 3)
    k, v = torch.randn(3, 6), torch.randn(3, 6)
    slots = torch.tensor([5, 22, 0], dtype=torch.int32)
    out = reference("kv_store")(cache, k, v, slots)
    assert out.data_ptr() == cache.data_ptr()
    for t, slot in enumerate(slots.tolist()):
        assert torch.equal(cache[0, slot // 4, slot % 4].flatten(), k[t])
        assert torch.equal(cache[1, slot // 4, slot % 4].flatten(), v[t])
    assert int((cache != 0).sum()) == 2 * 3 * 6


@pytest.mark.parametrize("normalize", [True, False])
def test_moe_route_picks_the_top_k_softmax_probabilities(normalize):
    logits = torch.randn(7, 6)
    weights, experts = reference("moe_route")(logits, top_k=2, normalize=normalize)
    probs = logits.softmax(-1)
    for t in range(7):
        top = probs[t].argsort(descending=True)[:2]
        assert experts[t].tolist() == top.tolist()
        expected = probs[t, top] / (probs[t, top].sum() if normalize else 1)
        assert_close(weights[t], expected)


def test_moe_experts_match_a_per_token_loop():
    tokens, hidden, inter, num_experts = 5, 8, 6, 4
    x = torch.randn(tokens, hidden)
    gate_up, down = torch.randn(num_experts, 2 * inter, hidden), torch.randn(num_experts, hidden, inter)
    weights, experts = torch.rand(tokens, 2), torch.tensor([[0, 3], [3, 1], [2, 0], [1, 2], [3, 0]])
    out = reference("moe_experts")(x, weights, experts, gate_up, down)
    for t in range(tokens):
        expected = sum(weights[t, j] * (down[e] @ (F.silu(gate_up[e, :inter] @ x[t]) * (gate_up[e, inter:] @ x[t])))
                       for j, e in enumerate(experts[t].tolist()))
        assert_close(out[t], expected)


def test_grouped_rms_norm_normalises_each_head_separately():
    x, w = torch.randn(3, 4 * 5) * 7, torch.rand(5) + 0.5
    out = reference("rms_norm")(x, w, eps=1e-6, group=5).view(3, 4, 5)
    expected = x.view(3, 4, 5) / x.view(3, 4, 5).pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w
    assert_close(out, expected)


def test_shape_rules_reject_mismatched_operands():
    tr = Tracer()
    x = tr.input("x", ("T", 16), DType.bf16)
    with pytest.raises(ValueError, match="linear: x has 16 features"):
        ops.linear(x, tr.param("w", (8, 12), DType.bf16))
    with pytest.raises(ValueError, match="rms_norm"):
        ops.rms_norm(x, tr.param("n", (5,), DType.bf16), 1e-6, group=5)
    with pytest.raises(ValueError, match="unknown op"):
        tr.emit("no_such_op", [x])
    with pytest.raises(ValueError, match="takes 2 or 3 inputs"):
        tr.emit("linear", [x])


def test_symbolic_dims_flow_through_shape_rules():
    tr = Tracer()
    x = tr.input("x", ("T", 16), DType.bf16)
    rows = tr.input("rows", ("L",), DType.i32)
    y = ops.gather_rows(ops.linear(x, tr.param("w", (24, 16), DType.bf16)), rows)
    assert y.shape == ("L", 24) and ops.cast(y, DType.f32).dtype == DType.f32
