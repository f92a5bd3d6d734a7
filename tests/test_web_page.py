"""The web page's serving (issue 44), with httpx: ``/`` is the app to a
browser and ``Ollama is running`` to everyone else; its files are served
from the package under ``/app/`` with a Content-Security-Policy (no inline
script, nothing from another origin); with keys the page and its files
need none (they hold no data) while ``/`` still needs one for an Ollama
client; the Host/Origin guard holds for the page as for the API."""

from __future__ import annotations

import re

import httpx
import pytest

from .views_support import fresh_server

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


@pytest.fixture(scope="module")
def keyed(server):
    with fresh_server(server, api_keys=["page-key"]) as srv:
        yield srv


def test_root_is_the_page_to_a_browser_and_ollamas_probe_to_the_rest(base_url):
    page = httpx.get(base_url + "/", headers=BROWSER)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    for rule in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "style-src 'self'"):
        assert rule in csp, csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert '<script type="module" src="/app/main.js"></script>' in page.text
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), "an inline script"
    assert not re.search(r"\son[a-z]+=|style=", page.text), "an inline handler or style"
    assert "http://" not in page.text and "https://" not in page.text  # no CDN, nothing remote
    for accept in ("*/*", "application/json", None):
        r = httpx.get(base_url + "/", headers={"Accept": accept} if accept else {})
        assert r.status_code == 200 and r.text == "Ollama is running", accept
    assert httpx.head(base_url + "/").status_code == 200
    assert httpx.get(base_url + "/dashboard").text == page.text  # (it opens on Activity)


def test_the_apps_files(base_url):
    js = httpx.get(base_url + "/app/main.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert (
        js.headers["x-content-type-options"] == "nosniff"
        and "script-src 'self'" in js.headers["content-security-policy"]
    )
    again = httpx.get(base_url + "/app/main.js", headers={"If-None-Match": js.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert httpx.get(base_url + "/app/app.css").headers["content-type"].startswith("text/css")
    assert "Apache License" in httpx.get(base_url + "/app/vendor/LICENSE.dompurify.txt").text
    assert "MIT" in httpx.get(base_url + "/app/vendor/LICENSE.marked.txt").text
    for path in ("/app/nope.js", "/app/../routes/page.py", "/app/%2e%2e/index.html", "/app/.hidden.js", "/app/x.py"):
        assert httpx.get(base_url + path).status_code == 404, path


def test_with_keys_the_page_is_open_its_data_is_not(keyed):
    assert httpx.get(keyed.url + "/", headers=BROWSER).status_code == 200
    assert httpx.get(keyed.url + "/app/chat.js").status_code == 200
    assert httpx.get(keyed.url + "/dashboard").status_code == 200
    assert httpx.get(keyed.url + "/").status_code == 401  # an Ollama client without the key
    assert httpx.get(keyed.url + "/", headers={"Authorization": "Bearer page-key"}).text == "Ollama is running"
    assert httpx.get(keyed.url + "/v1/conversations", headers=BROWSER).status_code == 401
    assert httpx.post(keyed.url + "/app/chat.js").status_code in (401, 405)


def test_the_guard_holds_for_the_page(keyed):
    assert httpx.get(keyed.url + "/", headers={**BROWSER, "Host": "evil.example"}).status_code == 403
    assert httpx.get(keyed.url + "/app/main.js", headers={"Host": "rebound.example:80"}).status_code == 403
    other = httpx.get(keyed.url + "/v1/models", headers={"Origin": "http://evil.example", "x-api-key": "page-key"})
    assert other.status_code == 403
    own = httpx.get(keyed.url + "/v1/models", headers={"Origin": keyed.url, "x-api-key": "page-key"})
    assert own.status_code == 200


def test_the_pages_files_are_not_in_the_views():
    """Like the views' own reads, the page's files never become rows of the
    fold (the page loading would otherwise fill Activity with itself)."""
    from turbospark.views.fold import Fold

    fold = Fold()
    for rid, path in ((1, "/app/main.js"), (2, "/app/vendor/marked.esm.js"), (3, "/v1/models")):
        fold.feed({"kind": "requestStarted", "id": rid, "atMs": 0, "method": "GET", "path": path})
        fold.feed({"kind": "requestFinished", "id": rid, "status": 200, "durationMs": 1})
    assert [r["path"] for r in fold.summary(10)["records"]] == ["/v1/models"]
