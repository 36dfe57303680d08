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

from streams.runtime.backfill import Range
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
