"""Plain data that crosses the engine boundary. Nothing here knows HTTP."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Where one media item (an image, a sound) stands in a prompt's text: a
#: message's content or a raw prompt holds it once per item, in order, and the
#: engine puts the item's tokens there (``engine/media.py``). The private-use
#: character in it keeps a client's text from forming it by accident;
#: llama-server's own marker (``<__media__>``) is its dialect's to translate.
MEDIA_MARKER = "<__media_\ue000__>"


class StopReason(str, enum.Enum):
    """Why a generation ended. The values are the event contract's strings."""

    END_OF_TURN = "endOfTurn"
    TOOL_CALLS = "toolCalls"
    EOS = "eos"
    STOP_STRING = "stopString"
    MAX_TOKENS = "maxTokens"
    CANCELLED = "cancelled"


#: ``Progress.opening``: the opening grammar's state
OPENING_OFF, OPENING_WATCHED, OPENING_HELD = 0, 1, 2


@dataclass(slots=True)
class GenerationConfig:
    """Everything the engine needs to decode one sequence.

    ``temperature <= 0`` means greedy. Penalties follow llama.cpp's meaning:
    ``repeat_penalty`` 1.0, ``presence_penalty`` and ``frequency_penalty``
    0.0 are off.
    """

    max_new_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    stop: tuple[str, ...] = ()
    #: Token id -> additive logit bias (OpenAI ``logit_bias``).
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: Text -> bias: each of its tokens (the text tokenized as text, no
    #: BOS) gets the bias (llama-server's string ``logit_bias`` keys); the
    #: local prepare moves them into :attr:`logit_bias`.
    logit_bias_text: tuple[tuple[str, float], ...] = ()
    #: Never end on an end-of-generation token (llama.cpp's ``ignore_eos``).
    ignore_eos: bool = False
    #: Grammar constraining the output (llguidance's Lark syntax, see
    #: tools/grammar.py), if any.
    grammar: str | None = None
    #: With a grammar: a text that switches it on (a lazy grammar, as
    #: llama.cpp has them): the output is free until the model writes this, and from
    #: there on (this text included) it must follow the grammar.
    grammar_trigger: str | None = None
    #: A second lazy grammar, for an output that *opens* a certain way (a
    #: bare JSON tool call, tools/grammar.opening_call_grammar): it holds
    #: the output from its first byte once ``opening_trigger`` (a regex,
    #: matched at the output's start) has matched. Watched beside
    #: ``grammar_trigger``; whichever is written first switches its grammar on.
    opening_grammar: str | None = None
    opening_trigger: str | None = None
    #: Log-probabilities: None is off; N reports each sampled token's
    #: log-probability and the N most likely tokens at its place.
    logprobs: int | None = None
    #: Tenant partition for KV reuse: a slot is never reused across keys.
    owner: str = ""
    #: Explicit session key (prompt_cache_key, user, x-session-id ...).
    session_key: str | None = None
    #: Speculative prompt-lookup decoding allowed for this request.
    speculative: bool = True
    #: Whether a finished text is a tool call (set when tools are offered),
    #: so the engine reports ``toolCalls`` as the stop reason.
    tool_call_check: Callable[[str], bool] | None = None
    #: llama.cpp's ``n_indent``: once a line has ended, stop where a later
    #: line starts indented less than this many spaces or tabs (a blank line
    #: too), so an editor's completion stays inside its block. 0: off.
    n_indent: int = 0
    #: llama.cpp's ``t_max_predict_ms`` in seconds: once a line has ended,
    #: stop when decoding has taken this long (an editor's latency cap). 0: off.
    max_predict_seconds: float = 0.0
    #: llama.cpp's ``return_progress``: report the prompt's prefill as it
    #: goes (:class:`PromptProgress` on the run), before the first token
    return_progress: bool = False
    #: llama.cpp's ``post_sampling_probs``: the log-probabilities reported
    #: (``logprobs``) are those of the distribution the pick is drawn from,
    #: after truncation and temperature, not the model's own
    post_sampling_probs: bool = False
    #: llama.cpp's ``timings_per_token``: the engine's own timings so far
    #: (:class:`TokenTimings`) with every piece of text
    timings_per_token: bool = False
    #: llama-server's streamed ``tokens``: each report carries the ids of
    #: the tokens sampled since the previous one (:attr:`Progress.ids`)
    token_ids: bool = False
    #: llama-server's ``id_slot``: run in this session slot (taken modulo the
    #: slots, as llama-server does), waiting while it is busy; None: any.
    slot: int | None = None
    #: the session slot the engine admitted the job into (-1 until then):
    #: written once by the engine thread, so an answer can report it
    slot_used: int = -1
    #: A place on the wait list held since admission (``Scheduler.reserve``):
    #: the submit that takes it is never refused as overloaded.
    reservation: Any = field(default=None, repr=False, compare=False)
    #: The sampling fields the request set itself (the dialects record
    #: them): a model's own sampling defaults fill only the others.
    given: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def fill_defaults(self, defaults: Mapping[str, Any]) -> None:
        """Take a model's sampling defaults (``ModelOptions.sampling``) for
        each field the request did not set itself (:attr:`given`)."""
        for name, value in defaults.items():
            if name not in self.given:
                setattr(self, name, value)


@dataclass(slots=True)
class StepCounts:
    """What one engine's steps did (llama-server's ``/metrics``), counted by
    the engine thread and read from any thread: ``llama_decode`` calls over
    token batches (a media chunk's and the idle timing's are not counted),
    the sequences running at each of them summed, and the sequences' steps
    that verified drafts. ``closed`` once the engine has stopped."""

    decodes: int = 0
    busy: int = 0
    draft_steps: int = 0
    closed: bool = False


@dataclass(slots=True, frozen=True)
class TokenProb:
    """One token and its log-probability; for a sampled token, ``top`` holds
    the most likely tokens at its place (most likely first). ``piece`` is
    the token's bytes (a multi-byte character may span tokens)."""

    id: int
    piece: bytes
    logprob: float
    top: tuple[TokenProb, ...] = ()

    @property
    def text(self) -> str:
        return self.piece.decode("utf-8", "replace")


@dataclass(slots=True)
class Progress:
    """Text produced since the previous progress report for one sequence."""

    text: str
    tokens: int  # tokens sampled in this report (liveness only, never usage)
    #: the sampled tokens' log-probabilities (``GenerationConfig.logprobs``;
    #: an empty tuple, shared, when not asked for: nothing is allocated per
    #: token)
    logprobs: Sequence[TokenProb] = ()
    #: reasoning the engine itself split off (a remote engine's
    #: ``reasoning_content``); the text is then empty
    reasoning: str = ""
    #: a piece of a tool call the engine parsed itself (a remote engine's
    #: ``tool_calls`` delta, ``upstream.wire.CallPiece``); the text is then empty
    call: Any = None
    #: the opening grammar (``GenerationConfig.opening_grammar``) after this
    #: report's last token: :data:`OPENING_OFF` (none, or the output is no
    #: call of its shape), :data:`OPENING_WATCHED` (the output may still
    #: open a call) or :data:`OPENING_HELD` (it holds the output: the text
    #: that matched its trigger arrives with this report or later)
    opening: int = 0
    #: the ids of the tokens sampled since the previous report
    #: (``GenerationConfig.token_ids``; else empty)
    ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """How far a prompt's prefill is (``GenerationConfig.return_progress``):
    llama-server's ``prompt_progress``. ``processed`` counts the prompt
    tokens in the KV now, the ``cache`` ones reused included."""

    total: int
    cache: int
    processed: int
    seconds: float


@dataclass(frozen=True, slots=True)
class TokenTimings:
    """The engine's timings so far (``GenerationConfig.timings_per_token``),
    sent just before the text they cover: llama-server's per-token
    ``timings``. ``prompt_n`` counts the prefilled tokens (``cache_n`` were
    reused); ``predicted_seconds`` runs from the first token to the last."""

    cache_n: int
    prompt_n: int
    prompt_seconds: float
    predicted_n: int
    predicted_seconds: float


@dataclass(slots=True)
class RawDecodeResult:
    """What the engine measured for one generation (the truth for usage)."""

    prompt_tokens: int
    new_tokens: int
    prefill_seconds: float
    decode_seconds: float
    reason: StopReason
    reused_prefix_tokens: int = 0
    session_slot_evicted: bool = False
    queue_seconds: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    #: The full generated text (after stop-string trimming).
    text: str = ""
    #: Generated token ids (the EOG token that ended a turn is not included).
    token_ids: list[int] = field(default_factory=list)
    #: Their log-probabilities, when asked for (``GenerationConfig.logprobs``).
    logprobs: list[TokenProb] = field(default_factory=list)
    #: Why reuse stopped where it did: the first prompt position that
    #: differed from the cached record sharing the most with the prompt
    #: (None: no record of its owner, or the prompt extends it whole).
    prefix_miss_at: int | None = None
    slot: int = -1
    #: Which of ``config.stop`` ended the generation (reason ``stopString``).
    stop_string: str | None = None
    #: Where ``reused_prefix_tokens`` came from: "slot" (the KV the request's
    #: own slot already held), "copy" (copied from another slot's KV of the
    #: same owner), None when nothing was reused.
    reused_from: str | None = None
    #: tokens of reasoning, when the engine counted them (a remote engine's
    #: ``completion_tokens_details``); None: counted from the text
    reasoning_tokens: int | None = None
    #: media in the prompt (images, sounds: each libmtmd chunk one item) and
    #: their tokens (part of ``prompt_tokens``); how many of them this run
    #: encoded (a reused prefix holds the rest) and the seconds that took
    media_items: int = 0
    media_tokens: int = 0
    media_encoded: int = 0
    media_encode_seconds: float = 0.0


@dataclass(slots=True)
class Embeddings:
    """What ``encode`` returns: one unit-norm vector per input text, and the
    number of tokens each input was (for usage)."""

    vectors: list[list[float]]
    token_counts: list[int]

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


@dataclass(slots=True)
class Ranking:
    """What ``rerank`` returns: one score per document, in the order sent
    (the reranker's raw output: a logit for a cross-encoder), each pair's
    tokens, and the request's own times on the engine thread: submitted →
    its first step (``queue``), its first step → its last one's end
    (``compute``, steps of other requests' pairs beside its own included)."""

    scores: list[float]
    token_counts: list[int]
    queue_seconds: float = 0.0
    compute_seconds: float = 0.0
    #: the engine steps (decodes) its pairs took part in
    steps: int = 0
    #: documents cut to fit (truncation asked for, or a per-document limit)
    truncated: int = 0
    #: the scores are probabilities already (a causal reranker's softmax
    #: over its labels, Qwen3-Reranker's), not logits
    probabilities: bool = False
    #: cancelled before its last pair: ``scores`` holds the pairs scored
    #: until then (the first ones, in order), ``token_counts`` their tokens
    cancelled: bool = False

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)


class CancelFlag:
    """Set by whoever gives up on a request (a disconnected client); polled
    by the scheduler once per step. A queued request that is cancelled never
    runs."""

    __slots__ = ("_event", "error", "reason", "_callbacks", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""
        #: called once when the flag is set (an engine that waits on I/O
        #: rather than stepping: a remote engine closes its connection)
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        #: set by :meth:`fail`: the run ends as cancelled, and the generation
        #: core raises this instead of answering (the server shutting down, a
        #: client too slow to read)
        self.error: Exception | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one callback must not stop the others
                pass

    def on_cancel(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the flag is set (at once if it is already); it
        may be called from any thread that cancels."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def child(self) -> CancelFlag:
        """A flag for one run of this request: set when this one is (the
        client went away, the server stops), or alone (the run is stopped
        and the request goes on: a guardrail re-ask that need not wait for
        the end of a call it already knows is wrong)."""
        flag = CancelFlag()

        def follow() -> None:
            if self.error is not None:
                flag.fail(self.error)
            else:
                flag.cancel(self.reason)

        self.on_cancel(follow)
        return flag

    def fail(self, error: Exception) -> None:
        """Cancel, and end the request with ``error`` rather than an answer."""
        if self._event.is_set():
            return
        self.error = error
        self.cancel(str(error))

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class ReaderBehind(Exception):
    """The reader of a run stopped taking its output (a client that does not
    read its stream): the run is cut rather than buffered without end."""

    def __init__(self, unread: int) -> None:
        super().__init__(f"client too slow: {unread} pieces of output unread")


class EngineError(RuntimeError):
    """The engine failed while running a request (llama.cpp error, ...)."""


class RankCancelled(EngineError):
    """A rerank cancelled before its last pair was scored; ``ranking``:
    what it had scored by then (``cancelled`` set), for its ``ranked``
    event (the error its flag may carry, a drain's, is the flag's)."""

    def __init__(self, message: str, ranking: Ranking) -> None:
        super().__init__(message)
        self.ranking = ranking


class AdmissionError(ValueError):
    """A request the engine refuses before running it (a clean 400)."""

    #: the error code clients act on, if any
    code: str | None = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextOverflow(AdmissionError):
    """The prompt, or the prompt and the reply's budget, do not fit the
    context. Worded as Anthropic's API words it, which Claude Code parses to
    compact or to lower ``max_tokens``; coded ``context_length_exceeded``,
    as OpenAI's, which Codex acts on."""

    code = "context_length_exceeded"

    def __init__(
        self,
        prompt_tokens: int,
        max_new: int,
        limit: int,
        param: str = "max_tokens",
        limit_name: str = "the model's context",
    ) -> None:
        where = f" ({limit_name})"
        if prompt_tokens > limit:
            message = f"prompt is too long: {prompt_tokens} tokens > {limit} maximum{where}"
            param = "messages" if param == "max_tokens" else param
        elif prompt_tokens == limit:
            # it fits, but leaves no room for the reply's first token: the
            # longest prompt is one less (worded so the "too long" parsers
            # still compact, and true)
            message = (
                f"prompt is too long: {prompt_tokens} tokens > {limit - 1} maximum "
                f"({limit_name}, with one token to reply)"
            )
            param = "messages" if param == "max_tokens" else param
        else:
            message = (
                f"input length and `max_tokens` exceed context limit: {prompt_tokens} + {max_new} > {limit}{where}, "
                f"decrease input length or `max_tokens` and try again ({prompt_tokens + max_new} tokens asked for)"
            )
        super().__init__(message, param)
        self.prompt_tokens, self.max_new, self.limit = prompt_tokens, max_new, limit


class Overloaded(RuntimeError):
    """The wait list is full (a 503 with Retry-After)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SlotActionError(ValueError):
    """A slot action (save, restore, erase) refused: ``reason`` is
    "invalid" (a bad request: no such file, a record that will not
    restore), "not_found" (no such slot), "busy" (the slot runs a job) or
    "forbidden" (another tenant's slot or record)."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason
