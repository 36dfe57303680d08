"""Fault injection for crash and freeze tests (`ORACULAR_TEST_KILL_AT`); off unless set."""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Final

log = logging.getLogger("oracular.worker")


class KillSwitch:
    """Crash and freeze tests only: kill, freeze or hold up this worker at one step of its
    n-th batch.

    `ORACULAR_TEST_KILL_AT=STEP:N[:stop|:block]` with STEP one of outputs (delivered), stored (local
    store written), handed (changelog records handed to the producer, not yet acknowledged),
    changelog (changelog records acknowledged) or acked (inputs acknowledged), and N the
    how-manieth time the step is reached, counted from 1: outputs are sent per batch, the
    other steps happen once per write, which holds the states of one batch or, while a backlog
    waits, of several. With `:stop` the worker stops itself (SIGSTOP) instead: frozen right
    there until the test sends SIGCONT, as a GC or VM pause would freeze it. With `:block` its
    event loop is held up for `BLOCK_S`, as a batch whose work takes that long holds it (the
    consumer's heartbeats wait with it, unless it runs in a thread: `ORACULAR_CONSUMER_LOOP`).
    Unset (always, outside tests): off.
    """

    STEPS: Final = ("outputs", "stored", "handed", "changelog", "acked")
    HOW: Final = {
        "kill": ("killing", signal.SIGKILL),
        "stop": ("freezing", signal.SIGSTOP),
        "block": ("blocking", None),
    }
    """What `:how` does: the log's verb, and the signal the process sends itself (None: it
    sleeps `BLOCK_S` on the event loop's thread)."""
    BLOCK_S: Final = 3.5
    """Over half the tests' session timeout (6 s, the broker's minimum), and under all of it
    with a heartbeat interval (1.2 s) on top: the last heartbeat before the block may be that
    old, and the next waits for the loop."""

    def __init__(self, step: str | None, batch: int, how: str = "kill") -> None:
        """Kill, stop or block (`how`) at `step` of the `batch`-th batch (None: never)."""
        self.step, self.batch, self.how = step, batch, how
        self.seen: dict[str, int] = {}

    @classmethod
    def from_env(cls) -> KillSwitch:
        """From ORACULAR_TEST_KILL_AT."""
        spec = os.environ.get("ORACULAR_TEST_KILL_AT", "")
        if not spec:
            return cls(None, 0)
        step, _, rest = spec.partition(":")
        batch, _, how = rest.partition(":")
        how = how or "kill"
        if step not in cls.STEPS or not batch.isdigit() or how not in cls.HOW:
            msg = (
                f"ORACULAR_TEST_KILL_AT={spec!r}: must be STEP:N, STEP:N:stop or STEP:N:block, "
                f"STEP one of {cls.STEPS}"
            )
            raise ValueError(msg)
        return cls(step, int(batch), how)

    def reached(self, step: str) -> None:
        """Count `step`; kill, stop or block this process when it is the chosen one."""
        if self.step != step:
            return
        self.seen[step] = self.seen.get(step, 0) + 1
        if self.seen[step] == self.batch:
            verb, sent = self.HOW[self.how]
            log.warning("ORACULAR_TEST_KILL_AT: %s the worker after %s", verb, step)
            if sent is None:
                time.sleep(self.BLOCK_S)  # the event loop's thread only
                return
            if sent == signal.SIGKILL:
                logging.shutdown()
            else:
                for handler in logging.getLogger().handlers:
                    handler.flush()
            os.kill(os.getpid(), sent)
