"""Faults of the worker's own machine (issue 45): each ends in a clean stop or an exact
recovery, and every output equals the offline replay's.

- A full disk (a small tmpfs, filled once the worker is ready; the guard off): the worker stops
  with exit 74 and one line, and once space is freed a restart gives the replay's outputs.
- The same disk with the guard on (ORACULAR_MIN_FREE_BYTES): input waits, the worker keeps
  running and says why, and takes input again once space is freed.
- A corrupt local copy (an .sst truncated, or bytes flipped inside one) of a stopped worker:
  the copy is set aside and restored from the changelog; more input after it, and the outputs
  equal the replay.
- Two workers on one datadir: the second is refused (exit 73) with one line.
- A stop with the broker gone: the worker ends within ORACULAR_SHUTDOWN_TIMEOUT_S, and the lost
  broker is not logged on every retry.

A tmpfs needs root: CI runs as root; elsewhere those tests are skipped (and say so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from rocksdict import Options, Rdict

from infra.broker import free_port, start_broker
from infra.processes import LoggedProcess
from streams.runtime.quiet_logs import BrokerUnreachable
from streams.settings.exits import (
    EXIT_DATADIR_IN_USE,
    EXIT_RESTART,
    EXIT_STOP_TIMEOUT,
    EXIT_STORAGE,
    EXIT_UNAVAILABLE,
)
from streams.settings.topics import STATE_TABLE
from tests.contract import contract_session

from .conftest import WorkerFactory
from .support import FaustWorker
from .test_serving import api_url
from .test_worker import FAST_TICK_S, assert_no_dead_letters, closed_by_a_later_day, worker_for
from .worker_support import (
    PARTITIONS,
    Deployment,
    assert_outputs_equal,
    deployment,
    expected_outputs,
    generate_stream,
    produce_events,
    wait_committed,
    wait_for_outputs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

EVENTS = 2_400
USERS = 300
SEED = 45
FAULT_TIMEOUT_S = 120.0  # the fault shows within seconds; this bounds a hang only
DISK = "24m"
FILL_CHUNKS = 4
"""The full-disk stream is produced in this many parts, until the worker stops."""
LEAVE_BYTES = 512 * 1024
"""Free space left on the worker's disk once it is ready: a few batches' states and WAL."""


@contextlib.contextmanager
def small_disk(path: Path, size: str = DISK) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the block: a disk that really fills."""
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path, leave: int) -> Path:
    """A file taking all of `disk`'s free space but `leave` bytes."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    size = st.f_bavail * st.f_frsize - leave
    with filler.open("wb") as f:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            size -= f.write(chunk[: min(size, len(chunk))])
    return filler


def on_disk(worker: FaustWorker, disk: Path) -> FaustWorker:
    worker.datadir = disk / "data"
    worker.env["ORACULAR_DATADIR"] = str(worker.datadir)
    return worker


def the_stream(dep: Deployment, events: int = EVENTS, users: int = USERS) -> tuple[list, int]:
    """A generated stream of `events` of `users`, and the watermark its last marks give."""
    return closed_by_a_later_day(generate_stream(dep.config, events=events, users=users, seed=SEED))


async def finish_and_compare(
    dep: Deployment, worker: FaustWorker, events: list, until: int, *, since: float | None = None
) -> None:
    """`worker` (running) ends the stream: every output equals the replay, no dead letter.
    With `since` (a monotonic time: the restart, or the fault's end), prints how long it took
    from then to commit the whole stream (the fault table's time to recover)."""
    expected = expected_outputs(dep.config, events, until=until)
    try:
        await wait_committed(dep, timeout_s=FAULT_TIMEOUT_S)
        if since is not None:
            took = time.monotonic() - since
            print(f"\n{dep.app_id}: the whole stream committed {took:.1f} s after the fault ended")
        records = await wait_for_outputs(dep, expected, timeout_s=FAULT_TIMEOUT_S)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nworker log:\n{worker.log_tail(60)}") from exc
    assert worker.stop() == 0
    assert_outputs_equal(records, expected)
    await assert_no_dead_letters(dep)


def stop_lines(worker: FaustWorker) -> list[str]:
    return [
        line
        for line in worker.log_text(current_run_only=True).splitlines()
        if line.startswith("oracular worker: stopped (")
    ]


async def full_disk(
    dep: Deployment, faust_worker: WorkerFactory, disk: Path, stream: tuple[list, int]
) -> None:
    """The datadir's disk fills mid-stream (the guard off): exit 74 and one line; a restart
    once space is freed (and the rest of the stream) gives the replay's outputs."""
    events, until = stream
    await dep.create_topics()
    worker = on_disk(
        worker_for(
            faust_worker, dep, ORACULAR_MIN_FREE_BYTES="0", ORACULAR_TICK_INTERVAL_S=FAST_TICK_S
        ),
        disk,
    )
    worker.start()
    filler = fill(disk, LEAVE_BYTES)
    produced, code = await produce_until_stopped(dep, worker, events)
    lines = stop_lines(worker)
    assert code == EXIT_STORAGE, worker.log_tail(60)
    assert len(lines) == 1 and "(storage in " in lines[0], lines
    assert "No space left on device" in lines[0] and "free space" in lines[0], lines
    assert "restarting" not in worker.log_text(current_run_only=True).lower()
    filler.unlink()
    restarted = time.monotonic()
    worker.start()
    await produce_events(dep.bootstrap, dep.topics.events.name, events[produced:])
    await finish_and_compare(dep, worker, events, until, since=restarted)


async def produce_until_stopped(
    dep: Deployment, worker: FaustWorker, events: list, chunks: int = FILL_CHUNKS
) -> tuple[int, int]:
    """Produce `events` a chunk at a time, each once the worker has taken the one before, until
    the worker exits; how many were produced, and its exit code. How much a stream writes to
    the disk depends on how the worker batches it (a loaded machine makes fewer, larger
    batches), so the disk is filled by more input, not by a margin tuned on a quiet machine."""
    size = -(-len(events) // chunks)
    for start in range(0, len(events), size):
        await produce_events(dep.bootstrap, dep.topics.events.name, events[start : start + size])
        exited = asyncio.ensure_future(worker.wait_exit_async(FAULT_TIMEOUT_S))
        taken = asyncio.ensure_future(wait_committed(dep, timeout_s=FAULT_TIMEOUT_S))
        done, pending = await asyncio.wait({exited, taken}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # a timeout of either fails the test here
        if exited in done:
            return start + size, exited.result()
    # all taken and still running: the timer's writes may be the last straw
    return len(events), await worker.wait_exit_async(FAULT_TIMEOUT_S)


@needs_root
async def test_a_full_disk_stops_the_worker_and_a_restart_equals_the_replay(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_BATCH_MAX": "50"})
    with small_disk(tmp_path / "disk") as disk:
        await full_disk(dep, faust_worker, disk, the_stream(dep, 4 * EVENTS, 4 * USERS))


@needs_root
async def test_a_low_disk_holds_input_until_there_is_space(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_BATCH_MAX": "50"})
    events, until = the_stream(dep)
    await dep.create_topics()
    with small_disk(tmp_path / "disk") as disk:
        worker = on_disk(
            worker_for(
                faust_worker,
                dep,
                ORACULAR_MIN_FREE_BYTES=str(2 * LEAVE_BYTES),
                ORACULAR_TICK_INTERVAL_S=FAST_TICK_S,
            ),
            disk,
        )
        worker.start()
        filler = fill(disk, LEAVE_BYTES)
        await produce_events(kafka, dep.topics.events.name, events)
        await worker.wait_line_async("no input is taken until there is space", FAULT_TIMEOUT_S)
        assert worker.running
        filler.unlink()
        await worker.wait_line_async("bytes free again: taking input", FAULT_TIMEOUT_S)
        await finish_and_compare(dep, worker, events, until)


def _compact(datadir: Path) -> list[Path]:
    """Flush every state partition's database of a stopped worker to .sst files (as a worker
    that ran long has them); the .sst files, largest first."""
    for db_path in datadir.rglob(f"{STATE_TABLE}-*.db"):
        db = Rdict(str(db_path), Options(raw_mode=True))
        db.flush()
        db.compact_range(None, None)
        db.close()
    return sorted(datadir.rglob("*.sst"), key=lambda p: p.stat().st_size, reverse=True)


async def corrupt_copy(
    dep: Deployment, faust_worker: WorkerFactory, damage: str, stream: tuple[list, int]
) -> None:
    """Half the stream, a clean stop, one .sst damaged; the restart sets the copy aside and
    restores it (a flip: found by the first scan, exit 75, restored by the next start);
    lookups never answer the prior for a user whose state exists; the rest of the stream, and
    every output equals the replay."""
    events, until = stream
    half = len(events) // 2
    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    await produce_events(dep.bootstrap, dep.topics.events.name, events[:half])
    await wait_committed(dep, timeout_s=FAULT_TIMEOUT_S)
    assert worker.stop() == 0
    sst = _compact(worker.datadir)[0]
    if damage == "truncated":
        os.truncate(sst, sst.stat().st_size // 2)
    else:
        with sst.open("r+b") as f:
            f.seek(sst.stat().st_size // 3)
            f.write(os.urandom(200))
    restarted = time.monotonic()
    if damage == "flipped":
        LoggedProcess.start(worker)  # not ready: the scan runs in the restore, before that
        code = await worker.wait_exit_async(FAULT_TIMEOUT_S)
        lines = stop_lines(worker)
        assert code == EXIT_RESTART, worker.log_tail(60)
        assert len(lines) == 1 and "(corrupt store in " in lines[0] and "moved to" in lines[0]
        worker.start()  # as a supervisor restarts it
    else:  # found when opened: set aside and restored at once
        worker.start()
        assert "is corrupt" in worker.log_text(current_run_only=True)
    set_aside = list(worker.datadir.rglob("set-aside/*"))
    assert len(set_aside) == 1 and set_aside[0].name.startswith(sst.parent.name), set_aside
    known = sorted({e.user for e in events[:half]})
    answers = await lookup_all(api_url(worker), known)
    unknown = [user for user, status in answers.items() if status == "unknown"]
    assert not unknown, f"{len(unknown)} users with a state answered as unknown: {unknown[:5]}"
    took = time.monotonic() - restarted
    print(f"\n{dep.app_id}: {damage} copy restored, {len(known)} users answered, {took:.1f} s")
    await produce_events(dep.bootstrap, dep.topics.events.name, events[half:])
    await finish_and_compare(dep, worker, events, until, since=restarted)


async def lookup_all(url: str, users: list[str]) -> dict[str, str]:
    """User -> the status of its lookup (`found`, `unknown`, `unavailable`, `error`)."""
    statuses: dict[str, str] = {}
    async with contract_session() as http:
        for start in range(0, len(users), 1_000):
            chunk = users[start : start + 1_000]
            async with http.post(f"{url}/v1/lookup", json={"users": chunk}) as response:
                assert response.status == 200, await response.text()
                body = await response.json()
            statuses.update({r["user"]: r["status"] for r in body["results"]})
    return statuses


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
async def test_a_corrupt_local_copy_is_restored_from_the_changelog(
    kafka: str,
    request: pytest.FixtureRequest,
    faust_worker: WorkerFactory,
    damage: str,
) -> None:
    dep = deployment(
        kafka,
        request.node.name,
        settings={"ORACULAR_BATCH_MAX": "50", "ORACULAR_API_PORT": "0"},
    )
    await corrupt_copy(dep, faust_worker, damage, the_stream(dep))


async def test_a_second_worker_on_the_same_datadir_is_refused(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    dep = deployment(kafka, request.node.name)
    await dep.create_topics()
    first = worker_for(faust_worker, dep)
    first.start()
    second = worker_for(faust_worker, dep)
    second.env["ORACULAR_DATADIR"] = str(first.datadir)
    second.log_path = tmp_path / "second.log"
    LoggedProcess.start(second)
    assert await second.wait_exit_async(FAULT_TIMEOUT_S) == EXIT_DATADIR_IN_USE
    log = second.log_text(current_run_only=True)
    assert f"the datadir {first.datadir} is in use by another worker" in log, log
    assert "Traceback" not in log, log
    assert first.running
    assert first.stop() == 0


async def test_a_stop_with_the_broker_gone_ends_within_the_timeout(
    request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    broker = await asyncio.to_thread(  # it runs its own event loop
        start_broker, tmp_path / "own-broker", port=None, stop_with_parent=True
    )
    try:
        dep = deployment(broker.bootstrap, request.node.name)
        await dep.create_topics()
        worker = worker_for(faust_worker, dep, ORACULAR_SHUTDOWN_TIMEOUT_S="5")
        worker.env["ORACULAR_BROKER"] = broker.bootstrap
        worker.start()
        await produce_events(broker.bootstrap, dep.topics.events.name, the_stream(dep)[0][:200])
        await wait_committed(dep, timeout_s=FAULT_TIMEOUT_S)
        await asyncio.to_thread(broker.stop)
        await worker.wait_line_async("the broker looks unreachable", FAULT_TIMEOUT_S)
        started = time.monotonic()
        assert worker.signal_and_wait(signal.SIGTERM, 60), "the stop was not bounded"
        took = time.monotonic() - started
        assert worker.process is not None
        assert worker.process.returncode in (0, EXIT_STOP_TIMEOUT), worker.log_tail(40)
        assert took < 5 + 25, took  # the timeout, and the interpreter's exit on a busy machine
        log = worker.log_text(current_run_only=True)
        retries = sum(log.count(prefix) for prefix in BrokerUnreachable.PREFIXES)
        assert retries <= 3, f"{retries} lines for one lost broker"
    finally:
        await asyncio.to_thread(broker.stop, wipe=True)


async def _changelog_refused(worker: FaustWorker, says: str) -> None:
    LoggedProcess.start(worker)
    assert await worker.wait_exit_async(FAULT_TIMEOUT_S) == EXIT_UNAVAILABLE
    log = worker.log_text(current_run_only=True)
    assert says in log and "Traceback" not in log, log


async def test_a_changelog_deleted_while_the_worker_was_down_is_refused_at_start(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """Faust would create it again empty and the worker would go on from the committed offsets
    with every user forgotten: the start is refused, saying how to restore or start over."""
    dep = deployment(kafka, request.node.name)
    await dep.create_topics()
    worker = worker_for(faust_worker, dep)
    worker.start()
    await produce_events(kafka, dep.topics.events.name, the_stream(dep)[0][:300])
    await wait_committed(dep, timeout_s=FAULT_TIMEOUT_S)
    assert worker.stop() == 0
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        await admin.delete_topics([dep.changelog])
        deadline = time.monotonic() + FAULT_TIMEOUT_S
        while dep.changelog in await admin.list_topics():
            assert time.monotonic() < deadline, "the changelog was not deleted"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    await _changelog_refused(worker, f"the changelog topic {dep.changelog} is missing, but app id")


async def test_a_changelog_with_fewer_partitions_than_the_input_is_refused_at_start(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    dep = deployment(kafka, request.node.name)
    await dep.create_topics()
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(dep.changelog, PARTITIONS - 1, 1)])
    finally:
        await admin.close()
    await _changelog_refused(
        worker_for(faust_worker, dep),
        f"the changelog topic {dep.changelog} has {PARTITIONS - 1} partitions, but the input "
        f"has {PARTITIONS}",
    )


async def test_a_worker_started_without_a_broker_says_how_to_start_one(
    request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Nothing listens where the broker should be: one line saying so and how to start one,
    exit 69, within the broker check's bound; nothing written to the datadir."""
    nowhere = f"127.0.0.1:{free_port()}"
    dep = deployment(nowhere, request.node.name)
    worker = worker_for(faust_worker, dep)
    worker.env["ORACULAR_BROKER"] = nowhere
    LoggedProcess.start(worker)
    assert await worker.wait_exit_async(FAULT_TIMEOUT_S) == EXIT_UNAVAILABLE
    log = worker.log_text(current_run_only=True)
    assert "make broker-up" in log and "Traceback" not in log, log
