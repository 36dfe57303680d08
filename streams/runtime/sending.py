"""A batch's records sent as Kafka record batches, one per partition (aiokafka's batch API).

Sending record by record (`producer.send`) costs, per record, a metadata check, a partitioner
call, an append into the producer's accumulator and a future: about a tenth of the worker's
CPU for its outputs and changelog records. The worker knows a batch's records all at once, so
it groups them by partition, fills one record batch per partition (`create_batch`, then
`send_batch`; a full one is sent and another started) and waits for each batch's
acknowledgement. Records keep the partition the producer's partitioner gives their key (the
one `producer.send` would have used) and their order within it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from streams.faust import patches as faust_patches

Record = tuple[str, int | None, bytes | None, bytes | None]
"""(topic, partition or None for the key's partition, key, value; None: a tombstone)."""


Sent = list[tuple[str, int, int, Any]]
"""Record batches handed to the producer: (topic, partition, records, delivery future)."""


async def no_check() -> None:
    """The default check before a hand-off or an acknowledged write: none."""


async def hand_over(
    producer: Any,
    records: Iterable[Record],
    before_sending: Callable[[], Awaitable[None]] = no_check,
) -> Sent:
    """Hand `records` to the aiokafka `producer` in record batches, without waiting for the
    broker (`acknowledged` does). Records of one partition go out in the order given, after
    any handed over earlier.

    `before_sending()` is awaited before each record batch is handed to the producer (a
    hand-off may yield to the event loop; the fence checks membership there after a stall).
    """
    grouped: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = {}
    choosers: dict[str, Callable[[bytes | None], int]] = {}
    for topic, given, key, value in records:
        partition = given
        if partition is None:
            choose = choosers.get(topic)
            if choose is None:
                choose = choosers[topic] = await faust_patches.key_partitioner(producer, topic)
            partition = choose(key)
        grouped.setdefault((topic, partition), []).append((key, value))
    sent: Sent = []

    async def send_batch(topic: str, partition: int, batch: Any, count: int) -> None:
        await before_sending()
        future = await producer.send_batch(batch, topic, partition=partition)
        sent.append((topic, partition, count, future))

    for (topic, partition), items in grouped.items():
        batch, count = producer.create_batch(), 0
        for key, value in items:
            if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it
                await send_batch(topic, partition, batch, count)
                batch, count = producer.create_batch(), 0
                batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any
            count += 1
        await send_batch(topic, partition, batch, count)
    return sent


async def acknowledged(sent: Sent) -> dict[tuple[str, int], int]:
    """Wait until the broker has every record batch of `sent`; returns the last offset written
    per (topic, partition). Raises what a failed delivery raises."""
    last: dict[tuple[str, int], int] = {}
    for topic, partition, count, future in sent:
        metadata = await future  # the batch's base offset: its records follow it in order
        end = metadata.offset + count - 1
        last[topic, partition] = max(last.get((topic, partition), -1), end)
    return last


def forget(sent: Sent) -> None:
    """Stop waiting for record batches handed to the producer (their errors are retrieved, so
    asyncio does not report them as never retrieved)."""
    for _, _, _, future in sent:
        future.add_done_callback(_retrieved)


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Take a forgotten delivery's outcome, so asyncio does not report it as never retrieved."""
    if not future.cancelled():
        future.exception()
