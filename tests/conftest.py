"""Shared fixtures: ONE real server on a loopback port with the bundled
model, shared by the whole session, a hub of observers tests can tap, and a
server around a scripted model that fails mid-generation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from turbospark import ListObserver, Server
from turbospark.observe import ServerEvent

from .fakes import Script, ScriptedModel


class Hub:
    """An observer that keeps every event and forwards to tapped observers."""

    def __init__(self) -> None:
        self.events: list[ServerEvent] = []
        self.taps: list[Any] = []
        self._lock = threading.Lock()

    def record(self, event: ServerEvent) -> None:
        with self._lock:
            self.events.append(event)
        for tap in list(self.taps):
            tap.record(event)  # a raising tap must not break requests

    def of(self, rid: int | str) -> list[ServerEvent]:
        rid = int(rid)
        with self._lock:
            return [e for e in self.events if getattr(e, "id", None) == rid]

    def wait_for(
        self, pred: Callable[[list[ServerEvent]], bool], rid: int | str, timeout: float = 30
    ) -> list[ServerEvent]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            evs = self.of(rid)
            if pred(evs):
                return evs
            time.sleep(0.02)
        raise AssertionError(
            f"events of request {rid} never satisfied the condition: {[e.to_dict() for e in self.of(rid)]}"
        )

    def wait_kind(self, rid: int | str, kind: str, timeout: float = 30) -> ServerEvent:
        evs = self.wait_for(lambda es: any(e.kind == kind for e in es), rid, timeout)
        return next(e for e in evs if e.kind == kind)


@pytest.fixture(scope="session")
def hub() -> Hub:
    return Hub()


@pytest.fixture(scope="session")
def server(hub: Hub):
    srv = Server(observer=hub).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def qwen_server():
    """A second server with Qwen2.5-Coder-0.5B (a model that really calls
    tools), shared by every tool-calling test file: ``(server, hub)``."""
    from turbospark.engine.model import ModelOptions
    from turbospark.models.catalog import CATALOG, resolve_model

    if not CATALOG["qwen2.5-coder-0.5b"].installed():
        pytest.fail("the Qwen2.5-Coder package model is not installed (make test installs it)")
    path, _ = resolve_model("qwen2.5-coder-0.5b")
    events = Hub()
    srv = Server(models=[ModelOptions(path=path, id="qwen", ctx=4096, parallel=1)], observer=events).start()
    yield srv, events
    srv.stop()


@pytest.fixture(scope="session")
def oai(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture()
def failing():
    """A server whose scripted model fails after two pieces (``one``, `` two``):
    ``(server, model, observer)``."""
    model = ScriptedModel(scripts=[Script(["one", " two", " three"], fail_after=2)])
    obs = ListObserver()
    with Server(models=[model], observer=obs) as srv:
        yield srv, model, obs
