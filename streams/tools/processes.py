"""`oracular worker --processes N`: N worker processes of one app id on one machine.

One Python worker uses one core; a machine with more cores runs more workers of the same app
id, and Kafka's consumer group spreads the input partitions over them (partitions are the
ceiling on parallelism). Each child is an ordinary `oracular worker` with its own datadir
(`<datadir>/p<i>`) and, when the lookup API or Faust's web server is on, its own port (the
base port + i). The parent forwards SIGINT/SIGTERM to every child, waits for them, and exits
with the first non-zero exit code; a child that dies is reported, not restarted (a process
supervisor or orchestrator restarts the whole unit, and the group rebalances meanwhile).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

STOP_TIMEOUT_S = 30.0
"""How long the supervisor waits for its workers after forwarding SIGTERM/SIGINT before it
kills them: shorter than the minute process managers commonly allow before they kill the
supervisor itself, so a worker that hangs while stopping is killed by its own supervisor."""
"""How long the children get to stop cleanly after a signal before they are killed."""


def child_environments(
    n: int, env: Mapping[str, str], default_datadir: Path
) -> list[dict[str, str]]:
    """The environment of each of `n` children: own datadir, own ports (base port + i)."""
    base = Path(env.get("ORACULAR_DATADIR") or default_datadir)
    children = []
    for i in range(n):
        child = dict(env)
        child["ORACULAR_DATADIR"] = str(base / f"p{i}")
        for var in ("ORACULAR_API_PORT", "ORACULAR_WEB_PORT"):
            port = env.get(var)
            if port and port.isdigit() and int(port) != 0:
                child[var] = str(int(port) + i)
        children.append(child)
    return children


def run_processes(
    argv: Sequence[str],
    environments: Sequence[Mapping[str, str]],
    command: str = "worker",
    watch: Callable[[set[int]], bool] | None = None,
) -> int:
    """Start one `oracular <command>` per environment with `argv`; supervise until they end.

    `watch(running)` is called every few tenths of a second with the indexes of the children
    still running; when it returns True, they are stopped as on SIGTERM."""
    children = [
        subprocess.Popen(
            tied_to_parent([sys.executable, "-m", "streams.cli", command, *argv]),
            env=dict(env),
        )
        for env in environments
    ]
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    print(
        f"oracular {command}: {len(children)} processes, pids "
        f"{', '.join(str(c.pid) for c in children)} (datadirs "
        f"{', '.join(e['ORACULAR_DATADIR'] for e in environments)})",
        file=sys.stderr,
    )
    code = 0
    running = set(range(len(children)))
    deadline: float | None = None
    while running:
        for i in sorted(running):
            status = children[i].poll()
            if status is None:
                continue
            running.discard(i)
            if status != 0 and not stopping:
                print(f"oracular {command}: process {i} exited with {status}", file=sys.stderr)
            code = code or status
        if stopping and deadline is None:
            deadline = time.monotonic() + STOP_TIMEOUT_S
        if deadline is not None and time.monotonic() > deadline:
            for i in running:
                children[i].kill()
        if watch is not None and not stopping and running and watch(running):
            forward(signal.SIGTERM, None)
        time.sleep(0.2)
    return code if code >= 0 else 128 - code


def tied_to_parent(cmd: list[str], signal: str = "KILL") -> list[str]:
    """`cmd` run so that it gets `signal` when the process starting it dies: util-linux's
    `setpriv --pdeathsig`, which execs `cmd` in place (same pid); without setpriv, `cmd` as
    it is. (Popen's preexec_fn could call prctl directly, but is unsafe once the parent has
    threads.)

    The supervisor's workers get SIGKILL, not SIGTERM: a supervisor that dies has usually
    been killed for taking too long to stop, and a worker already stopping would ignore a
    second SIGTERM and live on as an orphan (seen in a bench run). A killed worker loses
    nothing: inputs are acknowledged only once applied and stored."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", signal, *cmd] if setpriv else cmd


def main_env() -> dict[str, str]:
    """The current environment, as the children inherit it."""
    return dict(os.environ)
