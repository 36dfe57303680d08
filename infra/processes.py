"""Subprocesses with a log file, as the tests and the benchmarks run workers and helpers.

One implementation for all of them: the integration tests' worker fixture
(`tests/integration/support.py` `FaustWorker`, a subclass whose waits fail tests with
AssertionError), the benchmarks (`bench/workers.py`, `bench/lookup.py`, `bench/timers.py`) and
the broker starter (`infra/broker.py` uses `tied_to_parent`, `tail`, `rss_bytes`). It lives in
infra/ because tests and bench both import from here and the product wheel ships neither
(pyproject.toml packages only engine, schemas and streams), so no test code reaches it.

- `LoggedProcess`: start a command tied to this process (it gets SIGTERM if we die), its
  output appended to a log file after a header line per start; wait (blocking or async) for
  a log line such as "Worker ready"; wait for its exit; stop it (SIGTERM, SIGKILL after a
  bound) or kill it.
- `child_env`: the environment a child Python process gets (this checkout first on PYTHONPATH).
- `tied_to_parent`, `tail`: what the broker starter needs too.
- /proc readers: a process's (or process tree's) CPU time, resident and peak memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn, Self

from streams.tools.processes import tied_to_parent as product_tied_to_parent

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_LINE = "Worker ready"
"""What a Faust worker (the product's `oracular worker` included) logs once it processes."""
STOP_TIMEOUT_S = 60.0  # SIGTERM to exit, unless the caller says otherwise
POLL_S = 0.1  # how often a wait looks at the log or the process
LOG_TAIL_LINES = 40  # a log's lines quoted by default
TAIL_LINES = 60  # a process's log lines quoted when a wait for it fails
FAUST_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def tied_to_parent(cmd: list[str]) -> list[str]:
    """`cmd` wrapped so that it gets SIGTERM when the process starting it dies (the product's
    `streams.tools.processes.tied_to_parent`). Test sessions use it, so a pytest run that is
    killed leaves no broker or worker behind."""
    return product_tied_to_parent(cmd, "TERM")


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of the log at `path` (or a note that there is none)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def child_env(
    extra: Mapping[str, str], *, root: Path = REPO_ROOT, drop: str = ""
) -> dict[str, str]:
    """This process's environment (without the variables whose names start with `drop`, if
    given), with the checkout `root` first on PYTHONPATH, unbuffered output, and `extra`."""
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.getenv("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def log_time(line: str) -> float | None:
    """The epoch time of a Faust log line (it logs local time, to the millisecond)."""
    match = FAUST_LOG_TIME.match(line)
    if match is None:
        return None
    stamp, millis = match.group(1).split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


class LoggedProcess:
    """A subprocess tied to this one, in its own session, its output appended to a log file.

    Each `start()` first writes a header line to the log; `log_text(current_run_only=True)`
    reads what came after the last one, so a restarted process (same object, same log) is
    waited on for its own lines. Bounded waits raise `failure` (RuntimeError here; the tests'
    FaustWorker makes it AssertionError) with the log's tail.
    """

    failure: type[Exception] = RuntimeError

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path = REPO_ROOT,
    ) -> None:
        """Prepare; `start()` runs it. `env` is its whole environment (see `child_env`)."""
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_wall = 0.0
        """Wall-clock time (epoch s) just before the last start."""
        self._log_offset = 0

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Self:
        """Start it (own session: a Ctrl-C on us reaches it only through us); do not wait."""
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts}: {' '.join(self.argv)}\n".encode())
            self._log_offset = log.tell()
            self.started_wall = time.time()
            self.process = subprocess.Popen(
                tied_to_parent(self.argv),  # a killed test run or bench leaves nothing behind
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    # --- the log ------------------------------------------------------------------------

    def log_text(self, *, current_run_only: bool = False) -> str:
        """The log (since the last start's header with `current_run_only`); "" if none yet."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset if current_run_only else 0)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def fail(self, what: str) -> NoReturn:
        """Raise `failure`: "<name> <what>; log <path>:" and the log's tail."""
        msg = f"{self.name} {what}; log {self.log_path}:\n{self.log_tail()}"
        raise self.failure(msg)

    def _line(self, text: str, count: int, deadline: float, timeout_s: float) -> str | None:
        """The `count`-th line of this run containing `text`; None if not yet; `failure` if
        the process exited or the deadline passed."""
        lines = [line for line in self.log_text(current_run_only=True).splitlines() if text in line]
        if len(lines) >= count:
            return lines[count - 1]
        if not self.running:
            self.fail(f"exited before {text!r}")
        if time.monotonic() > deadline:
            self.fail(f"logged no {text!r} within {timeout_s:.0f} s")
        return None

    def wait_line(
        self, text: str, timeout_s: float, *, count: int = 1, poll_s: float = POLL_S
    ) -> str:
        """Block until `count` lines of this run contain `text`; return the `count`-th."""
        deadline = time.monotonic() + timeout_s
        while (line := self._line(text, count, deadline, timeout_s)) is None:
            time.sleep(poll_s)
        return line

    async def wait_line_async(
        self, text: str, timeout_s: float, *, count: int = 1, poll_s: float = POLL_S
    ) -> str:
        """`wait_line` without blocking the event loop."""
        deadline = time.monotonic() + timeout_s
        while (line := self._line(text, count, deadline, timeout_s)) is None:
            await asyncio.sleep(poll_s)
        return line

    # --- the end ------------------------------------------------------------------------

    async def wait_exit_async(self, timeout_s: float) -> int:
        """Wait for the process to exit by itself; kill it and fail after `timeout_s`."""
        assert self.process is not None, f"{self.name} was never started"
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.process.kill()
                self.process.wait()
                self.fail(f"did not finish within {timeout_s:.0f} s (killed)")
            await asyncio.sleep(POLL_S)
        return self.process.returncode

    def signal_and_wait(self, sig: signal.Signals, timeout_s: float) -> bool:
        """Send `sig` if it runs and wait for its exit; SIGKILL after `timeout_s`. True if it
        exited within `timeout_s` (or had already), False if it had to be killed."""
        process = self.process
        assert process is not None, f"{self.name} was never started"
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                return False
        return True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a worker flushes, commits and leaves its group), SIGKILL after `timeout_s`
        (said on stderr); the exit code, None if it was never started."""
        if self.process is None:
            return None
        if not self.signal_and_wait(signal.SIGTERM, timeout_s):
            print(
                f"{self.name} did not stop within {timeout_s:.0f} s of SIGTERM; killed it",
                file=sys.stderr,
                flush=True,
            )
        return self.process.returncode

    def kill(self) -> int | None:
        """SIGKILL: no flush, no commit. The exit code, None if it was never started."""
        if self.process is None:
            return None
        self.signal_and_wait(signal.SIGKILL, STOP_TIMEOUT_S)
        return self.process.returncode


# --- /proc --------------------------------------------------------------------------------


def _status_bytes(pid: int, field: str) -> int | None:
    """A memory figure (`field`, in kB) of /proc/<pid>/status, in bytes (None if gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process, from /proc (None if it is gone)."""
    return _status_bytes(pid, "VmRSS")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (None if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def thread_cpus(pid: int) -> set[int]:
    """The CPUs any thread of process `pid` may run on (empty if it is gone)."""
    found: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                found |= os.sched_getaffinity(int(task.name))
    return found


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident memory so far (VmHWM; None if it is gone)."""
    return _status_bytes(pid, "VmHWM")


def process_tree(pid: int) -> list[int]:
    """`pid` and its living descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of `pid` and its living descendants."""
    return sum(cpu_seconds(p) or 0.0 for p in process_tree(pid))


def tree_peak_rss_bytes(pid: int) -> int:
    """Sum of the peak resident memories of `pid` and its living descendants."""
    return sum(peak_rss_bytes(p) or 0 for p in process_tree(pid))


def tree_rss_bytes(pid: int) -> int:
    """Sum of the resident memories of `pid` and its living descendants."""
    return sum(rss_bytes(p) or 0 for p in process_tree(pid))
