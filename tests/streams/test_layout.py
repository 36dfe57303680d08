"""The layout of streams/ (streams/README.md): which sub-package may import which, no import
cycle between modules, no import inside a function to dodge one, and nothing of the dev
harness (infra/, bench/, tests/) imported by the product."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

STREAMS = Path(__file__).resolve().parents[2] / "streams"

ALLOWED = {
    "cli": {"worker", "tools", "runtime", "lookup", "settings"},
    "worker": {"runtime", "lookup", "settings"},
    "tools": {"runtime", "settings"},
    "runtime": {"faust", "settings"},
    "lookup": {"faust", "settings", "runtime"},
    "faust": set(),
    "settings": set(),
}
"""Sub-package (or top-level module: `worker`) -> the others it may import (streams/README.md
draws the same). One way only: `lookup/` reads `runtime/`, never the reverse; the worker
(`streams/worker.py`) joins the two."""

LATE_IMPORTS = {"cli"}
"""Where a module of the product may be imported inside a function: the commands import what
they run only when they run (`oracular replay` loads no Faust). Never to dodge a cycle: the
module graph of top-level imports has none, and these add none."""


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(STREAMS.rglob("*.py")):
        parts = path.relative_to(STREAMS.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def imports(path: Path) -> Iterator[tuple[str, bool]]:
    """(module imported, at the top level?) of every import of the file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            yield name, id(node) in top


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_sub_packages_import_only_what_the_layout_allows():
    known = dict(modules())
    problems = []
    for name, path in known.items():
        for imported, _ in imports(path):
            if imported.split(".")[0] in {"infra", "bench", "tests"}:
                problems.append(f"{name} imports the dev harness: {imported}")
            if imported not in known or not package(name):
                continue
            mine, theirs = package(name), package(imported)
            if theirs and theirs != mine and theirs not in ALLOWED[mine]:
                problems.append(f"{name} imports {imported}: {mine}/ may not import {theirs}/")
    assert problems == []


def test_the_packages_depend_on_each_other_one_way():
    """No two packages may import each other: the layout is a stack, read from the top."""
    both_ways = sorted(
        f"{mine} <-> {theirs}"
        for mine, allowed in ALLOWED.items()
        for theirs in allowed
        if mine < theirs and mine in ALLOWED.get(theirs, set())
    )
    assert both_ways == []


def test_no_import_cycle_between_modules_and_late_imports_only_where_allowed():
    known = dict(modules())
    graph: dict[str, set[str]] = {name: set() for name in known}
    late = []
    for name, path in known.items():
        relative = path.relative_to(STREAMS).as_posix()
        for imported, at_top in imports(path):
            if imported not in known or imported == name:
                continue
            if at_top:
                graph[name].add(imported)
            elif not any(relative.startswith(where) for where in LATE_IMPORTS):
                late.append(f"{name} imports {imported} inside a function")
    assert late == []
    # Depth-first search for a back edge.
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend([*trail, node, nxt])
                return True
            if nxt not in state and visit(nxt, [*trail, node]):
                return True
        state[node] = 2
        return False

    for node in sorted(graph):
        if node not in state and visit(node, []):
            break
    assert cycle == []


def test_every_sub_package_opens_with_a_two_line_docstring():
    for name, path in known_packages():
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        opening = doc.split("\n\n")[0].strip().splitlines()
        assert len(opening) == 2, f"{name}: {opening}"


def known_packages() -> Iterator[tuple[str, Path]]:
    for name, path in modules():
        if path.name == "__init__.py" and name != "streams":
            yield name, path
