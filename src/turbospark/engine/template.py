"""Chat templates: the GGUF's own ``tokenizer.chat_template``, rendered in a
sandboxed Jinja2 environment the way Hugging Face's tokenizers do.

A template is code shipped inside a model file, so it runs sandboxed: no
attribute access to Python internals, no mutation of passed-in objects.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import jinja2
import orjson
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .types import AdmissionError

#: Used when a GGUF carries no template: ChatML, the most common format.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Strings that templates use to close a turn; a token whose text is one of
#: these ends the turn (``endOfTurn``) rather than the stream (``eos``).
TURN_END_MARKERS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endofturn|>",
    "<|END_OF_TURN_TOKEN|>",
    "</s>",
)


def _text_of(content: Any) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _join(message: dict[str, Any], text: str, before: bool) -> None:
    """Add ``text`` to a message's content, before or after what it says."""
    content = message.get("content")
    if isinstance(content, list):
        part = {"type": "text", "text": text + "\n\n" if before else "\n\n" + text}
        message["content"] = [part, *content] if before else [*content, part]
    else:
        said = _text_of(content)
        message["content"] = text + "\n\n" + said if before else said + "\n\n" + text


def fold_inner_system(messages: list[dict[str, Any]], lead: bool = False) -> list[dict[str, Any]] | None:
    """For a template that renders a system message only at the start (Gemma's
    insists the rest alternate user/assistant): each system entry after the
    first non-system message joins a user turn where it stands: the one it
    follows directly, else the next one (at its start), else the last one
    before it; with none, or with ``lead``, the leading system message (so
    the conversation still has one: a model's default system prompt is not
    added). Joined to a user turn, what comes before the entry's place in
    the prompt stays as it was. None when there is nothing to fold."""
    first = 0
    while first < len(messages) and messages[first].get("role") == "system":
        first += 1
    if not any(m.get("role") == "system" for m in messages[first:]):
        return None
    out = [dict(m) for m in messages]
    while (i := next((k for k in range(first, len(out)) if out[k].get("role") == "system"), None)) is not None:
        text = _text_of(out.pop(i).get("content"))
        users = [j for j, m in enumerate(out) if m.get("role") == "user"]
        after = next((j for j in users if j >= i), None)  # (what followed it is at i now)
        before = next((j for j in reversed(users) if j < i), None)
        if lead or (before is None and after is None):
            if first:
                _join(out[0], text, before=False)
            else:
                out.insert(0, {"role": "system", "content": text})
                first = 1
        elif before is not None and (before == i - 1 or after is None):
            _join(out[before], text, before=False)
        else:
            assert after is not None
            _join(out[after], text, before=True)
    return out


class TemplateError(AdmissionError):
    """The template refused the conversation (e.g. roles must alternate)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template: {message}", "messages")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    option = orjson.OPT_INDENT_2 if indent else 0
    text = orjson.dumps(value, option=option | orjson.OPT_NON_STR_KEYS).decode()
    if ensure_ascii:
        text = text.encode("ascii", "backslashreplace").decode()
    return text


def _strftime_now(fmt: str) -> str:
    return _dt.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it expects."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML
        self.is_default = source is None
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the model's chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed to render these messages: {exc}", "messages") from exc
        except RecursionError:
            raise TemplateError(
                "chat template failed to render these messages: they are nested too deeply", "messages"
            ) from None
        except Exception as exc:  # noqa: BLE001 - template code on client data: any failure is a 400
            raise TemplateError(
                f"chat template failed to render these messages: {type(exc).__name__}: {exc}", "messages"
            ) from exc
