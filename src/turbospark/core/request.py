"""The request and result types of the one generation core: what every
dialect translates into (:class:`ChatRequest`, with :class:`FillIn` for
fill-in-the-middle), what a backend makes of it before any byte is sent
(:class:`Prepared`), and the end of a turn (:class:`Final`). Plain data:
dialects, backends and the core import it; it imports no part of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.types import MEDIA_MARKER, GenerationConfig, RawDecodeResult, StopReason, TokenProb
from ..tools import calls as toolcalls

DEFAULT_MAX_TOKENS = 256
EFFORTS_OFF = ("none", "off", "disabled")


@dataclass(frozen=True)
class Media:
    """One image or sound of a request, in the order its markers
    (:data:`MEDIA_MARKER`) stand in the messages' text or the raw prompt.

    ``data`` holds the item's encoded bytes (PNG, JPEG, ...; WAV, MP3); an
    item named by a remote URL has ``url`` instead until the server fetches
    it (only with ``--allow-media-urls``). ``field`` is where it came in
    (``messages[0].content[1].image_url``), for a refusal's ``param``."""

    kind: str  # "image" or "audio"
    data: bytes = b""
    url: str | None = None
    field: str = "messages"


def media_text(text: str) -> str:
    """A client's text as it may stand beside media markers: any copy of
    the marker in it is broken, so only the dialect's own markers count."""
    return text.replace(MEDIA_MARKER, MEDIA_MARKER.replace("\ue000", ""))


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
    #: llama-server's mixed prompt: token ids and texts, each text tokenized
    #: where it stands (the first part a text: BOS as the model wants it).
    prompt_mixed: list[int | str] | None = None
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
    #: the prompt's media, in marker order (:class:`Media`): each stands
    #: where a :data:`MEDIA_MARKER` stands in the messages' text (or the raw
    #: prompt); a model that cannot take them refuses them (never answered
    #: as if it had seen them)
    media: list[Media] = field(default_factory=list)
    #: the request's other prompts (a list of prompts: llama-server's
    #: ``/completion``, OpenAI's batch ``prompt``), each prepared and run on
    #: its own and answered as the next choice (by its index)
    batch: list[ChatRequest] = field(default_factory=list)
    #: the last message (an assistant's) is the answer's start, continued
    #: (a prefill: llama-server's ``continue_final_message``)
    continue_final: bool = False
    #: the prompt's text is kept (``Prepared.prompt_text``: llama-server's ``verbose``)
    verbose: bool = False
    #: no messages at all is a conversation too (llama-server's answer to
    #: Anthropic's ``messages: []``): the template renders it
    empty_chat: bool = False

    def is_raw(self) -> bool:
        """A prompt given as text or ids, not as messages (no chat template)."""
        return (
            self.prompt is not None
            or self.prompt_ids is not None
            or self.prompt_mixed is not None
            or self.fill_in is not None
        )

    def asks_thinking(self) -> bool:
        """Thinking turned on explicitly (not the model's default)."""
        return self.reasoning is not None and str(self.reasoning).lower() not in EFFORTS_OFF


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
    #: the guardrails' second attempt may be held to one call by a grammar
    #: (not for a model that may reason first, nor a remote engine, which
    #: may refuse ``tool_choice`` required)
    may_force_call: bool = False
    #: what a remote backend sends upstream, less the sampling fields (a
    #: local backend leaves it None and runs ``prompt_ids``)
    body: dict[str, Any] | None = None
    #: the prompt's media as the local engine prepared them (its
    #: ``MediaPrompt``: ``prompt_ids`` hold their placeholders), else None
    media: Any = None
    #: the end-of-generation tokens ``ignore_eos`` bans (llama-server lists
    #: them in its ``generation_settings.logit_bias``)
    eog: tuple[int, ...] = ()
    #: the request's other prompts, prepared (``ChatRequest.batch``)
    batch: list[Prepared] = field(default_factory=list)
    #: the prompt as text, when the request asked (``ChatRequest.verbose``;
    #: a local model's: a remote one leaves it None)
    prompt_text: str | None = None


@dataclass
class Final:
    """The end of a turn: its answer, with the engine's own numbers. After a
    guardrail re-ask the answer is the second attempt's alone (its text,
    reasoning, calls, and the counts and times of its run: what a response
    renders, a store keeps and usage counts); every run is in ``attempts``,
    and each has its own ``generated`` event (the engine's work, truthfully)."""

    #: the answered attempt's run
    result: RawDecodeResult
    text: str
    reasoning: str = ""
    tool_calls: list[toolcalls.ToolCall] = field(default_factory=list)
    #: every engine run of this turn (a guardrail re-ask adds one; the last is ``result``)
    attempts: list[RawDecodeResult] = field(default_factory=list)
    reasoning_tokens: int = 0
    #: why the calls (if any) were not accepted, after the last attempt
    problems: list[str] = field(default_factory=list)
    choice: int = 0

    def __post_init__(self) -> None:
        if not self.attempts:
            self.attempts = [self.result]

    @property
    def reasked(self) -> bool:
        """The answer is a guardrail re-ask's (a first attempt was rejected)."""
        return len(self.attempts) > 1

    # the counts and times of the answered run alone (a rejected attempt is
    # no part of the answer; rates are its tokens over its times)
    @property
    def prompt_tokens(self) -> int:
        return self.result.prompt_tokens

    @property
    def logprobs(self) -> list[TokenProb]:
        """The answer's sampled tokens' log-probabilities (empty unless asked for)."""
        return list(self.result.logprobs)

    @property
    def completion_tokens(self) -> int:
        return self.result.new_tokens

    @property
    def cached_tokens(self) -> int:
        return self.result.reused_prefix_tokens

    @property
    def queue_seconds(self) -> float:
        return self.result.queue_seconds

    @property
    def prefill_seconds(self) -> float:
        return self.result.prefill_seconds

    @property
    def decode_seconds(self) -> float:
        return self.result.decode_seconds

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
