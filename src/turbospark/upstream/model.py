"""A model another server runs: vLLM, SGLang, llama-server or another
turbospark, reached over its OpenAI-compatible API.

It is a ``backend.Backend`` whose tokens are not known here: its
``prepare`` checks the request and translates it into the body it is sent
(``Prepared.body``; the upstream templates, tokenises, enforces grammars and
admits, and its refusals are relayed), and ``start`` sends it, returning a
:class:`~turbospark.engine.channel.Run` whose
progress is the upstream's streamed text, reasoning and tool-call pieces, and
whose result carries the upstream's own counts (``usage``, llama-server
``timings``) and wall-clock times measured here: prefill = request sent →
first token received, decode = first → last token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ..core.backend import Capabilities, Health, Upstream, needs_local
from ..core.request import ChatRequest, Prepared
from ..engine.channel import Channel, Run
from ..engine.slotcontrol import SlotControl
from ..engine.types import (
    AdmissionError,
    CancelFlag,
    Embeddings,
    EngineError,
    GenerationConfig,
    Ranking,
    RawDecodeResult,
    ReaderBehind,
    StopReason,
)
from ..tools import calls as toolcalls
from ..tools.prompting import tool_names
from . import wire
from .client import CUT, Connection, Endpoint, UpstreamError

#: pieces a reader may leave unread before the run is failed (as the local engine's)
MAX_UNREAD = 1024


@dataclass
class RemoteOptions:
    """A remote model: config section or attach body (``kind = "remote"``)."""

    id: str
    base_url: str
    #: the model name the upstream knows it by
    model: str
    #: the environment variable holding the upstream's API key
    api_key_env: str | None = None
    #: its context length in tokens (what clients are told)
    ctx: int = 8192
    aliases: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    #: the upstream serves ``/embeddings`` for this model
    embeddings: bool = False
    #: what a health check reads (see :attr:`Endpoint.health_path`)
    health_path: str = "models"
    #: most connections open to it at once (each streamed answer holds one)
    max_connections: int = 256
    #: a PEM bundle of the CAs an https upstream's certificate is checked
    #: against (a private CA), instead of the bundled public ones
    ca_file: str | None = None
    #: its name within a replica group (``id@replica``), else None
    replica: str | None = None

    def endpoint(self) -> Endpoint:
        return Endpoint(
            self.base_url,
            self.api_key_env,
            dict(self.headers),
            self.connect_timeout,
            self.read_timeout,
            self.max_connections,
            self.health_path,
            self.ca_file,
        )


class RemoteModel:
    """The backend over one upstream (see the module docstring)."""

    #: its tokens are the upstream's: none are known here
    vocabulary = None

    def __init__(self, options: RemoteOptions) -> None:
        self.options = options
        self.model_id = options.id
        self.aliases = tuple(options.aliases)
        # (the upstream may or may not enforce grammars: calls are read as
        # they come; its template's thinking is its own)
        self.capabilities = Capabilities(embeddings=options.embeddings, thinking=None, resident=False)
        self.upstream = Upstream(options.base_url, options.api_key_env)
        self.connection = Connection(options.endpoint())
        self.in_flight = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    def health(self) -> Health:
        """Why its last request got no answer (None once one was answered)."""
        return Health(unreachable=self.connection.unreachable)

    async def probe(self) -> str | None:
        """Its health path read now: why it is down, or None."""
        return await self.connection.healthy()

    # -- what clients are told -------------------------------------------------
    @property
    def max_context(self) -> int:
        return self.options.ctx

    def info(self) -> dict[str, Any]:
        o = self.options
        return {
            "id": self.model_id,
            "aliases": list(self.aliases),
            "kind": "remote",
            "context": o.ctx,
            "upstream": o.base_url,  # never the key
            "upstream_model": o.model,
            "parameters": 0,
            "size_bytes": 0,
            "architecture": "remote",
            "description": f"{o.model} at {o.base_url}",
            "parallel": 0,
            "session_slots": 0,
            "chat_template": "",
            "quantization": "",
            "path": None,
        }

    def load(self) -> dict[str, Any]:
        return {"running": self.in_flight, "waiting": 0, "slots": []}

    def slot_control(self) -> SlotControl | None:
        """A remote engine's slots are its own (not shown or acted on here)."""
        return None

    def reserve(self, config: GenerationConfig) -> Callable[[], None]:
        """No wait list here: the upstream admits (its refusals are relayed)."""
        return _nothing

    def count_text(self, text: str) -> int:
        """Its tokens are the upstream's: not counted here."""
        return 0

    # -- requests ------------------------------------------------------------------
    def prepare(self, req: ChatRequest) -> Prepared:
        """Checked and translated into the body it is sent. Tool calls the
        upstream parses come back as calls; calls it leaves in the text are
        read by the same parsers and rescue as a local model's."""
        if req.fill_in is not None:
            raise AdmissionError(
                f"model {self.model_id!r} runs on a remote engine; fill-in-the-middle needs a local model", "suffix"
            )
        raw = req.is_raw()  # (fill-in-the-middle was refused above)
        if req.prompt == "" or (req.prompt_ids is not None and not req.prompt_ids):
            raise AdmissionError("the prompt is empty", "prompt")
        if not raw and not req.messages and not req.empty_chat:
            raise AdmissionError("'messages' must contain at least one message", "messages")
        if req.grammar is not None or (raw and (req.json_schema is not None or req.json_object)):
            # (a raw prompt's structure is not in an OpenAI chat body: it would go unenforced)
            where = "grammar" if req.grammar is not None else "json_schema"
            raise AdmissionError(
                f"model {self.model_id!r} runs on a remote engine; '{where}' needs a local model", where
            )
        warnings: list[str] = []
        config = req.config
        if req.context_limit is not None and req.context_limit < self.max_context:
            warnings.append(f"{req.context_limit_field} is not applied to a remote engine")
        if config.n_indent or config.max_predict_seconds:
            warnings.append("n_indent and t_max_predict_ms are not applied to a remote engine")
        tools = req.tools if req.tool_choice != "none" and not raw else None
        syntax = toolcalls.syntax_for_template("") if tools else None
        offered = tuple(tool_names(tools)) if syntax is not None else ()
        body = self.request_body(req)
        return Prepared([], config, req, syntax, offered, not raw, False, warnings, body=body)

    def request_body(self, req: ChatRequest) -> dict[str, Any]:
        """The body for a request (sampling added per run)."""
        default = req.default_max_tokens if req.default_max_tokens < self.options.ctx else None
        return wire.request_body(req, default)

    def start(self, prepared: Prepared, config: GenerationConfig, cancel: CancelFlag) -> Run:
        """One run of what :meth:`prepare` made (see :meth:`generate_body`)."""
        assert prepared.body is not None, "prepared by another backend"
        return self.generate_body(prepared.body, config, cancel)

    def start_many(self, prepared: Prepared, configs: list[GenerationConfig], cancel: CancelFlag) -> list[Run]:
        """Each choice is a run of its own upstream."""
        return [self.start(prepared, config, cancel) for config in configs]

    def _payload(self, body: dict[str, Any], config: GenerationConfig, stream: bool) -> dict[str, Any]:
        out = {**body, **wire.sampling(config), "model": self.options.model, "stream": stream}
        if config.logprobs is not None:  # the upstream's own, relayed
            if "messages" in body:
                out["logprobs"], out["top_logprobs"] = True, config.logprobs
            else:
                out["logprobs"] = config.logprobs
        if stream:
            out["stream_options"] = {"include_usage": True}
        return out

    @staticmethod
    def _path(body: dict[str, Any]) -> str:
        return "/chat/completions" if "messages" in body else "/completions"

    def generate_body(self, body: dict[str, Any], config: GenerationConfig, cancel: CancelFlag) -> Run:
        """Send one run upstream (streamed, with usage) on a task of this
        loop, feeding the returned :class:`Run`. A cancelled flag closes the
        upstream connection, so the upstream stops too."""
        loop = asyncio.get_running_loop()
        # a reader that stops reading fails the run rather than buffering the
        # upstream's answer without end (as a local engine's run does)
        channel = Channel(loop, MAX_UNREAD, lambda unread: cancel.fail(ReaderBehind(unread)))
        task = asyncio.ensure_future(self._pump(self._payload(body, config, True), cancel, channel.put))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        # the upstream may be silent for a long prefill: the flag cannot wait
        # for the next chunk, it cancels the task (closing the connection)
        def stop() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)

        cancel.on_cancel(stop)
        return Run(channel)

    async def _pump(self, payload: dict[str, Any], cancel: CancelFlag, put: Callable[[Any], None]) -> None:
        reading = wire.Reading()
        cut = False
        sent = time.perf_counter()
        first: float | None = None
        last = sent
        self.in_flight += 1
        try:
            async with aclosing(self.connection.stream_json(self._path(payload), payload)) as chunks:
                async for chunk in chunks:
                    for item in reading.chunk(chunk):
                        last = time.perf_counter()
                        if first is None:
                            first = last
                        put(item)
                    if cancel.cancelled:
                        break
        except UpstreamError as exc:
            if exc.code == CUT and reading.finish is not None:
                pass  # it said how it ended, then closed without [DONE]: whole
            else:
                self._failed(exc, first is not None, put)
                return
        except asyncio.CancelledError:
            cut = True  # the cancel flag (or the loop closing): the connection is closed
        except Exception as exc:  # noqa: BLE001 - every failure ends the run
            put(EngineError(f"reading the upstream failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            self.in_flight -= 1
        prompt, new, cached, reasoning = reading.counts()
        started = first if first is not None else time.perf_counter()
        put(
            RawDecodeResult(
                prompt_tokens=prompt,
                new_tokens=new,
                prefill_seconds=started - sent,
                decode_seconds=last - first if first is not None else 0.0,
                reason=StopReason.CANCELLED if cut or cancel.cancelled else reading.reason(),
                reused_prefix_tokens=cached,
                text="".join(reading.text),
                reused_from="upstream" if cached else None,
                reasoning_tokens=reasoning,
                logprobs=reading.logprobs,
            )
        )

    @staticmethod
    def _failed(exc: UpstreamError, after_output: bool, put: Callable[[Any], None]) -> None:
        """End the run with ``exc``; once output went out it is never
        retried, and is the upstream's failure (5xx) whatever it answered."""
        if after_output:
            exc.retryable = False
            exc.status = 502 if exc.status < 500 else exc.status
        put(exc)

    def count_prompt(self, req: ChatRequest) -> int:
        """The prompt's length in the upstream's own tokens: a one-token
        completion of it, read from its ``usage`` (blocking: worker threads)."""
        payload = self._payload(self.request_body(req), GenerationConfig(temperature=0.0), False)
        payload["max_tokens"] = 1
        payload.pop("response_format", None)
        data = self.connection.post_json(self._path(payload), payload)
        usage = data.get("usage") or {}
        n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(n, int):
            raise UpstreamError(502, f"upstream {self.options.base_url} did not count the prompt (no usage)")
        return n

    def encode(self, texts: list[str], truncate: bool = False) -> Embeddings:
        """The upstream's ``/embeddings`` (blocking: worker threads)."""
        if not self.capabilities.embeddings:
            raise needs_local(self.model_id, self.upstream, "embedding")
        data = self.connection.post_json("/embeddings", {"model": self.options.model, "input": texts})
        rows = sorted(data.get("data") or [], key=lambda r: r.get("index", 0) if isinstance(r, dict) else 0)
        vectors = [r.get("embedding") for r in rows if isinstance(r, dict)]
        if len(vectors) != len(texts) or not all(isinstance(v, list) for v in vectors):
            raise UpstreamError(
                502, f"upstream {self.options.base_url} returned {len(vectors)} embeddings for {len(texts)} inputs"
            )
        usage = data.get("usage") or {}
        total = usage.get("prompt_tokens", 0) if isinstance(usage, dict) else 0
        # the upstream counts the whole batch: the total is carried by the first input
        counts = [int(total) if i == 0 else 0 for i in range(len(texts))]
        return Embeddings(vectors, counts)  # type: ignore[arg-type]

    def rerank(
        self,
        query: str,
        documents: list[str],
        cancel: CancelFlag,
        truncate: bool = False,
        max_doc_tokens: int | None = None,
    ) -> Ranking:
        """Never routed here (a remote engine's capabilities say no rerank)."""
        raise needs_local(self.model_id, self.upstream, "reranking")

    def close(self) -> None:
        self.connection.close()

    async def aclose(self) -> None:
        """Close on the serving loop (the registry's shutdown)."""
        await self.connection.aclose()


def _nothing() -> None:
    return None
