"""The web page (issue 44): ``GET /`` to a browser (a request that accepts
``text/html``) and ``GET /dashboard`` answer ``static/index.html``, the app
with its Chat, Models and Activity views (``/dashboard`` opens on
Activity); every other client of ``/`` (Ollama's, curl) still gets
``Ollama is running``. Its ES modules and CSS are ``static/app/`` files,
served under ``/app/``. The page carries no data, so it is served without a
key (``auth.page_route``); the data it loads needs one when keys are
configured, which the page asks for and keeps in the tab's sessionStorage.
A Content-Security-Policy lets it load nothing but its own files and this
server's data: no inline script, no other origin."""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from ..access.auth import wants_page
from .ollama import root as ollama_root

#: The page may load nothing but itself and this server's data.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".png": "image/png",
}
#: a file's name under /app/: folders and names of plain characters, no dot first
_NAME = re.compile(r"^(?:[A-Za-z0-9_-][A-Za-z0-9._-]*/)*[A-Za-z0-9_-][A-Za-z0-9._-]*$")


@lru_cache(maxsize=64)
def _etag(name: str) -> str:
    """An existing asset's ETag (a hash of its bytes, once per file)."""
    return '"' + hashlib.sha256(asset(name) or b"").hexdigest()[:20] + '"'


@lru_cache(maxsize=64)
def asset(name: str) -> bytes | None:
    """A file of ``static/`` (None: no such file)."""
    path = resources.files("turbospark").joinpath("static", *name.split("/"))
    return path.read_bytes() if path.is_file() else None


def _page() -> Response:
    body = asset("index.html")
    assert body is not None, "the package lacks static/index.html"
    return HTMLResponse(body, headers={**HEADERS, "Cache-Control": "no-store"})


async def root(request: Request) -> Response:
    if wants_page(request.headers.get("accept", "")):
        return _page()
    return await ollama_root(request)


async def dashboard(request: Request) -> Response:
    return _page()


async def app_file(request: Request) -> Response:
    """A file of ``static/app/``, revalidated on each load (its ETag)."""
    name = request.path_params["name"]
    kind = TYPES.get(name[name.rfind(".") :]) if "." in name else None
    body = asset("app/" + name) if kind is not None and _NAME.match(name) else None
    if body is None:
        return Response("not found", status_code=404, media_type="text/plain", headers=HEADERS)
    etag = _etag("app/" + name)
    headers = {**HEADERS, "ETag": etag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=kind, headers=headers)


routes = [
    Route("/", root, methods=["GET", "HEAD"]),
    Route("/dashboard", dashboard, methods=["GET"]),
    Route("/app/{name:path}", app_file, methods=["GET"]),
]
