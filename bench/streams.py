"""Reading an OpenAI chat stream the way a client sees it, for the benches."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Streamed:
    text: str
    usage: dict[str, Any]
    request_id: int | None
    chunks: int  # content chunks
    first: float  # perf_counter at the first content chunk
    last: float  # ... and at the last
    sent: float = 0.0  # perf_counter when the request was sent

    @property
    def ttft(self) -> float:
        """Client-side time to the first content chunk."""
        return self.first - self.sent

    def decode_rate(self) -> float:
        """Client-side decode tok/s: first token's text .. last token's text
        is completion_tokens - 1 decode steps."""
        tokens = self.usage.get("completion_tokens", self.chunks)
        return (tokens - 1) / (self.last - self.first)


def stream_chat(url: str, body: dict[str, Any], timeout: float = 600) -> Streamed:
    """POST a streamed chat completion (usage included) and time its chunks."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    first = last = 0.0
    sent = time.perf_counter()
    text: list[str] = []
    usage: dict[str, Any] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout) as r:
        r.raise_for_status()
        rid = r.headers.get("x-request-id")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                text.append(chunk["choices"][0]["delta"]["content"])
    return Streamed("".join(text), usage, int(rid) if rid else None, len(text), first, last, sent)
