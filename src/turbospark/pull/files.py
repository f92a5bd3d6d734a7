"""One download per file, whatever name a pull gives it and whichever
process asks: a file is known by its key (its digest, else its source), a
second pull of it in this process follows the first's bytes, and a lock in
the store (``fcntl.flock`` on ``.partial/<key>.lock``) makes another
process wait, then find the verified file. A file already in place is
checked again (size, GGUF header, digest) before it is trusted; the lock
file remembers the last file it vouched for (digest, inode, size, mtime),
so an intact file is hashed once, not on every pull."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..engine.gguf import NotGGUF, check
from .fetch import FetchError, sha256_of
from .store import Store

log = logging.getLogger("turbospark.pull")
#: how often a pull waiting on another process's lock looks again (and at shutdown)
POLL = 0.2

FetchOne = Callable[[Callable[[int], None], Callable[[], None], Callable[[int], None]], None]


@dataclass(frozen=True)
class Want:
    """One file of a pull: what it is known by, where it goes, what it must be."""

    key: str
    target: str
    size: int | None = None
    sha256: str | None = None
    gguf: bool = True


@dataclass
class Hooks:
    """What a pull is told about one file: bytes arriving (and bytes an
    earlier pull left), a wait behind another download, the start of its
    bytes, and the digest check."""

    progress: Callable[[int], None]
    on_disk: Callable[[int], None]
    waiting: Callable[[str], None]
    starting: Callable[[], None]
    verifying: Callable[[], None]


@dataclass
class _Fetching:
    done: threading.Event = field(default_factory=threading.Event)
    followers: list[Hooks] = field(default_factory=list)
    arrived: int = 0
    error: BaseException | None = None


class _Lock:
    """A held store lock for one file, and the stamp it keeps."""

    def __init__(self, fd: int, store: Store, waited: bool) -> None:
        self.fd, self.store = fd, store
        #: another process held it first
        self.waited = waited

    def _stamp(self) -> dict[str, Any]:
        os.lseek(self.fd, 0, os.SEEK_SET)
        try:
            found = json.loads(os.read(self.fd, 4096) or b"{}")
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    def vouches(self, sha256: str, st: os.stat_result) -> bool:
        """The file ``st`` is the one this lock last verified as ``sha256``."""
        s = self._stamp()
        return s.get("sha256") == sha256.lower() and s.get("id") == [st.st_ino, st.st_size, st.st_mtime_ns]

    def vouched(self, sha256: str) -> str | None:
        """Another file in the store verified as ``sha256`` (and unchanged since)."""
        s = self._stamp()
        if s.get("sha256") != sha256.lower() or not isinstance(s.get("file"), str):
            return None
        try:
            path = self.store.path(s["file"])
            st = os.stat(path)
        except (OSError, ValueError, RuntimeError):
            return None
        return path if s.get("id") == [st.st_ino, st.st_size, st.st_mtime_ns] else None

    def stamp(self, sha256: str | None, target: str) -> None:
        if not sha256:
            return
        st = os.stat(target)
        record: dict[str, Any] = {"sha256": sha256.lower(), "file": os.path.relpath(target, self.store.root)}
        record["id"] = [st.st_ino, st.st_size, st.st_mtime_ns]
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(record).encode(), 0)


class Files:
    """The downloads of one store, one per file key at a time."""

    def __init__(self, store: Store, closed: threading.Event) -> None:
        self.store = store
        self.closed = closed
        self._lock = threading.Lock()
        self._fetching: dict[str, _Fetching] = {}

    @staticmethod
    def present(want: Want) -> bool:
        """In place at the size the source gives (a first look: :meth:`get` checks it fully)."""
        try:
            return want.size is None or os.path.getsize(want.target) == want.size
        except OSError:
            return False

    def get(self, want: Want, fetch_one: FetchOne, hooks: Hooks) -> None:
        """The file in place and verified: found intact, taken from another
        name's verified copy, or fetched (once, however many ask)."""
        waited = False  # (only a file waited for is taken from another name)
        while True:
            with self._lock:
                job = self._fetching.get(want.key)
                if job is None:
                    job = self._fetching[want.key] = _Fetching()
                    break
                job.followers.append(hooks)
                so_far = job.arrived
            hooks.starting()
            hooks.on_disk(so_far)
            hooks.waiting("another pull is fetching this file")
            while not job.done.wait(POLL):
                if self.closed.is_set():
                    raise FetchError("the server is shutting down; pull again to continue", 503)
            if job.error is not None:
                raise job.error
            waited = True
            # then this pull's own turn: it finds the file (or its twin) verified
        try:
            with self._locked(want.key, hooks) as lock:
                if self._intact(want, lock, hooks) or ((waited or lock.waited) and self._adopt(want, lock)):
                    return
                hooks.starting()
                fetch_one(self._fan(job, hooks, "progress"), hooks.verifying, self._fan(job, hooks, "on_disk"))
                lock.stamp(want.sha256, want.target)
        except BaseException as exc:
            job.error = exc
            raise
        finally:
            with self._lock:
                del self._fetching[want.key]
            job.done.set()

    def _fan(self, job: _Fetching, hooks: Hooks, which: str) -> Callable[[int], None]:
        """A byte count for the fetching pull and every pull following it."""

        def tell(n: int) -> None:
            with self._lock:
                job.arrived += n
                followers = list(job.followers)
            getattr(hooks, which)(n)
            for follower in followers:
                try:
                    getattr(follower, which)(n)
                except FetchError:
                    if self.closed.is_set():
                        raise  # (a shutdown stops every pull)
                    with self._lock:  # (that pull was cancelled: it stops following; the download goes on)
                        if follower in job.followers:
                            job.followers.remove(follower)
                except Exception:  # a follower's trouble spoils no download
                    log.debug("a pull following a download raised", exc_info=True)

        return tell

    @contextmanager
    def _locked(self, key: str, hooks: Hooks) -> Iterator[_Lock]:
        """The store's lock for ``key``, waited for (told once) while another process holds it."""
        path = self.store.partial(key).removesuffix(".part") + ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            told = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        hooks.waiting("another process is fetching this file")
                        told = True
                    if self.closed.wait(POLL):
                        raise FetchError("the server is shutting down; pull again to continue", 503) from None
            yield _Lock(fd, self.store, told)
        finally:
            os.close(fd)  # (the lock goes with it)

    def _intact(self, want: Want, lock: _Lock, hooks: Hooks) -> bool:
        """The target is in place and whole (one that is not is fetched
        again, and replaced only once the new one is verified)."""
        try:
            st = os.stat(want.target)
        except OSError:
            return False
        problem = None
        if want.size is not None and st.st_size != want.size:
            problem = f"{st.st_size} bytes, the source says {want.size}"
        elif want.gguf:
            try:
                check(want.target)
            except NotGGUF as exc:
                problem = str(exc)
        if problem is None and want.sha256 and not lock.vouches(want.sha256, st):
            hooks.verifying()
            got = sha256_of(want.target)
            if got == want.sha256.lower():
                lock.stamp(want.sha256, want.target)
            else:
                problem = f"its sha256 is {got}, the source says {want.sha256}"
        if problem is not None:  # (it stays until a verified file replaces it)
            rel = os.path.relpath(want.target, self.store.root)
            log.warning("%s in the model store is not intact (%s): fetching it again", rel, problem)
        return problem is None

    def _adopt(self, want: Want, lock: _Lock) -> bool:
        """The same file, just verified under another name (by the pull this
        one waited for): linked (else copied) in."""
        twin = lock.vouched(want.sha256) if want.sha256 else None
        if twin is None or twin == want.target:
            return False
        os.makedirs(os.path.dirname(want.target), exist_ok=True)
        scratch = self.store.partial(want.key).removesuffix(".part") + ".link"
        if os.path.lexists(scratch):
            os.unlink(scratch)
        try:
            os.link(twin, scratch)
        except OSError:
            shutil.copyfile(twin, scratch)
        os.replace(scratch, want.target)
        return True
