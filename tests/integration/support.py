"""Helpers for tests against the real broker: names, bounded waits, produce/consume, workers.

Every wait here is bounded by a named timeout, and a timeout fails with what was seen so far
(records received, the worker's log tail), so a hung test says why it hung.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self, TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from infra.processes import READY_LINE, LoggedProcess, child_env

# Generous for a 2-core machine that also runs the broker and the test process.
WORKER_READY_TIMEOUT_S = 90.0  # start, join the group, create/recover tables, "Worker ready"
WORKER_STOP_TIMEOUT_S = 30.0  # SIGTERM: flush, commit, leave the group
OUTPUT_TIMEOUT_S = 45.0  # input produced -> expected output records consumed
POLL_INTERVAL_S = 0.2
KILL_TIMEOUT_S = 60.0  # a started worker reaches its ORACULAR_TEST_KILL_AT step

Record: TypeAlias = ConsumerRecord[bytes, bytes]


def unique_name(prefix: str) -> str:
    """A topic / app id / group name no other test (or earlier run) uses."""
    safe = re.sub(r"[^a-zA-Z0-9._-]", "-", prefix)[:60]
    return f"{safe}-{uuid.uuid4().hex[:10]}"


async def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]
) -> None:
    """Send (key, value) records and wait until the broker has acknowledged all of them.

    Keys are partitioned with murmur2, as every producer must (the worker's state lives in the
    partition Kafka's default partitioner picks for the user id; docs/messages.md).
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def consume_until(
    bootstrap: str,
    topic: str,
    done: Callable[[list[Record]], bool],
    *,
    timeout_s: float = OUTPUT_TIMEOUT_S,
    what: str = "the expected records",
) -> list[Record]:
    """Read `topic` from the beginning (no consumer group) until `done(records)` holds.

    Raises AssertionError after `timeout_s`, listing what did arrive.
    """
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    await consumer.start()
    try:
        while not done(records):
            if time.monotonic() > deadline:
                shown = [(r.partition, r.offset, r.key, r.value) for r in records]
                msg = f"{what} did not arrive on {topic} within {timeout_s:.0f} s; got {shown}"
                raise AssertionError(msg)
            batches = await consumer.getmany(timeout_ms=int(POLL_INTERVAL_S * 1000))
            for batch in batches.values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


def faust_worker_argv(app: str) -> list[str]:
    """The command line of a Faust worker for `app` (a module path like streams.worker)."""
    return [sys.executable, "-m", "faust", "-A", app, "worker", "-l", "info", "--without-web"]


class FaustWorker(LoggedProcess):
    """A Faust worker in a subprocess: start, wait for "Worker ready", stop or kill.

    The process handling is `infra.processes.LoggedProcess` (the benchmarks run their workers
    with it too); here its bounded waits fail the test (AssertionError, with the log's tail).
    Configuration travels in environment variables (the product's convention): the caller gives
    ORACULAR_BROKER / ORACULAR_APP_ID and the app's own settings in `env`; the worker's state
    dir is passed as ORACULAR_DATADIR. Restarting the same object reuses the datadir, which is
    what a restart test needs. All runs append to one log file, each after a header line.
    """

    READY_LINE = READY_LINE
    failure = AssertionError

    def __init__(
        self,
        app: str,
        *,
        env: Mapping[str, str],
        datadir: Path,
        log_path: Path,
        argv: Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            "worker",
            argv if argv is not None else faust_worker_argv(app),
            env=child_env({**env, "ORACULAR_DATADIR": str(datadir)}),
            log_path=log_path,
        )
        self.datadir = datadir

    def start(self, *, timeout_s: float = WORKER_READY_TIMEOUT_S) -> Self:
        """Start the worker and block until its log says it is ready (killed if it is not
        within `timeout_s`, WORKER_READY_TIMEOUT_S)."""
        assert not self.running, "worker already running"
        super().start()
        try:
            self.wait_line(self.READY_LINE, timeout_s, poll_s=POLL_INTERVAL_S)
        except AssertionError:
            if self.running:
                self.signal_and_wait(signal.SIGKILL, WORKER_STOP_TIMEOUT_S)
            raise
        return self

    def stop(self, timeout_s: float = WORKER_STOP_TIMEOUT_S) -> int:
        """Graceful stop (SIGTERM: Faust flushes, commits and leaves the group).

        Fails the test if the worker needs longer than `timeout_s` (it is then killed).
        """
        return self._end(signal.SIGTERM, timeout_s)

    def kill(self) -> int:
        """Crash semantics: SIGKILL, no flush, no commit."""
        return self._end(signal.SIGKILL, WORKER_STOP_TIMEOUT_S)

    def _end(self, sig: signal.Signals, timeout_s: float) -> int:
        if not self.signal_and_wait(sig, timeout_s):
            self.fail(f"did not exit within {timeout_s:.0f} s of {sig.name} (killed)")
        assert self.process is not None
        return self.process.returncode


async def wait_killed(worker: FaustWorker, step: str) -> None:
    """Wait until the hook has SIGKILLed `worker` at `step`."""
    process = worker.process
    assert process is not None
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while process.poll() is None:
        if time.monotonic() > deadline:
            worker.kill()
            msg = f"the hook did not kill the worker within {KILL_TIMEOUT_S:.0f} s"
            raise AssertionError(f"{msg}; log {worker.log_path}:\n{worker.log_tail()}")
        await asyncio.sleep(POLL_INTERVAL_S)
    assert process.returncode == -signal.SIGKILL, (
        f"worker exited with {process.returncode}, not by SIGKILL; log {worker.log_path}:\n"
        f"{worker.log_tail()}"
    )
    log = worker.log_text(current_run_only=True)
    assert f"killing the worker after {step}" in log, f"not killed by the hook:\n{log[-3000:]}"
