"""dpu.chat_template against transformers' own renderer, on templates that lean on its jinja settings."""

import subprocess
import sys
from datetime import datetime

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from dpu.chat_template import ChatTemplate, render_chat

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
CHAT = [
    {"role": "system", "content": "Be kind & brief <always>."},
    {"role": "user", "content": "Où est le café? 🙂 \"quoted\""},
    {"role": "assistant", "content": "  Over there.  "},
    {"role": "user", "content": "Thanks"},
]
# Indented, multi-line: only renders cleanly with trim_blocks and lstrip_blocks, as real templates assume.
WHITESPACE_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(system='') %}
{% for message in messages %}
    {% if message.role == 'system' %}
        {% set ns.system = message.content %}
        {% continue %}
    {% endif %}
    {% if message.role == 'user' %}
[INST] {% if ns.system %}<<SYS>>{{ ns.system }}<</SYS>> {% endif %}{{ message.content | trim }} [/INST]
    {% else %}
{{ message.content }}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if tools is not none %}tools!{% endif %}{{ undefined_thing }}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}"""
TOJSON_TEMPLATE = "{{ messages | tojson }}|{{ messages[1] | tojson(indent=2) }}|{{ {'b': 1, 'a': [1, 2]} | tojson }}"
LOOP_TEMPLATE = "{% for m in messages %}{% if m.role == 'assistant' %}{% break %}{% endif %}{{ m.role }};{% endfor %}"
TEMPLATES = [WHITESPACE_TEMPLATE, TOJSON_TEMPLATE, LOOP_TEMPLATE]


def render_with_transformers(template, messages, add_generation_prompt, **extra):
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt, **extra)
    return rendered[0]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("template", TEMPLATES, ids=["whitespace", "tojson", "loopcontrols"])
def test_matches_transformers(template, add_generation_prompt):
    ours = render_chat(template, CHAT, add_generation_prompt=add_generation_prompt, special_tokens=SPECIAL_TOKENS)
    theirs = render_with_transformers(template, CHAT, add_generation_prompt, **SPECIAL_TOKENS)
    assert ours == theirs


def test_whitespace_template_renders_exact_text():
    text = render_chat(WHITESPACE_TEMPLATE, CHAT[1:3], add_generation_prompt=True, special_tokens=SPECIAL_TOKENS)
    assert text == '<s>\n[INST] Où est le café? 🙂 "quoted" [/INST]\n  Over there.  </s>\n\nASSISTANT:\n'


def test_tojson_keeps_unicode_and_html():
    text = render_chat(TOJSON_TEMPLATE, CHAT, add_generation_prompt=False, special_tokens={})
    assert "Où est le café? 🙂" in text and "<always>" in text and "&amp;" not in text
    assert '{\n  "role": "user",' in text


def test_extra_variables_override_special_tokens():
    text = render_chat("{{ bos_token }}{{ flavour }}", CHAT, add_generation_prompt=False,
                       special_tokens=SPECIAL_TOKENS, bos_token="<B>", flavour="mint")
    assert text == "<B>mint"


def test_strftime_now():
    text = render_chat("{{ strftime_now('%Y') }}", CHAT, add_generation_prompt=False, special_tokens={})
    assert text == str(datetime.now().year)


def test_compiled_template_renders_many_chats():
    template = ChatTemplate.from_source("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert [template.render(CHAT[:n], add_generation_prompt=False, special_tokens={}) for n in (1, 2)] == [
        CHAT[0]["content"], CHAT[0]["content"] + CHAT[1]["content"]]


@pytest.mark.parametrize("template, match", [
    ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant roles"),
    ("{{ messages.append(1) }}", "chat template failed"),
    ("{{ 'x' + messages[0].content }}", "chat template failed"),
])
def test_render_failures_are_one_line_value_errors(template, match):
    with pytest.raises(ValueError, match=match) as raised:
        render_chat(template, [{"role": "user", "content": ["a list"]}], add_generation_prompt=False,
                    special_tokens={})
    assert "\n" not in str(raised.value)


def test_syntax_error_is_a_value_error():
    with pytest.raises(ValueError, match="not valid jinja"):
        ChatTemplate.from_source("{% for m in messages %}{{ m }}")


@pytest.mark.parametrize("messages, match", [
    ({"role": "user", "content": "hi"}, "must be a list"),
    ([], "empty"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant"}], r"messages\[1\]"),
    (["hi"], r"messages\[0\]"),
    ([{"role": 3, "content": "hi"}], "role'] must be a string"),
])
def test_bad_messages_are_value_errors(messages, match):
    with pytest.raises(ValueError, match=match):
        render_chat(LOOP_TEMPLATE, messages, add_generation_prompt=False, special_tokens={})


def test_dpu_imports_no_gpu_stack():
    code = "import sys, dpu.tokenizer, dpu.chat_template; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    forbidden = {"ir", "codegen", "models", "blinkc", "runtime", "torch", "triton", "numpy", "transformers"}
    assert not forbidden & set(eval(loaded)), loaded
