"""Baselines of the decode benchmark: the device's measured read bandwidth, the bytes one decode step must
read (the roofline's numerator), and a plain torch model of the same shapes timed per step.

The torch model is the yardstick the megakernel has to beat: cuBLAS GEMMs, `F.rms_norm`, HF's rotate_half
rotary (llama3 scaling included), a contiguous KV cache per layer, `F.scaled_dot_product_attention` with
`enable_gqa=True`, a SiLU-gated MLP (or Qwen3-MoE experts), and the LM head over the full vocabulary for
the last token of each sequence. It runs any Llama, Qwen3 or Qwen3-MoE `ModelConfig` on random weights
made on the device (Llama-3-8B is 16 GB, Qwen3-30B-A3B 61 GB: never through the host), with fused qkv and
gate_up matrices. Nothing happens at import.

Shapes: B sequences, T new tokens each, N = B*T, H hidden, D head dim, S cached tokens, V vocabulary.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ir.analysis import decode_bytes
from ir.ops.attention import rope_inv_freq
from ir.passes.pipeline import run_pipeline
from models.config import ModelConfig
from models.registry import ARCHITECTURES
from models.trace import trace_model

Weights = dict[str, torch.Tensor]  # one layer's weights, or the top level's, by (short) HF name
RESERVE_BYTES = 1 << 30  # left free for cuBLAS workspaces, graph pools and the allocator's slack
WEIGHT_STD = 0.02


class DoesNotFit(RuntimeError):
    """The weights, KV cache and workspace need more device memory than is free."""


# ---------------------------------------------------------------------------------------------------
# Measuring


def median_ms(fn: Callable[[], object], device: torch.device, *, num_warmup: int, num_reps: int) -> float:
    """Median wall time of `fn` in ms: CUDA events around each call on a GPU, the host clock on a CPU."""
    for _ in range(num_warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(num_reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(num_reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events)


def read_bandwidth_tbs(device: str | torch.device, *, num_bytes: int = 4_000_000_000, num_reps: int = 30) -> float:
    """Measured read bandwidth in TB/s: `torch.sum` over a random bf16 tensor of `num_bytes` (4 GB: far
    beyond L2, and under 2^31 elements so the reduction is one kernel), median of `num_reps` timed runs;
    bytes read / time."""
    device = torch.device(device)
    with torch.inference_mode():
        data = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
        ms = median_ms(data.sum, device, num_warmup=3, num_reps=num_reps)
    del data
    release_memory(device)
    return tb_per_s(num_bytes, ms)


def tb_per_s(num_bytes: int, ms: float) -> float:
    return num_bytes / (ms * 1e-3) / 1e12


def decode_bytes_per_step(cfg: ModelConfig, batch: int, context: int) -> int:
    """Bytes one decode step of `batch` sequences with `context` cached tokens each must read (weights once,
    embedding rows and routed experts only, plus the KV cache), from the traced and optimised IR graph."""
    graph = run_pipeline(trace_model(ARCHITECTURES[cfg.architecture], cfg))
    return decode_bytes(graph, batch=batch, context=context).total


# ---------------------------------------------------------------------------------------------------
# Memory


def release_memory(device: torch.device) -> None:
    """Returns what no live object holds (reference cycles included) to the device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def require_fits(device: torch.device, num_bytes: int, what: str) -> None:
    """Raises DoesNotFit unless `num_bytes` (plus a reserve) fit in the device's free memory now."""
    if device.type != "cuda":
        return
    release_memory(device)
    free, total = torch.cuda.mem_get_info(device)
    if num_bytes + RESERVE_BYTES > free:
        raise DoesNotFit(f"{what} need {num_bytes / 1e9:.1f} GB (+{RESERVE_BYTES / 1e9:.1f} GB reserve); "
                         f"{free / 1e9:.1f} GB of {total / 1e9:.1f} GB free")


def kv_cache_bytes(cfg: ModelConfig, batch: int, num_tokens: int) -> int:
    return 2 * cfg.num_hidden_layers * batch * cfg.kv_size * num_tokens * cfg.dtype.itemsize


def workspace_bytes(cfg: ModelConfig, num_tokens: int, *, is_moe_gathered: bool) -> int:
    """A generous bound on one forward pass's activations (and, for gathered MoE, the expert copies)."""
    width = max(2 * cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
    activations = 16 * num_tokens * width + 6 * num_tokens * cfg.vocab_size
    experts = 0
    if cfg.num_experts and is_moe_gathered:
        experts = num_tokens * cfg.num_experts_per_tok * 3 * cfg.moe_intermediate_size * cfg.hidden_size
    return (activations + experts) * cfg.dtype.itemsize


# ---------------------------------------------------------------------------------------------------
# Weights and caches


def layer_shapes(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """One decoder layer's weights; the qkv rows are q, k, v and the gate_up rows gate, then up (as HF)."""
    hidden = cfg.hidden_size
    shapes = {"input_layernorm": (hidden,), "qkv_proj": (cfg.q_size + 2 * cfg.kv_size, hidden),
              "o_proj": (hidden, cfg.q_size), "post_attention_layernorm": (hidden,)}
    if cfg.qk_norm:
        shapes |= {"q_norm": (cfg.head_dim,), "k_norm": (cfg.head_dim,)}
    if cfg.is_moe_layer(layer):
        num, size = cfg.num_experts, cfg.moe_intermediate_size
        shapes |= {"gate": (num, hidden), "experts.gate_up_proj": (num, 2 * size, hidden),
                   "experts.down_proj": (num, hidden, size)}
    else:
        shapes |= {"gate_up_proj": (2 * cfg.intermediate_size, hidden), "down_proj": (hidden, cfg.intermediate_size)}
    return shapes


def top_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    shapes = {"embed_tokens": (cfg.vocab_size, cfg.hidden_size), "norm": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def weight_bytes(cfg: ModelConfig) -> int:
    groups = [top_shapes(cfg)] + [layer_shapes(cfg, i) for i in range(cfg.num_hidden_layers)]
    return sum(math.prod(shape) for shapes in groups for shape in shapes.values()) * cfg.dtype.itemsize


@dataclass
class ModelWeights:
    top: Weights  # embed_tokens, norm, lm_head (absent when tied)
    layers: list[Weights]


def random_weights(cfg: ModelConfig, device: str | torch.device) -> ModelWeights:
    """Random weights made directly on `device`: matrices N(0, 0.02), norm weights uniform in [0.9, 1.1]."""
    device = torch.device(device)
    check_supported(cfg)
    require_fits(device, weight_bytes(cfg), f"{cfg.architecture} weights")

    def make(shapes: dict[str, tuple[int, ...]]) -> Weights:
        return {name: _random_weight(shape, cfg.dtype.torch, device) for name, shape in shapes.items()}

    with torch.inference_mode():
        return ModelWeights(make(top_shapes(cfg)), [make(layer_shapes(cfg, i)) for i in range(cfg.num_hidden_layers)])


def _random_weight(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    weight = torch.empty(shape, dtype=dtype, device=device)
    return weight.uniform_(0.9, 1.1) if len(shape) == 1 else weight.normal_(0.0, WEIGHT_STD)


def check_supported(cfg: ModelConfig) -> None:
    if cfg.attention_bias or cfg.mlp_bias:
        raise ValueError(f"{cfg.architecture}: the torch baseline has no attention or MLP biases")


@dataclass
class KVCache:
    k: torch.Tensor  # [B, KVH, S, D]
    v: torch.Tensor  # [B, KVH, S, D]


def random_kv_caches(cfg: ModelConfig, batch: int, num_tokens: int, device: torch.device) -> list[KVCache]:
    """One contiguous cache per layer holding `num_tokens` positions, filled with N(0, 1) (never zeros)."""
    shape = (batch, cfg.num_key_value_heads, num_tokens, cfg.head_dim)

    def make() -> torch.Tensor:
        return torch.empty(shape, dtype=cfg.dtype.torch, device=device).normal_()

    with torch.inference_mode():
        return [KVCache(make(), make()) for _ in range(cfg.num_hidden_layers)]


# ---------------------------------------------------------------------------------------------------
# The model


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] -> silu(gate) * up: [..., I]"""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF rotate_half rotary on the first R dims of each head. x: [B, T, heads, D]; cos, sin: [T, 1, R]"""
    rotary_dim = cos.shape[-1]
    rot, keep = x[..., :rotary_dim], x[..., rotary_dim:]
    first, second = rot.chunk(2, dim=-1)
    rotated = rot * cos + torch.cat([-second, first], dim=-1) * sin
    return rotated if keep.shape[-1] == 0 else torch.cat([rotated, keep], dim=-1)


EXPERT_MODES = {
    "grouped": "grouped GEMMs (torch._grouped_mm)",
    "gathered": "weights gathered per (token, choice), bmm",
    "looped": "an eager loop over the experts",
}


def grouped_experts_available(device: str | torch.device) -> bool:
    """Whether torch has a grouped GEMM for `device` (`torch._grouped_mm`: CUTLASS on sm_90 and later)."""
    device = torch.device(device)
    if not hasattr(torch, "_grouped_mm"):
        return False
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)


def expert_mode(device: str | torch.device, *, prefill: bool) -> str:
    """How the torch baseline runs routed experts on `device` (EXPERT_MODES): grouped GEMMs where torch has
    them, as fused MoE kernels work; else gathered weights for a decode step (a CUDA graph can hold it) and an
    eager loop for a prefill (gathering would copy gigabytes)."""
    if grouped_experts_available(device):
        return "grouped"
    return "looped" if prefill else "gathered"


class TorchModel:
    """One forward pass of B sequences that each bring T tokens at `positions`; their caches must hold
    exactly positions[-1] + 1 tokens. Routed experts run as `experts` says (EXPERT_MODES): grouped and
    gathered have no host sync, so a CUDA graph can hold them; looped has data-dependent shapes (eager only)."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, *, experts: str) -> None:
        if experts not in EXPERT_MODES:
            raise ValueError(f"unknown experts mode {experts!r} (known: {', '.join(EXPERT_MODES)})")
        self.cfg, self.weights, self.experts = cfg, weights, experts
        device = weights.top["norm"].device
        self.inv_freq = rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling).to(device)  # [R/2]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """ids: [B, T], positions: [T] (shared by every sequence) -> fp32 logits of each last token [B, V]"""
        batch, num_new = ids.shape
        top = self.weights.top
        x = top["embed_tokens"][ids].view(batch * num_new, -1)  # x: [N, H]
        cos, sin = self.rope_cos_sin(positions)  # [T, 1, R]
        for layer, cache in zip(self.weights.layers, caches, strict=True):
            h = self.norm(x, layer["input_layernorm"])
            x = x + self.attention(layer, h.view(batch, num_new, -1), cos, sin, positions, cache)
            x = x + self.mlp(layer, self.norm(x, layer["post_attention_layernorm"]))
        last = x.view(batch, num_new, -1)[:, -1]  # [B, H]
        head = top.get("lm_head", top["embed_tokens"])
        return F.linear(self.norm(last, top["norm"]), head).float()  # [B, V]

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.cfg.rms_norm_eps)

    def rope_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, R/2]
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]  # [T, 1, R]
        dtype = self.cfg.dtype.torch
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def attention(self, layer: Weights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """h: [B, T, H] -> [N, H]; writes the new k, v into the cache at `positions`."""
        cfg = self.cfg
        batch, num_new, _ = h.shape
        qkv = F.linear(h, layer["qkv_proj"]).view(batch, num_new, -1, cfg.head_dim)  # [B, T, QH + 2 KVH, D]
        q, k, v = qkv.split([cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_key_value_heads], dim=2)
        if cfg.qk_norm:
            q, k = self.norm(q, layer["q_norm"]), self.norm(k, layer["k_norm"])
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        cache.k.index_copy_(2, positions, k.transpose(1, 2))  # [B, KVH, T, D] into [B, KVH, S, D]
        cache.v.index_copy_(2, positions, v.transpose(1, 2))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), cache.k, cache.v, is_causal=num_new > 1,
                                           enable_gqa=True)  # [B, QH, T, D]
        return F.linear(o.transpose(1, 2).reshape(batch * num_new, -1), layer["o_proj"])

    def mlp(self, layer: Weights, h: torch.Tensor) -> torch.Tensor:
        """h: [N, H] -> [N, H]"""
        if "gate" not in layer:
            return F.linear(silu_mul(F.linear(h, layer["gate_up_proj"])), layer["down_proj"])
        weights, experts = self.route(layer, h)
        run = {"grouped": self.experts_grouped, "gathered": self.experts_gathered, "looped": self.experts_looped}
        return run[self.experts](layer, h, weights, experts)

    def route(self, layer: Weights, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the router logits, top-k, renormalised if norm_topk_prob: ([N, k], experts [N, k])"""
        probs = F.linear(h, layer["gate"]).softmax(-1, dtype=torch.float32)  # [N, E]
        weights, experts = probs.topk(self.cfg.num_experts_per_tok, dim=-1)
        if self.cfg.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(h.dtype), experts

    def experts_grouped(self, layer: Weights, h: torch.Tensor, weights: torch.Tensor,
                        experts: torch.Tensor) -> torch.Tensor:
        """The (token, slot) pairs sorted by expert, then one grouped GEMM a matrix: each expert's weights read
        once for all of its rows. The counts come from a scatter, not `bincount` (which reads its input's
        maximum back to the host), so a CUDA graph can hold the whole."""
        num_tokens, top_k = experts.shape
        chosen = experts.flatten()  # [N*k]
        order = chosen.argsort(stable=True)
        counts = torch.zeros(self.cfg.num_experts, dtype=torch.int32, device=h.device)
        counts.scatter_add_(0, chosen, torch.ones_like(chosen, dtype=torch.int32))
        ends = counts.cumsum(0, dtype=torch.int32)  # each expert's rows end here in the sorted order
        x = h[order // top_k]  # [N*k, H]
        act = silu_mul(torch._grouped_mm(x, layer["experts.gate_up_proj"].transpose(1, 2), offs=ends))
        y_sorted = torch._grouped_mm(act, layer["experts.down_proj"].transpose(1, 2), offs=ends)  # [N*k, H]
        y = torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)
        return (y.view(num_tokens, top_k, -1) * weights.unsqueeze(-1)).sum(1)  # [N, H]

    def experts_gathered(self, layer: Weights, h: torch.Tensor, weights: torch.Tensor,
                         experts: torch.Tensor) -> torch.Tensor:
        """Each (token, slot) gathers (copies) its expert's weights, then one bmm per matrix."""
        num_tokens, top_k = experts.shape
        chosen = experts.flatten()  # [N*k]
        x = h.repeat_interleave(top_k, dim=0).unsqueeze(1)  # [N*k, 1, H]
        gate_up = layer["experts.gate_up_proj"][chosen].transpose(1, 2)  # [N*k, H, 2I]
        act = silu_mul(torch.bmm(x, gate_up))  # [N*k, 1, I]
        del gate_up  # free the copy before gathering the down matrices
        y = torch.bmm(act, layer["experts.down_proj"][chosen].transpose(1, 2))  # [N*k, 1, H]
        return (y.view(num_tokens, top_k, -1) * weights.unsqueeze(-1)).sum(1)  # [N, H]

    def experts_looped(self, layer: Weights, h: torch.Tensor, weights: torch.Tensor,
                       experts: torch.Tensor) -> torch.Tensor:
        """One GEMM pair per routed expert over the tokens that chose it (host sync: eager only)."""
        out = torch.zeros_like(h)
        for expert in experts.unique().tolist():
            token, slot = torch.where(experts == expert)
            act = silu_mul(F.linear(h[token], layer["experts.gate_up_proj"][expert]))
            y = F.linear(act, layer["experts.down_proj"][expert]) * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out


# ---------------------------------------------------------------------------------------------------
# Steps and their timings


Step = Callable[[], torch.Tensor]


def make_decode_step(cfg: ModelConfig, batch: int, context: int, device: str | torch.device,
                     weights: ModelWeights | None = None, experts: str | None = None) -> Step:
    """One decode step over static inputs: `batch` sequences holding `context` tokens each bring one more
    (the cache holds context + 1 positions; the new token's k, v land in the last). Returns logits [B, V].
    `experts`: how routed experts run (EXPERT_MODES; default `expert_mode`)."""
    device = torch.device(device)
    weights = random_weights(cfg, device) if weights is None else weights
    experts = experts or expert_mode(device, prefill=False)
    require_fits(device, kv_cache_bytes(cfg, batch, context + 1)
                 + workspace_bytes(cfg, batch, is_moe_gathered=experts == "gathered"),
                 f"KV cache ({batch} x {context + 1} tokens) and workspace")
    caches = random_kv_caches(cfg, batch, context + 1, device)
    model = TorchModel(cfg, weights, experts=experts)
    ids = torch.randint(cfg.vocab_size, (batch, 1), device=device)  # [B, 1]
    positions = torch.tensor([context], device=device)  # [1]
    return lambda: model.forward(ids, positions, caches)


def make_prefill_step(cfg: ModelConfig, prompt_len: int, device: str | torch.device,
                      weights: ModelWeights | None = None, experts: str | None = None,
                      ids: torch.Tensor | None = None) -> Step:
    """One prompt of `prompt_len` tokens (batch 1) into an empty cache; returns its last token's logits [1, V].
    `experts`: as for `make_decode_step`; `ids`: the prompt's [1, T] tensor on `device`, which the step reads
    each time it runs (default: random ids)."""
    device = torch.device(device)
    weights = random_weights(cfg, device) if weights is None else weights
    experts = experts or expert_mode(device, prefill=True)
    require_fits(device, kv_cache_bytes(cfg, 1, prompt_len)
                 + workspace_bytes(cfg, prompt_len, is_moe_gathered=experts == "gathered"),
                 f"KV cache ({prompt_len} tokens) and workspace")
    caches = random_kv_caches(cfg, 1, prompt_len, device)
    model = TorchModel(cfg, weights, experts=experts)
    if ids is None:
        ids = torch.randint(cfg.vocab_size, (1, prompt_len), device=device)  # [1, T]
    positions = torch.arange(prompt_len, device=device)  # [T]
    return lambda: model.forward(ids, positions, caches)


def capture_graph(step: Step) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`step` captured in one CUDA graph after two warm-up runs on a side stream; returns the graph and the
    tensor each replay writes its output into."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # cuBLAS handles and heuristics, SDPA backend choice, allocator warm-up
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()
    return graph, output


def torch_decode_ms(cfg: ModelConfig, batch: int, context: int, device: str | torch.device, *,
                    weights: ModelWeights | None = None, experts: str | None = None, num_reps: int = 50) -> float:
    """Median ms of one decode step captured in ONE CUDA graph (5 warm-up replays, then `num_reps`
    replays each timed by CUDA events). Random weights are made here unless `weights` are given."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, got {device}: use torch_decode_eager_ms")
    with torch.inference_mode():
        graph, _ = capture_graph(make_decode_step(cfg, batch, context, device, weights, experts))
        return median_ms(graph.replay, device, num_warmup=5, num_reps=num_reps)


def torch_decode_eager_ms(cfg: ModelConfig, batch: int, context: int, device: str | torch.device, *,
                          weights: ModelWeights | None = None, num_reps: int = 30) -> float:
    """Median ms of one decode step launched eagerly, kernel by kernel (host launch overhead included)."""
    device = torch.device(device)
    with torch.inference_mode():
        step = make_decode_step(cfg, batch, context, device, weights)
        return median_ms(step, device, num_warmup=3, num_reps=num_reps)


def torch_prefill_ms(cfg: ModelConfig, prompt_len: int, device: str | torch.device, *,
                     weights: ModelWeights | None = None, experts: str | None = None, num_reps: int = 10) -> float:
    """Median ms to prefill one prompt of `prompt_len` tokens at batch 1 and get its first token's logits:
    the time-to-first-token baseline (cuBLAS GEMMs, SDPA with is_causal=True, KV writes included).

    On a GPU the pass is captured in ONE CUDA graph and replayed, as for decode, unless an MoE model's experts
    run as an eager loop (`expert_mode`: data-dependent shapes). On a CPU: eager.
    """
    return torch_ttft_ms(cfg, prompt_len, device, weights=weights, experts=experts, num_reps=num_reps)[0]


def torch_ttft_ms(cfg: ModelConfig, prompt_len: int, device: str | torch.device, *,
                  weights: ModelWeights | None = None, experts: str | None = None,
                  num_reps: int = 10) -> tuple[float, float]:
    """`torch_prefill_ms`'s median, and the first token host to host as a user gets it: the prompt's ids
    copied from page-locked host memory into the pass's input, the pass, a greedy pick of the token and its
    copy back (best of `num_reps`, as `megakernel_tpot.ttft_ms` times the megakernel's `generate`)."""
    device = torch.device(device)
    with torch.inference_mode():
        experts = experts or expert_mode(device, prefill=True)
        ids = torch.zeros(1, prompt_len, dtype=torch.long, device=device)
        ids.copy_(torch.randint(cfg.vocab_size, (1, prompt_len)))
        step = make_prefill_step(cfg, prompt_len, device, weights, experts, ids=ids)
        run = step
        if device.type == "cuda" and (not cfg.num_experts or experts != "looped"):
            graph, logits = capture_graph(step)

            def run() -> torch.Tensor:
                graph.replay()
                return logits
        gpu_ms = median_ms(run, device, num_warmup=3, num_reps=num_reps)
        host_ids = ids.cpu().pin_memory() if device.type == "cuda" else ids.clone()
        times = []
        for _ in range(num_reps):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            ids.copy_(host_ids, non_blocking=True)
            run().argmax(-1).item()
            times.append((time.perf_counter() - start) * 1e3)
        return gpu_ms, min(times)
