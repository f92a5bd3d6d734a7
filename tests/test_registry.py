"""Many models in one server: routing rules, live attach/detach, idle unload,
the resident cap (CONTRACT §4). The real model loaded under several ids."""

from __future__ import annotations

import calendar
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from turbospark import ListObserver, Server
from turbospark.engine.model import ModelOptions
from turbospark.models.catalog import resolve_model
from turbospark.models.local import LocalBackend
from turbospark.models.registry import ModelSpec, Registry, RegistryError, RoutingError

from .fakes import ScriptedModel

PATH = resolve_model("smollm2-135m")[0]
SMALL = dict(ctx=1024, parallel=1)


def opts(model_id: str, **kw) -> ModelOptions:
    return ModelOptions(path=PATH, id=model_id, **{**SMALL, **kw})


@pytest.fixture(scope="module")
def multi():
    obs = ListObserver()
    srv = Server(
        models=[opts("alpha", aliases=("a1", "gpt-4o")), opts("beta"), opts("embedder", kind="embedding")],
        observer=obs,
        strict_model_names=True,  # (without it, the default model, alpha, serves unknown names)
    ).start()
    yield srv, obs
    srv.stop()


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)


def routed(obs, raw):
    rid = int(raw.headers["x-request-id"])
    return next(e for e in obs.of(rid) if e.kind == "requestRouted")


def chat(srv, model, **kw):
    return client(srv).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, **kw
    )


def test_exact_id_and_alias_routing(multi):
    srv, obs = multi
    for asked, served in [("alpha", "alpha"), ("a1", "alpha"), ("gpt-4o", "alpha"), ("beta", "beta")]:
        raw = chat(srv, asked)
        assert raw.parse().choices[0].message.content is not None
        ev = routed(obs, raw)
        assert (ev.requested, ev.served) == (asked, served)


def test_unknown_name_with_strict_names_is_404_listing_the_chat_models(multi):
    srv, obs = multi
    with pytest.raises(openai.NotFoundError) as exc:
        client(srv).chat.completions.create(model="claude-sonnet-4", messages=[{"role": "user", "content": "x"}])
    err = exc.value.body
    assert err["code"] == "model_not_found"
    assert "alpha" in err["message"] and "beta" in err["message"]
    assert "embedder" not in err["message"]  # not capable of chat
    fin = [e for e in obs.events if e.kind == "requestFinished"][-1]
    assert fin.status == 404 and "not found" in fin.error


def test_suggests_the_closest_name(multi):
    srv, _ = multi
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": "alpah", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404 and "Did you mean 'alpha'" in r.json()["error"]["message"]


def test_chat_request_naming_the_embedding_model_is_not_routed_to_it(multi):
    srv, obs = multi
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": "embedder", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404
    assert not [e for e in obs.of(int(r.headers["x-request-id"])) if e.kind == "requestRouted"]


def test_embeddings_route_to_the_embedding_model(multi):
    srv, obs = multi
    raw = client(srv).embeddings.with_raw_response.create(model="embedder", input="hello")
    assert len(raw.parse().data[0].embedding) > 0
    assert routed(obs, raw).served == "embedder"
    # an embedding-kind model holds no chat context, KV slots or scheduler
    model = next(m.engine for m in srv.registry.models() if m.model_id == "embedder")
    assert model.ctx is None and model.scheduler is None
    assert model.info()["kv_cache_bytes"] == 0 and model.load() == {"running": 0, "waiting": 0, "slots": []}
    ps = httpx.get(srv.url + "/api/ps").json()["models"]
    assert "embedder" in {m["name"].split(":")[0] for m in ps}


def test_lookups_never_fall_back(multi):
    srv, _ = multi
    assert httpx.get(srv.url + "/v1/models/alpha").status_code == 200
    assert httpx.get(srv.url + "/v1/models/a1").status_code == 200
    assert httpx.get(srv.url + "/v1/models/gpt-4").status_code == 404
    assert httpx.post(srv.url + "/api/show", json={"model": "gamma"}).status_code == 404
    ids = [m.id for m in client(srv).models.list()]
    assert ids == ["alpha", "beta", "embedder"]


def test_no_capable_model_is_503():
    emb = ScriptedModel(model_id="only-embeds", supports_chat=False, supports_embeddings=True)
    obs = ListObserver()
    with Server(models=[emb], observer=obs) as srv:
        r = httpx.post(
            srv.url + "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 503
        assert r.json()["error"]["message"] == "no model capable of this request (chat) is loaded"
        a = httpx.post(
            srv.url + "/v1/messages",
            json={"model": "x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )
        assert a.status_code == 503 and a.json()["type"] == "error"
        assert [e.status for e in obs.events if e.kind == "requestFinished"] == [503, 503]


def test_duplicate_names_are_refused_naming_both():
    reg = Registry()
    reg.attach(LocalBackend(ScriptedModel(model_id="one", aliases=("shared",))))
    with pytest.raises(RegistryError) as exc:
        reg.attach(LocalBackend(ScriptedModel(model_id="two", aliases=("shared",))))
    assert "'shared'" in str(exc.value) and "'two'" in str(exc.value) and "'one'" in str(exc.value)
    with pytest.raises(RegistryError):
        reg.configure(ModelSpec(id="one"))


def test_resolution_rules_unit():
    reg = Registry()
    with pytest.raises(RoutingError) as exc:
        reg.resolve("x")
    assert exc.value.status == 503
    reg.attach(LocalBackend(ScriptedModel(model_id="solo")))
    r = reg.resolve("claude-sonnet-4-5")
    assert (r.requested, r.served, r.fell_back) == ("claude-sonnet-4-5", "solo", True)
    assert reg.resolve(None).served == "solo"
    assert reg.resolve("solo:latest").served == "solo"
    reg.attach(LocalBackend(ScriptedModel(model_id="duo")))
    with pytest.raises(RoutingError) as exc:
        reg.resolve(None)
    assert exc.value.status == 400
    assert reg.lookup("gpt-4o") is None


def stream_in_thread(url: str, model: str, out: dict, max_tokens: int = 120):
    def run():
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Write a long story about a ship."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        chunks = []
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line)
                    out["started"] = True
                if out.get("stop"):  # the test has what it needs: hang up
                    break
        out["chunks"] = chunks

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while not out.get("started") and time.monotonic() < deadline:
        time.sleep(0.01)
    return t


def test_attach_and_detach_while_requests_stream():
    obs = ListObserver()
    with Server(models=[opts("alpha"), opts("beta")], observer=obs) as srv:
        # attach while alpha streams
        a_out: dict = {}
        ta = stream_in_thread(srv.url, "alpha", a_out)
        r = httpx.post(
            srv.url + "/v1/admin/models",
            timeout=60,
            json={"model": "smollm2-135m", "id": "gamma", "aliases": ["g"], "ctx": 1024, "parallel": 1},
        )
        assert r.status_code == 201, r.text
        assert r.json()["id"] == "gamma" and r.json()["loaded"] is True
        ta.join(60)
        assert a_out["status"] == 200 and a_out["chunks"][-1] == "data: [DONE]"
        assert "gamma" in [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
        assert "gamma" in [m["name"] for m in httpx.get(srv.url + "/api/tags").json()["models"]]
        assert any(e.kind == "modelAttached" and e.model == "gamma" for e in obs.events)
        # the same name again is refused
        dup = httpx.post(srv.url + "/v1/admin/models", timeout=60, json={"model": "smollm2-135m", "id": "g"})
        assert dup.status_code == 409

        # detach beta while it is mid-stream: that request completes
        beta = srv.registry.lookup("beta").model.engine
        b_out: dict = {}
        tb = stream_in_thread(srv.url, "beta", b_out, max_tokens=200)
        d = httpx.delete(srv.url + "/v1/admin/models/beta", timeout=10)
        assert d.status_code == 200 and d.json()["detached"] is True and d.json()["in_flight"] == 1
        assert any(e.kind == "modelDetached" and e.model == "beta" for e in obs.events)

        # its work still shows while it runs (it vanished from both views)
        def beta_slots() -> list[str]:
            slots = httpx.get(srv.url + "/v1/slots", timeout=10).json()["data"]
            return [s["state"] for s in slots if s["model"] == "beta"]

        deadline = time.monotonic() + 30
        while beta_slots() != ["busy"] and time.monotonic() < deadline:
            time.sleep(0.02)  # (its first chunk may go out before its slot is marked)
        assert beta_slots() == ["busy"]
        assert 'turbospark_num_requests_running{model="beta"} 1.0' in httpx.get(srv.url + "/metrics").text
        # new requests no longer reach beta: its name is unknown now, so the
        # default model (alpha, the first) serves it
        nxt = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "beta", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
            timeout=60,
        )
        assert nxt.status_code == 200, nxt.text
        ev = next(e for e in obs.of(int(nxt.headers["x-request-id"])) if e.kind == "requestRouted")
        assert (ev.requested, ev.served) == ("beta", "alpha")
        assert beta.scheduler._thread.is_alive()  # still serving the in-flight stream
        tb.join(120)
        assert b_out["status"] == 200 and b_out["chunks"][-1] == "data: [DONE]"
        finish = [c for c in b_out["chunks"] if '"finish_reason":"length"' in c]
        assert finish, "the detached model's stream did not run to its end"
        deadline = time.monotonic() + 10
        while beta.scheduler._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not beta.scheduler._thread.is_alive(), "the detached model was not unloaded"
        assert httpx.delete(srv.url + "/v1/admin/models/beta").status_code == 404


def test_keep_alive_unloads_idle_and_reloads_on_demand():
    obs = ListObserver()
    with Server(models=[opts("sleepy", keep_alive=0.5)], observer=obs) as srv:
        assert chat(srv, "sleepy").status_code == 200
        deadline = time.monotonic() + 15
        while srv.registry.lookup("sleepy").model is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.registry.lookup("sleepy").model is None
        assert [e.kind for e in obs.events if e.kind.startswith("model")] == ["modelAttached", "modelDetached"]
        assert httpx.get(srv.url + "/api/ps").json()["models"] == []
        assert [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]] == ["sleepy"]
        raw = chat(srv, "sleepy")  # loads it again
        assert raw.parse().choices[0].message.content is not None
        assert [e.kind for e in obs.events if e.kind.startswith("model")][-1] == "modelAttached"


def test_max_resident_evicts_least_recently_used():
    obs = ListObserver()
    with Server(models=[opts("first"), opts("second")], observer=obs, max_resident=1) as srv:
        assert srv.registry.lookup("first").model is not None
        assert srv.registry.lookup("second").model is None  # configured, loads on first use
        # its listing says the context it will be served with all the same
        cards = {m["id"]: m for m in httpx.get(srv.url + "/v1/models", timeout=30).json()["data"]}
        assert cards["second"]["state"] != "loaded" and cards["second"]["context_length"] == SMALL["ctx"]
        assert chat(srv, "second").status_code == 200
        assert srv.registry.lookup("first").model is None
        assert srv.registry.lookup("second").model is not None
        moves = [(e.kind, e.model) for e in obs.events if e.kind.startswith("model")]
        assert moves == [("modelAttached", "first"), ("modelDetached", "first"), ("modelAttached", "second")]
        assert chat(srv, "first").status_code == 200
        assert srv.registry.lookup("second").model is None


def test_max_resident_holds_while_every_resident_model_is_busy():
    """A request for a model that is not loaded, while every resident one is
    busy, waits for one to go idle (as Ollama's scheduler does) and never
    loads past --max-resident; two such loads at once take the one place in
    turn. Before, the model was loaded anyway and both stayed resident."""
    obs = ListObserver()
    with Server(models=[opts("first"), opts("second"), opts("third")], observer=obs, max_resident=1) as srv:
        reg = srv.registry
        peak = [0]
        watching = True

        def watch() -> None:  # the most models resident at once
            while watching:
                peak[0] = max(peak[0], sum(reg.lookup(m).model is not None for m in ("first", "second", "third")))
                time.sleep(0.002)

        w = threading.Thread(target=watch)
        w.start()
        try:
            out: dict = {}
            t = stream_in_thread(srv.url, "first", out, max_tokens=150)  # busy for a few seconds
            assert out.get("started")
            with ThreadPoolExecutor(2) as pool:
                waiting = [pool.submit(chat, srv, name) for name in ("second", "third")]
                t.join(120)
                assert out["status"] == 200 and out["chunks"][-1] == "data: [DONE]"  # undisturbed
                assert [f.result().status_code for f in waiting] == [200, 200]
        finally:
            watching = False
            w.join()
        assert peak[0] == 1
        moves = [(e.kind, e.model) for e in obs.events if e.kind.startswith("model")]
        assert moves[:2] == [("modelAttached", "first"), ("modelDetached", "first")]  # only once it was done
        assert sorted(m for k, m in moves[2:] if k == "modelAttached") == ["second", "third"]
        assert sum(reg.lookup(m).model is not None for m in ("first", "second", "third")) == 1


def test_a_load_that_waits_too_long_for_room_is_a_503_with_retry_after(monkeypatch: pytest.MonkeyPatch):
    from turbospark.models import registry

    monkeypatch.setattr(registry, "ROOM_WAIT_SECONDS", 0.5)
    with Server(models=[opts("first"), opts("second")], max_resident=1) as srv:
        out: dict = {}
        t = stream_in_thread(srv.url, "first", out, max_tokens=400)
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "second", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            timeout=60,
        )
        out["stop"] = True
        t.join(120)
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        assert r.json()["error"]["code"] == "max_resident" and "busy" in r.json()["error"]["message"]
        assert srv.registry.lookup("second").model is None and srv.registry.lookup("first").model is not None
        monkeypatch.setattr(registry, "ROOM_WAIT_SECONDS", 60.0)  # (first's run may still be ending)
        assert chat(srv, "second").status_code == 200  # idle now: first makes room


def test_a_load_waiting_for_room_ends_at_the_drains_deadline():
    """A request waiting for a resident model to go idle when the server
    stops: the drain's deadline ends the wait with a 503 ``shutting_down``
    (it held the exit until uvicorn cancelled it, a plain-text 500)."""
    obs = ListObserver()
    with Server(models=[opts("first"), opts("second")], max_resident=1, drain_timeout=1, observer=obs) as srv:
        out: dict = {}
        t = stream_in_thread(srv.url, "first", out, max_tokens=900)  # busy past the drain
        waiting: dict = {}

        def ask() -> None:
            body = {"model": "second", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            waiting["r"] = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)

        w = threading.Thread(target=ask)
        w.start()
        deadline = time.monotonic() + 60
        while srv.registry.lookup("second")._loading is None and time.monotonic() < deadline:
            time.sleep(0.02)  # until it waits for room (else the drain would refuse it at the door)
        assert srv.registry.lookup("second")._loading is not None
        srv.stop()
        w.join(120)
        t.join(120)
    r = waiting["r"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
    # nothing was loaded (nor evicted) while shutting down
    assert [(e.kind, e.model) for e in obs.events if e.kind.startswith("model")] == [("modelAttached", "first")]


def test_a_replica_with_no_room_to_load_is_passed_over_not_marked_down():
    """In a group of local replicas under --max-resident, only as many load
    at start as the cap allows; a replica that cannot be loaded for want of
    room is not a failed one: the request goes to a loaded replica at once,
    and nothing is marked down."""
    from turbospark.models.loading import GroupOptions

    obs = ListObserver()
    group = GroupOptions("pool", [("a", opts("x", parallel=2)), ("b", opts("x", parallel=2))], health_interval=3600)
    with Server(models=[group], observer=obs, max_resident=1) as srv:
        # the cap holds at start too: b waits for its first use (both were loaded)
        loaded = [m for m in ("pool@a", "pool@b") if srv.registry.lookup(m).model is not None]
        assert loaded == ["pool@a"]
        listed = {m["id"]: m for m in httpx.get(srv.url + "/v1/models").json()["data"]}
        assert {"pool", "pool@a", "pool@b"} <= set(listed)
        out: dict = {}
        t = stream_in_thread(srv.url, "pool", out, max_tokens=300)  # the loaded one is busy
        r = chat(srv, "pool")
        out["stop"] = True
        t.join(120)
        assert r.status_code == 200
        assert [m for m in ("pool@a", "pool@b") if srv.registry.lookup(m).model is not None] == loaded
        assert not [e for e in obs.events if e.kind == "modelHealth" and e.state == "down"]
        assert all(rep.up for rep in srv.registry.lookup("pool").group.replicas)


def test_admin_attach_inherits_the_server_defaults_and_respects_max_resident():
    """Issue 16 point 6: an attached model starts from the server's defaults
    (here --max-queue, --threads, --speculative off, --keep-alive) unless the
    request sets them, and counts against --max-resident: the least recently
    used idle model makes room; when every resident model is busy, 409."""
    defaults = {"max_queue": 3, "threads": 1, "speculative": False, "keep_alive": 300.0, "ctx": 1024}
    with Server(models=[opts("alpha")], max_resident=1, model_defaults=defaults) as srv:
        assert chat(srv, "alpha").status_code == 200
        r = httpx.post(srv.url + "/v1/admin/models", timeout=60, json={"model": "smollm2-135m", "id": "gamma"})
        assert r.status_code == 201, r.text
        gamma = srv.registry.lookup("gamma")
        assert srv.registry.lookup("alpha").model is None  # evicted to make room
        assert gamma.spec.keep_alive == 300.0
        sch = gamma.model.engine.scheduler
        assert (sch.max_queue, sch.speculative, gamma.model.engine.ctx.threads) == (3, False, 1)
        # what the request sets wins over the defaults
        assert httpx.delete(srv.url + "/v1/admin/models/gamma", timeout=10).status_code == 200
        r = httpx.post(
            srv.url + "/v1/admin/models", timeout=60, json={"model": "smollm2-135m", "id": "delta", "threads": 2}
        )
        assert r.status_code == 201, r.text
        assert srv.registry.lookup("delta").model.engine.ctx.threads == 2
        # every resident model busy: the attach is refused, nothing is loaded
        out: dict = {}
        t = stream_in_thread(srv.url, "delta", out, max_tokens=600)  # busy throughout the attach
        busy = httpx.post(srv.url + "/v1/admin/models", timeout=60, json={"model": "smollm2-135m", "id": "eps"})
        out["stop"] = True
        t.join(120)
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "max_resident", busy.text
        assert srv.registry.lookup("eps") is None and out["status"] == 200


def test_ollama_keep_alive_durations_parse_as_ollama_does():
    from turbospark.dialects.common import BadRequest
    from turbospark.dialects.ollama import keep_alive_seconds

    assert keep_alive_seconds(None) is None
    assert keep_alive_seconds(300) == 300.0 and keep_alive_seconds("300") == 300.0
    assert keep_alive_seconds("5m") == 300.0 and keep_alive_seconds("1h30m") == 5400.0
    assert keep_alive_seconds("300ms") == pytest.approx(0.3)
    assert keep_alive_seconds(0) == 0.0 and keep_alive_seconds("0s") == 0.0
    assert keep_alive_seconds(-1) == float("inf") and keep_alive_seconds("-1m") == float("inf")
    for bad in ("soon", "5 minutes", "", True, "m5"):
        with pytest.raises(BadRequest):
            keep_alive_seconds(bad)


def test_ollama_keep_alive_unloads_sets_the_timeout_and_reports_the_load():
    """Issue 16 point 7 on the real model: ``keep_alive: 0`` answers
    ``unload`` and unloads the model once idle; the next request reloads it
    and reports that as its ``load_duration``; a per-request keep_alive sets
    the model's idle timeout; bad durations are a 400."""
    obs = ListObserver()
    with Server(models=[opts("sleepy")], observer=obs) as srv:
        r = httpx.post(srv.url + "/api/generate", timeout=30, json={"model": "sleepy", "keep_alive": 0})
        assert r.status_code == 200 and r.json()["done_reason"] == "unload"
        deadline = time.monotonic() + 15
        while srv.registry.lookup("sleepy").model is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.registry.lookup("sleepy").model is None
        body = {
            "model": "sleepy",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": False,
            "keep_alive": "5m",
            "options": {"num_predict": 4, "temperature": 0},
        }
        r = httpx.post(srv.url + "/api/chat", timeout=120, json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["load_duration"] > 0 and out["total_duration"] >= out["load_duration"]
        assert srv.registry.lookup("sleepy").keep_alive == 300.0
        again = httpx.post(srv.url + "/api/chat", timeout=120, json=body).json()
        assert again["load_duration"] == 0  # resident now
        # /api/ps says when it goes: five minutes from now (it said "forever")
        expires = expires_at(srv.url)
        assert 250 < expires - time.time() <= 301, expires - time.time()
        # a request without keep_alive, in any dialect, brings back the
        # operator's (here: resident), as Ollama's default comes back; it
        # stayed at the last client's before
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=120,
                       json={"model": "sleepy", "messages": body["messages"], "max_tokens": 2})  # fmt: skip
        assert r.status_code == 200
        sleepy = srv.registry.lookup("sleepy")
        assert sleepy.keep_alive is None and sleepy.spec.keep_alive is None
        assert expires_at(srv.url) - time.time() > 100 * 365 * 86400
        httpx.post(srv.url + "/api/chat", timeout=120, json={**body, "keep_alive": 2})
        r = httpx.post(srv.url + "/api/chat", timeout=120, json={k: v for k, v in body.items() if k != "keep_alive"})
        assert r.status_code == 200 and srv.registry.lookup("sleepy").keep_alive is None
        bad = httpx.post(srv.url + "/api/chat", timeout=30, json={**body, "keep_alive": "soon"})
        assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]
        kinds = [e.kind for e in obs.events if e.kind.startswith("model")]
        assert kinds == ["modelAttached", "modelDetached", "modelAttached"]


def expires_at(url: str) -> float:
    """``/api/ps``'s ``expires_at`` of its one model, as a Unix time."""
    (row,) = httpx.get(url + "/api/ps", timeout=10).json()["models"]
    stamp = row["expires_at"].rstrip("Z").split(".")[0]
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_the_keep_alive_reaper_runs_from_start():
    """A model loaded at start and never used still unloads after its keep-alive."""
    with Server(models=[opts("idle", keep_alive=0.5)]) as srv:
        deadline = time.monotonic() + 15
        while srv.registry.lookup("idle").model is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.registry.lookup("idle").model is None
