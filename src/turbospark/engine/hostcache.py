"""The second KV tier: sequence states in host memory.

A session slot that another conversation takes would lose its KV. Instead the
scheduler saves the slot's sequence state (``llama_state_seq_get_data``: the
KV cells of that one sequence) here, keyed by the exact token record it
holds, before the slot is reused; a later prompt that extends a saved record
further than any slot does gets it restored into its slot
(``llama_state_seq_set_data``) and prefills only the rest.

Bounded by bytes (``--cache-ram``), least recently used first out, and
partitioned by tenant like the slots: a lookup only ever sees its own
owner's records. Pure bookkeeping; the scheduler thread owns it (no lock).

With ``--cache-dir`` the tier outlives the process: at unload or shutdown the
scheduler parks every slot's record here and ``persist`` writes the records
(one file each, private to the user, in a folder named by the model file's
identity and KV type); ``load`` reads them back at start, most recent first
while the budget lasts, so an agent's next session after a restart starts
warm. A file that does not parse or whose checksum fails is skipped; a
state llama.cpp refuses, or that does not hold the positions its tokens say,
is dropped. One server at a time keeps a folder (a lock file): a second one
on the same folder keeps its tier in memory only.
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

log = logging.getLogger("turbospark.engine")

MIB = 1 << 20
#: the default budget's share of the memory available at start, and its cap
DEFAULT_SHARE = 0.25
DEFAULT_CAP_MIB = 4096


def default_budget_mib() -> int:
    """A quarter of the memory available now, at most 4 GiB (0 if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    return min(DEFAULT_CAP_MIB, int(available * DEFAULT_SHARE) // MIB)
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return min(DEFAULT_CAP_MIB, int(pages * DEFAULT_SHARE) // MIB)
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(eq=False, slots=True)
class SavedState:
    owner: str
    tokens: list[int]
    state: bytes
    prompt_len: int = 0

    @property
    def size(self) -> int:
        return len(self.state) + 8 * len(self.tokens)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first: list slices compare in C
    while i + 64 <= n and a[i : i + 64] == b[i : i + 64]:
        i += 64
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HostCache:
    """Saved sequence states, least recently used first out of ``budget``
    bytes; one record per (owner, token record)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = max(0, budget_bytes)
        self._entries: OrderedDict[int, SavedState] = OrderedDict()
        self._next = 0
        self.bytes = 0
        self.saved = 0  # states put, ever
        self.restored = 0  # states taken back, ever
        self.evicted = 0  # states dropped for room, ever

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, tokens: list[int], state: bytes, prompt_len: int = 0) -> bool:
        """Keep a state (replacing one of the same owner whose record it
        extends or equals); False when it cannot fit the budget at all."""
        entry = SavedState(owner, list(tokens), state, prompt_len)
        if not self.enabled or entry.size > self.budget or not tokens:
            return False
        for key, old in list(self._entries.items()):
            if old.owner == owner and len(old.tokens) <= len(tokens) and tokens[: len(old.tokens)] == old.tokens:
                self._drop(key)
        while self.bytes + entry.size > self.budget and self._entries:
            self._drop(next(iter(self._entries)))
            self.evicted += 1
        self._entries[self._next] = entry
        self._next += 1
        self.bytes += entry.size
        self.saved += 1
        return True

    def best(self, owner: str, prompt: list[int]) -> tuple[int, int]:
        """(key, common prefix) of the owner's record sharing the longest
        prefix with ``prompt``; (-1, 0) when none shares anything."""
        best_key, best_lcp = -1, 0
        for key, entry in self._entries.items():
            if entry.owner != owner:
                continue
            lcp = common_prefix(entry.tokens, prompt)
            if lcp > best_lcp:
                best_key, best_lcp = key, lcp
        return best_key, best_lcp

    def take(self, key: int) -> SavedState:
        """Remove and return a record."""
        entry = self._entries[key]
        self._drop(key)
        self.restored += 1
        return entry

    def get(self, key: int) -> SavedState:
        """A record whose state goes back into a slot; it stays here (another
        new conversation may share it too), as the most recently used."""
        self._entries.move_to_end(key)
        self.restored += 1
        return self._entries[key]

    def discard(self, key: int) -> None:
        """Forget a record for good (one whose state would not restore)."""
        if key in self._entries:
            self._drop(key)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size

    def records(self) -> list[SavedState]:
        """Least recently used first."""
        return list(self._entries.values())

    def persist(self, folder: str) -> int:
        """Write every record to ``folder`` (replacing what it held, and
        what a writer killed midway left); returns how many were written.
        Never raises for a disk problem."""
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            names = os.listdir(folder)
        except OSError as e:
            log.warning("KV cache folder %s: %s", folder, e)
            return 0
        old = {n for n in names if n.endswith(FILE_SUFFIX) or n.endswith(TMP_SUFFIX)}
        written = set()
        for i, entry in enumerate(self.records()):
            name = f"{i:06d}{FILE_SUFFIX}"
            try:
                write_record(os.path.join(folder, name), entry)
            except OSError as e:
                log.warning("KV cache folder %s: %s", folder, e)
                break
            written.add(name)
        for name in old - written:
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass
        return len(written)

    def load(self, folder: str) -> int:
        """Read the records ``persist`` wrote, most recent first while they
        fit the budget; returns how many were loaded."""
        if not self.enabled:
            return 0
        try:
            names = sorted((n for n in os.listdir(folder) if n.endswith(FILE_SUFFIX)), reverse=True)
        except OSError:
            return 0
        loaded: list[SavedState] = []
        room = self.budget
        for name in names:
            entry = read_record(os.path.join(folder, name))
            if entry is None or entry.size > room:
                continue
            loaded.append(entry)
            room -= entry.size
        for entry in reversed(loaded):  # oldest first: the newest ends most recent
            self.put(entry.owner, entry.tokens, entry.state, entry.prompt_len)
        self.saved -= len(loaded)
        return len(loaded)

    def snapshot(self) -> dict[str, int]:
        return {
            "budget_bytes": self.budget,
            "bytes": self.bytes,
            "entries": len(self._entries),
            "saved": self.saved,
            "restored": self.restored,
            "evicted": self.evicted,
        }


#: a persisted record: MAGIC, one JSON header line (with the SHA-256 of what
#: follows: a record damaged on disk is skipped, never restored), the tokens
#: (int32), the state
MAGIC = b"turbospark-kv 2\n"
FILE_SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"
#: the longest header line read
MAX_HEADER = 4096


def folder_problem(folder: str) -> str | None:
    """Why ``folder`` cannot keep the records (None when it can): made if
    missing, then it must be a folder this process may write."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as e:
        return f"{e.strerror or e}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "not writable"
    return None


#: how long a model's next load waits for the one before it (unloaded,
#: evicted, failed) to finish writing its records to the same folder
HANDOVER_SECONDS = 120.0

_held_lock = threading.Lock()
#: the folders this process holds, by real path
_held: dict[str, FolderLock] = {}


class FolderLock:
    """One model at a time keeps its records in a folder: the last to shut
    down would replace the other's. Between processes a lock file
    (``flock``); within this one a table, where a model still writing its
    records on its way out hands the folder over to its next load (keep-alive,
    eviction, a reload after a failure) rather than refusing it."""

    def __init__(self, folder: str) -> None:
        self.folder = os.path.realpath(folder)
        self._fd: int | None = None
        #: its model is closing: its next load waits for the folder
        self.closing = False
        self._released = threading.Event()

    def acquire(self, wait: float = HANDOVER_SECONDS) -> str | None:
        """None once held; else why not."""
        deadline = time.monotonic() + wait
        while True:
            with _held_lock:
                holder = _held.get(self.folder)
                if holder is None:
                    problem = self._lock_file()
                    if problem is None:
                        _held[self.folder] = self
                    return problem
            if not holder.closing:
                return "another model of this server keeps its KV records there"
            if not holder._released.wait(max(0.0, deadline - time.monotonic())):
                return "the model before it was still writing its KV records there"

    def _lock_file(self) -> str | None:
        import fcntl

        try:
            fd = os.open(os.path.join(self.folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            return f"{e.strerror or e}"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return "another server keeps its KV records there"
        self._fd = fd
        return None

    def release(self) -> None:
        with _held_lock:
            if self._fd is not None:
                os.close(self._fd)  # (closing drops the lock)
                self._fd = None
            if _held.get(self.folder) is self:
                del _held[self.folder]
        self._released.set()


def cache_folder(root: str, model_path: str, cache_type: str) -> str:
    """``root``'s sub-folder for one model file (by its path, size and
    modification time) and KV element type: a state only loads back into a
    context made the same way."""
    st = os.stat(model_path)
    ident = f"{os.path.realpath(model_path)}\0{st.st_size}\0{st.st_mtime_ns}\0{cache_type}"
    name = os.path.basename(model_path).removesuffix(".gguf")
    return os.path.join(os.path.expanduser(root), f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}")


def write_record(path: str, entry: SavedState) -> int:
    """Write ``entry`` to ``path`` as one verified record (atomically: a
    temporary file in the same folder, then renamed; mode 0600); returns
    the bytes written. Raises ``OSError``."""
    folder = os.path.dirname(path) or "."
    tokens = array.array("i", entry.tokens).tobytes()
    head: dict[str, object] = {"owner": entry.owner, "prompt_len": entry.prompt_len, "tokens": len(entry.tokens)}
    head["sha256"] = _digest(head, tokens, entry.state)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=TMP_SUFFIX)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC)
            f.write(json.dumps(head).encode() + b"\n")
            f.write(tokens)
            f.write(entry.state)
            written = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return written


def _digest(head: dict[str, object], tokens: bytes, state: bytes) -> str:
    """SHA-256 of a record's header fields (who owns it, where its tokens
    end), its tokens and its state."""
    digest = hashlib.sha256(json.dumps(head, sort_keys=True).encode() + b"\n")
    digest.update(tokens)
    digest.update(state)
    return digest.hexdigest()


def read_record(path: str) -> SavedState | None:
    """The record in ``path``, or None for anything that is not one this
    module wrote whole: never a reason to fail the model's load."""
    try:
        # a regular file only (a FIFO would block the engine thread for good)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or f.read(len(MAGIC)) != MAGIC:
                return None
            head = json.loads(f.readline(MAX_HEADER))
            if not isinstance(head, dict):
                return None
            n, owner, prompt_len, expected = head["tokens"], head["owner"], head.get("prompt_len", 0), head["sha256"]
            if not (isinstance(n, int) and isinstance(owner, str) and isinstance(prompt_len, int)):
                return None
            left = os.fstat(f.fileno()).st_size - f.tell()
            if not 0 < 4 * n < left or not 0 <= prompt_len <= n:
                return None
            raw = f.read(4 * n)
            state = f.read()
        fields = {"owner": owner, "prompt_len": prompt_len, "tokens": n}
        if len(raw) != 4 * n or not state or _digest(fields, raw, state) != expected:
            return None
        tokens = array.array("i")
        tokens.frombytes(raw)
        return SavedState(owner, tokens.tolist(), state, prompt_len)
    except Exception:  # noqa: BLE001 - whatever the file holds, it is skipped
        return None
