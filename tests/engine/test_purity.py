"""engine/ is pure: it imports only a small set of standard-library modules and itself.

No clock, no randomness, no I/O: the same inputs must give the same states on every machine,
in a replay as in the live stream processor. These tests read the source with `ast`, so they
see every import, also one inside a function or under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"

ALLOWED_STDLIB = frozenset(
    {
        "__future__",
        "bisect",
        "collections",
        "collections.abc",
        "dataclasses",
        "decimal",  # exact decimal arithmetic: duration strings such as 1.001s (durations.py)
        "enum",
        "functools",
        "heapq",
        "itertools",
        "logging",
        "math",
        "operator",
        "re",
        "struct",
        "sys",
        "typing",
    }
)
"""Standard-library modules engine/ may import, by exact name (a submodule needs its own entry)."""

IMPURE = frozenset(
    {
        # clocks
        "time",
        "datetime",
        "calendar",
        "zoneinfo",
        "sched",
        "asyncio",
        "threading",
        # randomness
        "random",
        "secrets",
        "uuid",
        "hashlib",
        "numpy",
        # I/O: files, environment, processes, network
        "os",
        "io",
        "pathlib",
        "shutil",
        "tempfile",
        "glob",
        "subprocess",
        "socket",
        "urllib",
        "http",
        "sqlite3",
        "pickle",
        "json",
        "importlib",
        "builtins",
    }
)
"""Modules that would bring a clock, randomness or I/O into the engine."""

IMPURE_CALLS = frozenset({"open", "input", "print", "__import__", "eval", "exec", "breakpoint"})
"""Builtins that do I/O or import/run code the import checks cannot see."""


def _engine_files() -> list[Path]:
    files = sorted(ENGINE.rglob("*.py"))
    assert files, f"no Python files found under {ENGINE}"
    return files


def _imports(path: Path) -> Iterator[tuple[int, str, str]]:
    """Yield (line, imported module, the statement as written) for every import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            dots = "." * node.level
            module = node.module or ""
            names = ", ".join(alias.name for alias in node.names)
            yield node.lineno, dots + module, f"from {dots}{module} import {names}"


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ENGINE.parent)}:{line}"


def _is_engine(module: str, path: Path) -> bool:
    """True for `engine` / `engine.x`, and for a relative import that stays inside engine/."""
    if module.startswith("."):
        level = len(module) - len(module.lstrip("."))
        depth = len(path.relative_to(ENGINE).parts) - 1  # package levels below engine/
        return level <= depth + 1
    return module == "engine" or module.startswith("engine.")


def test_engine_imports_only_allowlisted_standard_library_modules_and_itself():
    """Every import in engine/ is an allowlisted stdlib module or part of the engine package."""
    problems = [
        f"{_where(path, line)}: `{statement}` imports {module!r}, which is neither the engine "
        f"nor an allowed standard-library module ({', '.join(sorted(ALLOWED_STDLIB))})"
        for path in _engine_files()
        for line, module, statement in _imports(path)
        if module not in ALLOWED_STDLIB and not _is_engine(module, path)
    ]
    assert not problems, "engine/ must stay stdlib-only and pure:\n" + "\n".join(problems)


def test_engine_never_imports_a_clock_randomness_or_io():
    """engine/ imports no clock (time, datetime), no randomness (random, uuid) and no I/O (os)."""
    problems = [
        f"{_where(path, line)}: `{statement}` brings {module.split('.')[0]!r} into the engine; "
        "engine/ must not read a clock, draw random numbers or do I/O (take times as `at` "
        "arguments and leave I/O to the stream processor)"
        for path in _engine_files()
        for line, module, statement in _imports(path)
        if module.lstrip(".").split(".")[0] in IMPURE
    ]
    assert not problems, "\n".join(problems)


def test_engine_never_calls_builtins_that_do_io_or_import_code():
    """engine/ never calls open, print, input, __import__, eval, exec or breakpoint."""
    problems = []
    for path in _engine_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in IMPURE_CALLS
            ):
                problems.append(
                    f"{_where(path, node.lineno)}: calls {node.func.id}(), which does I/O or "
                    "runs code the import checks cannot see"
                )
    assert not problems, "\n".join(problems)
