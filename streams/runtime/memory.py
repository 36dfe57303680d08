"""The worker's memory policy: keep Python's cyclic collector off the long-lived states."""

from __future__ import annotations

import gc
import time
from typing import Any, Final


class GcPolicy:
    """Keeps Python's cyclic collector off the long-lived states.

    The cache of decoded states and the deadline index are large and long-lived; left in the
    collector's generations, every full (generation 2) collection walks them: pauses of tens
    of milliseconds, several a minute, which were the worker's whole p99 latency
    (BENCHMARKS.md). So every `FREEZE_S` whatever is in the generations is
    frozen (`gc.freeze`, which only moves it aside): a collection then walks at most a
    second's worth of new objects. Frozen objects are still freed by reference counting when
    a state is replaced or evicted (the states hold no reference cycles). Once an hour
    everything is unfrozen and fully collected, so cyclic garbage that was frozen is
    reclaimed: one long pause an hour. Collections slower than `SLOW_PAUSE_S` are logged, so a
    pause that comes back shows.

    The per-second freeze does not collect first. A second's new objects are mostly the
    states of that second's users, all alive; collecting them before freezing found nothing
    to free in the worker (bad input, dead letters and lookups make no cycles either) and
    cost a pause on the loop every second (BENCHMARKS.md). The cost: cyclic garbage made between two
    young collections waits for the hourly collection.
    """

    FREEZE_S: Final = 1.0
    THAW_S: Final = 3600.0
    SLOW_PAUSE_S: Final = 0.05
    YOUNG_THRESHOLD: Final = 50_000
    """Allocations between two collections of the young generation (Python's default: 700).
    Applying an event makes dozens of short-lived records, and reference counting frees
    nearly all of them before any collection; a young collection every 700 allocations only
    walks the batch's live objects again and again (a measurable share of the processor's
    time in `bench.processor`). The states hold no reference cycles, so nothing waits longer to be
    freed but cyclic garbage, which the next collection still takes."""

    def __init__(self, log: Any = None) -> None:
        """Start counting from now; log slow collections to `log` (a `logging.Logger`)."""
        self.frozen_at = self.thawed_at = time.monotonic()
        self.slow_pauses = 0
        if log is not None:
            self._watch(log)

    def _watch(self, log: Any) -> None:
        started = [0.0]

        def timed(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
                return
            took = time.perf_counter() - started[0]
            if took >= self.SLOW_PAUSE_S:
                self.slow_pauses += 1
                log.info(
                    "garbage collection paused the worker for %.0f ms (generation %s)",
                    took * 1000,
                    info.get("generation"),
                )

        gc.callbacks.append(timed)

    @staticmethod
    def tune() -> None:
        """Set the young generation's threshold (the worker's once it runs, and the offline
        commands'; the older generations keep theirs)."""
        _, middle, old = gc.get_threshold()
        gc.set_threshold(GcPolicy.YOUNG_THRESHOLD, middle, old)

    def freeze(self) -> None:
        """Collect the young generations and freeze what survives (once, after a recovery
        or the hourly collection)."""
        gc.collect(1)
        gc.freeze()
        self.frozen_at = time.monotonic()

    def tick(self) -> None:
        """Freeze (without collecting), or thaw and collect everything, when it is time."""
        now = time.monotonic()
        if now - self.thawed_at >= self.THAW_S:
            gc.unfreeze()
            gc.collect()
            self.thawed_at = now
            self.freeze()
        elif now - self.frozen_at >= self.FREEZE_S:
            gc.freeze()
            self.frozen_at = now
