"""Running the `oracular` command line from tests, the way a user does (a subprocess)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_oracular(
    *args: str, env: Mapping[str, str], timeout: float, cwd: Path = REPO_ROOT
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`python -m streams.cli ARGS` with `env`; the finished process and its seconds."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done, time.monotonic() - started
