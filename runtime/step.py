"""Building the input tensors of one scheduler step from the sequences it advances."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's share of a step: `tokens` enter the cache at positions `start`, `start + 1`, ..."""

    tokens: Sequence[int]
    start: int
    pages: Sequence[int]
    wants_all_logits: bool = False  # logits for every token (oracle tests) or only the last

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("a step chunk needs at least one token")


def build_step(chunks: Sequence[SeqChunk], page_size: int, device: str | torch.device = "cpu"
               ) -> dict[str, torch.Tensor]:
    """The tensors named like the graph's step inputs (see models/blocks.py `Step`)."""
    ids, positions, slots, logits_rows, starts, context = [], [], [], [], [0], []
    max_pages = max(len(c.pages) for c in chunks)
    table = torch.zeros(len(chunks), max_pages, dtype=torch.int32)
    for b, chunk in enumerate(chunks):
        end = chunk.start + len(chunk.tokens)
        if len(chunk.pages) * page_size < end:
            raise ValueError(f"sequence {b}: {len(chunk.pages)} pages cannot hold {end} tokens")
        first_row = len(ids)
        ids += chunk.tokens
        positions += range(chunk.start, end)
        slots += [chunk.pages[p // page_size] * page_size + p % page_size for p in range(chunk.start, end)]
        logits_rows += range(first_row, len(ids)) if chunk.wants_all_logits else [len(ids) - 1]
        starts.append(len(ids))
        context.append(end)
        table[b, : len(chunk.pages)] = torch.tensor(chunk.pages, dtype=torch.int32)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    return {
        "input_ids": i32(ids), "positions": i32(positions), "seq_starts": i32(starts),
        "context_lens": i32(context), "page_table": table.to(device), "slot_mapping": i32(slots),
        "logits_indices": i32(logits_rows),
    }


def whole_prompts_step(sequences: Sequence[Sequence[int]], page_size: int, device: str | torch.device = "cpu"
                       ) -> tuple[dict[str, torch.Tensor], int]:
    """A step that prefills every sequence whole, on pages of its own numbered on from the last sequence's (the
    first from page 0), and the number of pages it takes: what the reference checks of a kernel's logits run on
    empty caches."""
    chunks, next_page = [], 0
    for tokens in sequences:
        pages = -(-len(tokens) // page_size)
        chunks.append(SeqChunk(tokens, 0, range(next_page, next_page + pages)))
        next_page += pages
    return build_step(chunks, page_size, device), next_page
