"""Session slots and the prefix store: which slot a job takes, and what of
its prompt is already in that slot's KV before it prefills.

Sequences live in session slots (llama.cpp sequence ids). A slot keeps a
record of the exact token ids in its KV after its turn ends, so the next
request that extends that conversation prefills only what is new.

Session slots (CONTRACT §7): a slot holds the same conversation only when
the request carries the slot's session key, or its prompt starts with the
slot's whole previous prompt (a next turn, or a regenerate). Serving
anything else into a slot that held usable state is an eviction, even when
the common part (a shared system prompt) is still reused within the tenant.

KV shared across conversations (issue 13): when another slot's record of the
same owner (parked, or a running sequence's record: exactly what its KV holds
so far) shares a long prefix with a new prompt (``copy_min_tokens`` and
``copy_min_share`` of the prompt) and longer than the request's own slot
does, that prefix's KV is copied into the request's slot instead of
prefilled, and the source keeps its own. A cancelled sequence's record is
what it had put in the KV when it stopped, and cancelled sequences are
released before admission, so a client's retry continues where it stopped.

The second tier (``hostcache.HostCache``, ``--cache-ram``): an evicted
slot's state is saved in host memory and restored into a slot when it
offers ``HOST_MIN_TOKENS`` more of a prompt than the slots do; with
``--cache-dir`` the tier is read at start and written at shutdown.

Only the scheduler thread touches the slots' KV (``SlotStore`` takes no
lock); the busy flags are also read under the wait list's lock.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .hostcache import FolderLock, HostCache, SavedState, common_prefix, folder_problem
from .jobs import Job
from .llama import LlamaContext
from .types import GenerationConfig, SlotActionError

log = logging.getLogger("turbospark.engine")

#: A prompt's prefix shared with ANOTHER slot's record (same owner) is copied
#: from that slot's KV instead of prefilled when it is at least this many
#: tokens ...
COPY_MIN_TOKENS = 256
#: ... and at least this share of the prompt (and longer than what the
#: request's own slot already shares with it).
COPY_MIN_SHARE = 0.5
#: a state saved in the host tier is restored when it offers at least this
#: many more prompt tokens than the slots do (loading a state costs little
#: next to prefilling: ~40 ms for 2,000 tokens of SmolLM2 here)
HOST_MIN_TOKENS = 64


@dataclass(frozen=True)
class TaskView:
    """The job a slot runs, or ran last (llama-server's ``/slots``): its
    task id, its settings, its prompt's length and how far it has got (a
    job that ended shows none of its progress, as llama-server resets a
    slot it releases: ``n_remain`` -1, nothing decoded)."""

    id: int
    config: GenerationConfig
    n_prompt: int
    n_decoded: int
    n_remain: int
    has_next_token: bool
    has_new_line: bool
    stopping_word: str
    #: prompt tokens prefilled so far, and those its slot's KV already held
    n_processed: int = 0
    n_cached: int = 0

    def ended(self) -> TaskView:
        """The view of its slot once released."""
        return TaskView(self.id, self.config, self.n_prompt, 0, -1, False, False, "")


@dataclass(eq=False)
class Slot:
    """One llama.cpp sequence id and the record of what its KV holds."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    owner: str = ""
    session_key: str | None = None
    last_used: float = 0.0
    busy: bool = False
    #: how many of ``tokens`` are the previous job's prompt (the rest is what
    #: it generated): the part a next turn of the same conversation repeats
    prompt_len: int = 0
    #: the last job that ran here, as it ended (None: none yet)
    task: TaskView | None = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "id": self.seq_id,
            "state": "busy" if self.busy else ("parked" if self.tokens else "empty"),
            "owner": self.owner,
            "session_key": self.session_key,
            "tokens_cached": len(self.tokens),
            "last_used": self.last_used,
        }


class Placement(NamedTuple):
    """What :meth:`SlotStore.prepare` left in a job's slot: the prompt
    tokens already in its KV, where they came from ("slot", "copy",
    "host"), whether another conversation was evicted, and the
    ``prefixMissAt`` of the job's records."""

    reused: int
    reused_from: str
    evicted: bool
    miss_at: int | None


def _miss_at(records: dict[Slot, int], prompt: list[int]) -> int | None:
    """Where the prompt first differs from the record that shares the most
    with it (``records``: record -> shared prefix); None when there is none
    or the prompt extends it whole (all it holds is reused)."""
    if not records:
        return None
    best = max(records, key=lambda s: records[s])
    n = records[best]
    return None if n >= len(best.tokens) or n >= len(prompt) else n


def _runs(ids: set[int]) -> int:
    """How many runs of consecutive integers ``ids`` forms."""
    return sum(1 for i in ids if i - 1 not in ids)


def _holds_prefix_of(slot: Slot, prompt: list[int]) -> bool:
    """Whether ``prompt`` starts with the slot's whole previous prompt (as
    far as its record holds it: a prefill cut short keeps only a part)."""
    n = min(slot.prompt_len, len(slot.tokens))
    return n > 0 and len(prompt) >= n and prompt[:n] == slot.tokens[:n]


class SlotStore:
    """A context's session slots, the records of what their KV holds, and
    the host tier behind them: slot choice, prefix reuse (own slot, copy
    from another slot, restore from the host tier) and eviction."""

    def __init__(
        self,
        ctx: LlamaContext,
        *,
        name: str,
        prefix_reuse: bool,
        kv_copy: bool,
        copy_min_tokens: int,
        copy_min_share: float,
        host_cache_bytes: int,
        cache_dir: str | None,
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.slots = [Slot(i) for i in range(ctx.opts.n_seq_max)]
        self.prefix_reuse = prefix_reuse
        #: copy a long prefix shared with another slot's record (see copy_source)
        self.kv_copy = kv_copy
        self.copy_min_tokens = copy_min_tokens
        self.copy_min_share = copy_min_share
        #: the second tier: evicted slots' states in host memory (--cache-ram)
        self.host = HostCache(host_cache_bytes if prefix_reuse else 0)
        #: where the host tier is kept across restarts (--cache-dir), if anywhere
        self.cache_dir = cache_dir if self.host.enabled else None
        self._folder_lock: FolderLock | None = None

    def busy_count(self) -> int:
        """Slots given to a job (running, or taken and being started)."""
        return sum(1 for s in self.slots if s.busy)

    def view(self) -> list[dict[str, Any]]:
        return [s.snapshot() for s in self.slots]

    # ---------------------------------------------------------------- choice
    def choose(self, job: Job, taken: set[Slot]) -> tuple[Slot, bool] | None:
        """The slot holding this conversation (its session key, else a
        record whose whole previous prompt the new prompt starts with), else
        an empty one, else the least recently used. Returns (slot,
        is_same_conversation)."""
        cfg = job.config
        if cfg.slot is not None:
            return self._named(job, taken)
        free = [s for s in self.slots if not s.busy and s not in taken]
        if not free:
            return None
        mine = [s for s in free if s.owner == cfg.owner and s.tokens]
        if cfg.session_key is not None:
            for s in mine:
                if s.session_key == cfg.session_key:
                    return s, True
            mine = [s for s in mine if s.session_key is None]
        if self.prefix_reuse and mine:
            # The same conversation: the prompt starts with the slot's WHOLE
            # previous prompt (a next turn re-renders the previous prompt,
            # then the answer, which may not match the generated tokens
            # exactly; a regenerate repeats it). A prompt that merely shares
            # a system prompt with a parked conversation is another one: it
            # takes an empty slot, so both keep their state, else evicts.
            same = [s for s in mine if _holds_prefix_of(s, job.prompt)]
            if same:
                # the record sharing the longest prefix (a cancelled prefill's
                # partial record included), then the most recent
                best = max(same, key=lambda s: (common_prefix(s.tokens, job.prompt), s.last_used))
                return best, True
        empty = [s for s in free if not s.tokens]
        if empty:
            # keep running sequences on consecutive ids: llama.cpp batches
            # only runs of consecutive ids in one pass (see steps.Stepper)
            busy = {s.seq_id for s in self.slots if s.busy} | {s.seq_id for s in taken}
            return min(empty, key=lambda s: (_runs(busy | {s.seq_id}), s.seq_id)), False
        return min(free, key=lambda s: s.last_used), False

    def _named(self, job: Job, taken: set[Slot]) -> tuple[Slot, bool] | None:
        """The slot a job names (llama-server's ``id_slot``, modulo the
        slots as llama-server takes it), or None while it is busy. It holds
        the same conversation when it is the owner's and the prompt extends
        its previous one (or carries its session key)."""
        cfg = job.config
        slot = self.slots[(cfg.slot or 0) % len(self.slots)]
        if slot.busy or slot in taken:
            return None
        mine = slot.owner == cfg.owner and bool(slot.tokens)
        if cfg.session_key is not None and slot.session_key is not None:
            return slot, mine and slot.session_key == cfg.session_key
        return slot, mine and self.prefix_reuse and _holds_prefix_of(slot, job.prompt)

    # ---------------------------------------------------------------- reuse
    def prepare(self, job: Job, slot: Slot, extension: bool) -> Placement:
        """Make ``slot``'s KV hold as much of the job's prompt as the slots
        and the host tier offer (the rest is prefilled), saving the
        conversation it evicts to the host tier, and record the job in it."""
        cfg = job.config
        records = self.records_shared(job)
        miss_at = _miss_at(records, job.prompt)
        evicted = self.evict(slot, extension)
        reuse = 0
        if self.prefix_reuse and slot in records:
            reuse = min(records[slot], len(job.prompt) - 1)
        reused_from = "slot"
        source, shared = self.copy_source(job, slot, reuse, records)
        saved, restore = self.host_source(job, max(reuse, shared))
        if saved >= 0:
            reuse = self.restore_from_host(saved, slot, restore)
            reused_from = "host"
        elif source is not None:
            reuse = self.copy_prefix(source, slot, shared)
            reused_from = "copy"
        elif reuse < len(slot.tokens):
            if not self.ctx.seq_rm(slot.seq_id, reuse, -1):
                self.ctx.seq_rm(slot.seq_id)
                reuse = 0
        slot.tokens = job.prompt[:reuse]
        slot.prompt_len = len(job.prompt)
        slot.owner = cfg.owner
        slot.session_key = cfg.session_key
        return Placement(reuse, reused_from, evicted, miss_at)

    def trim(self, slot: Slot, prompt: list[int], n: int) -> int:
        """Keep only the first ``n`` positions of ``slot``'s KV (its record
        the prompt's first ``n``); returns the tokens it holds (0 when the
        memory cannot drop a part: it is then emptied)."""
        if not self.ctx.seq_rm(slot.seq_id, n, -1):
            self.ctx.seq_rm(slot.seq_id)
            n = 0
        slot.tokens = prompt[:n]
        return n

    def evict(self, slot: Slot, extension: bool) -> bool:
        """Whether taking ``slot`` for another conversation (not an
        ``extension`` of its own) evicts the state it holds; that state
        moves to the host tier."""
        evicted = bool(slot.tokens) and not extension
        if evicted and self.host.enabled:
            self.save_to_host(slot)  # the conversation it held moves to the host tier
        return evicted

    def records_shared(self, job: Job) -> dict[Slot, int]:
        """How much of the prompt each record of the job's owner shares with
        it (every slot holding tokens), computed once per admission: the own
        slot's reuse, the copy source and ``prefixMissAt`` all read it."""
        owner, prompt = job.config.owner, job.prompt
        return {s: common_prefix(s.tokens, prompt) for s in self.slots if s.owner == owner and s.tokens}

    def copy_source(self, job: Job, dst: Slot, own: int, records: dict[Slot, int]) -> tuple[Slot | None, int]:
        """The other slot of the job's owner whose record shares the longest
        prefix with the prompt (a parked conversation, or a running one's
        record: exactly what its KV holds so far), with that prefix's length
        (capped at prompt length - 1), when copying it is worth it: at least
        ``copy_min_tokens``, at least ``copy_min_share`` of the prompt, and
        longer than the ``own`` tokens ``dst`` already shares. Else (None, 0)."""
        if not (self.prefix_reuse and self.kv_copy):
            return None, 0
        prompt = job.prompt
        limit = len(prompt) - 1
        need = max(self.copy_min_tokens, math.ceil(self.copy_min_share * len(prompt)), own + 1, 1)
        if need > limit:
            return None, 0
        best: Slot | None = None
        best_n = 0
        for s, shared in records.items():
            if s is dst or len(s.tokens) < need:
                continue
            n = min(shared, limit)
            # ties: the smaller record (less to copy)
            if n >= need and (n > best_n or (best is not None and n == best_n and len(s.tokens) < len(best.tokens))):
                best, best_n = s, n
        return best, best_n

    def copy_prefix(self, src: Slot, dst: Slot, n: int) -> int:
        """Make ``dst``'s KV hold ``src``'s first ``n`` positions; ``src``
        keeps all of its own. With one KV stream per sequence llama.cpp
        copies whole streams only (the data moves at the start of the next
        decode, before anything is written, so it is what ``src.tokens``
        says now): copy the whole sequence, then drop ``dst``'s part past
        ``n``. Returns the tokens ``dst`` now holds: ``n``, or 0 when the
        memory cannot drop a partial sequence (``dst`` is then emptied)."""
        ctx = self.ctx
        ctx.seq_rm(dst.seq_id)
        ctx.seq_cp(src.seq_id, dst.seq_id)
        if ctx.seq_rm(dst.seq_id, n, -1):
            log.debug("copied %d tokens of KV from slot %d into slot %d", n, src.seq_id, dst.seq_id)
            return n
        ctx.seq_rm(dst.seq_id)
        return 0

    # ---------------------------------------------------------- slot actions
    def _target(self, slot_id: int, owner: str | None) -> Slot:
        """The slot a save, restore or erase acts on: it exists, runs no job
        and (unless ``owner`` is None: an admin) is the owner's or empty."""
        if not 0 <= slot_id < len(self.slots):
            raise SlotActionError(f"there is no slot {slot_id} (slots 0-{len(self.slots) - 1})", "not_found")
        slot = self.slots[slot_id]
        if slot.busy:
            raise SlotActionError(f"slot {slot_id} is processing a request; try again when it is idle", "busy")
        if owner is not None and slot.tokens and slot.owner != owner:
            raise SlotActionError(f"slot {slot_id} holds another tenant's conversation", "forbidden")
        return slot

    def save_slot(self, slot_id: int, owner: str | None) -> SavedState:
        """What ``slot_id`` holds (its record and its sequence's state), to
        be written to a file (the engine thread)."""
        slot = self._target(slot_id, owner)
        if not slot.tokens:
            raise SlotActionError(f"slot {slot_id} holds nothing to save")
        return SavedState(slot.owner, list(slot.tokens), self.ctx.seq_state(slot.seq_id), slot.prompt_len)

    def restore_slot(self, slot_id: int, entry: SavedState, owner: str | None) -> int:
        """Load a saved record into ``slot_id`` (what it held moves to the
        host tier, as an eviction does); its record becomes the saved one,
        so a next prompt that extends those tokens reuses them. The state
        must restore and end where its tokens say (as ``restore_from_host``
        checks), else the slot is left empty. Returns the tokens restored."""
        slot = self._target(slot_id, owner)
        if owner is not None and entry.owner != owner:
            raise SlotActionError("this record was saved by another tenant", "forbidden")
        self.evict(slot, False)
        ctx = self.ctx
        ctx.seq_rm(slot.seq_id)
        self._clear(slot)
        if not (ctx.set_seq_state(slot.seq_id, entry.state) and ctx.seq_pos_max(slot.seq_id) == len(entry.tokens) - 1):
            ctx.seq_rm(slot.seq_id)
            raise SlotActionError("the saved slot would not restore into this model's context")
        slot.tokens, slot.owner, slot.prompt_len = list(entry.tokens), entry.owner, entry.prompt_len
        slot.last_used = time.time()
        return len(entry.tokens)

    def erase_slot(self, slot_id: int, owner: str | None) -> int:
        """Remove ``slot_id``'s KV and empty its record; returns the tokens
        it held."""
        slot = self._target(slot_id, owner)
        n = len(slot.tokens)
        self.ctx.seq_rm(slot.seq_id)
        self._clear(slot)
        return n

    @staticmethod
    def _clear(slot: Slot) -> None:
        slot.tokens, slot.owner, slot.session_key, slot.prompt_len = [], "", None, 0

    # ------------------------------------------------------------ host tier
    def save_to_host(self, slot: Slot) -> None:
        """Keep a slot's state in the host tier before another conversation
        takes the slot (a state larger than the whole budget is dropped)."""
        try:
            state = self.ctx.seq_state(slot.seq_id)
        except Exception:  # never fail a request over the second tier
            log.exception("saving slot %d to the host tier failed", slot.seq_id)
            return
        self.host.put(slot.owner, slot.tokens, state, slot.prompt_len)

    def host_source(self, job: Job, have: int) -> tuple[int, int]:
        """(key, prefix) of the job owner's saved state sharing the longest
        prefix with the prompt, when it beats the ``have`` tokens a slot
        offers by at least ``HOST_MIN_TOKENS``; else (-1, 0)."""
        if not self.host.enabled or not len(self.host):
            return -1, 0
        key, n = self.host.best(job.config.owner, job.prompt)
        n = min(n, len(job.prompt) - 1)
        if key < 0 or n < have + HOST_MIN_TOKENS:
            return -1, 0
        return key, n

    def restore_from_host(self, key: int, dst: Slot, n: int) -> int:
        """Load a saved state into ``dst`` and keep its first ``n``
        positions; returns the tokens ``dst`` holds (0 if that failed)."""
        ctx = self.ctx
        ctx.seq_rm(dst.seq_id)
        entry = self.host.get(key)
        # the state must end where its tokens say: the next decode continues
        # there (one that does not fails llama_decode for every sequence in
        # the step). (Its first position is not checked: a sliding-window
        # cache reports the window's.)
        if ctx.set_seq_state(dst.seq_id, entry.state) and ctx.seq_pos_max(dst.seq_id) == len(entry.tokens) - 1:
            if ctx.seq_rm(dst.seq_id, n, -1):
                log.debug("restored %d tokens of KV from the host tier into slot %d", n, dst.seq_id)
                return n
            ctx.seq_rm(dst.seq_id)  # a memory that cannot keep a part: the record stays for a whole match
            return 0
        log.warning("%s: a saved KV record would not restore; dropped", self.name)
        self.host.discard(key)  # never tried again, nor kept on disk
        ctx.seq_rm(dst.seq_id)
        return 0

    def load_host(self, folder: str) -> None:
        """Take the folder (one server at a time) and read its records; a
        folder that cannot keep them, or another server's, leaves the tier in
        memory only, with a warning (never a reason to fail the model)."""
        problem = folder_problem(folder)
        lock = FolderLock(folder)
        if problem is None:
            problem = lock.acquire()
        if problem is not None:
            log.warning("%s: KV cache folder %s: %s; the host tier is kept in memory only", self.name, folder, problem)
            self.cache_dir = None
            return
        self._folder_lock = lock
        try:
            n = self.host.load(folder)
        except Exception:  # noqa: BLE001 - the second tier never fails the model
            log.exception("%s: reading the KV records in %s failed", self.name, folder)
            return
        if n:
            log.info("%s: %d saved KV record(s) loaded from %s", self.name, n, folder)

    def persist_host(self, folder: str) -> None:
        """Park every slot's record in the host tier, then write the tier to
        ``folder`` (the scheduler thread, on its way out: it owns the KV)."""
        self.mark_closing()
        try:
            for slot in self.slots:
                if slot.tokens:
                    self.save_to_host(slot)
            n = self.host.persist(folder)
            log.info("%s: %d KV record(s) kept in %s", self.name, n, folder)
        except Exception:  # never fail a shutdown over the second tier
            log.exception("keeping the KV records in %s failed", folder)
        finally:
            if self._folder_lock is not None:
                self._folder_lock.release()

    def mark_closing(self) -> None:
        """A next load of this model waits for this one's records to be
        written (any thread)."""
        if self._folder_lock is not None:
            self._folder_lock.closing = True
