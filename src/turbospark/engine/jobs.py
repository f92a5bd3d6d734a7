"""A generation as the scheduler holds it before it runs.

A :class:`Job` is what ``LlamaChatModel`` submits: the prompt, its config,
its cancel flag, where its progress and result go (:class:`JobOutput`, a
``channel.Channel``), and the other choices of an ``n`` > 1 request. Its
``submitted_at`` and ``admitted_at`` stamps are the queue interval of its
timings (CONTRACT §2). :func:`end_job` puts a job's last item (and ends its
choices that never started); :func:`cancelled_result` is the result of one
that ended before it sampled anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .types import CancelFlag, GenerationConfig, RawDecodeResult, StopReason

if TYPE_CHECKING:
    from .media import MediaPrompt


class JobOutput(Protocol):
    """Where a job's progress and result go (:class:`channel.Channel`)."""

    def put(self, item: Any) -> None: ...


@dataclass(eq=False)
class Job:
    prompt: list[int]
    config: GenerationConfig
    cancel: CancelFlag
    sink: JobOutput
    submitted_at: float = field(default_factory=time.perf_counter)
    #: when it was given a slot (perf_counter; 0 until then)
    admitted_at: float = 0.0
    #: the other choices of an ``n`` > 1 request (same prompt): they start
    #: when this job's prompt is in the KV, each in a slot of its own with
    #: a copy of that KV, sampling its first token from the same logits
    siblings: list[Job] = field(default_factory=list)
    #: the prompt's media (its ids hold their placeholders), or None
    media: MediaPrompt | None = None


def cancelled_result(job: Job) -> RawDecodeResult:
    """The result of a job cancelled before it sampled anything."""
    media = job.media
    return RawDecodeResult(
        media_items=len(media.spans) if media else 0,
        media_tokens=media.media_tokens if media else 0,
        prompt_tokens=len(job.prompt),
        new_tokens=0,
        prefill_seconds=0.0,
        decode_seconds=0.0,
        reason=StopReason.CANCELLED,
        queue_seconds=time.perf_counter() - job.submitted_at,
    )


def end_job(job: Job, last: RawDecodeResult | Exception) -> None:
    """Put a job's last item; choices of its request that never started
    (it ended before its prompt was in the KV) end with it: cancelled,
    or with the same error."""
    job.sink.put(last)
    for sibling in job.siblings:
        sibling.sink.put(last if isinstance(last, Exception) else cancelled_result(sibling))
    job.siblings = []
