"""``GET /metrics``: the Prometheus text exposition of the server's
:class:`~turbospark.sinks.prometheus.PrometheusSink` (turbospark's series,
then llama-server's ``llamacpp:*``).

Behind the API key like every route, unless the server was started with
``--metrics-auth off`` (see :mod:`turbospark.access.auth`)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .common import state_of


async def metrics(request: Request) -> Response:
    st = state_of(request)
    body, content_type = st.metrics.exposition()
    # (llama-server's header: when the counters started)
    return Response(body, headers={"content-type": content_type, "process-start-time-unix": str(int(st.started_at))})


routes = [Route("/metrics", metrics, methods=["GET"])]
