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
    try:
        done = subprocess.run(
            [sys.executable, "-m", "streams.cli", *args],
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # say what it was doing when it was stopped
        tail = (exc.stderr or b"")[-4000:]
        text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        command = " ".join(args[:3])
        msg = f"`oracular {command} …` did not finish in {timeout:.0f} s; its stderr:\n{text}"
        raise AssertionError(msg) from exc
    return done, time.monotonic() - started
