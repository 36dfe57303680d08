"""The CPUs reserved for the lookup API (`ORACULAR_API_CPUS`): a settings value, parsed and
checked here, and applied by the worker (`streams.lookup.replica.Feed`).

Reserved CPUs are the API process's alone: it is pinned to them, and the worker's own threads
are pinned to the CPUs it may use but those. On a machine whose cores the worker keeps busy, a
lookup then never waits for a core behind a batch, and never takes one from processing
(BENCHMARKS.md, *A core for the lookup API*).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def parse_cpus(text: str) -> frozenset[int]:
    """A CPU list as `taskset -c` and /sys write them: `3`, `2-3`, `0,4-5`.

    Raises:
        ValueError: anything else, or an empty list (the message says which part).
    """
    cpus: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        first, dash, last = part.partition("-")
        if not (first.isascii() and first.isdigit()) or (
            dash and not (last.isascii() and last.isdigit())
        ):
            msg = f"{part!r} is not a CPU number or range (write e.g. 3, 2-3 or 0,4-5)"
            raise ValueError(msg)
        low, high = int(first), int(last) if dash else int(first)
        if high < low or high >= 1 << 16:
            msg = f"{part!r} is not a CPU range (low-high, high below 65536)"
            raise ValueError(msg)
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def check_cpus(text: str) -> str | None:
    """The problem with `text` as the API's reserved CPUs on this machine, or None."""
    if not hasattr(os, "sched_setaffinity"):
        return "CPU affinity is not supported on this platform (Linux only)"
    try:
        cpus = parse_cpus(text)
    except ValueError as exc:
        return str(exc)
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        return (
            f"CPUs {format_cpus(cpus - allowed)} are not among those this process may use "
            f"({format_cpus(allowed)})"
        )
    if not allowed - cpus:
        return (
            f"reserving CPUs {format_cpus(cpus)} leaves the worker none of the CPUs it may use "
            f"({format_cpus(allowed)})"
        )
    return None


def format_cpus(cpus: set[int] | frozenset[int]) -> str:
    """`cpus` as a CPU list (`0-2,5`): the form `parse_cpus` reads."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive CPUs
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def pin_process(pid: int, cpus: set[int] | frozenset[int]) -> None:
    """Every thread of process `pid` on `cpus` (threads it starts later inherit them from the
    thread that starts them). A thread that ended meanwhile is skipped."""
    try:
        tasks = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:  # no /proc: the process's first thread is the process
        tasks = [pid]
    for task in tasks:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(task, cpus)


def reserve_cpus(text: str | None) -> frozenset[int] | None:
    """ORACULAR_API_CPUS, applied in the worker: its threads (and those it starts later,
    which inherit it) keep off the CPUs reserved for its API process; returns them (None:
    unset) for the worker to pin the API process to when it starts it."""
    if text is None:
        return None
    reserved = parse_cpus(text)
    pin_process(os.getpid(), os.sched_getaffinity(0) - reserved)
    return reserved


def cpus_line(reserved: frozenset[int] | None) -> str:
    """What the worker's log says of the CPUs (after the API process's pid): "" when unset."""
    if reserved is None:
        return ""
    return (
        f", on CPUs {format_cpus(reserved)} (ORACULAR_API_CPUS); this worker on CPUs "
        f"{format_cpus(os.sched_getaffinity(0))}"
    )
