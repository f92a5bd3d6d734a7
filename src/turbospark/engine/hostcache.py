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
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

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

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size

    def snapshot(self) -> dict[str, int]:
        return {
            "budget_bytes": self.budget,
            "bytes": self.bytes,
            "entries": len(self._entries),
            "saved": self.saved,
            "restored": self.restored,
            "evicted": self.evicted,
        }
