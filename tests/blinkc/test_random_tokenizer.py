"""blinkc.random_tokenizer: special-token ids, the trained vocabulary, and files that transformers accepts."""

import json
import time

import pytest
from transformers import AutoTokenizer

from blinkc.random_tokenizer import (CORPUS_PATH, MAX_TRAINED_TOKENS, num_trained_tokens, special_token_ids,
                                     write_random_tokenizer)

REAL_IDS = {
    "llama3": {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006,
               "<|end_header_id|>": 128007, "<|eot_id|>": 128009},
    "phi3": {"<|endoftext|>": 100257, "<|im_start|>": 100264, "<|im_end|>": 100265, "<|im_sep|>": 100266},
    "qwen3": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645},
}
FULL_VOCAB = {"llama3": 128256, "phi3": 100352, "qwen3": 151936}
TINY_VOCAB = {"llama3": 1003, "phi3": 1009, "qwen3": 1013}
BOS_EOS = {"llama3": ("<|begin_of_text|>", "<|end_of_text|>"), "phi3": ("<|endoftext|>", "<|im_end|>"),
           "qwen3": (None, "<|im_end|>")}


def load_model_vocab(directory):
    return json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]


@pytest.mark.parametrize("family", sorted(REAL_IDS))
def test_real_ids_when_they_fit(family):
    assert special_token_ids(family, FULL_VOCAB[family]) == REAL_IDS[family]
    assert special_token_ids(family, max(REAL_IDS[family].values()) + 1) == REAL_IDS[family]


@pytest.mark.parametrize("family", sorted(REAL_IDS))
def test_packed_at_the_top_in_order_when_any_does_not_fit(family):
    for vocab_size in (1003, max(REAL_IDS[family].values())):
        ids = special_token_ids(family, vocab_size)
        assert list(ids) == list(REAL_IDS[family])
        assert list(ids.values()) == list(range(vocab_size - len(ids), vocab_size))


def test_bad_family_or_vocab_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer family 'gpt2'"):
        special_token_ids("gpt2", 1000)
    with pytest.raises(ValueError, match="too small"):
        write_random_tokenizer(tmp_path, "qwen3", 258)


@pytest.mark.parametrize("family", sorted(REAL_IDS))
def test_tiny_vocab_fills_every_id(tmp_path, family):
    write_random_tokenizer(tmp_path, family, TINY_VOCAB[family])
    assert sorted(load_model_vocab(tmp_path).values()) == list(range(TINY_VOCAB[family]))
    assert len(AutoTokenizer.from_pretrained(tmp_path)) == TINY_VOCAB[family]


@pytest.mark.parametrize("family", sorted(REAL_IDS))
def test_full_vocab_has_a_gap_below_the_specials(tmp_path, family):
    write_random_tokenizer(tmp_path, family, FULL_VOCAB[family])
    ids = sorted(load_model_vocab(tmp_path).values())
    num_trained = len(ids) - len(REAL_IDS[family])
    assert ids[:num_trained] == list(range(num_trained))
    assert ids[num_trained:] == sorted(REAL_IDS[family].values())
    assert 2000 < num_trained <= num_trained_tokens(family, FULL_VOCAB[family]) == MAX_TRAINED_TOKENS


@pytest.mark.parametrize("family", sorted(REAL_IDS))
@pytest.mark.parametrize("size", ["tiny", "full"])
def test_transformers_sees_the_family_tokens(tmp_path, family, size):
    vocab_size = (TINY_VOCAB if size == "tiny" else FULL_VOCAB)[family]
    write_random_tokenizer(tmp_path, family, vocab_size)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    expected = special_token_ids(family, vocab_size)
    assert {content: hf.convert_tokens_to_ids(content) for content in expected} == expected
    assert (hf.bos_token, hf.eos_token) == BOS_EOS[family]
    ids = hf.encode("x<|im_end|>y")
    assert (ids[0] == hf.bos_token_id) == (family == "llama3")
    assert (expected.get("<|im_end|>") in ids) == (family != "llama3")


def test_writing_is_deterministic_and_fast(tmp_path):
    started = time.perf_counter()
    write_random_tokenizer(tmp_path / "a", "qwen3", 151936)
    assert time.perf_counter() - started < 2.0
    write_random_tokenizer(tmp_path / "b", "qwen3", 151936)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_tokenizer_config_fields(tmp_path):
    write_random_tokenizer(tmp_path, "qwen3", 1013)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (None, "<|im_end|>", "<|endoftext|>")
    assert "<|im_start|>" in config["chat_template"] and config["model_max_length"] > 0


def test_corpus_is_prose_of_the_promised_size():
    text = CORPUS_PATH.read_text(encoding="utf-8")
    assert 5_000 < len(text.encode()) < 32_000
    assert len(text.split()) > 1_000 and text.count(".") > 100
