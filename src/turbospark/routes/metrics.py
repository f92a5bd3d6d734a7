"""``GET /metrics``: the Prometheus text exposition of the server's
:class:`~turbospark.sinks.prometheus.PrometheusSink`.

Behind the API key like every route, unless the server was started with
``--metrics-auth off`` (see :mod:`turbospark.access.auth`)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .common import state_of


async def metrics(request: Request) -> Response:
    body, content_type = state_of(request).metrics.exposition()
    return Response(body, headers={"content-type": content_type})


routes = [Route("/metrics", metrics, methods=["GET"])]
