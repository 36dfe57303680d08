"""Fault injection for crash tests (`ORACULAR_TEST_KILL_AT`); off unless set."""

from __future__ import annotations

import logging
import os
import signal
from typing import Final

log = logging.getLogger("oracular.worker")


class KillSwitch:
    """Crash tests only: SIGKILL this worker at one step of its n-th batch.

    `ORACULAR_TEST_KILL_AT=STEP:N` with STEP one of outputs (delivered), stored (local store
    written), changelog (changelog records acknowledged) or acked (inputs acknowledged), and N
    the how-manieth time the step is reached, counted from 1: outputs are sent per batch, the
    other steps happen once per write, which holds the states of one batch or, while a backlog
    waits, of several. Unset (always, outside tests): off.
    """

    STEPS: Final = ("outputs", "stored", "changelog", "acked")

    def __init__(self, step: str | None, batch: int) -> None:
        """Kill at `step` of the `batch`-th batch (None: never)."""
        self.step, self.batch = step, batch
        self.seen: dict[str, int] = {}

    @classmethod
    def from_env(cls) -> KillSwitch:
        """From ORACULAR_TEST_KILL_AT."""
        spec = os.environ.get("ORACULAR_TEST_KILL_AT", "")
        if not spec:
            return cls(None, 0)
        step, _, batch = spec.partition(":")
        if step not in cls.STEPS or not batch.isdigit():
            msg = f"ORACULAR_TEST_KILL_AT={spec!r}: must be STEP:N, STEP one of {cls.STEPS}"
            raise ValueError(msg)
        return cls(step, int(batch))

    def reached(self, step: str) -> None:
        """Count `step`; SIGKILL this process when it is the chosen one."""
        if self.step != step:
            return
        self.seen[step] = self.seen.get(step, 0) + 1
        if self.seen[step] == self.batch:
            log.warning("ORACULAR_TEST_KILL_AT: killing the worker after %s", step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
