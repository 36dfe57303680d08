"""The broker itself: a client round trip and idempotent topic creation."""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import pytest

from infra.broker import main
from streams.settings import product_topics
from streams.settings.topics import TopicSpec
from streams.tools.admin import BrokerError, ensure_topics, ensure_topics_async

from .support import consume_until, produce

pytestmark = pytest.mark.integration


async def test_msgpack_message_round_trip(kafka: str, name: Callable[[str], str]) -> None:
    topic = name("roundtrip")
    await ensure_topics_async(kafka, [TopicSpec(topic, 1)])
    payload = {"user": "u1", "n": 3, "name": "pricing.viewed", "ts": 1767261600000}

    await produce(kafka, topic, [(b"u1", msgpack.packb(payload))])
    records = await consume_until(kafka, topic, lambda got: len(got) >= 1)

    assert [(r.key, msgpack.unpackb(r.value)) for r in records] == [(b"u1", payload)]


def test_ensure_topics_creates_once_and_reports_a_partition_mismatch(
    kafka: str, name: Callable[[str], str]
) -> None:
    spec = TopicSpec(name("topic"), 3, {"retention.ms": "60000"})

    first = ensure_topics(kafka, [spec])
    again = ensure_topics(kafka, [spec])
    with pytest.raises(BrokerError, match=r"has 3, wanted 4.*ORACULAR_PARTITIONS"):
        ensure_topics(kafka, [TopicSpec(spec.name, 4)])

    assert [(r.created, r.actual) for r in first] == [(True, 3)]
    assert [(r.created, r.actual) for r in again] == [(False, 3)]


def test_cli_topics_creates_the_product_topics(
    kafka: str,
    name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix = name("product")
    monkeypatch.setenv("ORACULAR_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("ORACULAR_PARTITIONS", "2")

    assert main(["topics", "--bootstrap", kafka]) == 0
    created = capsys.readouterr().out
    assert main(["topics", "--bootstrap", kafka]) == 0
    existing = capsys.readouterr().out
    monkeypatch.setenv("ORACULAR_PARTITIONS", "3")
    assert main(["topics", "--bootstrap", kafka]) == 1
    mismatch = capsys.readouterr().err

    names = [spec.name for spec in product_topics()]
    assert created.splitlines() == [f"created  {n} (2 partitions)" for n in names]
    assert existing.splitlines() == [f"exists   {n} (2 partitions)" for n in names]
    assert mismatch.startswith("error: Partition count mismatch: ")
    assert f"{prefix}.events has 2, wanted 3" in mismatch
