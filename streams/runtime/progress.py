"""A progress line for long work: done/total, rate and ETA, on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO

TTY_INTERVAL_S = 0.2
"""How often a terminal's line is redrawn."""
LOG_INTERVAL_S = 10.0
"""How often a line is printed when stderr is a file or pipe (CI logs stay short)."""


class Progress:
    """Counts work units; redraws a line on a terminal, prints one now and then elsewhere."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        unit: str = "events",
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        """Start the clock. `total` in the same units as `advance`, if known."""
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.done = 0
        self.count = 0
        self.started = self._last = time.monotonic()

    def advance(self, done: int, count: int = 1) -> None:
        """Record progress: `done` units of `total` so far, `count` more items processed."""
        self.done = done
        self.count += count
        now = time.monotonic()
        if self.enabled and now - self._last >= (TTY_INTERVAL_S if self.tty else LOG_INTERVAL_S):
            self._last = now
            self._write(self.line(now), final=False)

    def line(self, now: float | None = None) -> str:
        """The progress text: count, percent, rate and ETA where a total is known."""
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        rate = self.count / elapsed
        text = f"{self.label}: {self.count:,} {self.unit} ({rate:,.0f}/s, {elapsed:.1f}s)"
        if self.total:
            share = min(self.done / self.total, 1.0)
            eta = (elapsed / share - elapsed) if share > 0 else float("inf")
            text += f" {share:6.1%} eta {eta:.0f}s"
        return text

    def close(self) -> None:
        """Print the final line."""
        if self.enabled:
            self._write(self.line(), final=True)

    def _write(self, text: str, *, final: bool) -> None:
        if self.tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
