"""The code's shape (issue 35): rules a reader relies on, checked on the
source itself. A function over 80 lines, a class over 400, an import cycle,
a model asked what it is with getattr/hasattr, or docs past their length
fail here before a review has to find them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "turbospark"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """What a module imports at its top level (not under TYPE_CHECKING or in
    a function: those cannot form a cycle at import time)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out |= {base} & mods.keys()
            out |= {f"{base}.{a.name}" for a in node.names} & mods.keys()
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names} & mods.keys()
    return out - {name}


def test_no_import_cycle():
    mods = _modules()
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_at_most_six_modules_at_the_top():
    """The layers show in the tree: at the top only the public API and the
    entry points; everything else lives in a package of its layer."""
    top = sorted(p.name for p in SRC.glob("*.py") if p.stem != "__init__")
    assert len(top) <= 6, top


def test_every_package_says_what_it_holds():
    """Each package under src/turbospark has an ``__init__.py`` whose
    docstring says what it holds (and what it may import)."""
    missing = []
    for folder in sorted(p for p in SRC.rglob("*") if p.is_dir() and any(p.glob("*.py"))):
        init = folder / "__init__.py"
        if not init.is_file() or not ast.get_docstring(ast.parse(init.read_text())):
            missing.append(str(folder.relative_to(ROOT)))
    assert not missing, missing


#: the rule's limits (issue 35)
MAX_FUNCTION, MAX_CLASS = 80, 400


def test_functions_and_classes_a_person_can_hold():
    long: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if not isinstance(node, ast.ClassDef) and size > MAX_FUNCTION:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} def {node.name} ({size} lines)")
            elif isinstance(node, ast.ClassDef) and size > MAX_CLASS:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} class {node.name} ({size} lines)")
    assert not long, long


def test_no_model_is_asked_what_it_is():
    """The core drives one Backend protocol: no ``takes_messages`` flag, no
    getattr/hasattr on a model, backend or registry entry."""
    probe = re.compile(r"\b(getattr|hasattr)\(\s*(\w+\.)*(model|backend|entry)\b")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "takes_messages" in line or probe.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, found


def test_docs_a_newcomer_reads():
    """README at most 300 lines with exactly two commands in its quick
    start; ARCHITECTURE at most 200 lines with a diagram of the layers."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = quick.split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.split("#")[0].strip()]
    assert commands == ["make serve", "make test"], commands
    architecture = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert len(architecture.splitlines()) <= 200 and "```mermaid" in architecture


def test_every_dialect_is_one_dialect_object():
    """Each wire dialect's module exports ONE ``Dialect`` (its schema,
    translation, renderer factory, error shape and paths); the modules they
    share export none."""
    import importlib

    from turbospark.dialects.base import Dialect

    shared = {"__init__", "base", "common", "errors", "media", "prompts", "render", "stamps", "translate"}
    names = sorted(p.stem for p in (SRC / "dialects").glob("*.py") if p.stem not in shared)
    assert {"anthropic", "llamacpp", "ollama", "openai_chat", "openai_completions", "openai_responses"} <= set(names)
    for name in names:
        module = importlib.import_module(f"turbospark.dialects.{name}")
        assert isinstance(module.Dialect, Dialect), name
        assert module.Dialect.name and module.Dialect.error is not None, name


def test_the_packages_form_a_tower():
    """No package imports one that imports it back (module-level imports):
    the layers read from the top (web/, routes/) down to engine/."""
    mods = _modules()

    def package(name: str) -> str:
        parts = name.split(".")
        return parts[1] if len(parts) > 1 and (SRC / parts[1]).is_dir() else "<top>"

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        graph.setdefault(package(name), set()).update(
            package(dep) for dep in _imports(name, path, mods) if package(dep) != package(name)
        )

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo += graph.get(node, ())
        return False

    loops = sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if reaches(b, a))
    assert not loops, loops
