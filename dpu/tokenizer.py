"""The serving tokenizer: a Hugging Face checkpoint's tokenizer files, loaded without transformers.

Owns reading `tokenizer.json`, `tokenizer_config.json`, an optional `chat_template.jinja` and an optional
`generation_config.json` from a checkpoint directory, and encode / decode / apply_chat_template that give
the same ids and text as `transformers.AutoTokenizer` does for a fast tokenizer.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import tokenizers

from dpu.chat_template import ChatTemplate

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True, eq=False)
class Tokenizer:
    backend: tokenizers.Tokenizer = field(repr=False)
    special_tokens: Mapping[str, str]  # bos_token, eos_token, ... -> token text, as in transformers' special_tokens_map
    bos_token_id: int | None
    eos_token_ids: frozenset[int]  # tokenizer_config's eos_token plus generation_config's eos_token_id(s)
    vocab_size: int  # one past the largest token id (ids may have gaps, so this can exceed the token count)
    chat_template: ChatTemplate | None = field(repr=False)

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        directory = Path(path)
        if not directory.is_dir():
            raise ValueError(f"tokenizer directory {directory} does not exist")
        backend = load_backend(directory / "tokenizer.json")
        config = read_json(directory / "tokenizer_config.json")
        generation_path = directory / "generation_config.json"
        generation_config = read_json(generation_path) if generation_path.exists() else {}
        special_tokens = read_special_tokens(config)
        bos = special_tokens.get("bos_token")
        return cls(
            backend=backend,
            special_tokens=special_tokens,
            bos_token_id=None if bos is None else token_id(backend, bos),
            eos_token_ids=read_eos_token_ids(backend, special_tokens, generation_config),
            vocab_size=max(backend.get_vocab(with_added_tokens=True).values()) + 1,
            chat_template=read_chat_template(directory, config),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False, **extra: Any) -> str | list[int]:
        """The rendered chat, or its ids when tokenize (no special tokens added: the template has them)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)")
        text = self.chat_template.render(
            messages, add_generation_prompt=add_generation_prompt, special_tokens=self.special_tokens, **extra)
        return self.encode(text, add_special_tokens=False) if tokenize else text


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"{path.name} is missing from {path.parent}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def load_backend(path: Path) -> tokenizers.Tokenizer:
    if not path.is_file():
        raise ValueError(f"{path.name} is missing from {path.parent}")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for every malformed file
        raise ValueError(f"{path} is not a valid tokenizer file: {' '.join(str(error).split())}") from None


def read_special_tokens(config: dict) -> Mapping[str, str]:
    """Named special tokens; old configs store them as {"content": ..., "__type": "AddedToken"}."""
    special_tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            if not isinstance(value, str):
                raise ValueError(f"tokenizer_config.json {name} must be a string, got {type(value).__name__}")
            special_tokens[name] = value
    return MappingProxyType(special_tokens)


def token_id(backend: tokenizers.Tokenizer, token: str) -> int:
    found = backend.token_to_id(token)
    if found is None:
        raise ValueError(f"tokenizer_config.json names token {token!r}, which tokenizer.json does not have")
    return found


def read_eos_token_ids(backend: tokenizers.Tokenizer, special_tokens: Mapping[str, str],
                       generation_config: dict) -> frozenset[int]:
    eos_ids = set()
    if "eos_token" in special_tokens:
        eos_ids.add(token_id(backend, special_tokens["eos_token"]))
    generation_eos = generation_config.get("eos_token_id")
    if isinstance(generation_eos, int):
        generation_eos = [generation_eos]
    if generation_eos is not None:
        if not isinstance(generation_eos, list) or not all(isinstance(i, int) for i in generation_eos):
            raise ValueError(f"generation_config.json eos_token_id must be an int or a list of ints, "
                             f"got {generation_eos!r}")
        eos_ids.update(generation_eos)
    return frozenset(eos_ids)


def read_chat_template(directory: Path, config: dict) -> ChatTemplate | None:
    """chat_template.jinja wins over tokenizer_config.json, as in transformers; a list picks its "default"."""
    jinja_path = directory / "chat_template.jinja"
    if jinja_path.is_file():
        return ChatTemplate.from_source(jinja_path.read_text(encoding="utf-8"))
    source = config.get("chat_template")
    if isinstance(source, list):
        by_name = {entry.get("name"): entry.get("template") for entry in source if isinstance(entry, dict)}
        if "default" not in by_name:
            raise ValueError(f"tokenizer_config.json has chat templates {sorted(map(str, by_name))} but no 'default'")
        source = by_name["default"]
    return None if source is None else ChatTemplate.from_source(source)
