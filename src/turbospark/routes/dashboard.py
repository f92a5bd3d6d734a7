"""``GET /dashboard``: one self-contained page (inline CSS and JS, canvas
charts, no CDN) that renders the server's fold (``/v1/stats``) and re-reads
it as ``/v1/events`` reports activity. The page carries no data, so it is
served without a key (see ``auth.OPEN_ROUTES``); the data it loads needs one
when keys are configured: the page takes it from ``#key=...`` (a fragment is
never sent to the server) or asks for it."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

#: The page may load nothing but itself and this server's data.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
)


@lru_cache(maxsize=1)
def page() -> str:
    return resources.files("turbospark").joinpath("static/dashboard.html").read_text("utf-8")


async def dashboard(request: Request) -> Response:
    return HTMLResponse(page(), headers={"Cache-Control": "no-store", "Content-Security-Policy": CSP})


routes = [Route("/dashboard", dashboard, methods=["GET"])]
