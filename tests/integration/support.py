"""Helpers for tests against the real broker: names, bounded waits, produce/consume, workers.

Every wait here is bounded by a named timeout, and a timeout fails with what was seen so far
(records received, the worker's log tail), so a hung test says why it hung.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from infra.broker import REPO_ROOT, tail, tied_to_parent

# Generous for a 2-core machine that also runs the broker and the test process.
WORKER_READY_TIMEOUT_S = 90.0  # start, join the group, create/recover tables, "Worker ready"
WORKER_STOP_TIMEOUT_S = 30.0  # SIGTERM: flush, commit, leave the group
OUTPUT_TIMEOUT_S = 45.0  # input produced -> expected output records consumed
POLL_INTERVAL_S = 0.2

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
    """The command line of a Faust worker for `app` (a module path like streams.app)."""
    return [sys.executable, "-m", "faust", "-A", app, "worker", "-l", "info", "--without-web"]


class FaustWorker:
    """A Faust worker in a subprocess: start, wait for "Worker ready", stop or kill.

    Configuration travels in environment variables (the product's convention): the caller gives
    ORACULAR_BROKER / ORACULAR_APP_ID and the app's own settings in `env`; the worker's state
    dir is passed as ORACULAR_DATADIR. Restarting the same object reuses the datadir, which is
    what a restart test needs. All runs append to one log file, each after a header line.
    """

    READY_LINE = "Worker ready"

    def __init__(
        self,
        app: str,
        *,
        env: Mapping[str, str],
        datadir: Path,
        log_path: Path,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.argv = list(argv) if argv is not None else faust_worker_argv(app)
        self.env = {
            **os.environ,
            # The repo root first, so the app imports from this checkout even if not installed.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.getenv("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
            **env,
            "ORACULAR_DATADIR": str(datadir),
        }
        self.datadir = datadir
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self, *, current_run_only: bool = False) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset if current_run_only else 0)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)

    def start(self, *, timeout_s: float = WORKER_READY_TIMEOUT_S) -> FaustWorker:
        """Start the worker and block until its log says it is ready."""
        assert not self.running, "worker already running"
        self.starts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts}: {' '.join(self.argv)}\n".encode())
            self._log_offset = log.tell()
            self.process = subprocess.Popen(
                tied_to_parent(self.argv),  # a killed pytest leaves no worker behind
                env=self.env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C on pytest does not hit the worker first
            )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.READY_LINE not in self.log_text(current_run_only=True):
            if not self.running:
                msg = f"worker exited during start-up; log {self.log_path}:\n{self.log_tail()}"
                raise AssertionError(msg)
            if time.monotonic() > deadline:
                self.kill()
                msg = (
                    f"worker not ready within {timeout_s:.0f} s (WORKER_READY_TIMEOUT_S); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
                raise AssertionError(msg)
            time.sleep(POLL_INTERVAL_S)

    def stop(self, *, timeout_s: float = WORKER_STOP_TIMEOUT_S) -> int:
        """Graceful stop (SIGTERM: Faust flushes, commits and leaves the group).

        Fails the test if the worker needs longer than `timeout_s` (it is then killed).
        """
        return self._signal_and_wait(signal.SIGTERM, timeout_s)

    def kill(self) -> int:
        """Crash semantics: SIGKILL, no flush, no commit."""
        return self._signal_and_wait(signal.SIGKILL, WORKER_STOP_TIMEOUT_S)

    def _signal_and_wait(self, sig: signal.Signals, timeout_s: float) -> int:
        process = self.process
        assert process is not None, "worker was never started"
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                msg = (
                    f"worker did not exit within {timeout_s:.0f} s of {sig.name} (killed); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
                raise AssertionError(msg) from None
        return process.returncode
