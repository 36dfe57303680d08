"""Real holes in the input's offsets, against the real broker: the worker neither hangs nor loses.

With Faust's dropped-input bug patched (streams/faust/delivery.py), a jump in a partition's
offsets is a hole in the log itself, and the worker counts it and goes on:
- transactions: each commit or abort writes a marker that takes an offset, and the records of
  an aborted transaction are never delivered (the worker reads committed records only);
- retention (here `delete_records`) removing a partition's head before the worker read it,
  including past the worker's own committed offset.
Each test compares the worker's outputs and final states with the offline replay of exactly
the records a committed reader sees, and waits for the group's commits to pass the last record
of every partition (a commit stuck before a hole would never get there). Faust commits one past
the last acknowledged record, so a partition that ends in a transaction marker stays committed
at that marker until a record follows it; re-reading a marker delivers nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from engine import Event

from .conftest import WorkerFactory
from .support import POLL_INTERVAL_S, FaustWorker
from .worker_support import (
    CAUGHT_UP_TIMEOUT_S,
    NO_WALL_CLOCK,
    PARTITIONS,
    Deployment,
    assert_outputs_equal,
    assert_states_equal,
    deployment,
    encode_event,
    expected_outputs,
    generate_stream,
    last_summary,
    partition_of,
    produce_many,
    read_all,
    sentinels,
    wait_committed,
    wait_for_outputs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAY_MS = 24 * 3600 * 1000
# Only event time closes episodes; one sentinel event per partition, far after the stream,
# makes every episode due, as in test_worker.py.
SETTINGS = {**NO_WALL_CLOCK, "ORACULAR_TICK_INTERVAL_S": "0.25"}
CHUNK = 40  # events per produce step (plain, committed transaction, aborted transaction)


def worker_for(faust_worker: WorkerFactory, dep: Deployment) -> FaustWorker:
    """A worker for `dep` (not yet started) running `oracular worker`."""
    return faust_worker("streams.worker", app_id=dep.app_id, env=dep.env(), argv=dep.argv())


async def assert_equals_replay_of(dep: Deployment, events: Sequence[Event], until: int) -> None:
    """Outputs and final states equal the offline replay of `events` up to `until`; no dead
    letters."""
    expected = expected_outputs(dep.config, list(events), until=until)
    records = await wait_for_outputs(dep, expected)
    assert_outputs_equal(records, expected)
    await assert_states_equal(dep, expected)
    letters = await read_all(dep.bootstrap, dep.topics.dlq.name)
    assert not letters, f"dead letters for good input: {[r.value for r in letters[:5]]}"


async def wait_committed_past(
    dep: Deployment, last: Mapping[int, int], *, timeout_s: float = CAUGHT_UP_TIMEOUT_S
) -> None:
    """Wait until the app's group has committed each input partition past its record at
    offset `last[partition]`."""
    topic = dep.topics.events.name
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            committed = await admin.list_consumer_group_offsets(dep.app_id)
            behind = {
                p: (committed[tp].offset if tp in committed else None, offset)
                for p, offset in last.items()
                if (tp := TopicPartition(topic, p)) not in committed
                or committed[tp].offset <= offset
            }
            if not behind:
                return
            if time.monotonic() > deadline:
                msg = (
                    f"group {dep.app_id} did not commit {topic} past its last records within "
                    f"{timeout_s:.0f} s; partition: (committed, last record) {behind}"
                )
                raise AssertionError(msg)
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        await admin.close()


def aborted_copy(events: Sequence[Event]) -> list[Event]:
    """The same users' events under other ids and names: applied, they would change states
    and outputs, so an aborted record that reaches the worker fails the comparison."""
    return [
        Event(e.user, e.at, name="pricing.viewed", id=f"aborted-{e.id}")
        for e in events
        if e.type == "event"
    ]


async def produce_transactionally(
    bootstrap: str, topic: str, steps: Sequence[tuple[str, Sequence[Event]]]
) -> dict[int, int]:
    """Produce `steps` in order: ("plain", events) with an ordinary producer, ("commit",
    events) and ("abort", events) each as one transaction of a transactional producer.

    Returns partition -> offset of its last committed record.
    """
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    txn = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{topic}-txn", enable_idempotence=True
    )
    last: dict[int, int] = {}
    await plain.start()
    await txn.start()
    try:
        for kind, events in steps:
            records = [encode_event(e) for e in events]
            producer = plain if kind == "plain" else txn
            if kind != "plain":
                await txn.begin_transaction()
            sent = [await producer.send(topic, value, key=key) for key, value in records]
            metadata = await asyncio.gather(*sent)  # in the log before a transaction ends
            if kind == "abort":
                await txn.abort_transaction()
                continue
            if kind == "commit":
                await txn.commit_transaction()
            for meta in metadata:
                last[meta.partition] = max(last.get(meta.partition, -1), meta.offset)
        return last
    finally:
        await txn.stop()
        await plain.stop()


async def test_transactions_on_the_input_apply_committed_records_only(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """Plain records, committed and aborted transactions interleaved on the input: the worker
    applies exactly the committed records, counts the holes markers leave, and commits on."""
    dep = deployment(kafka, request.node.name, settings=SETTINGS)
    events = generate_stream(dep.config, events=1_200, users=80, seed=31)
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    chunks = [events[i : i + CHUNK] for i in range(0, len(events), CHUNK)]
    steps: list[tuple[str, Sequence[Event]]] = []
    for n, chunk in enumerate(chunks):
        if n % 3 == 2:
            steps.append(("abort", aborted_copy(chunk)))
        steps.append(("plain" if n % 3 == 0 else "commit", chunk))
    steps.append(("commit", marks))  # every partition ends in a transaction marker
    assert {kind for kind, _ in steps} == {"plain", "commit", "abort"}

    await dep.create_topics()
    # All of it before the worker starts: it reads a log with every kind of hole in it, and
    # no partition is caught up (so no wall clock closes anything) before its end.
    last = await produce_transactionally(kafka, dep.topics.events.name, steps)
    worker = worker_for(faust_worker, dep)
    worker.start()

    await assert_equals_replay_of(dep, events + marks, until=marks[0].at)
    await wait_committed_past(dep, last)
    assert worker.stop() == 0
    counts = last_summary(worker.log_text())
    assert counts["applied"] == len(events) + len(marks), counts
    assert counts["gaps"] > 0, counts  # the markers left holes, and the worker went on


async def test_input_deleted_by_retention_before_it_was_read(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """A worker stops; input arrives; retention deletes the head of it, past the worker's
    committed offsets. Restarted, the worker reads from the log start on every partition,
    counts the holes, and equals the replay of the records that were still there."""
    dep = deployment(kafka, request.node.name, settings=SETTINGS)
    events = generate_stream(dep.config, events=1_600, users=80, seed=32)
    # The second part a day later, so the records the deletion takes leave no episode of the
    # first part open across the hole in the worker that the replay would close otherwise.
    first = events[:800]
    second = [Event(e.user, e.at + DAY_MS, e.name, e.type, e.intent, e.id) for e in events[800:]]
    topic = dep.topics.events.name
    await dep.create_topics()
    await produce_many(kafka, topic, (encode_event(e) for e in first))
    worker = worker_for(faust_worker, dep)
    worker.start()
    await wait_committed(dep)
    assert worker.stop() == 0

    sent = await produce_many(kafka, topic, (encode_event(e) for e in second))
    offsets = {p: sorted(m.offset for m in sent if m.partition == p) for p in range(PARTITIONS)}
    assert all(len(o) >= 20 for o in offsets.values()), "every partition got a second part"
    # Delete the first quarter of each partition's second part: the committed offset (its
    # first offset) is then below the log start.
    cut = {p: o[len(o) // 4] for p, o in offsets.items()}
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        await admin.delete_records(
            {TopicPartition(topic, p): RecordsToDelete(before_offset=c) for p, c in cut.items()}
        )
    finally:
        await admin.close()
    kept = [e for e, meta in zip(second, sent, strict=True) if meta.offset >= cut[meta.partition]]
    assert len(kept) < len(second) and {partition_of(e.user.encode()) for e in kept} == set(
        range(PARTITIONS)
    )

    marks = sentinels(second[-1].at + 30 * DAY_MS)
    await produce_many(kafka, topic, (encode_event(e) for e in marks))

    worker.start()
    await assert_equals_replay_of(dep, first + kept + marks, until=marks[0].at)
    await wait_committed(dep)
    assert worker.stop() == 0
    counts = last_summary(worker.log_text())
    assert counts["gaps"] == PARTITIONS, counts  # one hole per partition, where it was cut
    for p, c in cut.items():  # lost input is a warning naming the deleted offsets
        assert f"input partition {p}: offsets {offsets[p][0]}..{c - 1} were deleted" in (
            worker.log_text()
        )
    assert counts["applied"] == len(kept) + len(marks), counts
