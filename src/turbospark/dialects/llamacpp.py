"""llama.cpp server's own API (``llama-server``'s native routes): wire models
and pure translations, so editors and tools written for llama-server
(llama.vscode's ``/infill``, scripts using ``/completion`` or
``/tokenize``) work unchanged.

- ``POST /completion``: a raw prompt (a string, token ids, or
  ``{"prompt_string", "multimodal_data"}``: images and sound at its
  ``<__media__>`` markers) →
  ``{"content", "stop", "stop_type", "tokens_predicted",
  "tokens_evaluated", "tokens_cached", "timings", ...}``; streamed, one
  ``data: {"content": ..., "stop": false}`` per piece and a last frame with
  ``"stop": true`` and every count (no ``[DONE]``, as llama-server).
- ``POST /infill``: fill-in-the-middle with the model's own FIM tokens
  (``input_prefix``, ``input_suffix``, ``input_extra`` files, an optional
  ``prompt`` after the middle marker); a model without FIM tokens is a 400
  saying so.
- ``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props``,
  ``/embedding``: the model's tokenizer, template and embeddings.
- ``GET /slots``, ``POST /slots/{id}?action=save|restore|erase``: the
  session slots, and slot files (``routes/llamacpp.py``).

Errors: ``{"error": {"code", "message", "type"}}``, as llama-server.
Sampling follows llama-server's field names (``n_predict``,
``repeat_penalty``, ``repeat_last_n``, ``ignore_eos``, ``cache_prompt``);
``samplers`` (a custom chain order) is taken with a warning. ``n_probs: N``
adds ``completion_probabilities`` (each token's log-probability and the N
most likely at its place); with ``post_sampling_probs``, the probabilities
(``prob``, ``top_probs``) of what the selection left, as llama-server.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..core.answer import Delta
from ..core.request import ChatRequest, FillIn, Final, Media, Prepared, media_text
from ..engine.slotcontrol import SlotAction, SlotState
from ..engine.types import MEDIA_MARKER, GenerationConfig, PromptProgress, StopReason, TokenTimings
from . import base
from .base import Kind, Served
from .common import BadRequest, constrain, sse_data
from .errors import Failure, llamacpp_error
from .media import base64_item
from .openai_chat import timings
from .render import SSE, Unsent, prompt_progress, token_timings
from .translate import (
    SAMPLING,
    Translation,
    copy_sampling,
    logprobs_setting,
    probabilities,
    sampling_params,
    set_sampling,
    slot_setting,
    stop_strings,
)

#: llama-server's media marker (libmtmd's ``mtmd_default_marker()``)
MTMD_MARKER = "<__media__>"
#: llama-server's default when ``n_predict`` is -1 or absent is "until the
#: end"; a server that must answer on a budget uses the context's room
UNLIMITED = -1

_STOP_TYPES = {
    StopReason.END_OF_TURN: "eos",
    StopReason.EOS: "eos",
    StopReason.TOOL_CALLS: "eos",
    StopReason.MAX_TOKENS: "limit",
    StopReason.STOP_STRING: "word",
    StopReason.CANCELLED: "none",
}


class CompletionBody(BaseModel):
    """``/completion``'s fields we act on; unknown ones are accepted."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    #: text, token ids, or ``{"prompt_string", "multimodal_data"}`` (text
    #: with llama-server's media marker, and each item's base64)
    prompt: str | list[int | str | dict[str, Any]] | dict[str, Any] = ""
    n_predict: int | None = Field(default=None, ge=-1)
    #: (below 0: greedy, as llama-server takes it)
    temperature: float | None = None
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | str | None = None
    ignore_eos: bool | None = None
    cache_prompt: bool | None = None
    stream: bool | None = False
    n_probs: int | None = Field(default=None, ge=0)
    samplers: list[str] | str | None = None
    logit_bias: list[list[Any]] | dict[str, float] | None = None
    id_slot: int | None = None
    #: editors' limits: stop where a later line is indented less (llama.vim,
    #: llama.vscode send the cursor's indentation), and once a line has
    #: ended after this long decoding
    n_indent: int | None = Field(default=None, ge=0)
    t_max_predict_ms: int | float | None = None  # (0 or less: off)
    #: only these fields of the answer ("timings/prompt_n": a nested one, as a top-level key)
    response_fields: list[str] | None = None
    #: constrained output: a GBNF grammar, or a JSON schema
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    #: stream ``prompt_progress`` chunks while the prompt is prefilled
    return_progress: bool | None = None
    #: the engine's timings so far on every streamed text chunk
    timings_per_token: bool | None = None
    #: ``n_probs`` as probabilities after the selection (top-k/p, temperature)
    post_sampling_probs: bool | None = None


class ExtraFile(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    filename: str | None = None  # (absent: "tmp", as llama-server names it)
    text: str = ""


class InfillBody(CompletionBody):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraFile] = Field(default_factory=list)


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    tokens: list[int] = Field(default_factory=list)  # (none: "", as llama-server answers)


class TemplateBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    messages: list[dict[str, Any]]


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    content: str | list[str]


def _config(body: CompletionBody, warnings: list[str]) -> GenerationConfig:
    config = GenerationConfig()
    copy_sampling(body, config, SAMPLING)
    if body.repeat_penalty is not None:
        set_sampling(config, "repeat_penalty", body.repeat_penalty)
    if body.repeat_last_n is not None:
        config.penalty_last_n = body.repeat_last_n  # -1: the whole context (fitted in prepare)
    config.stop = stop_strings([body.stop] if isinstance(body.stop, str) else body.stop) or ()
    config.ignore_eos = bool(body.ignore_eos)
    config.n_indent = body.n_indent or 0
    config.max_predict_seconds = max(0.0, (body.t_max_predict_ms or 0) / 1000.0)
    config.return_progress = bool(body.return_progress and body.stream)
    config.timings_per_token = bool(body.timings_per_token and body.stream)
    config.post_sampling_probs = bool(body.post_sampling_probs)
    config.slot = slot_setting(body.id_slot)
    if body.cache_prompt is False:
        warnings.append("cache_prompt false is ignored: a reused prefix gives the same output")
    if body.samplers is not None:
        warnings.append("samplers: the server's sampler order is used")
    if body.n_probs:
        config.logprobs = logprobs_setting(True, body.n_probs, "n_probs")
    if body.logit_bias:
        config.logit_bias = _logit_bias(body.logit_bias)
    return config


def _logit_bias(value: list[list[Any]] | dict[str, float]) -> dict[int, float]:
    """llama-server's ``[[token, bias], ...]`` (``false`` bans the token) or
    an OpenAI-style ``{"token": bias}``."""
    pairs = value.items() if isinstance(value, dict) else value
    out: dict[int, float] = {}
    for pair in pairs:
        try:
            token, bias = pair
            tid = int(token)
        except (TypeError, ValueError):
            raise BadRequest("logit_bias entries must be [token id, bias]", "logit_bias") from None
        if tid < 0 or isinstance(bias, str):
            raise BadRequest("logit_bias entries must be [token id, bias]", "logit_bias")
        out[tid] = -100.0 if bias is False else max(-100.0, min(100.0, float(bias)))
    return out


def _budget(body: CompletionBody, req: ChatRequest) -> None:
    if body.n_predict is not None and body.n_predict != UNLIMITED:
        # 0: the editors' warm-up (the prompt into the cache): one token, as llama-server answers it
        req.config.max_new_tokens = max(1, body.n_predict)
        req.max_tokens_explicit = True
    elif body.n_predict == UNLIMITED:
        req.default_max_tokens = 1 << 30  # until the context is full or the model stops
    constrain(req, body.grammar, body.json_schema)


def prompt_of(prompt: str | list[Any] | dict[str, Any]) -> tuple[str | None, list[int] | None, list[Media]]:
    """(text, token ids, media): a string, a list of token ids (strings in a
    mixed list are refused: tokenise them with /tokenize), or one multimodal
    prompt (:func:`multimodal_prompt`; also as a list of one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], dict):
        prompt = prompt[0]
    if isinstance(prompt, dict):
        text, media = multimodal_prompt(prompt)
        return text, None, media
    if isinstance(prompt, str):
        return prompt, None, []
    if any(isinstance(t, dict) for t in prompt):
        raise BadRequest("several prompts in one request are not supported: send one prompt per request", "prompt")
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None, [int(t) for t in prompt], []
    raise BadRequest("'prompt' must be a string or a list of token ids", "prompt")


def multimodal_prompt(prompt: dict[str, Any]) -> tuple[str, list[Media]]:
    """llama-server's ``{"prompt_string": "... <__media__> ...",
    "multimodal_data": [base64, ...]}``: the items in order, one per
    marker (its marker becomes the engine's :data:`MEDIA_MARKER`)."""
    text, data = prompt.get("prompt_string"), prompt.get("multimodal_data") or []
    if not isinstance(text, str):
        raise BadRequest("'prompt.prompt_string' must be a string", "prompt.prompt_string")
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise BadRequest("'prompt.multimodal_data' must be a list of base64 strings", "prompt.multimodal_data")
    if not data:
        return text, []
    markers = text.count(MTMD_MARKER)
    if markers != len(data):
        raise BadRequest(
            f"'prompt.prompt_string' has {markers} media marker(s) ({MTMD_MARKER}) for "
            f"{len(data)} item(s) of 'prompt.multimodal_data': one marker stands for each, in order",
            "prompt.multimodal_data",
        )
    media = [base64_item(d, f"prompt.multimodal_data[{i}]") for i, d in enumerate(data)]
    return media_text(text).replace(MTMD_MARKER, MEDIA_MARKER), media


def translate_completion(body: CompletionBody) -> Translation:
    """``/completion``: a raw prompt (no template), with media where its
    object form carries them."""
    warnings: list[str] = []
    text, ids, media = prompt_of(body.prompt)
    req = ChatRequest(prompt=text, prompt_ids=ids, config=_config(body, warnings), media=media)
    _budget(body, req)
    return Translation(req, warnings, bool(body.stream))


def translate_infill(body: InfillBody) -> Translation:
    """``/infill``: fill-in-the-middle, laid out with the model's FIM tokens
    by the core (``generation.fim_ids``)."""
    warnings: list[str] = []
    if not isinstance(body.prompt, str):
        raise BadRequest(
            "'prompt' of /infill must be text (it follows the middle marker; /infill takes no media)", "prompt"
        )
    budget = body.n_predict if body.n_predict is not None else UNLIMITED
    files = [(f.filename if f.filename is not None else "tmp", f.text) for f in body.input_extra]
    fill = FillIn(body.input_prefix, body.input_suffix, files, body.prompt, budget=budget)
    req = ChatRequest(fill_in=fill, config=_config(body, warnings))
    _budget(body, req)
    return Translation(req, warnings, bool(body.stream))


def stop_type(reason: StopReason) -> str:
    return _STOP_TYPES.get(reason, "none")


class CompletionRenderer(Unsent):
    """``/completion`` and ``/infill`` answers: llama-server's JSON, or its
    stream of ``data:`` frames ending in one with ``"stop": true``."""

    media_type = SSE

    def __init__(
        self,
        model_name: str,
        stream: bool,
        prompt: str,
        stop_words: tuple[str, ...],
        settings: dict[str, Any] | None = None,
        fields: list[str] | None = None,
        config: GenerationConfig | None = None,
    ) -> None:
        self.model = model_name
        self.stream = stream
        self.prompt = prompt
        self.stop_words = stop_words
        #: ``generation_settings`` (llama.vscode reads its ``n_ctx`` after every answer)
        self.settings = settings or {}
        self.fields = fields
        #: the run's settings: the engine writes the slot it ran in there (``slot_used``)
        self.config = config
        #: the engine's timings so far (``timings_per_token``), put on text chunks
        self._timings: dict[str, Any] | None = None

    @property
    def slot(self) -> int:
        """The session slot the run was given (-1 before it was)."""
        return self.config.slot_used if self.config is not None else -1

    def _last(self, final: Final) -> dict[str, Any]:
        reason = final.result.reason
        stopping = ""
        if reason is StopReason.STOP_STRING:
            stopping = final.result.stop_string or next((w for w in self.stop_words if w), "")
        return {
            "index": 0,
            "id_slot": final.result.slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": final.completion_tokens,
            "tokens_evaluated": final.prompt_tokens,
            "tokens_cached": final.cached_tokens,
            "prompt": self.prompt,
            "has_new_line": "\n" in final.text,
            "truncated": False,
            "stop_type": stop_type(reason),
            "stopping_word": stopping,
            "generation_settings": self.settings,
            "timings": timings(final),
        }

    def complete(self, final: Final) -> dict[str, Any]:
        out = {"content": final.text, "tokens": [], **self._last(final)}
        if final.logprobs:
            out["completion_probabilities"] = probabilities(
                final.logprobs, self.settings.get("post_sampling_probs", False)
            )
        return pick(out, self.fields)

    def text(self, delta: Delta) -> bytes:
        chunk = {"index": 0, "content": delta.text, "tokens": [], "stop": False, "id_slot": self.slot}
        if delta.logprobs:
            chunk["completion_probabilities"] = probabilities(
                delta.logprobs, self.settings.get("post_sampling_probs", False)
            )
        if self._timings is not None:
            chunk["timings"] = self._timings
        return sse_data(chunk)

    def token_timings(self, timings: TokenTimings) -> None:
        self._timings = token_timings(timings)

    def final(self, final: Final) -> bytes:
        return sse_data(pick({"content": "", "tokens": [], **self._last(final)}, self.fields))

    def prompt_progress(self, progress: PromptProgress) -> bytes:
        chunk = {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": self.slot}
        return sse_data({**chunk, "prompt_progress": prompt_progress(progress)})

    def error(self, failure: Failure) -> bytes:
        return sse_data(failure.body(llamacpp_error))


def pick(answer: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """``response_fields``: only the named fields of the answer, a nested one
    by its path (``"timings/prompt_n"``) as a top-level key, as llama-server
    does; fields it lacks are left out."""
    if not fields:  # (an empty list asks for everything, as llama-server reads it)
        return answer
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = answer
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            if path:
                out[path] = value
    return out


def generation_settings(body: CompletionBody, n_ctx: int, config: GenerationConfig) -> dict[str, Any]:
    """The settings an answer ran with (llama-server's ``generation_settings``)."""
    return {
        "n_ctx": n_ctx,
        **sampling_params(config),
        "n_predict": body.n_predict if body.n_predict is not None else UNLIMITED,
        "n_probs": body.n_probs or 0,
        "post_sampling_probs": bool(body.post_sampling_probs),
        "stream": bool(body.stream),
    }


def slot(state: SlotState, n_ctx: int, speculative: bool, show_task: bool) -> dict[str, Any]:
    """One slot of ``GET /slots`` (llama-server's metrics-only form: never
    the prompt's text); ``show_task``: its job's settings and progress
    (only to whom the slot belongs)."""
    out: dict[str, Any] = {
        "id": state.id,
        "n_ctx": n_ctx,
        "speculative": speculative,
        "is_processing": state.processing,
    }
    task = state.task
    if not show_task:
        return out
    # (what the slot's KV holds: it follows a save, an erase and a restore)
    out["n_prompt_tokens"] = state.tokens_cached
    if task is None:
        return out
    out["id_task"] = task.id
    out["n_prompt_tokens_processed"] = task.n_processed
    out["n_prompt_tokens_cache"] = task.n_cached
    out["params"] = sampling_params(task.config)
    out["next_token"] = [
        {
            "has_next_token": task.has_next_token,
            "has_new_line": task.has_new_line,
            "n_remain": task.n_remain,
            "n_decoded": task.n_decoded,
            "stopping_word": task.stopping_word,
        }
    ]
    return out


def slot_saved(action: SlotAction, filename: str) -> dict[str, Any]:
    """``POST /slots/{id}?action=save``."""
    return {
        "id_slot": action.slot,
        "filename": filename,
        "n_saved": action.tokens,
        "n_written": action.bytes,
        "timings": {"save_ms": action.ms},
    }


def slot_restored(action: SlotAction, filename: str) -> dict[str, Any]:
    """``POST /slots/{id}?action=restore``."""
    return {
        "id_slot": action.slot,
        "filename": filename,
        "n_restored": action.tokens,
        "n_read": action.bytes,
        "timings": {"restore_ms": action.ms},
    }


def slot_erased(action: SlotAction) -> dict[str, Any]:
    """``POST /slots/{id}?action=erase``."""
    return {"id_slot": action.slot, "n_erased": action.tokens}


def props(info: dict[str, Any], parallel: int, template: str) -> dict[str, Any]:
    """``GET /props``."""
    ctx = int(info.get("context") or 0)
    return {
        "default_generation_settings": {
            "n_ctx": ctx,
            "params": {
                "n_predict": UNLIMITED,
                "temperature": 0.8,
                "top_k": 40,
                "top_p": 0.95,
                "min_p": 0.05,
                "seed": 0xFFFFFFFF,  # (llama.cpp's "random": none given by --seed or the preset)
                **(info.get("sampling") or {}),  # the model's preset (config file, --seed)
            },
        },
        "total_slots": parallel,
        "model_path": info.get("path") or info.get("id"),
        "model_alias": info.get("id"),
        "chat_template": template,
        "modalities": {"vision": False, "audio": False},
        "build_info": "turbospark",
    }


def renderer(body: CompletionBody, tr: Translation, prepared: Prepared, served: Served) -> CompletionRenderer:
    """``/completion`` and ``/infill`` answers, with the settings they ran with."""
    given = body.prompt[0] if isinstance(body.prompt, list) and len(body.prompt) == 1 else body.prompt
    prompt = given if isinstance(given, str) else ""
    if isinstance(given, dict) and isinstance(given.get("prompt_string"), str):
        prompt = given["prompt_string"]
    settings = generation_settings(body, served.max_context, prepared.config)
    return CompletionRenderer(
        body.model or served.model,
        tr.stream,
        prompt,
        prepared.config.stop,
        settings,
        body.response_fields,
        prepared.config,
    )


Dialect = base.Dialect(
    "llama.cpp",
    llamacpp_error,
    {
        "/completion": Kind(CompletionBody, translate_completion, renderer),
        # (llama-server's alias; only /v1/completions is OpenAI's)
        "/completions": Kind(CompletionBody, translate_completion, renderer),
        "/infill": Kind(InfillBody, translate_infill, renderer),
    },
)
