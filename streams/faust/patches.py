"""Fixes to faust-streaming 0.15.3's consumer, and the worker's only reads of Faust internals.

faust-streaming 0.15.3 (with aiokafka 0.14.0) loses input around rebalances. Its fetch loop
(`Consumer._drain_messages`) keeps `_read_offset` per partition and drops every fetched record
below it. `seek` and `perform_seek` store the *next offset to read* there, the loop stores the
*last offset delivered*, and the loop writes it after awaiting each delivery, even when a seek
or a revocation happened meanwhile. Recovery resumes the input partitions before seeking them
to the committed offsets, so records are delivered from the old position, the stream buffers
are then cleared, and the loop has already moved `_read_offset` past them: when the consumer
re-reads from the committed offset, those records are dropped as if delivered. The loop also
marks forward jumps as acked ("gaps") one offset too far (including the record it is about to
deliver), and the commit path (`_new_offset`, with `_add_gap`) commits past an unacked record
at the head of a partition (upstream issue #606; its fix, PR #707, is not merged). And the
consumer thread hands aiokafka Faust's live set of active partitions, which aiokafka reads as
"every partition" while it is empty: during a recovery that reads the changelog, input records
fetched after the seek to the committed offsets were returned while the input was still
paused, dropped, and never read again (a partition stalled for good).

Each patch below replaces one method with a copy of the 0.15.3 code changed as little as the fix
needs; the comment on each says what upstream does wrong and why the change is right. They are
applied once, when this module is imported (`streams.runtime.app` imports it, so `oracular worker`
and `faust -A streams.runtime.app worker` both run patched), and only onto faust-streaming 0.15.3:
another version raises `FaustVersionError`, because these methods must be re-read against it first.
The worker reads aborted transactional input unless told otherwise, so the consumer is also set
to `isolation_level="read_committed"` (Faust sets that only for its exactly-once mode). And one
patch wraps aiokafka's (0.14.0) fetcher, so a fetch of quiet partitions cannot hold busy input
back for Faust's 1.5 s fetch wait (`_fetch_waiting_by_traffic`); and a partition Faust takes
back after its buffer had filled wakes the consumer thread's wait for records, which otherwise
ran on until another partition's records arrived (`_waking_the_fetch`). Last, the worker's
consumer runs on the worker's own event loop rather than in Faust's consumer thread, which
waited for the GIL at every step while the worker applied batches (`ConsumerOnWorkerLoop`).

Nothing else in the product touches Faust's private attributes: the small read functions at the
end of this module are the worker's only way to them. `RawSchema` (a schema whose decode skips
Faust's serializer registry) is here too, since it stands in for Faust's own decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Final, NamedTuple, cast

import rocksdict  # the rocksdb:// store's own binding (a dependency)
from aiokafka import errors as kafka_errors
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.errors import ConsumerStoppedError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.group import HeartbeatRequest
from aiokafka.structs import TopicPartition
from faust.serializers.schemas import Schema
from faust.tables.recovery import Recovery
from faust.transport import consumer as consumer_module
from faust.transport.consumer import CONSUMER_FETCHING, Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.transport.producer import ProducerBuffer
from faust.types import TP

FAUST_VERSION: Final = "0.15.3"
"""The faust-streaming release these patches were written against (and the only one applied)."""
AIOKAFKA_VERSION: Final = "0.14.0"
"""The aiokafka release under it (pinned with it); one patch wraps its fetcher."""
ISOLATION_LEVEL: Final = "read_committed"
"""The worker reads committed transactional records only: aborted ones never reach the agent."""


class FaustVersionError(RuntimeError):
    """Raised on import when the installed faust-streaming is not the one patched here.

    Install faust-streaming 0.15.3 (the version pinned in pyproject.toml), or re-check each
    patched method in this module against the new version's source and update FAUST_VERSION.
    """


class _Delivered(NamedTuple):
    position: int
    read_offset: int | None


# --- the patched methods -----------------------------------------------------------------------


async def _drain_messages(self: Consumer, fetcher: Any) -> None:  # pragma: no cover - see tests
    """`Consumer._drain_messages` of 0.15.3 with these changes (and nothing else).

    1. `_read_offset[tp]` is the next offset to read, as `seek`, `perform_seek` and `seek_wait`
       already store it; upstream stored the last delivered offset, so after every seek the
       loop compared offsets against a value with another meaning.
    2. A record the consumer has moved back over is not delivered (`_fetched_after_seeks`):
       aiokafka only returns records below its position, so a record at or past the position
       was fetched before a seek (a rebalance's seek to the committed offset) and the consumer
       returns it again from there. Upstream delivered such records and moved `_read_offset`
       past the re-read, which then dropped the records in between.
    3. `_read_offset` moves only when the record was delivered and no seek or revocation
       happened while the loop awaited the delivery. Upstream wrote it unconditionally after
       the await: for a record whose delivery `stop_flow` interrupted, and over the offset a
       concurrent seek had just set, so the re-read after the seek was dropped.
    4. A forward jump from the next offset to read to a record's offset marks the absent
       offsets [next, offset - 1] as a gap (acked), not [last + 1, offset]: upstream's range
       included the record being delivered, acking it before any stream had processed it.
    5. After a fetched batch has been delivered whole, the consumer's positions are kept
       (`delivered_through`), so the worker can tell that a partition is read to its end when
       its last records are transaction markers (which are not delivered).
    6. A record is delivered by stepping the delivery coroutine in this task, not as a task
       raced against three others (`_run_delivery`); only a delivery that has to wait is
       raced against the flow's suspension.
    7. A record goes straight to the conductor's handler for its partition while no
       resubscription holds the conductor's lock (`_handler`), not through the consumer's
       callback, whose lookup under that lock cost two coroutines a record.
    """
    getmany = self.getmany
    consumer_should_stop = cast(Any, self)._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set
    flag_consumer_fetching = CONSUMER_FETCHING
    set_flag = self.diag.set_flag
    unset_flag = self.diag.unset_flag
    yield_every = 100
    num_since_yield = 0

    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(flag_consumer_fetching)
            ait = cast(AsyncIterator, getmany(timeout=1.0))
            await self.sleep(0)
            if not self.should_stop:
                complete = True
                async for tp, message in ait:
                    num_since_yield += 1
                    if num_since_yield > yield_every:
                        await asyncio.sleep(0)
                        num_since_yield = 0
                    if not await _deliver(self, tp, message):
                        complete = False  # stop_flow: a rebalance re-reads from the commit
                        break
                unset_flag(flag_consumer_fetching)
                if complete:
                    _keep_delivered_positions(self)
    except self.consumer_stopped_errors:
        if self.transport.app.should_stop:
            self.log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if self.transport.app.should_stop:
            self.log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:
        self.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        unset_flag(flag_consumer_fetching)


async def _deliver(self: Consumer, tp: TP, message: Any) -> bool:
    """The body of the patched fetch loop for one record; False when flow was stopped."""
    read_offset = self._read_offset
    offset = message.offset
    r_offset = read_offset.get(tp)
    if (r_offset is not None and offset < r_offset) or not _fetched_after_seeks(self, tp, offset):
        self.log.dev("DROPPED MESSAGE ROFF %r (read again later)", offset)
        return True
    if r_offset is not None and offset > r_offset and self.app.topics.acks_enabled_for(tp.topic):
        # Offsets r_offset..offset-1 are not in the log (transaction markers, aborted
        # records, compaction, retention): nothing will ever ack them.
        await self._add_gap(tp, r_offset, offset - 1)
    commit_every = self._commit_every
    if commit_every is not None and self._n_acked >= commit_every:
        self._n_acked = 0
        await self.commit()
    delivery: Coroutine[Any, Any, Any] = _handler(self, tp)(message)  # an async def call
    if not await _run_delivery(self, delivery):
        return False
    if _fetched_after_seeks(self, tp, offset):
        current = read_offset.get(tp)
        if current is None or current <= offset:
            read_offset[tp] = offset + 1
    return True


def _handler(self: Consumer, tp: TP) -> Any:
    """What delivers a record of `tp`: the conductor's handler for it, as the consumer's
    callback (`Conductor.on_message` of 0.15.3) looks it up under the conductor's lock. That
    lock only keeps the lookup off the map while a resubscription rebuilds it: when no one
    holds it, the handler is taken straight from the map (the lock's enter and exit were two
    of the seven coroutines a record cost). Otherwise, or for a partition not in the map, the
    consumer's own callback, which waits for the lock (or raises as upstream does).
    """
    conductor: Any = self.app.topics  # a Conductor: its private map and lock
    if not conductor._tp_to_callback_lock.locked():
        handler = conductor._tp_to_callback.get(tp)
        if handler is not None:  # (no `cast` here: its subscripted type is built per call)
            return handler
    return self.callback


async def _run_delivery(self: Consumer, delivery: Coroutine[Any, Any, Any]) -> bool:
    """Run the coroutine `delivery` to its end; False, with the delivery cancelled, when flow
    is suspended (a rebalance) or the consumer stops while it waits, as upstream's
    `wait_first(delivery, suspend_flow.wait())` does.

    Upstream runs every delivery as a task raced against three others (four tasks and an
    `asyncio.wait` per record: a tenth of the worker's CPU). A delivery almost never waits:
    it puts the record into a stream buffer with room. So the coroutine is stepped here, in
    the fetch loop's own task, and only a future it does wait on (a full buffer) is raced
    against the suspension with `wait_first`, as upstream races the whole delivery.
    """
    try:
        awaited = delivery.send(None)
    except StopIteration:
        return True
    try:
        while True:
            if awaited is None:  # a bare yield (`asyncio.sleep(0)`): give the loop a turn
                await asyncio.sleep(0)
            elif getattr(awaited, "_asyncio_future_blocking", None) is None:
                msg = f"a delivery yielded {awaited!r}, not a future"
                raise RuntimeError(msg)
            else:  # a future it awaits: wait as its task would, unless flow stops first
                awaited._asyncio_future_blocking = False
                if not awaited.done():
                    result = await self.wait_first(awaited, self.suspend_flow.wait())
                    if awaited not in result.done:
                        _cancel(delivery)
                        return False
            try:
                awaited = delivery.send(None)
            except StopIteration:
                return True
    except BaseException:  # this task cancelled (shutdown), or the delivery raised
        delivery.close()
        raise


def _cancel(delivery: Coroutine[Any, Any, Any]) -> None:
    """Cancel a suspended coroutine as cancelling its task would."""
    try:
        delivery.throw(asyncio.CancelledError())
    except (asyncio.CancelledError, StopIteration):
        return
    delivery.close()  # it caught the cancellation and waits again: end it


async def _add_gap(self: Consumer, tp: TP, offset_from: int, offset_to: int) -> None:
    """`Consumer._add_gap` of 0.15.3, clamped at the committed offset rather than one past it.

    `_committed_offset[tp]` is the next offset to read (what Kafka stores as committed), so the
    committed offset itself can be absent from the log (a transaction marker right after the
    last committed record is the usual case). Upstream clamped to `committed + 1`, leaving that
    offset neither acked nor a gap; its `_new_offset` hid that with the `> 1` test patched
    below, which in turn let it commit past an unacked record.
    """
    committed = self._committed_offset[tp]
    gap_for_tp = self._gap[tp]
    if committed is not None:
        offset_from = max(offset_from, committed)
    if offset_from <= offset_to:
        gap_for_tp.addi(offset_from, offset_to + 1)  # intervaltree excludes the end
        await asyncio.sleep(0)
        gap_for_tp.merge_overlaps()


def _new_offset(self: Consumer, tp: TP) -> int | None:
    """`Consumer._new_offset` of 0.15.3 with the head-of-queue test fixed (issue #606).

    The offset to commit is one past the first run of consecutive acked offsets, and only if
    that run starts at the committed offset (the next offset to read). Upstream returned None
    only when `min(acked) - committed > 1`, so with the record at the committed offset still
    in flight and the next one acked it committed past it, and a crash then lost it (#606,
    PR #707). It also skipped the test when the committed offset was 0.
    """
    acked = self._acked[tp]
    if acked:
        max_offset = max(acked)
        gap_for_tp = self._gap[tp]
        if gap_for_tp:
            candidates = gap_for_tp.overlap(0, max_offset)
            sorted_candidates = sorted(candidates, key=lambda x: x.begin)
            if sorted_candidates:
                stuff_to_add: list[int] = []
                for entry in sorted_candidates:
                    stuff_to_add.extend(range(entry.begin, entry.end))
                new_max_offset = max(stuff_to_add[-1], max_offset + 1)
                acked.extend(stuff_to_add)
                gap_for_tp.chop(0, new_max_offset)
        acked.sort()
        committed_offset = self._committed_offset[tp]
        if committed_offset is not None and min(acked) > committed_offset:
            return None  # the record at the committed offset is not acked yet
        batch = next(consumer_module.consecutive_numbers(acked))
        acked[: len(batch)] = []
        self._acked_index[tp].difference_update(batch)
        return int(batch[-1]) + 1
    return None


async def _on_recovery_completed(self: Recovery, generation_id: int = 0) -> None:
    """`Recovery.on_recovery_completed` of 0.15.3, seeking input before resuming it.

    Upstream resumed the input partitions first, then awaited the seek to the committed
    offsets, then resumed flow control, which clears every stream buffer. Fetching is running
    at that point (recovery resumed it), so input was fetched from the old position, delivered
    into buffers, and cleared, and the fetch loop had already moved its read offset past it.
    Here the partitions are sought first and resumed only after the buffers are cleared, so
    everything delivered from then on is read from the committed offsets and kept.
    (`Recovery._resume_streams` has the same order but runs only for apps without tables; the
    worker always has its state table, so it is left as it is.)
    """
    consumer = self.app.consumer
    self.log.info("Restore complete!")
    await self.app.on_rebalance_complete.send()
    self._set_recovery_ended()
    callback_coros = [
        asyncio.ensure_future(
            table.on_recovery_completed(
                self.actives_for_table[table],
                self.standbys_for_table[table],
            )
        )
        for table in self.tables.values()
    ]
    if callback_coros:
        await asyncio.wait(callback_coros)
    assignment = consumer.assignment()
    if self.app.consumer_generation_id != generation_id:
        self.log.warning(
            f"Recovery rebalancing again app id "
            f"{self.app.consumer_generation_id} param {generation_id}"
        )
        return
    if assignment:
        self.log.info("Seek stream partitions to committed offsets.")
        await self._wait(consumer.perform_seek(), timeout=self.app.conf.broker_request_timeout)
    self.completed.set()
    self.log.dev("Resume stream partitions")
    self.app.flow_control.resume()  # clears the stream buffers: before any input is fetched
    consumer.resume_partitions({tp for tp in assignment if not self._is_changelog_tp(tp)})
    consumer.resume_flow()
    await cast(Any, self.app)._fetcher.maybe_start()
    self.tables.on_actives_ready()
    if not self.app.assignor.assigned_standbys():
        self.tables.on_standbys_ready()
    self.app.on_rebalance_end()
    self.log.info("Worker ready")


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
    0.1-1 s each time the buffer had filled (predictions a second late for the first seconds
    after a start, in half of the latency runs at 8,400 events/s). Woken, the call looks again
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
    let the broker hold a fetch of the input for `app.fetch_max_wait_ms` while input arrives
    (see `_proc_fetch_request`), not Faust's 1,500 ms.

    Upstream passes `isolation_level="read_committed"` only in exactly-once mode, so an
    at-least-once worker applies records of aborted transactions. aiokafka reads both
    attributes when the consumer starts (it builds its fetcher then), so setting them on the
    new, not yet started consumer is enough.
    """

    def create_worker_consumer(self: AIOKafkaConsumerThread, transport: Any) -> Any:
        consumer = create(self, transport)
        consumer._isolation_level = ISOLATION_LEVEL
        wait_ms = getattr(self.app, "fetch_max_wait_ms", None)
        if wait_ms is not None:
            consumer._fetch_max_wait_ms = int(wait_ms)
        # Read by the fetcher (`_fetch_waiting_by_traffic`), which shares this object.
        consumer._subscription.oracular_quiet_topics = frozenset(
            getattr(self.app, "fetch_quiet_topics", ())
        )
        return consumer

    create_worker_consumer.__wrapped__ = create  # type: ignore[attr-defined]
    return create_worker_consumer


IDLE_FETCH_WAIT_MS: Final = 500
"""How long the broker may hold a fetch once a broker has sent no input for `BUSY_S`."""
BUSY_S: Final = 1.0


def _fetch_waiting_by_traffic(proc: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap aiokafka's `Fetcher._proc_fetch_request`: a fetch waits the consumer's
    `fetch_max_wait_ms` while its broker has sent records within `BUSY_S`, and at least
    `IDLE_FETCH_WAIT_MS` otherwise. Records of the app's `fetch_quiet_topics` (the ticks, a
    record a second per partition) do not count: with them, an idle worker stayed "busy" for
    good and sent 500 fetches a second (15% of a core, and as many requests to the broker).

    Why a short wait while busy: aiokafka keeps one fetch in flight per broker, and a fetch
    names only the partitions with nothing buffered. When the busy partitions are all
    buffered, the next fetch names only the quiet ones (the tick partitions, a record a
    second), and the broker holds it until one of them gets a record or the wait ends; until
    it answers, no fetch of the busy partitions can go out. With Faust's 1,500 ms, the worker
    fell into reading its input in bursts a second apart in half of the latency runs
    (predictions 0.5-1 s late); with 10 ms, every batch paid a few such waits (p50 40 ms).
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


class _LoopTask:
    """Stands in for mode's `WorkerThread` (the thread a `ServiceThread` runs in): runs the
    service's `_serve` as a task of the loop that starts it. `ServiceThread.start` starts it and
    waits until the service has started, as it waits for a thread."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self.service._serve()
        except Exception:
            # As `ServiceThread._start_thread` does when its thread's loop ends with an error.
            # Not raised again: `_serve` has logged it and crashed the service (a thread's
            # error ends the thread; a task's would only be reported as never retrieved).
            self.service.set_shutdown()

    def stop(self) -> None:
        """Nothing to join: `ServiceThread.stop` has waited until the service shut down
        (its consumer stopped), which is all the thread's end waited for besides its loop."""

    def is_alive(self) -> bool:
        return self.task is not None and not self.task.done()


class ConsumerOnWorkerLoop(AIOKafkaConsumerThread):
    """Faust's aiokafka consumer, run on the worker's event loop instead of a thread of its own
    (`ORACULAR_CONSUMER_LOOP=worker`, the default; `_new_consumer_thread`).

    Faust runs the aiokafka consumer in a `ServiceThread`: its own thread and event loop, the
    worker's loop asking it for records through a method queue (`call_thread`). In one Python
    process the two threads share the GIL, and the worker's loop is busy applying batches
    (milliseconds of Python each): every step of the consumer's thread (a fetch answer read, a
    record batch parsed, the next fetch sent, records handed over) waited for the GIL, up to
    the interpreter's 5 ms switch interval each time. At half the worker's throughput an input
    record reached the agent 8-10 ms after it was produced, against 2 ms for a plain aiokafka
    consumer (p50 / p99 produce -> prediction 16.8 / 34.1 ms threaded against 9.9 / 23.7 ms
    here, BENCHMARKS.md). On the worker's loop the consumer's I/O runs between batches, with
    nothing to wait for.

    Everything else is Faust's: the method queue (`call_thread` now hands the call to a task of
    the same loop), the rebalance callbacks, the service's start and shutdown. Three things of
    `ServiceThread` assume a thread of its own and are replaced: the thread (`_LoopTask` runs
    the service's `_serve` as a task), the sweep at its end, which cancels every task left on
    the thread's loop (`_gather_remaining_tasks`): here those are the worker's own, and the
    thread's keepalive (`_keepalive2`), which on this loop logged "Thread keepalive is not
    responding" at ERROR after any step of 2 s (the worker's own lease notices stalls,
    streams/runtime/fencing.py).

    What the thread gave, and what stands in for it: aiokafka's heartbeats run on the worker's
    loop, so a batch that blocks the loop longer than `ORACULAR_SESSION_TIMEOUT_S` costs the
    worker its partitions (batches take milliseconds; a mass of timer closes is spread over
    batches; a worker stalled that long fences itself either way, streams/runtime/fencing.py).
    """

    async def _gather_remaining_tasks(self) -> None:
        """Upstream cancels every task of the thread's loop at its end: the worker's here."""

    async def _keepalive2(self) -> None:
        """Upstream checks that the thread's loop runs and pokes the parent's: one loop here."""


def _new_consumer_thread(self: Any) -> Any:
    """`faust.transport.drivers.aiokafka.Consumer._new_consumer_thread`: the consumer on the
    app's own loop when the app says so (`app.consumer_on_worker_loop`, set by
    `streams.runtime.app.create_app`), else Faust's consumer thread."""
    if not getattr(self.app, "consumer_on_worker_loop", False):
        return ORIGINALS[AIOKafkaConsumer, "_new_consumer_thread"](self)
    return ConsumerOnWorkerLoop(
        self, loop=self.loop, thread_loop=self.loop, Worker=_LoopTask, beacon=self.beacon
    )


# --- applying them -------------------------------------------------------------------------------

PATCHES: Final[tuple[tuple[type, str, Callable[..., Any]], ...]] = (
    (Consumer, "_drain_messages", _drain_messages),
    (Consumer, "_add_gap", _add_gap),
    (Consumer, "_new_offset", _new_offset),
    (Recovery, "on_recovery_completed", _on_recovery_completed),
    (AIOKafkaConsumerThread, "_fetch_records", _fetch_records),
    (
        AIOKafkaConsumerThread,
        "_create_worker_consumer",
        _read_committed(AIOKafkaConsumerThread._create_worker_consumer),
    ),
    (
        Fetcher,
        "_proc_fetch_request",
        _fetch_waiting_by_traffic(Fetcher._proc_fetch_request),
    ),
    (ProducerBuffer, "wait_until_ebb", _ebb_without_settings(ProducerBuffer.wait_until_ebb)),
    (Consumer, "on_buffer_drop", _waking_the_fetch(Consumer.on_buffer_drop)),
    (Consumer, "resume_partitions", _waking_the_fetch(Consumer.resume_partitions)),
    (AIOKafkaConsumer, "_new_consumer_thread", _new_consumer_thread),
)
"""(class, method name, replacement) of every patch."""

ORIGINALS: Final[dict[tuple[type, str], Callable[..., Any]]] = {}
"""(class, method name) -> the upstream method, kept for the tests and for `unpatch`."""


def installed_version() -> str:
    """The installed faust-streaming distribution's version."""
    return importlib.metadata.version("faust-streaming")


def check_version(version: str | None = None, aiokafka: str | None = None) -> None:
    """Raise FaustVersionError unless `version` (default: the installed one) is FAUST_VERSION
    and aiokafka's (default: the installed one) is AIOKAFKA_VERSION."""
    found = installed_version() if version is None else version
    found_aiokafka = importlib.metadata.version("aiokafka") if aiokafka is None else aiokafka
    if found_aiokafka != AIOKAFKA_VERSION:
        msg = (
            f"streams.faust.patches: aiokafka {found_aiokafka} is installed, but the fetch "
            f"patch was written for aiokafka {AIOKAFKA_VERSION}; install "
            f"aiokafka=={AIOKAFKA_VERSION}, or re-check the patched Fetcher method"
        )
        raise FaustVersionError(msg)
    if found != FAUST_VERSION:
        msg = (
            f"streams.faust.patches: faust-streaming {found} is installed, but these patches "
            f"were written for faust-streaming {FAUST_VERSION} (they replace methods of its "
            "consumer, recovery and producer buffer); install "
            f"faust-streaming=={FAUST_VERSION}, or re-check each patched method against the "
            "new source and update FAUST_VERSION"
        )
        raise FaustVersionError(msg)


def apply(version: str | None = None) -> None:
    """Apply every patch once (idempotent); refuses any faust-streaming but FAUST_VERSION."""
    check_version(version)
    for owner, name, replacement in PATCHES:
        if (owner, name) not in ORIGINALS:
            ORIGINALS[owner, name] = owner.__dict__[name]
        setattr(owner, name, replacement)


def unpatch() -> None:
    """Put the upstream methods back (for the tests that show what the patches fix)."""
    for (owner, name), original in ORIGINALS.items():
        setattr(owner, name, original)


def applied() -> bool:
    """True when every patch is in place."""
    return all(owner.__dict__.get(name) is patch for owner, name, patch in PATCHES)


# --- reads of Faust's and aiokafka's state (the worker's only ones) ------------------------------


def _aiokafka_consumer(consumer: Any) -> Any | None:
    thread = getattr(consumer, "_thread", None)
    return getattr(thread, "_consumer", None)


def _assignment(client: Any) -> Any | None:
    """The aiokafka consumer `client`'s current assignment, or None."""
    subscription = client._subscription.subscription
    return None if subscription is None else subscription.assignment


def _partition_state(consumer: Any, tp: TP) -> Any | None:
    client = _aiokafka_consumer(consumer)
    assignment = None if client is None else _assignment(client)
    return None if assignment is None else assignment.state_value(tp)


def fetch_position(consumer: Any, tp: TP) -> int | None:
    """aiokafka's position for `tp`: every record below it has been returned to Faust."""
    state = _partition_state(consumer, tp)
    if state is None or not state.has_valid_position:
        return None
    return int(state.position)


def _fetched_after_seeks(consumer: Any, tp: TP, offset: int) -> bool:
    """False when the consumer's position moved back to `offset` or before (a seek), or `tp`
    is no longer assigned: the record was fetched before that and will be returned again.

    True when the position is unknown because the consumer is not aiokafka's (no check).
    """
    # The client looked up once (this runs twice for every record delivered).
    client = _aiokafka_consumer(consumer)
    if client is None:
        return True
    assignment = _assignment(client)
    state = None if assignment is None else assignment.state_value(tp)
    return state is not None and state.has_valid_position and state.position > offset


def _keep_delivered_positions(consumer: Any) -> None:
    """After a fetched batch was delivered whole: remember each partition's position."""
    client = _aiokafka_consumer(consumer)
    if client is None:
        return
    assignment = _assignment(client)
    kept: dict[TP, _Delivered] = {}
    if assignment is not None:
        read = consumer._read_offset
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if state is not None and state.has_valid_position:
                kept[tp] = _Delivered(int(state.position), read.get(tp))
    consumer._oracular_delivered = kept


async def take_batches(
    stream: Any, max_: int, within: float, pending: Callable[[], bool] = lambda: False
) -> AsyncIterator[list[Any]]:
    """Lists of up to `max_` events from an agent's `stream`, for the agent to ack by hand
    (`ack_all`): what `stream.noack_take(max_, within)` yields, read from the stream's buffer
    a batch at a time. An empty list when the buffer is empty and `pending()` says the agent
    holds events it has not acked yet: before waiting for more, the agent finishes those
    (Faust's rebalance empties the buffer, then waits until every delivered event is acked).

    `noack_take` runs every event through Faust's stream iterator in a task of its own (a
    loop turn, a buffer `get`, three coroutines and a processor per event): taking the
    buffer a batch at a time cut the worker's CPU per event by about 30% (A/B medians of
    4,773 and 6,858 events/s, BENCHMARKS.md). This keeps that iterator's bookkeeping for each
    event, as 0.15.3 has it (`faust/_cython/streams.pyx`, which Faust runs when its extension
    is built, and `Stream._py_aiter`): an event delivered before a rebalance (another
    consumer generation, or flow suspended) is skipped, and every other message is tracked as
    unacked (`Consumer.track_message`) before the agent gets it. A skipped event is not
    acked, as the compiled iterator does (the pure-Python one acks it, which could let a
    commit pass a record the new generation has not applied yet). The window differs: it
    runs from the start of the last batch, so batches start at most once a window but a batch
    that took longer than the window is followed at once (measured from the batch's end, the
    window added its whole length to every batch's cycle at live rates: p50 / p99 31 / 74 ms
    against 24 / 57 at 5,085 events/s, BENCHMARKS.md), and an event arriving after it has
    passed is taken at once rather than at the next tick of the window, so a quiet worker
    answers sooner.
    """
    app = stream.app
    queue = stream.channel.queue  # the agent's buffer, filled by Faust's conductor
    unacked = app.consumer.unacked
    acking_topics = app.topics.acking_topics
    on_message_in = app.sensors.on_message_in
    flow_active = app.flow_control.is_active
    loop = asyncio.get_running_loop()
    window_ends = loop.time()
    while not stream.should_stop:
        if queue.empty() and pending():
            yield []
            await asyncio.sleep(0)  # never a loop that starves the event loop
            continue
        try:
            first = await queue.get()  # raises what the channel was thrown (`queue._errors`)
        except StopAsyncIteration:  # the stream's end (shutdown): as Faust's iterator ends
            return
        wait = window_ends - loop.time()
        if wait > 0 and queue.qsize() + 1 < max_:
            await asyncio.sleep(wait)
        taken = [first]
        try:
            while len(taken) < max_ and not queue.empty():
                taken.append(queue.get_nowait())
        except StopAsyncIteration:  # ended with events taken: they stay unacked (re-read)
            return
        # Neither changes while the loop runs (it never awaits): read once per batch.
        generation, active = app.consumer_generation_id, flow_active()
        events = []
        for event in taken:
            message = event.message
            if not active or message.generation_id != generation:
                continue  # read again from the committed offset by the new generation
            if message.topic in acking_topics and not message.tracked:
                message.tracked = True
                unacked.add(message)
                on_message_in(message.tp, message.offset, message)
            events.append(event)
        # The window runs from the batch's start: one that took longer is followed at once.
        window_ends = loop.time() + within
        if events:
            yield events


def buffered(stream: Any) -> int:
    """Events waiting in an agent's `stream` buffer (delivered, not taken yet)."""
    size: int = stream.channel.queue.qsize()
    return size


def ack_all(app: Any, events: list[Any]) -> None:
    """Ack `events` (taken with `take_batches`) as `Stream.ack` does each, without a coroutine
    per event: their offsets may be committed once every earlier one is acked too."""
    on_message_out = app.sensors.on_message_out
    for event in events:
        if event.ack():
            message = event.message
            on_message_out(message.tp, message.offset, message)


def committed_offset(consumer: Any, tp: TP) -> int | None:
    """The offset the consumer last committed for `tp` (or found committed when assigned)."""
    value = consumer._committed_offset.get(tp)
    return None if value is None else int(value)


def read_offset(consumer: Any, tp: TP) -> int | None:
    """The next offset of `tp` the fetch loop will deliver (one past the last delivered)."""
    value = consumer._read_offset.get(tp)
    return None if value is None else int(value)


def delivered_through(consumer: Any, tp: TP) -> int | None:
    """An offset below which every record of `tp` was delivered to the streams or is not
    data (transaction markers, aborted records); None when not known right now.

    Known once the fetch loop has delivered a whole fetched batch and has not delivered or
    sought `tp` since.
    """
    kept = getattr(consumer, "_oracular_delivered", {}).get(tp)
    if kept is None or kept.read_offset != consumer._read_offset.get(tp):
        return None
    return int(kept.position)


def end_offset(consumer: Any, tp: TP) -> int | None:
    """The offset `tp` is read to when caught up: the last stable offset when reading
    committed records (records past it may still be aborted), else the high-water mark.
    None until the consumer has fetched `tp`.
    """
    client = _aiokafka_consumer(consumer)
    try:
        if client is not None and client._isolation_level == ISOLATION_LEVEL:
            stable = client.last_stable_offset(tp)
            if stable is not None and stable >= 0:
                return int(stable)
        value = consumer.highwater(tp)
    except (AssertionError, KeyError, AttributeError):  # not fetched yet, or not started
        return None
    return None if value is None else int(value)


def open_partitions(table: Any) -> set[int]:
    """The partitions whose local store (RocksDB database) `table` has open on this worker."""
    return set(getattr(table.data, "_dbs", {}))


def store_get(table: Any, partition: int, key: bytes) -> bytes | None:
    """Read `key` from `table`'s local store (RocksDB) of `partition`: one RocksDB read.

    Faust's `table.get(key)` with an event of that partition as the current event reads the
    same database, but twice for a present key (`in`, then the value) and through its sensors,
    its key index (a lock) and a KeyError for a missing key: 9 µs against 1 µs for a present
    key, 5.3 against 0.6 µs for a missing one, per read of a user the cache does not hold."""
    value: bytes | None = table.data._db_for_partition(partition).get(key)
    return value


def store_put_all(table: Any, partition: int, items: list[tuple[bytes, bytes]]) -> None:
    """Write `items` (key, value) to `table`'s local store of `partition` only (no changelog
    record), in one RocksDB write batch: atomic, and one call into RocksDB instead of one per
    key (Faust's `Store._set`, which also keeps a key -> partition index that reads with a
    current event, the worker's only reads, never use)."""
    batch = rocksdict.WriteBatch(raw_mode=True)  # raw bytes, as Faust opens the databases
    for key, value in items:
        batch.put(key, value)
    table.data._db_for_partition(partition).write(batch)


class RawSchema(Schema):
    """Keys and values as the bytes Kafka holds (`bytes` types, Faust's `raw` codec), decoded
    without Faust's serializer registry.

    Faust's compiled decode runs every record's key and value through the registry (a codec
    lookup, the `raw` codec, a type check) and looks the event class up in the app's settings:
    3.5% of the worker's time (py-spy) to hand over the same bytes. For this schema that is
    the identity, so `compile` makes the event at once, as Faust's decode would (aiokafka
    gives bytes or None; the raw codec and `bytes` type return them unchanged). Encoding
    (sending ticks) is Faust's own. A test holds the events to those of Faust's decode.
    """

    def __init__(self) -> None:
        super().__init__(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )

    def compile(self, app: Any, *, default_propagate: bool = False, **_: Any) -> Any:
        event_class = app.conf.Event  # what app.create_event makes, read once

        async def decode(message: Any, *, propagate: bool = default_propagate) -> Any:
            return event_class(app, message.key, message.value, message.headers, message)

        return decode


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

    With aiokafka's default partitioner (murmur2 of the key, in pure Python: about 1.7 µs a
    key, paid for every output record) a key's partition depends only on the key and the
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


def set_persisted_offset(table: Any, tp: TP, offset: int) -> None:
    """Record that `table`'s local store holds its changelog partition `tp` up to `offset`
    (a restart with the datadir kept reads the changelog from there)."""
    table.data.set_persisted_offset(tp, offset)


def wrap_changelog_apply(
    table: Any, wrap: Callable[[Callable[[Any], None]], Callable[[Any], None]]
) -> None:
    """Replace how `table` applies a batch of changelog records (restores and standbys) by
    `wrap(the current way)`."""
    table.apply_changelog_batch = wrap(table.apply_changelog_batch)


MEMBER: Final = "member"
LOST: Final = "lost"
REBALANCING: Final = "rebalancing"
UNKNOWN: Final = "unknown"


_HEARTBEAT_ANSWERS: Final = {
    kafka_errors.NoError: MEMBER,
    kafka_errors.IllegalGenerationError: LOST,
    kafka_errors.UnknownMemberIdError: LOST,
    kafka_errors.RebalanceInProgressError: REBALANCING,
}


async def membership(consumer: Any) -> str:
    """Ask the group coordinator, now, whether this consumer is a member of the current
    generation: one heartbeat with the consumer's generation and member id.

    `MEMBER`: the broker accepted it and the group is stable, so nobody else owns this
    consumer's partitions. `LOST`: the broker no longer knows this member or generation (it
    was evicted; aiokafka rejoins). `REBALANCING`: a rebalance is under way (aiokafka rejoins).
    `UNKNOWN`: no answer (coordinator moving, broker down, no aiokafka consumer). The
    heartbeat runs where aiokafka's coordinator lives: the consumer's thread, or the worker's
    loop (`ConsumerOnWorkerLoop`), through Faust's `call_thread` either way.
    """
    thread = getattr(consumer, "_thread", None)
    client = _aiokafka_consumer(consumer)
    coordinator = getattr(client, "_coordinator", None)
    if thread is None or coordinator is None:
        return UNKNOWN

    async def heartbeat() -> str:
        if coordinator.generation < 0 or coordinator.member_id == "":
            return LOST  # aiokafka already learned it was evicted and reset its generation
        if coordinator.coordinator_id is None:
            return UNKNOWN
        request = HeartbeatRequest(
            coordinator.group_id, coordinator.generation, coordinator.member_id
        )
        try:
            response = await coordinator._send_req(request)
        except kafka_errors.KafkaError:
            return UNKNOWN
        answer = _HEARTBEAT_ANSWERS.get(kafka_errors.for_code(response.error_code), UNKNOWN)
        if answer in (LOST, REBALANCING):
            coordinator.request_rejoin()  # as aiokafka's own heartbeat does on these answers
        return answer

    return cast(str, await thread.call_thread(heartbeat))


def abandon(consumer: Any, events: Any) -> None:
    """Forget `events` as in flight without acknowledging them.

    For a batch the worker must not apply (it lost its partitions while frozen): Faust's
    rebalance waits until every delivered message is acknowledged (`wait_empty`), and an
    acknowledgement could let a commit pass input nobody applied. Taken off the unacked set
    instead, the messages hold up nothing and commit nothing; the partitions' owners re-read
    them from the committed offsets.
    """
    unacked = consumer._unacked_messages
    for event in events:
        unacked.discard(event.message)


apply()
