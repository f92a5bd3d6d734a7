"""System entries inside ``messages[]`` (newer Claude Code releases send
one after the first user turn): a template that takes them in place renders
them there; one that takes a system message only at the start (Gemma's:
the rest must alternate user/assistant) gets them folded into the user turn
before them (``engine.template.fold_inner_system``), never a 400."""

from __future__ import annotations

import anthropic
import pytest

from tests.support import Server
from turbospark.engine.model import ModelOptions
from turbospark.engine.template import fold_inner_system
from turbospark.models.catalog import resolve_model

#: Gemma 3's template, in its essentials: a leading system message becomes
#: the first user turn's prefix, and the rest must alternate
GEMMA_STYLE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

INNER = [
    {"role": "user", "content": "Say hello."},
    {"role": "system", "content": "Agent types: claude, explore."},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Again."},
]


def test_fold_inner_system_joins_the_user_turn_before_it():
    assert fold_inner_system([{"role": "system", "content": "S"}, *INNER[:1]]) is None  # only a leading one
    assert fold_inner_system(INNER) == [
        {"role": "user", "content": "Say hello.\n\nAgent types: claude, explore."},
        *INNER[2:],
    ]
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}]}, {"role": "system", "content": "b"}]
    assert fold_inner_system(parts) == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "\n\nb"}]}
    ]
    # after an answer: the next user turn, at its start (the order holds)
    later = [INNER[0], INNER[2], {"role": "system", "content": "S"}, INNER[3]]
    assert fold_inner_system(later) == [INNER[0], INNER[2], {"role": "user", "content": "S\n\nAgain."}]
    # none after it: the last one before it
    last = [INNER[0], INNER[2], {"role": "system", "content": "S"}]
    assert fold_inner_system(last) == [{"role": "user", "content": "Say hello.\n\nS"}, INNER[2]]
    # no user turn at all: the leading system message takes it, or becomes it
    lead = [
        {"role": "system", "content": "A"},
        {"role": "assistant", "content": "x"},
        {"role": "system", "content": "B"},
    ]
    assert fold_inner_system(lead) == [{"role": "system", "content": "A\n\nB"}, {"role": "assistant", "content": "x"}]
    alone = [
        {"role": "assistant", "content": "x"},
        {"role": "system", "content": "B"},
        {"role": "system", "content": "C"},
    ]
    assert fold_inner_system(alone) == [{"role": "system", "content": "B\n\nC"}, {"role": "assistant", "content": "x"}]
    # lead (the model has a default system prompt): the leading one, always
    assert fold_inner_system(INNER, lead=True) == [
        {"role": "system", "content": INNER[1]["content"]},
        INNER[0],
        *INNER[2:],
    ]
    assert fold_inner_system(INNER) is not None and INNER[0]["content"] == "Say hello."  # the input is not changed


@pytest.fixture(scope="module")
def gemma_style():
    options = ModelOptions(
        path=resolve_model("smollm2-135m")[0], id="g", ctx=2048, parallel=1, chat_template=GEMMA_STYLE
    )
    with Server(models=[options]) as srv:
        yield srv


def test_a_template_that_takes_system_only_first_gets_it_folded(gemma_style):
    client = anthropic.Anthropic(base_url=gemma_style.url, api_key="x", max_retries=0, timeout=120)
    # Anthropic's body has no system role: Claude Code's entry as it sends it
    inner = [*INNER[:1], {"role": "system", "content": INNER[1]["content"]}, *INNER[2:]]
    r = client.messages.create(model="g", max_tokens=2, messages=inner, extra_body={"temperature": 0})  # type: ignore[arg-type]
    folded = client.messages.create(
        model="g",
        max_tokens=2,
        messages=fold_inner_system(INNER),
        extra_body={"temperature": 0},  # type: ignore[arg-type]
    )
    # the same prompt as the conversation folded by hand: the entry is in it
    total = lambda m: m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)  # noqa: E731
    assert total(r) == total(folded)
    plain = client.messages.create(
        model="g", max_tokens=2, messages=[INNER[0], *INNER[2:]], extra_body={"temperature": 0}
    )  # type: ignore[arg-type]
    assert total(r) > total(plain) + 5
