"""API keys (CONTRACT §5): every route but GET /health, both header
forms, constant-time comparison, 401s in each dialect's shape, observed."""

from __future__ import annotations

import subprocess
import sys

import anthropic
import httpx
import openai
import pytest

from turbospark import ListObserver, Server
from turbospark.access.auth import Auth, is_loopback, refuse_open_bind

KEY = "sk-test-0123456789"
ADMIN = "admin-secret-key"


@pytest.fixture(scope="module")
def guarded(server):
    model = server.registry.models()[0]
    obs = ListObserver()
    with Server(models=[model], observer=obs, api_keys=[KEY], admin_keys=[ADMIN]) as srv:
        yield srv, obs


CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def test_missing_key_is_401_before_the_body_is_read(guarded):
    srv, obs = guarded
    r = httpx.post(srv.url + "/v1/chat/completions", content=b"{definitely not json")
    assert r.status_code == 401  # not 400: auth runs before the body is parsed
    assert r.json() == {
        "error": {"message": "invalid or missing API key", "type": "authentication_error", "param": None, "code": None}
    }
    rid = int(r.headers["x-request-id"])
    assert [(e.kind, getattr(e, "status", None)) for e in obs.of(rid)] == [
        ("requestStarted", None),
        ("requestFinished", 401),
    ]
    assert obs.of(rid)[1].error == "invalid or missing API key"


@pytest.mark.parametrize("key", ["sk-test-0123456788", "short", KEY + "-longer", ""])
def test_wrong_keys_of_any_length_are_401(guarded, key):
    srv, _ = guarded
    r = httpx.post(srv.url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": key})
    assert r.status_code == 401


def test_x_api_key_and_bearer_both_work(guarded):
    srv, _ = guarded
    assert (
        httpx.post(srv.url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": KEY}, timeout=60).status_code
        == 200
    )
    assert (
        httpx.post(
            srv.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {KEY}"}, timeout=60
        ).status_code
        == 200
    )
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
    assert c.chat.completions.create(**CHAT).choices[0].message.content is not None
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_sdks_authenticate_natively(guarded):
    srv, _ = guarded
    a = anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0)
    assert a.messages.create(model="m", max_tokens=3, messages=[{"role": "user", "content": "Hi"}]).content
    with pytest.raises(anthropic.AuthenticationError) as exc:
        anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=3, messages=[{"role": "user", "content": "Hi"}]
        )
    assert exc.value.body["error"]["type"] == "authentication_error"


def test_401_shapes_per_dialect(guarded):
    srv, _ = guarded
    a = httpx.post(srv.url + "/v1/messages", json={})
    assert a.status_code == 401 and a.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid or missing API key"},
    }
    o = httpx.post(srv.url + "/api/chat", json={})
    assert o.status_code == 401 and o.json() == {"error": "invalid or missing API key"}
    # the model list is both OpenAI's and Anthropic's: the client's header decides
    m = httpx.get(srv.url + "/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert m.status_code == 401 and m.json()["type"] == "error"
    assert m.json()["error"]["type"] == "authentication_error"
    assert set(httpx.get(srv.url + "/v1/models").json()) == {"error"}


def test_health_is_open_everything_else_is_not(guarded):
    srv, _ = guarded
    assert httpx.get(srv.url + "/health").status_code == 200
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/api/tags"),
        ("GET", "/v1/slots"),
        ("GET", "/"),
        ("GET", "/v1/nonexistent"),
        ("POST", "/health"),
    ]:
        assert httpx.request(method, srv.url + path).status_code == 401, path


def test_admin_routes_need_the_admin_key(guarded):
    srv, _ = guarded
    assert httpx.get(srv.url + "/v1/admin/models", headers={"x-api-key": KEY}).status_code == 403
    r = httpx.get(srv.url + "/v1/admin/models", headers={"x-api-key": ADMIN})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "smollm2-135m"
    # and it opens the inference routes too, as a tenant of its own (tests/test_admin_tenant.py)
    assert httpx.get(srv.url + "/v1/models", headers={"x-api-key": ADMIN}).status_code == 200
    # it reads the views, by GET and by HEAD alike (HEAD was a 401)
    for path in ("/v1/events", "/v1/stats", "/v1/slots", "/metrics"):
        assert httpx.head(srv.url + path, headers={"x-api-key": ADMIN}, timeout=10).status_code == 200, path


def test_tenant_is_a_hash_never_the_key(guarded):
    srv, _ = guarded
    httpx.post(srv.url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": KEY}, timeout=60)
    slots = httpx.get(srv.url + "/v1/slots", headers={"x-api-key": KEY}).json()["data"]
    owners = {s["owner"] for s in slots if s["owner"]}
    assert owners and all(KEY not in o for o in owners)


def test_auth_unit():
    auth = Auth(("k1", "k2"))
    assert auth.check("GET", "/health", {}).allowed
    assert not auth.check("GET", "/v1/models", {}).allowed
    assert auth.check("GET", "/v1/models", {"authorization": "bearer k2"}).allowed  # scheme is case-insensitive
    assert not auth.check("GET", "/v1/models", {"authorization": "Basic k2"}).allowed
    t1 = auth.check("GET", "/", {"x-api-key": "k1"}).tenant
    t2 = auth.check("GET", "/", {"x-api-key": "k2"}).tenant
    assert t1 and t2 and t1 != t2
    assert not Auth().enabled and Auth().check("POST", "/v1/x", {}).allowed
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    assert refuse_open_bind("0.0.0.0", Auth()) and refuse_open_bind("0.0.0.0", Auth(("k",))) is None


def test_serve_refuses_a_public_address_without_a_key():
    out = subprocess.run(
        [sys.executable, "-m", "turbospark.cli", "serve", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0 without an API key" in out.stderr


def test_kv_reuse_never_crosses_api_keys(server):
    """The same conversation under key B gets nothing from key A's cache."""
    from turbospark.engine.model import LlamaChatModel, ModelOptions
    from turbospark.models.catalog import resolve_model

    model = LlamaChatModel(
        ModelOptions(path=resolve_model("smollm2-135m")[0], id="tenants", parallel=1, session_slots=2)
    )
    obs = ListObserver()
    try:
        with Server(models=[model], observer=obs, api_keys=["key-a", "key-b"]) as srv:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "Describe a quiet library."}],
                "max_tokens": 4,
            }

            def reused(key: str) -> int:
                r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers={"x-api-key": key}, timeout=60)
                assert r.status_code == 200
                gen = next(e for e in obs.of(int(r.headers["x-request-id"])) if e.kind == "generated")
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == gen.reused_prefix_tokens
                return gen.reused_prefix_tokens

            assert reused("key-a") == 0
            assert reused("key-b") == 0  # A's conversation is there, but not B's to reuse
            assert reused("key-a") > 0  # A reuses its own
            assert reused("key-b") > 0
    finally:
        model.close()
