"""The admin key is accepted on every route, as a tenant of its own (issue
42, item 9), as a single-key server's key and LiteLLM's master key are: one
Ollama client holding it pulls a model, lists it and chats with it (it got
401 on ``/api/tags`` and ``/api/chat``). It sees every tenant only where an
admin does (the views, the slot routes); elsewhere only its own."""

from __future__ import annotations

import httpx
import ollama

from turbospark.access.auth import Auth, tenant_of

from .views_support import pulling_server

KEY, ADMIN = "user-key", "admin-key"
HELLO = [{"role": "user", "content": "Say hello."}]


def test_one_ollama_client_with_the_admin_key_pulls_lists_and_chats(tmp_path):
    with pulling_server(str(tmp_path), api_keys=[KEY], admin_keys=[ADMIN]) as (srv, _):
        client = ollama.Client(host=srv.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)
        client.pull("smollm2:135m")
        assert "smollm2:135m" in {m.model for m in client.list().models}
        answer = client.chat(model="smollm2:135m", messages=HELLO, options={"num_predict": 4})
        assert answer.message.content is not None
        # its request is its own tenant's: an inference key does not see it
        mine = httpx.get(srv.url + "/v1/stats", params={"requests": 1000}, headers={"x-api-key": KEY}, timeout=10)
        every = httpx.get(srv.url + "/v1/stats", params={"requests": 1000}, headers={"x-api-key": ADMIN}, timeout=10)
        assert "/api/chat" in {r["path"] for r in every.json()["records"]}
        assert "/api/chat" not in {r["path"] for r in mine.json()["records"]}
        # and the inference key still gets no admin route
        r = httpx.post(srv.url + "/api/pull", json={"model": "smollm2:135m"}, headers={"x-api-key": KEY})
        assert r.status_code == 403
        assert httpx.get(srv.url + "/api/tags", timeout=10).status_code == 401  # no key at all


def test_the_admin_key_is_its_own_tenant_on_inference_routes():
    auth = Auth((KEY,), (ADMIN,))
    d = auth.check("POST", "/v1/chat/completions", {"x-api-key": ADMIN})
    assert d.allowed and d.tenant == tenant_of(ADMIN) and not d.admin
    for method, path in (("GET", "/api/tags"), ("POST", "/api/chat"), ("POST", "/v1/messages"), ("GET", "/props")):
        assert auth.check(method, path, {"authorization": f"Bearer {ADMIN}"}).allowed, path
    # where an admin sees every tenant, it still does
    assert auth.check("GET", "/v1/stats", {"x-api-key": ADMIN}).admin
    assert auth.check("POST", "/slots/0", {"x-api-key": ADMIN}).admin
    assert auth.check("POST", "/api/pull", {"x-api-key": ADMIN}).admin
    assert not auth.check("POST", "/v1/chat/completions", {"x-api-key": "nope"}).allowed
