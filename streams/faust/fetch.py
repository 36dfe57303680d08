"""The fetch: which partitions the consumer thread asks for, and how long a fetch waits.
Faust's `_fetch_records` and consumer creation, and aiokafka 0.14.0's fetcher, patched.

The consumer thread handed aiokafka Faust's live set of active partitions, which aiokafka reads
as "every partition" while it is empty: input fetched during a recovery was returned while the
input was paused, dropped, and never read again. The worker's consumer reads committed records
only (`isolation_level="read_committed"`, which Faust sets only for exactly-once); a fetch of
quiet partitions cannot hold busy input back for Faust's fetch wait
(`_fetch_waiting_by_traffic`); and a partition Faust takes back after its buffer had filled
wakes the consumer thread's wait for records (`_waking_the_fetch`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any, Final

from aiokafka.errors import ConsumerStoppedError
from aiokafka.structs import TopicPartition
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from streams.faust.config import consumer_settings
from streams.faust.internals import _aiokafka_consumer
from streams.faust.upstream import ISOLATION_LEVEL


class _ActivePartitions:
    """Faust's live set of active partitions as aiokafka's `fetched_records` reads it: it asks
    only `tp in partitions`, and an empty set would mean every partition, so this is never
    empty to it (see `_fetch_records`)."""

    __slots__ = ("_tps",)

    def __init__(self, tps: set[TP]) -> None:
        self._tps = tps

    def __bool__(self) -> bool:
        return True

    def __contains__(self, tp: object) -> bool:
        return tp in self._tps


async def _fetch_records(
    self: AIOKafkaConsumerThread,
    consumer: Any,
    active_partitions: set[TP] | None,
    timeout: float | None = None,
    max_records: int | None = None,
) -> Any:
    """`AIOKafkaConsumerThread._fetch_records` of 0.15.3, never asking aiokafka for every
    partition when Faust has none active.

    Faust hands the consumer thread its live set of active partitions (`_active_partitions`,
    mutated by `pause_partitions`/`resume_partitions` on the worker's loop), and aiokafka's
    `Fetcher.fetched_records(partitions)` reads an empty `partitions` as "every assigned
    partition", on entry and each time it wakes from waiting for a fetch (up to the 1 s
    timeout). When the changelog read of a recovery ends, recovery pauses the changelog
    partitions while the input is still paused: the set is empty until the input is resumed.
    A `fetched_records` call the fetch loop started while the changelog was active then
    returns every input record aiokafka has fetched and moves aiokafka's positions past them;
    Faust's `getmany` drops them (their partitions are not active) without a word. If that
    happens after recovery's seek to the committed offsets (aiokafka runs the seek and the
    fetch concurrently in its thread), nothing ever sets the position back: the partition
    delivers nothing again and its commit never moves (the durability test's stall after a
    restore from the changelog; without a changelog to read, the fetch loop is not running in
    that window). Here an empty set returns nothing, and aiokafka only ever sees a view that
    is never empty and drains the partitions active when it drains, not when it was called.

    Records drained for a partition that is paused before Faust's `getmany` looks at them
    are still dropped. Input partitions are paused only by a rebalance, and the recovery that
    follows seeks them to their committed offsets (after the drain, so the position moves
    back); changelog partitions are paused at the end of a changelog read, and the next
    recovery seeks them to the table's persisted offsets.
    """
    if not self.consumer.flow_active:
        return {}
    fetcher = consumer._fetcher
    if consumer._closed or fetcher._closed:
        raise ConsumerStoppedError()
    partitions: _ActivePartitions | None = None  # None: a client-only app reads every partition
    if active_partitions is not None:
        if not active_partitions:
            return {}
        partitions = _ActivePartitions(active_partitions)
    with fetcher._subscriptions.fetch_context():
        return await fetcher.fetched_records(partitions, timeout=timeout, max_records=max_records)


def _waking_the_fetch(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a `Consumer` method that makes partitions active again (`on_buffer_drop`,
    `resume_partitions`): afterwards, wake the consumer thread's wait for fetched records.

    Faust takes a partition out of its active set when the agent's buffer is nearly full
    (`on_buffer_full`), and puts it back once the buffer has drained (`on_buffer_drop`).
    Its fetch loop asks aiokafka's `fetched_records` for records of the active partitions:
    that call looks at the records aiokafka holds when it starts, and then waits for the next
    fetch response with records (up to Faust's 1 s). A partition that was inactive when it
    looked keeps its records in aiokafka's buffer, and aiokafka fetches nothing more of a
    partition with buffered records, so only another partition's records end the wait: here
    a tick, one a second per partition. Under a backlog the worker's input then stopped for
    up to a second each time the buffer had filled (predictions late for the first seconds
    after a start, in half of the latency runs; BENCHMARKS.md). Woken, the call looks again
    at once; when nothing new is there it waits on as before.
    """

    @functools.wraps(method)
    def reactivate(self: Consumer, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        _wake_fetched_records(self)
        return result

    return reactivate


def _wake_fetched_records(consumer: Any) -> None:
    """Wake the `fetched_records` calls waiting in the consumer's thread (from any thread)."""
    fetcher = getattr(_aiokafka_consumer(consumer), "_fetcher", None)
    loop = getattr(fetcher, "_loop", None)
    if loop is None or loop.is_closed():
        return  # not started, or stopped: nothing waits
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(_notify_fetch_waiters, fetcher)


def _notify_fetch_waiters(fetcher: Any) -> None:
    """What aiokafka's fetch routine does when a fetch response brought records."""
    for waiter in list(fetcher._fetch_waiters):
        fetcher._notify(waiter)


def _read_committed(create: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `AIOKafkaConsumerThread._create_worker_consumer`: read committed records only, and
    let the broker hold a fetch of the input for the app's `fetch_max_wait_ms`
    (`streams.faust.config.ConsumerSettings`) while input arrives
    (see `_proc_fetch_request`), not Faust's 1,500 ms.

    Upstream passes `isolation_level="read_committed"` only in exactly-once mode, so an
    at-least-once worker applies records of aborted transactions. aiokafka reads both
    attributes when the consumer starts (it builds its fetcher then), so setting them on the
    new, not yet started consumer is enough.
    """

    def create_worker_consumer(self: AIOKafkaConsumerThread, transport: Any) -> Any:
        consumer = create(self, transport)
        consumer._isolation_level = ISOLATION_LEVEL
        settings = consumer_settings(self.app)
        if settings.fetch_max_wait_ms is not None:
            consumer._fetch_max_wait_ms = settings.fetch_max_wait_ms
        # Read by the fetcher (`_fetch_waiting_by_traffic`), which shares this object.
        consumer._subscription.oracular_quiet_topics = settings.quiet_topics
        return consumer

    create_worker_consumer.__wrapped__ = create  # type: ignore[attr-defined]
    return create_worker_consumer


IDLE_FETCH_WAIT_MS: Final = 500


"""How long the broker may hold a fetch once a broker has sent no input for `BUSY_S`."""


BUSY_S: Final = 1.0


def _fetch_waiting_by_traffic(proc: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap aiokafka's `Fetcher._proc_fetch_request`: a fetch waits the consumer's
    `fetch_max_wait_ms` while its broker has sent records within `BUSY_S`, and at least
    `IDLE_FETCH_WAIT_MS` otherwise. Records of the app's `quiet_topics` (the ticks, a
    record a second per partition) do not count: with them, an idle worker stayed "busy" for
    good and sent a fetch every `fetch_max_wait_ms` (a share of a core, and as many requests
    to the broker).

    Why a short wait while busy: aiokafka keeps one fetch in flight per broker, and a fetch
    names only the partitions with nothing buffered. When the busy partitions are all
    buffered, the next fetch names only the quiet ones (the tick partitions, a record a
    second), and the broker holds it until one of them gets a record or the wait ends; until
    it answers, no fetch of the busy partitions can go out. With Faust's 1,500 ms, the worker
    fell into reading its input in bursts a second apart in half of the latency runs
    (predictions up to a second late); with 10 ms, every batch paid a few such waits
    (BENCHMARKS.md).
    Why a long wait while idle: a fetch of every partition is answered as soon as any record
    arrives, so waiting costs nothing then, and an idle worker sends two fetches a second
    instead of hundreds.
    """

    async def proc_fetch_request(self: Any, assignment: Any, node_id: int, request: Any) -> Any:
        busy_until: dict[int, float] = self.__dict__.setdefault("_oracular_busy_until", {})
        if busy_until.get(node_id, 0.0) < time.monotonic():
            request._max_wait_ms = max(request._max_wait_ms, IDLE_FETCH_WAIT_MS)
        got_records = await proc(self, assignment, node_id, request)
        if got_records and _fetched_traffic(self, request):
            busy_until[node_id] = time.monotonic() + BUSY_S
        return got_records

    proc_fetch_request.__wrapped__ = proc  # type: ignore[attr-defined]
    return proc_fetch_request


def _fetched_traffic(fetcher: Any, request: Any) -> bool:
    """True when the fetch `request` just buffered records of a topic that is not quiet.

    A fetch names only partitions with nothing buffered, so those of its partitions that
    have buffered records now got them from this fetch."""
    quiet: frozenset[str] = getattr(fetcher._subscriptions, "oracular_quiet_topics", frozenset())
    buffered = fetcher._records
    return any(
        topic not in quiet and any(TopicPartition(topic, entry[0]) in buffered for entry in parts)
        for topic, parts in request.topics
    )
