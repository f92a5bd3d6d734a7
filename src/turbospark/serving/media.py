"""A request's media made ready before it is prepared: refused where the
model cannot take them, bounded in number (``--max-images``), and those a
request names by an http(s) URL fetched, only where ``--allow-media-urls``
allows their host (a server fetching any URL a request names is a
request-forgery hole, so none is fetched by default).

A fetch never reaches a loopback, private, link-local or otherwise
non-global address (the host's name is resolved here, every address
checked, and the connection made to the checked one, so a second answer of
the DNS cannot slip another address in), except an address the operator
named literally (``--allow-media-urls 127.0.0.1:9000``); it follows at most
:data:`MAX_REDIRECTS` redirects, each to the same host, takes at most
:data:`MAX_FETCH_BYTES` and :data:`FETCH_TIMEOUT` seconds in all, and goes
through no proxy. Every refusal and failure is a 400 naming the field
(``media_urls_off``, ``media_url_refused``, ``media_fetch_failed``): the
client named the URL, and an SDK does not retry a 400."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from ..core.backend import Backend
from ..core.generation import refuse_media
from ..core.media import MediaRefused, top_field, without_media
from ..core.request import ChatRequest, Media

#: the most media items (images and sounds) one request may carry (``--max-images``)
DEFAULT_MAX_IMAGES = 16
MAX_FETCH_BYTES = 20 << 20
FETCH_TIMEOUT = 10.0
MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class AllowedHost:
    """One ``--allow-media-urls`` entry: a host name (``*.example.com``: any
    name under it; ``*``: any host), or an IP address; with a port or any."""

    host: str
    port: int | None = None

    @property
    def literal(self) -> bool:
        """An IP address (fetched from even where it is private or loopback)."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host == "*":
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host


def allowed_hosts(entries: Iterable[str]) -> tuple[AllowedHost, ...]:
    """``--allow-media-urls`` values (each comma-separated): ``host``,
    ``host:port``, ``[v6]:port``; a bad one is a ValueError naming it."""
    out: list[AllowedHost] = []
    for entry in (e.strip() for value in entries for e in value.split(",")):
        if not entry:
            continue
        try:
            url = httpx.URL(f"http://{entry}/")
            host, port = url.host, url.port
        except (httpx.InvalidURL, ValueError):
            host, port = "", None
        if not host or "/" in entry or "@" in entry:
            raise ValueError(f"--allow-media-urls: {entry!r} is not a host or host:port")
        out.append(AllowedHost(host.lower(), port))
    return tuple(out)


@dataclass(frozen=True)
class MediaPolicy:
    """How a server takes media: the hosts it fetches URLs from (none: no
    URL is fetched) and the most items one request may carry."""

    allowed: tuple[AllowedHost, ...] = ()
    max_images: int = DEFAULT_MAX_IMAGES
    max_bytes: int = MAX_FETCH_BYTES
    timeout: float = FETCH_TIMEOUT

    @classmethod
    def of(cls, allow_media_urls: Iterable[str] = (), max_images: int | None = None) -> MediaPolicy:
        limit = DEFAULT_MAX_IMAGES if max_images is None else max_images
        if limit < 0:
            raise ValueError("--max-images must be 0 or more")
        return cls(allowed_hosts(allow_media_urls), limit)

    def entry(self, host: str, port: int) -> AllowedHost | None:
        return next((a for a in self.allowed if a.matches(host, port)), None)


def takes(model: Backend, item: Media) -> bool:
    return model.capabilities.audio if item.kind == "audio" else model.capabilities.vision


async def ready(policy: MediaPolicy, model: Backend, req: ChatRequest) -> None:
    """Refuse media ``model`` cannot take, and more than the policy allows;
    fetch those named by URL (in place: ``req.media`` then holds bytes)."""
    if not req.media:
        return
    refuse_media(model, req)
    if len(req.media) > policy.max_images:
        raise MediaRefused(
            f"this request has {len(req.media)} images or sounds; one request may carry at most "
            f"{policy.max_images} (--max-images)",
            top_field(req.media[0].field),
            "too_many_images",
        )
    pending = [i for i, m in enumerate(req.media) if m.url is not None and not m.data]
    if not pending:
        return
    tasks = [asyncio.ensure_future(fetch(policy, req.media[i])) for i in pending]
    try:
        fetched = await asyncio.gather(*tasks)  # (the first failure is the answer)
    finally:
        for task in tasks:
            task.cancel()
    for i, data in zip(pending, fetched, strict=True):
        req.media[i] = dataclasses.replace(req.media[i], data=data)


async def counted(policy: MediaPolicy, model: Backend, req: ChatRequest) -> ChatRequest:
    """``req`` as a token count takes it on ``model``: the media it cannot
    take left out (a real request would be refused; the count is the
    text's), the others ready."""
    req = without_media(req, lambda m: takes(model, m))
    await ready(policy, model, req)
    return req


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _short(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."


async def fetch(policy: MediaPolicy, item: Media) -> bytes:
    """The bytes at ``item.url`` (see the module's rules)."""
    assert item.url is not None
    where = item.field
    if not policy.allowed:
        raise MediaRefused(
            f"'{where}' names a remote URL ({_short(item.url)}), and this server fetches no media URLs: "
            "send the image inline as a base64 data URL (data:image/png;base64,...), or start the server "
            "with --allow-media-urls HOST[,HOST...] to fetch from those hosts",
            where,
            "media_urls_off",
        )
    try:
        url = httpx.URL(item.url)
    except (httpx.InvalidURL, ValueError):
        raise MediaRefused(f"'{where}' is not a valid URL", where, "media_url_refused") from None
    try:
        async with asyncio.timeout(policy.timeout):
            return await _follow(policy, url, where)
    except TimeoutError:
        raise MediaRefused(
            f"'{where}': fetching {_short(str(url))} took longer than {policy.timeout:g} s", where, "media_fetch_failed"
        ) from None


async def _follow(policy: MediaPolicy, url: httpx.URL, where: str) -> bytes:
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=policy.timeout) as client:
        for _ in range(MAX_REDIRECTS + 1):
            address = await _address(policy, url, where)
            target = url.copy_with(host=address)
            headers = {"Host": url.netloc.decode("ascii"), "Accept": "image/*, audio/*"}
            extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
            try:
                async with client.stream("GET", target, headers=headers, extensions=extensions) as response:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        moved = url.join(response.headers["location"])
                        if moved.host != url.host:
                            raise MediaRefused(
                                f"'{where}': {_short(str(url))} redirects to another host ({moved.host}); "
                                "media are fetched only from the host named",
                                where,
                                "media_url_refused",
                            )
                        url = moved
                        continue
                    return await _body(policy, response, url, where)
            except httpx.HTTPError as exc:
                raise MediaRefused(
                    f"'{where}': could not fetch {_short(str(url))} ({type(exc).__name__})", where, "media_fetch_failed"
                ) from None
    raise MediaRefused(f"'{where}': {_short(str(url))} redirects too many times", where, "media_url_refused")


async def _address(policy: MediaPolicy, url: httpx.URL, where: str) -> str:
    """The address to connect to for ``url``: its host allowed, every
    address it resolves to a public one (or the IP address named)."""
    if url.scheme not in ("http", "https") or not url.host:
        raise MediaRefused(f"'{where}' must be an http(s) URL", where, "media_url_refused")
    host = url.host.lower()
    port = url.port or (443 if url.scheme == "https" else 80)
    entry = policy.entry(host, port)
    if entry is None:
        raise MediaRefused(
            f"'{where}': this server fetches media only from the hosts --allow-media-urls names, "
            f"and not from {host}:{port}",
            where,
            "media_url_refused",
        )
    if entry.literal and entry.host == host:  # the operator named this address
        return host
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise MediaRefused(f"'{where}': the host {host} does not resolve", where, "media_fetch_failed") from None
        addresses = [str(info[4][0]) for info in infos]
    private = next((a for a in addresses if not _public(a)), None)
    if private is not None or not addresses:
        raise MediaRefused(
            f"'{where}': {host} is (or resolves to) a loopback, private or link-local address ({private}); "
            "media are never fetched from one unless --allow-media-urls names that address itself",
            where,
            "media_url_refused",
        )
    return addresses[0]


async def _body(policy: MediaPolicy, response: httpx.Response, url: httpx.URL, where: str) -> bytes:
    if response.status_code != 200:
        raise MediaRefused(
            f"'{where}': {_short(str(url))} answered HTTP {response.status_code}", where, "media_fetch_failed"
        )
    too_big = MediaRefused(
        f"'{where}': {_short(str(url))} is larger than {policy.max_bytes:,} bytes, the most fetched",
        where,
        "media_too_large",
    )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise too_big
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > policy.max_bytes:
            raise too_big
    return bytes(body)
