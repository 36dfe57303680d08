"""`oracular backfill`'s broker side: the range to run, a fresh app id, the start offsets.

The run itself is the worker's (`streams/runtime/backfill.py`); these are the steps the command
takes around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from schemas.events import DecodeError, IgnoredMessage, decode_event
from streams.runtime.backfill import Range
from streams.runtime.erasure import marker_key
from streams.runtime.progress import Progress
from streams.tools.admin import BrokerError, quiet_aiokafka
from streams.tools.reset import plan_reset


async def committed_offsets(
    bootstrap: str, group: str, topic: str, client: Mapping[str, Any] | None = None
) -> dict[int, int]:
    """The consumer group's committed offsets of `topic` (partition -> offset)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
    try:
        with quiet_aiokafka():
            await admin.start()
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}


async def capture_range(
    bootstrap: str, topic: str, since_ms: int | None, client: Mapping[str, Any] | None = None
) -> Range:
    """The input topic's start (earliest, or the first offset at/after `since_ms`) and end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **(client or {})
    )
    try:
        with quiet_aiokafka():
            await consumer.start()
        # The consumer only tracks metadata of topics it is told about; ask for this one.
        consumer._client.add_topic(topic)
        await consumer._client.force_metadata_update()
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            msg = f"the input topic {topic!r} does not exist on {bootstrap}"
            raise BrokerError(msg)
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        stop = await consumer.end_offsets(tps)
        start = await consumer.beginning_offsets(tps)
        if since_ms is not None:
            found = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
            start = {tp: stop[tp] if found[tp] is None else found[tp].offset for tp in tps}
    finally:
        await consumer.stop()
    return Range({tp.partition: start[tp] for tp in tps}, {tp.partition: stop[tp] for tp in tps})


async def check_fresh(bootstrap: str, app_id: str, client: Mapping[str, Any] | None) -> None:
    """Refuse an app id that already has a consumer group or internal topics."""
    plan = await plan_reset(bootstrap, app_id, Path("/nonexistent"), client)  # no local check
    if plan.group is not None or plan.topics:
        msg = (
            f"app id {app_id!r} already has state on the broker (consumer group or "
            f"internal topics): a backfill needs a fresh one. Pick another --app-id, or "
            f"`oracular reset {app_id}` first"
        )
        raise BrokerError(msg)


async def commit_start(
    bootstrap: str,
    app_id: str,
    topic: str,
    start: Mapping[int, int],
    client: Mapping[str, Any] | None = None,
) -> None:
    """Commit `start` for the app's consumer group, so the worker begins there (--since)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=app_id, enable_auto_commit=False, **(client or {})
    )
    try:
        with quiet_aiokafka():
            await consumer.start()
        consumer.assign([TopicPartition(topic, p) for p in start])  # commit needs an assignment
        await consumer.commit(
            {TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in start.items()}
        )
    finally:
        await consumer.stop()


async def scan_erasures(
    bootstrap: str,
    topic: str,
    span: Range,
    secret: bytes,
    *,
    max_skew_ms: int,
    client: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """The erase commands up to the range's end, read ahead from the topic's start (a command
    before `--since` still erases later inputs): marker key (hex) -> the latest erase time of
    its user. Only the commands the worker applies count: keyed by their user, and
    not dated beyond the allowed skew past their record's timestamp. A value without the bytes
    `erase` is not decoded (nearly every record: the read costs little more than the fetch).
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # a start the broker deleted since: its first offset
        max_partition_fetch_bytes=4 * 1024 * 1024,
        **(client or {}),
    )
    erased: dict[str, int] = {}
    left = {p: o for p, o in span.stop.items() if o > 0}
    total = sum(left.values())  # at most: the broker may have deleted the oldest
    progress = Progress("backfill: reading ahead for erase commands", total, unit="messages")
    try:
        with quiet_aiokafka():
            await consumer.start()
        tps = {p: TopicPartition(topic, p) for p in left}
        consumer.assign(list(tps.values()))
        await consumer.seek_to_beginning(*tps.values())
        done = 0
        while left:
            batches = await consumer.getmany(*[tps[p] for p in left], timeout_ms=1000)
            for tp, records in batches.items():
                stop = left.get(tp.partition)
                for record in records:
                    if stop is None or record.offset >= stop:
                        break
                    done += 1
                    if record.value is not None and b"erase" in record.value:
                        _note_erasure(record, secret, max_skew_ms, erased)
                if records and stop is not None and records[-1].offset >= stop - 1:
                    left.pop(tp.partition, None)
            for partition in list(left):  # a partition whose end was deleted (retention)
                if await consumer.position(tps[partition]) >= left[partition]:
                    left.pop(partition)
            progress.advance(done, count=done - progress.done)
    finally:
        await consumer.stop()
        progress.close()
    return erased


def _note_erasure(record: Any, secret: bytes, max_skew_ms: int, erased: dict[str, int]) -> None:
    """Note `record` in `erased` if it is an erase command the worker would apply."""
    try:
        event = decode_event(record.value, fallback_ts=record.timestamp)
    except (DecodeError, IgnoredMessage):
        return
    key = event.user.encode()
    if event.type != "erase" or record.key != key:
        return
    if record.timestamp and record.timestamp > 0 and event.at > record.timestamp + max_skew_ms:
        return  # the worker dead-letters it (a clock too far ahead)
    marker = marker_key(secret, key).hex()
    erased[marker] = max(event.at, erased.get(marker, event.at))
