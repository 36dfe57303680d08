"""`oracular backfill`: the stream processor over an input topic's history, then exit.

A backfill runs the normal worker under a fresh app id (its own consumer group, state and
changelog), from the beginning of the input topic (or from `--since`), up to the end offsets
captured when it starts. The processor is the live worker's; only time differs: a backfill
closes no episode until a partition has reached its end offset (users' own events still close
theirs), then one more tick closes what is due by then: the later of the partition's newest
event time and the wall clock, minus the lateness (docs/time.md). So a backfill equals
`oracular replay --until` that watermark, whatever the order of the topic, and output ids
derive from the events, so running the same backfill twice gives identical ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from streams.admin import BrokerError, quiet_aiokafka
from streams.reset import plan_reset


@dataclass(frozen=True)
class Range:
    """Per partition: where the backfill starts and where it stops."""

    start: dict[int, int]
    stop: dict[int, int]

    @property
    def total(self) -> int:
        """Messages to handle."""
        return sum(max(self.stop[p] - self.start[p], 0) for p in self.stop)


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
