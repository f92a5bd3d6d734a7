"""The one interface every dialect's answer is written through.

A route translates the request, routes and prepares it, builds its dialect's
:class:`Renderer` and hands it to ``routes.common.respond``, which runs the
generation and asks the renderer for every piece: the whole body when the
client did not ask for a stream, else an opening, each text / reasoning /
tool-call piece (a call's start, its arguments, its end), the final frames, or an error frame once the stream has
begun. Nothing else about a dialect's wire format lives outside its module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ..core.answer import Delta, ReasoningDelta, ToolArgumentsDelta, ToolCallBegin, ToolCallDelta
from ..core.request import Final
from ..engine.types import PromptProgress, StopReason, TokenTimings
from .errors import Failure

#: what a renderer returns for one stream item: one frame, several, or none
FrameOut = bytes | Iterable[bytes] | None

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
#: an SSE comment: every SSE reader skips it (the openai SDK, browsers'
#: EventSource), and it keeps a quiet stream's connection alive
SSE_KEEP_ALIVE = b": keep-alive\n\n"


class Renderer(Protocol):
    #: whether the client asked for a stream
    stream: bool
    #: the stream's content type (SSE or NDJSON)
    media_type: str

    def complete(self, final: Final) -> dict[str, Any]:
        """The whole answer as one JSON body (not streamed)."""
        ...

    def opening(self, prompt_tokens: int) -> FrameOut:
        """Sent before the first token."""
        ...

    def text(self, delta: Delta) -> FrameOut:
        """Answer text (with its tokens' log-probabilities, when asked for)."""
        ...

    def reasoning(self, delta: ReasoningDelta) -> FrameOut: ...

    def tool_call_begin(self, delta: ToolCallBegin) -> FrameOut:
        """A streamed call's id and name (its arguments follow)."""
        ...

    def tool_arguments(self, delta: ToolArgumentsDelta) -> FrameOut:
        """More of a streamed call's arguments."""
        ...

    def tool_call(self, delta: ToolCallDelta) -> FrameOut:
        """A whole call, or (``delta.streamed``) the end of a streamed one."""
        ...

    def final(self, final: Final) -> FrameOut:
        """The closing frames (stop reason, usage, terminator); with ``n``
        > 1 it is called once per choice."""
        ...

    def error(self, failure: Failure) -> bytes:
        """A failure once the stream has begun; nothing follows it."""
        ...


@runtime_checkable
class ReportsProgress(Protocol):
    """A renderer that sends a prompt's prefill progress (llama-server's
    ``return_progress``: its ``prompt_progress`` chunks)."""

    def prompt_progress(self, progress: PromptProgress) -> FrameOut: ...


@runtime_checkable
class KeepsAlive(Protocol):
    """A renderer whose dialect has a keep-alive of its own (Anthropic's
    ``ping`` event); other SSE dialects get :data:`SSE_KEEP_ALIVE`."""

    def keep_alive(self) -> bytes: ...


def keep_alive(renderer: Renderer) -> bytes | None:
    """What ``renderer``'s stream sends while nothing else comes (the queue,
    a long prefill): None for a stream with no such frame (NDJSON: every
    line is a message a client reads)."""
    if isinstance(renderer, KeepsAlive):
        return renderer.keep_alive()
    return SSE_KEEP_ALIVE if renderer.media_type == SSE else None


@runtime_checkable
class ReportsTimings(Protocol):
    """A renderer that puts the engine's timings so far on its text chunks
    (llama-server's ``timings_per_token``): it keeps the latest."""

    def token_timings(self, timings: TokenTimings) -> FrameOut: ...


def token_timings(t: TokenTimings) -> dict[str, Any]:
    """llama-server's ``timings`` object, from the engine's numbers so far."""
    prompt_ms, predicted_ms = t.prompt_seconds * 1000.0, t.predicted_seconds * 1000.0
    return {
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / t.prompt_n if t.prompt_n else 0.0,
        "prompt_per_second": t.prompt_n / t.prompt_seconds if t.prompt_seconds else 0.0,
        "predicted_n": t.predicted_n,
        "predicted_ms": predicted_ms,
        # (over decode steps, as llama-server: the first token comes from the prompt's last batch)
        "predicted_per_token_ms": predicted_ms / (t.predicted_n - 1) if t.predicted_n > 1 else 0.0,
        "predicted_per_second": (t.predicted_n - 1) / t.predicted_seconds
        if t.predicted_n > 1 and t.predicted_seconds
        else 0.0,
    }


def progress_timings(progress: PromptProgress) -> dict[str, Any]:
    """llama-server's ``timings`` on a ``prompt_progress`` chunk (with
    ``timings_per_token``): the prefill so far, nothing predicted yet; the
    first report, before any prompt token is decoded, has no prompt time."""
    prompt_n = progress.processed - progress.cache
    return token_timings(TokenTimings(progress.cache, prompt_n, progress.seconds if prompt_n else 0.0, 0, 0.0))


def prompt_progress(progress: PromptProgress) -> dict[str, Any]:
    """llama-server's ``prompt_progress`` object."""
    return {
        "total": progress.total,
        "cache": progress.cache,
        "processed": progress.processed,
        "time_ms": round(progress.seconds * 1000, 3),
    }


class ChoicesRenderer(Renderer, Protocol):
    """A renderer of a dialect with ``n`` choices per request (OpenAI chat
    and completions), or several prompts (completions, llama-server's)."""

    def complete_choices(self, finals: list[Final]) -> dict[str, Any] | list[dict[str, Any]]:
        """Every choice in one JSON body (not streamed): one object (OpenAI's
        choices), or a list of results (llama-server's several prompts)."""
        ...


class Unsent:
    """Defaults for the stream items a dialect does not send."""

    def opening(self, prompt_tokens: int) -> FrameOut:
        return None

    def reasoning(self, delta: ReasoningDelta) -> FrameOut:
        return None

    def tool_call_begin(self, delta: ToolCallBegin) -> FrameOut:
        return None

    def tool_arguments(self, delta: ToolArgumentsDelta) -> FrameOut:
        return None

    def tool_call(self, delta: ToolCallDelta) -> FrameOut:
        return None


#: llama-server's ``stop_type`` of each way a run ends
STOP_TYPES = {
    StopReason.END_OF_TURN: "eos",
    StopReason.EOS: "eos",
    StopReason.TOOL_CALLS: "eos",
    StopReason.MAX_TOKENS: "limit",
    StopReason.STOP_STRING: "word",
    StopReason.CANCELLED: "none",
}


def stop_type(reason: StopReason) -> str:
    return STOP_TYPES.get(reason, "none")


def native_result(final: Final, model: str, prompt: str, settings: dict[str, Any]) -> dict[str, Any]:
    """llama-server's own result of a run (its ``/completion`` answer), as
    its OpenAI routes add it with ``verbose`` (``__verbose``)."""
    run = final.result
    timed = TokenTimings(
        final.cached_tokens,
        final.prompt_tokens - final.cached_tokens,
        final.prefill_seconds,
        final.completion_tokens,
        final.decode_seconds,
    )
    return {
        "index": final.choice,
        "content": final.text,
        "tokens": list(run.token_ids),
        "id_slot": -1,
        "stop": True,
        "model": model,
        "tokens_predicted": final.completion_tokens,
        "tokens_evaluated": final.prompt_tokens,
        "generation_settings": settings,
        "prompt": prompt,
        "has_new_line": "\n" in final.text,
        "truncated": False,
        "stop_type": stop_type(run.reason),
        "stopping_word": run.stop_string or "",
        "tokens_cached": final.cached_tokens,
        "timings": token_timings(timed),
    }
