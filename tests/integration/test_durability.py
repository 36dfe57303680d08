"""Durable state after a SIGKILL at each step of a batch (issue 9, item 4).

`streams.runtime.faults.KillSwitch` (`ORACULAR_TEST_KILL_AT=STEP:N`) SIGKILLs the worker right after
one step of its N-th batch: `outputs` (delivered), `stored` (local RocksDB written), `changelog`
(changelog records acknowledged) or `acked` (inputs acknowledged). For each step, with the
datadir kept or deleted, a worker applies a generated stream while it is produced, its timer
closing episodes by event time all along, is killed there, restarts without the hook and
finishes the stream (`closed_by_a_later_day` makes every episode due by event time). Once it
has stopped cleanly, for every user:

1. the last changelog value's engine state is the replay's final state, without
   `close_due`: a timer close stored locally before the kill must reach the changelog too;
2. the worker's local RocksDB value, read from its datadir with rocksdict, is byte for byte
   the last changelog value. Bytes, not decoded states: the stored value also carries the
   user's last applied offset, its input and episode counters, clock, timer close and tick
   offset, which a restore from the changelog must give back as they are, and every write
   puts the same bytes in both places;
3. every output id of the replay was published and every copy of an id equals the replay's.

The stream is produced in chunks, each once the worker's timer has ticked every partition
since the previous chunk, so ticks are spread through the worker's input (a stream produced
all at once before the worker starts is queued ahead of every tick in Faust's stream buffer,
and nothing would close before the kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from faust.stores.rocksdb import Store as RocksDBStore
from rocksdict import AccessType, Options, Rdict

from engine import Event
from schemas.stored import decode_stored
from streams.runtime.faults import KillSwitch
from streams.settings.topics import STATE_TABLE

from .conftest import WorkerFactory
from .support import FaustWorker, Record, wait_killed
from .test_worker import FAST_TICK_S, assert_no_dead_letters, closed_by_a_later_day, worker_for
from .worker_support import (
    PARTITIONS,
    Deployment,
    assert_outputs_equal,
    changelog_states,
    deployment,
    encode_event,
    expected_outputs,
    generate_stream,
    last_summary,
    partition_of,
    read_all,
    state_problems,
    wait_committed,
    wait_for_outputs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GENERATED = 3_600
USERS = 200
SEED = 19
WARM_UP = 1_300
"""Left out of the generated stream: in its first 1,300 events (about 35 minutes of event time)
every user is in a dense first session and no episode is due, so the timer would close nothing
that early. In the 2,300 events after them, episodes are due from about the 200th on."""
BATCH_MAX = "50"
CHUNK = 150
"""Events produced between two rounds of ticks: three batches or so."""
KILL_AT = {"outputs": 25, "stored": 25, "handed": 25, "changelog": 25, "acked": 25}
"""The how-manieth time the step is reached when it kills the worker: some 500 to 1,000 events
into the stream (batches of ticks included), after several rounds of ticks that closed
episodes. Outputs are delivered per batch, and states written about as often: a batch's
states are written once its outputs are acknowledged, by the next batch or an empty one when
the buffer is empty, and held for later ones only while a full batch (50) waits, which a
chunk of 150 events rarely leaves."""
SUMMARY_INTERVAL_S = "0.1"  # the killed run logs its counters often: its last line is recent
COMPLETION_TIMEOUT_S = 120.0  # the restart applies the rest and commits it (about 5 s, idle)
TICKS_TIMEOUT_S = 30.0  # the running worker's timer ticks every partition once more
OFFSET_KEY = RocksDBStore.offset_key
"""Where Faust keeps a partition DB's changelog offset (not a user)."""
TABLE_DB = re.compile(rf"^{re.escape(STATE_TABLE)}-(\d+)\.db$")


async def produce_between_ticks(
    dep: Deployment, events: Sequence[Event], worker: FaustWorker
) -> None:
    """Produce `events` in chunks of CHUNK, the next one once every ticks partition has a tick
    sent after the previous chunk, while `worker` runs; once it died, the rest at once."""
    ticks = [TopicPartition(dep.topics.ticks.name, p) for p in range(PARTITIONS)]
    producer = AIOKafkaProducer(bootstrap_servers=dep.bootstrap, acks="all", linger_ms=5)
    consumer = AIOKafkaConsumer(bootstrap_servers=dep.bootstrap, group_id=None)
    await producer.start()
    await consumer.start()
    try:
        for start in range(0, len(events), CHUNK):
            chunk = [encode_event(e) for e in events[start : start + CHUNK]]
            sent = [
                await producer.send(dep.topics.events.name, value, key=key) for key, value in chunk
            ]
            await asyncio.gather(*sent)
            ends = await consumer.end_offsets(ticks)
            deadline = time.monotonic() + TICKS_TIMEOUT_S
            while worker.running:
                now = await consumer.end_offsets(ticks)
                if all(now[tp] > ends[tp] for tp in ticks):
                    break
                assert time.monotonic() < deadline, f"no tick on every partition: {ends} {now}"
                await asyncio.sleep(0.05)
    finally:
        await consumer.stop()
        await producer.stop()


def local_table(datadir: Path) -> dict[int, dict[bytes, bytes]]:
    """Partition -> key -> value of the state table's RocksDB files under `datadir`.

    Faust keeps one DB per partition, `<tabledir>/oracular-state-<partition>.db`; each also
    holds Faust's changelog offset under `OFFSET_KEY`, which is left out. Opened read-only,
    in the raw mode Faust writes them in (keys and values are the bytes the worker wrote).
    """
    paths = [p for p in datadir.rglob(f"{STATE_TABLE}-*.db") if TABLE_DB.match(p.name)]
    found: dict[int, dict[bytes, bytes]] = {}
    for path in paths:
        match = TABLE_DB.match(path.name)
        assert match is not None
        partition = int(match.group(1))
        assert partition not in found, f"two DBs for partition {partition}: {paths}"
        db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            found[partition] = {k: v for k, v in db.items() if k != OFFSET_KEY}
        finally:
            db.close()
    assert sorted(found) == list(range(PARTITIONS)), f"table DBs under {datadir}: {paths}"
    return found


def last_changelog_values(records: Iterable[Record]) -> dict[bytes, tuple[int, bytes]]:
    """Key -> (partition, value) of the last changelog record per key (tombstones delete)."""
    last: dict[bytes, tuple[int, bytes]] = {}
    for record in records:
        assert record.key is not None, f"changelog record without a key: {record}"
        if record.value is None:
            last.pop(record.key, None)
        else:
            last[record.key] = (record.partition, record.value)
    return last


def _fields(raw: bytes, dep: Deployment) -> str:
    """The stored value's fields besides the engine state, for a failure message."""
    user = decode_stored(raw, dep.config)
    return (
        f"partition={user.partition} last_offset={user.last_offset} inputs={user.inputs} "
        f"episodes={user.episodes} clock={user.clock} timer_close={user.timer_close} "
        f"tick_offset={user.tick_offset} episode_open={user.state.episode.started_at is not None}"
    )


def local_problems(
    local: Mapping[int, Mapping[bytes, bytes]],
    changelog: Mapping[bytes, tuple[int, bytes]],
    dep: Deployment,
) -> list[str]:
    """Where the local RocksDB values are not the last changelog values, byte for byte (and
    keys stored or logged on a partition that is not their own)."""
    problems = []
    merged: dict[bytes, bytes] = {}
    for partition, rows in local.items():
        for key, value in rows.items():
            if partition_of(key) != partition:
                problems.append(f"{key!r} is in partition {partition}'s DB")
            merged[key] = value
    for key, (partition, _) in changelog.items():
        if partition_of(key) != partition:
            problems.append(f"{key!r}'s last changelog record is on partition {partition}")
    problems += [f"{k!r} only in the changelog" for k in sorted(set(changelog) - set(merged))]
    problems += [f"{k!r} only in the local store" for k in sorted(set(merged) - set(changelog))]
    for key in sorted(set(merged) & set(changelog)):
        value, logged = merged[key], changelog[key][1]
        if value != logged:
            problems.append(
                f"{key!r}: local [{_fields(value, dep)}] != changelog [{_fields(logged, dep)}]"
            )
    return problems


def timer_writes(values: Iterable[bytes], dep: Deployment) -> int:
    """How many of the stored `values` a tick wrote (a timer close)."""
    return sum(decode_stored(v, dep.config).tick_offset is not None for v in values)


async def committed_ticks(dep: Deployment) -> dict[int, int]:
    """Ticks partition -> the app's committed offset there."""
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(dep.app_id)
    finally:
        await admin.close()
    return {
        tp.partition: m.offset for tp, m in offsets.items() if tp.topic == dep.topics.ticks.name
    }


async def crash_picture(dep: Deployment, datadir: Path) -> str:
    """What a killed worker left: users in its local store and the changelog, how many were
    last written by a timer close (a tick), by a tick not committed yet (the users the restart
    writes again when the datadir is kept), and how many local values the changelog lacks."""
    local = {k: v for rows in local_table(datadir).values() for k, v in rows.items()}
    logged = last_changelog_values(await read_all(dep.bootstrap, dep.changelog))
    committed = await committed_ticks(dep)
    by_tick = uncommitted = 0
    for raw in local.values():
        user = decode_stored(raw, dep.config)
        if user.tick_offset is not None:
            by_tick += 1
            uncommitted += user.tick_offset >= committed.get(user.partition, 0)
    ahead = [k for k, v in local.items() if k not in logged or logged[k][1] != v]
    ahead_by_tick = timer_writes((local[k] for k in ahead), dep)
    return (
        f"{len(local)} users in the local store, {len(logged)} in the changelog; "
        f"{by_tick} last written by a tick, {uncommitted} of them by an uncommitted tick; "
        f"{len(ahead)} local values not in the changelog ({ahead_by_tick} by a tick)"
    )


@contextlib.contextmanager
def explained_by(worker: FaustWorker) -> Iterator[None]:
    """A failed wait says what the worker's log says last."""
    try:
        yield
    except AssertionError as exc:
        msg = f"{exc}\nworker log {worker.log_path}, last lines:\n{worker.log_tail(40)}"
        raise AssertionError(msg) from exc


def _report(what: str, problems: list[str]) -> str:
    return f"{len(problems)} {what}, e.g.:\n" + "\n".join(problems[:10])


@pytest.mark.parametrize("datadir", ["kept", "deleted"])
@pytest.mark.parametrize("step", KillSwitch.STEPS)
async def test_state_is_durable_after_a_kill_at_each_step_of_a_batch(
    kafka: str,
    request: pytest.FixtureRequest,
    faust_worker: WorkerFactory,
    step: str,
    datadir: str,
) -> None:
    """Killed at `step` of a mid-stream batch and restarted: changelog = replay, local
    RocksDB = changelog (bytes), outputs = replay, for every user and id."""
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_BATCH_MAX": BATCH_MAX})
    events, until = closed_by_a_later_day(
        generate_stream(dep.config, events=GENERATED, users=USERS, seed=SEED)[WARM_UP:]
    )
    expected = expected_outputs(dep.config, events, until=until)
    await dep.create_topics()

    worker = worker_for(
        faust_worker,
        dep,
        ORACULAR_TICK_INTERVAL_S=FAST_TICK_S,
        ORACULAR_SUMMARY_INTERVAL_S=SUMMARY_INTERVAL_S,
        ORACULAR_TEST_KILL_AT=f"{step}:{KILL_AT[step]}",
    )
    worker.start()
    producing = asyncio.create_task(produce_between_ticks(dep, events, worker))
    try:
        await wait_killed(worker, step)
    finally:
        await producing  # the rest of the stream, at once after the kill
    killed = last_summary(worker.log_text(current_run_only=True))
    print(f"killed at {step}:{KILL_AT[step]}; last counters {killed}")
    print(f"at the kill: {await crash_picture(dep, worker.datadir)}")
    # The timer closed episodes by event time before the kill, and the stream was not done.
    assert killed["closed_by_timer"] > 0, killed
    assert killed["applied"] < len(events) // 2, killed
    if datadir == "deleted":
        shutil.rmtree(worker.datadir)  # the restart restores the table from the changelog

    del worker.env["ORACULAR_TEST_KILL_AT"]
    worker.start()
    with explained_by(worker):
        # Committed first: a partition left behind is named with its offsets.
        await wait_committed(dep, timeout_s=COMPLETION_TIMEOUT_S)
        await wait_for_outputs(dep, expected, timeout_s=COMPLETION_TIMEOUT_S)
    assert worker.stop() == 0
    counts = last_summary(worker.log_text(current_run_only=True))
    print(f"restarted run's counters: {counts}")
    assert counts["closed_by_timer"] > 0, counts

    changelog = await read_all(kafka, dep.changelog)
    problems = state_problems(changelog_states(changelog, dep.config), expected.states)
    assert not problems, _report("users' last changelog states differ from the replay", problems)
    problems = local_problems(local_table(worker.datadir), last_changelog_values(changelog), dep)
    assert not problems, _report("local RocksDB values differ from the changelog", problems)
    outputs = [r for topic in dep.outputs for r in await read_all(kafka, topic)]
    assert_outputs_equal(outputs, expected)
    await assert_no_dead_letters(dep)
