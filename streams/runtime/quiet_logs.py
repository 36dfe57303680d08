"""aiokafka's log, made readable: retried errors at INFO, a lost broker said once a while.

aiokafka logs at ERROR what it retries at once (a fresh broker's "Group Coordinator Request
failed"), and every failed connection attempt to a broker that went away: 4,923 lines in 50 s
under a worker whose broker was stopped. `quiet_aiokafka_logs` installs both filters once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final


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
    them, so an outage is said once whichever of them fails first."""
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
