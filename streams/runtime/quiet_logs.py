"""aiokafka's and Faust's log, made readable: retried errors at INFO, a lost broker said once
a while, Faust's tables on one line.

aiokafka logs at ERROR what it retries at once (a fresh broker's "Group Coordinator Request
failed"), and every failed connection attempt to a broker that went away: 4,923 lines in 50 s
under a worker whose broker was stopped. `quiet_aiokafka_logs` installs both filters once.

Faust draws topic and partition sets as boxed tables, five lines and more each: about 120 of
the lines a worker logs at start. `_one_line_faust_table` (a formatter of `mode`'s logging,
which Faust's log records pass through) writes each on one line (`one_line_table`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from mode.utils.logging import formatter2

from streams.faust import patches as faust_patches


class _TransientCoordinatorErrors(logging.Filter):
    """aiokafka logs a retriable "Group Coordinator Request failed" at ERROR; a fresh broker
    answers so while it creates its offsets topic, and aiokafka retries at once. INFO, then:
    an ERROR line in a healthy first start sends people looking for a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno == logging.ERROR
            and str(record.msg).startswith("Group Coordinator Request failed")
            and record.args
            and getattr(
                record.args[0] if isinstance(record.args, tuple) else None, "retriable", False
            )
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg += " (retrying)"
        return True


class BrokerUnreachable(logging.Filter):
    """aiokafka's "Unable connect to node ..." and "Unable to ... metadata ..." errors: the
    first of an outage is logged, then one line every `every_s` saying how long the broker
    has been unreachable, instead of one per attempt. An outage ends when no attempt has
    failed for `every_s`."""

    PREFIXES: Final = (
        "Unable connect to node",
        "Unable to update metadata",
        "Unable to request",
        "Failed fetch messages from",
        "Got error produce response",
        "Group Coordinator Request failed",
    )
    """What aiokafka's client, fetcher, producer and group coordinator say on every retry
    while a broker is gone (each of them ten times a second)."""

    def __init__(self, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self.since: float | None = None
        """When the outage's first failure was logged (None: no outage)."""
        self.last_failure = self.last_said = 0.0
        self.failures = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.PREFIXES):
            return True
        now = self.clock()
        if self.since is None or now - self.last_failure > self.every_s:
            self.since, self.last_said, self.failures = now, now, 0
            self.last_failure = now
            record.msg = f"{record.msg} (the broker looks unreachable: said again every %gs)"
            record.args = (*(record.args if isinstance(record.args, tuple) else ()), self.every_s)
            return True
        self.last_failure = now
        self.failures += 1
        if now - self.last_said < self.every_s:
            return False
        self.last_said = now
        record.msg = "the broker has been unreachable for %.0f s (%d failed attempts since)"
        record.args = (now - self.since, self.failures)
        return True


def quiet_aiokafka_logs() -> None:
    """Install the filters on aiokafka's loggers (once): one BrokerUnreachable for all of
    them, so an outage is said once whichever of them fails first; and Faust's tables on one
    line (`mode` keeps its formatters in a set: added once however often this runs)."""
    formatter2(_one_line_faust_table)
    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    if not any(isinstance(f, _TransientCoordinatorErrors) for f in coordinator.filters):
        coordinator.addFilter(_TransientCoordinatorErrors())
    for name in BROKER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, BrokerUnreachable) for f in logger.filters):
            logger.addFilter(_BROKER_UNREACHABLE)


BROKER_LOGGERS: Final = (
    "aiokafka",  # aiokafka/client.py logs as "aiokafka"
    "aiokafka.consumer.fetcher",
    "aiokafka.producer.sender",
    "aiokafka.consumer.group_coordinator",
)
_BROKER_UNREACHABLE: Final = BrokerUnreachable()


MAX_TABLE_ROWS: Final = 20
"""Rows of a Faust table written on its line; the rest are counted."""


def one_line_table(text: str) -> str | None:
    """A table drawn by Faust (`faust.utils.terminal.logtable`) as one line: "Title: cells of
    a row; cells of the next row" (the header row left out); None if `text` is no such table."""
    if "\n|" not in text:  # most log arguments: no table, and no lines split
        return None
    lines = text.strip().splitlines()
    if len(lines) < 3 or not lines[0].startswith("+") or not lines[-1].startswith("+"):
        return None
    title = lines[0].strip("+-")
    rows = [
        " ".join(cell.strip() for cell in line.strip("|").split("|"))
        for line in lines
        if line.startswith("|")
    ][1:]
    shown = "; ".join(rows[:MAX_TABLE_ROWS])
    more = len(rows) - MAX_TABLE_ROWS
    return f"{title}: {shown or 'none'}" + (f"; and {more} more" if more > 0 else "")


def _one_line_faust_table(arg: Any, record: logging.LogRecord) -> str | None:
    """`mode`'s log formatter hook: Faust's tables (built by its own formatter, which may run
    before or after this one, or passed as a preformatted argument) on one line, after a space
    instead of a line break."""
    if not isinstance(arg, str):
        arg = faust_patches.faust_log_argument(arg, record)
    return one_line_table(arg) if isinstance(arg, str) else None
