"""What the bench ran on: the machine, the code, the broker's version, other test runs."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

from bench.workers import ROOT


def pytest_processes() -> list[str]:
    """Command lines of running pytest processes: other people's test runs on this box."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if "pytest" in cmdline and "python" in cmdline:
            found.append(f"{proc.name} {cmdline[:120]}")
    return found


def machine() -> str:
    """One line about the machine."""
    import platform  # noqa: PLC0415

    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return (
        f"{platform.machine()}, {cpu}, {os.cpu_count()} cores, {memory / 2**30:.0f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def kafka_version() -> str:
    """The Kafka version the broker runs (infra/pom.xml)."""
    match = re.search(r"<kafka.version>([^<]+)<", (ROOT / "infra" / "pom.xml").read_text())
    return match.group(1) if match else "?"


def code_version(root: Path) -> str:
    """The commit the workers ran, and whether their code had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "streams", "engine", "schemas"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"commit {head}" + (" with uncommitted changes in the product" if dirty else "")
