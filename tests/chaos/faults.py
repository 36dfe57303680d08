"""The chaos: workers of one app id started, stopped, killed and frozen, and a broker restart.

Every fault is chosen by one seeded RNG and logged with the time since the scenario began, so
a failing run can be replayed (the schedule is the same for the same seed; what the workers
do in between is not). Blocking steps (a start waits for "Worker ready", a SIGTERM for the
exit) run in threads, so production goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tests.integration.support import FaustWorker

FREEZE_MARGIN_S = 4.0
"""A frozen worker is held this long past the session timeout: the group has evicted it."""


@dataclass
class Fleet:
    """The workers of one app id, each with its own datadir and log."""

    workers: list[FaustWorker]
    started: float = field(default_factory=time.monotonic)
    events: list[str] = field(default_factory=list)
    """What happened, in order: "  12.3 s  kill w1"."""
    frozen: set[int] = field(default_factory=set)
    busy: set[int] = field(default_factory=set)
    """Workers a step is acting on right now (starting, stopping, frozen)."""
    down: set[int] = field(default_factory=set)
    """Workers a step stopped or killed (their exit is expected)."""
    unexpected_exits: list[str] = field(default_factory=list)
    failed_steps: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        """Log `text` with the seconds since the run began and the UTC wall time (for logs)."""
        wall = time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"
        line = f"{time.monotonic() - self.started:7.1f} s  {wall}  {text}"
        self.events.append(line)
        print(f"[chaos] {line}", flush=True)

    def name(self, n: int) -> str:
        return f"w{n}"

    def running(self) -> list[int]:
        """Workers whose process runs and that no step is acting on."""
        return [
            n
            for n, w in enumerate(self.workers)
            if w.running and n not in self.busy and n not in self.frozen
        ]

    def stopped(self) -> list[int]:
        return [n for n, w in enumerate(self.workers) if not w.running and n not in self.busy]

    async def restart_fenced(self) -> None:
        """Restart workers that stopped themselves to recover (exit code 75, EX_TEMPFAIL,
        `streams.settings.exits.EXIT_RESTART`: fenced after a freeze, state not restored after a
        broker failover, a corrupt store set aside), as a process supervisor would; the reason
        (the worker's stop line) is noted."""
        for n, worker in enumerate(self.workers):
            process = worker.process
            if n in self.down or n in self.busy or process is None or process.poll() != 75:
                continue
            stops = [
                line
                for line in worker.log_text(current_run_only=True).splitlines()
                if line.startswith("oracular worker: stopped (")
            ]
            why = stops[-1][len("oracular worker: stopped ") :][:160] if stops else "no stop line"
            self.note(f"{self.name(n)} stopped itself to recover (rc 75) {why}: restarting it")
            await self.start(n)

    def check_exits(self) -> None:
        """Record workers that exited on their own (not stopped or killed by a step). Exit 75
        is left to `restart_fenced`: a worker may exit so between its pass and this one."""
        for n, worker in enumerate(self.workers):
            process = worker.process
            if n in self.down or n in self.busy or process is None:
                continue
            if process.poll() in (None, 75):
                continue
            tag = (
                f"{self.name(n)} exited by itself (rc {process.returncode}, start {worker.starts})"
            )
            if tag not in self.unexpected_exits:
                self.unexpected_exits.append(tag)
                self.note(f"{tag}; log {worker.log_path}")

    async def start(self, n: int) -> None:
        self.note(f"start {self.name(n)}")
        self.down.discard(n)
        if await self._step(n, f"start {self.name(n)}", self.workers[n].start):
            self.note(f"{self.name(n)} ready")

    async def stop(self, n: int) -> None:
        self.note(f"SIGTERM {self.name(n)}")
        self.down.add(n)
        if await self._step(n, f"SIGTERM {self.name(n)}", self.workers[n].stop):
            rc = self.workers[n].process.returncode  # type: ignore[union-attr]
            self.note(f"{self.name(n)} exited rc {rc}")

    async def kill(self, n: int) -> None:
        self.note(f"SIGKILL {self.name(n)}")
        self.down.add(n)
        await self._step(n, f"SIGKILL {self.name(n)}", self.workers[n].kill)

    async def _step(self, n: int, what: str, action: Callable[[], object]) -> bool:
        """Run a blocking step in a thread; False (noted) if its bounded wait failed."""
        self.busy.add(n)
        try:
            await asyncio.to_thread(action)
        except AssertionError as exc:  # FaustWorker's bounded waits fail with the log's tail
            first = str(exc).splitlines()[0].rstrip(":")
            self.failed_steps.append(f"{what}: {first}")
            self.note(f"FAILED {what}: {first}")
            self.down.add(n)  # counted here, not again as an unexpected exit
            return False
        finally:
            self.busy.discard(n)
        return True

    def freeze(self, n: int, hold_s: float) -> asyncio.Task[None]:
        """SIGSTOP now, SIGCONT after `hold_s` (a zombie that comes back)."""
        process = self.workers[n].process
        assert process is not None
        self.frozen.add(n)
        os.kill(process.pid, signal.SIGSTOP)
        self.note(f"SIGSTOP {self.name(n)} for {hold_s:.0f} s")

        async def thaw() -> None:
            await asyncio.sleep(hold_s)
            self.thaw(n)

        return asyncio.create_task(thaw())

    def thaw(self, n: int) -> None:
        if n not in self.frozen:
            return
        process = self.workers[n].process
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
        self.frozen.discard(n)
        self.note(f"SIGCONT {self.name(n)}")

    def shutdown(self) -> None:
        """Kill whatever still runs (teardown)."""
        for n in list(self.frozen):
            self.thaw(n)
        for worker in self.workers:
            if worker.running:
                worker.kill()


class Restartable(Protocol):
    """A broker the chaos may restart (tests/chaos/conftest.py RestartableBroker)."""

    def restart(self) -> None: ...


@dataclass
class Chaos:
    """The fault schedule: one step every `gap_s` (random in the range) until told to stop."""

    fleet: Fleet
    rng: random.Random
    session_timeout_s: float
    gap_s: tuple[float, float]
    broker: Restartable | None = None
    """Restart this broker once, when `restart_at_s` (since the start) has passed."""
    restart_at_s: float | None = None
    restarted: bool = False
    thaws: list[asyncio.Task[None]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    first_kinds: list[str] = field(default_factory=list)
    """Fault kinds still to inject once before the choice is free (so every run has each)."""

    def __post_init__(self) -> None:
        self.first_kinds = ["sigterm", "sigkill", "freeze"]
        self.rng.shuffle(self.first_kinds)

    async def run(self, stop: asyncio.Event) -> None:
        """Inject faults until `stop` is set; at least one worker is kept running."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.rng.uniform(*self.gap_s))
            except TimeoutError:
                pass
            else:
                break
            await self.fleet.restart_fenced()
            self.fleet.check_exits()
            if self._broker_due():
                await self._restart_broker()
                continue
            await self._one_fault()

    def _broker_due(self) -> bool:
        elapsed = time.monotonic() - self.fleet.started
        return (
            self.broker is not None
            and not self.restarted
            and self.restart_at_s is not None
            and elapsed >= self.restart_at_s
        )

    async def _restart_broker(self) -> None:
        assert self.broker is not None
        self.fleet.note("broker restart: SIGTERM")
        started = time.monotonic()
        await asyncio.to_thread(self.broker.restart)
        self.restarted = True
        self.fleet.note(f"broker ready again after {time.monotonic() - started:.1f} s")
        self._count("broker restart")

    async def _one_fault(self) -> None:
        fleet, rng = self.fleet, self.rng
        running, stopped = fleet.running(), fleet.stopped()
        choices = ["start"] * 2 * bool(stopped)
        if len(running) >= 2:  # keep one worker applying input
            choices += ["sigterm", "sigkill", "freeze"]
        if not choices:
            return
        kind = rng.choice(choices)
        if kind != "start" and self.first_kinds:  # every kind early, each run
            kind = self.first_kinds.pop()
        self._count(kind)
        if kind == "start":
            await fleet.start(rng.choice(stopped))
        elif kind == "sigterm":
            await fleet.stop(rng.choice(running))
        elif kind == "sigkill":
            await fleet.kill(rng.choice(running))
        else:
            hold = self.session_timeout_s + FREEZE_MARGIN_S
            self.thaws.append(fleet.freeze(rng.choice(running), hold))

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    async def finish(self) -> None:
        """Thaw the frozen and start every stopped worker: the whole fleet runs at the end."""
        for task in self.thaws:
            task.cancel()
        for n in list(self.fleet.frozen):
            self.fleet.thaw(n)
        # As between steps: a worker that stopped itself after the last freeze (rc 75) is
        # restarted as a supervisor would, not counted as an unexpected exit.
        await self.fleet.restart_fenced()
        self.fleet.check_exits()
        for n in self.fleet.stopped():
            await self.fleet.start(n)
