"""The step log GPU builds keep (codegen/templates/megakernel.py.j2) and how the decode benchmark reads it."""
from __future__ import annotations

import pytest
import torch

from benchmarks.megakernel_tpot import Variant, full_batch_step_ms
from runtime.megakernel import parse_step_log


def _words(entries: list[tuple[int, int, int]], capacity: int = 6) -> torch.Tensor:
    """The int32 words the kernel writes: timer low word (as a signed int32), high word, tokens, sequences."""
    words = torch.zeros(capacity * 4, dtype=torch.int32)
    for step, (clock, tokens, seqs) in enumerate(entries):
        low = clock & 0xFFFFFFFF
        words[step * 4:step * 4 + 4] = torch.tensor([low - (1 << 32) if low >= 1 << 31 else low, clock >> 32,
                                                     tokens, seqs], dtype=torch.int32)
    return words


def test_the_timer_is_rebuilt_from_both_words_and_unrun_steps_are_dropped():
    entries = [(0x1_7FFF_FFF0, 512, 1), (0x1_8000_0100, 1, 1), (0x2_0000_0000, 1, 1)]  # low word sign bit set
    assert parse_step_log(_words(entries)) == entries


def test_tpot_is_the_median_step_that_decodes_the_whole_batch():
    ms = 1_000_000
    steps = [(0, 2048, 4),  # prefill
             (30 * ms, 1024, 8),  # prefill chunks and the first sequences' decode tokens
             (50 * ms, 8, 8), (57 * ms, 8, 8), (65 * ms, 8, 8), (72 * ms, 5, 5),  # 7, 8, 7 ms at batch 8
             (76 * ms, 0, 0)]
    assert full_batch_step_ms(steps, 8) == pytest.approx(7.0)
    with pytest.raises(RuntimeError, match="no step decoded all 16 sequences"):
        full_batch_step_ms(steps, 16)


def test_variant_specs():
    decode = Variant.parse("64x512:attention_stages=3,wide_n=128")
    assert (decode.batch, decode.context, decode.is_ttft) == (64, 512, False)
    assert decode.config(16).attention_stages == 3 and decode.config(16).max_batch == 64
    ttft = Variant.parse("ttft2048")
    assert (ttft.context, ttft.is_ttft, ttft.fields) == (2048, True, {})
    assert ttft.config(16).max_tokens_per_step == 2048
