"""The datadir's free space: input waits while it is below ORACULAR_MIN_FREE_BYTES.

RocksDB that runs out of space mid-batch fails the write and then refuses every write after
it; the worker stops on that (streams/runtime/failstop.py, exit 74), and a restart needs space
first. The guard keeps it from getting there: before each batch the worker asks `low()` (a
`statvfs` at most every `CHECK_EVERY_S`), and while the free space is below the setting it
applies nothing (`wait_for_space`), says so once in the log, is not ready (`health`) and
shows it in /metrics (`oracular_datadir_low`), so an alert can call someone before the disk
is full. Input then waits in the broker, where it is safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

log = logging.getLogger("oracular.worker")


class DiskGuard:
    """The free space of the disk that holds `path`, against `min_free` bytes (0: no guard)."""

    CHECK_EVERY_S: Final = 0.5
    """How stale a reading may be: a `statvfs` costs microseconds, a batch milliseconds."""
    WAIT_S: Final = 1.0
    """How often a held worker looks again."""

    def __init__(
        self,
        path: Path,
        min_free: int,
        *,
        statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path, self.min_free = path, min_free
        self._statvfs, self._clock = statvfs, clock
        self.free_bytes: int | None = None
        """Free bytes for an unprivileged writer at the last reading (None: none yet)."""
        self.holding = False
        """True while input waits for space."""
        self._read_at = float("-inf")

    def low(self) -> bool:
        """True when the free space (read at most CHECK_EVERY_S ago) is below `min_free`."""
        if self.min_free <= 0:
            return False
        now = self._clock()
        if now - self._read_at >= self.CHECK_EVERY_S:
            self._read_at = now
            try:
                found = self._statvfs(self.path)
            except OSError:  # the datadir gone: RocksDB's own error says more
                return False
            self.free_bytes = found.f_bavail * found.f_frsize
        return self.free_bytes is not None and self.free_bytes < self.min_free

    async def wait_for_space(self, give_up: Callable[[], bool]) -> bool:
        """Wait until the free space is back above `min_free`: True then, False as soon as
        `give_up()` (a rebalance under way: the batch is left to whoever owns it next)."""
        if not self.low():
            return True
        self.holding = True
        log.warning(
            "the datadir %s has %s bytes free, below ORACULAR_MIN_FREE_BYTES=%s: no input is "
            "taken until there is space (free some, or give the datadir a bigger disk)",
            self.path,
            self.free_bytes,
            self.min_free,
        )
        started = self._clock()
        try:
            while self.low():
                if give_up():
                    return False
                await asyncio.sleep(self.WAIT_S)
        finally:
            self.holding = False
        log.warning(
            "the datadir has %s bytes free again: taking input (held %.0f s)",
            self.free_bytes,
            self._clock() - started,
        )
        return True

    def health(self) -> list[str]:
        """Why the worker is not ready, as far as its disk goes."""
        if not self.holding:
            return []
        return [
            f"datadir low on space: {self.free_bytes} bytes free < ORACULAR_MIN_FREE_BYTES "
            f"{self.min_free}; input held"
        ]
