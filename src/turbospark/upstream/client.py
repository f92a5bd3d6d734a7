"""One pooled HTTP client per upstream (httpx, HTTP/2 where the upstream
offers it over TLS), its errors as exceptions the routes map to each
dialect's shape, and SSE lines read as JSON. The API key is read from the
environment variable the configuration names, at each request: it is never
stored in the configuration, the model's info, events or logs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from ..engine.types import EngineError
from .wire import context_overflow, error_message

#: how much of an upstream error body is read
ERROR_BODY_LIMIT = 64 * 1024


#: configured header values at least this long, in headers named as
#: credentials, are kept out of relayed errors (shorter ones are not secrets)
MIN_SECRET = 8
SECRET_HEADER_WORDS = ("key", "token", "auth", "secret", "cookie", "session", "signature", "password")
#: a secret's start this long at the end of a body read in part is cut too
MIN_PARTIAL = 4

#: the code of :class:`UpstreamError` for a stream that closed without its
#: ``[DONE]`` (whole if a ``finish_reason`` came before it)
CUT = "upstream_stream_cut"


class UpstreamError(EngineError):
    """An upstream answered with an error, or could not be reached.
    ``status`` is what the caller gets (the upstream's own, or 502/504 when
    there was no answer); ``retry_after`` is kept from 429/503 answers.
    ``retryable``: nothing was generated and another replica may do better
    (no answer, 5xx, 429)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        retry_after: str | None = None,
        retryable: bool = False,
        answered: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after = retry_after
        self.retryable = retryable
        #: the upstream answered with this status (False: unreachable, timed
        #: out, or its stream was cut)
        self.answered = answered

    @property
    def busy(self) -> bool:
        """The upstream answered that it is busy (a 429, or a 503 that says
        when to come back): it is alive, only full for now."""
        if self.code == "shutting_down":  # a draining turbospark: going away, not full
            return False
        return self.status == 429 or (self.status == 503 and self.retry_after is not None)

    @property
    def down(self) -> bool:
        """The replica itself looks out of service: no answer, or a 502, 503
        or 504 (a gateway in front of it, an engine not ready) that is not
        a busy signal. An error it answered for this request (a 500) is not."""
        return not self.busy and (not self.answered or self.status in (502, 503, 504))


@dataclass
class Endpoint:
    """Where an upstream is and how to talk to it."""

    base_url: str
    #: the environment variable holding its API key (never the key)
    api_key_env: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    connect_timeout: float = 5.0
    #: the longest wait for the next byte (a long prefill comes first)
    read_timeout: float = 600.0
    #: most connections open to it at once (a streamed request holds one for
    #: its whole answer; past this, requests wait for one)
    max_connections: int = 256
    #: what a health check reads: with a leading slash, from the server's
    #: root (``/health``, ``/v1/models``: where vLLM, SGLang, llama-server and
    #: turbospark serve them); without one, relative to ``base_url`` (the
    #: default ``models``: the upstream's model list); or a whole URL
    health_path: str = "models"
    #: the CAs to check an https upstream's certificate against (a PEM
    #: file); None: the public ones (certifi's)
    ca_file: str | None = None

    _context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx checks the upstream's certificate with. With
        ``ca_file``, one context read once and shared by its clients
        (httpcore sets the same ALPN protocols, h2 included, on it)."""
        if self.ca_file is None:
            return True
        if self._context is None:
            self._context = ssl.create_default_context(cafile=self.ca_file)
        return self._context

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")

    def health_url(self) -> str:
        path = self.health_path
        if path == "/models":  # the default's first spelling, documented as relative to base_url
            path = "models"
        if path.startswith("/"):  # from the server's root (a query kept)
            return str(httpx.URL(self.base_url).join(path))
        return self.url(path)

    def request_headers(self) -> dict[str, str]:
        h = dict(self.headers)
        key = self._key()
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def _secrets(self) -> list[str]:
        """The key, and configured header values that look like credentials
        (by the header's name), longest first."""
        found = [self._key() or ""]
        found += [v for k, v in self.headers.items() if any(w in k.lower() for w in SECRET_HEADER_WORDS)]
        return sorted({s for s in found if len(s) >= MIN_SECRET}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """``text`` (an upstream's error, relayed to clients, events, views
        and logs) without the credentials this server sent it: an upstream
        or a gateway may echo the request's headers back."""
        for secret in self._secrets():
            text = text.replace(secret, "[redacted]")
        return text

    def redact_body(self, raw: bytes) -> bytes:
        """An error body redacted before any of it is cut to a message (a
        secret cut in two would no longer be found), including a secret's
        start at the end of a body read only in part."""
        secrets = self._secrets()
        if not secrets:
            return raw
        text = self.redact(raw.decode("utf-8", "replace"))
        for secret in secrets:
            for k in range(len(secret) - 1, MIN_PARTIAL - 1, -1):
                if text.endswith(secret[:k]):
                    text = text[:-k] + "[redacted]"
                    break
        return text.encode()


#: how long an idle pooled connection is kept: under the 5 s after which
#: uvicorn (vLLM, SGLang, turbospark) and llama-server close one, so a
#: request is not sent on a connection the upstream is closing right then
KEEPALIVE_SECONDS = 3.0
#: what sending on a connection the upstream closed meanwhile raises (no
#: answer was read): on a kept connection, the request is sent once more
STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class _Opened:
    """Whether a request opened a new connection (httpcore's ``trace``
    extension): only one sent on a kept connection is sent again after a
    ``STALE`` failure (a new one that fails is the upstream's own failure,
    and its request is not sent twice)."""

    def __init__(self) -> None:
        self.opened = False

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name.startswith("connection.connect_tcp"):
            self.opened = True

    async def hook(self, name: str, info: dict[str, Any]) -> None:
        self(name, info)


class Connection:
    """The pooled clients of one :class:`Endpoint`: an async one per event
    loop (a server has one) and a blocking one for worker threads."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._async: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._sync: httpx.Client | None = None
        #: why the last request got no answer at all (None once one is answered):
        #: what the views show of a remote model with no health checks
        self.unreachable: str | None = None

    def _timeout(self) -> httpx.Timeout:
        e = self.endpoint
        # no pool timeout: a request waiting for a free connection waits (a busy
        # upstream is not a failed one; its own queue bounds it)
        return httpx.Timeout(connect=e.connect_timeout, read=e.read_timeout, write=60.0, pool=None)

    def _limits(self) -> httpx.Limits:
        n = self.endpoint.max_connections
        return httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=KEEPALIVE_SECONDS)

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            c = self._async.get(loop)
            if c is None:
                c = self._async[loop] = httpx.AsyncClient(
                    http2=_http2(),
                    timeout=self._timeout(),
                    limits=self._limits(),
                    verify=self.endpoint.verify(),
                    trust_env=False,
                )
            return c

    def blocking(self) -> httpx.Client:
        with self._lock:
            if self._sync is None:
                self._sync = httpx.Client(
                    http2=_http2(),
                    timeout=self._timeout(),
                    limits=self._limits(),
                    verify=self.endpoint.verify(),
                    trust_env=False,
                )
            return self._sync

    def close(self) -> None:
        """Close every client (from any thread): an async one on its own
        loop while that loop runs, else it is dropped with the loop."""
        with self._lock:
            clients, self._async = self._async, {}
            sync, self._sync = self._sync, None
        if sync is not None:
            sync.close()
        for loop, c in clients.items():
            if loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(c.aclose())
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(c.aclose(), loop)

    async def aclose(self) -> None:
        """Close the clients, awaiting this loop's (a server's shutdown,
        while its loop still runs: its connections end now, not when the
        garbage collector finds them)."""
        with self._lock:
            mine = self._async.pop(asyncio.get_running_loop(), None)
        if mine is not None:
            await mine.aclose()
        self.close()

    # -- requests ------------------------------------------------------------
    async def stream_json(self, path: str, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """POST ``body`` and yield each SSE ``data`` object. Raises
        :class:`UpstreamError` for an error answer (before anything was
        yielded) or an error event in the stream; what it quotes of the
        upstream's answer is redacted (``Endpoint.redact_body``)."""
        e = self.endpoint
        client = self.client()
        opened = _Opened()
        request = client.build_request(
            "POST", e.url(path), content=orjson.dumps(body), headers=_json_headers(e), extensions={"trace": opened.hook}
        )
        answered = False
        try:
            try:
                resp = await client.send(request, stream=True)
            except STALE:
                if opened.opened:
                    raise
                # a kept connection the upstream closed as it was reused (its idle timeout): once more
                resp = await client.send(request, stream=True)
            answered, self.unreachable = True, None
            async with aclosing(resp):
                if resp.status_code >= 400:
                    raw = e.redact_body(await _read_limited(resp))
                    raise answer_error(resp.status_code, raw, resp.headers)
                kind = resp.headers.get("content-type", "")
                if resp.status_code != 200 or "text/event-stream" not in kind:
                    raw = e.redact_body(await _read_limited(resp)) if "json" in kind else b""
                    raise _not_a_stream(e, resp.status_code, kind, raw)
                event = ""
                finished = False  # a choice said how it ended
                lines = resp.aiter_lines()
                async for line in lines:
                    if line.startswith("event:"):
                        event = line[6:].strip()
                        continue
                    if line.startswith("error:"):  # llama-server before 2025-09: the error as its own field
                        event, line = "error", "data:" + line[6:]
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        await _finish(lines)
                        return
                    try:
                        obj = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        continue
                    if not isinstance(obj, dict):
                        continue
                    if event == "error" or ("error" in obj and "choices" not in obj):
                        raise stream_error(e.redact_body(data.encode()), resp.headers)
                    event = ""
                    yield obj
                    choices = obj.get("choices")
                    finished = finished or any(isinstance(c, dict) and c.get("finish_reason") for c in choices or ())
                    if finished and not choices and isinstance(obj.get("usage"), dict):
                        # the usage chunk comes last: the answer is whole, even
                        # if the upstream holds the stream open without [DONE]
                        await _finish(lines)
                        return
                # closed with no [DONE]: a proxy's cut, a crash between chunks
                raise UpstreamError(
                    502, f"the upstream's stream ({e.base_url}) closed before its end", CUT, retryable=True
                )
        except httpx.TimeoutException as exc:
            self._no_answer(answered, exc)
            raise UpstreamError(
                504, f"upstream {e.base_url} timed out ({type(exc).__name__})", retryable=True
            ) from None
        except httpx.HTTPError as exc:
            self._no_answer(answered, exc)
            raise UpstreamError(502, f"upstream {e.base_url} unreachable ({_why(exc)})", retryable=True) from None

    def _no_answer(self, answered: bool, exc: BaseException) -> None:
        if not answered:
            self.unreachable = (
                f"{'timed out' if isinstance(exc, httpx.TimeoutException) else 'unreachable'} ({_why(exc)})"
            )

    def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A blocking POST (worker threads: embeddings, token counts); an
        error answer's text redacted as a stream's is."""
        e = self.endpoint
        client = self.blocking()
        opened = _Opened()
        request = client.build_request(
            "POST", e.url(path), content=orjson.dumps(body), headers=_json_headers(e), extensions={"trace": opened}
        )
        answered = False
        try:
            try:
                resp = client.send(request, stream=True)
            except STALE:
                if opened.opened:
                    raise
                # a kept connection the upstream closed as it was reused (its idle timeout): once more
                resp = client.send(request, stream=True)
            answered, self.unreachable = True, None
            try:  # (read outside the retry: an answer cut while read is not sent again)
                resp.read()
            finally:
                resp.close()
        except httpx.TimeoutException as exc:
            self._no_answer(answered, exc)
            raise UpstreamError(
                504, f"upstream {e.base_url} timed out ({type(exc).__name__})", retryable=True
            ) from None
        except httpx.HTTPError as exc:
            self._no_answer(answered, exc)
            raise UpstreamError(502, f"upstream {e.base_url} unreachable ({_why(exc)})", retryable=True) from None
        if resp.status_code >= 400:
            raise answer_error(resp.status_code, e.redact_body(resp.content[:ERROR_BODY_LIMIT]), resp.headers)
        try:
            data = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            raise UpstreamError(502, f"upstream {e.base_url} answered with something that is not JSON") from None
        if not isinstance(data, dict):
            raise UpstreamError(502, f"upstream {e.base_url} answered with something that is not a JSON object")
        return data

    async def healthy(self, timeout: float = 5.0) -> str | None:
        """None when the upstream answers its health path with 2xx, else why
        not. Its own short-lived connection: a pool full of long answers
        must not make a busy upstream look dead."""
        e = self.endpoint
        try:
            async with httpx.AsyncClient(http2=_http2(), timeout=timeout, verify=e.verify(), trust_env=False) as client:
                resp = await client.get(e.health_url(), headers=e.request_headers())
        except httpx.HTTPError as exc:
            return f"unreachable ({_why(exc)})"
        return None if resp.status_code < 300 else f"health check answered {resp.status_code}"


def answer_error(status: int, raw: bytes, headers: httpx.Headers) -> UpstreamError:
    message, code = error_message(status, raw)
    overflow = context_overflow(message, raw) if status in (400, 413) else None
    if overflow is not None:  # worded and coded as this server's own
        return UpstreamError(400, str(overflow), overflow.code, answered=True)
    retry = headers.get("retry-after")
    return UpstreamError(
        status,
        message,
        code,
        retry if status in (429, 503) else None,
        retryable=status == 429 or status >= 500,
        answered=True,
    )


def stream_error(raw: bytes, headers: httpx.Headers) -> UpstreamError:
    """An error event inside a stream (vLLM, SGLang, llama-server send one
    for a failure after the answer began, and SGLang for a refusal before
    it): the HTTP status it names, as an answer with that status would be
    (a context overflow worded as ours); 502 when it names none. Once output
    went out, the run's failure is the upstream's whatever it says
    (``RemoteModel._failed``)."""
    status = _named_status(raw)
    if status is not None:
        exc = answer_error(status, raw, headers)
        if exc.status >= 500:
            exc.message = f"the upstream failed mid-stream: {exc.message}"
            exc.args = (exc.message,)
        return exc
    message, code = error_message(500, raw)
    return UpstreamError(502, f"the upstream failed mid-stream: {message}", code, answered=True)


def _named_status(raw: bytes) -> int | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    err = data.get("error", data) if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return None
    for value in (err.get("code"), err.get("status"), data.get("code")):
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
            return value
    return None


def _not_a_stream(e: Endpoint, status: int, kind: str, raw: bytes) -> UpstreamError:
    """A 2xx that is not an event stream: an error in a JSON body (a gateway
    in front of the engine may answer so) is relayed with its message."""
    what = f"upstream {e.base_url} answered {status} {kind or 'without a content type'} to a streamed request"
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and "error" in data and "choices" not in data:
        message, code = error_message(status, raw)
        return UpstreamError(502, f"{what}, an error: {message}", code, retryable=True)
    return UpstreamError(502, f"{what}, not an event stream", retryable=True)


async def _read_limited(resp: httpx.Response) -> bytes:
    out = bytearray()
    async for chunk in resp.aiter_bytes():
        out += chunk
        if len(out) >= ERROR_BODY_LIMIT:
            break
    return bytes(out[:ERROR_BODY_LIMIT])


def _json_headers(e: Endpoint) -> dict[str, str]:
    return {**e.request_headers(), "Content-Type": "application/json"}


async def _finish(lines: AsyncIterator[str]) -> None:
    """Read the end of a stream after its ``[DONE]`` (normally nothing but
    the body's end), so its connection goes back to the pool rather than
    being closed; an upstream that keeps the stream open past it is left
    after a moment."""
    # (the answer is whole: a cut or reset past its end changes nothing)
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(1.0):
            async for _ in lines:
                pass


def _why(exc: BaseException) -> str:
    """The failure's kind, naming an untrusted TLS certificate (the one a
    private CA's upstream needs ``ca_file`` for)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"{type(exc).__name__}: TLS certificate not trusted ({cause.verify_message}); see ca_file"
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


def _http2() -> bool:
    """HTTP/2 when ``h2`` is installed (negotiated over TLS; plain http stays 1.1)."""
    try:
        import h2  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency, but optional to httpx
        return False
    return True
