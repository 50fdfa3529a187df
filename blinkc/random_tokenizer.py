"""Tokenizer files for random-weight checkpoints.

Owns each family's special tokens (and their ids), its chat template, and writing `tokenizer.json` plus
`tokenizer_config.json`: a small byte-level BPE trained on `data/corpus.txt`, laid out like the real
Llama-3 / Phi-4 / Qwen3 tokenizers so that `transformers` and `dpu.tokenizer` load it unchanged.

Special tokens keep the real models' ids when they all fit inside `vocab_size`; otherwise they are packed,
in order, at the very top of the vocabulary. Ids between the trained tokens and the special tokens do not
exist. `tokenizers` renumbers an added token that the model does not know, so each special token is also
put into the BPE model's vocabulary at its id (no merge can produce it, so encoding is unchanged).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS_PATH = Path(__file__).parent / "data" / "corpus.txt"
MAX_TRAINED_TOKENS = 4000
NUM_BYTE_TOKENS = 256
# The cl100k-style split used by Llama-3 and Phi-4 (Qwen's differs only in splitting digits one by one).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
PHI3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Phi-4 chat has no role ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)


@dataclass(frozen=True)
class TokenizerFamily:
    special_tokens: tuple[tuple[str, int], ...]  # (content, id in the real model), in id order
    bos_token: str | None  # also prepended by the post-processor when is_bos_added
    eos_token: str
    pad_token: str
    is_bos_added: bool
    model_max_length: int
    chat_template: str


FAMILIES = MappingProxyType({
    "llama3": TokenizerFamily(
        special_tokens=(("<|begin_of_text|>", 128000), ("<|end_of_text|>", 128001),
                        ("<|start_header_id|>", 128006), ("<|end_header_id|>", 128007), ("<|eot_id|>", 128009)),
        bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>", pad_token="<|end_of_text|>",
        is_bos_added=True, model_max_length=131072, chat_template=LLAMA3_CHAT_TEMPLATE),
    "phi3": TokenizerFamily(
        special_tokens=(("<|endoftext|>", 100257), ("<|im_start|>", 100264), ("<|im_end|>", 100265),
                        ("<|im_sep|>", 100266)),
        bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        is_bos_added=False, model_max_length=16384, chat_template=PHI3_CHAT_TEMPLATE),
    "qwen3": TokenizerFamily(
        special_tokens=(("<|endoftext|>", 151643), ("<|im_start|>", 151644), ("<|im_end|>", 151645)),
        bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        is_bos_added=False, model_max_length=40960, chat_template=QWEN3_CHAT_TEMPLATE),
})


def get_family(family: str) -> TokenizerFamily:
    if family not in FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; expected one of {sorted(FAMILIES)}")
    return FAMILIES[family]


def special_token_ids(family: str, vocab_size: int) -> dict[str, int]:
    """Real ids when all fit below vocab_size, else the top len(specials) ids in the same order."""
    specials = get_family(family).special_tokens
    if vocab_size < NUM_BYTE_TOKENS + len(specials):
        raise ValueError(f"vocab_size {vocab_size} is too small for {family}: need at least "
                         f"{NUM_BYTE_TOKENS + len(specials)}")
    if all(real_id < vocab_size for _, real_id in specials):
        return dict(specials)
    first_id = vocab_size - len(specials)
    return {content: first_id + i for i, (content, _) in enumerate(specials)}


def num_trained_tokens(family: str, vocab_size: int) -> int:
    return min(vocab_size - len(get_family(family).special_tokens), MAX_TRAINED_TOKENS)


def write_random_tokenizer(out_dir: Path, family: str, vocab_size: int) -> None:
    """Write tokenizer.json and tokenizer_config.json for `family` into out_dir (created if missing)."""
    spec = get_family(family)
    ids = special_token_ids(family, vocab_size)
    tokenizer = train_bpe(num_trained_tokens(family, vocab_size))
    tokenizer.post_processor = build_post_processor(spec, ids)
    tokenizer = with_special_tokens(tokenizer, ids)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = build_tokenizer_config(spec)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def train_bpe(num_tokens: int) -> Tokenizer:
    """Byte-level BPE with at most num_tokens tokens (256 byte tokens included); deterministic."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=num_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = CORPUS_PATH.read_text(encoding="utf-8")
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def build_post_processor(spec: TokenizerFamily, ids: dict[str, int]) -> processors.PostProcessor:
    byte_level = processors.ByteLevel(trim_offsets=False)
    if not spec.is_bos_added:
        return byte_level
    bos = spec.bos_token
    prepend_bos = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, ids[bos])])
    return processors.Sequence([byte_level, prepend_bos])


def with_special_tokens(tokenizer: Tokenizer, ids: dict[str, int]) -> Tokenizer:
    """Add the special tokens at exactly `ids`, through the serialized form (see the module docstring)."""
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for content, token_id in ids.items():
        vocab[content] = token_id
    data["added_tokens"] = [
        {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for content, token_id in ids.items()
    ]
    return Tokenizer.from_str(json.dumps(data))


def build_tokenizer_config(spec: TokenizerFamily) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": spec.bos_token,
        "eos_token": spec.eos_token,
        "pad_token": spec.pad_token,
        "model_max_length": spec.model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": spec.chat_template,
    }
