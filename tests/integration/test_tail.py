"""`oracular tail` on the real broker: prefixed and suffixed outputs, --pretty, dead letters."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest
from aiokafka import AIOKafkaProducer

from infra.broker import REPO_ROOT
from schemas.outputs import dlq_message, encode_output
from streams.settings.exits import EXIT_UNAVAILABLE
from streams.settings.topics import TopicSpec
from streams.tools.admin import ensure_topics_async
from tests.cli import run_oracular

pytestmark = pytest.mark.integration

TAIL_TIMEOUT_S = 60.0  # --max ends it as soon as the messages arrived; this only stops a hang

PREDICTION = {
    "id": "u1:e2",
    "user": "u1",
    "at": 1_767_261_660_000,
    "type": "event",
    "event": "limit.hit",
    "intents": {"upgrade": {"p": 0.6123, "lower": 0.51, "reveal": True, "suppressed_until": None}},
}
EPISODE = {
    "id": "u1:1767261600000/1",
    "user": "u1",
    "started_at": 1_767_261_600_000,
    "closed_at": 1_767_263_460_000,
    "reason": "timeout",
    "intents": {"upgrade": {"verdict": "held", "signals": ["limit.hit", "pricing.viewed"]}},
}


async def _publish(kafka: str, prefix: str, suffix: str) -> None:
    """One prediction, one episode and one dead letter on `<prefix>.<output><suffix>`, as a
    backfill with --output-suffix writes them (msgpack, the dead letter in JSON)."""
    names = [f"{prefix}.predictions{suffix}", f"{prefix}.episodes{suffix}"]
    names.append(f"{prefix}.events.dlq{suffix}")
    await ensure_topics_async(kafka, [TopicSpec(n, 2) for n in names])
    dead = dlq_message(
        "invalid JSON", topic=f"{prefix}.events", partition=1, offset=5, key=b"u2", value=b"{x"
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka, acks="all")
    await producer.start()
    try:
        await producer.send(names[0], encode_output(PREDICTION), key=b"u1")
        await producer.send(names[1], encode_output(EPISODE), key=b"u1")
        await producer.send(names[2], encode_output(dead, "json"), key=b"u2")
        await producer.flush()
    finally:
        await producer.stop()


def _tail(kafka: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "ORACULAR_BROKER": kafka}
    env.pop("ORACULAR_TOPIC_PREFIX", None)
    return run_oracular("tail", "--from-beginning", *args, env=env, timeout=TAIL_TIMEOUT_S)[0]


def test_tail_follows_a_prefixed_runs_suffixed_outputs(kafka, name):
    prefix = name("run")
    asyncio.run(_publish(kafka, prefix, ".bf"))

    pretty = _tail(
        kafka, "--pretty", "--topic-prefix", prefix, "--output-suffix", ".bf", "--max", "3"
    )
    assert pretty.returncode == 0, pretty.stderr[-2000:]
    assert sorted(pretty.stdout.splitlines()) == sorted(
        [
            "2026-01-01T10:01:00Z  u1          limit.hit               upgrade p=0.612 REVEAL",
            "2026-01-01T10:31:00Z  u1          episode closed (timeout) after 31m00s: "
            "upgrade held [limit.hit, pricing.viewed]",
            f"dead letter from {prefix}.events partition 1 offset 5, key 'u2': invalid JSON",
        ]
    )
    assert (
        "tail: 1 prediction (1 reveal: upgrade 1), 1 episode closed (1 timed out), "
        "1 dead letter" in pretty.stderr
    )

    # Full topic names (what `--topics oracular.predictions.bf` used to refuse), in JSON: the
    # dead letter names its own topic; where the input came from is `source_topic`.
    plain = _tail(kafka, "--topics", f"{prefix}.events.dlq.bf", "--max", "1")
    assert plain.returncode == 0, plain.stderr[-2000:]
    dead = json.loads(plain.stdout)
    assert dead["topic"] == f"{prefix}.events.dlq.bf"
    assert dead["source_topic"] == f"{prefix}.events"
    assert dead["error"] == "invalid JSON"


def test_tail_refuses_a_prefix_or_suffix_whose_topics_the_broker_does_not_have(kafka, name):
    prefix = name("run")
    asyncio.run(_publish(kafka, prefix, ".bf"))
    missing = _tail(kafka, "--topic-prefix", prefix, "--topics", "predictions")  # no suffix
    assert missing.returncode == EXIT_UNAVAILABLE
    [line] = missing.stderr.splitlines()
    assert f"topic {prefix}.predictions (did you mean {prefix}.predictions.bf?) does not " in line
    wrong = _tail(kafka, "--topic-prefix", prefix, "--output-suffix", ".x", "--topics", "dlq")
    assert wrong.returncode == EXIT_UNAVAILABLE
    assert f"topic {prefix}.events.dlq.x (did you mean {prefix}.events.dlq.bf?) does " in (
        wrong.stderr
    )


async def test_a_stop_ends_the_tail_even_when_its_cancel_is_lost(kafka, name):
    """The stop flag alone ends the loop (as when Python 3.11's wait_for swallowed the signal's
    cancel inside aiokafka), and what was held still comes out."""
    import io

    from streams.tools.kafkatools import tail_topics

    prefix = name("run")
    await _publish(kafka, prefix, "")
    out = io.StringIO()
    seen: list[str] = []

    def stopping() -> bool:
        seen.append(out.getvalue())
        return bool(out.getvalue())  # stop once something was shown (no idle, no limit)

    shown = await asyncio.wait_for(
        tail_topics(
            kafka,
            [f"{prefix}.predictions", f"{prefix}.episodes"],
            from_beginning=True,
            limit=None,
            idle_s=None,
            out=out,
            window_s=0.0,
            stopping=stopping,
        ),
        TAIL_TIMEOUT_S,
    )
    assert shown == 2
    assert len(out.getvalue().splitlines()) == 2
