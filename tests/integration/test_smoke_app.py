"""The smoke Faust app end to end: a worker subprocess, a RocksDB table, a graceful restart."""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import pytest

from streams.admin import ensure_topics_async
from streams.topics import TopicSpec

from .conftest import WorkerFactory
from .support import Record, consume_until, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4


def totals_by_user(records: list[Record]) -> dict[str, list[int]]:
    """Every published total, per user, in the order published."""
    totals: dict[str, list[int]] = {}
    for record in records:
        message = msgpack.unpackb(record.value)
        assert record.key == message["user"].encode(), "output keyed by user id"
        totals.setdefault(message["user"], []).append(message["total"])
    return totals


def events(*pairs: tuple[str, int]) -> list[tuple[bytes, bytes]]:
    return [(user.encode(), msgpack.packb({"user": user, "n": n})) for user, n in pairs]


async def test_totals_survive_a_worker_restart(
    kafka: str, name: Callable[[str], str], faust_worker: WorkerFactory
) -> None:
    source, sink = name("in"), name("out")
    await ensure_topics_async(kafka, [TopicSpec(source, PARTITIONS), TopicSpec(sink, PARTITIONS)])
    worker = faust_worker(
        "streams.smoke_app",
        app_id=name("smoke"),
        env={
            "ORACULAR_SMOKE_INPUT": source,
            "ORACULAR_SMOKE_OUTPUT": sink,
            "ORACULAR_PARTITIONS": str(PARTITIONS),
        },
    )

    worker.start()
    # The undecodable message (0xc1 is never valid msgpack) sits between u1's events on the
    # same partition: the agent must skip it and carry on.
    garbage = [(b"u1", b"\xc1")]
    await produce(
        kafka, source, events(("u1", 1), ("u1", 2)) + garbage + events(("u2", 10), ("u1", 3))
    )
    first = await consume_until(kafka, sink, lambda got: len(got) >= 4, what="4 totals")
    assert totals_by_user(first) == {"u1": [1, 3, 6], "u2": [10]}
    assert worker.stop() == 0

    # Same app id and datadir: the totals must continue from the stored values, and nothing
    # consumed before the stop may be applied twice (that would show as extra totals).
    worker.start()
    await produce(kafka, source, events(("u1", 4), ("u2", 5), ("u3", 7)))
    everything = await consume_until(kafka, sink, lambda got: len(got) >= 7, what="7 totals")
    assert totals_by_user(everything) == {"u1": [1, 3, 6, 10], "u2": [10, 15], "u3": [7]}
    assert worker.stop() == 0
    assert "skipping" in worker.log_text(), "the bad message was logged"
    assert list((worker.datadir / "v1" / "tables").glob("totals-*.db")), "RocksDB store used"
