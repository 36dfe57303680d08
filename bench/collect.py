"""The bench's output collector: read output topics from the start, count, time, stop.

Every end-to-end run is timed on its output records' own timestamps (set by the process that
produced them), so the collector's delays do not count; a run ends when the counts reach what
is expected, or when no output arrived for a while (then the run is flagged), or on a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer

from infra.processes import LoggedProcess

IDLE_S = 5.0  # no output for this long ends a run whose counts never reached the expected
FIRST_OUTPUT_TIMEOUT_S = 180.0  # worker start to its first output
RUN_TIMEOUT_S = 900.0  # any single run


@dataclass
class Outputs:
    """What a collector saw on the output topics."""

    counts: Counter[str] = field(default_factory=Counter)
    first_ts: int | None = None
    """Smallest record timestamp (ms; set by the producing process when it sent the record)."""
    last_ts: dict[str, int] = field(default_factory=dict)
    """Per role, the largest record timestamp."""
    values: list[tuple[float, bytes, float]] = field(default_factory=list)
    """(arrival wall time, value) of every record, when kept."""
    stamps: dict[str, list[int]] = field(default_factory=dict)
    """Per role, every record's timestamp (ms), in arrival order."""
    complete: bool = False
    """The counts reached the expected counts (else the run ended on idle or timeout)."""
    ended_by: str = ""

    def span_s(self, *roles: str) -> float:
        """Seconds from the first output of any role to the last of `roles` (default: all)."""
        last = max(self.last_ts[r] for r in (roles or tuple(self.last_ts)) if r in self.last_ts)
        assert self.first_ts is not None
        return max(last - self.first_ts, 1) / 1000

    def add(self, role: str, records: Sequence[Any], arrival: float, *, keep: bool) -> None:
        """Count `records` of `role`, which arrived at wall time `arrival`."""
        self.counts[role] += len(records)
        self.stamps.setdefault(role, []).extend(record.timestamp for record in records)
        for record in records:
            ts = record.timestamp
            if self.first_ts is None or ts < self.first_ts:
                self.first_ts = ts
            if ts > self.last_ts.get(role, 0):
                self.last_ts[role] = ts
            if keep and record.value is not None:
                self.values.append((arrival, record.value, ts / 1000))


@dataclass
class _Clock:
    """When a collector started, last saw output, and saw its input finish (monotonic)."""

    began: float
    last_output: float | None = None
    input_done: float | None = None

    def ending(self, now: float, idle_s: float, waits_for_input: bool) -> str:
        """Why the collection ends now, or "" to go on."""
        if self.last_output is not None and (self.input_done or not waits_for_input):
            quiet = now - max(self.last_output, self.input_done or 0.0)
            if quiet > idle_s:
                return f"no output for {idle_s:.0f} s"
        if self.last_output is None and now - self.began > FIRST_OUTPUT_TIMEOUT_S:
            return "no output at all"
        if now - self.began > RUN_TIMEOUT_S:
            return "run timeout"
        return ""


async def collect(
    bootstrap: str,
    topics: Mapping[str, str],
    *,
    expected: Mapping[str, int] | None = None,
    keep_values: bool = False,
    started: asyncio.Event | None = None,
    input_done: Callable[[], bool] | None = None,
    idle_s: float = IDLE_S,
    first_output: asyncio.Event | None = None,
) -> Outputs:
    """Read `topics` (role -> topic) from the beginning until the counts reach `expected`, or
    nothing arrived for `idle_s` after the first output (and after `input_done()` holds).
    `started` is set once the consumer runs, `first_output` when the first records arrive."""
    role_of = {topic: role for role, topic in topics.items()}
    consumer = AIOKafkaConsumer(
        *topics.values(),
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    out = Outputs()
    await consumer.start()
    if started is not None:
        started.set()
    clock = _Clock(time.monotonic())
    try:
        while not out.ended_by:
            batches = await consumer.getmany(timeout_ms=100)
            arrival, now = time.time(), time.monotonic()
            for tp, records in batches.items():
                out.add(role_of[tp.topic], records, arrival, keep=keep_values)
                clock.last_output = now
            if batches and first_output is not None:
                first_output.set()
            if expected is not None and all(out.counts[r] >= n for r, n in expected.items()):
                out.complete, out.ended_by = True, "expected counts"
                break
            if input_done is not None and clock.input_done is None and input_done():
                clock.input_done = now
            out.ended_by = clock.ending(now, idle_s, waits_for_input=input_done is not None)
    finally:
        await consumer.stop()
    return out


async def outputs_of(collector: asyncio.Task[Outputs], proc: LoggedProcess) -> Outputs:
    """The collector's result; RuntimeError if `proc` exits before the collection ends."""
    while not collector.done():
        if not proc.running:
            await asyncio.sleep(1.0)  # outputs it flushed while stopping still arrive
            if collector.done():
                break
            code = proc.process.returncode if proc.process else None
            msg = f"{proc.name} exited ({code}) before its outputs were complete; log "
            msg += f"{proc.log_path}:\n{proc.log_tail()}"
            raise RuntimeError(msg)
        await asyncio.wait({collector}, timeout=0.2)
    return collector.result()
