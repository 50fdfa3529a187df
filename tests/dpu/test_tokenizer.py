"""dpu.tokenizer.Tokenizer against transformers.AutoTokenizer on random-checkpoint tokenizers of each family."""

import json
import re

import pytest
from transformers import AutoTokenizer

from blinkc.random_tokenizer import special_token_ids, write_random_tokenizer
from dpu.tokenizer import Tokenizer

CASES = [("llama3", 1003), ("llama3", 128256), ("phi3", 1009), ("phi3", 100352), ("qwen3", 1013), ("qwen3", 151936)]
TEXTS = [
    "Hello, world! The kettle starts to hum.",
    "",
    "  leading, trailing and   runs of    spaces  ",
    "tabs\tand\nnewlines\n\n\n\r\nend",
    "naïve café — 東京 Ελληνικά 🙂👍🏽 \u200b zero width",
    "numbers 1234567, 3.14159 and 0x7fff",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_sep|>",
    "<|begin_of_text|><|start_header_id|>x<|end_header_id|> mid<|eot_id|>tail<|endoftext|><|end_of_text|>",
]
SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
CHATS = [
    [{"role": "user", "content": "What is a cache?"}],
    [SYSTEM, {"role": "user", "content": "Hi there "}, {"role": "assistant", "content": "  Hello. 🙂"},
     {"role": "user", "content": "Why is the sky blue?\n\nBe brief."}],
    [{"role": "user", "content": "Say <tag> & \"quote\""}, {"role": "assistant", "content": "Done: naïve."},
     {"role": "user", "content": "again"}],
]


@pytest.fixture(scope="module", params=CASES, ids=[f"{family}-{vocab}" for family, vocab in CASES])
def case(request, tmp_path_factory):
    family, vocab_size = request.param
    directory = tmp_path_factory.mktemp(f"{family}-{vocab_size}")
    write_random_tokenizer(directory, family, vocab_size)
    return family, vocab_size, Tokenizer.from_dir(directory), AutoTokenizer.from_pretrained(directory)


def test_special_ids_match_writer_and_transformers(case):
    family, vocab_size, ours, hf = case
    ids = special_token_ids(family, vocab_size)
    assert {content: ours.backend.token_to_id(content) for content in ids} == ids
    assert ours.bos_token_id == hf.bos_token_id
    assert ours.eos_token_ids == {hf.eos_token_id}
    assert ours.vocab_size == max(ids.values()) + 1 <= vocab_size
    assert ours.special_tokens == hf.special_tokens_map


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_decode_match_transformers(case, add_special_tokens):
    _, _, ours, hf = case
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=add_special_tokens)
        assert ids == hf.encode(text, add_special_tokens=add_special_tokens), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text


def test_plain_text_round_trips(case):
    _, _, ours, _ = case
    for text in TEXTS[:6]:
        assert ours.decode(ours.encode(text)) == text


def test_bos_is_prepended_only_for_llama3(case):
    family, _, ours, _ = case
    ids = ours.encode("hi")
    assert (ids[0] == ours.bos_token_id) == (family == "llama3")
    assert ours.encode("hi", add_special_tokens=False) == (ids[1:] if family == "llama3" else ids)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(case, add_generation_prompt):
    _, _, ours, hf = case
    for chat in CHATS:
        text = ours.apply_chat_template(chat, add_generation_prompt=add_generation_prompt)
        assert text == hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=False)
        ids = ours.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=True)
        assert ids == hf.apply_chat_template(
            chat, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False)
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_chat_extra_variables_reach_the_template(case):
    family, _, ours, hf = case
    chat = CHATS[0]
    text = ours.apply_chat_template(chat, enable_thinking=False)
    assert text == hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert text.endswith("<think>\n\n</think>\n\n") == (family == "qwen3")


def test_generation_config_eos_ids_are_added(tmp_path):
    write_random_tokenizer(tmp_path, "llama3", 128256)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008, 128009]}))
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == frozenset({128001, 128008, 128009})


def test_chat_template_jinja_file_wins(tmp_path):
    write_random_tokenizer(tmp_path, "qwen3", 1013)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.role }}]{% endfor %}")
    tokenizer = Tokenizer.from_dir(tmp_path)
    assert tokenizer.apply_chat_template(CHATS[1]) == "[system][user][assistant][user]"
    assert tokenizer.apply_chat_template(CHATS[1]) == AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(
        CHATS[1], tokenize=False)


def test_missing_directory_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.from_dir(tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_missing_file_names_the_file(tmp_path, name):
    write_random_tokenizer(tmp_path, "phi3", 1009)
    (tmp_path / name).unlink()
    with pytest.raises(ValueError, match=name):
        Tokenizer.from_dir(tmp_path)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_malformed_json_names_the_file(tmp_path, name):
    write_random_tokenizer(tmp_path, "phi3", 1009)
    (tmp_path / name).write_text('{"eos_token": ')
    with pytest.raises(ValueError, match=name) as raised:
        Tokenizer.from_dir(tmp_path)
    assert "\n" not in str(raised.value)


def test_eos_token_unknown_to_tokenizer_json(tmp_path):
    write_random_tokenizer(tmp_path, "qwen3", 1013)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|nope|>"}))
    with pytest.raises(ValueError, match=re.escape("'<|nope|>'")):
        Tokenizer.from_dir(tmp_path)


def test_bad_messages_are_value_errors(case):
    _, _, ours, _ = case
    for messages in ["hello", [], [{"role": "user"}], [{"content": "x"}], ["user: hi"]]:
        with pytest.raises(ValueError, match="messages"):
            ours.apply_chat_template(messages)
