"""One typed object per request, under ONE key of the ASGI scope: what the
middleware and the handlers tell each other about it (its id, its reporter,
the leases it holds, its cancel flag, its failover, its tenant, the error its
client got). No HTTP types: it is plain data over the scope's dict."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ..engine.types import CancelFlag
from ..observe import NO_REPORTER, Reporter

if TYPE_CHECKING:
    from .dispatch import Failover

#: the scope key the request's :class:`RequestContext` is stored under
CONTEXT_KEY = "turbospark.request"


#: the error notes of a response whose client left, or read too slowly
DISCONNECTED = "client disconnected"
TOO_SLOW = "client too slow"


@dataclass
class RequestContext:
    #: the id its events carry (``ObserveMiddleware`` mints it)
    id: int | None = None
    #: reports its engine runs once it is routed; the middleware ends the
    #: request only after they are reported
    reporter: Reporter | None = None
    #: releases of the registry leases and wait-list places it holds,
    #: called when its response is complete (``LeaseMiddleware``)
    leases: list[Callable[[], None]] = field(default_factory=list)
    #: id(route) → its lease's release, for routes to a replica (a failover
    #: gives the failed replica back at once)
    replica_leases: dict[int, Callable[[], None]] = field(default_factory=dict)
    #: the generation's cancel flag: a client found too slow cancels it
    cancel: CancelFlag | None = None
    #: how it moves to another replica, when it was routed to one
    failover: Failover | None = None
    #: its API key's tenant (None: no keys are configured) and whether the
    #: key is an admin's
    tenant: str | None = None
    admin: bool = False
    #: the message of the error its client got, for ``requestFinished``
    error: str | None = None
    #: a stored response's id and the one it continues (the Responses API's
    #: state), named by its ``requestRouted`` event
    response_id: str | None = None
    previous_response_id: str | None = None
    #: a stream that never ends by itself (``/v1/events``): its client
    #: closing it is its normal end, not an error
    open_ended: bool = False

    @property
    def reporting(self) -> Reporter:
        return self.reporter if self.reporter is not None else NO_REPORTER

    def note_error(self, message: str) -> None:
        """The first error noted is the one ``requestFinished`` carries."""
        if self.error is None:
            self.error = message

    def hold(self, release: Callable[[], None]) -> None:
        """Release this when the response is complete."""
        self.leases.append(release)

    def release_all(self) -> None:
        leases, self.leases = self.leases, []
        for release in leases:
            release()


def context_of(scope: MutableMapping[str, Any]) -> RequestContext:
    """The request's context, made on first use."""
    ctx = scope.get(CONTEXT_KEY)
    if ctx is None:
        ctx = scope[CONTEXT_KEY] = RequestContext()
    return cast(RequestContext, ctx)
