"""Browser safety (CONTRACT §5): which ``Host`` and ``Origin`` a request
may carry, what a CORS answer allows (the request headers it allows come
from the dialects: ``dialects.base.cors_headers``), and how large a body may
be. Pure policy, no HTTP types: ``middleware.GuardMiddleware`` applies it.

Why: a server on 127.0.0.1 without a key is reachable from every web page its
user opens. A page can send a "simple" cross-origin POST without a preflight
(refused here by its ``Origin``), and a page on a domain re-pointed at
127.0.0.1 (DNS rebinding) sends its own name as ``Host`` (refused here unless
the name is loopback, the bound address or allowed). Clients that are not
browsers (SDKs, CLIs, curl) send no ``Origin`` and a loopback or IP ``Host``,
and are unaffected.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT_MAX_BODY = 32 * 1024 * 1024
CORS_METHODS = "GET, POST, DELETE, OPTIONS, HEAD"
CORS_EXPOSE = "x-request-id, retry-after, x-turbospark-warning"
CORS_MAX_AGE = "600"
WILDCARD_BINDS = ("0.0.0.0", "::", "")


def split_host(value: str) -> str:
    """``Host`` header → the host name or address, lower case, no port."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8080
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_loopback_name(host: str) -> bool:
    """localhost, ``*.localhost`` (RFC 6761: browsers resolve these to
    loopback themselves) or a loopback address."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


@dataclass
class BrowserPolicy:
    """The server's rules for ``Host``, ``Origin`` and body size."""

    #: the address the server listens on
    bound_host: str = "127.0.0.1"
    #: more ``Host`` names to accept (``*``: any)
    allowed_hosts: tuple[str, ...] = ()
    #: origins whose pages may call the API (``*``: any); the server's own
    #: origin is always allowed
    cors_origins: tuple[str, ...] = ()
    max_body: int = DEFAULT_MAX_BODY
    _hosts: frozenset[str] = field(init=False, repr=False)
    _origins: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.allowed_hosts = tuple(h.strip().lower() for h in self.allowed_hosts if h.strip())
        self.cors_origins = tuple(o.strip().rstrip("/").lower() for o in self.cors_origins if o.strip())
        hosts = {split_host(h) if h != "*" else "*" for h in self.allowed_hosts}
        bound = split_host(self.bound_host) if self.bound_host else ""
        if bound:
            hosts.add(bound)
        if bound in WILDCARD_BINDS:
            # listening everywhere: the machine's own names are its addresses
            name = socket.gethostname().lower()
            hosts.update({name, socket.getfqdn().lower()})
        self._hosts = frozenset(hosts)
        self._origins = frozenset(self.cors_origins)
        if self.max_body < 1:
            raise ValueError("the body limit must be at least 1 byte")

    @property
    def wildcard_bind(self) -> bool:
        return split_host(self.bound_host) in WILDCARD_BINDS

    def host_allowed(self, host_header: str | None) -> bool:
        """A rebinding attack names its own domain: a loopback name, an
        address literal we may be reached at, or a configured name passes."""
        if host_header is None:
            return True  # HTTP/1.0 without Host: not a browser
        host = split_host(host_header)
        if "*" in self._hosts or host in self._hosts or is_loopback_name(host):
            return True
        # any address literal when listening on every interface (a page
        # cannot rebind an address, only a name)
        return self.wildcard_bind and _ip(host) is not None

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        """``origin`` may call the API: configured, ``*``, or this server's
        own (a page it served, such as the dashboard)."""
        origin = origin.strip().rstrip("/").lower()
        if "*" in self._origins or origin in self._origins:
            return True
        if host_header and origin in (
            f"http://{host_header.strip().lower()}",
            f"https://{host_header.strip().lower()}",
        ):
            return True
        return False


def policy_from(
    bound_host: str,
    allowed_hosts: Iterable[str] = (),
    cors_origins: Iterable[str] = (),
    max_body: int | None = None,
) -> BrowserPolicy:
    return BrowserPolicy(
        bound_host, tuple(allowed_hosts), tuple(cors_origins), max_body if max_body else DEFAULT_MAX_BODY
    )
