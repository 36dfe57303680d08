"""The worker's memory policy: keep Python's cyclic collector off the long-lived states."""

from __future__ import annotations

import gc
import time
from typing import Final


class GcPolicy:
    """Keeps Python's cyclic collector off the long-lived states.

    The cache of decoded states and the deadline index are large and long-lived; left in the
    collector's generations, every full collection walks them (tens of ms of p99 latency,
    BENCHMARKS.md). So young objects are collected and the survivors frozen (`gc.freeze`)
    every `FREEZE_S`; frozen objects are still freed by reference counting when a state is
    evicted. Once an hour everything is unfrozen and fully collected, so cyclic garbage that
    happened to be frozen while still in use is reclaimed: one full collection an hour.
    """

    FREEZE_S: Final = 30.0
    THAW_S: Final = 3600.0

    def __init__(self) -> None:
        """Start counting from now."""
        self.frozen_at = self.thawed_at = time.monotonic()

    def freeze(self) -> None:
        """Collect the young generations and freeze what survives."""
        gc.collect(1)
        gc.freeze()
        self.frozen_at = time.monotonic()

    def tick(self) -> None:
        """Freeze, or thaw and collect everything, when it is time."""
        now = time.monotonic()
        if now - self.thawed_at >= self.THAW_S:
            gc.unfreeze()
            gc.collect()
            self.thawed_at = now
            self.freeze()
        elif now - self.frozen_at >= self.FREEZE_S:
            self.freeze()
