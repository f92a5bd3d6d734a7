"""Pulls: one per model at a time (a second pull of the same model follows
the first's progress instead of fetching again), each told as Ollama's
progress lines to whoever asked and as ``modelPull`` events to every sink.
Synchronous (downloads run on a worker thread; ``/api/pull`` bridges)."""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..models.catalog import CATALOG
from ..observe import ModelPull, Observer, now_ms, record
from . import fetch, gguf, hf, ollama, packaged
from .refs import DEFAULT_QUANT, Reference
from .store import Installed, Store

log = logging.getLogger("turbospark.pull")
#: events at most this often per pull (progress)
EVENT_EVERY = 0.5
#: progress lines at most this often per listener
LINE_EVERY = 0.1


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
        self._lock = threading.Lock()
        self._closed = threading.Event()

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
            job.error = exc
            self._started(job)  # (a plan that failed: under the name asked for)
            self._event(job, "failed", reason=str(exc))
            raise
        finally:
            with self._lock:
                del self._jobs[key]
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

    def _counter(self, job: _Job, digest: str, size: int) -> tuple[Callable[[int], None], Callable[[int], None]]:
        """The ``progress`` callback of one file's download, and its
        ``on_disk`` (bytes an earlier pull left: done, not fetched)."""
        state = {"done": 0}

        def arrived(n: int, fetched: bool = True) -> None:
            if self._closed.is_set():
                raise fetch.FetchError("the server is shutting down; pull again to continue", 503)
            state["done"] += n
            job.completed += n
            job.fetched += max(n, 0) if fetched else 0
            whole = bool(size) and state["done"] >= size  # (the last line always goes)
            self._say(job, PullUpdate(f"pulling {digest[7:19]}", digest, size, state["done"]), force=whole)
            if time.monotonic() - job.evented >= EVENT_EVERY:
                self._event(job, "progress")

        return arrived, lambda n: arrived(n, fetched=False)

    def _file(self, job: _Job, digest: str, size: int, fetch_one: Callable[..., None]) -> None:
        """One file of a model: skipped when it is in place, else fetched with progress."""
        self._say(job, PullUpdate(f"pulling {digest[7:19]}", digest, size, 0))
        progress, on_disk = self._counter(job, digest, size)
        fetch_one(progress, lambda: self._say(job, PullUpdate("verifying sha256 digest")), on_disk)

    # -- the sources ----------------------------------------------------------
    def _hf(self, ref: Reference, job: _Job) -> Pulled:
        self._say(job, PullUpdate("pulling manifest"))
        plan = hf.plan(ref, self.endpoint)
        job.name = plan.reference.name
        files = [*plan.files, *([plan.mmproj] if plan.mmproj else [])]
        targets = [self.store.path(f"hf/{plan.reference.repo}/{f.path}") for f in files]
        missing = [(f, t) for f, t in zip(files, targets, strict=True) if not os.path.isfile(t)]
        job.total = sum(f.size or 0 for f in files)
        job.completed = job.total - sum(f.size or 0 for f, _ in missing)
        self._started(job)
        self.store.ensure_space(sum(f.size or 0 for f, _ in missing))
        for f, target in missing:
            digest = f"sha256:{f.sha256}" if f.sha256 else f"sha256:{'0' * 64}"
            self._file(
                job,
                digest,
                f.size or 0,
                lambda progress, verifying, on_disk, f=f, target=target: hf.download(
                    plan,
                    f,
                    target,
                    self.store.partial(f.sha256 or f"{plan.revision}-{f.path}"),
                    self.client,
                    progress,
                    self.endpoint,
                    verifying,
                    on_disk,
                ),  # fmt: skip
            )
        relative = [os.path.relpath(t, self.store.root) for t in targets]
        model_files = relative[: len(plan.files)]
        row = self._installed(plan.reference, model_files, relative[len(plan.files)] if plan.mmproj else None)
        row.digest = f"sha256:{plan.files[0].sha256}" if plan.files[0].sha256 else ""
        return self._record(job, row)

    def _ollama(self, ref: Reference, job: _Job) -> Pulled:
        self._say(job, PullUpdate("pulling manifest"))
        plan = ollama.plan(ref, self.client, self.registry)
        layers = [plan.model, *([plan.projector] if plan.projector else [])]
        targets = [self.store.path(f"ollama/{ref.repo}/sha256-{layer.hex}.gguf") for layer in layers]
        missing = [(x, t) for x, t in zip(layers, targets, strict=True) if not os.path.isfile(t)]
        job.total = sum(x.size for x in layers)
        job.completed = job.total - sum(x.size for x, _ in missing)
        self._started(job)
        self.store.ensure_space(sum(x.size for x, _ in missing))
        for layer, target in missing:
            self._file(
                job,
                layer.digest,
                layer.size,
                lambda progress, verifying, on_disk, layer=layer, target=target: fetch.download(
                    self.client,
                    plan.blob(layer),
                    self.store.partial(layer.hex),
                    target,
                    progress,
                    verifying=verifying,
                    on_disk=on_disk,
                ),  # fmt: skip
            )
        relative = [os.path.relpath(t, self.store.root) for t in targets]
        row = self._installed(ref, relative[:1], relative[1] if plan.projector else None)
        row.digest, row.params = plan.model.digest, plan.params
        row.template, row.system = plan.texts.get("template", ""), plan.texts.get("system", "")
        return self._record(job, row)

    def _url(self, ref: Reference, job: _Job) -> Pulled:
        parsed = urllib.parse.urlsplit(ref.url)
        sha = dict(urllib.parse.parse_qsl(parsed.fragment)).get("sha256")
        url = urllib.parse.urlunsplit(parsed._replace(fragment=""))
        target = self.store.path(f"url/{parsed.hostname}/{ref.name}")
        size = None
        if not os.path.isfile(target):
            try:
                head = self.client.head(url, follow_redirects=True)
                size = int(head.headers["content-length"]) if head.status_code == 200 else None
            except (httpx.TransportError, KeyError, ValueError):
                size = None
            job.total = size or 0
            self._started(job)
            self.store.ensure_space(size or 0)
            self._file(
                job,
                f"sha256:{sha or '0' * 64}",
                size or 0,
                lambda progress, verifying, on_disk: fetch.download(
                    self.client, fetch.Remote(url, size, sha), self.store.partial(url), target, progress,
                    verifying=verifying, on_disk=on_disk,
                ),
            )  # fmt: skip
        self._started(job)  # (in place already)
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
