"""`faust_patches.membership` against the real broker: the heartbeat a worker sends after a
long pause tells it whether it is still a member of its group's current generation.

A stalled worker asks before it writes (streams/runtime/fencing.py `Fence.may_write`), so the answer
must be right in both directions: a member that was evicted while frozen must hear "lost", and
one that was not must hear "member" (else it would drop every batch after a pause).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.faust import patches as faust_patches

pytestmark = pytest.mark.integration

JOIN_TIMEOUT_S = 60.0  # generous: a loaded machine


def _as_faust_consumer(client: AIOKafkaConsumer) -> Any:
    """The two things `membership` reads of Faust's consumer: its thread's aiokafka client and
    `call_thread` (here the client runs on the test's own loop)."""

    async def call_thread(fun: Any) -> Any:
        return await fun()

    return SimpleNamespace(_thread=SimpleNamespace(_consumer=client, call_thread=call_thread))


async def _joined(client: AIOKafkaConsumer) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not client.assignment():
        assert time.monotonic() < deadline, "the consumer did not join its group"
        await client.getmany(timeout_ms=200)


async def test_membership_follows_the_group(kafka: str, name: Any) -> None:
    topic, group = name("in"), name("group")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    # Its own heartbeats are rare, so only the questions asked here notice the rebalance below.
    first = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka,
        group_id=group,
        heartbeat_interval_ms=20_000,
        session_timeout_ms=60_000,
    )
    await first.start()
    try:
        await _joined(first)
        consumer = _as_faust_consumer(first)
        assert await faust_patches.membership(consumer) == faust_patches.MEMBER

        # A second member joins: until the first rejoins, the group is rebalancing (and the
        # first rejoins only when told so: its own heartbeats are 20 s apart).
        second = AIOKafkaConsumer(topic, bootstrap_servers=kafka, group_id=group)

        async def join() -> None:
            await second.start()  # aiokafka's start waits for the group's answer
            await _joined(second)

        joining = asyncio.ensure_future(join())
        try:
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            answers = []
            while not joining.done():
                assert time.monotonic() < deadline, "the second consumer did not join"
                answers.append(await faust_patches.membership(consumer))
                await first.getmany(timeout_ms=100)  # lets the first rejoin when told
            await joining
            assert faust_patches.REBALANCING in answers, answers
            assert faust_patches.LOST not in answers, answers
            await _joined(first)
            assert await faust_patches.membership(consumer) == faust_patches.MEMBER
        finally:
            joining.cancel()
            await second.stop()

        # An old generation (what a member evicted while frozen still holds) is refused.
        coordinator = first._coordinator
        current = coordinator.generation
        coordinator.generation = current - 1
        try:
            assert await faust_patches.membership(consumer) == faust_patches.LOST
        finally:
            coordinator.generation = current
    finally:
        await first.stop()
