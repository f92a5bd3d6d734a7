"""A local model's prompt: what :class:`~turbospark.models.local.LocalBackend`
prepares before any engine work. The chat template (tools offered the
template's way or inlined, thinking switched, inner system turns folded
where a template refuses them), raw prompts and token ids, the
fill-in-the-middle layouts (llama-server's ``/infill`` cut included), the
grammars (forced and lazy tool calls, an answer opening as a bare call,
structured output, a client's own), the budget and the admission checks.
Blocking: runs on a worker thread."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ..core.media import check_media
from ..core.request import EFFORTS_OFF, ChatRequest, FillIn, Prepared
from ..engine.interface import ChatModel
from ..engine.media import MediaError
from ..engine.template import TemplateError, fold_inner_system
from ..engine.types import AdmissionError, ContextOverflow
from ..tools import calls as toolcalls
from ..tools import grammar as grammars
from ..tools.prompting import inline_tools, template_knows_tools, tool_names


def _thinking(model: ChatModel, req: ChatRequest) -> bool:
    effort = req.reasoning if req.reasoning is not None else model.default_reasoning
    return effort is None or str(effort).lower() not in EFFORTS_OFF


def render(model: ChatModel, req: ChatRequest) -> list[int]:
    """The prompt token ids exactly as :func:`prepare` prefills them (a
    media chunk's tokens as its placeholders)."""
    return _render(model, req).ids


class _Rendered(NamedTuple):
    ids: list[int]
    syntax: str | None = None
    think: bool = False
    #: the engine's ``MediaPrompt`` when the prompt has media (``ids`` are its)
    media: Any = None
    #: the prompt as text (only for a request that asked: ``ChatRequest.verbose``)
    text: str | None = None


def _media_bytes(req: ChatRequest) -> list[bytes]:
    """The request's media, each fetched by now (the route fetches URLs),
    checked before the engine decodes any (``core.media``: a format taken
    here, an image's declared size)."""
    for m in req.media:
        if m.url is not None and not m.data:
            raise AdmissionError(f"the media at '{m.field}' was not fetched", m.field)
    check_media(req.media)
    return [m.data for m in req.media]


@contextlib.contextmanager
def _named(req: ChatRequest) -> Iterator[None]:
    """An item the engine refuses, named by the field it came in."""
    try:
        yield
    except MediaError as exc:
        if exc.index is None or not 0 <= exc.index < len(req.media):
            raise
        field = req.media[exc.index].field
        named = MediaError(str(exc).replace(f"media item {exc.index}", f"'{field}'", 1), field, exc.index)
        named.code = "invalid_media"
        raise named from None


def _render(model: ChatModel, req: ChatRequest) -> _Rendered:
    """The prompt ids, the tool syntax or None, whether thinking is on, and
    the prompt's media as the engine prepared them."""
    if req.media and (req.fill_in is not None or req.prompt_ids is not None):
        raise AdmissionError("media go with a text prompt or messages, not a token-id or fill-in prompt", "prompt")
    if req.fill_in is not None:
        return _Rendered(fim_ids(model, req.fill_in))
    given = req.prompt_ids
    if req.prompt_mixed is not None:  # (llama-server's: a text's BOS only as the first part)
        mixed = enumerate(req.prompt_mixed)
        given = [t for i, p in mixed for t in (model.tokenize(p, i == 0, False) if isinstance(p, str) else [p])]
    if given is not None:
        bad = next((t for t in given if not 0 <= t < model.vocab_size), None)
        if bad is not None:
            raise AdmissionError(f"the prompt names token {bad}, but the vocabulary has {model.vocab_size}", "prompt")
        return _Rendered(list(given), text=model.detokenize(given) if req.verbose else None)
    if req.prompt is not None:
        if req.prompt == "":
            raise AdmissionError("the prompt is empty", "prompt")
        if req.media:
            with _named(req):
                media = model.media_prompt(req.prompt, _media_bytes(req), chat=False)
            return _Rendered(media.ids, media=media, text=req.prompt)
        return _Rendered(model.prompt_ids(req.prompt), text=req.prompt)
    if not req.messages and not req.empty_chat:
        raise AdmissionError("'messages' must contain at least one message", "messages")
    source = model.template_source
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
        return _chat(model, req, messages, offered, kwargs)._replace(syntax=syntax, think=think)
    except TemplateError as refused:
        # system entries inside the conversation (Claude Code sends them) where
        # the template takes one only at the start: folded where it can (into
        # the leading one when the model would otherwise add its default)
        folded = fold_inner_system(messages, lead=bool(model.default_system))
        if folded is None:
            raise
        try:
            return _chat(model, req, folded, offered, kwargs)._replace(syntax=syntax, think=think)
        except TemplateError:
            raise refused from None  # (the conversation the client sent is what was refused)


def _chat(
    model: ChatModel,
    req: ChatRequest,
    messages: list[dict[str, Any]],
    offered: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> _Rendered:
    if req.continue_final:
        return _prefilled(model, req, messages, offered, kwargs)
    text = model.chat_text(messages, offered, **kwargs) if req.verbose else None
    if not req.media:
        return _Rendered(model.render_chat(messages, tools=offered, **kwargs), text=text)
    with _named(req):
        media = model.render_media_chat(messages, _media_bytes(req), tools=offered, **kwargs)
    return _Rendered(media.ids, media=media, text=text)


def _prefilled(
    model: ChatModel,
    req: ChatRequest,
    messages: list[dict[str, Any]],
    offered: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> _Rendered:
    """A final assistant message continued (a prefill, llama-server's
    ``continue_final_message``): the conversation before it and the
    generation prompt, then its text, the answer going on from there; the
    whole text tokenized at once, BOS as the model wants it."""
    text = model.chat_text(messages[:-1], offered, **kwargs) + str(messages[-1].get("content") or "")
    if req.media:
        with _named(req):
            media = model.media_prompt(text, _media_bytes(req), chat=True)
        return _Rendered(media.ids, media=media, text=text)
    ids, bos = model.tokenize(text, False, True), list(model.leading_bos)
    return _Rendered(ids if not bos or ids[: len(bos)] == bos else bos + ids, text=text)


def fim_ids(model: ChatModel, fill: FillIn) -> list[int]:
    """llama.cpp's fill-in-the-middle layout: each context file after the
    file separator (when the vocabulary has one), then the prefix marker and
    prefix, the suffix marker and suffix, the middle marker and the start of
    the middle. Texts are tokenised as text (a marker inside a file stays
    text). A model without FIM tokens is refused."""
    fim = model.fim_tokens
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
    bos = list(model.leading_bos)  # (a vocabulary that wants BOS gets it before the prefix marker)
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
    marked = model.marked_tokens
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
    if not model.enforces_grammars or not req.tools or syntax is None:
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


def prepare_local(model: ChatModel, req: ChatRequest) -> Prepared:
    """Render and tokenise the prompt, pick the grammars, and admit it."""
    try:
        return _prepare(model, req)
    except AdmissionError as exc:
        # the engine names the prompt's field "messages"; a raw prompt's is
        # "prompt" (completions, Ollama generate, llama.cpp)
        if exc.param == "messages" and req.is_raw():
            exc.param = "prompt"
        raise


def _prepare(model: ChatModel, req: ChatRequest) -> Prepared:
    rendered = _render(model, req)
    ids, syntax, think, media = rendered.ids, rendered.syntax, rendered.think, rendered.media
    raw = req.is_raw()
    if not ids:
        raise AdmissionError("the prompt is empty", "prompt" if raw else "messages")
    config = req.config
    config.fill_defaults(model.default_sampling)  # the model's preset, where the request is silent
    if not req.max_tokens_explicit:
        config.max_new_tokens = model.default_max_new(len(ids), req.default_max_tokens)
    model.check_admission(len(ids), config.max_new_tokens)
    warnings = _fit_context_limit(model.max_context, req, len(ids))
    for text, bias in config.logit_bias_text:  # (llama-server's string keys: each of the text's tokens)
        config.logit_bias.update(dict.fromkeys(model.tokenize(text, False, False), bias))
    config.logit_bias_text = ()
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
    thinks_first = "<think>" in model.template_source
    reasons = think and thinks_first
    opening = _opening_call(req, syntax) if grammar is None and not reasons else None
    # (set whole: a re-ask's config is a copy of the first attempt's, and
    # its grammars are its own)
    config.grammar, config.grammar_trigger = (grammar, None) if grammar is not None else lazy or (None, None)
    config.opening_grammar, config.opening_trigger = opening or (None, None)
    if config.grammar:
        model.compile_grammar(config.grammar, config.grammar_trigger)
    if config.opening_grammar:
        model.compile_grammar(config.opening_grammar)
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
    # (a second attempt may be held to one call by a grammar, unless the
    # model may reason first: the call would be its reasoning)
    return Prepared(
        ids,
        config,
        req,
        syntax,
        offered,
        not raw,
        think_open,
        warnings,
        call_grammar,
        may_force_call=not thinks_first,
        media=media,
        eog=model.eog_tokens if config.ignore_eos else (),
        prompt_text=rendered.text,
    )
