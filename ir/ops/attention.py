"""Attention ops: rotary embedding, appending K/V to the paged cache, and paged causal attention.

The KV cache of one layer is a single value `[2, N, PS, KVH, HD]` (keys then values, N pages of PS
tokens). `kv_store` returns the cache it wrote so that the attention that reads it depends on it.
A step's sequences are described by `seq_starts [B+1]` (where each sequence's tokens start in the
flattened token dim), `context_lens [B]` (tokens in the cache once this step's are added) and
`page_table [B, P]`; the last `q_len` cached tokens of a sequence are the ones this step brings.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ir.dtypes import DType
from ir.ops.registry import register_op, require

if TYPE_CHECKING:
    from ir.tracer import Tensor


def rope_inv_freq(rotary_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim / 2] in fp32, as HF computes them ("default" and "llama3")."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    if scaling is None:
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and sin [T, rotary_dim / 2] of the positions' angles, as HF computes them."""
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def _rope_type(inputs, attrs):
    x, positions = inputs
    require(positions.shape == (x.shape[0],), "rope: positions must be [T]")
    require(isinstance(x.shape[1], int) and x.shape[1] % attrs["head_dim"] == 0, "rope: x must be [T, heads*hd]")
    require(0 < attrs["rotary_dim"] <= attrs["head_dim"] and attrs["rotary_dim"] % 2 == 0, "rope: bad rotary_dim")
    return [(x.shape, x.dtype)]


@register_op("rope", 2, _rope_type)
def _rope(x, positions, *, head_dim: int, rotary_dim: int, theta: float, scaling: dict | None):
    cos, sin = rope_cos_sin(rope_inv_freq(rotary_dim, theta, scaling).to(x.device), positions)
    cos, sin = torch.cat([cos, cos], -1).to(x.dtype)[:, None], torch.cat([sin, sin], -1).to(x.dtype)[:, None]
    xh = x.view(x.shape[0], -1, head_dim)
    rot, keep = xh[..., :rotary_dim], xh[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated * sin, keep], dim=-1).reshape(x.shape)


def rope(x: Tensor, positions: Tensor, *, head_dim: int, rotary_dim: int, theta: float,
         scaling: dict[str, Any] | None) -> Tensor:
    """Rotates the first `rotary_dim` dims of each head (HF's rotate_half convention)."""
    return x.tracer.emit("rope", [x, positions], head_dim=head_dim, rotary_dim=rotary_dim,
                         theta=float(theta), scaling=scaling)[0]


def _kv_store_type(inputs, attrs):
    cache, k, v, slots = inputs
    require(len(cache.shape) == 5 and cache.shape[0] == 2, "kv_store: cache must be [2, N, PS, KVH, HD]")
    width = cache.shape[3] * cache.shape[4]
    require(k.shape == v.shape == (slots.shape[0], width), f"kv_store: k and v must be [T, {width}]")
    return [(cache.shape, cache.dtype)]


@register_op("kv_store", 4, _kv_store_type)
def _kv_store(cache, k, v, slots):
    flat = cache.view(2, -1, cache.shape[3], cache.shape[4])
    flat[0, slots.long()] = k.view(k.shape[0], cache.shape[3], cache.shape[4]).to(cache.dtype)
    flat[1, slots.long()] = v.view(v.shape[0], cache.shape[3], cache.shape[4]).to(cache.dtype)
    return cache


def kv_store(cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> Tensor:
    """Writes token t's k/v at flat slot `slot_mapping[t]` (page * PS + offset); returns the cache."""
    return cache.tracer.emit("kv_store", [cache, k, v, slot_mapping])[0]


def _attention_type(inputs, attrs):
    q, cache, seq_starts, context_lens, page_table = inputs
    require(q.shape[1] == attrs["num_heads"] * attrs["head_dim"], "paged_attention: q must be [T, H*HD]")
    require(cache.shape[3:] == (attrs["num_kv_heads"], attrs["head_dim"]), "paged_attention: cache heads mismatch")
    require(attrs["num_heads"] % attrs["num_kv_heads"] == 0, "paged_attention: heads not a multiple of kv heads")
    require(len(page_table.shape) == 2 and page_table.dtype == DType.i32,
            "paged_attention: page_table must be i32[B, P]")
    return [(q.shape, q.dtype)]


@register_op("paged_attention", 5, _attention_type)
def _paged_attention(q, cache, seq_starts, context_lens, page_table, *, num_heads: int,
                     num_kv_heads: int, head_dim: int, scale: float):
    out = torch.zeros_like(q)
    page_size = cache.shape[2]
    for b in range(context_lens.shape[0]):
        start, stop, ctx = int(seq_starts[b]), int(seq_starts[b + 1]), int(context_lens[b])
        if stop == start:
            continue
        pages = page_table[b, : -(-ctx // page_size)].long()
        k = cache[0, pages].reshape(-1, num_kv_heads, head_dim)[:ctx]
        v = cache[1, pages].reshape(-1, num_kv_heads, head_dim)[:ctx]
        k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)  # kv head j serves q heads j*rep..
        v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)
        qs = q[start:stop].view(stop - start, num_heads, head_dim)
        scores = torch.einsum("nhd,lhd->hnl", qs, k) * scale
        q_pos = ctx - (stop - start) + torch.arange(stop - start, device=q.device)
        future = torch.arange(ctx, device=q.device)[None, :] > q_pos[:, None]
        probs = scores.masked_fill(future, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
        out[start:stop] = torch.einsum("hnl,lhd->nhd", probs, v).reshape(stop - start, -1)
    return out


def paged_attention(q: Tensor, cache: Tensor, seq_starts: Tensor, context_lens: Tensor, page_table: Tensor,
                    *, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> Tensor:
    """Causal attention of each sequence's new tokens over its cached tokens: [T, H*HD]."""
    return q.tracer.emit("paged_attention", [q, cache, seq_starts, context_lens, page_table],
                         num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         scale=float(scale))[0]
