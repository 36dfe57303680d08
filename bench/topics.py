"""The bench's topics: create them, preload events, count their records."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.workers import PARTITIONS
from engine import Event
from schemas.events import encode_event
from streams.settings.topics import TopicSpec
from streams.tools.admin import ensure_topics_async

if TYPE_CHECKING:
    from bench.inputs import Record


async def preload(bootstrap: str, topic: str, events: Sequence[Event]) -> float:
    """Produce `events` (keyed by user, murmur2) and wait for the broker's acks; seconds."""
    return await _produce(
        bootstrap, topic, ((event.user.encode(), encode_event(event), None) for event in events)
    )


async def preload_records(bootstrap: str, topic: str, records: Sequence[Record]) -> float:
    """Produce `records` (bench/inputs.py: key, value, record timestamp) as `preload` does."""
    return await _produce(bootstrap, topic, ((r.key, r.value, r.timestamp_ms) for r in records))


async def _produce(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes, int | None]]
) -> float:
    """Send (key, value, record timestamp) records in large batches, acked by every replica;
    the seconds from the first send to the last ack (encoding included: `records` may be
    lazy)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=256 * 1024
    )
    await producer.start()
    started = time.monotonic()
    try:
        for key, value, timestamp_ms in records:
            await producer.send(topic, value, key=key, timestamp_ms=timestamp_ms)
        await producer.flush()
    finally:
        await producer.stop()
    return time.monotonic() - started


async def create_topics(
    bootstrap: str, names: Sequence[str], config: Mapping[str, str] | None = None
) -> None:
    """Topics with the benchmark's partition count and `config` (idempotent)."""
    specs = [TopicSpec(name, PARTITIONS, config or {}) for name in names]
    await ensure_topics_async(bootstrap, specs)


async def end_offsets(bootstrap: str, topic: str) -> int:
    """Sum of the topic's end offsets: the records it holds (nothing is deleted here)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.force_metadata_update()  # no public metadata refresh
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in partitions]
        return sum((await consumer.end_offsets(tps)).values()) if tps else 0
    finally:
        await consumer.stop()


async def settled_end_offsets(bootstrap: str, topic: str, at_least: int) -> int:
    """The topic's record count once it holds `at_least` and stopped growing (bounded)."""
    deadline = time.monotonic() + 120.0
    previous = -1
    while True:
        count = await end_offsets(bootstrap, topic)
        if (count >= at_least and count == previous) or time.monotonic() > deadline:
            return count
        previous = count
        await asyncio.sleep(1.0)
