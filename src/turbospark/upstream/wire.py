"""Pure translation between the internal request and an OpenAI-compatible
upstream (vLLM, SGLang, llama-server, another turbospark): the body that is
sent, each streamed chunk read back, the upstream's own counts as a
:class:`RawDecodeResult`, and an upstream error body as one message.

Nothing here does I/O; ``upstream/model.py`` sends and reads."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..engine.types import ContextOverflow, GenerationConfig, Progress, StopReason, TokenProb

#: reasoning efforts that turn thinking off (``generation.EFFORTS_OFF``)
EFFORTS_OFF = ("none", "off", "disabled", "false")
#: the internal effort as one of the three OpenAI-compatible servers take
EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}

#: the upstream's ``finish_reason`` as the event contract's stop reason
FINISH = {
    "stop": StopReason.END_OF_TURN,
    "eos": StopReason.EOS,
    "length": StopReason.MAX_TOKENS,
    "tool_calls": StopReason.TOOL_CALLS,
    "function_call": StopReason.TOOL_CALLS,
    "content_filter": StopReason.END_OF_TURN,
}


@dataclass(slots=True)
class CallPiece:
    """A piece of a tool call the upstream parsed itself (OpenAI
    ``delta.tool_calls[]``): the first piece of a call has its id and name,
    later ones more of its arguments' JSON text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """One internal (template-form) message in OpenAI's wire form: tool call
    arguments back to JSON strings, template-only keys dropped."""
    out: dict[str, Any] = {"role": m.get("role", "user"), "content": m.get("content")}
    if m.get("name") and out["role"] in ("user", "assistant", "system", "tool"):
        out["name"] = m["name"]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    calls = m.get("tool_calls")
    if calls:
        wire = []
        for c in calls:
            fn = c.get("function") or {}
            args = fn.get("arguments", c.get("arguments", {}))
            wire.append(
                {
                    "id": c.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": fn.get("name", c.get("name", "")),
                        "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                    },
                }
            )
        out["tool_calls"] = wire
        if out["content"] in (None, ""):
            out["content"] = None
    elif out["content"] is None:
        out["content"] = ""
    return out


def request_body(req: Any, default_max: int | None) -> dict[str, Any]:
    """What a request (``generation.ChatRequest``) asks of the upstream,
    less the model name, the sampling fields (:func:`sampling`, per choice)
    and ``stream``. A chat request becomes a chat completion; a raw prompt
    (text or token ids) a completion."""
    body: dict[str, Any] = {}
    if req.prompt_mixed is not None:  # (llama-server's mixed ids and texts, as given)
        body["prompt"] = list(req.prompt_mixed)
    elif req.prompt is not None or req.prompt_ids is not None:
        body["prompt"] = req.prompt if req.prompt is not None else list(req.prompt_ids)
    else:
        body["messages"] = [_message(m) for m in req.messages]
        if req.tools and req.tool_choice != "none":
            body["tools"] = req.tools
            if req.tool_choice == "named":
                body["tool_choice"] = {"type": "function", "function": {"name": req.tool_name}}
            else:
                body["tool_choice"] = req.tool_choice
            if not req.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        if req.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": req.json_schema, "strict": True},
            }
        elif req.json_object:
            body["response_format"] = {"type": "json_object"}
        kwargs = dict(req.template_kwargs)
        effort = str(req.reasoning).lower() if req.reasoning is not None else None
        if effort in EFFORTS_OFF:
            # thinking off: the template's switch (Qwen3 and kin), as locally
            kwargs.setdefault("enable_thinking", False)
        elif effort is not None:
            # OpenAI's three efforts; Anthropic's "max", Ollama's own words ... map onto them
            body["reasoning_effort"] = EFFORTS.get(effort, "medium")
        if kwargs:
            body["chat_template_kwargs"] = kwargs
    if req.max_tokens_explicit:
        body["max_tokens"] = req.config.max_new_tokens
    elif default_max is not None:
        body["max_tokens"] = default_max
    return body


def sampling(config: GenerationConfig) -> dict[str, Any]:
    """The sampling fields of one run (a choice of ``n`` has its own seed)."""
    out: dict[str, Any] = {"temperature": max(0.0, config.temperature), "top_p": config.top_p}
    if config.seed is not None:
        out["seed"] = config.seed
    if config.stop:
        out["stop"] = list(config.stop)
    if config.presence_penalty:
        out["presence_penalty"] = config.presence_penalty
    if config.frequency_penalty:
        out["frequency_penalty"] = config.frequency_penalty
    if config.logit_bias or config.logit_bias_text:
        # (text keys as llama-server takes them: the upstream tokenizes them)
        out["logit_bias"] = {**{str(k): v for k, v in config.logit_bias.items()}, **dict(config.logit_bias_text)}
    # fields OpenAI lacks but vLLM, SGLang, llama-server and turbospark take
    if config.top_k:
        out["top_k"] = config.top_k
    if config.min_p:
        out["min_p"] = config.min_p
    if config.repeat_penalty != 1.0:
        out["repetition_penalty"] = config.repeat_penalty
    if config.ignore_eos:
        out["ignore_eos"] = True
    if config.session_key:
        out["user"] = config.session_key
    return out


@dataclass
class Reading:
    """What one upstream stream has said so far: its counts (``usage``,
    llama-server's ``timings``), why it finished, the text it wrote."""

    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    finish: str | None = None
    text: list[str] = field(default_factory=list)
    #: the answer's log-probabilities, when they were asked for
    logprobs: list[TokenProb] = field(default_factory=list)
    #: tool calls by id, and the last one a piece went to (pieces without an index)
    _call_ids: dict[str, int] = field(default_factory=dict)
    _last_call: int = 0

    def chunk(self, data: dict[str, Any]) -> list[Progress]:
        """One streamed chunk (chat or completion) as progress items."""
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        if isinstance(data.get("timings"), dict):
            self.timings = data["timings"]
        out: list[Progress] = []
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):  # a completion chunk
                text = choice.get("text")
                if isinstance(text, str) and text:
                    out.append(Progress(text, 1, self._probs(completion_probs(choice.get("logprobs")))))
                continue
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                out.append(Progress("", 1, reasoning=thought))
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.append(Progress(content, 1, self._probs(chat_probs(choice.get("logprobs")))))
            for call in delta.get("tool_calls") or ():
                if not isinstance(call, dict):
                    continue
                fn = call.get("function")
                fn = fn if isinstance(fn, dict) else {}
                name, args, call_id = fn.get("name"), fn.get("arguments"), call.get("id")
                index = self._call_index(call.get("index"), call_id if isinstance(call_id, str) else None)
                piece = CallPiece(
                    index,
                    call_id if isinstance(call_id, str) else None,
                    name if isinstance(name, str) else None,
                    args if isinstance(args, str) else orjson.dumps(args).decode() if isinstance(args, dict) else "",
                )
                out.append(Progress("", 1, call=piece))
        for p in out:
            if p.text:
                self.text.append(p.text)
        return out

    def _call_index(self, index: Any, call_id: str | None) -> int:
        """A call piece's index. Without one (some servers leave it out, or
        send null), a new id is a new call and a piece with no id continues
        the last call."""
        at: int
        if isinstance(index, int) and not isinstance(index, bool):
            at = index
            if call_id:
                self._call_ids[call_id] = at
        elif call_id:
            at = self._call_ids.setdefault(call_id, max(self._call_ids.values(), default=-1) + 1)
        else:
            at = self._last_call
        self._last_call = at
        return at

    def _probs(self, probs: list[TokenProb]) -> list[TokenProb] | tuple[()]:
        if not probs:
            return ()
        self.logprobs += probs
        return probs

    def reason(self) -> StopReason:
        return FINISH.get(self.finish or "stop", StopReason.END_OF_TURN)

    def counts(self) -> tuple[int, int, int, int | None]:
        """(prompt tokens, generated tokens, reused prompt tokens, reasoning
        tokens) as the upstream counted them: ``usage`` (cached tokens from
        ``prompt_tokens_details``), else llama-server's ``timings``. Never
        a count of chunks: zeros when the upstream said nothing."""
        u = self.usage or {}
        t = self.timings or {}
        prompt = _int(u.get("prompt_tokens"))
        new = _int(u.get("completion_tokens"))
        details = u.get("prompt_tokens_details") or {}
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        if not u and t:
            cached = _int(t.get("cache_n"))
            prompt = _int(t.get("prompt_n")) + cached
            new = _int(t.get("predicted_n"))
        elif not cached and t:
            cached = _int(t.get("cache_n"))
        out_details = u.get("completion_tokens_details") or {}
        reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
        return prompt, new, cached, reasoning if isinstance(reasoning, int) else None


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def error_message(status: int, raw: bytes) -> tuple[str, str | None]:
    """(message, code) of an upstream error body in any of the shapes
    servers answer with: OpenAI ``{"error": {...}}``, vLLM ``{"message"}``,
    Anthropic, Ollama ``{"error": "..."}``, FastAPI ``{"detail"}``."""
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    message: Any = None
    code: Any = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            message, code = err.get("message"), err.get("code")
        elif isinstance(err, str):
            message = err
        if message is None:
            message = data.get("message") or data.get("detail")
    if not isinstance(message, str) or not message:
        text = raw[:300].decode("utf-8", "replace").strip()
        message = text or f"HTTP {status}"
    return message, code if isinstance(code, str) else None


UPSTREAM_CONTEXT = "the upstream's context"
#: vLLM's and SGLang's refusals of a request over its context, with their numbers:
#: (the pattern, which groups hold the limit, the prompt and the reply's budget)
_VLLM_OVERFLOW = [
    # "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum
    # context length is 4096 tokens and your request has 2778 input tokens (...)"
    (
        re.compile(
            r"is too large: (\d+)\. This model's maximum context length is (\d+) tokens and your request "
            r"has (\d+) input tokens"
        ),
        2,
        3,
        1,
    ),  # fmt: skip
    # "... maximum context length is 4096 tokens. However, you requested 4200 tokens
    # (200 in the messages, 4000 in the completion)"
    (
        re.compile(
            r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens \((\d+) in the "
            r"messages, (\d+) in the completion\)"
        ),
        1,
        2,
        3,
    ),  # fmt: skip
    # "... maximum context length is 4096 tokens. However, your request has 5000 input tokens"
    (re.compile(r"maximum context length is (\d+) tokens\. However, your request has (\d+) input tokens"), 1, 2, 0),
    # vLLM (newer) and SGLang: "Requested token count exceeds the model's maximum context length
    # of 4096 tokens. You requested a total of 5000 tokens: 3000 tokens from the input messages
    # and 2000 tokens for the completion." (the counts may be written as floats)
    (
        re.compile(
            r"maximum context length of (\d+) tokens\. You requested a total of [\d.]+ tokens: (\d+)(?:\.\d+)? "
            r"tokens from the input messages and (\d+)(?:\.\d+)? tokens for the completion"
        ),
        1,
        2,
        3,
    ),  # fmt: skip
    # SGLang's, sent inside the stream: "The input (5000 tokens) is longer than the model's
    # context length (4096 tokens)."
    (re.compile(r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"), 2, 1, 0),
]


def context_overflow(message: str, raw: bytes) -> ContextOverflow | None:
    """An upstream's refusal of a prompt over its context, with its numbers,
    as this server words its own (``ContextOverflow``: what Claude Code
    reads to compact, the code Codex acts on): llama-server's
    ``exceed_context_size_error`` and vLLM's and SGLang's messages. None for any other
    error, or one without the numbers."""
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
        prompt, limit = err.get("n_prompt_tokens"), err.get("n_ctx")
        if isinstance(prompt, int) and isinstance(limit, int) and 0 < limit <= prompt:
            return ContextOverflow(prompt, 0, limit, limit_name=UPSTREAM_CONTEXT)
    for pattern, at_limit, at_prompt, at_new in _VLLM_OVERFLOW:
        m = pattern.search(message)
        if m:
            new = int(m.group(at_new)) if at_new else 0
            return ContextOverflow(int(m.group(at_prompt)), new, int(m.group(at_limit)), limit_name=UPSTREAM_CONTEXT)
    return None


def _prob(entry: Any) -> TokenProb | None:
    """One ``{token, logprob, bytes}`` of an OpenAI chat chunk's log-probabilities
    (no token ids: an upstream names its tokens by their text)."""
    if not isinstance(entry, dict):
        return None
    token, logprob, raw = entry.get("token"), entry.get("logprob"), entry.get("bytes")
    if not isinstance(token, str) or not isinstance(logprob, int | float):
        return None
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        return TokenProb(-1, bytes(raw), float(logprob))
    return TokenProb(-1, token.encode(), float(logprob))


def chat_probs(raw: Any) -> list[TokenProb]:
    """A chat chunk's ``logprobs.content``: each sampled token with its
    ``top_logprobs``."""
    out: list[TokenProb] = []
    for entry in raw.get("content") or () if isinstance(raw, dict) else ():
        prob = _prob(entry)
        if prob is not None:
            top = [t for t in map(_prob, entry.get("top_logprobs") or ()) if t is not None]
            out.append(TokenProb(-1, prob.piece, prob.logprob, tuple(top)))
    return out


def completion_probs(raw: Any) -> list[TokenProb]:
    """A completion chunk's ``logprobs``: parallel ``tokens``,
    ``token_logprobs`` and ``top_logprobs`` (token → logprob) lists."""
    if not isinstance(raw, dict):
        return []
    tokens, values, tops = raw.get("tokens") or [], raw.get("token_logprobs") or [], raw.get("top_logprobs") or []
    out: list[TokenProb] = []
    for i, (token, logprob) in enumerate(zip(tokens, values)):
        if not isinstance(token, str) or not isinstance(logprob, int | float):
            continue
        alternatives = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        top = tuple(TokenProb(-1, t.encode(), float(v)) for t, v in alternatives.items() if isinstance(v, int | float))
        out.append(TokenProb(-1, token.encode(), float(logprob), top))
    return out
