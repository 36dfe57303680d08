"""Fail-stop (streams/runtime/failstop.py), the disk guard, the stop deadline and the log of a
lost broker: each fault of the worker's own machine ends the process with its code and one
line saying what to do, and never lets Faust restart the agent around lost state."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from streams.faust.patches import StoreError
from streams.runtime.diskguard import DiskGuard
from streams.runtime.failstop import BROKER, BUG, CORRUPT, STORAGE, FailStop, fault_of
from streams.runtime.processor import Processor
from streams.runtime.quiet_logs import BrokerUnreachable
from streams.runtime.shutdown import StopDeadline
from streams.settings.exits import (
    EXIT_RESTART,
    EXIT_SOFTWARE,
    EXIT_STOP_TIMEOUT,
    EXIT_STORAGE,
    EXIT_UNAVAILABLE,
)

WAIT_S = 30.0  # bounds a hang only; every wait below is on a condition


class Exited(BaseException):
    """What the test's exit function raises instead of ending the process."""


def recording_failstop() -> tuple[FailStop, list[int], io.StringIO]:
    codes: list[int] = []
    stderr = io.StringIO()

    def exit_process(code: int) -> None:
        codes.append(code)
        raise Exited(code)

    return FailStop(exit_process=exit_process, stderr=stderr), codes, stderr


@pytest.mark.parametrize(
    ("exc", "fault", "code"),
    [
        (StoreError("IO error: No space left on device", partition=3, corrupt=False), STORAGE, 74),
        (StoreError("Corruption: block checksum mismatch", partition=3, corrupt=True), CORRUPT, 75),
        (OSError(28, "No space left on device"), STORAGE, 74),
        (KafkaTimeoutError(), BROKER, 69),
        (ValueError("a bug"), BUG, 70),
        (KeyError("k"), BUG, 70),
    ],
)
def test_each_fault_stops_with_its_code_and_one_line_saying_what_to_do(exc, fault, code):
    failstop, codes, stderr = recording_failstop()
    assert fault_of(exc) is fault and fault.code == code
    with pytest.raises(Exited):
        failstop.stop("the processing agent", exc)
    assert codes == [code]
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"oracular worker: stopped ({fault.kind} in the processing agent")
    assert fault.remedy in lines[0] and lines[0].endswith(f"(exit {code})")
    assert failstop.stopping is fault


def test_the_exit_codes_are_the_documented_ones():
    assert (STORAGE.code, CORRUPT.code, BROKER.code, BUG.code) == (
        EXIT_STORAGE,
        EXIT_RESTART,
        EXIT_UNAVAILABLE,
        EXIT_SOFTWARE,
    )
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    for code in (EXIT_STORAGE, EXIT_RESTART, EXIT_UNAVAILABLE, EXIT_SOFTWARE, EXIT_STOP_TIMEOUT):
        assert f"| {code} |" in doc, f"exit {code} is not in docs/operations.md's table"


def test_a_corrupt_partition_found_while_reading_is_set_aside_before_the_stop(tmp_path):
    failstop, codes, stderr = recording_failstop()
    asked: list[int] = []

    def set_aside(partition: int) -> Path:
        asked.append(partition)
        return tmp_path / "set-aside" / f"p{partition}"

    failstop.set_aside = set_aside
    with pytest.raises(Exited):
        failstop.stop(
            "the lookup API's feed", StoreError("Corruption: x", partition=6, corrupt=True)
        )
    assert asked == [6] and codes == [EXIT_RESTART]
    assert f"moved to {tmp_path / 'set-aside' / 'p6'}" in stderr.getvalue()


def test_a_storage_error_is_raised_by_the_processor_never_dead_lettered():
    """The input is not the problem: the batch stops, and with it the worker."""
    from schemas.config import load_config
    from streams.runtime.processor import Batch
    from tests.streams.test_cli_replay import CONFIG
    from tests.streams.test_processor import EVENTS, TICKS, TS, DictTable, _message

    class FailingTable(DictTable):
        def get(self, key, context):
            raise StoreError("Corruption: block checksum mismatch", partition=0, corrupt=True)

    config = load_config(CONFIG)
    event = {"id": "a", "user": "u1", "name": "pricing.viewed", "ts": TS}
    processor = Processor(config, events_topic=EVENTS, ticks_topic=TICKS, faults=(StoreError,))
    batch = Batch(FailingTable(), config)
    with pytest.raises(StoreError):
        processor.on_input(batch, _message(0, event))
    assert not batch.outputs and not processor.counts["dead_lettered"]
    assert not processor.counts["internal_errors"]
    # Any other exception is still the message's: dead-lettered with the reason.
    plain = Processor(config, events_topic=EVENTS, ticks_topic=TICKS)
    batch = Batch(FailingTable(), config)
    plain.on_input(batch, _message(0, event))
    assert plain.counts["internal_errors"] == 1
    assert [o.role for o in batch.outputs] == ["dlq"]


UPSTREAM_RESTART = """
import asyncio, os, sys, time
import faust

async def main():
    app = faust.App("failstop-test", broker="kafka://127.0.0.1:1", store="memory://")
    entered = []

    @app.agent()
    async def plain(stream):
        entered.append(1)
        async for _ in stream:
            raise RuntimeError("lost the batch")

    # The worker's supervisor (Faust's default, `agent_supervisor`); test contexts crash instead.
    async with plain.test_context(supervisor_strategy=app.conf.agent_supervisor) as agent:
        putting = asyncio.ensure_future(agent.put(b"one"))
        deadline = time.monotonic() + 30
        while len(entered) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        print("entered", len(entered), flush=True)
        os._exit(0)  # the restarted agent would be left running: the point is made

asyncio.run(main())
"""


async def test_upstream_faust_restarts_an_agent_that_raised_and_the_guard_stops_instead():
    """Why the guard exists: Faust's supervisor starts a failed agent body again (the batch
    it held is lost, in a process of its own here); the guarded body stops the process on the
    first exception."""
    upstream = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", UPSTREAM_RESTART],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "entered 2" in upstream.stdout, upstream.stdout + upstream.stderr

    failstop, codes, _ = recording_failstop()
    entered = []
    guarded_body_done = asyncio.Event()

    async def body(stream: Any) -> None:
        entered.append(1)
        try:
            async for _ in stream:
                raise RuntimeError("lost the batch")
        finally:
            guarded_body_done.set()

    with pytest.raises(Exited):
        await failstop.guarded("the processing agent")(body)(_one_item())
    assert guarded_body_done.is_set() and entered == [1] and codes == [EXIT_SOFTWARE]


async def _one_item() -> Any:
    yield b"one"


def statvfs_of(free: list[int]) -> Any:
    return lambda _path: SimpleNamespace(f_bavail=free[0], f_frsize=1)


async def test_the_disk_guard_holds_input_while_space_is_low_and_says_why():
    free = [10]
    now = [0.0]
    guard = DiskGuard(Path("."), 100, statvfs=statvfs_of(free), clock=lambda: now[0])
    guard.WAIT_S = 0.001  # type: ignore[misc]
    assert guard.low() and guard.health() == []  # not yet holding anything
    released = asyncio.create_task(guard.wait_for_space(lambda: False))
    deadline = time.monotonic() + WAIT_S
    while not guard.holding:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)
    assert "datadir low on space: 10 bytes free" in guard.health()[0]
    free[0] = 1_000
    now[0] += guard.CHECK_EVERY_S  # the next reading is due
    assert await asyncio.wait_for(released, WAIT_S) is True
    assert not guard.holding and guard.health() == []


async def test_the_disk_guard_gives_the_batch_up_for_a_rebalance_and_is_off_at_zero():
    guard = DiskGuard(Path("."), 100, statvfs=statvfs_of([10]))
    assert await guard.wait_for_space(lambda: True) is False and not guard.holding
    off = DiskGuard(Path("."), 0, statvfs=statvfs_of([0]))
    assert not off.low() and await off.wait_for_space(lambda: False) is True


def test_the_disk_guard_reads_the_real_disk(tmp_path):
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    assert DiskGuard(tmp_path, free * 2 + 1).low()
    assert not DiskGuard(tmp_path, 1).low()


def test_a_stop_that_takes_too_long_ends_the_process_with_124():
    stopping = threading.Event()
    exited: list[int] = []
    done = threading.Event()

    def exit_process(code: int) -> None:
        exited.append(code)
        done.set()

    deadline = StopDeadline(stopping.is_set, 0.3, exit_process=exit_process)
    deadline.start()
    time.sleep(deadline.POLL_S * 3)  # a process that is not stopping is left alone
    assert not exited
    stopping.set()
    assert done.wait(WAIT_S) and exited == [EXIT_STOP_TIMEOUT]


def test_a_lost_broker_is_logged_once_then_every_so_often():
    now = [0.0]
    quiet = BrokerUnreachable(every_s=30.0, clock=lambda: now[0])

    def attempt() -> logging.LogRecord:
        return logging.LogRecord(
            "aiokafka",
            logging.ERROR,
            __file__,
            1,
            "Unable connect to node with id %s: %s",
            (1, "Connect call failed"),
            None,
        )

    said = []
    for _ in range(1_000):  # 100 s of attempts, ten a second
        record = attempt()
        if quiet.filter(record):
            said.append(record.getMessage())
        now[0] += 0.1
    assert said[0].startswith("Unable connect to node with id 1: Connect call failed")
    assert len(said) == 4, said  # the first, then at 30, 60 and 90 s
    assert said[1].startswith("the broker has been unreachable for 30 s")
    now[0] += 60  # quiet for a while: the next failure starts a new outage
    record = attempt()
    assert quiet.filter(record) and record.getMessage().startswith("Unable connect")
    other = logging.LogRecord("aiokafka", logging.ERROR, __file__, 1, "other", (), None)
    assert quiet.filter(other)


def test_the_filter_sits_on_the_logger_aiokafkas_client_logs_to():
    import aiokafka.client

    from streams.runtime.quiet_logs import quiet_aiokafka_logs

    quiet_aiokafka_logs()
    assert any(isinstance(f, BrokerUnreachable) for f in aiokafka.client.log.filters)


async def test_input_partitions_without_their_changelog_partitions_stop_the_worker():
    """Faust's assignor left the changelog out ("Ignoring missing topic"): nothing was
    restored. With records in those changelog partitions the worker stops (exit 75) before
    any input applies; with none (a new deployment) it goes on."""
    from streams.runtime.failstop import UNRESTORED
    from streams.runtime.restored import StateNotRestored, check_restored

    asked: list[list[int]] = []

    def ends(found: dict[int, int]) -> Any:
        async def end_offsets(partitions: list[int]) -> dict[int, int]:
            asked.append(partitions)
            return found

        return end_offsets

    await check_restored([0, 1], [0, 1, 2], ends({}), "cl")  # all there: nothing asked
    assert asked == []
    with pytest.raises(StateNotRestored, match=r"input partitions \[1\] were assigned without"):
        await check_restored([0, 1, 3], [0], ends({1: 40, 3: 0}), "cl")
    assert asked == [[1, 3]]
    await check_restored([0, 1], [], ends({0: 0, 1: 0}), "cl")  # empty: a new deployment
    await check_restored([0, 1], [], ends({}), "cl")  # no topic yet
    assert fault_of(StateNotRestored("x")) is UNRESTORED and UNRESTORED.code == EXIT_RESTART
