"""The one generation core every dialect goes through.

A dialect translates its wire request into a :class:`ChatRequest`, calls
:func:`prepare` (template, tools, grammar, admission: errors here are clean
4xx before any byte of the response is sent), then :func:`complete` or
:func:`stream`, and renders what comes out in its own shape:

- :class:`Delta` — answer text, streamed as the engine produces it;
- :class:`ReasoningDelta` — thinking (``<think>...</think>``) split off the answer;
- :class:`ToolCallBegin`, :class:`ToolArgumentsDelta` — a call streaming:
  its id and name, then its arguments as they are written;
- :class:`ToolCallDelta` — one complete tool call (closing a streamed one);
- :class:`Final` — the end, with the engine's own counts (summed over attempts).

Items are defined, and one run's text is turned into them, in answer.py
(the :class:`~turbospark.answer.Router`). Tool calls: a grammar holds calls
to their one shape where it can (the lazy grammar of ``tool_choice`` auto,
woken by a call marker or a bare call's opening; the grammar of
``tool_choice`` required/named), and such calls stream as they are written.
Otherwise the call text is held back, parsed (tools/calls.py) and validated
against the offered schemas (tools/guardrails.py). With guardrails on, a turn
whose calls are invalid, missing although required, or merely repeating an
answered call gets one re-ask (:func:`_reask`); a call naming no offered tool,
and in a stream a repeated call, are re-asked as soon as they show, their run
stopped there. The second attempt runs through the same path as the first
and its items go out as they come. Structured output (``json_schema``/
``json_object``) is enforced by a grammar too (tools/grammar.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .answer import (
    Delta,
    ProbsCarrier,
    ReasoningDelta,
    Relayed,
    Router,
    ToolArgumentsDelta,
    ToolCallBegin,
    ToolCallDelta,
    after_call,
)
from .engine.channel import Run
from .engine.interface import ChatModel
from .engine.template import TemplateError, fold_inner_system
from .engine.types import (
    AdmissionError,
    CancelFlag,
    ContextOverflow,
    GenerationConfig,
    Progress,
    RawDecodeResult,
    StopReason,
    TokenProb,
)
from .observe import NO_REPORTER, Reporter
from .tools import calls as toolcalls
from .tools import grammar as grammars
from .tools.guardrails import answer_turn, corrective_turn, repeated, validate_calls
from .tools.prompting import inline_tools, template_knows_tools, tool_names
from .tools.rescue import rescue_call

DEFAULT_MAX_TOKENS = 256
EFFORTS_OFF = ("none", "off", "disabled")


@dataclass
class FillIn:
    """Fill-in-the-middle: the model writes what goes between ``prefix`` and
    ``suffix`` (llama.cpp ``/infill``, OpenAI Completions and Ollama
    ``suffix``), with the model's own FIM tokens. ``files``: other files for
    context as (name, text); ``middle``: text the middle starts with.
    ``budget``: laid out and cut to size as llama-server's ``/infill`` does
    (editors send more context than fits and rely on it), given the most
    tokens the answer may take (-1: unbounded)."""

    prefix: str
    suffix: str
    files: list[tuple[str, str]] = field(default_factory=list)
    middle: str = ""
    budget: int | None = None


@dataclass
class ChatRequest:
    """The internal request: what every chat dialect translates into."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    #: A raw prompt (``/v1/completions``, Ollama ``raw``): no chat template.
    prompt: str | None = None
    #: The prompt as token ids already (llama.cpp's ``/completion`` with
    #: ids): used as is.
    prompt_ids: list[int] | None = None
    #: A fill-in-the-middle prompt, laid out with the model's FIM tokens.
    fill_in: FillIn | None = None
    #: OpenAI-style function tools: [{"type": "function", "function": {...}}]
    tools: list[dict[str, Any]] | None = None
    config: GenerationConfig = field(default_factory=GenerationConfig)
    #: True when the client set the budget; otherwise it is a default that
    #: may be clipped to the room left in the context.
    max_tokens_explicit: bool = False
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: "auto" | "none" | "required" | "named" (then ``tool_name``)
    tool_choice: str = "auto"
    tool_name: str | None = None
    parallel_tool_calls: bool = True
    #: structured output: a JSON schema, or any JSON object
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    #: a grammar the output must follow, in llguidance's Lark syntax
    #: (llama.cpp's GBNF ``grammar``, converted by the dialect)
    grammar: str | None = None
    #: reasoning effort asked for ("none" turns thinking off); None: the
    #: model's default
    reasoning: str | None = None
    #: None: the server's --guardrails setting (filled in by the route)
    guardrails: bool | None = None
    #: the most tokens this request may use, prompt and answer together
    #: (Ollama's ``num_ctx``), and the field that set it, for messages; None:
    #: the model's context
    context_limit: int | None = None
    context_limit_field: str = "context_limit"
    #: how many choices to generate for the one prompt (OpenAI ``n``)
    n: int = 1
    #: client stamps taken out of the prompt (``dialects/stamps.py``)
    normalized: int = 0


@dataclass
class Prepared:
    prompt_ids: list[int]
    config: GenerationConfig
    request: ChatRequest | None = None
    #: the tool-call syntax in use, when tools are offered and may be called
    syntax: str | None = None
    offered: tuple[str, ...] = ()
    #: thinking is split off the answer
    think: bool = False
    think_open: bool = False  # the generation prompt already opened <think>
    #: what the client should hear about how the request was taken
    warnings: list[str] = field(default_factory=list)
    #: a grammar holds every call to the one shape (tools/streaming.py), so
    #: calls stream as they are written: "forced" (the whole answer is the
    #: call: tool_choice required/named), "lazy" (from the call marker on)
    call_grammar: str | None = None
    #: for a model that takes requests rather than token ids (a remote
    #: engine, ``takes_messages``): what is sent, less the sampling fields
    body: dict[str, Any] | None = None


@dataclass
class Final:
    """The end of a turn, with the engine's own numbers."""

    result: RawDecodeResult
    text: str
    reasoning: str = ""
    tool_calls: list[toolcalls.ToolCall] = field(default_factory=list)
    #: every engine run of this turn (a guardrail re-ask adds one)
    attempts: list[RawDecodeResult] = field(default_factory=list)
    reasoning_tokens: int = 0
    #: why the calls (if any) were not accepted, after the last attempt
    problems: list[str] = field(default_factory=list)
    choice: int = 0

    def __post_init__(self) -> None:
        if not self.attempts:
            self.attempts = [self.result]

    @property
    def prompt_tokens(self) -> int:
        return sum(a.prompt_tokens for a in self.attempts)

    @property
    def logprobs(self) -> list[TokenProb]:
        """Every sampled token's log-probability, over all attempts (empty
        unless asked for)."""
        return [p for a in self.attempts for p in a.logprobs]

    @property
    def completion_tokens(self) -> int:
        return sum(a.new_tokens for a in self.attempts)

    @property
    def cached_tokens(self) -> int:
        return sum(a.reused_prefix_tokens for a in self.attempts)

    # times summed over attempts, like the counts: after a re-ask every rate
    # is summed tokens over summed times
    @property
    def queue_seconds(self) -> float:
        return sum(a.queue_seconds for a in self.attempts)

    @property
    def prefill_seconds(self) -> float:
        return sum(a.prefill_seconds for a in self.attempts)

    @property
    def decode_seconds(self) -> float:
        return sum(a.decode_seconds for a in self.attempts)

    @property
    def reason(self) -> StopReason:
        """The turn's stop reason: tool calls win over the engine's ending,
        and the engine's "tool calls" stands only if a valid call survived
        (one written in the reasoning, or failing its schema, is no call)."""
        if self.tool_calls:
            return StopReason.TOOL_CALLS
        if self.result.reason is StopReason.TOOL_CALLS:
            return StopReason.END_OF_TURN
        return self.result.reason


# ---------------------------------------------------------------- preparing
def _thinking(model: ChatModel, req: ChatRequest) -> bool:
    effort = req.reasoning if req.reasoning is not None else getattr(model, "default_reasoning", None)
    return effort is None or str(effort).lower() not in EFFORTS_OFF


def thinks(model: ChatModel) -> bool | None:
    """Whether the model can think apart from its answer: its chat template
    handles thinking (Qwen3's ``enable_thinking``, DeepSeek-R1's ``<think>``,
    gpt-oss's reasoning channel, EXAONE-Deep's ``<thought>``). None for a remote engine, which knows its
    own model (a request is sent on as it is)."""
    if getattr(model, "takes_messages", False):
        return None
    return template_thinks(_template_source(model))


def template_thinks(source: str) -> bool:
    """Whether a chat template handles thinking (see :func:`thinks`)."""
    source = source.lower()
    return any(word in source for word in ("think", "reasoning", "thought"))


def asks_thinking(req: ChatRequest) -> bool:
    """The request turns thinking on explicitly (not the model's default)."""
    return req.reasoning is not None and str(req.reasoning).lower() not in EFFORTS_OFF


def _template_source(model: ChatModel) -> str:
    template = getattr(model, "template", None)
    return getattr(template, "source", "") or ""


def render(model: ChatModel, req: ChatRequest) -> list[int]:
    """The prompt token ids exactly as :func:`prepare` prefills them."""
    ids, _, _ = _render(model, req)
    return ids


def count_prompt(model: ChatModel, req: ChatRequest) -> int:
    """The prompt's length in tokens exactly as a real request would be
    prefilled (token counting endpoints): rendered here, or counted by a
    remote engine itself. Blocking: call it off the event loop."""
    if getattr(model, "takes_messages", False):
        return int(model.count_prompt(model.request_body(req)))  # type: ignore[attr-defined]
    return len(render(model, req))


def _render(model: ChatModel, req: ChatRequest) -> tuple[list[int], str | None, bool]:
    """(prompt ids, tool syntax or None, whether thinking is on)."""
    if req.fill_in is not None:
        return fim_ids(model, req.fill_in), None, False
    if req.prompt_ids is not None:
        bad = next((t for t in req.prompt_ids if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise AdmissionError(f"the prompt names token {bad}, but the vocabulary has {model.vocab_size}", "prompt")
        return list(req.prompt_ids), None, False
    if req.prompt is not None:
        if req.prompt == "":
            raise AdmissionError("the prompt is empty", "prompt")
        return model.prompt_ids(req.prompt), None, False
    if not req.messages:
        raise AdmissionError("'messages' must contain at least one message", "messages")
    source = _template_source(model)
    tools = req.tools if req.tool_choice != "none" else None
    syntax = toolcalls.syntax_for_template(source) if tools else None
    messages = req.messages
    kwargs = dict(req.template_kwargs)
    think = _thinking(model, req)
    kwargs.setdefault("enable_thinking", think)
    if req.reasoning is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning)
    has_history_calls = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    offered: list[dict[str, Any]] | None = tools
    if (tools or has_history_calls) and not template_knows_tools(source):
        messages, offered = inline_tools(messages, tools, syntax or "hermes"), None
    try:
        return model.render_chat(messages, tools=offered, **kwargs), syntax, think
    except TemplateError as refused:
        # system entries inside the conversation (Claude Code sends them) where
        # the template takes one only at the start: folded where it can (into
        # the leading one when the model would otherwise add its default)
        folded = fold_inner_system(messages, lead=bool(getattr(model, "default_system", None)))
        if folded is None:
            raise
        try:
            return model.render_chat(folded, tools=offered, **kwargs), syntax, think
        except TemplateError:
            raise refused from None  # (the conversation the client sent is what was refused)


def fim_ids(model: ChatModel, fill: FillIn) -> list[int]:
    """llama.cpp's fill-in-the-middle layout: each context file after the
    file separator (when the vocabulary has one), then the prefix marker and
    prefix, the suffix marker and suffix, the middle marker and the start of
    the middle. Texts are tokenised as text (a marker inside a file stays
    text). A model without FIM tokens is refused."""
    fim: dict[str, int] = getattr(model, "fim_tokens", None) or {}
    pre, suf, mid = fim.get("pre", -1), fim.get("suf", -1), fim.get("mid", -1)
    if min(pre, suf, mid) < 0:
        raise AdmissionError(
            f"model {model.model_id!r} has no fill-in-the-middle tokens; use a FIM model (e.g. qwen2.5-coder-0.5b)",
            "suffix",
        )

    def text(t: str) -> list[int]:
        return model.tokenize(t, False, False) if t else []

    if fill.budget is not None:
        return _infill_ids(model, fill, fim, text)
    ids: list[int] = []
    sep = fim.get("sep", -1)
    for name, body in fill.files:
        if sep >= 0:
            ids += [sep, *text(f"{name}\n")]
        ids += text(body if body.endswith("\n") else body + "\n")
    if fill.files and sep >= 0:
        ids += [sep, *text("\n")]
    return [*ids, pre, *text(fill.prefix), suf, *text(fill.suffix), mid, *text(fill.middle)]


#: the answer's room when ``/infill`` sets no ``n_predict`` (its context cut
#: leaves twice this; llama-server reserves its own ``-n`` instead)
DEFAULT_FIM_ANSWER = 256
#: the batch ``/infill``'s cut is reckoned in (llama-server's default
#: ``n_batch``: ¾ of it for the prefix, ¼ for the suffix), at most half the context
FIM_BATCH = 2048
#: the most characters a token is taken to span where a text is cut before
#: it is tokenised (its kept tokens are the same unless they average more)
CHARS_PER_TOKEN = 32
#: what separates context chunks for a vocabulary without a file separator
#: (llama-server's, written so the model does not read it as code)
_CHUNK = "\n\n--- snippet ---\n\n"


def _infill_ids(model: ChatModel, fill: FillIn, fim: dict[str, int], text: Callable[[str], list[int]]) -> list[int]:
    """llama-server's ``/infill`` layout (repo-level FIM: the repository
    marker, each context file after a file separator, the current file's;
    the request's ``prompt`` ends the prefix), cut to fit as it cuts it: the
    prefix's last three quarters of a batch, the suffix's first quarter less
    the prompt, and the newest context up to the context less a batch and
    twice the answer's budget."""
    n_ctx = model.max_context
    n_batch = min(FIM_BATCH, n_ctx // 2)
    rep, sep = fim.get("rep", -1), fim.get("sep", -1)

    # only what can be kept is tokenised (a 20 MB prefix, tokenised whole
    # to keep 1536 tokens of it, took 18 s): a text's last or first n tokens'
    # worth of characters
    def last(t: str, n: int) -> list[int]:
        return text(t[-n * CHARS_PER_TOKEN :]) if n > 0 else []

    def first(t: str, n: int) -> list[int]:
        return text(t[: n * CHARS_PER_TOKEN]) if n > 0 else []

    prompt = last(fill.middle, n_ctx)
    prefix = last(fill.prefix, 3 * (n_batch // 4))
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)) :]
    room = max(0, n_batch // 4 - (2 + len(prompt)))
    suffix = first(fill.suffix, room)[:room]
    # (an unbounded answer still needs room: the budget it gets by default)
    budget = fill.budget if fill.budget is not None and fill.budget >= 0 else DEFAULT_FIM_ANSWER
    want = max(0, n_ctx - n_batch - 2 * budget)
    # the context: the newest files, from the current file's separator back
    # to the repository header, as far as ``want`` reaches
    pieces = [[sep, *text("filename\n")] if sep >= 0 else []]
    have = len(pieces[0])
    for name, body in reversed(fill.files):
        if have >= want:
            break
        head = [sep, *text(f"{name}\n")] if sep >= 0 else text(_CHUNK)
        pieces.append(head + last(body, want - have))
        have += len(pieces[-1])
    if have < want and rep >= 0:
        pieces.append([rep, *text("myproject\n")])
    extra = [t for piece in reversed(pieces) for t in piece]
    take = min(want, len(extra))
    context = extra[len(extra) - take :] if take else []
    vocab = getattr(model, "file", None)  # (a vocabulary that wants BOS gets it before the prefix marker)
    bos = [int(vocab.bos)] if vocab is not None and vocab.add_bos and vocab.bos >= 0 else []
    # what llama-server's cut can still leave over the context (a long
    # cursor line, a warm-up's whole batch) goes too: the oldest context
    # first, then the prefix's start, the suffix's end, the line's start
    over = len(context) + len(bos) + 3 + len(prefix) + len(prompt) + len(suffix) + max(1, budget) - n_ctx
    for part, from_start in ((context, True), (prefix, True), (suffix, False), (prompt, True)):
        if over <= 0:
            break
        drop = min(over, len(part))
        if from_start:
            del part[:drop]
        else:
            del part[len(part) - drop :]
        over -= drop
    return [*context, *bos, fim["pre"], *prefix, *prompt, fim["suf"], *suffix, fim["mid"]]


def _specials(model: ChatModel) -> dict[str, int]:
    """The call markers that are one special token in the model's vocabulary."""
    marked = getattr(model, "marked_tokens", None) or {}
    return {m: marked[m] for m in toolcalls.MARKERS + (toolcalls.HERMES_CLOSE,) if m in marked}


def _grammar(req: ChatRequest, syntax: str | None, specials: dict[str, int]) -> str | None:
    try:
        if req.tools and req.tool_choice in ("required", "named") and syntax is not None:
            name = req.tool_name if req.tool_choice == "named" else None
            return grammars.tool_call_grammar(req.tools, syntax, name, specials=specials)
        if req.grammar is not None:
            return req.grammar
        if req.json_schema is not None:
            grammars.check_schema(req.json_schema)
            return grammars.json_schema_grammar(req.json_schema)
        if req.json_object:
            return grammars.json_object_grammar()
    except grammars.UnsupportedSchema as exc:
        where = "tools" if req.tool_choice in ("required", "named") and req.tools else "response_format"
        raise AdmissionError(str(exc), where) from None
    except ValueError as exc:  # a tool list the grammar cannot express (duplicate names ...)
        raise AdmissionError(str(exc), "tools") from None
    except RecursionError:
        where = "tools" if req.tool_choice in ("required", "named") and req.tools else "response_format"
        raise AdmissionError("the schema is nested too deeply for a grammar", where) from None
    return None


def _lazy_call_grammar(req: ChatRequest, syntax: str | None, specials: dict[str, int]) -> tuple[str, str] | None:
    """With tools offered and ``tool_choice`` auto: a grammar that lies
    dormant while the model writes text and, from the moment it opens a call
    (the syntax's marker), holds it to valid calls of the offered tools.
    None when the syntax has no marker (bare JSON) or a schema is beyond the
    grammar (the calls are then parsed and validated after the fact)."""
    if not req.tools or req.tool_choice != "auto" or syntax not in toolcalls.CALL_TRIGGERS:
        return None
    if req.json_schema is not None or req.json_object:
        return None
    try:
        grammar = grammars.tool_call_grammar(
            req.tools, syntax, many=req.parallel_tool_calls, specials=specials, lenient=True
        )
    except (grammars.UnsupportedSchema, ValueError, RecursionError):
        return None
    return grammar, toolcalls.CALL_TRIGGERS[syntax]


def _opening_call(req: ChatRequest, syntax: str | None) -> tuple[str, str] | None:
    """With tools offered and ``tool_choice`` auto, in every syntax: the
    grammar of an answer that opens as a bare JSON call and its trigger
    (``grammars.opening_call_grammar``); None when the schemas are beyond it."""
    if not req.tools or req.tool_choice != "auto" or syntax is None:
        return None
    if req.json_schema is not None or req.json_object:
        return None
    try:
        return grammars.opening_call_grammar(req.tools)
    except (grammars.UnsupportedSchema, ValueError, RecursionError):
        return None


def _streamed_calls(model: ChatModel, req: ChatRequest, syntax: str | None, forced: bool, lazy: bool) -> str | None:
    """Whether the calls stream as they are written (``Prepared.call_grammar``):
    only when the engine enforces grammars and a syntax is known."""
    if not getattr(model, "enforces_grammars", False) or not req.tools or syntax is None:
        return None
    if forced and req.tool_choice in ("required", "named"):
        return "forced"
    return "lazy" if lazy else None


def _fit_context_limit(model_context: int, req: ChatRequest, n: int) -> list[str]:
    """Honour the request's own context limit up to the model's context (a
    larger one is a warning, not an error): a default budget is cut to the
    room it leaves, an explicit one that does not fit is refused, never the
    prompt truncated. A repetition window past the context (Ollama's
    ``repeat_last_n: -1``) becomes the context. Returns the warnings."""
    warnings: list[str] = []
    ctx, limit, name = model_context, req.context_limit, req.context_limit_field
    config = req.config
    if limit is not None and limit > ctx:
        warnings.append(f"{name} {limit} is larger than this model's context of {ctx} tokens; using {ctx}")
    elif limit is not None:
        ctx = limit
    if ctx < model_context:
        room = ctx - n
        if room < 1:
            raise ContextOverflow(n, config.max_new_tokens, ctx, name, f"{name} {ctx}")
        if not req.max_tokens_explicit:
            config.max_new_tokens = min(config.max_new_tokens, room)
        elif config.max_new_tokens > room:
            raise ContextOverflow(n, config.max_new_tokens, ctx, "max_tokens", f"{name} {ctx}")
    if config.penalty_last_n < 0 or config.penalty_last_n > ctx:
        # llama.cpp allocates a window of this many tokens: a huge value
        # must not reach it
        config.penalty_last_n = ctx
    return warnings


def prepare(model: ChatModel, req: ChatRequest) -> Prepared:
    """Render and tokenize the prompt, pick tools/grammar, and admit it."""
    if req.tool_choice == "named":
        if req.tool_name not in tool_names(req.tools):
            raise AdmissionError(
                f"tool_choice names {req.tool_name!r}, which is not among the offered tools", "tool_choice"
            )
    if req.tool_choice in ("required", "named") and not tool_names(req.tools):
        raise AdmissionError("tool_choice requires a tool call but no tools were offered", "tool_choice")
    if getattr(model, "takes_messages", False):
        return _prepare_remote(model, req)
    try:
        return _prepare_local(model, req)
    except AdmissionError as exc:
        # the engine names the prompt's field "messages"; a raw prompt's is
        # "prompt" (completions, Ollama generate, llama.cpp)
        if exc.param == "messages" and _raw(req):
            exc.param = "prompt"
        raise


def _raw(req: ChatRequest) -> bool:
    """A prompt given as text or ids, not as messages (no chat template)."""
    return req.prompt is not None or req.prompt_ids is not None or req.fill_in is not None


def _prepare_local(model: ChatModel, req: ChatRequest) -> Prepared:
    ids, syntax, think = _render(model, req)
    raw = _raw(req)
    if not ids:
        raise AdmissionError("the prompt is empty", "prompt" if raw else "messages")
    config = req.config
    if not req.max_tokens_explicit:
        config.max_new_tokens = model.default_max_new(len(ids), req.default_max_tokens)
    model.check_admission(len(ids), config.max_new_tokens)
    warnings = _fit_context_limit(model.max_context, req, len(ids))
    for token in config.logit_bias:  # refused now, not after a stream's headers
        if not 0 <= token < model.vocab_size:
            raise AdmissionError(
                f"logit_bias names token {token}, but the vocabulary has {model.vocab_size} tokens", "logit_bias"
            )
    specials = _specials(model)
    grammar = _grammar(req, syntax, specials)
    lazy = _lazy_call_grammar(req, syntax, specials) if grammar is None else None
    # an answer that opens as a bare JSON call (not for a model that may
    # reason first: the engine could not tell where its answer opens)
    reasons = think and "<think>" in _template_source(model)
    opening = _opening_call(req, syntax) if grammar is None and not reasons else None
    # (set whole: a re-ask's config is a copy of the first attempt's, and
    # its grammars are its own)
    config.grammar, config.grammar_trigger = (grammar, None) if grammar is not None else lazy or (None, None)
    config.opening_grammar, config.opening_trigger = opening or (None, None)
    compile_grammar = getattr(model, "compile_grammar", None)
    if compile_grammar is not None:
        if config.grammar:
            compile_grammar(config.grammar, config.grammar_trigger)
        if config.opening_grammar:
            compile_grammar(config.opening_grammar)
    call_grammar = _streamed_calls(model, req, syntax, grammar is not None, lazy is not None or opening is not None)
    offered = tuple(tool_names(req.tools)) if syntax is not None else ()
    if offered:
        names = set(offered)
        config.tool_call_check = lambda text: bool(toolcalls.parse_tool_calls(text, names).calls)
    think_open = False
    if reasons and not raw:
        # a template whose generation prompt opens <think> itself: the
        # output starts inside the reasoning
        opener = model.tokenize("<think>", False, True)
        think_open = bool(opener) and (ids[-len(opener) :] == opener or ids[-len(opener) - 1 : -1] == opener)
    # thinking is split off whenever the model writes it (the effort only
    # flips the template's switch); raw prompts are left alone
    return Prepared(ids, config, req, syntax, offered, not raw, think_open, warnings, call_grammar)


def _prepare_remote(model: ChatModel, req: ChatRequest) -> Prepared:
    """A model that takes the request itself (a remote engine): checked and
    translated into the body it is sent; the upstream templates, tokenises,
    enforces grammars and admits (its refusals are relayed). Tool calls it
    parses come back as calls; calls it leaves in the text are read by the
    same parsers and rescue as a local model's."""
    if req.fill_in is not None:
        raise AdmissionError(
            f"model {model.model_id!r} runs on a remote engine; fill-in-the-middle needs a local model", "suffix"
        )
    raw = _raw(req)  # (fill-in-the-middle was refused above)
    if req.prompt == "" or (req.prompt_ids is not None and not req.prompt_ids):
        raise AdmissionError("the prompt is empty", "prompt")
    if not raw and not req.messages:
        raise AdmissionError("'messages' must contain at least one message", "messages")
    if req.grammar is not None or (raw and (req.json_schema is not None or req.json_object)):
        # (a raw prompt's structure is not in an OpenAI chat body: it would go unenforced)
        where = "grammar" if req.grammar is not None else "json_schema"
        raise AdmissionError(f"model {model.model_id!r} runs on a remote engine; '{where}' needs a local model", where)
    warnings: list[str] = []
    config = req.config
    if req.context_limit is not None and req.context_limit < model.max_context:
        warnings.append(f"{req.context_limit_field} is not applied to a remote engine")
    if config.n_indent or config.max_predict_seconds:
        warnings.append("n_indent and t_max_predict_ms are not applied to a remote engine")
    tools = req.tools if req.tool_choice != "none" and not raw else None
    syntax = toolcalls.syntax_for_template("") if tools else None
    offered = tuple(tool_names(tools)) if syntax is not None else ()
    body = model.request_body(req)  # type: ignore[attr-defined]
    return Prepared([], config, req, syntax, offered, not raw, False, warnings, body=body)


# --------------------------------------------------------------- generating
async def complete(model: ChatModel, prepared: Prepared, cancel: CancelFlag, reporter: Reporter = NO_REPORTER) -> Final:
    """Run the turn to its end (the same path as :func:`stream`)."""
    return (await complete_choices(model, prepared, cancel, reporter))[0]


async def complete_choices(
    model: ChatModel, prepared: Prepared, cancel: CancelFlag, reporter: Reporter = NO_REPORTER
) -> list[Final]:
    """Every choice's :class:`Final`, in choice order."""
    finals: list[Final] = []
    async for item in stream(model, prepared, cancel, reporter):
        if isinstance(item, Final):
            finals.append(item)
    finals.sort(key=lambda f: f.choice)
    return finals


async def _run(
    model: ChatModel, prepared: Prepared, cancel: CancelFlag, reporter: Reporter, run: Run | None = None
) -> AsyncIterator[Progress | RawDecodeResult]:
    """One engine run (``run``, else one started here): its progress, then
    its result, which ``reporter`` records as ``generated`` the moment the
    run ends. Closing the iterator early sets the cancel flag and leaves the
    run to end at the engine's next step (it is still reported: the reporter
    tracks its result's future)."""
    if run is None:
        run = _start(model, prepared, prepared.config, cancel)
    model_id = model.model_id
    reported = False

    def report(done: asyncio.Future[RawDecodeResult]) -> None:
        nonlocal reported
        if not reported and not done.cancelled() and done.exception() is None:
            reported = True
            reporter.generated(model_id, done.result())

    # an abandoned run is reported when it ends; one still iterated, before
    # its result is handed on (so ``generated`` precedes what follows it)
    run.done.add_done_callback(report)
    reporter.running(run.done)
    try:
        async for item in run:  # raises the engine's error, if any
            if isinstance(item, RawDecodeResult):
                report(run.done)
            yield item
    finally:
        if not run.done.done():
            cancel.cancel("the client went away")


def _start(model: ChatModel, prepared: Prepared, config: GenerationConfig, cancel: CancelFlag) -> Run:
    """One engine run of ``prepared`` with ``config`` (a choice's own)."""
    if prepared.body is not None:
        return model.generate_body(prepared.body, config, cancel)  # type: ignore[attr-defined,no-any-return]
    return model.generate(prepared.prompt_ids, config, None, cancel)


Item = Delta | ReasoningDelta | ToolCallBegin | ToolArgumentsDelta | ToolCallDelta | Final


async def stream(
    model: ChatModel, prepared: Prepared, cancel: CancelFlag, reporter: Reporter = NO_REPORTER, live: bool = False
) -> AsyncIterator[Item]:
    """Deltas as the engine produces them, tool calls once validated, then
    one :class:`Final` per choice; each engine run is reported through
    ``reporter``. With ``n`` > 1 the choices run side by side (one prefill,
    see ``LlamaChatModel.generate_many``) and their items interleave, each
    tagged with its ``choice``. ``live``: a client reads the items as they
    come, so nothing is held back for long (``Router.speculate``)."""
    n = prepared.request.n if prepared.request is not None else 1
    if n == 1:  # the hot path: no wrapper (its items are choice 0 already)
        async for item in _one_choice(model, prepared, cancel, reporter, None, live):
            yield item
        return
    configs = [prepared.config] + [
        dataclasses.replace(
            prepared.config,
            seed=None if prepared.config.seed is None else prepared.config.seed + i,
            session_key=None,  # the conversation's slot stays choice 0's
            reservation=None,
        )
        for i in range(1, n)
    ]
    many = getattr(model, "generate_many", None)
    if many is not None and prepared.body is None:
        runs = many(prepared.prompt_ids, configs, None, cancel)
    else:  # an engine without shared prefill: n plain runs
        runs = [_start(model, prepared, c, cancel) for c in configs]
    choices = [
        _choice(model, dataclasses.replace(prepared, config=c), cancel, reporter, run, i, live)
        for i, (c, run) in enumerate(zip(configs, runs))
    ]
    async for item in _merge(choices):
        yield item


async def _merge(sources: list[AsyncGenerator[Item, None]]) -> AsyncIterator[Item]:
    """The items of several iterators as they come. The hand-over queue is
    small, so a reader that stops reading stops the pumps, and the engine's
    own bound on unread output (``ReaderBehind``) still applies."""
    queue: asyncio.Queue[Item | BaseException | None] = asyncio.Queue(maxsize=16)

    async def pump(source: AsyncGenerator[Item, None]) -> None:
        try:
            async for item in source:
                await queue.put(item)
            await queue.put(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put(exc)
        finally:
            await source.aclose()  # its engine run is cancelled if still going

    tasks = [asyncio.create_task(pump(s)) for s in sources]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _choice(
    model: ChatModel,
    prepared: Prepared,
    cancel: CancelFlag,
    reporter: Reporter,
    run: Run | None = None,
    index: int = 0,
    live: bool = False,
) -> AsyncGenerator[Item, None]:
    """One choice: its run's deltas, its tool calls (with a guardrail
    re-ask when needed), its :class:`Final`."""
    async for item in _one_choice(model, prepared, cancel, reporter.for_choice(index), run, live):
        item.choice = index
        yield item


async def _one_choice(
    model: ChatModel,
    prepared: Prepared,
    cancel: CancelFlag,
    reporter: Reporter,
    run: Run | None,
    live: bool = False,
    reask: bool = True,
) -> AsyncIterator[Item]:
    """One choice's items. ``reask``: the guardrails may ask a second time
    (never from a second attempt's own run). A call that names no offered
    tool is re-asked the moment its name is out: its run is stopped there
    (it has a cancel flag of its own when this choice starts it)."""
    req = prepared.request
    reask = reask and req is not None and req.guardrails is not False and bool(prepared.offered)
    own = cancel.child() if reask and run is None else cancel
    router = Router(prepared, live=live, reask=reask, stops=own is not cancel)
    attempts: list[RawDecodeResult] = []
    result: RawDecodeResult | None = None
    probs = ProbsCarrier()
    relayed: Relayed | None = None
    retry: Prepared | None = None  # the guardrails' second attempt, if they ask for one
    early = False  # whether a re-ask was asked for before the run ended
    async for item in _run(model, prepared, own, reporter, run):
        if not isinstance(item, Progress):
            result = item
            continue
        if retry is not None:  # stopped for the re-ask: the rest is dropped
            continue
        if item.call is not None or item.reasoning:  # split by the engine itself
            relayed = relayed or Relayed()
            for r in relayed.feed(item, router):
                yield r
            continue
        for d in probs.attach(item.logprobs, router.feed(item.text, item.opening)):
            yield d
        if (router.misnamed is not None or router.repeat is not None) and own is not cancel and not early:
            early = True
            if router.misnamed is not None:
                retry = await _guard(model, prepared, router, [router.misnamed], [], cancel)
            elif router.repeat is not None:  # hand the result back (``_reask``)
                retry = await _guard(model, prepared, router, [], [router.repeat], cancel)
            if retry is not None:
                own.cancel("re-asked: " + (router.misnamed or "the call repeats one the conversation has"))
            else:  # no room for a second attempt: the first goes on, as it is
                reask = False
                for d in router.no_reask():
                    yield d
    assert result is not None
    # (a run stopped for the re-ask may have been failed meanwhile as a slow
    # reader: its output was left unread while the re-ask was prepared)
    _raise_if_failed(result, cancel if retry is not None else own)
    attempts.append(result)
    if retry is None:
        for d in probs.attach((), router.flush()):
            yield d
    calls: list[toolcalls.ToolCall] = []
    problems: list[str] = []
    buffered = whole = False  # the calls were checked whole (and are sent whole)
    if retry is not None:  # stopped where its call named no offered tool, or repeated one
        problems = [router.misnamed] if router.misnamed else []
    elif relayed is not None and relayed.calls:
        # calls the engine parsed itself went out as they came: closed here
        relayed_calls = relayed.finish()
        calls = [call for call, _ in relayed_calls]
        for i, (call, streamed) in enumerate(relayed_calls):
            yield ToolCallDelta(i, call, streamed=streamed)
        problems = validate_calls(calls, req.tools if req else None)
        leftover = _calls_of(router.tail, prepared)[2] if router.tail else ""
        if leftover.strip():
            yield router._content(leftover)
    elif router.streamed_calls:
        # out already (the grammar kept them valid, or they were read on
        # speculation and are validated here): no re-ask in a stream
        assert router.reader is not None
        calls = list(router.reader.calls)
        problems = validate_calls(calls, req.tools if req else None)
        cut = router.reader.partial
        if cut is not None:  # the budget ran out inside it: closed as it is
            yield ToolCallDelta(len(calls), cut, streamed=True, cut=True)
            problems.append(f"the answer ended inside the call to {cut.name!r}")
            # a body that is not streamed keeps the unfinished call as text
            router.content.append(router.reader.partial_text)
        elif not router.rest_streams and (rest := after_call(router.reader.rest)).strip():
            # what followed the calls read (text a grammar would not have let
            # through): more calls, sent whole, and text
            more, more_problems, leftover = _calls_of(rest, prepared)
            if req is not None and not req.parallel_tool_calls:
                more = []
            for i, call in enumerate(more, len(calls)):
                yield ToolCallDelta(i, call)
            calls, problems = calls + more, problems + more_problems
            if leftover.strip():
                yield router._content(leftover)
        elif not live:
            # a client reading the whole answer at once has seen none of it:
            # the guardrails' checks (a grammar-held call may still repeat one
            # whose result the conversation has) and their re-ask
            if reask and result.reason is not StopReason.MAX_TOKENS:
                retry = await _guard(model, prepared, router, problems, calls, cancel)
            buffered = True
    elif prepared.offered:
        calls, problems, leftover = _calls_of(router.tail, prepared)
        # (an answer the budget cut short stands: a second attempt would have
        # no more room than the first had)
        if reask and result.reason is not StopReason.MAX_TOKENS:
            retry = await _guard(model, prepared, router, problems, calls, cancel)
        if retry is None and leftover.strip():
            # what the first attempt wrote from its call on is the answer's
            # rest only when it stands: a re-ask's answer replaces it
            yield router._content(leftover)
        buffered = whole = True
    if retry is not None:
        # the second attempt: its items go out as they come (after what the
        # first already sent; the first's answer from its call on is
        # replaced), and its Final's numbers join this one's
        again: Final | None = None
        async for later in _one_choice(model, retry, cancel, reporter, None, live, reask=False):
            if isinstance(later, Final):
                again = later
            else:
                yield later
        assert again is not None
        router.content.append(again.text)
        router.reasoning.append(again.reasoning)
        attempts += again.attempts
        result, calls, problems = again.result, again.tool_calls, again.problems
        buffered = whole = False  # its calls went out in its own run
    if buffered and req is not None and not req.parallel_tool_calls:
        calls = calls[:1]
    for i, call in enumerate(calls if whole else ()):  # calls checked whole go out whole
        yield ToolCallDelta(i, call)
    reasoning = "".join(router.reasoning)
    yield Final(
        result=result,
        text="".join(router.content),
        reasoning=reasoning,
        tool_calls=calls,
        attempts=attempts,
        reasoning_tokens=_reasoning_tokens(model, result, reasoning),
        problems=problems,
    )


async def _guard(
    model: ChatModel,
    prepared: Prepared,
    router: Router,
    problems: list[str],
    calls: list[toolcalls.ToolCall],
    cancel: CancelFlag,
) -> Prepared | None:
    """The guardrails' second attempt for this answer, if they ask for one
    (``_reask``; templating the longer prompt runs off the event loop). A
    request that was given up gets none."""
    if cancel.cancelled:
        return None
    return await asyncio.to_thread(_reask, model, prepared, router, problems, calls)


def _reasoning_tokens(model: ChatModel, result: RawDecodeResult, reasoning: str) -> int:
    if result.reasoning_tokens is not None:  # the engine counted them
        return result.reasoning_tokens
    if not reasoning or getattr(model, "takes_messages", False):
        return 0
    return len(model.tokenize(reasoning, False, False))


def _raise_if_failed(result: RawDecodeResult, cancel: CancelFlag) -> None:
    """A run stopped by :meth:`CancelFlag.fail` ends the request with that
    error (its ``generated`` is reported all the same)."""
    if result.reason is StopReason.CANCELLED and cancel.error is not None:
        raise cancel.error


def _calls_of(text: str, prepared: Prepared) -> tuple[list[toolcalls.ToolCall], list[str], str]:
    """(valid calls, problems, text that was not a call)."""
    if not text:
        return [], [], ""
    parsed = toolcalls.parse_tool_calls(text, prepared.offered)
    req = prepared.request
    if not parsed.calls and req is not None:
        rescued, why = rescue_call(text, req.tools)
        if rescued is not None:
            return [rescued], [], ""
        if why is not None and not parsed.problems:
            return [], [why], text
    problems = list(parsed.problems)
    problems += validate_calls(parsed.calls, req.tools if req else None)
    valid = (
        parsed.calls
        if not problems
        else [c for c in parsed.calls if not validate_calls([c], req.tools if req else None)]
    )
    return valid, problems, parsed.content


def _reask(
    model: ChatModel, prepared: Prepared, router: Router, problems: list[str], calls: list[toolcalls.ToolCall]
) -> Prepared | None:
    """The corrective second attempt the guardrails ask for, or None when the
    first answer stands (it is fine, or a second attempt cannot fit)."""
    req = prepared.request
    assert req is not None
    raw = "".join(router.content) + router.tail
    names = list(prepared.offered)
    required = req.tool_choice in ("required", "named")
    results = repeated(calls, req.messages) if calls and not problems else []
    choice = req.tool_choice
    if problems or (required and not calls):
        example = toolcalls.render_call(prepared.syntax or "hermes", names[0], {"...": "..."}) if names else ""
        turn = corrective_turn(raw, problems, names, example)
        # the corrective turn asks for a call: where a grammar can hold the
        # second attempt to one valid call (the prompt is the same), it does;
        # not where the first made valid calls beside the bad one, nor for a
        # model that may reason first (the call would be its reasoning), a
        # remote engine (it may refuse "required") or structured output
        reasons = "<think>" in _template_source(model)
        plain = not (reasons or req.json_schema is not None or req.json_object or calls)
        if choice == "auto" and plain and not getattr(model, "takes_messages", False):
            choice = "required"
    elif results and not required:
        turn = answer_turn(raw, results)
    else:
        return None
    retry_req = dataclasses.replace(
        req,
        messages=[*req.messages, *turn],
        # a copy: prepare sets the retry's own budget, grammar and call check
        config=dataclasses.replace(prepared.config),
        # a budget that was clipped to the room in the context (not set by the
        # client) is clipped again to the room the longer prompt leaves, or
        # the second attempt could never fit
        max_tokens_explicit=req.max_tokens_explicit,
        default_max_tokens=prepared.config.max_new_tokens,
    )
    # the forced choice first; a tool beyond its grammar (a "tools" refusal)
    # falls back to the client's own; anything else (no room for a second
    # attempt) lets the first answer stand
    for attempt in dict.fromkeys((choice, req.tool_choice)):
        try:
            return prepare(model, dataclasses.replace(retry_req, tool_choice=attempt))
        except AdmissionError as exc:
            if attempt == req.tool_choice or exc.param != "tools":
                return None
    return None
