"""Rendering Hugging Face chat templates exactly as `transformers` does.

Owns the jinja environment (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, transformers' `tojson`,
`raise_exception` and `strftime_now`), checking messages, and turning every template failure into a
one-line ValueError. Chat templates are third-party jinja written for transformers' lenient `Undefined`
(`message.tool_calls is defined` and the like), so unlike our own templates this one is not strict.
"""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template compiled once; render it for any number of conversations."""

    source: str
    compiled: jinja2.Template

    @classmethod
    def from_source(cls, source: str) -> "ChatTemplate":
        if not isinstance(source, str):
            raise ValueError(f"chat_template must be a string, got {type(source).__name__}")
        try:
            return cls(source=source, compiled=make_environment().from_string(source))
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"chat_template is not valid jinja (line {error.lineno}): {error.message}") from None

    def render(self, messages: list[dict], *, add_generation_prompt: bool,
               special_tokens: Mapping[str, str], **extra: Any) -> str:
        """Render like transformers: special tokens (bos_token, eos_token, ...) first, extra overrides them."""
        check_messages(messages)
        variables = {**special_tokens, **extra}
        variables.setdefault("tools", None)
        variables.setdefault("documents", None)
        try:
            return self.compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
        except (jinja2.TemplateError, TypeError) as error:
            raise ValueError(f"chat template failed: {one_line(error)}") from None


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool,
                special_tokens: Mapping[str, str], **extra: Any) -> str:
    """Compile `template` and render `messages`; hold a ChatTemplate instead when rendering many times."""
    return ChatTemplate.from_source(template).render(
        messages, add_generation_prompt=add_generation_prompt, special_tokens=special_tokens, **extra)


def check_messages(messages: Any) -> None:
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a chat needs at least one message")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{index}] must be a dict with 'role' and 'content' keys, got {message!r:.80}")
        if not isinstance(message["role"], str):
            raise ValueError(f"messages[{index}]['role'] must be a string, got {type(message['role']).__name__}")


def make_environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    return environment


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' tojson: no HTML escaping (unlike jinja's), non-ASCII kept, indent/separators allowed."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message: str) -> None:
    raise jinja2.TemplateError(f"raise_exception: {message}")


def strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__
