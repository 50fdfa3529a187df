"""Text generation with the reference engine: tokenizer, optional chat template, engine, detokenizer."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from blinkc.engine import EngineConfig, ReferenceEngine
from blinkc.env import cache_dir
from blinkc.random_checkpoint import write_random_checkpoint
from blinkc.weights import load_weights
from dpu.tokenizer import Tokenizer
from ir import DType
from models.registry import ResolvedModel, resolve_model
from models.trace import trace_model
from runtime.sampling import SamplingParams


def random_checkpoint_dir(preset: str, seed: int) -> Path:
    """A random checkpoint of `preset`, written once into the cache and reused."""
    out = cache_dir() / "random" / f"{preset}-seed{seed}"
    if not (out / "tokenizer_config.json").exists():
        write_random_checkpoint(resolve_model(preset).hf_config, out, seed=seed)
    return out


class ChatSession:
    """One model on the reference engine: plain completions, or a conversation through the chat template."""

    def __init__(self, model: ResolvedModel, params: SamplingParams, dtype: DType | None = None) -> None:
        if model.checkpoint_dir is None:
            raise ValueError("this needs weights: give a checkpoint directory or --random-weights")
        self.tokenizer = Tokenizer.from_dir(model.checkpoint_dir)
        cfg = dataclasses.replace(model.config, dtype=dtype) if dtype else model.config
        graph = trace_model(model.definition, cfg)
        max_len = cfg.max_position_embeddings
        self.engine = ReferenceEngine(
            graph, load_weights(graph, model.checkpoint_dir),
            eos_token_ids=tuple(self.tokenizer.eos_token_ids) + cfg.eos_token_ids,
            config=EngineConfig(num_pages=-(-max_len // graph.meta["page_size"]), max_model_len=max_len))
        self.params = params
        self.messages: list[dict[str, str]] = []

    def complete(self, ids: list[int]) -> list[int]:
        with torch.inference_mode():
            (out,) = self.engine.generate([ids], self.params)
        return out

    def reply(self, message: str) -> str:
        """Adds a user message, generates the assistant's answer and keeps both in the history."""
        self.messages.append({"role": "user", "content": message})
        ids = self.tokenizer.apply_chat_template(self.messages, tokenize=True)
        answer = self.tokenizer.decode(self.complete(ids))
        self.messages.append({"role": "assistant", "content": answer})
        return answer


def generate_text(model: ResolvedModel, prompt: str, params: SamplingParams, *, chat: bool,
                  dtype: DType | None = None) -> tuple[str, list[int]]:
    """(generated text, generated ids) for one prompt."""
    session = ChatSession(model, params, dtype)
    if chat:
        ids = session.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True)
    else:
        ids = session.tokenizer.encode(prompt)
    out = session.complete(ids)
    return session.tokenizer.decode(out), out
