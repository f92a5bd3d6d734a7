"""Reads ``GET /v1/events`` with httpx, resuming with ``?since=`` after any
disconnect, and hands out each event as its dict (gap markers as
``{"kind": "gap", "missed": N, ...}``, which :class:`~turbospark.views.fold.Fold`
counts as log gaps)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson


@dataclass(frozen=True)
class Frame:
    id: int | None
    event: str
    data: str


class SSEParser:
    """Line-by-line Server-Sent Events parsing (the WHATWG rules that matter
    here: ``field: value``, comments, multi-line data, blank line ends)."""

    def __init__(self) -> None:
        self._id: int | None = None
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> Frame | None:
        if line == "":
            if not self._data and self._id is None:
                self._event = "message"
                return None
            frame = Frame(self._id, self._event, "\n".join(self._data))
            self._id, self._event, self._data = None, "message", []
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            try:
                self._id = int(value)
            except ValueError:
                pass
        return None


class EventSource:
    """An endless async iterator of event dicts from one server.

    ``seq`` is the last event sequence number received; a reconnect asks for
    everything after it, so nothing is lost unless the server's ring moved
    past it (then the server sends a gap marker, passed on like an event).
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        on_state: Callable[[str], None] = lambda state: None,
        since: int = 0,
        retry_s: float = 1.0,
        read_timeout_s: float = 60.0,  # the server sends keep-alives every 15 s
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.on_state = on_state
        self.seq = since
        self.retry_s = retry_s
        self.timeout = httpx.Timeout(10.0, read=read_timeout_s)
        self.connected = False

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            while True:
                try:
                    async with client.stream(
                        "GET", self.url + "/v1/events", params={"since": self.seq}, headers=self._headers()
                    ) as response:
                        if response.status_code == 401:
                            self.on_state("unauthorized (pass --api-key)")
                        elif response.status_code != 200:
                            self.on_state(f"HTTP {response.status_code}")
                        else:
                            self.connected = True
                            self.on_state("live")
                            parser = SSEParser()
                            async for line in response.aiter_lines():
                                frame = parser.feed(line)
                                if frame is None:
                                    continue
                                if frame.id is not None:
                                    self.seq = frame.id
                                if frame.data:
                                    try:
                                        event = orjson.loads(frame.data)
                                    except orjson.JSONDecodeError:
                                        continue  # not an event (the fold skips any other shape)
                                    if frame.event == "gap" and isinstance(event, dict):
                                        event = {"kind": "gap", **event}
                                    yield event
                except (httpx.HTTPError, OSError) as exc:
                    self.on_state(f"reconnecting ({type(exc).__name__})")
                else:
                    self.on_state("reconnecting")
                self.connected = False
                await asyncio.sleep(self.retry_s)
