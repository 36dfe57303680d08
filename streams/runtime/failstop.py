"""Fail-stop: a fault the worker cannot handle stops it, never a restart around lost state.

Faust's supervisor restarts an agent whose body raised. For this worker that is the worst
outcome there is: the batch in hand was applied to the cache, its states were not written
(a full disk), and the restarted agent goes on from the next record, publishing predictions
that no stored state backs under ids a replay also gives. So every exception that escapes
the agent, the timers, the changelog's restore or the lookup API's feed reaches `FailStop.stop`
instead, which:

- logs what happened (with the traceback when it is a bug) and writes one line to stderr
  naming the fault and what to do;
- exits the process at once (`os._exit`) with the fault's code (streams/settings/exits.py;
  docs/operations.md "Exit codes"), so a process supervisor restarts it.

Exiting at once is the crash the durability tests already prove safe (a SIGKILL at every step
of a batch, tests/integration/test_durability.py): inputs are acked only once their states'
changelog records are acknowledged, so nothing is acked beyond what is durable, and a restart
re-applies the rest and re-sends its outputs with the same ids. A graceful stop would instead
run the agent's and Faust's shutdown over state it can no longer trust.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, NamedTuple, NoReturn, TextIO

from aiokafka.errors import KafkaError

from streams.faust.patches import StoreError
from streams.runtime.restored import StateNotRestored
from streams.settings.exits import EXIT_RESTART, EXIT_SOFTWARE, EXIT_STORAGE, EXIT_UNAVAILABLE

log = logging.getLogger("oracular.worker")


class Fault(NamedTuple):
    """A kind of fault: its name in the stop line and /metrics, exit code and remedy."""

    kind: str
    code: int
    remedy: str


STORAGE: Final = Fault(
    "storage",
    EXIT_STORAGE,
    "free space on the datadir's disk (or fix the disk), then restart the worker: its state "
    "is restored from the changelog where the local copy lacks it",
)
CORRUPT: Final = Fault(
    "corrupt store",
    EXIT_RESTART,
    "restart the worker: it restores the partition from the changelog",
)
UNRESTORED: Final = Fault(
    "state not restored",
    EXIT_RESTART,
    "restart the worker (a supervisor does): the next assignment restores the partitions",
)
BROKER: Final = Fault(
    "broker",
    EXIT_UNAVAILABLE,
    "check the broker (`make broker-up` for the local one) and restart the worker: whatever "
    "was not acknowledged is applied again, with the same output ids",
)
BUG: Final = Fault(
    "internal error",
    EXIT_SOFTWARE,
    "restart the worker (nothing unacknowledged is lost) and report this line with the log "
    "above it",
)
FAULTS: Final = (STORAGE, CORRUPT, UNRESTORED, BROKER, BUG)


def fault_of(exc: BaseException) -> Fault:
    """The kind of fault `exc` is."""
    if isinstance(exc, StoreError):
        return CORRUPT if exc.corrupt else STORAGE
    if isinstance(exc, StateNotRestored):
        return UNRESTORED
    if isinstance(exc, KafkaError):
        return BROKER
    if isinstance(exc, OSError) and exc.errno is not None:
        return STORAGE  # ENOSPC, EIO, EROFS, EDQUOT: the disk, not the code
    return BUG


def one_line(exc: BaseException) -> str:
    """`exc` as `Type: first line of its message`."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class FailStop:
    """Stops the process on a fault (see the module's docstring); one per process."""

    def __init__(
        self,
        *,
        exit_process: Callable[[int], Any] = os._exit,
        stderr: TextIO | None = None,
    ) -> None:
        self._exit = exit_process
        self._stderr = stderr
        self.set_aside: Callable[[int], Path | None] | None = None
        """Moves a partition's local copy aside (set by the runtime, which knows the table)."""
        self.stopping: Fault | None = None
        """The fault the worker is stopping for (None: none)."""

    def stop(self, where: str, exc: BaseException) -> NoReturn:
        """Stop the process because of `exc`, raised in `where` (the agent, a timer, ...)."""
        fault = fault_of(exc)
        if self.stopping is not None:  # a second fault while the first one's line is written
            self._exit(self.stopping.code)
            raise SystemExit(self.stopping.code)  # only when `exit` returns (tests)
        self.stopping = fault
        detail = one_line(exc)
        if fault is CORRUPT and isinstance(exc, StoreError) and exc.partition is not None:
            detail += self._set_aside(exc.partition)
        log.critical(
            "stopping the worker: %s in %s: %s",
            fault.kind,
            where,
            detail,
            exc_info=exc if fault is BUG else None,
        )
        # The process's own stderr: Faust's worker redirects `sys.stderr` into its log.
        stderr = self._stderr or sys.__stderr__ or sys.stderr
        print(
            f"oracular worker: stopped ({fault.kind} in {where}: {detail}): {fault.remedy} "
            f"(exit {fault.code})",
            file=stderr,
            flush=True,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit(fault.code)
        raise SystemExit(fault.code)  # only when `exit` returns (tests)

    def _set_aside(self, partition: int) -> str:
        """Move partition's corrupt copy aside; what to add to the stop line."""
        if self.set_aside is None:
            return ""
        try:
            target = self.set_aside(partition)
        except OSError as exc:
            return f" (setting its copy aside failed: {exc}; delete it by hand)"
        return "" if target is None else f" (partition {partition}'s copy moved to {target})"

    def guarded(
        self, where: str
    ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        """A decorator: the coroutine function (an agent, a timer, a task) stops the process
        when an exception escapes it, instead of letting Faust log it or restart it."""

        def guard(body: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            @functools.wraps(body)  # Faust names agents and reads timers' signatures from it
            async def run_guarded(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await body(*args, **kwargs)
                except (asyncio.CancelledError, SystemExit, KeyboardInterrupt, GeneratorExit):
                    raise  # a stop under way, or an exit already decided
                except BaseException as exc:
                    self.stop(where, exc)

            return run_guarded

        return guard


FAIL_STOP: Final = FailStop()
"""The process's one FailStop."""
