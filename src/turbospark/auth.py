"""Access control (REFERENCE.md §5). Pure logic: headers in, a decision out.

Off unless a key is configured. When on, every route except ``GET /health``
needs a key, sent as ``x-api-key: KEY`` or ``Authorization: Bearer KEY``.
Admin routes may be given their own keys; then only those open them.
Comparison is constant-time over SHA-256 digests, so neither the content nor
the length of a configured key leaks through timing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Mapping

ADMIN_PREFIX = "/v1/admin/"
#: Where the auth middleware puts the caller's tenant in the ASGI scope state.
TENANT_KEY = "turbospark_tenant"
#: ``/dashboard`` is a page without data (a browser cannot send a key when
#: it navigates); the data it loads (/v1/stats, /v1/events) needs the key.
OPEN_ROUTES = {("GET", "/health"), ("HEAD", "/health"), ("GET", "/dashboard")}
#: Opened by ``--metrics-auth off``: Prometheus scrapers usually hold no key.
METRICS_ROUTES = {("GET", "/metrics"), ("HEAD", "/metrics")}


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def tenant_of(key: str) -> str:
    """The tenant a key belongs to, as stored in slots (never the key)."""
    return hashlib.sha256(b"turbospark-tenant:" + key.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Decision:
    allowed: bool
    tenant: str = ""
    reason: str = ""


@dataclass
class Auth:
    api_keys: tuple[str, ...] = ()
    admin_keys: tuple[str, ...] = ()
    #: serve ``GET /metrics`` without a key even when keys are configured
    metrics_open: bool = False
    _digests: tuple[tuple[bytes, str], ...] = field(init=False, repr=False)
    _admin_digests: tuple[bytes, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.api_keys = tuple(k for k in self.api_keys if k)
        self.admin_keys = tuple(k for k in self.admin_keys if k)
        self._digests = tuple((_digest(k), tenant_of(k)) for k in self.api_keys)
        self._admin_digests = tuple(_digest(k) for k in self.admin_keys)

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.admin_keys)

    @staticmethod
    def presented_key(headers: Mapping[str, str]) -> str | None:
        key = headers.get("x-api-key")
        if key:
            return key.strip()
        authz = headers.get("authorization", "")
        scheme, _, value = authz.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None

    def check(self, method: str, path: str, headers: Mapping[str, str]) -> Decision:
        if not self.enabled or (method, path) in OPEN_ROUTES:
            return Decision(True)
        if self.metrics_open and (method, path) in METRICS_ROUTES:
            return Decision(True)
        is_admin = path.startswith(ADMIN_PREFIX) and bool(self._admin_digests)
        if not is_admin and not self._digests:
            return Decision(True)
        key = self.presented_key(headers)
        if key is None:
            return Decision(False, reason="invalid or missing API key")
        given = _digest(key)
        if is_admin:
            ok = False
            for d in self._admin_digests:  # no early exit: constant work
                ok |= hmac.compare_digest(given, d)
            return Decision(ok, tenant_of(key) if ok else "", "" if ok else "invalid or missing API key")
        tenant = ""
        for d, t in self._digests:
            if hmac.compare_digest(given, d):
                tenant = t
        if tenant:
            return Decision(True, tenant)
        return Decision(False, reason="invalid or missing API key")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_open_bind(host: str, auth: Auth) -> str | None:
    """Why serving on ``host`` without a key is refused, or None if fine."""
    if auth.api_keys or is_loopback(host):
        return None
    return (
        f"refusing to listen on {host} without an API key: anyone who can reach this "
        "address could use the models. Pass --api-key KEY (or set TURBOSPARK_API_KEY), "
        "or listen on 127.0.0.1."
    )


def from_config(
    api_keys: Iterable[str], admin_keys: Iterable[str], env: Mapping[str, str], metrics_auth: bool = True
) -> Auth:
    keys = [k for k in api_keys if k]
    env_key = env.get("TURBOSPARK_API_KEY")
    if env_key:
        keys.append(env_key)
    admin = [k for k in admin_keys if k]
    env_admin = env.get("TURBOSPARK_ADMIN_KEY")
    if env_admin:
        admin.append(env_admin)
    return Auth(tuple(keys), tuple(admin), metrics_open=not metrics_auth)
