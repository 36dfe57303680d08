"""`streams.runtime.sending`: `hand_over` fills record batches per partition, in order;
`acknowledged` waits for them and gives the last offsets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from streams.faust import patches as faust_patches
from streams.faust import producer as faust_producer
from streams.runtime.sending import acknowledged, hand_over, no_check


class FakeBatch:
    """A record batch holding at most `room` records (the first always fits)."""

    def __init__(self, room: int) -> None:
        self.room, self.records = room, []

    def append(self, *, key: Any, value: Any, timestamp: Any) -> Any:
        assert timestamp is None  # the producer stamps the send time
        if self.records and len(self.records) >= self.room:
            return None
        self.records.append((key, value))
        return SimpleNamespace()


class FakeProducer:
    """Keeps each partition's log; a batch's future gives its base offset."""

    def __init__(self, room: int = 3, fail: bool = False) -> None:
        self.room, self.fail = room, fail
        self.logs: dict[tuple[str, int], list[Any]] = {}
        self.batches: list[tuple[str, int, int]] = []

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.room)

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> Any:
        log = self.logs.setdefault((topic, partition), [])
        future = asyncio.get_running_loop().create_future()
        if self.fail:
            future.set_exception(RuntimeError("not delivered"))
        else:
            future.set_result(SimpleNamespace(offset=len(log)))
        log.extend(batch.records)
        self.batches.append((topic, partition, len(batch.records)))
        return future


async def send_all(producer: Any, records: Any, before_sending: Any = no_check) -> Any:
    """Hand over, then wait: what the worker does with a batch's outputs."""
    return await acknowledged(await hand_over(producer, records, before_sending))


async def test_records_go_per_partition_in_order_and_full_batches_are_split():
    producer = FakeProducer(room=3)
    records = [("t", i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(9)]
    checks: list[int] = []

    async def check() -> None:
        checks.append(len(producer.batches))

    last = await send_all(producer, records, check)
    assert producer.logs[("t", 0)] == [
        (f"k{i}".encode(), f"v{i}".encode()) for i in (0, 2, 4, 6, 8)
    ]
    assert producer.logs[("t", 1)] == [(f"k{i}".encode(), f"v{i}".encode()) for i in (1, 3, 5, 7)]
    assert producer.batches == [("t", 0, 3), ("t", 0, 2), ("t", 1, 3), ("t", 1, 1)]
    assert checks == [0, 1, 2, 3]  # checked before each batch is handed over
    assert last == {("t", 0): 4, ("t", 1): 3}


async def test_keys_without_a_partition_go_where_the_partitioner_puts_them(monkeypatch):
    producer = FakeProducer()

    async def partitioner(_: Any, topic: str) -> Any:
        assert topic == "out"
        return lambda key: len(key) % 3

    monkeypatch.setattr(faust_patches, "key_partitioner", partitioner)
    await send_all(producer, [("out", None, b"a", b"1"), ("out", None, b"bb", b"2")])
    assert producer.logs == {("out", 1): [(b"a", b"1")], ("out", 2): [(b"bb", b"2")]}


async def test_a_failed_delivery_raises():
    with pytest.raises(RuntimeError, match="not delivered"):
        await send_all(FakeProducer(fail=True), [("t", 0, b"k", b"v")])


async def test_nothing_to_send_sends_nothing():
    producer = FakeProducer()
    assert await send_all(producer, []) == {} and producer.batches == []


async def test_the_key_partitioner_is_the_one_producer_send_uses():
    """`key_partitioner` picks, for every key, the partition aiokafka's `send` would: its
    default partitioner (murmur2 of the key, as Kafka's Java clients) over the topic's
    partitions."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
    try:
        eight = set(range(8))
        producer._metadata = SimpleNamespace(
            partitions_for_topic=lambda topic: eight if topic == "out" else None,
            available_partitions_for_topic=lambda topic: eight,
        )

        async def known(topic: str) -> None:
            return None

        producer.client._wait_on_metadata = known
        choose = await faust_patches.key_partitioner(producer, "out")
        default = DefaultPartitioner()
        keys = [f"user-{i}".encode() for i in range(200)]
        assert [choose(k) for k in keys] == [default(k, sorted(eight), sorted(eight)) for k in keys]
        assert {choose(k) for k in keys} == eight
    finally:
        await producer.stop()


async def test_remembered_partitions_follow_the_topics_partitions(monkeypatch):
    """`key_partitioner` remembers a key's partition (murmur2 is pure Python): remembered or
    not, it is the partitioner's, also after the topic's partitions change; a None key (a
    random partition) is never remembered."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
    partitions = set(range(8))
    try:
        producer._metadata = SimpleNamespace(
            partitions_for_topic=lambda topic: partitions,
            available_partitions_for_topic=lambda topic: partitions,
        )

        async def known(topic: str) -> None:
            return None

        producer.client._wait_on_metadata = known
        default = DefaultPartitioner()
        keys = [f"user-{i}".encode() for i in range(300)]
        for count in (8, 8, 12, 8):  # the same, then more partitions, then as before
            partitions = set(range(count))
            choose = await faust_patches.key_partitioner(producer, "remembered")
            every = sorted(partitions)
            assert [choose(k) for k in keys] == [default(k, every, every) for k in keys]
        assert len(faust_producer._key_partitions["remembered"][1]) == len(keys)
        assert {choose(None) for _ in range(200)} == partitions  # random, as `send` picks
        monkeypatch.setattr(faust_producer, "KEY_PARTITIONS_CACHED", 10)  # full: starts over
        choose = await faust_patches.key_partitioner(producer, "remembered")
        faust_producer._key_partitions["remembered"][1].clear()
        assert [choose(k) for k in keys] == [default(k, every, every) for k in keys]
        assert len(faust_producer._key_partitions["remembered"][1]) <= 10
    finally:
        await producer.stop()


async def test_the_workers_record_batches_take_a_backlogs_states(tmp_path):
    """A write of a backlog's held states (thousands of 1-2 KiB changelog records) fills a
    few record batches per partition, not dozens of Faust's default 16 KiB: aiokafka hands a
    partition's next batch over only once the one before it is on its way."""
    from schemas.config import load_config
    from streams.runtime.app import PRODUCER_BATCH_BYTES
    from streams.settings import settings_from_env
    from streams.worker import create_worker

    settings = settings_from_env({"ORACULAR_DATADIR": str(tmp_path / "state")})
    app = create_worker(settings, load_config("examples/oracular.yaml"))
    assert app.conf.producer_max_batch_size == PRODUCER_BATCH_BYTES
    assert PRODUCER_BATCH_BYTES < 1_048_588  # the broker's default limit on a record batch
    producer = AIOKafkaProducer(
        bootstrap_servers="127.0.0.1:1", max_batch_size=app.conf.producer_max_batch_size
    )
    try:
        batch, taken = producer.create_batch(), 0
        while batch.append(key=b"user-1", value=b"s" * 1500, timestamp=None) is not None:
            taken += 1
        assert taken >= 150
    finally:
        await producer.stop()
