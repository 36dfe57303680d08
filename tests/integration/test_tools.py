"""`oracular backfill` and `oracular reset` against the real broker."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import msgpack
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.synthetic import clickstream
from engine import END_OF_TIME
from infra.broker import REPO_ROOT
from schemas.config import load_config
from schemas.outputs import decode_output
from streams.runtime.app import TIMER_CLOSES_PER_BATCH
from streams.runtime.datadir import MARKER
from streams.settings import product_topics
from streams.tools.admin import ensure_topics_async
from tests.cli import run_oracular

from .worker_support import expected_outputs

pytestmark = pytest.mark.integration

CONFIG = REPO_ROOT / "examples" / "oracular.yaml"
PARTITIONS = 4
BACKFILL_TIMEOUT_S = 180.0  # start Faust, join, create the changelog, drain, tick, stop: 2 cores
OUTPUTS_TIMEOUT_S = 30.0  # the backfill has exited: its outputs are on the broker already


def _env(kafka: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "ORACULAR_BROKER": kafka,
        "ORACULAR_TOPIC_PREFIX": prefix,
        "ORACULAR_PARTITIONS": str(PARTITIONS),
        "ORACULAR_TICK_INTERVAL_S": "0.5",
        "ORACULAR_DATADIR": str(tmp_path / "state"),
    }


def _oracular(env: dict[str, str], *args: str, timeout: float = BACKFILL_TIMEOUT_S):
    return run_oracular(*args, env=env, timeout=timeout)[0]


def _backfill(env: dict[str, str], app_id: str, *flags: str):
    """`oracular backfill` of the example config under `app_id`, with more `flags`."""
    return _oracular(env, "backfill", "--config", str(CONFIG), "--app-id", app_id, *flags)


def _events():
    config = load_config(CONFIG)
    return config, clickstream(config, 600, 40, seed=5)


async def _setup(kafka: str, prefix: str, events) -> None:
    topics = product_topics(
        {"ORACULAR_TOPIC_PREFIX": prefix, "ORACULAR_PARTITIONS": str(PARTITIONS)}
    )
    await ensure_topics_async(kafka, list(topics))
    producer = AIOKafkaProducer(bootstrap_servers=kafka, acks="all")
    await producer.start()
    try:
        for e in events:
            message = {"id": e.id, "user": e.user, "ts": e.at, "type": e.type}
            if e.name is not None:
                message["name"] = e.name
            # Record timestamps are the event times, as `oracular produce` sets them: --since
            # finds its start offsets by record timestamp.
            await producer.send(
                topics.events.name, msgpack.packb(message), key=e.user.encode(), timestamp_ms=e.at
            )
        await producer.flush()
    finally:
        await producer.stop()


def _expected(config, events) -> dict[str, dict]:
    return expected_outputs(config, events, until=END_OF_TIME).messages


async def _outputs(kafka: str, topics: list[str], count: int) -> dict[str, dict]:
    """The messages of `topics` by id, read until `count` distinct ids (and a quiet second)."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=kafka,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    got: dict[str, dict] = {}
    deadline = time.monotonic() + OUTPUTS_TIMEOUT_S
    await consumer.start()
    try:
        quiet_since = None
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            records = [r for batch in batches.values() for r in batch]
            for record in records:
                message = decode_output(record.value)
                got[message["id"]] = message
            if len(got) >= count:
                quiet_since = quiet_since if not records and quiet_since else time.monotonic()
                if time.monotonic() - quiet_since > 1.0:  # extra ids would show up by now
                    break
    finally:
        await consumer.stop()
    assert len(got) == count, f"expected {count} distinct output ids, got {len(got)}"
    return got


def test_backfill_equals_replay_and_is_repeatable(kafka, name, tmp_path):
    """A backfill's outputs equal `oracular replay` of the topic; a second one gives the same."""
    prefix = name("bf")
    config, events = _events()
    asyncio.run(_setup(kafka, prefix, events))
    expected = _expected(config, events)
    outputs = [f"{prefix}.predictions.bf", f"{prefix}.episodes.bf"]
    runs = []
    for attempt in (1, 2):
        env = _env(kafka, prefix, tmp_path / f"run{attempt}")
        done = _backfill(env, f"{prefix}-app{attempt}", "--output-suffix", ".bf")
        assert done.returncode == 0, done.stderr[-3000:]
        handled = "applied=600, redelivered=0, duplicate_id=0, dead_lettered=0, ignored=0"
        assert f"complete: {handled}" in done.stderr
        runs.append(asyncio.run(_outputs(kafka, outputs, len(expected))))
    assert runs[0] == expected
    assert runs[1] == runs[0]


def test_a_backfill_whose_end_closes_more_episodes_than_a_batch_may(kafka, name, tmp_path):
    """At a backfill's end thousands of episodes fall due at once; a batch closes at most
    `TIMER_CLOSES_PER_BATCH` of them and the worker ticks again for the rest. The backfill
    ends only once the last of them is closed: every close is published, as the replay."""
    prefix = name("bfm")
    config = load_config(CONFIG)
    events = clickstream(config, 6_000, 5_000, seed=9)  # 3,000+ users end with an open episode
    asyncio.run(_setup(kafka, prefix, events))
    replayed = expected_outputs(config, events, until=END_OF_TIME)
    expected = replayed.messages
    closes = sum(1 for m in replayed.episodes.values() if m["reason"] == "timeout")
    assert closes > 2 * TIMER_CLOSES_PER_BATCH, closes
    env = _env(kafka, prefix, tmp_path)
    done = _backfill(env, f"{prefix}-app", "--output-suffix", ".bf")
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = [f"{prefix}.predictions.bf", f"{prefix}.episodes.bf"]
    assert asyncio.run(_outputs(kafka, outputs, len(expected))) == expected


def test_a_backfill_in_two_processes_equals_the_replay(kafka, name, tmp_path):
    """`--processes 2`: two processes of one app id share the partitions, the parent stops
    them once each has done the partitions it owns, and together they publish exactly the
    replay's outputs."""
    prefix = name("bfp")
    config, events = _events()
    asyncio.run(_setup(kafka, prefix, events))
    expected = _expected(config, events)
    env = _env(kafka, prefix, tmp_path)
    done = _backfill(env, f"{prefix}-app", "--output-suffix", ".bf", "--processes", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "oracular backfill: 2 processes" in done.stderr
    assert f"backfill {prefix}-app complete: 600 messages in 2 processes" in done.stderr
    outputs = [f"{prefix}.predictions.bf", f"{prefix}.episodes.bf"]
    assert asyncio.run(_outputs(kafka, outputs, len(expected))) == expected
    assert (tmp_path / "state" / "p0").is_dir() and (tmp_path / "state" / "p1").is_dir()
    assert done.stderr.count("complete (one process of several): applied=") == 2
    too_many = _oracular(env, "backfill", "--config", str(CONFIG), "--processes", "5")
    assert too_many.returncode == 2  # usage
    assert "--processes must be between 1 and the 4 input partitions (got 5)" in too_many.stderr


def test_backfill_since_starts_at_that_time_and_refuses_a_used_app_id(kafka, name, tmp_path):
    """--since skips earlier events; an app id that already has state is refused."""
    prefix = name("since")
    _, events = _events()
    asyncio.run(_setup(kafka, prefix, events))
    since = events[400].at
    later = sum(e.at >= since for e in events)
    env = _env(kafka, prefix, tmp_path)
    done = _backfill(env, f"{prefix}-a", "--since", str(since), "--output-suffix", ".since")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"complete: applied={later}," in done.stderr
    again = _oracular(env, "backfill", "--config", str(CONFIG), "--app-id", f"{prefix}-a")
    assert again.returncode == 69
    assert "already has state on the broker" in again.stderr
    assert f"oracular reset {prefix}-a" in again.stderr


def test_reset_dry_run_then_delete(kafka, name, tmp_path):
    """reset lists, then deletes, the app's internal topics, consumer group and local state."""
    prefix = name("reset")
    _, events = _events()
    asyncio.run(_setup(kafka, prefix, events[:50]))
    app_id = f"{prefix}-app"
    env = _env(kafka, prefix, tmp_path)
    done = _oracular(env, "backfill", "--config", str(CONFIG), "--app-id", app_id)
    assert done.returncode == 0, done.stderr[-3000:]
    datadir = tmp_path / "state"
    assert datadir.is_dir() and (datadir / MARKER).is_file()  # the app's marker (datadir.py)
    dry = _oracular(env, "reset", app_id, "--datadir", str(datadir), "--dry-run", timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert f"topic          {app_id}-oracular-state-changelog" in dry.stdout
    assert f"consumer group {app_id}" in dry.stdout and "dry run: nothing deleted" in dry.stdout
    assert datadir.is_dir()
    # Without --datadir: ORACULAR_DATADIR; without that, var/faust/APP_ID where reset runs,
    # said in full when there is nothing there (the worker's is under where it ran).
    found = _oracular(env, "reset", app_id, "--dry-run", timeout=60)
    assert f"local state    {datadir}" in found.stdout, found.stdout
    elsewhere = {k: v for k, v in env.items() if k != "ORACULAR_DATADIR"}
    missed = _oracular(elsewhere, "reset", app_id, "--dry-run", timeout=60)
    looked = (REPO_ROOT / "var" / "faust" / app_id).absolute()
    assert f"local state    none at {looked} (the worker's is under" in missed.stdout, missed.stdout
    gone = _oracular(env, "reset", app_id, "--datadir", str(datadir), timeout=60)
    assert gone.returncode == 0, gone.stderr
    assert not datadir.exists()
    # Nothing is left: a reset of it now is a mistyped id's answer (exit 1, the closest run).
    after = _oracular(env, "reset", app_id, "--datadir", str(datadir), "--dry-run", timeout=60)
    assert after.returncode == 1, after.stderr
    [line] = after.stderr.splitlines()
    assert line.startswith(f"oracular reset: nothing belongs to app id '{app_id}' (no consumer")
    assert f"(did you mean {prefix}?)" in line


def test_reset_refuses_while_a_worker_runs(kafka, name, faust_worker, tmp_path):
    """An app id with a running worker is not reset: the message says to stop it first."""
    prefix = name("busy")
    app_id = f"{prefix}-app"
    worker = faust_worker(
        "streams.worker",
        app_id=app_id,
        env={
            "ORACULAR_TOPIC_PREFIX": prefix,
            "ORACULAR_PARTITIONS": str(PARTITIONS),
            "ORACULAR_CONFIG": str(CONFIG),
        },
        argv=[sys.executable, "-m", "streams.cli", "worker", "--loglevel", "info"],
    ).start()
    env = _env(kafka, prefix, tmp_path)
    busy = _oracular(env, "reset", app_id, "--datadir", str(worker.datadir), timeout=60)
    assert busy.returncode == 1
    assert "active member(s) — stop its workers first" in busy.stderr
    assert worker.datadir.exists()
    assert f"consumer group {app_id}" in busy.stdout  # the plan is still shown
    worker.stop()


async def _delete_input_once_running(kafka: str, topic: str, app_id: str) -> int:
    """Once the backfill has captured its range (its changelog topic exists: Faust is up),
    delete the input topic's records up to its end, as retention would. Returns the end."""
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
    from aiokafka.structs import TopicPartition

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        deadline = time.monotonic() + BACKFILL_TIMEOUT_S
        while not any(t.startswith(app_id) for t in await admin.list_topics()):
            assert time.monotonic() < deadline, "the backfill never created its changelog topic"
            await asyncio.sleep(0.05)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka, group_id=None)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        await admin.delete_records({tp: RecordsToDelete(ends[tp]) for tp in tps})
        return sum(ends.values())
    finally:
        await admin.close()


async def _produce_fast(kafka: str, topic: str, events) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka, acks="all", linger_ms=20)
    await producer.start()
    try:
        sent = [
            await producer.send(
                topic,
                msgpack.packb(
                    {"id": e.id, "user": e.user, "ts": e.at, "type": e.type, "name": e.name}
                ),
                key=e.user.encode(),
            )
            for e in events
        ]
        await producer.flush()
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def test_a_backfill_whose_input_is_deleted_under_it_ends_and_says_so(kafka, name, tmp_path):
    """Retention deleting the input a backfill has not read yet: the backfill still ends
    (it used to wait for the deleted records forever), and warns which offsets it misses."""
    prefix = name("gone")
    config = load_config(CONFIG)
    events = [e for e in clickstream(config, 20_000, 400, seed=9) if e.name is not None]
    topics = product_topics(
        {"ORACULAR_TOPIC_PREFIX": prefix, "ORACULAR_PARTITIONS": str(PARTITIONS)}
    )
    asyncio.run(ensure_topics_async(kafka, list(topics)))
    asyncio.run(_produce_fast(kafka, topics.events.name, events))
    app_id = f"{prefix}-app"
    env = {**_env(kafka, prefix, tmp_path), "ORACULAR_TICK_INTERVAL_S": "0.2"}

    async def backfill_while_deleting():
        run = asyncio.to_thread(
            _oracular, env, "backfill", "--config", str(CONFIG), "--app-id", app_id
        )
        return await asyncio.gather(
            run, _delete_input_once_running(kafka, topics.events.name, app_id)
        )

    done, total = asyncio.run(backfill_while_deleting())
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"backfill {app_id} complete" in done.stderr
    applied = int(done.stderr.split("applied=")[1].split(",")[0])
    assert applied <= total == len(events)
    if applied < total:  # the deletion came before the backfill read everything: it says so
        assert "were deleted by the broker (retention) before the backfill read them" in done.stderr
