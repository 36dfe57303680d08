"""Every repository path, `make` target, `oracular` subcommand and flag, and `python -m` module
quoted in the Markdown docs exists (README.md, docs/*.md, the packages' READMEs, BENCHMARKS.md
and CHANGELOG.md's Unreleased section; released entries describe the past and stay as written, as
do entries recording a removal or a rename).
The product's docs and code cite no file that is not in the repository.
The docs quote measured rates and latencies only from BENCHMARKS.md's "Current figures" table.

Checked: every word of an inline code span or a fenced code block, every relative Markdown
link, and every path in running text (`docs/x.md`, `streams/x.py`, `NAME.md`). A quoted word is
taken as a repository path when its first segment is a top-level entry of the repository
(`streams/runtime/app.py`, `docs/time.md`, `examples/oracular.yaml`, `Makefile`); a link is resolved
from its page. Paths under var/ and .cache/ are made at run time and not checked; a `*` in a
path must match at least one file.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from streams.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
)
"""Every Markdown file of the repository: README.md, docs/*.md, CHANGELOG.md, BENCHMARKS.md,
the packages' READMEs."""
RUNTIME_DIRS = ("var/", ".cache/", ".venv/")

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")
ORACULAR = re.compile(  # a command line: at a line's start (after `$ `, VAR=value) or a pipe
    r"(?:^\s*(?:\$\s+)?|[|;&(]\s*)(?:[A-Z_]+=\S*\s+)*(?:[\w./-]*/)?oracular "
    r"([a-z][\w-]*)(?![\w:-])((?:[ \t]+[^\s|;&`()]+)*)",
    re.MULTILINE,
)
LOG_LINES = ("oracular lookup API on",)
"""Quoted log lines that read like a command (a `COMMAND:` line never does)."""
PYTHON_M = re.compile(r"python(?:3(?:\.\d+)?)? -m ([\w.]+)")


@cache
def tracked() -> frozenset[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return frozenset(out.splitlines())


@cache
def roots() -> frozenset[str]:
    return frozenset(p.split("/")[0] for p in tracked())


def exists(path: str) -> bool:
    """A tracked file, or a directory holding one; a glob matching one."""
    path = path.rstrip("/")
    if "*" in path:
        pattern = re.compile(re.escape(path).replace(r"\*", "[^/]*") + "(/.*)?")
        return any(pattern.fullmatch(p) for p in tracked())
    return path in tracked() or any(p.startswith(path + "/") for p in tracked())


def unreleased(text: str) -> str:
    """CHANGELOG.md up to its first released version."""
    released = re.search(r"^## \[?\d", text, re.MULTILINE)
    return text[: released.start()] if released else text


def quoted(text: str) -> Iterator[tuple[int, str]]:
    """(line number, code) of every fenced block and inline code span."""
    for block in FENCE.finditer(text):
        yield text.count("\n", 0, block.start(1)) + 1, block.group(1)
    prose = FENCE.sub(blank, text)
    for span in SPAN.finditer(prose):
        yield prose.count("\n", 0, span.start()) + 1, span.group(2)


def blank(match: re.Match[str]) -> str:
    """The match's text with everything but line breaks made spaces (keeps line numbers)."""
    return re.sub(r"[^\n]", " ", match.group(0))


REMOVAL = re.compile(r"\b(removed|no longer|is gone|are gone|renamed|replaced)\b", re.IGNORECASE)


def without_removals(changelog: str) -> str:
    """The changelog with every entry that records a removal or rename blanked out: those name
    what is no longer there on purpose."""
    entry = re.compile(r"^- .*?(?=^- |^#|\Z)", re.MULTILINE | re.DOTALL)
    return entry.sub(lambda m: blank(m) if REMOVAL.search(m.group(0)) else m.group(0), changelog)


def doc_text(doc: str) -> str:
    text = (ROOT / doc).read_text()
    return without_removals(unreleased(text)) if doc == "CHANGELOG.md" else text


def words(code: str) -> Iterator[str]:
    for raw in re.split(r"[\s,;()\[\]\"'=]+", code):
        word = re.sub(r":\d+(-\d+)?$", "", raw.strip(".:").split("#")[0])  # path:line
        if word:
            yield word


def path_problems(doc: str, text: str) -> list[str]:
    problems = []
    for line, code in quoted(text):
        for word in words(code):
            if "://" in word or word.startswith(RUNTIME_DIRS) or "<" in word or "$" in word:
                continue
            first = word.split("/")[0]
            looks_like_path = first in roots() and ("/" in word or "." in first or first.isupper())
            if looks_like_path and not exists(word):
                problems.append(f"{doc}:{line}: `{word}` is not in the repository")
    outside_code = SPAN.sub(blank, FENCE.sub(blank, text))
    for match in prose_paths().finditer(outside_code):
        word = match.group(1)
        if not exists(word):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"{doc}:{line}: {word} is not in the repository")
    for match in LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if not target or "://" in target or target.startswith("mailto:"):
            continue
        line = text.count("\n", 0, match.start()) + 1
        resolved = (ROOT / doc).parent.joinpath(target).resolve()
        try:
            relative = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            problems.append(f"{doc}:{line}: link ({target}) leaves the repository")
            continue
        if not exists(relative):
            problems.append(f"{doc}:{line}: link ({target}) is not in the repository")
    return problems


@cache
def prose_paths() -> re.Pattern[str]:
    """A path in running text: a top-level directory's name, a slash, more; or NAME.md."""
    dirs = sorted(r for r in roots() if "." not in r and r != "Makefile")
    top = "|".join(dirs)
    return re.compile(rf"(?<![\w./<-])((?:{top})/[\w./*-]*[\w*]|[A-Z]+\.md)(?![\w/-])")


@cache
def make_targets() -> frozenset[str]:
    makefile = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([a-zA-Z][\w-]*):", makefile, re.MULTILINE))


@cache
def subcommands() -> dict[str, argparse.ArgumentParser]:
    return _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr,return-value]


def command_problems(doc: str, text: str) -> list[str]:
    problems = []
    for line, code in quoted(text):
        for match in MAKE.finditer(code):
            if match.group(1) not in make_targets():
                problems.append(f"{doc}:{line}: `make {match.group(1)}`: no such Makefile target")
        for match in ORACULAR.finditer(code):
            if code[match.start() :].lstrip().startswith(LOG_LINES):
                continue
            name, rest = match.group(1), match.group(2)
            parser = subcommands().get(name)
            if parser is None:
                problems.append(f"{doc}:{line}: `oracular {name}`: no such subcommand")
                continue
            flags = {s for a in parser._actions for s in a.option_strings}
            nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            words = rest.split()
            if nested and words and words[0] in nested[0].choices:  # `oracular topics delete`
                flags |= {s for a in nested[0].choices[words[0]]._actions for s in a.option_strings}
            for flag in re.findall(r"(?<!\S)(--?[a-z][\w-]*)", rest):
                if flag not in flags:
                    problems.append(f"{doc}:{line}: `oracular {name} {flag}`: no such flag")
        for match in PYTHON_M.finditer(code):
            module = match.group(1).replace(".", "/")
            if not (exists(module + ".py") or exists(module + "/__main__.py")):
                problems.append(f"{doc}:{line}: `python -m {match.group(1)}`: no such module")
    return problems


@pytest.mark.parametrize("doc", DOCS)
def test_quoted_paths_exist(doc: str) -> None:
    assert path_problems(doc, doc_text(doc)) == []


@pytest.mark.parametrize("doc", DOCS)
def test_quoted_commands_exist(doc: str) -> None:
    assert command_problems(doc, doc_text(doc)) == []


def test_the_checks_can_fail() -> None:
    text = (
        "Run `make nope` or `oracular nope`, then `oracular worker --no-such-flag`;\n"
        "read `streams/nope.py`, [that](missing.md) and `tests/engine/test_nope_*.py`.\n"
        "```sh\npython -m streams.nope\n$ oracular replay x.jsonl --config examples/gone.yaml\n"
        "oracular summary: not a command\nthe oracular engine\n```\n"
    )
    assert sorted(command_problems("docs/x.md", text)) == [
        "docs/x.md:1: `make nope`: no such Makefile target",
        "docs/x.md:1: `oracular nope`: no such subcommand",
        "docs/x.md:1: `oracular worker --no-such-flag`: no such flag",
        "docs/x.md:4: `python -m streams.nope`: no such module",
    ]
    assert sorted(path_problems("docs/x.md", text)) == [
        "docs/x.md:2: `streams/nope.py` is not in the repository",
        "docs/x.md:2: `tests/engine/test_nope_*.py` is not in the repository",
        "docs/x.md:2: link (missing.md) is not in the repository",
        "docs/x.md:4: `examples/gone.yaml` is not in the repository",
    ]
    assert path_problems("README.md", "as docs/nope.md and NOTES.md say") == [
        "README.md:1: docs/nope.md is not in the repository",
        "README.md:1: NOTES.md is not in the repository",
    ]
    log = "## [Unreleased]\n- `docs/gone.md` removed.\n- See `docs/nope.md`.\n## [0.1]\n- `docs/x`"
    assert path_problems("CHANGELOG.md", without_removals(unreleased(log))) == [
        "CHANGELOG.md:3: `docs/nope.md` is not in the repository"
    ]
    fine = "`make lint`, `oracular worker --processes 2`, `docs/time.md`, [t](time.md)"
    assert path_problems("docs/x.md", fine) == command_problems("docs/x.md", fine) == []


CITATIONS = re.compile(
    r"shared/|\bseed/|SPEC\.md|DESIGN\.md|research notes|section [A-Z]\b|"
    r"the project's shared notes|reference page",
)


def test_nothing_cites_files_outside_the_repository() -> None:
    """Docs, code and comments explain the model themselves instead of citing notes the
    repository does not hold."""
    problems = []
    for path in sorted(tracked()):
        if not path.endswith((".py", ".md", ".toml", ".yaml", ".yml", ".sh", "Makefile")):
            continue
        if path in {"tests/test_doc_references.py", "CHANGELOG.md"}:
            continue
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1):
            if CITATIONS.search(line):
                problems.append(f"{path}:{number}: {line.strip()}")
    assert problems == []


FIGURE_DOCS = [d for d in DOCS if d not in {"BENCHMARKS.md", "CHANGELOG.md"}]
"""The docs that may quote measured figures: all but the benchmark log itself and the changelog
(a record of what each change did at the time)."""
RATE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*(?:events/s\b|events per second|events a second)")
PERCENTILE = re.compile(r"\bp(?:50|90|95|99)\b[^.;|\n]{0,40}?(\d+(?:\.\d+)?)\s*ms\b")


def current_figures() -> set[str]:
    """Every number in BENCHMARKS.md's "Current figures" table (its value column)."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    section = re.search(r"^## Current figures\n(.*?)(?=^#)", text, re.MULTILINE | re.DOTALL)
    assert section, 'BENCHMARKS.md opens with a "## Current figures" section'
    values = set()
    for row in section.group(1).splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in {"what", "---"}:
            values |= {n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", cells[1])}
    assert values, 'the "Current figures" table has values'
    return values


def figure_problems(doc: str, text: str, figures: set[str]) -> list[str]:
    """Rates (events/s) and latency percentiles a doc quotes that the table does not hold."""
    problems = []
    for pattern in (RATE, PERCENTILE):
        for match in pattern.finditer(text):
            number = match.group(1).replace(",", "")
            if number not in figures:
                line = text.count("\n", 0, match.start()) + 1
                problems.append(
                    f"{doc}:{line}: `{match.group(0)}` is not in BENCHMARKS.md's current "
                    "figures: link to them instead"
                )
    return problems


@pytest.mark.parametrize("doc", FIGURE_DOCS)
def test_docs_quote_figures_only_from_the_current_figures_table(doc: str) -> None:
    """A measured rate or latency in a doc is one of BENCHMARKS.md's current figures (or the
    doc links to them and quotes none), so no doc keeps last week's numbers."""
    assert figure_problems(doc, doc_text(doc), current_figures()) == []


def test_the_figure_check_can_fail() -> None:
    text = "one process: 12,000 events/s, p99 about 31 ms; the table's 16,692 events/s is fine"
    assert figure_problems("docs/x.md", text, {"16692"}) == [
        "docs/x.md:1: `12,000 events/s` is not in BENCHMARKS.md's current figures: link to "
        "them instead",
        "docs/x.md:1: `p99 about 31 ms` is not in BENCHMARKS.md's current figures: link to "
        "them instead",
    ]
