"""Fill holes in a partition's delivered input from the broker before anything past them applies.

Offsets of an input partition reach the agent in order, one after another, unless the log has
no record there (transaction markers, aborted records, compaction, retention) — or the consumer
failed to deliver records that exist. `streams/faust/` fixes the known ways Faust
loses fetched input; this is the check that makes a loss impossible whatever its cause: when a
batch holds a record past the next expected offset, the missing range is read straight from the
broker (read_committed, the worker's own security settings) and the records found are applied
first, in order. A range that holds no record is a real hole in the log and nothing is added.
Either way the record after the hole applies only once everything before it has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from streams.runtime.processor import InMessage

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S: Final = 20.0
"""How long a hole may take to read from the broker before the worker gives up on it."""
IDLE_POLLS: Final = 3
"""Polls (0.2 s each) that return nothing and do not move the position: the range is read."""


class GapFiller:
    """A group-less consumer that reads ranges of input offsets on demand."""

    def __init__(self, bootstrap: str, client: Mapping[str, Any]) -> None:
        """Connect lazily to `bootstrap` with the aiokafka keyword arguments `client`."""
        self.bootstrap, self.client = bootstrap, dict(client)
        self.consumer: AIOKafkaConsumer | None = None
        self.filled = 0

    async def read(self, topic: str, partition: int, start: int, stop: int) -> list[Any]:
        """The committed records of `topic`/`partition` with offsets in [start, stop).

        Raises:
            TimeoutError: the broker did not return the range in time.
        """
        consumer = await self._consumer()
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        found: list[Any] = []
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        idle_polls = 0
        while True:
            position = await consumer.position(tp)
            if position >= stop or idle_polls >= IDLE_POLLS:
                # Past the range, or the broker has nothing more to give below it (the rest
                # of the range holds only transaction markers or aborted records).
                return [r for r in found if start <= r.offset < stop]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                msg = f"offsets {start}..{stop - 1} of {topic}[{partition}] not read in time"
                raise TimeoutError(msg)
            batches = await consumer.getmany(tp, timeout_ms=int(min(remaining, 0.2) * 1000))
            records = batches.get(tp, [])
            found.extend(records)
            moved = await consumer.position(tp)
            idle_polls = 0 if records or moved > position else idle_polls + 1

    async def log_start(self, topic: str, partition: int) -> int:
        """The partition's first offset still in the log (retention and deletions move it)."""
        consumer = await self._consumer()
        tp = TopicPartition(topic, partition)
        first: int = (await consumer.beginning_offsets([tp]))[tp]
        return first

    async def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """The end offsets of `topic`'s `partitions`; {} when the broker has no such topic."""
        consumer = await self._consumer()
        consumer._client.add_topic(topic)  # it only asks the broker about topics it is told of
        await consumer._client.force_metadata_update()
        if not consumer.partitions_for_topic(topic):
            return {}
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: int(offset) for tp, offset in ends.items()}

    async def close(self) -> None:
        """Disconnect."""
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None

    async def _consumer(self) -> AIOKafkaConsumer:
        if self.consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
                **self.client,
            )
            await consumer.start()
            self.consumer = consumer
        return self.consumer


async def _warn_if_deleted(
    filler: GapFiller, topic: str, partition: int, start: int, stop: int
) -> None:
    """A hole that starts below the log start was deleted by the broker before the worker read
    it (retention, a deletion): lost input, unlike transaction markers, so say so loudly."""
    try:
        first = await filler.log_start(topic, partition)
    except (TimeoutError, OSError, KafkaError):
        return  # the hole is still counted and logged by the processor
    if first > start:
        log.warning(
            "input partition %s: offsets %s..%s were deleted by the broker (retention) before "
            "this worker read them: their events are not in its state. Keep the input longer "
            "than a worker can fall behind",
            partition,
            start,
            min(first, stop) - 1,
        )


async def fill_holes(
    filler: GapFiller, messages: list[InMessage], expected: dict[int, int], events_topic: str
) -> list[InMessage]:
    """`messages` with every input record missing before a delivered one read in, in order.

    `expected`: partition -> the next input offset to handle (updated as messages pass).
    A missing record has the delivered record's partition, so its state is read and written
    there; it is not a Faust event, so there is nothing to acknowledge.
    """
    out: list[InMessage] = []
    for message in messages:
        if message.topic != events_topic:
            out.append(message)
            continue
        partition = message.partition
        start = expected.get(partition)
        if start is not None and message.offset > start:
            try:
                records = await filler.read(events_topic, partition, start, message.offset)
            except (TimeoutError, OSError) as exc:
                log.error(
                    "input partition %s: could not read offsets %s..%s from the broker (%s); "
                    "going on without them",
                    partition,
                    start,
                    message.offset - 1,
                    exc,
                )
                records = []
            if len(records) < message.offset - start:
                await _warn_if_deleted(filler, events_topic, partition, start, message.offset)
            if records:
                filler.filled += len(records)
                log.warning(
                    "input partition %s: offsets %s..%s were not delivered by the consumer; "
                    "read %s record(s) of them from the broker and applied them first",
                    partition,
                    start,
                    message.offset - 1,
                    len(records),
                )
            out.extend(
                InMessage(
                    events_topic,
                    partition,
                    r.offset,
                    r.key,
                    r.value,
                    r.timestamp if r.timestamp and r.timestamp > 0 else None,
                )
                for r in records
            )
        out.append(message)
        expected[partition] = max(expected.get(partition, 0), message.offset + 1)
    return out
