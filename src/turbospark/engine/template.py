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


def fold_inner_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """For a template that renders a system message only at the start (Gemma's
    insists the rest alternate user/assistant): each system entry after the
    first non-system one joins the user message before it (after its text:
    what comes before it in the prompt stays as it was, so a cached prefix
    still holds), else the leading system message. None when there is none
    to fold."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    if not any(m.get("role") == "system" for m in messages[lead:]):
        return None
    out = [dict(m) for m in messages[:lead]]
    for m in messages[lead:]:
        if m.get("role") != "system":
            out.append(dict(m))
            continue
        text = _text_of(m.get("content"))
        user = next((o for o in reversed(out) if o.get("role") == "user"), None)
        if user is None:
            if out and out[0].get("role") == "system":
                out[0]["content"] = _text_of(out[0].get("content")) + "\n\n" + text
            else:
                out.insert(0, {"role": "system", "content": text})
        elif isinstance(user.get("content"), list):
            user["content"] = [*user["content"], {"type": "text", "text": text}]
        else:
            user["content"] = _text_of(user.get("content")) + "\n\n" + text
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
