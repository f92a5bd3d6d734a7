"""One file over HTTP, done right: resumed from the bytes already on disk
after a cut connection (``Range``), verified (its size and digest as its
source gave them, and a GGUF's header: every tensor within the file) before
it is moved into place (an atomic rename), so a partial or unverified file
is never where a model is loaded from."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ..engine.gguf import NotGGUF, check

CHUNK = 1 << 20
#: attempts at one file (each resumes where the last stopped)
ATTEMPTS = 5


class FetchError(RuntimeError):
    """A download failed (the message says why); ``status`` is what a client gets."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


def plain(exc: BaseException) -> str:
    """What went wrong, as a client is told it: never a path on this machine."""
    if isinstance(exc, OSError):
        name = os.path.basename(str(exc.filename)) if exc.filename else ""
        return f"{exc.strerror or type(exc).__name__}" + (f" ({name})" if name else "")
    return str(exc)


@dataclass(frozen=True)
class Remote:
    """A file to fetch: where from, how big, and its digest (hex sha256)."""

    url: str
    size: int | None = None
    sha256: str | None = None


def sha256_of(path: str, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
            if progress:
                progress(len(block))
    return h.hexdigest()


def verify(path: str, remote: Remote, gguf: bool) -> None:
    """Size, GGUF header and digest, or :class:`FetchError` (the file is deleted)."""
    problem = None
    size = os.path.getsize(path) if os.path.exists(path) else 0
    if remote.size is not None and size != remote.size:
        problem = f"{remote.url}: {size} bytes arrived, the source said {remote.size}"
    elif size == 0:
        problem = f"{remote.url}: nothing arrived"
    elif gguf:
        try:
            check(path)
        except NotGGUF as exc:
            problem = f"{remote.url} is not a usable GGUF file: {exc}"
    if problem is None and remote.sha256 is not None:
        got = sha256_of(path)
        if got != remote.sha256.lower():
            problem = f"{remote.url}: sha256 {got} does not match the source's {remote.sha256}"
    if problem is not None:
        if os.path.exists(path):
            os.unlink(path)
        raise FetchError(problem)


def _one_attempt(
    client: httpx.Client, remote: Remote, partial: str, headers: dict[str, str], progress: Callable[[int], None]
) -> bool:
    """Fetch from the bytes on disk onwards; True when the source sent it all."""
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    if remote.size is not None and have >= remote.size:
        return True
    ask = {**headers, **({"Range": f"bytes={have}-"} if have else {})}
    with client.stream("GET", remote.url, headers=ask, follow_redirects=True) as r:
        if r.status_code == 416 and have:
            return True  # (we already hold it all)
        if r.status_code not in (200, 206):
            r.read()
            raise FetchError(f"{remote.url} answered {r.status_code}", 404 if r.status_code == 404 else 502)
        mode = "ab" if r.status_code == 206 else "wb"  # 200: the source starts over
        if mode == "wb" and have:
            progress(-have)
        with open(partial, mode) as out:
            for block in r.iter_bytes(CHUNK):
                out.write(block)
                out.flush()
                progress(len(block))
    return True


def download(
    client: httpx.Client,
    remote: Remote,
    partial: str,
    target: str,
    progress: Callable[[int], None],
    headers: dict[str, str] | None = None,
    gguf: bool = True,
    verifying: Callable[[], None] | None = None,
    on_disk: Callable[[int], None] | None = None,
) -> None:
    """``remote`` into ``target`` by way of ``partial`` (resumed if it is
    there: ``on_disk`` is told how many bytes an earlier pull left), verified,
    then renamed into place. ``progress`` gets byte counts as they arrive
    (negative when a source ignores the range and restarts)."""
    if remote.size is not None and remote.size <= 0:
        raise FetchError(f"{remote.url}: the source says the file is {remote.size} bytes")
    if on_disk is not None and os.path.exists(partial):
        on_disk(os.path.getsize(partial))
    last: Exception | None = None
    for _ in range(ATTEMPTS):
        try:
            _one_attempt(client, remote, partial, headers or {}, progress)
            break
        except httpx.TransportError as exc:  # cut, reset, timed out: resume
            last = exc
    else:
        raise FetchError(f"{remote.url}: the connection failed {ATTEMPTS} times ({last})")
    if verifying:
        verifying()
    verify(partial, remote, gguf)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(partial, target)
