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
- :class:`Final` — the end: the answered attempt's text, calls and counts.

Items are defined, and one run's text is turned into them, in answer.py
(the :class:`~turbospark.core.answer.Router`). Tool calls: a grammar holds calls
to their one shape where it can (the lazy grammar of ``tool_choice`` auto,
woken by a call marker or a bare call's opening; the grammar of
``tool_choice`` required/named), and such calls stream as they are written.
Otherwise the call text is held back, parsed (tools/calls.py) and validated
against the offered schemas (tools/guardrails.py). With guardrails on, a turn
whose calls are invalid, missing although required, or merely repeating an
answered call gets one re-ask (:func:`_reask`); a call naming no offered tool,
and in a stream a repeated call, are re-asked as soon as they show, their run
stopped there. The second attempt runs through the same path as the first
and its items go out as they come; it is the answer (the :class:`Final`:
what a body renders, a store keeps and usage counts), the first attempt
only its own ``generated`` event. Structured output (``json_schema``/
``json_object``) is enforced by a grammar too (tools/grammar.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator

from ..engine.channel import SIDE_ITEMS, Run
from ..engine.types import (
    AdmissionError,
    CancelFlag,
    Progress,
    PromptProgress,
    RawDecodeResult,
    StopReason,
    TokenTimings,
)
from ..observe import NO_REPORTER, Reporter
from ..tools import calls as toolcalls
from ..tools.guardrails import answer_turn, corrective_turn, repeated
from ..tools.prompting import tool_names
from .answer import (
    Delta,
    Outcome,
    ProbsCarrier,
    ReasoningDelta,
    Relayed,
    Router,
    ToolArgumentsDelta,
    ToolCallBegin,
    ToolCallDelta,
)
from .backend import Backend
from .media import top_field
from .request import ChatRequest, Final, Prepared


# ---------------------------------------------------------------- preparing
def prepare(backend: Backend, req: ChatRequest) -> Prepared:
    """What every backend refuses alike (a ``tool_choice`` the tools cannot
    meet), then the backend's own preparing: template and tokens, or the
    upstream's body; grammars; admission. Blocking: a worker thread."""
    if req.tool_choice == "named":
        if req.tool_name not in tool_names(req.tools):
            raise AdmissionError(
                f"tool_choice names {req.tool_name!r}, which is not among the offered tools", "tool_choice"
            )
    if req.tool_choice in ("required", "named") and not tool_names(req.tools):
        raise AdmissionError("tool_choice requires a tool call but no tools were offered", "tool_choice")
    refuse_media(backend, req)
    if req.config.slot is not None and backend.slot_control() is None:
        raise AdmissionError(
            f"model {backend.model_id!r} has no session slots here: 'id_slot' cannot be honoured", "id_slot"
        )
    prepared = backend.prepare(req)
    prepared.batch = [prepare(backend, other) for other in req.batch]
    return prepared


def refuse_media(backend: Backend, req: ChatRequest) -> None:
    """Media the model cannot take are refused, never answered as if seen
    (``param``: the field they came in, ``messages``, ``input``, ``images``)."""
    images = [m for m in req.media if m.kind == "image"]
    sounds = [m for m in req.media if m.kind == "audio"]
    if images and not backend.capabilities.vision:
        refused = AdmissionError(
            f"model {backend.model_id!r} takes no images (it has no vision support); "
            f"this request has {len(images)} image(s): send text only, or use a model with vision",
            top_field(images[0].field),
        )
        refused.code = "images_not_supported"
        raise refused
    if sounds and not backend.capabilities.audio:
        refused = AdmissionError(
            f"model {backend.model_id!r} takes no sound (it has no audio support); "
            f"this request has {len(sounds)} sound(s): send text only, or use a model with audio input",
            top_field(sounds[0].field),
        )
        refused.code = "audio_not_supported"
        raise refused


# --------------------------------------------------------------- generating
async def complete(backend: Backend, prepared: Prepared, cancel: CancelFlag, reporter: Reporter = NO_REPORTER) -> Final:
    """Run the turn to its end (the same path as :func:`stream`)."""
    return (await complete_choices(backend, prepared, cancel, reporter))[0]


async def complete_choices(
    backend: Backend, prepared: Prepared, cancel: CancelFlag, reporter: Reporter = NO_REPORTER
) -> list[Final]:
    """Every choice's :class:`Final`, in choice order."""
    finals: list[Final] = []
    async for item in stream(backend, prepared, cancel, reporter):
        if isinstance(item, Final):
            finals.append(item)
    finals.sort(key=lambda f: f.choice)
    return finals


async def _run(
    backend: Backend, prepared: Prepared, cancel: CancelFlag, reporter: Reporter, run: Run | None = None
) -> AsyncIterator[Progress | PromptProgress | TokenTimings | RawDecodeResult]:
    """One engine run (``run``, else one started here): its progress, then
    its result, which ``reporter`` records as ``generated`` the moment the
    run ends. Closing the iterator early sets the cancel flag and leaves the
    run to end at the engine's next step (it is still reported: the reporter
    tracks its result's future)."""
    if run is None:
        run = backend.start(prepared, prepared.config, cancel)
    model_id = backend.model_id
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


#: (``PromptProgress`` and ``TokenTimings`` only when the request asked for
#: them: ``return_progress``, ``timings_per_token``)
Item = (
    Delta | ReasoningDelta | ToolCallBegin | ToolArgumentsDelta | ToolCallDelta | Final | PromptProgress | TokenTimings
)


async def stream(
    backend: Backend, prepared: Prepared, cancel: CancelFlag, reporter: Reporter = NO_REPORTER, live: bool = False
) -> AsyncIterator[Item]:
    """Deltas as the engine produces them, tool calls once validated, then
    one :class:`Final` per choice; each engine run is reported through
    ``reporter``. With ``n`` > 1 the choices run side by side (one prefill,
    see ``LlamaChatModel.generate_many``) and their items interleave, each
    tagged with its ``choice``; so do a request's several prompts
    (``Prepared.batch``: each its own run). ``live``: a client reads the items as they
    come, so nothing is held back for long (``Router.speculate``)."""
    n = prepared.request.n if prepared.request is not None else 1
    if prepared.batch:  # several prompts: each its own run, answered as the next choice
        each = [prepared, *prepared.batch]
        async for item in _merge([_choice(backend, p, cancel, reporter, None, i, live) for i, p in enumerate(each)]):
            yield item
        return
    if n == 1:  # the hot path: no wrapper (its items are choice 0 already)
        async for item in _one_choice(backend, prepared, cancel, reporter, None, live):
            yield item
        return
    configs = [prepared.config] + [
        dataclasses.replace(
            prepared.config,
            seed=None if prepared.config.seed is None else prepared.config.seed + i,
            session_key=None,  # the conversation's slot stays choice 0's
            slot=None,  # (so does a slot the request names: the others take free ones)
            reservation=None,
        )
        for i in range(1, n)
    ]
    runs = backend.start_many(prepared, configs, cancel)
    choices = [
        _choice(backend, dataclasses.replace(prepared, config=c), cancel, reporter, run, i, live)
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
    backend: Backend,
    prepared: Prepared,
    cancel: CancelFlag,
    reporter: Reporter,
    run: Run | None = None,
    index: int = 0,
    live: bool = False,
) -> AsyncGenerator[Item, None]:
    """One choice: its run's deltas, its tool calls (with a guardrail
    re-ask when needed), its :class:`Final`."""
    async for item in _one_choice(backend, prepared, cancel, reporter.for_choice(index), run, live):
        if not isinstance(item, SIDE_ITEMS):  # (the run's: no choice's own)
            item.choice = index
        yield item


async def _one_choice(
    backend: Backend,
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
    turn = _Turn(backend, prepared, cancel, live, reask, run is None)
    async for item in turn.first(reporter, run):
        yield item
    async for item in turn.end():
        yield item
    if turn.retry is not None:
        async for item in turn.again(reporter):
            yield item
    for item in turn.final():
        yield item


class _Turn:
    """One choice's attempts: the first run (routed as it comes; stopped
    early for a re-ask when its call names no offered tool or repeats an
    answered one), its end (the router's :class:`~turbospark.core.answer.Outcome`
    and the guardrails' decision), the second attempt if they ask for one,
    and the :class:`Final` of both."""

    def __init__(
        self, backend: Backend, prepared: Prepared, cancel: CancelFlag, live: bool, reask: bool, own_run: bool
    ) -> None:
        self.backend, self.prepared, self.cancel, self.live = backend, prepared, cancel, live
        #: a run this choice starts has a flag of its own, to stop it for a re-ask
        self.own = cancel.child() if reask and own_run else cancel
        self.router = Router(prepared, live=live, reask=reask, stops=self.own is not cancel)
        self.probs = ProbsCarrier()
        self.relayed: Relayed | None = None
        self.retry: Prepared | None = None  # the guardrails' second attempt, if they ask for one
        self.result: RawDecodeResult | None = None
        self.attempts: list[RawDecodeResult] = []
        self.outcome = Outcome()
        #: the second attempt's Final, once it answered
        self.second: Final | None = None

    async def first(self, reporter: Reporter, run: Run | None) -> AsyncIterator[Item]:
        """The first run's items, as they come."""
        router, early = self.router, False  # (whether a re-ask was asked for before the run ended)
        async for item in _run(self.backend, self.prepared, self.own, reporter, run):
            if not isinstance(item, Progress):
                if isinstance(item, SIDE_ITEMS):
                    yield item  # (the prompt's prefill, before any token; the timings before their text)
                else:
                    self.result = item
                continue
            if self.retry is not None:  # stopped for the re-ask: the rest is dropped
                continue
            if item.call is not None or item.reasoning:  # split by the engine itself
                self.relayed = self.relayed or Relayed()
                for r in self.relayed.feed(item, router):
                    yield r
                continue
            for d in self.probs.attach(item.logprobs, router.feed(item.text, item.opening), item.ids):
                yield d
            why = router.early_reask() if self.own is not self.cancel and not early else None
            if why is not None:
                early = True
                self.retry = await _guard(self.backend, self.prepared, router, *why, self.cancel)
                if self.retry is not None:
                    self.own.cancel("re-asked: " + (router.misnamed or "the call repeats one the conversation has"))
                else:  # no room for a second attempt: the first goes on, as it is (``router.reask`` off)
                    for d in router.no_reask():
                        yield d
        assert self.result is not None
        # (a run stopped for the re-ask may have been failed meanwhile as a slow
        # reader: its output was left unread while the re-ask was prepared)
        _raise_if_failed(self.result, self.cancel if self.retry is not None else self.own)
        self.attempts.append(self.result)

    async def end(self) -> AsyncIterator[Item]:
        """The first answer's end: its calls, and the guardrails' decision."""
        router, result = self.router, self.result
        assert result is not None
        if self.retry is not None:  # stopped where its call named no offered tool, or repeated one
            self.outcome = Outcome(problems=[router.misnamed] if router.misnamed else [])
            return
        for d in self.probs.attach((), router.flush()):
            yield d
        out = self.outcome = router.finish(self.relayed)
        for item in out.items:
            yield item
        # (an answer the budget cut short stands: a second attempt would have
        # no more room than the first had)
        if out.buffered and router.reask and result.reason is not StopReason.MAX_TOKENS:
            self.retry = await _guard(self.backend, self.prepared, router, out.problems, out.calls, self.cancel)
        if self.retry is None and out.leftover.strip():
            # what the first attempt wrote from its call on is the answer's
            # rest only when it stands: a re-ask's answer replaces it
            yield router.text(out.leftover)

    async def again(self, reporter: Reporter) -> AsyncIterator[Item]:
        """The second attempt: its items go out as they come (after what the
        first already sent; the first's answer from its call on is
        replaced), and it is the answer."""
        assert self.retry is not None
        again: Final | None = None
        async for later in _one_choice(self.backend, self.retry, self.cancel, reporter, None, self.live, reask=False):
            if isinstance(later, Final):
                again = later
            else:
                yield later
        assert again is not None
        self.second = again
        self.attempts += again.attempts
        self.result = again.result
        # its calls went out in its own run
        self.outcome = Outcome(calls=again.tool_calls, problems=again.problems)

    def final(self) -> list[Item]:
        """The calls checked whole (they go out whole now), then the Final."""
        out, req, result = self.outcome, self.prepared.request, self.result
        assert result is not None
        calls = out.calls
        if out.buffered and req is not None and not req.parallel_tool_calls:
            calls = calls[:1]
        whole: list[Item] = [ToolCallDelta(i, call) for i, call in enumerate(calls if out.whole else ())]
        # the answered attempt only: a re-asked first attempt is no part of
        # the answer (its text and reasoning, its tokens), only of the events
        second = self.second
        text = second.text if second is not None else self.router.answer
        reasoning = second.reasoning if second is not None else self.router.reasoning_text
        return whole + [
            Final(
                result=result,
                text=text,
                reasoning=reasoning,
                tool_calls=calls,
                attempts=self.attempts,
                reasoning_tokens=_reasoning_tokens(self.backend, result, reasoning),
                problems=out.problems,
            )
        ]


async def _guard(
    backend: Backend,
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
    return await asyncio.to_thread(_reask, backend, prepared, router, problems, calls)


def _reasoning_tokens(backend: Backend, result: RawDecodeResult, reasoning: str) -> int:
    if result.reasoning_tokens is not None:  # the engine counted them
        return result.reasoning_tokens
    return backend.count_text(reasoning)


def _raise_if_failed(result: RawDecodeResult, cancel: CancelFlag) -> None:
    """A run stopped by :meth:`CancelFlag.fail` ends the request with that
    error (its ``generated`` is reported all the same)."""
    if result.reason is StopReason.CANCELLED and cancel.error is not None:
        raise cancel.error


def _reask(
    backend: Backend, prepared: Prepared, router: Router, problems: list[str], calls: list[toolcalls.ToolCall]
) -> Prepared | None:
    """The corrective second attempt the guardrails ask for, or None when the
    first answer stands (it is fine, or a second attempt cannot fit)."""
    req = prepared.request
    assert req is not None
    raw = router.raw
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
        plain = prepared.may_force_call and not (req.json_schema is not None or req.json_object or calls)
        if choice == "auto" and plain:
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
            return prepare(backend, dataclasses.replace(retry_req, tool_choice=attempt))
        except AdmissionError as exc:
            if attempt == req.tool_choice or exc.param != "tools":
                return None
    return None
