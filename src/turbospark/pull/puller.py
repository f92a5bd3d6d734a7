"""Pulls: one per model at a time (a second pull of the same model follows
the first's progress instead of fetching again), and one download per file
whatever the name (``files.py``: a pull of the same file under another name,
or in another process, waits for it), each told as Ollama's progress lines
to whoever asked and as ``modelPull`` events to every sink; the pulls in
flight and the last few ended are :meth:`Puller.pulls` (``/v1/admin/pulls``).
Synchronous (downloads run on a worker thread; ``/api/pull`` bridges)."""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..models.catalog import CATALOG
from ..observe import ModelPull, Observer, now_ms, record
from . import fetch, gguf, hf, ollama, packaged
from .files import Files, Hooks, Want
from .refs import DEFAULT_QUANT, Reference
from .store import Installed, Store

log = logging.getLogger("turbospark.pull")
#: events at most this often per pull (progress)
EVENT_EVERY = 0.5
#: progress lines at most this often per listener
LINE_EVERY = 0.1
#: ended pulls :meth:`Puller.pulls` keeps (the newest)
ENDED_KEPT = 10


@dataclass(frozen=True)
class PullUpdate:
    """One progress line, in Ollama's ``/api/pull`` shape."""

    status: str
    digest: str = ""
    total: int = 0
    completed: int = 0

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.digest:
            out.update(digest=self.digest, total=self.total, completed=self.completed)
        return out


@dataclass(frozen=True)
class Pulled:
    """What a pull gives: the model's name and the GGUF to load (a split
    model's first part); ``model`` is its store row (None: a packaged model)."""

    name: str
    path: str
    model: Installed | None = None


@dataclass
class _Job:
    """One pull in progress, and who follows it."""

    name: str
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    listeners: list[Callable[[PullUpdate], None]] = field(default_factory=list)
    last: PullUpdate | None = None
    result: Pulled | None = None
    error: BaseException | None = None
    completed: int = 0
    total: int = 0
    fetched: int = 0
    evented: float = 0.0
    lined: float = 0.0
    #: its ``started`` event went out
    announced: bool = False
    #: listing, waiting, pulling, verifying, writing, finished, failed, cancelled
    state: str = "listing"
    #: set by :meth:`Puller.cancel`: the pull stops at its next chunk
    cancel: threading.Event = field(default_factory=threading.Event)
    at: float = field(default_factory=time.time)
    ended: float | None = None
    reason: str | None = None

    def view(self) -> dict[str, Any]:
        """As ``/v1/admin/pulls`` shows it (``rate``: bytes a second over the network)."""
        took = (self.ended or time.monotonic()) - self.started
        return {
            "model": self.name,
            "state": self.state,
            "completed": self.completed,
            "total": self.total,
            "fetched": self.fetched,
            "rate": round(self.fetched / took) if took > 0 else 0,
            "started_at": round(self.at, 3),
            "seconds": round(took, 3),
            "clients": len(self.listeners),
            "error": self.reason,
        }


class Puller:
    """Fills the store. ``endpoint``: Hugging Face's (else ``HF_ENDPOINT``);
    ``registry``: Ollama's (else ``TURBOSPARK_OLLAMA_REGISTRY``)."""

    def __init__(
        self,
        store: Store,
        observer: Observer | None = None,
        *,
        endpoint: str | None = None,
        registry: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.store = store
        self.observer = observer
        self.endpoint = endpoint
        self.registry = registry
        #: the project's pooled client for what is not Hugging Face's
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(30.0, read=60.0), limits=httpx.Limits(max_connections=8)
        )
        self._jobs: dict[str, _Job] = {}
        self._ended: deque[_Job] = deque(maxlen=ENDED_KEPT)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.files = Files(store, self._closed)

    def close(self) -> None:
        """Stop the pulls in progress at their next chunk (their bytes stay
        in ``.partial/`` for the next pull to continue), then close."""
        self._closed.set()
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.done.wait(30)
        self.client.close()
        self.store.close()

    def active(self) -> list[dict[str, Any]]:
        """Pulls in progress (``/v1/admin/pulls``, the views' first paint)."""
        with self._lock:
            jobs = list(self._jobs.values())
        return [
            {"model": j.name, "completed": j.completed, "total": j.total, "clients": len(j.listeners)} for j in jobs
        ]

    def pulls(self) -> list[dict[str, Any]]:
        """The pulls in flight (oldest first), then the last few that ended (newest first)."""
        with self._lock:
            jobs, ended = list(self._jobs.values()), list(reversed(self._ended))
        return [j.view() for j in [*jobs, *ended]]

    def cancel(self, name: str) -> bool:
        """Stop the pull of ``name`` (as asked for, or as it is named now) at
        its next chunk: its bytes stay in ``.partial/`` for a later pull to
        continue. False: no such pull in flight."""
        with self._lock:
            jobs = [j for key, j in self._jobs.items() if name in (key, j.name)]
        for job in jobs:
            job.cancel.set()
        return bool(jobs)

    # -- one pull ----------------------------------------------------------
    def pull(self, ref: Reference, on_update: Callable[[PullUpdate], None] | None = None) -> Pulled:
        """Fetch what ``ref`` names into the store (nothing when it is there).
        Raises :class:`fetch.FetchError`, :class:`hf.NeedsQuant`, a
        :class:`store.StoreError` (no space included)."""
        key = ref.name
        with self._lock:
            job = self._jobs.get(key)
            leader = job is None
            if job is None:
                job = self._jobs[key] = _Job(key)
            if on_update is not None:
                job.listeners.append(on_update)
                if job.last is not None:
                    on_update(job.last)  # where the first pull is now
        if not leader:
            job.done.wait()
            if job.error is not None:
                raise job.error
            assert job.result is not None
            return job.result
        try:
            job.result = self._run(ref, job)
            return job.result
        except BaseException as exc:
            job.error, job.reason = exc, fetch.plain(exc)
            job.state = "cancelled" if job.cancel.is_set() else "failed"
            self._started(job)  # (a plan that failed: under the name asked for)
            self._event(job, "failed", reason=job.reason)
            raise
        finally:
            job.ended = time.monotonic()
            with self._lock:
                del self._jobs[key]
                self._ended.append(job)
            job.done.set()

    def _run(self, ref: Reference, job: _Job) -> Pulled:
        if ref.source == "packaged":
            self._started(job)
            self._say(job, PullUpdate("pulling manifest"))
            path = packaged.install(CATALOG[ref.repo], lambda s: self._say(job, PullUpdate(s)))
            pulled = Pulled(ref.name, path)
        elif ref.source == "hf":
            pulled = self._hf(ref, job)
        elif ref.source == "ollama":
            pulled = self._ollama(ref, job)
        else:
            pulled = self._url(ref, job)
        job.state = "finished"
        self._say(job, PullUpdate("success"))
        self._event(job, "finished", seconds=round(time.monotonic() - job.started, 3))
        return pulled

    # -- progress ------------------------------------------------------------
    def _say(self, job: _Job, update: PullUpdate, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - job.lined < LINE_EVERY:
            return
        job.lined, job.last = now, update
        with self._lock:
            listeners = list(job.listeners)
        for listen in listeners:
            try:
                listen(update)
            except Exception:  # a listener (a client gone) spoils nothing
                log.debug("pull listener raised", exc_info=True)

    def _started(self, job: _Job) -> None:
        """The ``started`` event, once the pull's name and size are known (a
        Hugging Face repo named without a quant is named with the one chosen):
        a pull's events all carry one name, and the views draw a bar at once."""
        if not job.announced:
            job.announced = True
            self._event(job, "started")

    def _event(self, job: _Job, phase: str, seconds: float | None = None, reason: str | None = None) -> None:
        job.evented = time.monotonic()
        record(
            self.observer,
            lambda: ModelPull(
                at_ms=now_ms(),
                model=job.name,
                phase=phase,
                completed=job.completed,
                total=job.total,
                fetched=job.fetched,
                seconds=seconds,
                reason=reason,
            ),
        )

    def _counter(self, job: _Job, digest: str, size: int, state: dict[str, int]) -> Callable[[int, bool], None]:
        """Counts one file's bytes (``fetched``: over the network, else
        found on disk) into the pull, with its progress lines and events."""

        def arrived(n: int, fetched: bool = True) -> None:
            if self._closed.is_set():
                raise fetch.FetchError("the server is shutting down; pull again to continue", 503)
            if job.cancel.is_set():
                raise fetch.FetchError(f"the pull of {job.name} was cancelled", 409)
            state["done"] += n
            job.completed += n
            job.fetched += max(n, 0) if fetched else 0
            whole = bool(size) and state["done"] >= size  # (the last line always goes)
            self._say(job, PullUpdate(f"pulling {digest[7:19]}", digest, size, state["done"]), force=whole)
            if time.monotonic() - job.evented >= EVENT_EVERY:
                self._event(job, "progress")

        return arrived

    def _file(self, job: _Job, want: Want, fetch_one: Callable[..., None]) -> None:
        """One file of a model: found intact in place, or fetched (once, with
        whoever else wants it) with progress."""
        digest, size = f"sha256:{want.sha256 or '0' * 64}", want.size or 0
        state = {"done": size if self.files.present(want) else 0}  # (counted as done already)
        arrived = self._counter(job, digest, size, state)

        def starting() -> None:  # its bytes start (again) from none
            job.completed -= state["done"]
            state["done"], job.state = 0, "pulling"
            self._say(job, PullUpdate(f"pulling {digest[7:19]}", digest, size, 0))

        def waiting(why: str) -> None:
            job.state = "waiting"
            self._say(job, PullUpdate(f"waiting for {digest[7:19]}: {why}"))

        def verifying() -> None:
            job.state = "verifying"
            self._say(job, PullUpdate("verifying sha256 digest"))

        hooks = Hooks(lambda n: arrived(n, True), lambda n: arrived(n, False), waiting, starting, verifying)
        self.files.get(want, fetch_one, hooks)
        if state["done"] < size:  # (found whole: another pull's, or one in place)
            arrived(size - state["done"], False)

    # -- the sources ----------------------------------------------------------
    def _hf(self, ref: Reference, job: _Job) -> Pulled:
        self._say(job, PullUpdate("pulling manifest"))
        plan = hf.plan(ref, self.endpoint, self.client)
        job.name = plan.reference.name
        files = [*plan.files, *([plan.mmproj] if plan.mmproj else [])]
        targets = [self.store.path(f"hf/{plan.reference.repo}/{f.path}") for f in files]
        wants = [
            Want(f.sha256 or f"{plan.reference.repo}@{plan.revision}/{f.path}", t, f.size, f.sha256)
            for f, t in zip(files, targets, strict=True)
        ]
        self._plan_size(job, wants)
        for f, want in zip(files, wants, strict=True):
            self._file(
                job,
                want,
                lambda progress, verifying, on_disk, f=f, want=want: hf.download(
                    plan, f, want.target, self.store.partial(want.key), self.client, progress, self.endpoint,
                    verifying, on_disk,
                ),
            )  # fmt: skip
        relative = [os.path.relpath(t, self.store.root) for t in targets]
        model_files = relative[: len(plan.files)]
        row = self._installed(plan.reference, model_files, relative[len(plan.files)] if plan.mmproj else None)
        row.digest = f"sha256:{plan.files[0].sha256}" if plan.files[0].sha256 else ""
        return self._record(job, row)

    def _plan_size(self, job: _Job, wants: list[Want]) -> None:
        """The pull's total and what is in place already; room for the rest."""
        missing = [w.size or 0 for w in wants if not self.files.present(w)]
        job.total = sum(w.size or 0 for w in wants)
        job.completed = job.total - sum(missing)
        self._started(job)
        self.store.ensure_space(sum(missing))

    def _ollama(self, ref: Reference, job: _Job) -> Pulled:
        self._say(job, PullUpdate("pulling manifest"))
        plan = ollama.plan(ref, self.client, self.registry)
        layers = [plan.model, *([plan.projector] if plan.projector else [])]
        wants = [Want(x.hex, self.store.path(f"ollama/{ref.repo}/sha256-{x.hex}.gguf"), x.size, x.hex) for x in layers]
        self._plan_size(job, wants)
        for layer, want in zip(layers, wants, strict=True):
            self._file(
                job,
                want,
                lambda progress, verifying, on_disk, layer=layer, want=want: fetch.download(
                    self.client, plan.blob(layer), self.store.partial(want.key), want.target, progress,
                    verifying=verifying, on_disk=on_disk,
                ),
            )  # fmt: skip
        relative = [os.path.relpath(w.target, self.store.root) for w in wants]
        row = self._installed(ref, relative[:1], relative[1] if plan.projector else None)
        row.digest, row.params = plan.model.digest, plan.params
        row.template, row.system = plan.texts.get("template", ""), plan.texts.get("system", "")
        return self._record(job, row)

    def _url(self, ref: Reference, job: _Job) -> Pulled:
        parsed = urllib.parse.urlsplit(ref.url)
        sha = dict(urllib.parse.parse_qsl(parsed.fragment)).get("sha256")
        url = urllib.parse.urlunsplit(parsed._replace(fragment=""))
        target = self.store.path(ref.store_file())
        size = None
        if not os.path.isfile(target):
            try:
                head = self.client.head(url, follow_redirects=True)
                size = int(head.headers["content-length"]) if head.status_code == 200 else None
            except (httpx.TransportError, KeyError, ValueError):
                size = None
        want = Want(sha.lower() if sha else url, target, size, sha)
        self._plan_size(job, [want])
        self._file(
            job,
            want,
            lambda progress, verifying, on_disk: fetch.download(
                self.client, fetch.Remote(url, size, sha), self.store.partial(want.key), target, progress,
                verifying=verifying, on_disk=on_disk,
            ),
        )  # fmt: skip
        row = self._installed(ref, [os.path.relpath(target, self.store.root)], None)
        row.digest = f"sha256:{sha}" if sha else ""
        return self._record(job, row)

    def _installed(self, ref: Reference, files: list[str], mmproj: str | None) -> Installed:
        paths = [self.store.path(f) for f in files]
        facts = gguf.read(paths)
        return Installed(
            name=ref.name,
            source=ref.source,
            reference=ref.url or ref.name,
            files=files,
            mmproj=mmproj,
            size=sum(os.path.getsize(p) for p in paths),
            architecture=facts.architecture,
            parameters=facts.parameters,
            context=facts.context,
            quant=facts.quant,
            template=facts.chat_template,
        )

    def _record(self, job: _Job, row: Installed) -> Pulled:
        job.state = "writing"
        self._say(job, PullUpdate("writing manifest"))
        self.store.add(row)
        return Pulled(row.name, self.store.path(row.files[0]), row)


def find_installed(store: Store, ref: Reference) -> Pulled | None:
    """The model ``ref`` names when it is in the store already (a Hugging
    Face repo named without a quant: its default quant)."""
    names = [ref.name]
    if ref.source == "hf" and not ref.tag and not ref.file:
        names.append(ref.with_tag(DEFAULT_QUANT).name)
    for name in names:
        row = store.find(name)
        if row is not None and all(os.path.isfile(p) for p in store.paths(row)):
            return Pulled(row.name, store.path(row.files[0]), row)
    return None
