"""Kafka-facing commands against the real broker when their topics are missing, and `produce`
of a CSV with the column flags (docs/tools.md "Exit codes")."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgpack
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from infra.broker import REPO_ROOT
from streams.settings import product_topics
from streams.settings.exits import EXIT_UNAVAILABLE
from streams.tools.admin import ensure_topics_async
from tests.cli import run_oracular

from .support import consume_until

pytestmark = pytest.mark.integration

CONFIG = REPO_ROOT / "examples" / "oracular.yaml"
TS = 1_767_261_600_000
COMMAND_TIMEOUT_S = 60.0  # a missing topic is found in one metadata round trip
BACKFILL_TIMEOUT_S = 180.0  # start Faust, join, create the changelog, drain, tick, stop: 2 cores


def _env(kafka: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORACULAR_")}
    return {
        **env,
        "PYTHONPATH": str(REPO_ROOT),
        "ORACULAR_BROKER": kafka,
        "ORACULAR_TOPIC_PREFIX": prefix,
        "ORACULAR_PARTITIONS": "2",
        "ORACULAR_TICK_INTERVAL_S": "0.5",
        "ORACULAR_DATADIR": str(tmp_path / "state"),
        "ORACULAR_API_PORT": "0",  # a free port: 6067 is the user's own worker's
    }


def _oracular(env: dict[str, str], *args: str, timeout: float = COMMAND_TIMEOUT_S):
    return run_oracular(*args, env=env, timeout=timeout)


async def _topics_named(kafka: str, prefix: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        return sorted(t for t in await admin.list_topics() if t.startswith(prefix))
    finally:
        await admin.close()


@pytest.mark.parametrize(
    ("command", "args", "missing"),
    [
        ("produce", ["EVENTS"], "topic {p}.events does"),
        ("tail", ["--max", "1"], "topics {p}.predictions, {p}.episodes, {p}.events.dlq do"),
        ("tail", ["--topics", "dlq", "--max", "1"], "topic {p}.events.dlq does"),
        ("backfill", ["--config", str(CONFIG)], "topic {p}.events does"),
        ("forget", ["u1", "--reason", "asked"], "topic {p}.events does"),
    ],
)
def test_a_missing_topic_is_one_line_and_exit_69(kafka, name, tmp_path, command, args, missing):
    prefix = name("t")
    events = tmp_path / "events.jsonl"
    events.write_text(f'{{"user":"u1","name":"a","ts":{TS}}}\n')
    argv = [str(events) if a == "EVENTS" else a for a in args]
    done, elapsed = _oracular(_env(kafka, prefix, tmp_path), command, *argv)
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    [line] = done.stderr.splitlines()  # no "not found in cluster metadata" spam
    assert line == (
        f"oracular {command}: {missing.format(p=prefix)} not exist on {kafka} — create the "
        "product topics with `make topics` (or start `oracular worker`, which creates them); "
        "check ORACULAR_TOPIC_PREFIX; `oracular topics list` shows the topics there are"
    )
    assert elapsed < COMMAND_TIMEOUT_S
    assert asyncio.run(_topics_named(kafka, prefix)) == []  # it created none


def test_produce_a_csv_with_the_column_flags_then_backfill_it_quietly(kafka, name, tmp_path):
    """`produce` maps CSV columns as `replay` does; a backfill's stdout (a pipe here) carries
    no terminal control codes (Faust's spinner)."""
    prefix = name("csv")
    env = _env(kafka, prefix, tmp_path)
    topics = product_topics(env)
    asyncio.run(ensure_topics_async(kafka, list(topics)))
    shop = tmp_path / "shop.csv"
    rows = [f"u{n % 3},page.viewed,{TS + n * 1000}" for n in range(6)]
    shop.write_text("user_id,event,timestamp\n" + "\n".join([*rows, "u9,broken,"]) + "\n")
    flags = ["--user-col", "user_id", "--event-col", "event", "--time-col", "timestamp"]

    done, _ = _oracular(env, "produce", str(shop), *flags)

    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()  # the skipped line, the progress line, the summary
    assert err[0] == "oracular produce: skipped line 8: column 'timestamp' is empty"
    assert err[-1] == f"produce: 6 events to {topics.events.name} on {kafka} (1 skipped)"
    records = asyncio.run(
        consume_until(kafka, topics.events.name, lambda got: len(got) >= 6, what="6 events")
    )
    sent = sorted((r.key, msgpack.unpackb(r.value)["ts"]) for r in records)
    assert sent == sorted((f"u{n % 3}".encode(), TS + n * 1000) for n in range(6))

    backfill, _ = _oracular(env, "backfill", "--config", str(CONFIG), timeout=BACKFILL_TIMEOUT_S)
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    assert "complete: applied=6" in backfill.stderr
    assert "\x1b" not in backfill.stdout and "\b" not in backfill.stdout
