"""Access control (CONTRACT §5). Pure logic: headers in, a decision out.

Off unless a key is configured. When on, every route except ``GET /health``
needs a key, sent as ``x-api-key: KEY`` or ``Authorization: Bearer KEY``.
Admin routes may be given their own keys; then only those open them, and
an admin key opens every other route too (as a tenant of its own).
Comparison is constant-time over SHA-256 digests, so neither the content nor
the length of a configured key leaks through timing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ADMIN_PREFIX = "/v1/admin/"
OPEN_ROUTES = {("GET", "/health"), ("HEAD", "/health")}
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
    #: the refusal's HTTP status: 401 no valid key, 403 a valid key without
    #: the privilege the route needs
    status: int = 401
    #: the caller holds the admin privilege (an admin key, or no keys at all)
    admin: bool = False


#: Routes where an admin key sees every tenant: what the server holds and
#: did. On every other route it is a tenant of its own, as an inference key.
VIEW_ROUTES = {
    (method, path) for method in ("GET", "HEAD") for path in ("/v1/events", "/v1/stats", "/v1/slots", "/metrics")
}
MISSING_KEY = "invalid or missing API key"
#: llama-server's slot routes: an admin key sees and acts on every tenant's
#: slots there (an inference key, only its own tenant's)
SLOT_PATH = "/slots"
NOT_ADMIN = "this route needs an admin key (--admin-key); an inference key never administers"


#: admin routes outside ``/v1/admin/``: Ollama's model management (the store)
ADMIN_PATHS = frozenset({"/api/pull", "/api/delete", "/api/copy"})


def admin_opens(method: str, path: str) -> bool:
    """The routes besides the admin ones an admin key opens: the views, and
    llama-server's slot routes."""
    if (method, path) in VIEW_ROUTES:
        return True
    return (method in ("GET", "HEAD") and path == SLOT_PATH) or (method == "POST" and path.startswith(SLOT_PATH + "/"))


def page_route(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """The web page and its files (``routes/page.py``): no data, and a
    browser cannot send a key when it navigates; the data the page loads
    needs the key. ``/`` only to a browser (``Accept: text/html``): an
    Ollama client's probe there still needs one."""
    if method not in ("GET", "HEAD"):
        return False
    if path == "/":
        return wants_page(headers.get("accept", ""))
    return path == "/dashboard" or path.startswith("/app/")


def wants_page(accept: str) -> bool:
    """A browser's navigation: it accepts ``text/html`` (curl and the SDKs send ``*/*``)."""
    return "text/html" in accept.lower()


def is_admin_route(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX) or path.rstrip("/") == ADMIN_PREFIX.rstrip("/") or path in ADMIN_PATHS


@dataclass
class Auth:
    api_keys: tuple[str, ...] = ()
    admin_keys: tuple[str, ...] = ()
    #: serve ``GET /metrics`` without a key even when keys are configured
    metrics_open: bool = False
    _digests: tuple[tuple[bytes, str], ...] = field(init=False, repr=False)
    _admin_digests: tuple[tuple[bytes, str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.api_keys = tuple(k for k in self.api_keys if k)
        self.admin_keys = tuple(k for k in self.admin_keys if k)
        self._digests = tuple((_digest(k), tenant_of(k)) for k in self.api_keys)
        self._admin_digests = tuple((_digest(k), tenant_of(k)) for k in self.admin_keys)

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

    @staticmethod
    def _match(given: bytes, digests: tuple[tuple[bytes, str], ...]) -> str:
        """The tenant of the matching digest, or "" (no early exit: constant work)."""
        tenant = ""
        for d, t in digests:
            if hmac.compare_digest(given, d):
                tenant = t
        return tenant

    def check(self, method: str, path: str, headers: Mapping[str, str]) -> Decision:
        """Who may call ``method path`` with these headers (CONTRACT §5):
        with no keys everything is open and the caller administers; admin
        routes need an admin key (403 for a valid inference key, also when
        no admin key is configured); admin keys also read the views (every
        tenant's), and open every other route as a tenant of their own."""
        if not self.enabled:
            return Decision(True, admin=True)
        if (method, path) in OPEN_ROUTES or (self.metrics_open and (method, path) in METRICS_ROUTES):
            return Decision(True)
        if page_route(method, path, headers):
            return Decision(True)
        admin_route = is_admin_route(path)
        key = self.presented_key(headers)
        given = _digest(key) if key is not None else b""
        admin_tenant = self._match(given, self._admin_digests) if key is not None else ""
        if not admin_route and not self._digests:
            # only admin keys configured: the rest stays open (an admin key
            # still reads every tenant's views)
            if admin_tenant and admin_opens(method, path):
                return Decision(True, admin_tenant, admin=True)
            return Decision(True)
        if key is None:
            return Decision(False, reason=MISSING_KEY)
        tenant = self._match(given, self._digests)
        if admin_tenant and (admin_route or admin_opens(method, path)):
            return Decision(True, admin_tenant, admin=True)
        if admin_route:
            if tenant:
                return Decision(False, reason=NOT_ADMIN, status=403)
            return Decision(False, reason=MISSING_KEY)
        if tenant or admin_tenant:
            # an admin key infers too, as its own tenant (as one key does on
            # a single-key server): it sees its own requests, slots and
            # stored responses there, not every tenant's
            return Decision(True, tenant or admin_tenant)
        return Decision(False, reason=MISSING_KEY)


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


class KeyFileError(ValueError):
    pass


def read_key_file(path: str) -> list[str]:
    """API keys from a file, one a line (blank lines and ``#`` comments
    skipped), so they need not sit in the world-readable command line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise KeyFileError(f"the API key file {path} holds no key")
    return keys


def check_bind(host: str, auth: Auth) -> None:
    """The one bind rule, for the CLI and ``Server`` alike: raises
    :class:`OpenBind` for a non-loopback address without an API key."""
    why = refuse_open_bind(host, auth)
    if why:
        raise OpenBind(why)


class OpenBind(ValueError):
    pass


def from_config(
    api_keys: Iterable[str],
    admin_keys: Iterable[str],
    env: Mapping[str, str],
    metrics_auth: bool = True,
    key_files: Iterable[str] = (),
) -> Auth:
    keys = [k for k in api_keys if k]
    for path in key_files:
        keys.extend(read_key_file(path))
    env_key = env.get("TURBOSPARK_API_KEY")
    if env_key:
        keys.append(env_key)
    admin = [k for k in admin_keys if k]
    env_admin = env.get("TURBOSPARK_ADMIN_KEY")
    if env_admin:
        admin.append(env_admin)
    return Auth(tuple(keys), tuple(admin), metrics_open=not metrics_auth)
