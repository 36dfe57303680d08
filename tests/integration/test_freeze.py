"""A worker frozen while its changelog records were on their way, against the real broker.

A GC or VM pause (here SIGSTOP, at one exact step: `ORACULAR_TEST_KILL_AT=handed:1:stop`, right
after the worker handed a batch's changelog records to its producer) lets the group evict the
worker and another one take its partitions. When the frozen worker resumes, its records go out
*after* the new owner's, and it exits (code 75, streams/runtime/fencing.py) for a supervisor to
restart it. Its local RocksDB copies must not claim to hold changelog records they never read: were
it to store its own late records' offsets as the point its copies are restored from, a restart
would skip everything the new owner wrote before them, and go on from the committed offsets
with those users stale or missing (their inputs are never read again).

The test freezes worker A at its first changelog write, lets B apply the whole first part of
the stream while A is frozen, resumes A (which must exit 75), stops B, restarts A alone on its
own datadir and feeds it the rest: every output and every final state must be the replay's,
and A's local copies byte for byte the changelog's last values.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from streams.runtime.fencing import EXIT_FENCED

from .conftest import WorkerFactory
from .support import POLL_INTERVAL_S, FaustWorker
from .test_durability import last_changelog_values, local_problems, local_table
from .test_worker import DAY_MS, FAST_TICK_S, assert_equals_replay, worker_for
from .worker_support import (
    NO_WALL_CLOCK,
    deployment,
    expected_outputs,
    generate_stream,
    produce_events,
    read_all,
    relocate,
    sentinels,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FREEZE_TIMEOUT_S = 60.0  # the started worker reaches its first changelog write and stops
EXIT_TIMEOUT_S = 60.0  # the resumed worker notices the freeze, sends its repairs and exits


def process_state(worker: FaustWorker) -> str:
    """The process's state letter from /proc (T: stopped by a signal)."""
    stat = Path(f"/proc/{worker.pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


async def wait_frozen(worker: FaustWorker) -> None:
    """Wait until the worker stopped itself at its fault step."""
    await worker.wait_line_async("freezing the worker after handed", FREEZE_TIMEOUT_S)
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    while process_state(worker) != "T":
        if time.monotonic() > deadline:
            worker.fail(f"is not stopped (state {process_state(worker)})")
        await asyncio.sleep(POLL_INTERVAL_S)


async def test_a_worker_frozen_while_writing_restarts_without_stale_local_state(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    dep = deployment(
        kafka, request.node.name, settings={**NO_WALL_CLOCK, "ORACULAR_BATCH_MAX": "50"}
    )
    events = generate_stream(dep.config, events=1_500, users=120, seed=29)
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    expected = expected_outputs(dep.config, events + marks, until=marks[0].at)
    # A applies the first part and freezes at its write; B applies the first and the second
    # part meanwhile (A never sees the second); A, restarted, gets the third.
    first, second = len(events) // 3, len(events) * 2 // 3
    await dep.create_topics()

    frozen = worker_for(
        faust_worker,
        dep,
        ORACULAR_TICK_INTERVAL_S=FAST_TICK_S,
        ORACULAR_TEST_KILL_AT="handed:1:stop",
    )
    await produce_events(kafka, dep.topics.events.name, events[:first])
    frozen.start()
    await wait_frozen(frozen)

    # B takes every partition once A's session times out, and applies the first two parts.
    other = relocate(
        worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S), tmp_path / "other"
    )
    other.start()
    await produce_events(kafka, dep.topics.events.name, events[first:second])
    await wait_committed(dep)
    written_by_other = len(await read_all(kafka, dep.changelog))

    os.kill(frozen.pid, signal.SIGCONT)
    code = await frozen.wait_exit_async(EXIT_TIMEOUT_S)
    assert code == EXIT_FENCED, f"the resumed worker exited {code}:\n{frozen.log_tail()}"
    assert "frozen for" in frozen.log_text(current_run_only=True)
    # Its late records are in the changelog after the other worker's.
    assert len(await read_all(kafka, dep.changelog)) > written_by_other
    assert other.stop() == 0

    # A alone, on its own datadir: it restores what it lacks, then applies the rest.
    del frozen.env["ORACULAR_TEST_KILL_AT"]
    frozen.start()
    await produce_events(kafka, dep.topics.events.name, events[second:] + marks)
    await assert_equals_replay(dep, expected)
    assert frozen.stop() == 0
    changelog = last_changelog_values(await read_all(kafka, dep.changelog))
    problems = local_problems(local_table(frozen.datadir), changelog, dep)
    assert not problems, f"{len(problems)} local values differ from the changelog: {problems[:5]}"


async def test_a_long_step_while_the_changelog_is_on_its_way_is_no_freeze(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """A batch whose work holds the event loop up for over half the session timeout while
    the last changelog records travel (a backfill closing a hundred thousand episodes at
    once takes seconds) looks like a freeze to the worker's lease; it asks the group
    coordinator, hears it is still a member, and goes on: no exit, nothing lost."""
    dep = deployment(
        kafka, request.node.name, settings={**NO_WALL_CLOCK, "ORACULAR_BATCH_MAX": "50"}
    )
    events = generate_stream(dep.config, events=1_000, users=80, seed=31)
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    expected = expected_outputs(dep.config, events + marks, until=marks[0].at)
    await dep.create_topics()
    await produce_events(kafka, dep.topics.events.name, events[: len(events) // 2])
    worker = worker_for(
        faust_worker,
        dep,
        ORACULAR_TICK_INTERVAL_S=FAST_TICK_S,
        ORACULAR_TEST_KILL_AT="handed:2:block",
    )
    worker.start()
    await worker.wait_line_async("blocking the worker after handed", FREEZE_TIMEOUT_S)
    await produce_events(kafka, dep.topics.events.name, events[len(events) // 2 :] + marks)
    await assert_equals_replay(dep, expected)
    log = worker.log_text(current_run_only=True)
    assert worker.running, f"the worker exited:\n{worker.log_tail()}"
    assert "confirming it still belongs to its group" in log
    assert "frozen for" not in log
    assert "keepalive is not responding" not in log  # mode's check of a consumer thread
    assert worker.stop() == 0
