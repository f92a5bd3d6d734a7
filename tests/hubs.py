"""Fake model hubs on loopback for the model-pull tests.

``FakeHub`` is a Hugging Face Hub that the real ``huggingface_hub`` library
accepts (``endpoint=hub.url`` or ``HF_ENDPOINT``); ``FakeRegistry`` is an
Ollama registry (the Docker-distribution API that ``ollama pull`` reads).
Both are ``http.server`` servers on 127.0.0.1 (an ephemeral port), HTTP/1.1
with keep-alive, run in a daemon thread: nothing here reaches the network.

Both answer directly where the real services redirect to a CDN (the hub's
``/resolve`` for LFS files, the registry's blobs), serve byte ranges
(``Range: bytes=N-`` is answered 206 with ``Content-Range``), stream files
from disk in chunks, count what they serve, and take fault hooks:
``cut_after`` (the next GET sends that many body bytes, then the connection
is closed), ``lie_size`` (the listings advertise a size that is not the
content's), ``wrong_sha`` / ``wrong_digest`` (a sha256 that is not the
content's) and ``hold`` (GETs wait until released: a slow file, for races);
the hub also plays a mirror (``as_mirror``: a listing without sizes or
digests, a download without ``X-Linked-*``) serving part of a file as if it
were all (``truncate``). The hub advertises no Xet headers, so
huggingface_hub downloads over plain HTTP.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import socket
import socketserver
import struct
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 1 << 20  # bytes per write when streaming a body

Content = bytes | bytearray | str | os.PathLike[str]

# -- hashing -----------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 hex digest of a file's content (cached while it is unchanged)."""
    p = Path(path).resolve()
    st = p.stat()
    return _sha256_of(str(p), st.st_size, st.st_mtime_ns)


def _git_blob_oid(blob: Blob) -> str:
    """The git object id (sha1 of ``blob <size>\\0<content>``) of a content."""
    digest = hashlib.sha1(b"blob %d\0" % blob.size)
    for chunk in blob.chunks(0, blob.size):
        digest.update(chunk)
    return digest.hexdigest()


def _wrong(hexdigest: str) -> str:
    """A sha256 hex digest that is not ``hexdigest`` (deterministic)."""
    return hashlib.sha256(b"wrong:" + hexdigest.encode()).hexdigest()


# -- content and byte ranges -------------------------------------------------


@dataclass(frozen=True)
class Blob:
    """A content to serve: bytes held in memory, or a file streamed from disk."""

    size: int
    sha256: str
    data: bytes | None = None
    path: Path | None = None

    @classmethod
    def of(cls, content: Content) -> Blob:
        if isinstance(content, bytes | bytearray):
            data = bytes(content)
            return cls(size=len(data), sha256=hashlib.sha256(data).hexdigest(), data=data)
        path = Path(content).resolve()
        return cls(size=path.stat().st_size, sha256=file_sha256(path), path=path)

    def chunks(self, start: int, stop: int) -> Iterator[bytes | memoryview]:
        """The bytes ``[start, stop)``, in chunks of at most ``CHUNK``."""
        if self.data is not None:
            view = memoryview(self.data)
            for pos in range(start, stop, CHUNK):
                yield view[pos : min(pos + CHUNK, stop)]
            return
        assert self.path is not None
        with open(self.path, "rb") as f:
            f.seek(start)
            pos = start
            while pos < stop and (chunk := f.read(min(CHUNK, stop - pos))):
                pos += len(chunk)
                yield chunk


_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", re.IGNORECASE)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, stop)`` for a single-range ``Range`` header, None to send it all.

    Raises ValueError when the range cannot be satisfied (answered 416).
    Several ranges, or a header that does not parse, are ignored (a server
    may always answer 200 with the whole content)."""
    match = _RANGE.fullmatch(header) if header else None
    if match is None or not (match[1] or match[2]):
        return None
    if not match[1]:  # bytes=-N: the last N bytes
        suffix = int(match[2])
        if suffix == 0 or size == 0:
            raise ValueError(header)
        return max(size - suffix, 0), size
    start = int(match[1])
    stop = min(int(match[2]) + 1, size) if match[2] else size
    if start >= size or stop <= start:
        raise ValueError(header)
    return start, stop


# -- counters and fault hooks ------------------------------------------------


@dataclass(frozen=True)
class _Cut:
    nbytes: int
    reset: bool


@dataclass
class Hold:
    """A blob's GETs held back (``FakeRegistry.hold``)."""

    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


@dataclass
class _Stats:
    """What a server was asked for and sent, keyed by whatever names a content."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    gets: Counter[Hashable] = field(default_factory=Counter)
    sent: Counter[Hashable] = field(default_factory=Counter)
    cuts: dict[Hashable, _Cut] = field(default_factory=dict)

    def request(self, method: str, path: str, range_header: str | None) -> None:
        with self.lock:
            self.requests.append((method, path, range_header))

    def count_get(self, key: Hashable) -> None:
        with self.lock:
            self.gets[key] += 1

    def add_sent(self, key: Hashable, nbytes: int) -> None:
        with self.lock:
            self.sent[key] += nbytes

    def arm_cut(self, key: Hashable, nbytes: int, reset: bool) -> None:
        with self.lock:
            self.cuts[key] = _Cut(nbytes, reset)

    def take_cut(self, key: Hashable) -> _Cut | None:
        with self.lock:
            return self.cuts.pop(key, None)


# -- HTTP plumbing -------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """Hands every request to the fake's ``_route``; helpers to answer it."""

    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive connection is dropped after this
    server: _Server
    body = b""
    _headers_done = False

    def setup(self) -> None:
        super().setup()
        self.server.app._track(self.connection, True)

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().finish()
        self.server.app._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the fakes are quiet; ``requests`` records what was asked

    def _dispatch(self) -> None:
        app = self.server.app
        app._stats.request(self.command, self.path, self.headers.get("Range"))
        self._headers_done = False
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        try:
            app._route(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away mid-answer
        except Exception:
            traceback.print_exc(file=sys.stderr)
            if self._headers_done:
                self.close_connection = True
            else:
                self.send_json(500, {"error": "fake server error (see stderr)"})

    do_GET = do_HEAD = do_POST = _dispatch

    def end_headers(self) -> None:
        self._headers_done = True
        super().end_headers()

    def send_head(self, status: int, headers: dict[str, str]) -> None:
        """Status and headers (which must include Content-Length)."""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def send_body(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        """A whole answer; HEAD gets the same headers and no body."""
        all_headers = {**(headers or {}), "Content-Type": content_type, "Content-Length": str(len(body))}
        self.send_head(status, all_headers)
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self.send_body(status, json.dumps(obj).encode(), "application/json; charset=utf-8", headers)

    def send_blob(self, blob: Blob, key: Hashable, headers: dict[str, str]) -> None:
        """A content or the range of it asked for, counted under ``key``;
        a cut armed for ``key`` is spent by this GET."""
        stats = self.server.app._stats
        if self.command == "GET":
            stats.count_get(key)
        try:
            span = parse_range(self.headers.get("Range"), blob.size)
        except ValueError:
            self.send_json(416, {"error": "Requested Range Not Satisfiable"}, {"Content-Range": f"bytes */{blob.size}"})
            return
        start, stop = span or (0, blob.size)
        head = {**headers, "Accept-Ranges": "bytes", "Content-Length": str(stop - start)}
        if span is not None:
            head["Content-Range"] = f"bytes {start}-{stop - 1}/{blob.size}"
        self.send_head(206 if span else 200, head)
        if self.command != "GET":
            return
        cut = stats.take_cut(key)
        end = stop if cut is None else min(stop, start + cut.nbytes)
        for chunk in blob.chunks(start, end):
            self.wfile.write(chunk)
            stats.add_sent(key, len(chunk))
        if cut is not None:
            self._abort(cut.reset)

    def _abort(self, reset: bool) -> None:
        """Close the connection now, mid-body: a FIN, or a RST if ``reset``."""
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        # else: socketserver shuts the socket down (FIN) once this returns


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() closes the kept-alive connections itself

    def __init__(self, app: _FakeServer) -> None:
        self.app = app
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks for the host's FQDN (a DNS lookup): skip it
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class _FakeServer:
    """Start/stop, context manager, ``url`` and ``requests`` for both fakes."""

    def __init__(self) -> None:
        self.url = ""  # http://127.0.0.1:PORT once started
        self.port = 0
        self._lock = threading.RLock()  # the fake's content and fault state
        self._stats = _Stats()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    def start(self) -> Self:
        if self._server is None:
            self._server = _Server(self)
            self.port = self._server.server_address[1]
            self.url = f"http://127.0.0.1:{self.port}"
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"{type(self).__name__}:{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:  # wake the handlers waiting on a kept-alive connection
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """Every request so far: (method, raw path with query, Range header or None)."""
        with self._stats.lock:
            return list(self._stats.requests)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _route(self, h: _Handler) -> None:
        raise NotImplementedError


# -- the Hugging Face Hub -----------------------------------------------------

_DATE = "2024-01-01T00:00:00.000Z"
# what the real hub keeps in git rather than LFS (when under 10 MiB)
_GIT_SUFFIXES = (".json", ".md", ".txt", ".jinja", ".py", ".yaml", ".yml", ".gitattributes", ".csv")
_REPO = r"(?P<repo>[^/]+/[^/]+)"
_RESOLVE = re.compile(rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)")
_INFO = re.compile(rf"/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?")
_TREE = re.compile(rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?")
_PATHS = re.compile(rf"/api/models/{_REPO}/paths-info/(?P<rev>[^/]+)")


@dataclass
class _HubFile:
    blob: Blob
    lfs: bool
    git_oid: str = ""  # of the content, for a file kept in git
    size_lie: int | None = None
    sha_lie: str | None = None
    unlisted: bool = False  # the listing gives no size and no sha256 (a mirror's)
    unlinked: bool = False  # the download carries no X-Linked-Size / X-Linked-Etag
    served: Blob | None = None  # what HEAD and GET serve instead of the content (a truncated file)

    @property
    def size(self) -> int:
        """The size advertised."""
        return self.blob.size if self.size_lie is None else self.size_lie

    @property
    def sha256(self) -> str:
        """The sha256 advertised."""
        return self.sha_lie or self.blob.sha256

    def pointer(self) -> bytes:
        """The git-lfs pointer file that git holds in place of the content."""
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def oid(self) -> str:
        """The git blob id: of the LFS pointer, or of the content."""
        if not self.lfs:
            return self.git_oid
        pointer = self.pointer()
        return hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()

    def tree_entry(self, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.oid, "size": self.size, "path": path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(self.pointer())}
        return entry

    def sibling(self, path: str, blobs: bool) -> dict[str, Any]:
        if not blobs or self.unlisted:
            return {"rfilename": path}
        sib: dict[str, Any] = {"rfilename": path, "blobId": self.oid, "size": self.size}
        if self.lfs:
            sib["lfs"] = {"sha256": self.sha256, "size": self.size, "pointerSize": len(self.pointer())}
        return sib


def _folder_entry(path: str) -> dict[str, Any]:
    return {"type": "directory", "oid": hashlib.sha1(f"tree:{path}".encode()).hexdigest(), "size": 0, "path": path}


def _tree(files: dict[str, _HubFile], base: str, recursive: bool) -> list[dict[str, Any]] | None:
    """The tree listing under ``base`` (folders first), None if nothing is there."""
    base = base.strip("/")
    prefix = f"{base}/" if base else ""
    folders: set[str] = set()
    entries = []
    for name in sorted(files):
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split("/")
        folders.update(prefix + "/".join(parts[:i]) for i in range(1, len(parts) if recursive else min(2, len(parts))))
        if recursive or len(parts) == 1:
            entries.append(files[name].tree_entry(name))
    if base and not entries and not folders:
        return None
    return [_folder_entry(f) for f in sorted(folders)] + entries


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, [""])[-1].lower() in ("1", "true")


class FakeHub(_FakeServer):
    """A Hugging Face Hub for model repos ``org/name``, each at one fixed commit.

    Serves ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``, ``/api/models/{repo}``
    (``/revision/{rev}``), ``/api/models/{repo}/tree/{rev}[/{path}]`` and
    ``POST /api/models/{repo}/paths-info/{rev}``; ``rev`` is ``main`` or the
    repo's commit. Files are LFS files (``X-Linked-Etag`` = the quoted sha256)
    unless small text kept in git (see ``add_file``)."""

    def __init__(self) -> None:
        super().__init__()
        self._repos: dict[str, dict[str, _HubFile]] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._holds: dict[tuple[str, str], Hold] = {}

    # -- content

    def add_file(self, repo_id: str, filename: str, data: Content, *, lfs: bool | None = None) -> str:
        """Add (or replace) a file: bytes, or a path streamed from disk. It is an
        LFS file unless ``lfs=False``, or, by default, a text file (.json, .md,
        ...) under 10 MiB. Returns the content's sha256."""
        if len(repo_id.split("/")) != 2 or not all(repo_id.split("/")):
            raise ValueError(f"repo ids are 'org/name', not {repo_id!r}")
        blob = Blob.of(data)
        if lfs is None:
            lfs = blob.size >= 10 << 20 or not filename.endswith(_GIT_SUFFIXES)
        entry = _HubFile(blob, lfs, "" if lfs else _git_blob_oid(blob))
        with self._lock:
            self._repos.setdefault(repo_id, {})[filename] = entry
        return blob.sha256

    def set_info(self, repo_id: str, **fields: Any) -> None:
        """Extra fields for the repo's ``model_info`` JSON (``gguf``, ``cardData``...)."""
        with self._lock:
            self._info.setdefault(repo_id, {}).update(fields)

    def env(self) -> dict[str, str]:
        """Environment for a process that uses huggingface_hub against this hub.

        huggingface_hub reads these when it is imported. Without them it sends,
        once per process, ``GET {HF_ENDPOINT}/api/agent-harnesses`` (a best-effort
        probe for its User-Agent; it ignores ``endpoint=``, so it goes to
        huggingface.co unless HF_ENDPOINT is set): HF_HUB_DISABLE_TELEMETRY
        turns it off, and this hub answers it if it comes here."""
        return {"HF_ENDPOINT": self.url, "HF_HUB_DISABLE_TELEMETRY": "1"}

    @staticmethod
    def commit(repo_id: str) -> str:
        """The repo's commit sha (fixed: derived from its id)."""
        return hashlib.sha1(f"fake-hub-commit:{repo_id}".encode()).hexdigest()

    # -- fault hooks

    def cut_after(self, repo_id: str, filename: str, nbytes: int, *, reset: bool = False) -> None:
        """The next GET of the file sends ``nbytes`` of its body, then closes the
        connection: an orderly close (the client sees the body end early) or,
        with ``reset``, a TCP reset (the client may see fewer bytes)."""
        self._file(repo_id, filename)
        self._stats.arm_cut((repo_id, filename), nbytes, reset)

    def as_mirror(self, repo_id: str, filename: str, *, linked: bool = True) -> None:
        """The listing gives the file no size and no sha256 (as a mirror set
        with ``HF_ENDPOINT`` may); with ``linked=False`` its download carries
        no ``X-Linked-Size`` / ``X-Linked-Etag`` either."""
        with self._lock:
            entry = self._file(repo_id, filename)
            entry.unlisted, entry.unlinked = True, not linked

    def truncate(self, repo_id: str, filename: str, nbytes: int) -> None:
        """HEAD and GET serve only the first ``nbytes`` of the file, as if that
        were all of it (a mirror holding half a file); the listing and the
        ``X-Linked-*`` headers still advertise the whole."""
        with self._lock:
            entry = self._file(repo_id, filename)
            blob = entry.blob
            if blob.data is not None:
                entry.served = Blob.of(blob.data[:nbytes])
            else:
                assert blob.path is not None
                with open(blob.path, "rb") as f:
                    entry.served = Blob.of(f.read(nbytes))

    def hold(self, repo_id: str, filename: str) -> Hold:
        """GETs of the file wait (at most a minute) until ``release()``;
        ``arrived`` is set when the first one waits."""
        self._file(repo_id, filename)
        hold = Hold()
        with self._lock:
            self._holds[(repo_id, filename)] = hold
        return hold

    def lie_size(self, repo_id: str, filename: str, size: int) -> None:
        """The listings and the HEAD metadata advertise ``size``; GET serves the
        real content."""
        with self._lock:
            self._file(repo_id, filename).size_lie = size

    def wrong_sha(self, repo_id: str, filename: str) -> str:
        """The listings and the ETags advertise a sha256 that is not the content's
        (the content is served unchanged). Returns the advertised sha256."""
        with self._lock:
            entry = self._file(repo_id, filename)
            if not entry.lfs:
                raise ValueError(f"{filename} is kept in git: it has no sha256 to lie about")
            entry.sha_lie = _wrong(entry.blob.sha256)
            return entry.sha_lie

    # -- counters

    def bytes_sent(self, repo_id: str, filename: str) -> int:
        """Body bytes written for GETs of the file, over all requests."""
        with self._stats.lock:
            return self._stats.sent[(repo_id, filename)]

    def gets(self, repo_id: str, filename: str) -> int:
        """GET requests for the file."""
        with self._stats.lock:
            return self._stats.gets[(repo_id, filename)]

    def _file(self, repo_id: str, filename: str) -> _HubFile:
        with self._lock:
            try:
                return self._repos[repo_id][filename]
            except KeyError:
                raise KeyError(f"no file {filename!r} in {repo_id!r}") from None

    # -- serving

    def _route(self, h: _Handler) -> None:
        url = urlsplit(h.path)
        query = parse_qs(url.query)
        get = h.command in ("GET", "HEAD")
        if get and (m := _TREE.fullmatch(url.path)):
            self._serve_tree(h, unquote(m["repo"]), unquote(m["rev"]), unquote(m["path"] or ""), query)
        elif h.command == "POST" and (m := _PATHS.fullmatch(url.path)):
            self._serve_paths_info(h, unquote(m["repo"]), unquote(m["rev"]))
        elif get and (m := _INFO.fullmatch(url.path)):
            self._serve_info(h, unquote(m["repo"]), unquote(m["rev"] or "main"), _flag(query, "blobs"))
        elif get and (m := _RESOLVE.fullmatch(url.path)):
            self._serve_file(h, unquote(m["repo"]), unquote(m["rev"]), unquote(m["path"]))
        elif get and url.path == "/api/agent-harnesses":  # huggingface_hub's user-agent probe
            h.send_json(200, {"standardEnvVars": [], "harnesses": {}})
        else:
            h.send_json(404, {"error": "Not Found"})

    def _files(self, h: _Handler, repo_id: str, rev: str) -> dict[str, _HubFile] | None:
        """The repo's files, or None once a 404 (RepoNotFound, RevisionNotFound) is sent."""
        with self._lock:
            files = dict(self._repos[repo_id]) if repo_id in self._repos else None
        if files is None:
            message = "Repository not found"
            h.send_json(404, {"error": message}, {"X-Error-Code": "RepoNotFound", "X-Error-Message": message})
            return None
        if rev not in ("main", self.commit(repo_id)):
            message = f"Invalid rev id: {rev}"
            h.send_json(404, {"error": message}, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": message})
            return None
        return files

    def _serve_file(self, h: _Handler, repo_id: str, rev: str, path: str) -> None:
        files = self._files(h, repo_id, rev)
        if files is None:
            return
        entry = files.get(path)
        commit = self.commit(repo_id)
        if entry is None:
            message = "Entry not found"
            headers = {"X-Error-Code": "EntryNotFound", "X-Error-Message": message, "X-Repo-Commit": commit}
            h.send_json(404, {"error": message}, headers)
            return
        name = path.rsplit("/", 1)[-1]
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f"inline; filename*=UTF-8''{name}; filename=\"{name}\";",
            "X-Repo-Commit": commit,
            "ETag": f'"{entry.sha256 if entry.lfs else entry.oid}"',
        }
        if entry.lfs and not entry.unlinked:
            headers |= {"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)}
        served = entry.served or entry.blob
        if h.command == "HEAD":  # the metadata call: the advertised size, no body
            size = entry.size if entry.served is None else served.size
            h.send_head(200, {**headers, "Accept-Ranges": "bytes", "Content-Length": str(size)})
            return
        with self._lock:
            hold = self._holds.get((repo_id, path))
        if hold is not None:
            hold.arrived.set()
            hold.released.wait(60)
        h.send_blob(served, (repo_id, path), headers)

    def _serve_info(self, h: _Handler, repo_id: str, rev: str, blobs: bool) -> None:
        files = self._files(h, repo_id, rev)
        if files is None:
            return
        commit = self.commit(repo_id)
        info: dict[str, Any] = {
            "_id": commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit,
            "lastModified": _DATE,
            "createdAt": _DATE,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["gguf"] if any(name.endswith(".gguf") for name in files) else [],
            "siblings": [files[name].sibling(name, blobs) for name in sorted(files)],
            "usedStorage": sum(f.size for f in files.values()),
        }
        with self._lock:
            info.update(self._info.get(repo_id, {}))
        h.send_json(200, info)

    def _serve_tree(self, h: _Handler, repo_id: str, rev: str, path: str, query: dict[str, list[str]]) -> None:
        files = self._files(h, repo_id, rev)
        if files is None:
            return
        listing = _tree(files, path, _flag(query, "recursive"))
        if listing is None:
            message = f"Entry not found: {path}"
            h.send_json(404, {"error": message}, {"X-Error-Code": "EntryNotFound", "X-Error-Message": message})
            return
        h.send_json(200, listing)

    def _serve_paths_info(self, h: _Handler, repo_id: str, rev: str) -> None:
        files = self._files(h, repo_id, rev)
        if files is None:
            return
        found = []
        for path in parse_qs(h.body.decode()).get("paths", []):
            path = path.strip("/")
            if path in files:
                found.append(files[path].tree_entry(path))
            elif any(name.startswith(f"{path}/") for name in files):
                found.append(_folder_entry(path))
        h.send_json(200, found)


# -- the Ollama registry -------------------------------------------------------

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_MODEL = "application/vnd.ollama.image.model"
LAYER_PROJECTOR = "application/vnd.ollama.image.projector"
LAYER_TEMPLATE = "application/vnd.ollama.image.template"
LAYER_SYSTEM = "application/vnd.ollama.image.system"
LAYER_PARAMS = "application/vnd.ollama.image.params"
LAYER_LICENSE = "application/vnd.ollama.image.license"

_V2_MANIFEST = re.compile(r"/v2/(?P<repo>.+)/manifests/(?P<ref>[^/]+)")
_V2_BLOB = re.compile(r"/v2/(?P<repo>.+)/blobs/(?P<digest>[^/]+)")


def _registry_error(h: _Handler, status: int, code: str, message: str, detail: Any = None) -> None:
    """An OCI distribution error: ``{"errors": [{"code", "message", "detail"}]}``."""
    error: dict[str, Any] = {"code": code, "message": message}
    if detail is not None:
        error["detail"] = detail
    h.send_json(status, {"errors": [error]})


@dataclass
class _OllamaModel:
    layers: list[dict[str, Any]]  # as built; the model layer first
    config: dict[str, Any]  # the config blob's JSON, less its rootfs
    digest_lie: str | None = None
    size_lie: int | None = None
    manifest: bytes = b""


class FakeRegistry(_FakeServer):
    """An Ollama registry: ``GET/HEAD /v2/{namespace}/{name}/manifests/{tag}`` and
    ``GET/HEAD /v2/{namespace}/{name}/blobs/sha256:<hex>``. Counters and cuts
    are keyed by the digest in the blob's URL."""

    def __init__(self) -> None:
        super().__init__()
        self._blobs: dict[str, Blob] = {}
        self._models: dict[tuple[str, str, str], _OllamaModel] = {}
        self._head_sizes: dict[str, int] = {}  # digest -> size HEAD advertises (lie_size)
        self._holds: dict[str, Hold] = {}

    # -- content

    def add_model(
        self,
        name: str,
        tag: str,
        gguf: Content,
        template: str | None = None,
        params: dict[str, Any] | None = None,
        system: str | None = None,
        namespace: str = "library",
        *,
        license: str | None = None,
        family: str = "llama",
        file_type: str = "Q4_K_M",
        model_type: str = "135M",
        projector: Content | None = None,
    ) -> dict[str, Any]:
        """Publish ``namespace/name:tag``: the GGUF (a path streamed from disk, or
        bytes) as the model layer, then the projector (a multimodal model's
        mmproj GGUF), template, system, params (JSON) and license layers that
        are given. Returns the manifest."""
        layers = [self._add_blob(LAYER_MODEL, Blob.of(gguf))]
        if projector is not None:
            layers.append(self._add_blob(LAYER_PROJECTOR, Blob.of(projector)))
        texts = [(LAYER_TEMPLATE, template), (LAYER_SYSTEM, system), (LAYER_LICENSE, license)]
        layers += [self._add_blob(kind, Blob.of(text.encode())) for kind, text in texts if text is not None]
        if params is not None:
            layers.append(self._add_blob(LAYER_PARAMS, Blob.of(json.dumps(params).encode())))
        config = {
            "model_format": "gguf",
            "model_family": family,
            "model_families": [family],
            "model_type": model_type,
            "file_type": file_type,
            "architecture": "amd64",
            "os": "linux",
        }
        key = self._key(name, tag, namespace)
        with self._lock:
            self._models[key] = _OllamaModel(layers, config)
            self._rebuild(key)
        return self.manifest(name, tag, namespace)

    def manifest(self, name: str, tag: str, namespace: str = "library") -> dict[str, Any]:
        """The manifest as served now."""
        return dict(json.loads(self._model(name, tag, namespace).manifest))

    def model_digest(self, name: str, tag: str, namespace: str = "library") -> str:
        """The model layer's digest as the manifest advertises it (the content's
        ``sha256:<hex>`` unless ``wrong_digest`` was called)."""
        layer: dict[str, Any] = self.manifest(name, tag, namespace)["layers"][0]
        return str(layer["digest"])

    # -- fault hooks

    def cut_after(self, digest: str, nbytes: int, *, reset: bool = False) -> None:
        """The next GET of the blob sends ``nbytes`` of its body, then closes the
        connection (orderly, or a TCP reset with ``reset``)."""
        self._stats.arm_cut(digest, nbytes, reset)

    def hold(self, digest: str) -> Hold:
        """GETs of the blob wait (at most a minute) until ``release()``;
        ``arrived`` is set when the first one waits."""
        hold = Hold()
        with self._lock:
            self._holds[digest] = hold
        return hold

    def wrong_digest(self, name: str, tag: str, namespace: str = "library") -> str:
        """The manifest advertises a wrong digest for the model layer, and the
        real bytes are served under that digest too. Returns it."""
        with self._lock:
            model = self._model(name, tag, namespace)
            real = model.layers[0]["digest"]
            model.digest_lie = "sha256:" + _wrong(real.removeprefix("sha256:"))
            self._blobs[model.digest_lie] = self._blobs[real]
            self._rebuild(self._key(name, tag, namespace))
            return model.digest_lie

    def lie_size(self, name: str, tag: str, size: int, namespace: str = "library") -> None:
        """The manifest (and a HEAD of the blob) advertise ``size`` for the model
        layer; GET serves the real bytes."""
        with self._lock:
            model = self._model(name, tag, namespace)
            model.size_lie = size
            self._rebuild(self._key(name, tag, namespace))

    # -- counters

    def bytes_sent(self, digest: str) -> int:
        """Body bytes written for GETs of the blob, over all requests."""
        with self._stats.lock:
            return self._stats.sent[digest]

    def gets(self, digest: str) -> int:
        """GET requests for the blob."""
        with self._stats.lock:
            return self._stats.gets[digest]

    # -- building

    @staticmethod
    def _key(name: str, tag: str, namespace: str) -> tuple[str, str, str]:
        return namespace.casefold(), name.casefold(), tag.casefold()

    def _model(self, name: str, tag: str, namespace: str) -> _OllamaModel:
        with self._lock:
            try:
                return self._models[self._key(name, tag, namespace)]
            except KeyError:
                raise KeyError(f"no model {namespace}/{name}:{tag}") from None

    def _add_blob(self, media_type: str, blob: Blob) -> dict[str, Any]:
        digest = f"sha256:{blob.sha256}"
        with self._lock:
            self._blobs[digest] = blob
        return {"mediaType": media_type, "digest": digest, "size": blob.size}

    def _rebuild(self, key: tuple[str, str, str]) -> None:
        """Write the model's config blob and manifest from its layers and lies."""
        model = self._models[key]
        layers = [dict(layer) for layer in model.layers]
        if model.digest_lie is not None:
            layers[0]["digest"] = model.digest_lie
        if model.size_lie is not None:
            layers[0]["size"] = model.size_lie
            self._head_sizes[layers[0]["digest"]] = model.size_lie
        rootfs = {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]}
        config = json.dumps({**model.config, "rootfs": rootfs}, separators=(",", ":")).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": self._add_blob(CONFIG_V1, Blob.of(config)),
            "layers": layers,
        }
        model.manifest = json.dumps(manifest, separators=(",", ":")).encode()

    # -- serving

    def _route(self, h: _Handler) -> None:
        path = urlsplit(h.path).path
        if h.command not in ("GET", "HEAD"):
            _registry_error(h, 405, "UNSUPPORTED", "the operation is unsupported")
        elif path in ("/v2", "/v2/"):
            h.send_json(200, {}, {"Docker-Distribution-API-Version": "registry/2.0"})
        elif m := _V2_MANIFEST.fullmatch(path):
            self._serve_manifest(h, unquote(m["repo"]), unquote(m["ref"]))
        elif m := _V2_BLOB.fullmatch(path):
            self._serve_blob(h, unquote(m["digest"]))
        else:
            _registry_error(h, 404, "NAME_UNKNOWN", "repository name not known to registry")

    def _serve_manifest(self, h: _Handler, repo: str, tag: str) -> None:
        namespace, _, name = repo.rpartition("/")
        with self._lock:
            model = self._models.get(self._key(name, tag, namespace or "library"))
            body = model.manifest if model is not None else None
        if body is None:
            _registry_error(h, 404, "MANIFEST_UNKNOWN", "manifest unknown", {"Tag": tag})
            return
        digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
        h.send_body(200, body, MANIFEST_V2, {"Docker-Content-Digest": digest, "ETag": f'"{digest}"'})

    def _serve_blob(self, h: _Handler, digest: str) -> None:
        with self._lock:
            blob = self._blobs.get(digest)
            head_size = self._head_sizes.get(digest)
        if blob is None:
            _registry_error(h, 404, "BLOB_UNKNOWN", "blob unknown to registry", digest)
            if h.command == "GET":
                self._stats.count_get(digest)
            return
        headers = {"Content-Type": "application/octet-stream", "Docker-Content-Digest": digest, "ETag": f'"{digest}"'}
        with self._lock:
            hold = self._holds.get(digest)
        if hold is not None and h.command == "GET":
            hold.arrived.set()
            hold.released.wait(60)
        if h.command == "HEAD" and head_size is not None:
            h.send_head(200, {**headers, "Accept-Ranges": "bytes", "Content-Length": str(head_size)})
        else:
            h.send_blob(blob, digest, headers)


@contextlib.contextmanager
def pulls_from(hf: FakeHub, reg: FakeRegistry | None = None) -> Iterator[None]:
    """This process's pulls (and the servers it starts) pointed at ``hf``
    and ``reg`` while the block runs: ``HF_ENDPOINT``, the Ollama registry,
    never offline."""
    import pytest

    env = {**hf.env(), **({"TURBOSPARK_OLLAMA_REGISTRY": reg.url} if reg is not None else {})}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("HF_HUB_OFFLINE", raising=False)
        yield
