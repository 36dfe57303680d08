"""A stop that cannot finish still ends: ORACULAR_SHUTDOWN_TIMEOUT_S.

Faust's stop waits for every delivered record to be acknowledged (`wait_empty`) and for the
producer's buffer to flush, with no bound: with the broker gone, or a batch that will never
be acked, SIGTERM and Ctrl-C hung for minutes and a second Ctrl-C was ignored. A process
supervisor then waits, or kills without knowing why. `StopDeadline` watches from a thread
of its own (the event loop may be the thing that is stuck): once the app starts stopping it
allows `timeout_s`, then says so on stderr and exits with EXIT_STOP_TIMEOUT. Nothing more is
acknowledged than was durable before (inputs are acked only once their changelog records
are), so the next owner of the partitions applies the rest again.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from streams.settings.exits import EXIT_STOP_TIMEOUT

log = logging.getLogger("oracular.worker")


class StopDeadline:
    """Ends the process `timeout_s` after `stopping()` first turns true."""

    POLL_S: Final = 0.2

    def __init__(
        self,
        stopping: Callable[[], bool],
        timeout_s: float,
        *,
        exit_process: Callable[[int], Any] = os._exit,
    ) -> None:
        self.stopping, self.timeout_s, self._exit = stopping, timeout_s, exit_process
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Watch from a daemon thread (once): it dies with the process when the stop ends."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, name="oracular-stop", daemon=True)
            self.thread.start()

    def _watch(self) -> None:
        while not self.stopping():
            time.sleep(self.POLL_S)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            time.sleep(self.POLL_S)
        line = (
            f"oracular worker: the stop took longer than ORACULAR_SHUTDOWN_TIMEOUT_S="
            f"{self.timeout_s:g} s (the broker unreachable, or a write that never returned): "
            f"exiting now; what was not acknowledged is applied again by the next owner "
            f"(exit {EXIT_STOP_TIMEOUT})"
        )
        log.critical(line)
        print(line, file=sys.__stderr__ or sys.stderr, flush=True)  # not Faust's redirect
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit(EXIT_STOP_TIMEOUT)
