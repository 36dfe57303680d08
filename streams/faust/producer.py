"""The producer: the aiokafka producer under Faust's, key partitions, the buffer's ebb.
`ProducerBuffer.wait_until_ebb` patched; `key_partitioner` remembers keys' partitions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

from aiokafka.partitioner import DefaultPartitioner


def _ebb_without_settings(wait_until_ebb: Callable[..., Any]) -> Callable[..., Any]:
    """`ProducerBuffer.wait_until_ebb`, deciding that nothing is to wait for without a
    settings lookup.

    The conductor awaits it for every record it delivers, and upstream's `size` reads
    `app.conf.producer_threaded` each time (a fifth of the cost of a delivery's Faust part).
    The setting is read once per buffer here; only a buffer over its limit goes on to
    upstream's method, which logs and flushes it.
    """

    @functools.wraps(wait_until_ebb)
    async def ebb(self: Any) -> None:
        threaded = self.__dict__.get("_oracular_threaded")
        if threaded is None:
            threaded = self._oracular_threaded = bool(self.app.conf.producer_threaded)
        waiting = (self.queue if threaded else self.pending) or None
        if waiting is not None and waiting.qsize() > self.max_messages:
            await wait_until_ebb(self)

    return ebb


def kafka_producer(app: Any) -> Any:
    """The aiokafka producer under `app`'s Faust producer (started with the app)."""
    return app.producer._ensure_producer()


KEY_PARTITIONS_CACHED: Final = 100_000


"""Keys whose partition `key_partitioner` remembers per topic (then it starts over)."""


_key_partitions: dict[str, tuple[tuple[int, ...], dict[bytes, int]]] = {}


"""Topic -> (its partitions, key -> partition), as of the last `key_partitioner` call."""


async def key_partitioner(producer: Any, topic: str) -> Callable[[bytes | None], int]:
    """`key -> partition` of `topic` as the aiokafka `producer.send` picks it (the producer's
    partitioner over the topic's partitions), with the topic's metadata fetched first.

    With aiokafka's default partitioner (murmur2 of the key, in pure Python, paid for every
    output record) a key's partition depends only on the key and the
    topic's partitions, so it is remembered per topic and partition set; a key of None (a
    random partition) is never remembered."""
    await producer.client._wait_on_metadata(topic)

    def choose(key: bytes | None) -> int:
        partition: int = producer._partition(topic, None, None, None, key, None)
        return partition

    if type(producer._partitioner) is not DefaultPartitioner:
        return choose
    partitions = tuple(sorted(producer._metadata.partitions_for_topic(topic) or ()))
    cached = _key_partitions.get(topic)
    if cached is None or cached[0] != partitions:  # new, or the topic's partitions changed
        cached = _key_partitions[topic] = (partitions, {})
    known = cached[1]

    def remembered(key: bytes | None) -> int:
        if key is None:
            return choose(key)
        partition = known.get(key)
        if partition is None:
            if len(known) >= KEY_PARTITIONS_CACHED:
                known.clear()
            partition = known[key] = choose(key)
        return partition

    return remembered
