"""A model another server runs: vLLM, SGLang, llama-server or another
turbospark, reached over its OpenAI-compatible API.

It implements the model interface (``engine/interface.py``) with
``takes_messages``: the generation core does not render or tokenise for it,
it hands over the request as a body (``request_body``) and gets a
:class:`~turbospark.engine.channel.Run` back (``generate_body``) whose
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

from ..engine.channel import Channel, Run
from ..engine.types import (
    AdmissionError,
    CancelFlag,
    Embeddings,
    EngineError,
    GenerationConfig,
    RawDecodeResult,
    ReaderBehind,
    StopReason,
)
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
    """The model interface over one upstream (see the module docstring)."""

    supports_chat = True
    vision: Any = None
    default_reasoning: Any = None
    default_system: str | None = None
    #: the generation core sends it the request, not token ids
    takes_messages = True
    #: the upstream may or may not enforce grammars; calls are read as they come
    enforces_grammars = False

    def __init__(self, options: RemoteOptions) -> None:
        self.options = options
        self.model_id = options.id
        self.aliases = tuple(options.aliases)
        self.supports_embeddings = options.embeddings
        self.connection = Connection(options.endpoint())
        self.in_flight = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def unreachable(self) -> str | None:
        """Why its last request got no answer (None once one was answered)."""
        return self.connection.unreachable

    # -- what clients are told -------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return None

    @property
    def vocab_size(self) -> int:
        return 0

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

    # -- what only a local engine has --------------------------------------------
    def _local_only(self, what: str) -> AdmissionError:
        return AdmissionError(
            f"model {self.model_id!r} runs on a remote engine ({self.options.base_url}); {what} needs a local model",
            "model",
        )

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        raise self._local_only("tokenizing")

    def detokenize(self, tokens: list[int]) -> str:
        raise self._local_only("detokenizing")

    def render_chat(self, messages: list[dict[str, Any]], tools: Any = None, **kw: Any) -> list[int]:
        raise self._local_only("rendering a prompt into tokens")

    def prompt_ids(self, text: str) -> list[int]:
        raise self._local_only("tokenizing")

    def chat_text(self, messages: list[dict[str, Any]], tools: Any = None, **kw: Any) -> str:
        raise self._local_only("rendering the chat template")

    def check_admission(self, n_prompt: int, max_new: int) -> None:
        """The upstream decides (its error is relayed with its status)."""

    def default_max_new(self, n_prompt: int, default: int) -> int:
        return default

    def reserve(self, config: GenerationConfig) -> Callable[[], None]:
        return _nothing

    def generate(self, prompt_ids: list[int], config: GenerationConfig, images: Any, cancel: CancelFlag) -> Run:
        raise EngineError(f"model {self.model_id!r} takes requests, not token ids (generate_body)")

    # -- requests ------------------------------------------------------------------
    def request_body(self, req: Any) -> dict[str, Any]:
        """The body for a ``generation.ChatRequest`` (sampling added per run)."""
        default = req.default_max_tokens if req.default_max_tokens < self.options.ctx else None
        return wire.request_body(req, default)

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

    def count_prompt(self, body: dict[str, Any]) -> int:
        """The prompt's length in the upstream's own tokens: a one-token
        completion of it, read from its ``usage`` (blocking: worker threads)."""
        payload = self._payload(body, GenerationConfig(temperature=0.0), False)
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
        if not self.supports_embeddings:
            raise self._local_only("embedding")
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

    def close(self) -> None:
        self.connection.close()

    async def aclose(self) -> None:
        """Close on the serving loop (the registry's shutdown)."""
        await self.connection.aclose()


def _nothing() -> None:
    return None
