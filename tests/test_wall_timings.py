"""Per-request wall-clock timings (CONTRACT §2) and what counts as an
eviction of a session slot (CONTRACT §7), on the real bundled model.

Timings are each request's own intervals: queue = submitted → admitted,
prefill = admitted → first token, decode = first → last token. Under
batching they are NOT shares of a batch step, so a request's
``newTokens / decodeSeconds`` is the rate its client really received.
Every comparison here is between the engine's numbers and the client's own
clock on the SAME run, so a slow or loaded machine moves both together.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from turbospark import ListObserver, Server
from turbospark.engine.model import ModelOptions
from turbospark.models.catalog import resolve_model


def path() -> str:
    return resolve_model("smollm2-135m")[0]


def serve(**opts):
    obs = ListObserver()
    srv = Server(models=[ModelOptions(path=path(), id="m", speculative=False, **opts)], observer=obs)
    return srv, obs


def generated(obs: ListObserver, rid: str | int, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in obs.of(int(rid)):
            if e.kind == "generated":
                return e
        time.sleep(0.01)
    raise AssertionError(f"no generated event for request {rid}")


class Stream:
    """One streamed chat completion read on its own thread, stamping every
    chunk that carries content with the client's clock."""

    def __init__(self, client: httpx.Client, content: str, max_tokens: int) -> None:
        self.body = {
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        self.client = client
        self.stamps: list[float] = []  # perf_counter at each content chunk
        self.usage: dict | None = None
        self.rid: str | None = None
        self.error: BaseException | None = None
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self, barrier: threading.Barrier | None = None) -> Stream:
        self.barrier = barrier
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            if self.barrier is not None:
                self.barrier.wait(30)
            with self.client.stream("POST", "/v1/chat/completions", json=self.body) as r:
                assert r.status_code == 200, r.read()
                self.rid = r.headers["x-request-id"]
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.perf_counter()
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        self.usage = chunk["usage"]
                    if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                        self.stamps.append(now)
                        self.first.set()
        except BaseException as exc:  # reported by join()
            self.error = exc
        finally:
            self.first.set()

    def join(self) -> None:
        self.thread.join(120)
        assert not self.thread.is_alive(), "stream never ended"
        if self.error is not None:
            raise self.error


def test_batched_decode_rate_is_the_rate_the_client_saw():
    """Two concurrent streams of different lengths share every batch step:
    each one's decodeSeconds spans its own first → last token, so its rate
    matches the client's (the old per-step shares made it up to 2× too
    fast with two streams)."""
    srv, obs = serve(parallel=2)
    with srv, httpx.Client(base_url=srv.url, timeout=120) as client:
        # warm the model and the connection pool (first-use costs are no timing)
        client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        )
        barrier = threading.Barrier(2)
        streams = [
            Stream(client, "Write a long story about a lighthouse keeper.", 120).start(barrier),
            Stream(client, "Describe a sunrise over the mountains.", 50).start(barrier),
        ]
        for s in streams:
            s.join()
        gens = [generated(obs, s.rid) for s in streams]
        # they really ran together: the short one finished while the long one decoded
        assert streams[1].stamps[-1] < streams[0].stamps[-1]
        assert streams[0].stamps[0] < streams[1].stamps[-1]
        for s, g, n in zip(streams, gens, (120, 50)):
            assert g.new_tokens == n == s.usage["completion_tokens"]
            assert len(s.stamps) >= 2
            client_rate = (g.new_tokens - 1) / (s.stamps[-1] - s.stamps[0])
            engine_rate = g.new_tokens / g.decode_seconds
            assert engine_rate == pytest.approx(client_rate, rel=0.15), (
                f"engine {engine_rate:.1f} tok/s, client {client_rate:.1f} tok/s",
                g,
            )
            assert g.queue_seconds >= 0 and g.prefill_seconds > 0
        # the wall-clock intervals of batched requests overlap: together
        # they exceed the wall time both took (shares of the steps could not)
        both = max(s.stamps[-1] for s in streams) - min(s.stamps[0] for s in streams)
        assert sum(g.decode_seconds for g in gens) > both


def test_queue_seconds_is_the_wait_behind_the_running_request():
    """parallel=1: a request sent while another streams waits until that one
    ends; its queueSeconds is that wait as the client saw it."""
    srv, obs = serve(parallel=1)
    with (
        srv,
        httpx.Client(base_url=srv.url, timeout=120) as long_client,
        httpx.Client(base_url=srv.url, timeout=120) as client,
    ):
        warm = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        long_client.post("/v1/chat/completions", json=warm)
        first = client.post("/v1/chat/completions", json=warm)  # an open connection for the second
        assert generated(obs, first.headers["x-request-id"]).queue_seconds < 0.5
        long = Stream(long_client, "Write a long story about a lighthouse keeper.", 120).start()
        assert long.first.wait(60) and long.stamps, long.error  # it holds the only sequence
        time.sleep(0.1)
        sent = time.perf_counter()
        r = client.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "Name three colours."}],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        long.join()
        g = generated(obs, r.headers["x-request-id"])
        waited = long.stamps[-1] - sent
        assert waited > 0.3, "the long request ended too soon to queue anything behind it"
        assert g.queue_seconds == pytest.approx(waited, abs=0.05), (g.queue_seconds, waited)
        # the queued request's own prefill and decode did not absorb the wait
        assert g.prefill_seconds + g.decode_seconds < waited


def chat(client: httpx.Client, obs: ListObserver, messages: list[dict], key: str | None = None):
    headers = {"x-session-id": key} if key else {}
    r = client.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": "m", "messages": messages, "max_tokens": 24, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    return generated(obs, r.headers["x-request-id"]), r.json()["choices"][0]["message"]["content"]


def test_an_unrelated_conversation_evicts_the_only_slot():
    """session_slots=1: a conversation that shares only the template's
    system prompt with the parked one evicts it (while still reusing the
    common part); a real next turn, a regenerate and a request carrying the
    slot's session key do not."""
    srv, obs = serve(parallel=1, session_slots=1)
    with srv, httpx.Client(base_url=srv.url, timeout=120) as client:
        story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
        g1, _ = chat(client, obs, story)
        assert g1.session_slot_evicted is False  # the slot was empty

        fruits = [{"role": "user", "content": "Unrelated: list three fruits please, with details."}]
        g2, answer = chat(client, obs, fruits)
        assert g2.session_slot_evicted is True
        # reuse and eviction are separate facts: the shared template head
        # still came from the slot's KV
        assert 0 < g2.reused_prefix_tokens < g1.prompt_tokens

        turn2 = fruits + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Which of them is the sweetest?"},
        ]
        g3, _ = chat(client, obs, turn2)
        assert g3.session_slot_evicted is False
        assert g3.reused_prefix_tokens >= g2.prompt_tokens

        g4, _ = chat(client, obs, turn2)  # a regenerate: the same prompt again
        assert g4.session_slot_evicted is False
        assert g4.reused_prefix_tokens == g4.prompt_tokens - 1

        g5, _ = chat(client, obs, story, key="keeper")
        assert g5.session_slot_evicted is True  # the slot held the fruit conversation
        g6, _ = chat(client, obs, [{"role": "user", "content": "Something else entirely."}], key="keeper")
        assert g6.session_slot_evicted is False  # the slot's session key: the same conversation
