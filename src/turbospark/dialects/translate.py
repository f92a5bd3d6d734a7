"""Dialect-neutral pieces of request translation, so every dialect module
says only what is its own: the one :class:`Translation` result, the
sampling-field table, the one tool-choice shape, and assistant tool calls in
the form chat templates read."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel

from ..core.request import ChatRequest
from ..engine.types import GenerationConfig, TokenProb
from .common import BadRequest


@dataclass
class Translation:
    """What every dialect's request translation returns: the internal
    request (None for a call that generates nothing: Ollama's load and
    unload), warnings for the client, whether the answer streams, what the
    dialect's renderer needs that the core does not (``extras``: Responses'
    tools to echo, Ollama's load reason), and the model's idle timeout the
    request sets (``keep_alive``, seconds; ``inf``: for good)."""

    request: ChatRequest | None
    warnings: list[str] = field(default_factory=list)
    stream: bool = False
    extras: dict[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None


#: ``GenerationConfig`` attribute -> request field, for the sampling fields
#: most dialects name alike (each dialect passes the subset it has, plus its
#: own spellings)
SAMPLING: Mapping[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def set_sampling(config: GenerationConfig, attr: str, value: Any) -> None:
    """A sampling field the request sets itself: recorded as given, so the
    model's own default for it (a config preset) does not replace it."""
    setattr(config, attr, value)
    config.given = config.given | {attr}


def copy_sampling(source: Any, config: GenerationConfig, fields: Mapping[str, str] = SAMPLING) -> None:
    """Set each config attribute whose request field is given (not None)."""
    for attr, name in fields.items():
        value = getattr(source, name, None)
        if value is not None:
            set_sampling(config, attr, value)


def pick(fields: Mapping[str, str], *names: str) -> dict[str, str]:
    """A subset of a field table."""
    return {k: v for k, v in fields.items() if k in names}


#: the most stop strings a request may give (Anthropic's limit; OpenAI's
#: dialects allow 16): each is looked for after every token, on the engine
#: thread every request shares
MAX_STOPS = 64


def stop_strings(value: str | list[str] | None, param: str = "stop") -> tuple[str, ...] | None:
    """One stop string or a list of them; empty strings are dropped."""
    if value is None:
        return None
    stops = tuple(s for s in ([value] if isinstance(value, str) else value) if s)
    if len(stops) > MAX_STOPS:
        raise BadRequest(f"'{param}': at most {MAX_STOPS} stop strings are supported, not {len(stops)}", param)
    return stops


class ToolChoice(NamedTuple):
    """A request's tool choice in internal terms: ``mode`` is auto, none,
    required or named (then ``name`` says which); ``parallel`` is whether
    several calls may come in one turn."""

    mode: str = "auto"
    name: str | None = None
    parallel: bool = True


def tool_calls_for_template(calls: list[Any], where: str = "tool_calls") -> list[dict[str, Any]]:
    """Templates expect ``function.arguments`` as an object; the wire has a
    JSON string. Each call is checked (``where`` names the list in errors):
    templates and the tools code index into these without further checks."""
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        if isinstance(call, BaseModel):
            call = call.model_dump(exclude_unset=True)
        if not isinstance(call, dict):
            raise BadRequest(f"'{at}' must be an object", at)
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise BadRequest(f"'{at}.function' must be an object with 'name' and 'arguments'", f"{at}.function")
        if not isinstance(fn.get("name"), str):
            raise BadRequest(f"'{at}.function.name' must be a string", f"{at}.function.name")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise BadRequest(f"'{at}.id' must be a string", f"{at}.id")
        fn = dict(fn)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = orjson.loads(args) if args.strip() else {}
            except orjson.JSONDecodeError:
                pass
        elif args is not None and not isinstance(args, dict):
            raise BadRequest(
                f"'{at}.function.arguments' must be a JSON string or an object", f"{at}.function.arguments"
            )
        out.append({**call, "function": fn, **fn})
    return out


#: the most alternatives a request may ask for at each token (OpenAI's bound)
MAX_TOP_LOGPROBS = 20
#: what a log-probability of minus infinity (a token the constraints forbid)
#: is written as: JSON has no infinity, and OpenAI uses this value
FORBIDDEN_LOGPROB = -9999.0


def slot_setting(id_slot: int | None) -> int | None:
    """llama-server's ``id_slot``: the session slot to run in (a number
    past the last slot wraps round, as llama-server takes it); -1 or
    absent: any."""
    if id_slot is None or id_slot == -1:
        return None
    if id_slot < -1:
        raise BadRequest("'id_slot' must be a slot id (0 or more), or -1 for any slot", "id_slot")
    return id_slot


def logprobs_setting(wanted: bool | None, top: int | None, param: str = "top_logprobs") -> int | None:
    """``GenerationConfig.logprobs`` from a dialect's on/off switch and
    alternative count: None (off), or how many alternatives to report."""
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"'{param}' must be between 0 and {MAX_TOP_LOGPROBS}", param)
    if not wanted:
        if top:
            raise BadRequest(f"'{param}' needs 'logprobs' set to true", param)
        return None
    return top or 0


def logprob_value(value: float) -> float:
    return value if value > FORBIDDEN_LOGPROB else FORBIDDEN_LOGPROB


def token_logprob(prob: TokenProb, alternatives: bool = True) -> dict[str, Any]:
    """One token as OpenAI Chat, Responses and Ollama write it: ``token``,
    ``logprob``, ``bytes`` and, for a sampled token, ``top_logprobs``."""
    out: dict[str, Any] = {"token": prob.text, "logprob": logprob_value(prob.logprob), "bytes": list(prob.piece)}
    if alternatives:
        out["top_logprobs"] = [token_logprob(t, False) for t in prob.top]
    return out


def _probability(prob: TokenProb, post: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"id": prob.id, "token": prob.text, "bytes": list(prob.piece)}
    if post:  # (the engine reported the distribution after the selection: as probabilities)
        out["prob"] = math.exp(prob.logprob) if math.isfinite(prob.logprob) else 0.0
    else:
        out["logprob"] = logprob_value(prob.logprob)
    return out


def probabilities(logprobs: Sequence[TokenProb], post: bool = False) -> list[dict[str, Any]]:
    """``n_probs``: llama-server's ``completion_probabilities`` entries
    (with ``post_sampling_probs``: ``prob`` and ``top_probs``)."""
    top = "top_probs" if post else "top_logprobs"
    return [{**_probability(p, post), top: [_probability(t, post) for t in p.top]} for p in logprobs]


def sampling_params(config: GenerationConfig) -> dict[str, Any]:
    """A job's settings under llama-server's names (its ``params``)."""
    return {
        "n_predict": config.max_new_tokens,
        "temperature": config.temperature,
        "top_k": config.top_k,
        "top_p": config.top_p,
        "min_p": config.min_p,
        "seed": config.seed if config.seed is not None else 0xFFFFFFFF,  # (llama.cpp's "random")
        "repeat_penalty": config.repeat_penalty,
        "repeat_last_n": config.penalty_last_n,
        "presence_penalty": config.presence_penalty,
        "frequency_penalty": config.frequency_penalty,
        "stop": list(config.stop),
        "ignore_eos": config.ignore_eos,
        "n_probs": config.logprobs or 0,
        "n_indent": config.n_indent,
        "t_max_predict_ms": round(config.max_predict_seconds * 1000),
    }


def logit_bias(value: list[list[Any]] | dict[str, Any]) -> tuple[dict[int, float], tuple[tuple[str, float], ...]]:
    """``logit_bias`` as llama-server takes it, ``[[token, bias], ...]`` or
    ``{"token": bias}`` (OpenAI's): a
    token by its id, or a text, each of whose tokens gets the bias
    (tokenized by the model: ``GenerationConfig.logit_bias_text``); a bias
    of ``false`` bans the token. (ids, texts)."""
    pairs = value.items() if isinstance(value, dict) else value
    ids: dict[int, float] = {}
    texts: list[tuple[str, float]] = []
    for pair in pairs:
        try:
            token, bias = pair
        except (TypeError, ValueError):
            raise BadRequest("logit_bias entries must be [token, bias]: a token id or a text", "logit_bias") from None
        if isinstance(bias, bool) and bias is not False or not isinstance(bias, int | float):
            raise BadRequest("a logit_bias bias must be a number, or false to ban the token", "logit_bias")
        weight = -100.0 if bias is False else max(-100.0, min(100.0, float(bias)))
        tid = _token_id(token)
        if tid is None and isinstance(token, str):
            texts.append((token, weight))
        elif tid is None or tid < 0:
            raise BadRequest("logit_bias entries must be [token, bias]: a token id or a text", "logit_bias")
        else:
            ids[tid] = weight
    return ids, tuple(texts)


def _token_id(token: Any) -> int | None:
    """A token id, given as a number or as a string of digits (an object's
    key); None for anything else (a text)."""
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if isinstance(token, str) and token.lstrip("-").isdigit():
        return int(token)
    return None
