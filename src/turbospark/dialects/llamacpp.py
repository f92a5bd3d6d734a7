"""llama.cpp server's own API (``llama-server``'s native routes): wire models
and pure translations, so editors and tools written for llama-server
(llama.vscode's ``/infill``, scripts using ``/completion`` or
``/tokenize``) work unchanged.

- ``POST /completion``: a raw prompt (a string, token ids, ids and texts
  mixed, or ``{"prompt_string", "multimodal_data"}``: images and sound at
  its ``<__media__>`` markers; a list of prompts answers a list of
  results, ``dialects/prompts.py``) →
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
from ..core.request import ChatRequest, FillIn, Final, Prepared
from ..engine.slotcontrol import SlotAction, SlotState
from ..engine.types import GenerationConfig, PromptProgress, StopReason, TokenTimings
from . import base
from .base import Kind, Served
from .common import BadRequest, constrain, sse_data
from .errors import Failure, llamacpp_error
from .openai_chat import timings
from .prompts import batch, prompts_of
from .render import SSE, Unsent, progress_timings, prompt_progress, stop_type, token_timings
from .translate import (
    SAMPLING,
    Translation,
    copy_sampling,
    logit_bias,
    logprobs_setting,
    probabilities,
    sampling_params,
    set_sampling,
    slot_setting,
    stop_strings,
)

#: llama-server's default when ``n_predict`` is -1 or absent is "until the
#: end"; a server that must answer on a budget uses the context's room
UNLIMITED = -1


class CompletionBody(BaseModel):
    """``/completion``'s fields we act on; unknown ones are accepted."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    #: text, token ids, ids and texts mixed, ``{"prompt_string",
    #: "multimodal_data"}`` (text with llama-server's media marker, and each
    #: item's base64), or a list of such prompts (``dialects/prompts.py``)
    prompt: str | list[Any] | dict[str, Any] = ""
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
    logit_bias: list[list[Any]] | dict[str, Any] | None = None
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
    #: the answer's token ids in ``tokens`` (a stream's chunks always carry theirs)
    return_tokens: bool | None = None
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
    config.token_ids = bool(body.stream)  # (each chunk's ``tokens``)
    config.post_sampling_probs = bool(body.post_sampling_probs)
    config.slot = slot_setting(body.id_slot)
    if body.cache_prompt is False:
        warnings.append("cache_prompt false is ignored: a reused prefix gives the same output")
    if body.samplers is not None:
        warnings.append("samplers: the server's sampler order is used")
    if body.n_probs:
        config.logprobs = logprobs_setting(True, body.n_probs, "n_probs")
    if body.logit_bias:
        config.logit_bias, config.logit_bias_text = logit_bias(body.logit_bias)
    return config


def _budget(body: CompletionBody, req: ChatRequest) -> None:
    if body.n_predict is not None and body.n_predict != UNLIMITED:
        # 0: the editors' warm-up (the prompt into the cache): one token, as llama-server answers it
        req.config.max_new_tokens = max(1, body.n_predict)
        req.max_tokens_explicit = True
    elif body.n_predict == UNLIMITED:
        req.default_max_tokens = 1 << 30  # until the context is full or the model stops
    constrain(req, body.grammar, body.json_schema)


def translate_completion(body: CompletionBody) -> Translation:
    """``/completion``: a raw prompt (no template), with media where its
    object form carries them; a list of prompts is several requests
    (``ChatRequest.batch``), answered by their indexes."""
    warnings: list[str] = []

    def make() -> ChatRequest:
        req = ChatRequest(config=_config(body, warnings))
        _budget(body, req)
        return req

    prompts = prompts_of(body.prompt)
    req = batch(prompts, make)
    return Translation(req, list(dict.fromkeys(warnings)), bool(body.stream), {"prompts": [p.shown for p in prompts]})


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


class CompletionRenderer(Unsent):
    """``/completion`` and ``/infill`` answers: llama-server's JSON, or its
    stream of ``data:`` frames ending in one with ``"stop": true``."""

    media_type = SSE

    def __init__(
        self,
        model_name: str,
        stream: bool,
        prompts: list[str],
        stop_words: tuple[str, ...],
        settings: dict[str, Any] | None = None,
        fields: list[str] | None = None,
        return_tokens: bool = False,
        config: GenerationConfig | None = None,
    ) -> None:
        self.model = model_name
        #: the answer's ids in ``tokens`` (not streamed; a stream's chunks carry theirs)
        self.return_tokens = return_tokens
        self.stream = stream
        #: each prompt as the answer echoes it (its text; "" for token ids), by index
        self.prompts = prompts
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
            "index": final.choice,
            "id_slot": final.result.slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": final.completion_tokens,
            "tokens_evaluated": final.prompt_tokens,
            "tokens_cached": final.cached_tokens,
            "prompt": self.prompts[final.choice] if final.choice < len(self.prompts) else "",
            "has_new_line": "\n" in final.text,
            "truncated": False,
            "stop_type": stop_type(reason),
            "stopping_word": stopping,
            "generation_settings": self.settings,
            "timings": timings(final),
        }

    def complete(self, final: Final) -> dict[str, Any]:
        ids = list(final.result.token_ids) if self.return_tokens else []
        out = {"content": final.text, "tokens": ids, **self._last(final)}
        if final.logprobs:
            out["completion_probabilities"] = probabilities(
                final.logprobs, self.settings.get("post_sampling_probs", False)
            )
        return pick(out, self.fields)

    def complete_choices(self, finals: list[Final]) -> list[dict[str, Any]]:
        """Several prompts' answers: one result each, in index order, as
        llama-server answers them (a list)."""
        return [self.complete(final) for final in finals]

    def text(self, delta: Delta) -> bytes:
        chunk = {
            "index": delta.choice,
            "content": delta.text,
            "tokens": list(delta.ids),
            "stop": False,
            "id_slot": self.slot,
        }
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
        chunk["prompt_progress"] = prompt_progress(progress)
        if self.settings.get("timings_per_token"):
            chunk["timings"] = progress_timings(progress)
        return sse_data(chunk)

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


#: llama-server's samplers this server does not run, as its settings show
#: them switched off (its defaults)
SAMPLERS_OFF: dict[str, Any] = {
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "typical_p": 1.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
}
#: the sampler chain, in its order, under llama-server's names
SAMPLER_ORDER = ["penalties", "top_k", "top_p", "min_p", "temperature"]


def generation_settings(body: CompletionBody, n_ctx: int, prepared: Prepared) -> dict[str, Any]:
    """The settings an answer ran with: every key of llama-server's
    ``generation_settings`` (with ``n_ctx``, which editors read); its
    ``logit_bias`` holds the end-of-generation tokens ``ignore_eos`` bans
    (bias ``null``: minus infinity, as llama-server writes it)."""
    config = prepared.config
    n_predict = body.n_predict if body.n_predict is not None else UNLIMITED
    bias: list[dict[str, Any]] = [{"bias": b, "token": t} for t, b in config.logit_bias.items()]
    bias += [{"bias": None, "token": t} for t in prepared.eog]
    return {
        "n_ctx": n_ctx,
        **sampling_params(config),
        **SAMPLERS_OFF,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "n_keep": 0,
        "n_discard": 0,
        "stream": bool(body.stream),
        "logit_bias": bias,
        "n_probs": body.n_probs or 0,
        "min_keep": 0,
        "grammar": body.grammar or "",
        "grammar_lazy": False,
        "grammar_triggers": [],
        "preserved_tokens": [],
        "chat_format": "Content-only",
        "reasoning_format": "none",
        "reasoning_in_content": False,
        "generation_prompt": "",
        "samplers": SAMPLER_ORDER,
        "speculative.types": "ngram-simple" if config.speculative else "none",
        "timings_per_token": bool(body.timings_per_token),
        "post_sampling_probs": bool(body.post_sampling_probs),
        "backend_sampling": False,
        "lora": [],
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
    prompts = tr.extras.get("prompts") or [body.prompt if isinstance(body.prompt, str) else ""]
    settings = generation_settings(body, served.max_context, prepared)
    return CompletionRenderer(
        body.model or served.model,
        tr.stream,
        prompts,
        prepared.config.stop,
        settings,
        body.response_fields,
        bool(body.return_tokens),
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
