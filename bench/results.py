"""What the end-to-end benchmark measured (`Results`), and the machine's load meanwhile."""

from __future__ import annotations

import asyncio
import os
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.machine import pytest_processes

if TYPE_CHECKING:
    from bench.session import Params

MONITOR_S = 5.0  # machine load sampling interval


@dataclass
class Results:
    """Everything measured, for the table and the Markdown section."""

    params: Params
    stream: str = "synthetic"
    """The input stream (bench/inputs.py) of the throughput and latency phases."""
    input_describe: str = ""
    """What the throughput phase's input was (bench/inputs.py `BenchInput.describe`)."""
    backfill: list[dict[str, Any]] = field(default_factory=list)
    """The `oracular backfill` runs over the throughput phase's input."""
    loads: list[tuple[str, tuple[float, float, float]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    preload_s: float = 0.0
    expected: dict[str, int] = field(default_factory=dict)
    input_count: int = 0
    """Records in the throughput phase's input topic (the events and the closing marks)."""
    pipeline: list[dict[str, Any]] = field(default_factory=list)
    passthrough: list[dict[str, Any]] = field(default_factory=list)
    scaled: list[dict[str, Any]] = field(default_factory=list)
    """The `oracular worker --processes N` runs (N = params.processes)."""
    peers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per peer (bench/peers), its throughput runs."""
    peer_versions: dict[str, str] = field(default_factory=dict)
    peer_unavailable: dict[str, str] = field(default_factory=dict)
    """Per peer that was not (or no longer) measured, why."""
    latency_rate: float = 0.0
    latency: list[dict[str, Any]] = field(default_factory=list)
    latency_base: list[dict[str, Any]] = field(default_factory=list)
    recovery: dict[str, Any] = field(default_factory=dict)
    restores: list[dict[str, Any]] = field(default_factory=list)
    empties: list[dict[str, Any]] = field(default_factory=list)
    broker_rss: int | None = None
    durations: dict[str, float] = field(default_factory=dict)
    """Seconds each phase took."""
    samples: list[tuple[float, int]] = field(default_factory=list)
    """(1-minute load average, pytest processes running) every MONITOR_S seconds."""

    def load(self, when: str) -> None:
        """Note the load average now."""
        self.loads.append((when, os.getloadavg()))

    async def monitor(self) -> None:
        """Sample the machine's load and other test runs until cancelled."""
        while True:
            self.samples.append((os.getloadavg()[0], len(pytest_processes())))
            await asyncio.sleep(MONITOR_S)

    def machine_load(self) -> str:
        """What else ran during the benchmark, from the samples."""
        if not self.samples:
            return ""
        busy = sum(1 for _, tests in self.samples if tests)
        loads = sorted(load for load, _ in self.samples)
        return (
            f"During the run, other test runs (pytest processes) were seen in {busy} of "
            f"{len(self.samples)} samples taken every {MONITOR_S:.0f} s; 1-minute load "
            f"average median {statistics.median(loads):.2f}, max {loads[-1]:.2f} (2 = both "
            "cores busy)."
        )
