"""turbospark.Server in-process with observers attached, and observers that
misbehave."""

from __future__ import annotations

import openai

from turbospark import RingObserver, Server


def test_server_with_ring_observer(server):
    model = server.registry.models()[0]  # reuse the loaded model: not owned, not closed
    ring = RingObserver(max_events=100)
    with Server(models=[model], observer=ring) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model="anything", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert r.usage.completion_tokens >= 1
    drained = ring.drain()
    kinds = [e["kind"] for e in drained.events]
    assert kinds == ["modelAttached", "requestStarted", "requestRouted", "generated", "requestFinished"]
    assert drained.events[3]["newTokens"] == r.usage.completion_tokens
    assert drained.dropped == 0


def test_server_without_observer_serves(server):
    model = server.registry.models()[0]
    with Server(models=[model]) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert raw.parse().choices[0].message.content is not None
        assert raw.headers["x-request-id"]


def test_raising_observer_does_not_break_requests(hub, oai):
    class Boom:
        calls = 0

        def record(self, event):
            Boom.calls += 1
            raise RuntimeError("observer exploded")

    hub_taps = hub.taps
    boom = Boom()
    from turbospark.observe import FanOut

    hub_taps.append(FanOut([boom]))  # FanOut contains it, as the server's fan-out does
    try:
        r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        assert r.choices[0].message.content is not None
        assert Boom.calls >= 3
    finally:
        hub_taps.clear()


def test_observer_raising_directly_is_contained(server):
    """The server's own observer (not wrapped in a fan-out) raises on every
    event: requests still succeed."""

    class Boom:
        def record(self, event):
            raise RuntimeError("no")

    model = server.registry.models()[0]
    with Server(models=[model], observer=Boom()) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        assert r.usage.completion_tokens >= 1
        s = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
        )
        assert list(s)
