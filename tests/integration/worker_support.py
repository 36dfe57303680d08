"""Helpers for the `oracular worker` tests: deployments, streams, expected outputs, readers.

The reference is the offline replay of the same events (`streams.tools.replay.replay_outputs`,
what `oracular replay` runs). Every wait is bounded by a named timeout and fails saying what
was seen.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import RecordMetadata

from bench.synthetic import FILLER, clickstream, closing_marks
from engine import END_OF_TIME, EngineConfig, Event, close_if_due, serialize
from infra.broker import REPO_ROOT
from schemas.config import load_config
from schemas.events import encode_event as schema_encode_event
from schemas.outputs import decode_output
from schemas.stored import decode_stored
from streams.runtime.erasure import is_marker
from streams.runtime.processor import EPISODES, PREDICTIONS
from streams.settings import product_topics
from streams.settings.topics import STATE_TABLE, ProductTopics
from streams.tools.admin import ensure_topics_async
from streams.tools.replay import replay_outputs

from .support import POLL_INTERVAL_S, FaustWorker, Record, unique_name

PARTITIONS = 4
NO_WALL_CLOCK = {"ORACULAR_IDLE_MS": str(10 * 365 * 24 * 3600 * 1000)}
"""Worker settings under which only event time moves watermarks (the wall clock never)."""
"""Ten years: wall clock minus this never reaches the events, so only event time counts."""
EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "oracular.yaml"

# Bounds for a 2-core box running the broker, one or two workers and the test process.
COMPLETION_TIMEOUT_S = 60.0  # a few thousand events applied and all outputs published
CAUGHT_UP_TIMEOUT_S = 60.0  # a produced chunk applied and its offsets committed
STATES_TIMEOUT_S = 30.0  # outputs seen -> the batch's state writes visible in the changelog
TOPIC_METADATA_TIMEOUT_S = 30.0  # a topic the worker creates shows up in the metadata
GROUP_STABLE_TIMEOUT_S = 60.0  # a joining worker's rebalance completes
READ_TO_END_TIMEOUT_S = 30.0  # reading a topic up to its current end offsets


# --- deployments --------------------------------------------------------------------------


@dataclass
class Deployment:
    """One test's product topics, app id and worker settings (unique names per test)."""

    bootstrap: str
    app_id: str
    prefix: str
    config_path: Path
    config: EngineConfig
    settings: dict[str, str]
    topics: ProductTopics = field(init=False)

    def __post_init__(self) -> None:
        env = {"ORACULAR_TOPIC_PREFIX": self.prefix, "ORACULAR_PARTITIONS": str(PARTITIONS)}
        self.topics = product_topics(env)

    @property
    def changelog(self) -> str:
        """The state table's changelog topic (Faust names it <app id>-<table>-changelog)."""
        return f"{self.app_id}-{STATE_TABLE}-changelog"

    @property
    def outputs(self) -> list[str]:
        """The predictions and episodes topics."""
        return [self.topics.predictions.name, self.topics.episodes.name]

    def env(self, **overrides: str) -> dict[str, str]:
        """The worker's ORACULAR_* environment."""
        return {
            "ORACULAR_TOPIC_PREFIX": self.prefix,
            "ORACULAR_PARTITIONS": str(PARTITIONS),
            "ORACULAR_SUMMARY_INTERVAL_S": "5",
            "ORACULAR_COMMIT_INTERVAL_S": "0.5",
            # A killed worker leaves the group after this (the broker's minimum is 6 s).
            "ORACULAR_SESSION_TIMEOUT_S": "6",
            **self.settings,
            **overrides,
        }

    def argv(self) -> list[str]:
        """`oracular worker` as the tests run it."""
        return [
            sys.executable,
            "-m",
            "streams.cli",
            "worker",
            "--config",
            str(self.config_path),
            "--loglevel",
            "info",
        ]

    async def create_topics(self) -> None:
        """Create the product topics now, so events can be produced before a worker runs."""
        await ensure_topics_async(self.bootstrap, list(self.topics))


def deployment(
    bootstrap: str,
    test_name: str,
    *,
    config_path: Path = EXAMPLE_CONFIG,
    settings: Mapping[str, str] | None = None,
) -> Deployment:
    """A Deployment with a unique app id and topic prefix for `test_name`."""
    return Deployment(
        bootstrap=bootstrap,
        app_id=unique_name(f"{test_name}-app"),
        prefix=unique_name(test_name),
        config_path=config_path,
        config=load_config(config_path),
        settings=dict(settings or {}),
    )


def relocate(worker: FaustWorker, directory: Path) -> FaustWorker:
    """Give `worker` its own datadir and log under `directory` (a second worker, same app id)."""
    worker.datadir = directory / "data"
    worker.env["ORACULAR_DATADIR"] = str(worker.datadir)
    worker.log_path = directory / "worker.log"
    return worker


# --- streams ------------------------------------------------------------------------------


def generate_stream(config: EngineConfig, *, events: int, users: int, seed: int) -> list[Event]:
    """A globally time-sorted clickstream with sign-outs, outcomes, long gaps and reveals.

    `bench.synthetic.clickstream` gives the events; about 8% of its filler page views become
    `revealed` commands for a declared intent, at the same time and with the same id.
    """
    rng = random.Random(seed)
    intents = sorted(config.intents)
    out = []
    for event in clickstream(config, events, users, seed):
        if event.type == "event" and event.name in FILLER and rng.random() < 0.08:
            intent = rng.choice(intents)
            out.append(Event(event.user, event.at, type="revealed", intent=intent, id=event.id))
        else:
            out.append(event)
    return out


def stream_shape(config: EngineConfig, events: Sequence[Event]) -> dict[str, int]:
    """Counts of what the stream exercises, so a test can say its stream is not degenerate."""
    outcomes = {i.outcome for i in config.intents.values() if i.outcome}
    last: dict[str, int] = {}
    long_gaps = 0
    for event in events:
        if event.user in last and event.at - last[event.user] > config.episode_timeout_ms:
            long_gaps += 1
        last[event.user] = event.at
    return {
        "events": len(events),
        "users": len(last),
        "ends": sum(e.type == "end" for e in events),
        "revealed": sum(e.type == "revealed" for e in events),
        "outcomes": sum(e.name in outcomes for e in events),
        "long_gaps": long_gaps,
    }


def partition_of(key: bytes, partitions: int = PARTITIONS) -> int:
    """The partition aiokafka's default (murmur2, Java-compatible) partitioner picks for `key`."""
    every = list(range(partitions))
    return int(DefaultPartitioner()(key, every, every))


def sentinels(at: int, partitions: int = PARTITIONS) -> list[Event]:
    """One event per partition, by a user whose id hashes there, at time `at`."""
    return closing_marks(at, partitions)


def encode_event(event: Event, *, properties: int = 0) -> tuple[bytes, bytes]:
    """(key, value) of an input message: key = user id, value = the native msgpack map.

    `properties` > 0 adds that many 400-character analytics properties (about 0.4 KB each),
    which the worker ignores, as producers' extra fields are.
    """
    extra = {"properties": {f"p{n}": "x" * 400 for n in range(properties)}} if properties else {}
    return event.user.encode(), schema_encode_event(event, **extra)


async def produce_many(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]
) -> list[RecordMetadata]:
    """Send records in order (murmur2 on the key) and wait until the broker has all of them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in records]
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


async def produce_events(
    bootstrap: str, topic: str, events: Iterable[Event], *, properties: int = 0
) -> None:
    """Produce native msgpack events keyed by user (see encode_event for `properties`)."""
    await produce_many(bootstrap, topic, (encode_event(e, properties=properties) for e in events))


# --- what the replay says ---------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """The messages and final states the offline replay gives for a stream."""

    predictions: dict[str, dict[str, Any]]
    episodes: dict[str, dict[str, Any]]
    states: dict[str, bytes]
    """User -> engine.serialize(final state, include_config=False)."""
    closed_at_end: int
    """How many episodes only the final watermark closes."""

    @property
    def messages(self) -> dict[str, dict[str, Any]]:
        """Predictions and episodes by id."""
        return {**self.predictions, **self.episodes}


def expected_outputs(
    config: EngineConfig,
    events: Sequence[Event],
    *,
    until: int = END_OF_TIME,
    erased: Mapping[str, int] | None = None,
) -> Expected:
    """Replay `events` offline (the worker's own Processor, as `oracular replay` runs it);
    `erased`: the erasures read ahead (as a replay of a file or a backfill reads them)."""
    outputs, run = replay_outputs(config, events, until=until, erased=erased)
    found: dict[str, dict[str, dict[str, Any]]] = {PREDICTIONS: {}, EPISODES: {}}
    for output in outputs:
        assert output.role in found, f"the replay dead-lettered a test event: {output.message}"
        into = found[output.role]
        assert output.message["id"] not in into, f"the replay gives {output.message['id']} twice"
        into[output.message["id"]] = output.message
    predictions, episodes = found[PREDICTIONS], found[EPISODES]
    assert not set(predictions) & set(episodes), "prediction and episode ids never collide"
    states = {u: serialize(s, include_config=False) for u, s in run.states().items()}
    return Expected(predictions, episodes, states, run.counts["closed_by_timer"])


# --- reading topics -----------------------------------------------------------------------


class TopicReader:
    """Reads whole topics from the beginning, without a consumer group, accumulating records."""

    def __init__(self, bootstrap: str, topics: Sequence[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.records: list[Record] = []
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self.partitions: list[TopicPartition] = []

    async def __aenter__(self) -> TopicReader:
        await self.consumer.start()
        deadline = time.monotonic() + TOPIC_METADATA_TIMEOUT_S
        for topic in self.topics:
            while not (found := self.consumer.partitions_for_topic(topic)):
                if time.monotonic() > deadline:
                    msg = f"topic {topic} not in the metadata within {TOPIC_METADATA_TIMEOUT_S} s"
                    raise AssertionError(msg)
                await self.consumer._client.force_metadata_update()  # topic created by a worker
                await asyncio.sleep(POLL_INTERVAL_S)
            self.partitions += [TopicPartition(topic, p) for p in sorted(found)]
        self.consumer.assign(self.partitions)
        await self.consumer.seek_to_beginning(*self.partitions)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def _fetch(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=int(POLL_INTERVAL_S * 1000))
        for batch in batches.values():
            self.records.extend(batch)

    async def read_to_end(self, timeout_s: float = READ_TO_END_TIMEOUT_S) -> list[Record]:
        """Everything up to the end offsets as of now; returns all records read so far."""
        ends = await self.consumer.end_offsets(self.partitions)
        deadline = time.monotonic() + timeout_s
        while await self._behind(ends):
            if time.monotonic() > deadline:
                msg = f"could not read {self.topics} to their end within {timeout_s:.0f} s"
                raise AssertionError(msg)
            await self._fetch()
        return self.records

    async def _behind(self, ends: Mapping[TopicPartition, int]) -> bool:
        for tp, end in ends.items():
            if await self.consumer.position(tp) < end:
                return True
        return False

    async def wait_for(
        self,
        done: Callable[[list[Record]], bool],
        *,
        timeout_s: float,
        what: str,
        describe: Callable[[list[Record]], str] = lambda r: f"{len(r)} records",
    ) -> list[Record]:
        """Read on until `done(records)`; fail after `timeout_s` saying what arrived."""
        deadline = time.monotonic() + timeout_s
        while not done(self.records):
            if time.monotonic() > deadline:
                msg = (
                    f"{what} did not arrive on {self.topics} within {timeout_s:.0f} s; "
                    f"got {describe(self.records)}"
                )
                raise AssertionError(msg)
            await self._fetch()
        return self.records


def distinct_ids(records: Iterable[Record]) -> set[str]:
    """The ids of the output messages among `records`."""
    return {decode_output(r.value)["id"] for r in records}


async def wait_for_outputs(
    dep: Deployment, expected: Expected, *, timeout_s: float = COMPLETION_TIMEOUT_S
) -> list[Record]:
    """Read predictions and episodes until they hold as many distinct ids as expected."""
    want = len(expected.messages)
    seen: set[str] = set()
    count = 0

    def done(records: list[Record]) -> bool:
        nonlocal count
        seen.update(decode_output(r.value)["id"] for r in records[count:])
        count = len(records)
        return len(seen) >= want

    def describe(records: list[Record]) -> str:
        missing = sorted(set(expected.messages) - seen)
        return f"{len(seen)} of {want} distinct ids; missing e.g. {missing[:5]}"

    async with TopicReader(dep.bootstrap, dep.outputs) as reader:
        return await reader.wait_for(
            done, timeout_s=timeout_s, what=f"{want} distinct output ids", describe=describe
        )


def output_problems(records: Iterable[Record], expected: Expected) -> list[str]:
    """Differences between published outputs and the replay: missing, extra, unequal ids.

    Duplicates of an id are allowed (at-least-once), but every copy must equal the replay's.
    """
    want = expected.messages
    problems = []
    seen = set()
    for record in records:
        message = decode_output(record.value)
        ident = message.get("id")
        seen.add(ident)
        if ident not in want:
            problems.append(f"unexpected message {message}")
        elif message != want[ident]:
            problems.append(f"{ident}: got {message}, replay gives {want[ident]}")
        elif record.key != message["user"].encode():
            problems.append(f"{ident}: keyed {record.key!r}, not by its user")
    problems += [f"missing {ident}: {want[ident]}" for ident in sorted(set(want) - seen)]
    return problems


def assert_outputs_equal(records: Iterable[Record], expected: Expected) -> None:
    """Every published message equals the replay's message with its id, and none is missing."""
    problems = output_problems(records, expected)
    assert not problems, f"{len(problems)} differences from the replay, e.g.:\n" + "\n".join(
        problems[:10]
    )


def changelog_states(
    records: Iterable[Record], config: EngineConfig, *, close_due: bool = False
) -> dict[str, bytes]:
    """User -> serialized engine state of the last changelog value per key.

    With `close_due`, each state is first closed as the timer would close it at the end of
    time (`engine.close_if_due`). After a SIGKILL with the datadir kept, a timer close the
    worker stored in RocksDB just before the kill can be missing from the changelog: a
    redelivered tick finds the episode closed locally and writes nothing. That close is not
    lost: any restore from the changelog reopens the episode and the next tick closes it at
    the same deadline, to the same state. (An input, by contrast, is never redelivered after
    its commit, so input-caused writes are compared strictly: redelivered inputs rewrite.)
    """
    last = compacted(records)
    states = {
        key.decode(): decode_stored(raw, config).state
        for key, raw in last.items()
        if not is_marker(key)  # an erased user's marker (tests/integration/test_lifecycle.py)
    }
    if close_due:
        states = {user: close_if_due(state, END_OF_TIME).state for user, state in states.items()}
    return {user: serialize(state, include_config=False) for user, state in states.items()}


def compacted(records: Iterable[Record]) -> dict[bytes, bytes]:
    """A changelog as compaction leaves it: the last value per key, tombstoned keys gone."""
    last: dict[bytes, bytes] = {}
    for record in records:
        if record.value is not None:
            last[record.key] = record.value
        else:
            last.pop(record.key, None)  # a tombstone: deleted
    return last


def state_problems(actual: Mapping[str, bytes], expected: Mapping[str, bytes]) -> list[str]:
    """Users whose stored state differs from the replay's, or who are missing or extra."""
    problems = [f"missing user {u}" for u in sorted(set(expected) - set(actual))]
    problems += [f"extra user {u}" for u in sorted(set(actual) - set(expected))]
    problems += [
        f"state of {u} differs from the replay's"
        for u in sorted(set(actual) & set(expected))
        if actual[u] != expected[u]
    ]
    return problems


async def assert_states_equal(
    dep: Deployment,
    expected: Expected,
    *,
    timeout_s: float = STATES_TIMEOUT_S,
    close_due: bool = False,
) -> None:
    """The changelog's last value per user equals the replay's final state (polled: a batch
    writes its states just after its outputs are delivered). `close_due`: see
    `changelog_states`, for runs that ended in a SIGKILL."""
    deadline = time.monotonic() + timeout_s
    async with TopicReader(dep.bootstrap, [dep.changelog]) as reader:
        while True:
            records = await reader.read_to_end()
            states = changelog_states(records, dep.config, close_due=close_due)
            problems = state_problems(states, expected.states)
            if not problems:
                return
            if time.monotonic() > deadline:
                msg = (
                    f"changelog {dep.changelog}: {len(problems)} users differ from the replay "
                    f"after {timeout_s:.0f} s (STATES_TIMEOUT_S), e.g.:\n"
                    + "\n".join(problems[:10])
                )
                raise AssertionError(msg)
            await asyncio.sleep(POLL_INTERVAL_S)


async def read_all(bootstrap: str, topic: str) -> list[Record]:
    """Every record of `topic` up to its current end."""
    async with TopicReader(bootstrap, [topic]) as reader:
        return await reader.read_to_end()


# --- consumer group -----------------------------------------------------------------------


async def wait_committed(dep: Deployment, *, timeout_s: float = CAUGHT_UP_TIMEOUT_S) -> None:
    """Wait until the app's group has committed every input partition up to its end offset."""
    topic = dep.topics.events.name
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer = AIOKafkaConsumer(bootstrap_servers=dep.bootstrap, group_id=None)
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap)
    await consumer.start()
    await admin.start()
    try:
        ends = await consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout_s
        while True:
            committed = await admin.list_consumer_group_offsets(dep.app_id)
            behind = {
                tp.partition: (committed[tp].offset if tp in committed else None, end)
                for tp, end in ends.items()
                if tp not in committed or committed[tp].offset < end
            }
            if not behind:
                return
            if time.monotonic() > deadline:
                msg = (
                    f"group {dep.app_id} did not commit {topic} to its end within "
                    f"{timeout_s:.0f} s; partition: (committed, end) {behind}"
                )
                raise AssertionError(msg)
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        await admin.close()
        await consumer.stop()


async def wait_group_stable(
    dep: Deployment, members: int, *, timeout_s: float = GROUP_STABLE_TIMEOUT_S
) -> None:
    """Wait until the app's consumer group is Stable with `members` members."""
    admin = AIOKafkaAdminClient(bootstrap_servers=dep.bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            [response] = await admin.describe_consumer_groups([dep.app_id])
            group = response.groups[0]
            # (error_code, group_id, state, protocol_type, protocol, members, ...)
            state, current = group[2], len(group[5])
            if state == "Stable" and current == members:
                return
            if time.monotonic() > deadline:
                msg = (
                    f"group {dep.app_id} not Stable with {members} members within "
                    f"{timeout_s:.0f} s: state {state}, {current} members"
                )
                raise AssertionError(msg)
            await asyncio.sleep(POLL_INTERVAL_S)
    finally:
        await admin.close()


# --- the worker's log -----------------------------------------------------------------------

SUMMARY = re.compile(r"oracular summary: (.*)")


def last_summary(log: str) -> dict[str, int]:
    """The counters of the last `oracular summary:` line in `log`."""
    lines = SUMMARY.findall(log)
    assert lines, "the worker logged no summary line"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)\b", lines[-1]) if k != "events_per_s"}


BACKFILL_TIMEOUT_S = 180.0  # start Faust, join, create the changelog, drain, tick, stop: 2 cores


async def run_backfill(
    dep: Deployment, app_id: str, datadir: Path
) -> subprocess.CompletedProcess[str]:
    """`oracular backfill` of `dep`'s input topic under `app_id`, its outputs to the `.bf`
    topics; the finished process (the caller checks its exit and summary)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        **dep.env(ORACULAR_TICK_INTERVAL_S="0.5"),
        "ORACULAR_BROKER": dep.bootstrap,
        "ORACULAR_DATADIR": str(datadir),
    }
    argv = [sys.executable, "-m", "streams.cli", "backfill", "--config", str(dep.config_path)]
    argv += ["--app-id", app_id, "--output-suffix", ".bf"]
    return await asyncio.to_thread(
        subprocess.run,
        argv,
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=BACKFILL_TIMEOUT_S,
        check=False,
    )
