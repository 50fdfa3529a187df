"""runtime.step: the input tensors of one step, for a prefill chunk, a continued chunk and a decode, and for
whole prompts on pages of their own."""
from __future__ import annotations

import pytest
import torch

from runtime.step import SeqChunk, build_step, whole_prompts_step

PAGE_SIZE = 4
PREFILL = SeqChunk(tokens=[11, 12, 13, 14, 15, 16], start=0, pages=[7, 2])
CONTINUED = SeqChunk(tokens=[21, 22, 23, 24], start=5, pages=[0, 5, 9])  # positions 5..8
DECODE = SeqChunk(tokens=[31], start=9, pages=[4, 1, 3])  # position 9: page 3, offset 1


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _assert_inputs(step: dict[str, torch.Tensor], expected: dict[str, list]) -> None:
    assert set(step) == set(expected)
    for name, values in expected.items():
        assert step[name].dtype == torch.int32, name
        assert torch.equal(step[name], _i32(values)), f"{name}: {step[name].tolist()} != {values}"


def test_prefill_continued_chunk_and_decode_last_logits_only():
    step = build_step([PREFILL, CONTINUED, DECODE], PAGE_SIZE)
    _assert_inputs(step, {
        "input_ids": [11, 12, 13, 14, 15, 16, 21, 22, 23, 24, 31],
        "positions": [0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9],
        "seq_starts": [0, 6, 10, 11],
        "context_lens": [6, 9, 10],
        "page_table": [[7, 2, 0], [0, 5, 9], [4, 1, 3]],  # short page lists padded with 0
        "slot_mapping": [28, 29, 30, 31, 8, 9,  # page 7 offsets 0-3, page 2 offsets 0-1
                         21, 22, 23, 36,  # page 5 offsets 1-3, page 9 offset 0
                         13],  # page 3 offset 1
        "logits_indices": [5, 9, 10],
    })


def test_wants_all_logits_gives_every_row_of_that_sequence():
    chunks = [SeqChunk(PREFILL.tokens, 0, PREFILL.pages, wants_all_logits=True), CONTINUED,
              SeqChunk(DECODE.tokens, 9, DECODE.pages, wants_all_logits=True)]
    assert build_step(chunks, PAGE_SIZE)["logits_indices"].tolist() == [0, 1, 2, 3, 4, 5, 9, 10]


def test_page_table_pads_with_zeros_to_the_longest_list():
    chunks = [SeqChunk([1], 0, [6]), SeqChunk([2, 3, 4, 5, 6, 7, 8, 9, 10], 0, [8, 3, 1])]
    assert build_step(chunks, PAGE_SIZE)["page_table"].tolist() == [[6, 0, 0], [8, 3, 1]]


def test_pages_that_cannot_hold_the_tokens():
    short = SeqChunk(tokens=[1, 2, 3], start=6, pages=[0, 1])  # positions up to 8 need 3 pages of 4
    with pytest.raises(ValueError, match="sequence 1: 2 pages cannot hold 9 tokens"):
        build_step([PREFILL, short], PAGE_SIZE)


def test_chunk_needs_a_token():
    with pytest.raises(ValueError, match="at least one token"):
        SeqChunk(tokens=[], start=0, pages=[0])


def test_whole_prompts_take_consecutive_pages_of_their_own():
    step, num_pages = whole_prompts_step([[1, 2, 3, 4, 5], [6], [7, 8, 9, 10]], PAGE_SIZE)
    assert num_pages == 4
    assert step["page_table"].tolist() == [[0, 1], [2, 0], [3, 0]]
    assert step["positions"].tolist() == [0, 1, 2, 3, 4, 0, 0, 1, 2, 3]
    assert step["slot_mapping"].tolist() == [0, 1, 2, 3, 4, 8, 12, 13, 14, 15]
    assert step["logits_indices"].tolist() == [4, 5, 9]
