"""`oracular worker` end to end against the real broker, held to the offline replay.

Each test has its own topics (unique prefix) and app id. Expected messages and final states
come from `engine.replay` over the same events (worker_support.expected_outputs); the worker's
outputs must equal them id by id (duplicates allowed, every copy equal), and the state table's
changelog must end with the replay's final state for every user.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import msgpack
import pytest

from engine import END_OF_TIME, EngineConfig, Event
from schemas.outputs import decode_output
from streams.runtime.processor import HANDLED

from .conftest import WorkerFactory
from .support import FaustWorker, wait_killed
from .worker_support import (
    COMPLETION_TIMEOUT_S,
    NO_WALL_CLOCK,
    PARTITIONS,
    Deployment,
    Expected,
    TopicReader,
    assert_outputs_equal,
    assert_states_equal,
    deployment,
    distinct_ids,
    encode_event,
    expected_outputs,
    generate_stream,
    last_summary,
    produce_events,
    produce_many,
    read_all,
    relocate,
    sentinels,
    stream_shape,
    wait_committed,
    wait_for_outputs,
    wait_group_stable,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAY_MS = 24 * 3600 * 1000
LATENESS_MS = 120_000  # the default ORACULAR_LATENESS_MS
FAST_TICK_S = "0.25"
BACKFILL_PROPERTIES = 5  # many timer passes while a stream is applied: more timer closes to check

# Silent-user test: episode timeout and tick interval, and the slack on top of "timeout + two
# tick intervals" for the Kafka hops no tick can hide: the event's own produce -> fetch, the
# tick's produce -> fetch, the episode's produce -> our fetch, and the 0.05 s batch window.
# Each hop takes milliseconds idle, but a few hundred on this 2-core box under load.
SILENT_TIMEOUT_MS = 3_000
SILENT_TICK_S = 0.5
SILENT_SLACK_S = 1.5
TICKS_TIMEOUT_S = 30.0  # a started worker's timer has ticked every partition
SILENT_WAIT_S = 30.0  # long enough to see a late close and report how late it was


def worker_for(faust_worker: WorkerFactory, dep: Deployment, **env: str) -> FaustWorker:
    """A worker for `dep` (not yet started) running `oracular worker`."""
    return faust_worker("streams.worker", app_id=dep.app_id, env=dep.env(**env), argv=dep.argv())


async def assert_no_dead_letters(dep: Deployment) -> None:
    """Good input never reaches the dead-letter topic."""
    records = await read_all(dep.bootstrap, dep.topics.dlq.name)
    assert not records, f"dead letters for good input: {[r.value for r in records[:5]]}"


async def assert_equals_replay(
    dep: Deployment, expected: Expected, *, close_due: bool = False
) -> None:
    """Every output, every final state and an empty DLQ, as the offline replay has them."""
    records = await wait_for_outputs(dep, expected)
    assert_outputs_equal(records, expected)
    await assert_states_equal(dep, expected, close_due=close_due)
    await assert_no_dead_letters(dep)


def closed_by_a_later_day(events: list[Event]) -> tuple[list[Event], int]:
    """`events` and one event per partition a day after them, and the watermark that gives.

    Generated streams are months old: a worker that has caught up with them runs its clock on
    from their newest time at wall-clock speed, so it would take the timeout plus the lateness
    of real time to close the last episodes. These marks move every partition's watermark past
    all other deadlines by event time, as later traffic would.
    """
    marks = sentinels(events[-1].at + DAY_MS)
    return events + marks, marks[0].at - LATENESS_MS


def assert_stream_exercises_everything(dep: Deployment, events: list[Event]) -> None:
    """The generated stream has what the equivalence is about, not only page views."""
    shape = stream_shape(dep.config, events)
    assert shape["users"] >= 200, shape
    assert shape["ends"] > 50 and shape["revealed"] > 50 and shape["outcomes"] > 20, shape
    assert shape["long_gaps"] > 100, shape  # idle gaps longer than the episode timeout


async def test_live_run_equals_the_replay(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """Events produced in chunks to a running worker give the replay's messages and states."""
    dep = deployment(kafka, request.node.name, settings=NO_WALL_CLOCK)
    events = generate_stream(dep.config, events=5_000, users=200, seed=11)
    assert_stream_exercises_everything(dep, events)
    # Far after every deadline of the stream: each partition's watermark passes them all.
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    expected = expected_outputs(dep.config, events + marks, until=marks[0].at)

    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    chunk = len(events) // 4
    for start in range(0, len(events), chunk):
        await produce_events(kafka, dep.topics.events.name, events[start : start + chunk])
        # The worker catches up between chunks; with the huge grace only event time closes.
        await wait_committed(dep)
    await produce_events(kafka, dep.topics.events.name, marks)

    await assert_equals_replay(dep, expected)
    assert worker.stop() == 0
    # A clean stop: the agent ends with its stream, it does not crash on the way out.
    assert "Crashed reason" not in worker.log_text(), worker.log_tail()
    counts = last_summary(worker.log_text())
    assert counts["applied"] == len(events) + len(marks), counts
    # The timer closed idle episodes mid-stream, not only the ones the sentinels make due.
    assert counts["closed_by_timer"] > expected.closed_at_end, counts


async def test_silent_user_is_closed_on_time_by_the_wall_clock(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """A user who goes silent is closed at last event + timeout, within two ticks of it."""
    config_path = tmp_path / "silent.json"
    config_path.write_text(
        json.dumps(
            {
                "episodeTimeout": f"{SILENT_TIMEOUT_MS}ms",
                "intents": {
                    "upgrade": {"signals": {"pricing.viewed": 3}, "outcome": "upgrade.completed"}
                },
            }
        )
    )
    dep = deployment(
        kafka,
        request.node.name,
        config_path=config_path,
        settings={
            "ORACULAR_LATENESS_MS": "0",
            "ORACULAR_IDLE_MS": "0",
            "ORACULAR_TICK_INTERVAL_S": str(SILENT_TICK_S),
        },
    )
    await dep.create_topics()
    worker = worker_for(faust_worker, dep)
    worker.start()
    async with TopicReader(kafka, [dep.topics.ticks.name]) as ticks:
        await ticks.wait_for(
            lambda got: {r.partition for r in got} == set(range(PARTITIONS)),
            timeout_s=TICKS_TIMEOUT_S,
            what="a tick for every partition",
        )

    async with TopicReader(kafka, [dep.topics.episodes.name]) as episodes:
        await episodes.read_to_end()
        ts = int(time.time() * 1000)
        event = Event("silent-user", ts, name="pricing.viewed", id="s1")
        await produce_events(kafka, dep.topics.events.name, [event])
        records = await episodes.wait_for(
            lambda got: len(got) >= 1, timeout_s=SILENT_WAIT_S, what="the timeout close"
        )
        arrived_ms = time.time() * 1000
    record = records[0]
    print(
        f"closed {arrived_ms - ts:.0f} ms after the event, published at +{record.timestamp - ts} ms"
    )

    expected = expected_outputs(dep.config, [event], until=END_OF_TIME)
    [message] = expected.episodes.values()
    assert message["closed_at"] == ts + SILENT_TIMEOUT_MS and message["reason"] == "timeout"
    assert [decode_output(r.value) for r in records] == [message] * len(records)
    assert record.timestamp > ts + SILENT_TIMEOUT_MS, "published before the episode was due"
    bound_ms = SILENT_TIMEOUT_MS + (2 * SILENT_TICK_S + SILENT_SLACK_S) * 1000
    assert arrived_ms - ts <= bound_ms, f"closed {arrived_ms - ts:.0f} ms after the event"
    await assert_states_equal(dep, expected)
    assert worker.stop() == 0


async def test_backfill_closes_nothing_early(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """A fresh app id consuming an old topic from the start equals the replay to the end.

    Default time settings. The stream is months old; one last event per partition, a day
    after the rest, moves each watermark past every other deadline, and a live worker that
    catches up closes exactly what the replay closes by then (its clock then runs on from
    that day at wall-clock speed, which closes nothing more within the test).
    """
    dep = deployment(kafka, request.node.name)
    events = generate_stream(dep.config, events=5_000, users=200, seed=12)
    assert_stream_exercises_everything(dep, events)
    assert events[-1].at < time.time() * 1000 - 30 * DAY_MS, "wall time far past the events"
    marks = sentinels(events[-1].at + DAY_MS)
    expected = expected_outputs(dep.config, events + marks, until=marks[0].at - LATENESS_MS)
    await dep.create_topics()
    # About 2 KB per event, so each partition takes several fetches (1 MiB per partition each)
    # and the timer's ticks, queued behind the fetched events, are handled during the catch-up.
    await produce_events(
        kafka, dep.topics.events.name, events + marks, properties=BACKFILL_PROPERTIES
    )

    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    await assert_equals_replay(dep, expected)
    assert worker.stop() == 0
    # Whether ticks land inside the catch-up depends on the machine's speed, so that is
    # checked at the processor (tests/streams/test_time.py), not here.


@pytest.mark.parametrize("datadir", ["kept", "deleted"])
async def test_worker_killed_mid_stream_recovers_to_the_replay(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, datadir: str
) -> None:
    """Killed mid-stream and restarted (datadir kept or deleted): outputs and states as replayed.

    The worker kills itself once the outputs of its 20th batch (of 50 events, of 4,000) are
    delivered (`ORACULAR_TEST_KILL_AT`): a kill from the test after some outputs had arrived
    came, on a fast run, after the worker had finished."""
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_BATCH_MAX": "50"})
    events, until = closed_by_a_later_day(
        generate_stream(dep.config, events=4_000, users=200, seed=14)
    )
    expected = expected_outputs(dep.config, events, until=until)
    await dep.create_topics()
    # Several fetches per partition (see the backfill test): ticks come during the catch-ups.
    await produce_events(kafka, dep.topics.events.name, events, properties=BACKFILL_PROPERTIES)

    worker = worker_for(
        faust_worker,
        dep,
        ORACULAR_TICK_INTERVAL_S=FAST_TICK_S,
        ORACULAR_TEST_KILL_AT="outputs:20",
    )
    worker.start()
    await wait_killed(worker, "outputs")
    async with TopicReader(kafka, dep.outputs) as outputs:
        before = distinct_ids(await outputs.read_to_end())
    assert 0 < len(before) < len(expected.messages), "not killed mid-stream"
    if datadir == "deleted":
        shutil.rmtree(worker.datadir)  # the restart restores the table from the changelog

    del worker.env["ORACULAR_TEST_KILL_AT"]
    worker.start()
    # Timer closes are durable (rewritten after recovery when their tick was not committed):
    # the changelog equals the replay without closing anything by hand.
    await assert_equals_replay(dep, expected)
    assert worker.stop() == 0


GOOD_USERS = ("alice", "bob", "carol")


def user_stream(config: EngineConfig, user: str, events: int, seed: int) -> list[Event]:
    """A generated stream of one user, ids prefixed with the user."""
    return [
        Event(user, e.at, e.name, e.type, e.intent, f"{user}-{e.id}")
        for e in generate_stream(config, events=events, users=1, seed=seed)
    ]


BAD_INPUT = [
    # (key, value, the reason the dead letter must give)
    (b"alice", b"\xc1", r"not valid msgpack or JSON"),
    (b"alice", {"id": "b1", "user": "alice", "name": 42, "ts": 0}, r"field 'name' must be a "),
    (b"bob", {"id": "b2", "user": "bob", "name": "x", "ts": [1]}, r"field 'ts' must be epoch"),
    (b"alice", {"id": "b3", "name": "pricing.viewed", "ts": 0}, r"field 'user' is missing"),
    (b"bob", {"user": "bob", "type": "explode", "ts": 0}, r"field 'type' must be one of .*explode"),
    (
        b"alice",
        {"user": "alice", "name": "page.viewed", "ts": 0, "pad": "x" * 70_000},
        r"message is \d+ bytes; the limit is 65536",
    ),
    (b"\xff\xfealice", {"user": "alice", "name": "page.viewed", "ts": 0}, r"key is not UTF-8"),
    (
        b"alice",
        {"user": "alice", "type": "revealed", "intent": "teleport", "ts": 0},
        r"unknown intent 'teleport'",
    ),
    (b"bob", {"user": "alice", "name": "page.viewed", "ts": 0}, r"key 'bob' is not its user"),
]


async def test_bad_input_is_dead_lettered_and_good_input_still_applies(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """Each kind of bad message lands in the DLQ with its reason; the counters add up."""
    # The only summary line is then the one logged at shutdown.
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_SUMMARY_INTERVAL_S": "3600"})
    good = sorted(
        (e for n, user in enumerate(GOOD_USERS) for e in user_stream(dep.config, user, 40, n)),
        key=lambda e: e.at,
    )
    good, until = closed_by_a_later_day(good)
    expected = expected_outputs(dep.config, good, until=until)
    bad = [(key, v if isinstance(v, bytes) else msgpack.packb(v), why) for key, v, why in BAD_INPUT]
    ignored = (b"alice", msgpack.packb({"type": "identify", "userId": "alice"}))

    # Good messages (one of them JSON), a bad one after every fifth, the ignored one halfway.
    mixed = [encode_event(e) for e in good]
    mixed[1] = (mixed[1][0], json.dumps(msgpack.unpackb(mixed[1][1])).encode())
    for n, (key, value, _) in enumerate(bad):
        mixed.insert(5 + 6 * n, (key, value))
    mixed.insert(len(mixed) // 2, ignored)
    assert len(mixed) == len(good) + len(bad) + 1

    await dep.create_topics()
    worker = worker_for(faust_worker, dep)
    worker.start()
    sent = await produce_many(kafka, dep.topics.events.name, mixed)

    outputs = await wait_for_outputs(dep, expected)
    async with TopicReader(kafka, [dep.topics.dlq.name]) as reader:
        letters = await reader.wait_for(
            lambda got: len(got) >= len(bad), timeout_s=COMPLETION_TIMEOUT_S, what="dead letters"
        )
    assert_outputs_equal(outputs, expected)
    await assert_states_equal(dep, expected)

    # Every bad message, and nothing else, in the DLQ: its origin, its original bytes, a reason.
    reasons = {(key, value): why for key, value, why in bad}
    want = {
        (meta.partition, meta.offset): (key, value, reasons[(key, value)])
        for meta, (key, value) in zip(sent, mixed, strict=True)
        if (key, value) in reasons
    }
    got = {
        (m["partition"], m["offset"]): (r.key, m) for r in letters if (m := decode_output(r.value))
    }
    assert len(letters) == len(got) == len(bad) and set(got) == set(want), [
        m["error"] for _, m in got.values()
    ]
    for where, (key, value, why) in want.items():
        letter_key, letter = got[where]
        assert letter_key == key
        assert re.search(why, letter["error"]), f"{where}: {letter['error']!r} does not say {why!r}"
        assert letter == {
            "error": letter["error"],  # matched above
            "topic": dep.topics.events.name,
            "partition": where[0],
            "offset": where[1],
            "key": key,
            "value": value,
        }

    assert worker.stop() == 0
    lines = re.findall("oracular summary: .*", worker.log_text())
    assert len(lines) == 1, f"expected only the shutdown summary, got {lines}"
    counts = last_summary(worker.log_text())
    handled = sum(counts[name] for name in HANDLED)
    assert handled == len(mixed), counts
    assert (counts["applied"], counts["dead_lettered"], counts["ignored"]) == (
        len(good),
        len(bad),
        1,
    ), counts


async def test_a_second_worker_joining_mid_stream_changes_nothing(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Two workers sharing the app id (a rebalance mid-stream) give the replay's outputs."""
    dep = deployment(kafka, request.node.name, settings=NO_WALL_CLOCK)
    events = generate_stream(dep.config, events=5_000, users=200, seed=13)
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    expected = expected_outputs(dep.config, events + marks, until=marks[0].at)
    await dep.create_topics()
    first = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    first.start()
    split = len(events) * 2 // 5
    await produce_events(kafka, dep.topics.events.name, events[:split])
    await wait_committed(dep)

    second = relocate(
        worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S), tmp_path / "second"
    )
    second.start()
    await wait_group_stable(dep, members=2)
    await produce_events(kafka, dep.topics.events.name, events[split:])
    await produce_events(kafka, dep.topics.events.name, marks)

    await assert_equals_replay(dep, expected)
    assert second.stop() == 0
    assert first.stop() == 0
    assert last_summary(second.log_text())["applied"] > 0, "the second worker took partitions"


async def test_processes_flag_runs_workers_of_one_app_id_that_share_the_partitions(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """`oracular worker --processes 2`: two children, own datadirs, outputs as replayed."""
    dep = deployment(kafka, request.node.name)
    events, until = closed_by_a_later_day(
        generate_stream(dep.config, events=2_000, users=100, seed=15)
    )
    expected = expected_outputs(dep.config, events, until=until)
    await dep.create_topics()
    worker = faust_worker(
        "streams.worker",
        app_id=dep.app_id,
        env=dep.env(ORACULAR_TICK_INTERVAL_S=FAST_TICK_S),
        argv=[*dep.argv(), "--processes", "2"],
    )
    worker.start()
    await wait_group_stable(dep, members=2)
    await produce_events(kafka, dep.topics.events.name, events)
    await assert_equals_replay(dep, expected)
    assert worker.stop() == 0
    children = sorted(p.name for p in worker.datadir.iterdir() if p.name.startswith("p"))
    assert children == ["p0", "p1"], children
    assert "2 processes" in worker.log_text()
