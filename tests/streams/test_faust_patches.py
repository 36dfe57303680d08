"""The faust-streaming 0.15.3 patches (streams/faust/registry.py lists them), without a broker.

Faust's real consumer runs its real fetch loop (`_drain_messages`) and its real recovery step
(`Recovery.on_recovery_completed`) against a scripted partition: a fake aiokafka consumer with a
log, a position and seeks, a delivery callback standing in for the stream buffers, and flow
control that clears them as Faust's does. Each scenario waits on conditions, never on sleeps.

The `upstream` tests run the same scenarios with the patches removed and assert that Faust
0.15.3 still misbehaves: if one fails, Faust's code under the patch changed, and the patch must
be re-read against it. Set ORACULAR_FAUST_UNPATCHED=1 to run the patched tests against upstream
(they then fail, which is how the regression test was shown to catch the drop).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import faust
import pytest
from aiokafka.consumer.fetcher import Fetcher, FetchResult
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.structs import ConsumerRecord, TopicPartition
from faust import streams as faust_streams
from faust.tables.recovery import Recovery
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP
from faust.types.tuples import ConsumerMessage
from mode.threads import QueueServiceThread, ServiceThread

from streams.faust import delivery as faust_delivery
from streams.faust import fetch as faust_fetch
from streams.faust import patches as faust_patches
from streams.faust import upstream as faust_upstream
from streams.faust import worker_loop as faust_worker_loop
from streams.faust.config import ConsumerSettings, configure
from streams.faust.patches import FAUST_VERSION, FaustVersionError

INPUT = TP("events", 0)
CHANGELOG = TP("app-state-changelog", 0)
COMMITTED = 2
LOG_END = 12  # records at offsets 0..11
MAX_RECORDS = 4  # per fetch, as broker_max_poll_records would cap it
QUEUE_SIZE = 2  # a stream buffer that fills up (stream_buffer_maxsize)
SCENARIO_TIMEOUT_S = 30.0  # each scenario takes milliseconds; this only bounds a hang
UNPATCHED = os.environ.get("ORACULAR_FAUST_UNPATCHED") == "1"

SOURCE_SHA256 = {patch.method: patch.source_sha256 for patch in faust_patches.PATCHES}
"""(class, method) -> sha256 of the upstream source each patch replaces, as the registry
(streams/faust/registry.py) pins it. A new value means Faust changed that method: re-read it
against the patch before updating the registry's hash."""

SERVICE_THREAD_SHA256 = {
    # What `ConsumerOnWorkerLoop` runs of mode-streaming's ServiceThread (its start, serve and
    # stop, with the thread replaced) and what it leaves out (the thread, the sweep of the
    # thread's loop): a new value means mode changed them, re-read them against the class.
    "ServiceThread.__init__": "82979878990cdff5826c9d27ce132ef9d728ce0e41faae70375da8717578cb2e",
    "ServiceThread.start": "f11841038a033a05f2523901082d51dec9b4ef42b226ab2dd4b6223078a10680",
    "ServiceThread._serve": "67809eae09573ac7b43d0679e70a5394acc739bee5809d30b89e9ea8a7ac4b38",
    "ServiceThread.stop": "32d026539c3665b2ceaa8dcdc0c3f49195ceb5b6059947e7104a4b258d1d4efd",
    "ServiceThread._start_thread": (
        "a06373478446fb6192a52e3884096299d569633973bf57e528108c449478f173"
    ),
    "ServiceThread._keepalive2": (
        "3bc84ca2133f05b0c95db0646a7a5904b1286fb3a7feb521e1c96213ccc2c447"
    ),
    "ServiceThread._gather_remaining_tasks": (
        "6f65b92dd101248509e375f2087a1f46997098217fbabdd8b558efbb34b72915"
    ),
    "QueueServiceThread.call_thread": (
        "479edda75b54734b48dabbb33071259949ded0a6f9fa6f82e81afdc42aff6e55"
    ),
    "AIOKafkaConsumerThread.on_start": (
        "38b4e8bd1e10723aed02bb1e8c74ccb02a0b04dec35b9001c51f45fa7f2b611c"
    ),
}

CONDUCTOR_HANDLER_SHA256 = "9fbc0538097aa4eca6113b99df8d17605ae72a6b5030482f041a183f4cc34df1"
"""`Conductor._compile_message_handler` of 0.15.3, whose lookup `faust_delivery._handler`
repeats without the lock when no one holds it."""


@pytest.fixture
def patched() -> Iterator[None]:
    """The patches as the worker runs them (or upstream, with ORACULAR_FAUST_UNPATCHED=1)."""
    if UNPATCHED:
        faust_patches.unpatch()
    try:
        yield
    finally:
        faust_patches.apply()


@pytest.fixture
def upstream() -> Iterator[None]:
    """Faust 0.15.3 as released: the patches removed for the test, then put back."""
    faust_patches.unpatch()
    try:
        yield
    finally:
        faust_patches.apply()


# --- a scripted partition -----------------------------------------------------------------


class _PartitionState:
    """What aiokafka keeps per assigned partition: the position (next offset to return)."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.has_valid_position = True


class FakeKafka:
    """aiokafka's consumer as Faust's fetch loop sees it: one input partition with a log.

    A fetch returns up to MAX_RECORDS records from the position and moves it past them; a
    seek moves it. `states` is read by the patches the way they read aiokafka's.
    """

    def __init__(self, position: int) -> None:
        self.states = {INPUT: _PartitionState(position)}
        self._isolation_level = faust_patches.ISOLATION_LEVEL
        self._subscription = SimpleNamespace(
            subscription=SimpleNamespace(
                assignment=SimpleNamespace(tps=set(self.states), state_value=self.states.get)
            )
        )
        self.idle = asyncio.Event()
        """Set when a fetch found nothing to return (the input paused or read to its end)."""

    def fetch(self, active: set[TP]) -> dict[TP, list[ConsumerRecord]]:
        state = self.states[INPUT]
        if INPUT not in active or state.position >= LOG_END:
            self.idle.set()
            return {}
        self.idle.clear()
        offsets = range(state.position, min(state.position + MAX_RECORDS, LOG_END))
        state.position = offsets[-1] + 1
        return {INPUT: [_record(o) for o in offsets]}

    def seek(self, offset: int) -> None:
        self.states[INPUT].position = offset

    def assignment(self) -> set[TP]:
        return {INPUT, CHANGELOG}

    def highwater(self, tp: TP) -> int:
        return LOG_END

    def last_stable_offset(self, tp: TP) -> int:
        return LOG_END


def _record(offset: int) -> ConsumerRecord:
    return ConsumerRecord(INPUT.topic, INPUT.partition, offset, 0, 0, b"u1", b"v", None, 2, 1, ())


@dataclass
class StreamBuffer:
    """The stream buffers: deliveries block while full; flow control clears them."""

    items: list[int] = field(default_factory=list)
    blocked: asyncio.Event = field(default_factory=asyncio.Event)
    space: asyncio.Event = field(default_factory=asyncio.Event)

    async def deliver(self, message: Any) -> None:
        while len(self.items) >= QUEUE_SIZE:
            self.space.clear()
            self.blocked.set()
            await self.space.wait()
        self.items.append(message.offset)

    def clear(self) -> None:
        self.items.clear()
        self.space.set()

    def take(self) -> list[int]:
        taken, self.items[:] = list(self.items), []
        self.space.set()
        return taken


@dataclass
class Worker:
    """Faust's real consumer wired to a FakeKafka and a StreamBuffer."""

    consumer: Any
    kafka: FakeKafka
    buffer: StreamBuffer
    app: Any


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Workers made by a test; their consumer threads' unused event loops closed after it."""
    made: list[Worker] = []
    yield made
    for worker in made:
        worker.consumer._thread.thread_loop.close()


def make_worker(workers: list[Worker], position: int = COMMITTED) -> Worker:
    """A consumer right after a rebalance: the input assigned but paused, nothing read yet."""
    app = faust.App(
        "patch-tests", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False
    )
    consumer = app.consumer
    kafka = FakeKafka(position)
    buffer = StreamBuffer()
    consumer._thread._consumer = kafka
    consumer.callback = buffer.deliver
    consumer._active_partitions = {CHANGELOG}  # recovery reads the changelog; input paused

    async def getmany(active_partitions: set[TP], timeout: float) -> dict[TP, list[Any]]:
        records = kafka.fetch(active_partitions)
        if not records:
            await asyncio.sleep(0.01)  # as a real fetch waits; the scenarios wait on events
        return records

    async def seek_to_committed() -> dict[TP, int]:
        # aiokafka's seek runs in the consumer's thread while the fetch loop goes on: it
        # happens here once the loop is stuck delivering or has nothing to fetch.
        kafka.idle.clear()
        blocked = asyncio.ensure_future(buffer.blocked.wait())
        idle = asyncio.ensure_future(kafka.idle.wait())
        await asyncio.wait({blocked, idle}, return_when=asyncio.FIRST_COMPLETED)
        blocked.cancel()
        idle.cancel()
        kafka.seek(COMMITTED)
        return {INPUT: COMMITTED}

    consumer._getmany = getmany
    consumer.seek_to_committed = seek_to_committed
    worker = Worker(consumer, kafka, buffer, app)
    workers.append(worker)
    return worker


def fake_recovery(worker: Worker) -> Any:
    """What `Recovery.on_recovery_completed` uses of a Recovery (no tables, no standbys)."""
    consumer = worker.consumer

    async def wait(coro: Any, timeout: float | None = None) -> None:
        await coro

    async def nothing(*_: Any, **__: Any) -> None:
        return None

    app = SimpleNamespace(
        consumer=consumer,
        consumer_generation_id=0,
        conf=SimpleNamespace(broker_request_timeout=90.0),
        on_rebalance_complete=SimpleNamespace(send=nothing),
        flow_control=SimpleNamespace(resume=worker.buffer.clear),  # Faust's clears buffers
        _fetcher=SimpleNamespace(maybe_start=nothing),
        assignor=SimpleNamespace(assigned_standbys=set),
        on_rebalance_end=lambda: None,
    )
    return SimpleNamespace(
        app=app,
        log=SimpleNamespace(info=lambda *a: None, dev=lambda *a: None, warning=lambda *a: None),
        tables=SimpleNamespace(
            values=lambda: [], on_actives_ready=lambda: None, on_standbys_ready=lambda: None
        ),
        actives_for_table={},
        standbys_for_table={},
        completed=asyncio.Event(),
        _set_recovery_ended=lambda: None,
        _wait=wait,
        _is_changelog_tp=lambda tp: tp == CHANGELOG,
    )


async def _wait_until(condition: Any, what: str) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(poll(), SCENARIO_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"{what} did not happen within {SCENARIO_TIMEOUT_S} s")


async def recover_then_process(worker: Worker) -> list[int]:
    """Faust's recovery step with the fetch loop running, then the agent draining the buffer.

    Returns the input offsets the agent got, in order.
    """
    consumer, kafka, buffer = worker.consumer, worker.kafka, worker.buffer
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    loop = asyncio.ensure_future(consumer._drain_messages(fetcher))
    try:
        await _wait_until(kafka.idle.is_set, "a first fetch")
        await Recovery.on_recovery_completed(fake_recovery(worker), 0)
        processed: list[int] = []

        def read_to_end() -> bool:
            processed.extend(buffer.take())
            return kafka.states[INPUT].position >= LOG_END and kafka.idle.is_set()

        await _wait_until(read_to_end, "reading the input to its end")
        processed.extend(buffer.take())
        return processed
    finally:
        fetcher._stopped.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


# --- the drop, end to end --------------------------------------------------------------------


async def test_recovery_delivers_every_input_record_from_the_committed_offset(patched, workers):
    """After recovery the agent gets every record from the committed offset on, in order."""
    worker = make_worker(workers)
    processed = await recover_then_process(worker)
    assert processed == list(range(COMMITTED, LOG_END))


async def test_upstream_recovery_drops_input_it_delivered_before_seeking(upstream, workers):
    """Faust 0.15.3: records delivered before the seek are cleared, and their re-read dropped.

    Recovery resumes the input, the fetch loop delivers records 2, 3 and is stuck on 4 (the
    buffer is full) while the seek to the committed offset 2 runs; resuming flow control then
    clears the buffer, the loop records 4 as read, and the re-read of 2 and 3 is dropped.
    """
    worker = make_worker(workers)
    processed = await recover_then_process(worker)
    assert set(range(COMMITTED, LOG_END)) - set(processed) == {2, 3}, processed


async def test_a_record_fetched_before_a_seek_back_is_read_again_not_past(patched, workers):
    """The fetch loop delivering a batch when the consumer is sought back to the committed
    offset: the rest of the batch is not delivered, and the re-read is, from that offset."""
    worker = make_worker(workers)
    consumer, kafka, buffer = worker.consumer, worker.kafka, worker.buffer
    consumer.resume_partitions({INPUT})
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    loop = asyncio.ensure_future(consumer._drain_messages(fetcher))
    try:
        await _wait_until(buffer.blocked.is_set, "the buffer filling up")  # 2, 3 in; 4 waits
        await consumer.perform_seek()  # back to 2: what was fetched is fetched again
        processed: list[int] = []

        def read_to_end() -> bool:
            processed.extend(buffer.take())
            return kafka.states[INPUT].position >= LOG_END and kafka.idle.is_set()

        await _wait_until(read_to_end, "reading the input to its end")
        processed.extend(buffer.take())
    finally:
        fetcher._stopped.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    # 4 was in delivery during the seek (it reached the buffer); everything from 2 follows.
    assert processed[:2] == [2, 3]
    assert processed[-(LOG_END - COMMITTED) :] == list(range(COMMITTED, LOG_END)), processed


# --- recovery that read the changelog: the fetch loop's partition set emptied under aiokafka ---
#
# Here the fetch loop runs through the real fetch path down to aiokafka: Faust's `getmany`, its
# consumer thread's `_fetch_records` and aiokafka's `Fetcher.fetched_records` over aiokafka's
# own partition states and fetch results. Only the background fetch routine (which would fetch
# from a broker) and the consumer thread (the calls run on the test's loop) are scripted.


class _FetchedRecords:
    """One fetch response for INPUT, iterated the way aiokafka's FetchResult reads one."""

    def __init__(self, offsets: range) -> None:
        self._records = iter([_record(o) for o in offsets])
        self.next_fetch_offset = offsets[0]

    def __iter__(self) -> _FetchedRecords:
        return self

    def __next__(self) -> ConsumerRecord:
        record = next(self._records)
        self.next_fetch_offset = record.offset + 1
        return record


class ScriptedFetcher:
    """aiokafka's Fetcher (its real `fetched_records` and `seek_to`) over a real
    SubscriptionState; the test plays its background fetch routine with `fetch` and `wake`."""

    def __init__(self) -> None:
        self.subscriptions = SubscriptionState(loop=asyncio.get_running_loop())
        self.subscriptions.assign_from_user({INPUT, CHANGELOG})
        self.subscriptions.seek(INPUT, COMMITTED)
        self.subscriptions.seek(CHANGELOG, 0)
        fetcher = Fetcher.__new__(Fetcher)  # without its broker client and fetch routine
        fetcher._subscriptions = self.subscriptions
        fetcher._records = {}
        fetcher._fetch_waiters = set()
        fetcher._loop = asyncio.get_running_loop()
        fetcher._closed = False
        fetcher._wait_consume_future = None
        self.fetcher = fetcher
        self.notified: set[asyncio.Future[Any]] = set()

    def position(self, tp: TP = INPUT) -> int:
        return int(self.subscriptions.subscription.assignment.state_value(tp).position)

    def waiting(self) -> bool:
        """A `fetched_records` call is waiting for a fetch response (not one already woken)."""
        return bool(self.fetcher._fetch_waiters - self.notified)

    def fetch(self) -> None:
        """A fetch response for INPUT from its position to the end of its log arrives."""
        assignment = self.subscriptions.subscription.assignment
        self.fetcher._records[INPUT] = FetchResult(
            INPUT,
            assignment=assignment,
            partition_records=_FetchedRecords(range(self.position(), LOG_END)),
            backoff=0,
        )
        self.wake()

    def wake(self) -> None:
        """Wake the waiting `fetched_records` calls, as any fetch response does."""
        for waiter in list(self.fetcher._fetch_waiters):
            self.notified.add(waiter)
            self.fetcher._notify(waiter)


def make_fetching_worker(workers: list[Worker]) -> tuple[Worker, ScriptedFetcher]:
    """A consumer after a rebalance whose recovery reads the changelog: the changelog
    partition active, the input paused, aiokafka's position on the input at its committed
    offset, the fetch loop waiting on the changelog."""
    app = faust.App(
        "patch-tests", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False
    )
    consumer = app.consumer
    scripted = ScriptedFetcher()
    buffer = StreamBuffer()

    async def seek_to_committed() -> dict[TP, int]:
        # aiokafka seeks in the consumer's thread; its fetch routine then fetches the input
        # from the committed offset, while the fetch loop's `fetched_records` call (started
        # when the changelog was active) waits. The seek returns once that call has seen the
        # fetch response: it then drained it or went back to waiting.
        scripted.fetcher.seek_to(INPUT, COMMITTED)
        returned = getmany_returned[0]
        scripted.fetch()
        await _wait_until(
            lambda: getmany_returned[0] > returned or scripted.waiting(),
            "the waiting fetch seeing the records",
        )
        return {INPUT: COMMITTED}

    client = SimpleNamespace(
        _fetcher=scripted.fetcher,
        _closed=False,
        _subscription=scripted.subscriptions,
        _max_poll_records=None,  # as the worker's: the whole fetch response at once
        _isolation_level=faust_patches.ISOLATION_LEVEL,
        assignment=lambda: {INPUT, CHANGELOG},
        highwater=lambda tp: LOG_END,
        last_stable_offset=lambda tp: LOG_END,
        seek_to_committed=seek_to_committed,
    )
    thread = consumer._thread
    thread._consumer = client

    async def call_thread(fun: Any, *args: Any, **kwargs: Any) -> Any:
        return await fun(*args, **kwargs)  # on this loop, not the consumer's thread

    thread.call_thread = call_thread
    getmany_returned = [0]
    thread_getmany = consumer._getmany

    async def getmany(active_partitions: set[TP], timeout: float) -> Any:
        # A fetch waits until a fetch response arrives (`wake`), not a second, so the
        # scenario does not depend on how fast the test runs.
        try:
            return await thread_getmany(active_partitions, SCENARIO_TIMEOUT_S)
        finally:
            getmany_returned[0] += 1  # Faust's getmany has filtered what this returned

    consumer._getmany = getmany
    consumer.callback = buffer.deliver
    consumer._active_partitions = {CHANGELOG}  # recovery resumed the changelog only
    consumer._paused_partitions = {INPUT}
    worker = Worker(consumer, cast(Any, scripted), buffer, app)
    workers.append(worker)
    return worker, scripted


async def recover_after_reading_the_changelog(
    worker: Worker, scripted: ScriptedFetcher, *, then: Any
) -> Any:
    """Recovery from the end of the changelog read with the fetch loop running; returns what
    `then(processed)` returns, `processed` being the input offsets the agent got."""
    consumer = worker.consumer
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    loop = asyncio.ensure_future(consumer._drain_messages(fetcher))
    try:
        await _wait_until(scripted.waiting, "the fetch loop waiting on the changelog")
        consumer.pause_partitions({CHANGELOG})  # "Done reading from changelog topics"
        await Recovery.on_recovery_completed(fake_recovery(worker), 0)
        scripted.wake()  # another partition's fetch response
        return await then(worker.buffer)
    finally:
        fetcher._stopped.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_input_fetched_while_no_partition_is_active_is_delivered_after_resume(
    patched, workers
):
    """The durability test's stall: every input record from the committed offset is
    delivered, though aiokafka fetched them while Faust had no active partition.

    Between "Done reading from changelog topics" (the changelog paused) and resuming the
    input, Faust's set of active partitions is empty. A `fetched_records` call the fetch loop
    made while the changelog was active was given that set itself, and aiokafka reads an
    empty set as "every partition": it returned the input records fetched after the seek to
    the committed offset and moved its position past them; Faust's `getmany` then dropped
    them (the input was not active), and nothing ever read them again.
    """
    worker, scripted = make_fetching_worker(workers)

    async def take_all(buffer: StreamBuffer) -> list[int]:
        processed: list[int] = []

        def all_delivered() -> bool:
            processed.extend(buffer.take())
            return len(processed) >= LOG_END - COMMITTED

        await _wait_until(all_delivered, "delivering the input from the committed offset")
        return processed

    processed = await recover_after_reading_the_changelog(worker, scripted, then=take_all)
    assert processed == list(range(COMMITTED, LOG_END))
    assert scripted.position() == LOG_END


async def test_upstream_drains_the_input_while_no_partition_is_active(upstream, workers):
    """Faust 0.15.3 + aiokafka 0.14.0: the input records fetched after the seek are returned
    to the paused consumer, dropped, and aiokafka's position is past them: a stall."""
    worker, scripted = make_fetching_worker(workers)

    async def state(buffer: StreamBuffer) -> tuple[list[int], int, bool]:
        return list(buffer.items), scripted.position(), INPUT in scripted.fetcher._records

    delivered, position, buffered = await recover_after_reading_the_changelog(
        worker, scripted, then=state
    )
    assert (delivered, position, buffered) == ([], LOG_END, False)


async def _read_after_the_buffer_filled(workers: list[Worker], timeout: float) -> Any:
    """The fetch loop's `fetched_records` call (through `_fetch_records`, as Faust's `getmany`
    makes it) while the agent's buffer is full and aiokafka holds fetched input records; the
    agent then drains its buffer (`on_buffer_drop`). Returns the call's task."""
    worker, scripted = make_fetching_worker(workers)
    consumer = worker.consumer
    consumer._paused_partitions = set()
    consumer._active_partitions = {INPUT, CHANGELOG}
    consumer.resume_flow()
    consumer.on_buffer_full(INPUT)  # nearly full: Faust takes no more of INPUT for now
    scripted.fetch()  # records of INPUT arrive meanwhile and wait in aiokafka's buffer
    thread = consumer._thread
    active = consumer._get_active_partitions()
    reading = asyncio.ensure_future(
        faust_fetch._fetch_records(thread, thread._consumer, active, timeout=timeout)
    )
    await _wait_until(scripted.waiting, "the fetch loop waiting for records")
    consumer.on_buffer_drop(INPUT)  # the agent drained its buffer: INPUT is active again
    return reading


async def test_a_partition_taken_back_after_its_buffer_filled_is_read_at_once(patched, workers):
    """Faust stops taking a partition while the agent's buffer is nearly full. Records of it
    aiokafka fetched meanwhile wait in aiokafka's buffer (and aiokafka fetches no more of it),
    and the fetch loop's call waits for the next fetch response with records. Taking the
    partition back wakes that call, which then returns the records: here well before its own
    timeout, which nothing else ends."""
    reading = await _read_after_the_buffer_filled(workers, timeout=SCENARIO_TIMEOUT_S)
    records = await asyncio.wait_for(reading, SCENARIO_TIMEOUT_S / 2)
    assert [record.offset for record in records[INPUT]] == list(range(COMMITTED, LOG_END))


async def test_upstream_reads_a_partition_taken_back_only_when_other_records_arrive(
    upstream, workers
):
    """Faust 0.15.3 + aiokafka 0.14.0: the call waits its whole timeout (Faust's 1 s) and
    returns nothing; the records come with the next call. In the worker only another
    partition's records (a tick, one a second per partition) ended such a wait: under a
    backlog, input stopped for 0.1-1 s each time the buffer had filled."""
    reading = await _read_after_the_buffer_filled(workers, timeout=0.5)
    assert await asyncio.wait_for(reading, SCENARIO_TIMEOUT_S) == {}


# --- commits: gaps and the head of the acked offsets (#606) ------------------------------------


def _consumer_at(workers: list[Worker], committed: int) -> Any:
    consumer = make_worker(workers).consumer
    consumer._committed_offset[INPUT] = committed
    return consumer


def _ack(consumer: Any, *offsets: int) -> None:
    consumer._acked[INPUT].extend(offsets)
    consumer._acked_index[INPUT].update(offsets)


def test_no_commit_past_an_unacked_record_at_the_committed_offset(patched, workers):
    """Record 10 (the committed offset) still in flight, 11 and 12 acked: nothing to commit."""
    consumer = _consumer_at(workers, 10)
    _ack(consumer, 11, 12)
    assert consumer._new_offset(INPUT) is None
    _ack(consumer, 10)
    assert consumer._new_offset(INPUT) == 13


def test_upstream_commits_past_an_unacked_record_at_the_committed_offset(upstream, workers):
    """Faust 0.15.3 (#606): with 10 unacked and 11, 12 acked it commits 13."""
    consumer = _consumer_at(workers, 10)
    _ack(consumer, 11, 12)
    assert consumer._new_offset(INPUT) == 13


async def test_a_gap_at_the_committed_offset_is_acked(patched, workers):
    """A transaction marker at the committed offset (10): the gap mark covers it, so acking
    11 commits 12."""
    consumer = _consumer_at(workers, 10)
    await consumer._add_gap(INPUT, 10, 10)
    _ack(consumer, 11)
    assert consumer._new_offset(INPUT) == 12


async def test_upstream_leaves_the_committed_offset_out_of_a_gap(upstream, workers):
    """Faust 0.15.3 clamps a gap to one past the committed offset."""
    consumer = _consumer_at(workers, 10)
    await consumer._add_gap(INPUT, 10, 12)
    assert sorted((i.begin, i.end) for i in consumer._gap[INPUT]) == [(11, 13)]


async def test_the_fetch_loop_marks_only_absent_offsets_as_a_gap(patched, workers):
    """After a seek to 10, a first record at 12 (10 and 11 are markers) marks 10..11 as a gap,
    not the delivered record 12; acking 12 then commits 13."""
    worker = make_worker(workers, position=13)  # record 12 was fetched
    consumer = worker.consumer
    consumer._committed_offset[INPUT] = 10
    consumer._read_offset[INPUT] = 10
    consumer.app.topics._acking_topics.add(INPUT.topic)
    assert await faust_delivery._deliver(consumer, INPUT, SimpleNamespace(offset=12))
    assert sorted((i.begin, i.end) for i in consumer._gap[INPUT]) == [(10, 12)]
    assert worker.buffer.items == [12] and consumer._read_offset[INPUT] == 13
    _ack(consumer, 12)
    assert consumer._new_offset(INPUT) == 13


# --- reading committed records ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "level"), [("patched", "read_committed"), ("upstream", "read_uncommitted")]
)
async def test_the_worker_consumer_reads_committed_records_only(request, workers, patch, level):
    """Patched, the worker's aiokafka consumer reads committed records; upstream, not."""
    request.getfixturevalue(patch)
    consumer = make_worker(workers).consumer
    client = consumer._thread._create_worker_consumer(consumer.transport)
    try:
        assert client._isolation_level == level
    finally:
        await client.stop()


@pytest.mark.parametrize(("patch", "wait_ms"), [("patched", 25), ("upstream", 1500)])
async def test_the_worker_consumer_fetch_wait_is_the_apps(request, workers, patch, wait_ms):
    """Patched, a fetch of the worker's consumer waits the app's `fetch_max_wait_ms` (while
    input arrives); upstream, Faust's 1.5 s."""
    request.getfixturevalue(patch)
    consumer = make_worker(workers).consumer
    configure(
        consumer.app, ConsumerSettings(fetch_max_wait_ms=25, quiet_topics=frozenset({"ticks"}))
    )
    client = consumer._thread._create_worker_consumer(consumer.transport)
    try:
        assert client._fetch_max_wait_ms == wait_ms
        quiet = getattr(client._subscription, "oracular_quiet_topics", None)
        assert quiet == (frozenset({"ticks"}) if patch == "patched" else None)
    finally:
        await client.stop()


class _Broker:
    """Stands in for the network under aiokafka's `Fetcher._proc_fetch_request`: records
    the wait each fetch asked for, and answers with records of a topic (buffered as aiokafka
    buffers them) or without (None)."""

    def __init__(self) -> None:
        self.waits: list[int] = []
        self.answers: list[str | None] = []

    async def __call__(self, fetcher: Any, assignment: Any, node_id: int, request: Any) -> bool:
        self.waits.append(request._max_wait_ms)
        fetcher._records.clear()  # the worker took what the last fetch buffered
        topic = self.answers.pop(0)
        if topic is not None:
            fetcher._records[TopicPartition(topic, 0)] = object()
        return topic is not None


def _fetcher() -> Any:
    quiet = SimpleNamespace(oracular_quiet_topics=frozenset({"ticks"}))
    return SimpleNamespace(_records={}, _subscriptions=quiet)


def _fetch_request() -> Any:
    """A fetch of partition 0 of the input and the ticks, as aiokafka builds one."""
    return SimpleNamespace(
        _max_wait_ms=2, topics=[("in", [(0, 0, 1024)]), ("ticks", [(0, 0, 1024)])]
    )


async def test_a_fetch_waits_short_while_records_arrive_and_long_when_idle(monkeypatch):
    """The first fetch (nothing seen yet) waits long; after an answer with records, fetches
    wait the consumer's short wait, even an empty one; a second after the last records, long
    again. Upstream, every fetch waits the consumer's setting (so a short one spins idle and a
    long one delivers input in bursts)."""
    broker = _Broker()
    proc = faust_fetch._fetch_waiting_by_traffic(broker)
    fetcher = _fetcher()
    clock = [100.0]
    monkeypatch.setattr(faust_fetch.time, "monotonic", lambda: clock[0])
    broker.answers = ["in", None, "in", None, None]
    for _ in range(3):
        await proc(fetcher, None, 1, _fetch_request())
    clock[0] += faust_fetch.BUSY_S / 2
    await proc(fetcher, None, 1, _fetch_request())
    clock[0] += faust_fetch.BUSY_S
    await proc(fetcher, None, 1, _fetch_request())
    idle = faust_fetch.IDLE_FETCH_WAIT_MS
    assert broker.waits == [idle, 2, 2, 2, idle]


async def test_ticks_alone_do_not_keep_the_fetches_short(monkeypatch):
    """Records of the quiet topics (a tick a second) leave an idle worker's fetches long: it
    fetches twice a second, not 500 times (before: 15% of a core, idle)."""
    broker = _Broker()
    proc = faust_fetch._fetch_waiting_by_traffic(broker)
    fetcher = _fetcher()
    monkeypatch.setattr(faust_fetch.time, "monotonic", lambda: 100.0)
    broker.answers = ["ticks", "ticks", None, "in", None]
    for _ in range(5):
        await proc(fetcher, None, 1, _fetch_request())
    idle = faust_fetch.IDLE_FETCH_WAIT_MS
    assert broker.waits == [idle, idle, idle, idle, 2]


def test_the_fetch_wait_patch_wraps_aiokafkas_fetcher() -> None:
    """The patch sits on aiokafka's `Fetcher` (the class a started consumer builds)."""
    assert (
        Fetcher._proc_fetch_request.__wrapped__
        is faust_upstream.ORIGINALS[Fetcher, "_proc_fetch_request"]
    )


# --- what the patches are applied to ---------------------------------------------------------


@pytest.mark.parametrize("method", sorted(SOURCE_SHA256))
def test_the_patched_upstream_source_is_the_one_the_patch_was_written_for(method):
    """Each replaced method's upstream source is byte for byte the 0.15.3 one."""
    owner, name = method.split(".")
    [original] = [
        f for (o, n), f in faust_upstream.ORIGINALS.items() if (o.__name__, n) == (owner, name)
    ]
    source = inspect.getsource(getattr(original, "fget", original))  # a property's getter
    assert hashlib.sha256(source.encode()).hexdigest() == SOURCE_SHA256[method], (
        f"faust-streaming's {method} changed: re-read it against streams/faust/registry.py"
    )


@pytest.mark.parametrize("patch", faust_patches.PATCHES, ids=lambda patch: patch.method)
def test_every_registered_patch_names_a_test_of_this_module_and_why(patch):
    """Each registry entry names the test that fails without it (here), and its reason."""
    test = globals().get(patch.test)
    assert callable(test) and patch.test.startswith("test_"), patch.test
    assert patch.reason and patch.upstream


def test_every_patch_is_applied_once_on_import():
    """Importing streams.runtime.app (the worker's runtime) applies them; applying again
    changes nothing."""
    import streams.runtime.app  # noqa: F401 - the import is the point

    assert faust_patches.applied()
    before = dict(faust_upstream.ORIGINALS)
    faust_patches.apply()
    assert faust_patches.applied() and before == faust_upstream.ORIGINALS
    assert len(before) == len(faust_patches.PATCHES) == len(SOURCE_SHA256)


@pytest.mark.parametrize("version", ["0.15.2", "0.15.4", "0.16.0"])
def test_the_patches_refuse_another_faust_version(version):
    """Another faust-streaming version is refused with what to do, and nothing is patched."""
    with pytest.raises(
        FaustVersionError,
        match=rf"faust-streaming {version} is installed.*"
        rf"written for faust-streaming {FAUST_VERSION}.*install ",
    ):
        faust_patches.apply(version)
    assert faust_patches.applied()


def test_the_patches_refuse_another_aiokafka_version():
    """Another aiokafka under Faust is refused too: one patch wraps its fetcher."""
    with pytest.raises(FaustVersionError, match=r"aiokafka 0\.15\.0 is installed.*0\.14\.0"):
        faust_patches.check_version(aiokafka="0.15.0")
    faust_patches.check_version()  # the installed pair


class _Deliveries:
    """Counts what upstream's race would have cost: `wait_first` calls."""

    def __init__(self, consumer: Any) -> None:
        self.races = 0
        race = consumer.wait_first

        async def counted(*coros: Any, **kwargs: Any) -> Any:
            self.races += 1
            return await race(*coros, **kwargs)

        consumer.wait_first = counted


async def test_a_delivery_that_does_not_wait_runs_inline(patched, workers):
    """A delivery into a buffer with room completes without a task or a race."""
    consumer = make_worker(workers).consumer
    deliveries = _Deliveries(consumer)
    done: list[int] = []

    async def deliver() -> None:
        done.append(1)

    assert await faust_delivery._run_delivery(consumer, deliver())
    assert done == [1] and deliveries.races == 0


async def test_a_delivery_that_waits_is_raced_and_completes(patched, workers):
    """A delivery waiting on a future (a full buffer) and a bare yield completes once the
    future is resolved, through one race per wait."""
    consumer = make_worker(workers).consumer
    deliveries = _Deliveries(consumer)
    room = asyncio.get_running_loop().create_future()
    steps: list[str] = []

    async def deliver() -> str:
        await asyncio.sleep(0)
        steps.append("waiting")
        value = await room
        steps.append(value)
        return value

    running = asyncio.ensure_future(faust_delivery._run_delivery(consumer, deliver()))
    await _wait_until(lambda: steps == ["waiting"], "the delivery waiting")
    room.set_result("delivered")
    assert await running
    assert steps == ["waiting", "delivered"] and deliveries.races == 1


async def test_a_waiting_delivery_is_cancelled_when_flow_is_suspended(patched, workers):
    """Flow suspended while a delivery waits: False, and the delivery sees a cancellation
    (its cleanup runs), as upstream's race cancels the delivery's task."""
    consumer = make_worker(workers).consumer
    never = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def deliver() -> None:
        try:
            await never
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    consumer.suspend_flow.clear()
    running = asyncio.ensure_future(faust_delivery._run_delivery(consumer, deliver()))
    await asyncio.sleep(0.01)
    consumer.suspend_flow.set()
    assert await asyncio.wait_for(running, 10) is False
    assert seen == ["cancelled"] and never.cancelled()


async def test_a_delivery_error_propagates(patched, workers):
    """What a delivery raises, before or after waiting, is raised to the fetch loop."""
    consumer = make_worker(workers).consumer

    async def fails_at_once() -> None:
        raise ValueError("bad record")

    async def fails_after_waiting() -> None:
        await asyncio.sleep(0)
        raise KeyError("later")

    with pytest.raises(ValueError, match="bad record"):
        await faust_delivery._run_delivery(consumer, fails_at_once())
    with pytest.raises(KeyError, match="later"):
        await faust_delivery._run_delivery(consumer, fails_after_waiting())


async def test_a_record_goes_straight_to_its_partitions_handler_while_the_lock_is_free():
    """The conductor's handler for the record's partition, unless a resubscription holds the
    conductor's lock or the partition has none: then the consumer's callback, which is the
    conductor's `on_message` (it waits for the lock, or raises for an unknown partition)."""
    app = faust.App(
        "handler-tests", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False
    )
    consumer, conductor = app.consumer, app.topics
    consumer._thread.thread_loop.close()  # the consumer thread's loop, never run here
    assert consumer.callback == conductor.on_message
    handler = object()
    conductor._tp_to_callback[INPUT] = handler
    assert faust_delivery._handler(consumer, INPUT) is handler
    assert faust_delivery._handler(consumer, CHANGELOG) == conductor.on_message
    async with conductor._tp_to_callback_lock:
        assert faust_delivery._handler(consumer, INPUT) == conductor.on_message


async def test_the_producer_buffer_is_flushed_only_over_its_limit(patched):
    """A delivery waits for the producer's buffer only when it holds more than its limit,
    then through upstream's flush (the worker's producer is not threaded)."""
    app = faust.App("ebb-tests", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False)
    app.consumer._thread.thread_loop.close()  # the consumer thread's loop, never run here
    buffer = app.producer.buffer
    flushed: list[int] = []

    async def flush_atmost(n: int) -> int:
        flushed.append(n)
        return 0

    buffer.flush_atmost = flush_atmost
    waiting = buffer.pending
    for n in range(buffer.max_messages):
        waiting.put_nowait(n)
    await buffer.wait_until_ebb()
    assert flushed == []
    waiting.put_nowait("one over")
    await buffer.wait_until_ebb()
    assert flushed == [buffer.max_messages]


def test_the_conductor_lookup_is_the_one_the_handler_patch_was_written_for():
    """`_handler` repeats `Conductor.on_message`'s lookup: a change there must be re-read."""
    from faust.transport.conductor import Conductor

    source = inspect.getsource(Conductor._compile_message_handler)
    assert hashlib.sha256(source.encode()).hexdigest() == CONDUCTOR_HANDLER_SHA256, (
        "faust-streaming's Conductor._compile_message_handler changed: re-read it against "
        "faust_delivery._handler"
    )


def test_store_reads_and_writes_agree_with_fausts_own_on_each_partition(tmp_path):
    """`store_get` and `store_put_all` use the databases Faust's RocksDB store reads and writes
    for an event's partition, in the same (raw) bytes: each sees the other's values, on that
    partition only."""
    app = faust.App(
        "store-test",
        broker="kafka://127.0.0.1:1",  # never started: the store needs no broker
        store="rocksdb://",
        datadir=str(tmp_path),
        key_serializer="raw",
        value_serializer="raw",
    )
    table = app.Table("st", key_type=bytes, value_type=bytes, partitions=4)
    store = table.data

    class Event:  # what Faust takes the partition of a table access from
        def __init__(self, partition: int) -> None:
            self.message = SimpleNamespace(partition=partition, topic="in")

    @contextlib.contextmanager
    def event_of(partition: int) -> Iterator[None]:
        event = Event(partition)
        token = faust_streams._current_event.set(weakref.ref(event))
        try:
            yield
        finally:
            faust_streams._current_event.reset(token)

    try:
        with event_of(2):
            store[b"u1"] = b"\x81\xa1a\x01"  # Faust's own write, on partition 2
        assert faust_patches.store_get(table, 2, b"u1") == b"\x81\xa1a\x01"
        assert faust_patches.store_get(table, 1, b"u1") is None
        assert faust_patches.store_get(table, 2, b"nobody") is None

        faust_patches.store_put_all(table, 3, [(b"u2", b"\x00v")])
        with event_of(3):
            assert store.get(b"u2") == b"\x00v"  # Faust's own read, on partition 3
        with event_of(0):
            assert store.get(b"u2") is None
    finally:
        for db in store._dbs.values():
            db.close()


# --- the consumer on the worker's loop ---------------------------------------------------------


@pytest.mark.parametrize("method", sorted(SERVICE_THREAD_SHA256))
def test_the_service_thread_is_the_one_the_loop_consumer_was_written_for(method):
    owner_name, name = method.split(".")
    owner = {
        "ServiceThread": ServiceThread,
        "QueueServiceThread": QueueServiceThread,
        "AIOKafkaConsumerThread": AIOKafkaConsumerThread,
    }[owner_name]
    source = inspect.getsource(owner.__dict__[name])
    assert hashlib.sha256(source.encode()).hexdigest() == SERVICE_THREAD_SHA256[method], (
        f"mode's or faust's {method} changed: re-read it against ConsumerOnWorkerLoop"
    )


def _kafka_app(consumer_on_worker_loop: bool | None = None) -> faust.App:
    """A Faust app of the aiokafka driver (nothing connects until its consumer starts)."""
    app = faust.App("loop-consumer", broker="kafka://127.0.0.1:1", store="memory://")
    if consumer_on_worker_loop is not None:
        configure(app, ConsumerSettings(on_worker_loop=consumer_on_worker_loop))
    return app


async def test_the_consumer_runs_on_the_apps_loop_without_a_thread(patched, monkeypatch):
    """Started, the consumer's service runs on the app's loop (the test's), in no thread of
    its own; Faust's calls into it (`call_thread`) run there too; stopped, it shuts down
    without touching the loop's other tasks (upstream's end of a thread cancels them all)."""
    loop = asyncio.get_running_loop()
    thread = _kafka_app(consumer_on_worker_loop=True).consumer._thread
    assert isinstance(thread, faust_worker_loop.ConsumerOnWorkerLoop)
    assert thread.thread_loop is loop
    where: list[tuple[int, Any]] = []
    stops: list[str] = []

    async def on_start(self: Any) -> None:  # instead of starting an aiokafka consumer
        where.append((threading.get_ident(), asyncio.get_running_loop()))

    async def on_thread_stop(self: Any) -> None:
        await QueueServiceThread.on_thread_stop(self)  # stops its method queue
        stops.append("stopped")

    monkeypatch.setattr(faust_worker_loop.ConsumerOnWorkerLoop, "on_start", on_start)
    monkeypatch.setattr(faust_worker_loop.ConsumerOnWorkerLoop, "on_thread_stop", on_thread_stop)
    bystander = asyncio.ensure_future(asyncio.sleep(SCENARIO_TIMEOUT_S))
    threads = threading.active_count()
    try:
        await asyncio.wait_for(thread.start(), SCENARIO_TIMEOUT_S)
        here = (threading.get_ident(), loop)
        assert where == [here]
        assert threading.active_count() == threads
        # No thread keepalive: upstream's checks the loop every 1.1 s until the service stops
        # (logging an error after any 2 s step of the worker's loop).
        await asyncio.wait_for(thread._keepalive2(), 1.0)

        async def call() -> tuple[int, Any]:
            return threading.get_ident(), asyncio.get_running_loop()

        assert await asyncio.wait_for(thread.call_thread(call), SCENARIO_TIMEOUT_S) == here
        await asyncio.wait_for(thread.stop(), SCENARIO_TIMEOUT_S)
        assert stops == ["stopped"]
        await _wait_until(lambda: not thread._thread.is_alive(), "the consumer's task to end")
        assert not bystander.done()
    finally:
        bystander.cancel()


async def test_other_apps_keep_fausts_consumer_thread(patched):
    """Without the worker's say-so (`ConsumerSettings.on_worker_loop`), Faust's thread as
    released."""
    for app in (_kafka_app(), _kafka_app(consumer_on_worker_loop=False)):
        thread = app.consumer._thread
        try:
            assert type(thread) is AIOKafkaConsumerThread
            assert thread.thread_loop is not asyncio.get_running_loop()
        finally:
            thread.thread_loop.close()  # the thread's loop, made by mode, never run here


@pytest.mark.parametrize(
    ("setting", "on_loop"), [(None, True), ("worker", True), ("thread", False)]
)
def test_the_worker_runs_its_consumer_where_the_setting_says(tmp_path, setting, on_loop):
    from schemas.config import load_config
    from streams.settings import settings_from_env
    from streams.worker import create_worker

    env = {"ORACULAR_DATADIR": str(tmp_path / "state")}
    if setting is not None:
        env["ORACULAR_CONSUMER_LOOP"] = setting
    app = create_worker(settings_from_env(env), load_config("examples/oracular.yaml"))
    thread = app.consumer._thread
    try:
        assert isinstance(thread, faust_worker_loop.ConsumerOnWorkerLoop) is on_loop
        assert isinstance(thread, AIOKafkaConsumerThread)
    finally:
        if not on_loop:
            thread.thread_loop.close()  # the thread's loop, made by mode, never run here


# --- the changelog queue: a restore never drops a record it fetched --------------------------


def _changelog_queue_after_flow_control(app: Any) -> list[str]:
    """Put two records in `app`'s changelog queue, revoke and resume flow as a rebalance does
    (`flow_control.clear`, then `flow_control.resume`), and return what is left to apply."""
    queue = app.tables.changelog_queue
    queue.put_nowait("record 10")
    app.flow_control.clear()  # `App._on_partitions_revoked`
    queue.put_nowait("record 11")
    app.flow_control.resume()  # the restore, right after its seek
    return [queue.get_nowait() for _ in range(queue.qsize())]


def test_upstream_clears_the_changelog_records_fetched_but_not_yet_applied(upstream):
    """faust-streaming 0.15.3: both clear the queue, though the consumer has read past them."""
    app = faust.App("upstream-changelog-queue", broker="kafka://127.0.0.1:1", store="memory://")
    assert _changelog_queue_after_flow_control(app) == []


def test_the_worker_applies_every_changelog_record_it_fetched(patched, tmp_path):
    """The worker's app keeps them: the recovery applies (or skips as seen) each in order."""
    from schemas.config import load_config
    from streams.settings import settings_from_env
    from streams.worker import create_worker

    env = {"ORACULAR_DATADIR": str(tmp_path / "state"), "ORACULAR_CONSUMER_LOOP": "worker"}
    app = create_worker(settings_from_env(env), load_config("examples/oracular.yaml"))
    assert _changelog_queue_after_flow_control(app) == ["record 10", "record 11"]
    app.flow_control.clear()  # other queues (the agents' streams) are still cleared
    assert all(queue.qsize() == 0 for queue in app.flow_control._queues)


def test_a_revoked_partitions_changelog_records_are_not_a_warning_each(
    patched: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Kept, they reach the restore after a revocation, which logs each one: at DEBUG now
    (thousands per rebalance), while the recovery's other warnings stay warnings."""
    app = faust.App("revoked-records", broker="kafka://127.0.0.1:1", store="memory://")
    assert app.tables.changelog_queue is not None  # the patched queue installs the filter
    recovery_log = logging.getLogger("faust.tables.recovery")
    with caplog.at_level("WARNING", logger="faust.tables.recovery"):
        recovery_log.warning(
            "recovery unknown topic TopicPartition(topic='c', partition=1) offset 7"
        )
        recovery_log.warning("Error in recovery boom")
    assert [r.getMessage() for r in caplog.records] == ["Error in recovery boom"]


def test_the_installed_faust_is_the_patched_version():
    """The environment has the version the patches were written for."""
    assert faust_upstream.installed_version() == FAUST_VERSION == faust.__version__


# --- taking batches from an agent's stream ---------------------------------------------------

TAKE_TOPIC = "take-in"
STREAMS_PYX_SHA256 = "0041622f4a251188f53d73e6d51d18d16f0f427512df1e96c043cfdeea4c3250"


@pytest.fixture
def taking() -> Iterator[tuple[Any, Any]]:
    """An app with flow running and a stream whose buffer the test fills by hand."""
    app = faust.App(
        "take-tests", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False
    )
    app.flow_control.resume()  # suspended until a worker's first assignment
    app.topics._acking_topics.add(TAKE_TOPIC)
    yield app, app.stream(app.channel())
    app.consumer._thread.thread_loop.close()  # the consumer thread's loop, never run


def _put(app: Any, stream: Any, offsets: range, generation: int = 0) -> list[Any]:
    """Events of TAKE_TOPIC's partition 0 at `offsets`, put into the stream's buffer."""
    events = []
    for offset in offsets:
        message = ConsumerMessage(  # what the Kafka consumer makes of a record
            TAKE_TOPIC, 0, offset, 0.0, 0, None, b"k", b"v", None, generation_id=generation
        )
        message.incref()  # one stream reads it, as the conductor counts
        event = faust.Event(app, b"k", b"v", {}, message)
        stream.channel.queue.put_nowait(event)
        events.append(event)
    return events


async def _next(batches: Any) -> list[int]:
    batch = await asyncio.wait_for(batches.__anext__(), SCENARIO_TIMEOUT_S)
    return [event.message.offset for event in batch]


async def test_take_batches_yields_the_buffer_in_order_at_most_max_at_a_time(taking):
    app, stream = taking
    _put(app, stream, range(7))
    batches = faust_patches.take_batches(stream, 3, 0.001)
    assert [await _next(batches) for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [6]]
    await batches.aclose()


async def test_taken_messages_are_tracked_until_acked_and_then_committable(taking):
    """What Stream.__aiter__ does per event: a taken message is unacked (so a rebalance
    waits for it and no commit passes it) until the agent acks it."""
    app, stream = taking
    events = _put(app, stream, range(3))
    batches = faust_patches.take_batches(stream, 10, 0.001)
    assert await _next(batches) == [0, 1, 2]
    consumer, tp = app.consumer, TP(TAKE_TOPIC, 0)
    assert {e.message for e in events} <= set(consumer.unacked)
    faust_patches.ack_all(app, events[:2])
    assert list(consumer._acked[tp]) == [0, 1] and events[2].message in consumer.unacked
    faust_patches.ack_all(app, events[2:])
    assert list(consumer._acked[tp]) == [0, 1, 2] and not consumer.unacked
    await batches.aclose()


@pytest.mark.parametrize("why", ["another generation", "flow suspended"])
async def test_an_event_delivered_before_a_rebalance_is_skipped_not_acked(taking, why):
    """As Faust's compiled stream iterator skips it: not given to the agent, not tracked (it
    holds up nothing) and not acked (an ack could let a commit pass it before the new
    generation applies it)."""
    app, stream = taking
    stale = _put(app, stream, range(2), generation=1 if why == "another generation" else 0)
    if why == "flow suspended":
        app.flow_control.suspend()
    batches = faust_patches.take_batches(stream, 10, 0.001)
    taking = asyncio.ensure_future(batches.__anext__())
    await _wait_until(stream.channel.queue.empty, "the stale events taken")
    assert not any(e.message.acked for e in stale) and not app.consumer.unacked
    assert not app.consumer._acked[TP(TAKE_TOPIC, 0)]
    if why == "flow suspended":
        app.flow_control._suspend.clear()  # resume() would also clear the buffer
        app.flow_control._resume.set()
    _put(app, stream, range(2, 3))
    batch = await asyncio.wait_for(taking, SCENARIO_TIMEOUT_S)
    assert [e.message.offset for e in batch] == [2]
    await batches.aclose()


async def test_an_empty_batch_when_the_buffer_runs_dry_with_events_held(taking):
    """The agent holding events it has not acked (their states not written yet) gets an
    empty batch as soon as the buffer is empty, to write them: Faust's rebalance empties the
    buffer and then waits for every delivered event's ack."""
    app, stream = taking
    held: list[Any] = []
    _put(app, stream, range(2))
    batches = faust_patches.take_batches(stream, 10, 0.001, lambda: bool(held))
    held.extend(await batches.__anext__())
    assert await _next(batches) == []  # nothing buffered, events held: write them
    held.clear()
    taking_ = asyncio.ensure_future(batches.__anext__())
    await asyncio.sleep(0.05)
    assert not taking_.done()  # nothing held: it waits for input
    _put(app, stream, range(2, 3))
    assert [e.message.offset for e in await asyncio.wait_for(taking_, SCENARIO_TIMEOUT_S)] == [2]
    await batches.aclose()


@pytest.mark.parametrize("waiting", [True, False])
async def test_take_batches_ends_when_the_stream_ends(taking, waiting):
    """The channel thrown StopAsyncIteration (a worker's shutdown) ends the batches, as it
    ends Faust's own iterator; an async generator must not let it out (a RuntimeError)."""
    app, stream = taking
    batches = faust_patches.take_batches(stream, 10, 0.001)
    if waiting:
        taking_ = asyncio.ensure_future(batches.__anext__())
        await _wait_until(lambda: stream.channel.queue._getters, "the generator waiting")
        await stream.channel.throw(StopAsyncIteration())
    else:
        _put(app, stream, range(2))
        stream.channel.queue._errors.append(StopAsyncIteration())
        taking_ = asyncio.ensure_future(batches.__anext__())
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(taking_, SCENARIO_TIMEOUT_S)


async def test_a_batch_waits_out_the_window_after_the_last_one_unless_it_is_full(taking):
    """Within the window after a batch, events gather into the next; a full buffer does not
    wait."""
    app, stream = taking
    _put(app, stream, range(3))
    batches = faust_patches.take_batches(stream, 3, 60.0)
    assert await _next(batches) == [0, 1, 2]  # the first window is over at once
    _put(app, stream, range(3, 6))
    assert await _next(batches) == [3, 4, 5]  # full: not held for the 60 s window
    taking = asyncio.ensure_future(batches.__anext__())
    _put(app, stream, range(6, 7))
    await asyncio.sleep(0.2)
    assert not taking.done()  # one event, 60 s window: it waits for more
    taking.cancel()
    await asyncio.gather(taking, return_exceptions=True)


async def test_a_batch_that_took_longer_than_the_window_is_followed_at_once(taking):
    """The window runs from a batch's start, not its end: after a batch whose work outlasted
    the window, the next one (not full) is not held for another window."""
    app, stream = taking
    window_s = 2.0
    _put(app, stream, range(1))
    batches = faust_patches.take_batches(stream, 10, window_s)
    assert await _next(batches) == [0]
    await asyncio.sleep(window_s * 1.05)  # the agent applies the batch for longer than the window
    _put(app, stream, range(1, 2))
    # Measured from the batch's end, the next batch would wait the whole window again.
    batch = await asyncio.wait_for(batches.__anext__(), window_s * 0.75)
    assert [e.message.offset for e in batch] == [1]
    await batches.aclose()


@pytest.mark.parametrize(
    ("where", "sha256"),
    [
        ("Stream._py_aiter", "3a48ee257a65435b482d51edb74f2993a67867949b1ef89b49fea893769e0614"),
        ("_cython/streams.pyx", STREAMS_PYX_SHA256),
    ],
)
def test_take_batches_mirrors_the_stream_iterators_it_was_written_for(where, sha256):
    """`take_batches` repeats the stream iterators' per-event bookkeeping (skip stale events,
    track messages): a change there must be re-read against it."""
    if where.endswith(".pyx"):
        source = (Path(faust.__file__).parent / where).read_text()
    else:
        source = inspect.getsource(faust.streams.Stream._py_aiter)
    assert hashlib.sha256(source.encode()).hexdigest() == sha256, (
        f"faust-streaming's {where} changed: re-read it against take_batches"
    )


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (b"user-1", b"\x84\xa4user\xa6user-1", []),
        (None, b'{"user": "u"}', [("trace", b"x")]),
        (b"user-1", None, []),
        (b"", b"", []),
        (b"\xff\x00", b"\x00" * 1000, None),
    ],
)
async def test_the_raw_schema_decodes_as_fausts_bytes_schema_does(key, value, headers):
    """`RawSchema`'s decode makes the event Faust's own compiled decode makes of a record for
    a bytes/raw topic (same class, key, value, headers and message): if Faust's decoding of
    raw records changes, this fails."""
    app = faust.App(
        "raw-schema-tests", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False
    )
    try:
        upstream = faust.Schema(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        ).compile(app)
        ours = faust_patches.RawSchema().compile(app)
        message = ConsumerMessage("t", 0, 7, 0.0, 0, headers, key, value, None)
        want, got = await upstream(message), await ours(message)
        assert type(got) is type(want) and got.app is want.app and got.message is message
        assert (got.key, got.value, got.headers) == (want.key, want.value, want.headers)
        topic = app.topic("t", schema=faust_patches.RawSchema())
        assert (topic.key_type, topic.value_type) == (bytes, bytes)
        assert (topic.key_serializer, topic.value_serializer) == ("raw", "raw")
        assert type(await topic.clone().decode(message)) is type(want)  # clones share it
    finally:
        app.consumer._thread.thread_loop.close()


# --- the local store's faults: a corrupt copy set aside, scans that never end early ------------


def _rocksdb_table(tmp_path: Path, name: str = "store-faults") -> Any:
    app = faust.App(
        name,
        broker="kafka://127.0.0.1:1",  # never started: the store needs no broker
        store="rocksdb://",
        datadir=str(tmp_path),
        key_serializer="raw",
        value_serializer="raw",
    )
    return app.Table("st", key_type=bytes, value_type=bytes, partitions=4)


def _filled(table: Any, partition: int, users: int = 20_000) -> Path:
    """Write `users` values to `partition`'s database, flush it to one compacted .sst, close
    it; the .sst's path."""
    faust_patches.store_put_all(
        table, partition, [(b"u%06d" % i, os.urandom(200)) for i in range(users)]
    )
    db = table.data._dbs.pop(partition)
    db.flush()
    db.compact_range(None, None)
    db.close()
    (sst,) = faust_patches.store_path(table, partition).glob("*.sst")
    return sst


def _flip(path: Path, at: float = 1 / 3, size: int = 200) -> None:
    with path.open("r+b") as f:
        f.seek(int(path.stat().st_size * at))
        f.write(bytes(b ^ 0xFF for b in f.read(size)[:size]) or os.urandom(size))


def test_a_corrupt_local_copy_is_set_aside_and_opened_empty(tmp_path, patched):
    """A truncated .sst: upstream's open raises RocksDB's Corruption, for good (every start
    fails the same way). Patched, the database goes to `set-aside/` with the reason, and the
    partition opens empty, for the recovery to restore from the changelog."""
    table = _rocksdb_table(tmp_path)
    sst = _filled(table, 2)
    half = sst.stat().st_size // 2
    os.truncate(sst, half)
    path = faust_patches.store_path(table, 2)
    before = faust_patches.set_aside_count[0]
    try:
        assert faust_patches.store_get(table, 2, b"u000001") is None  # opened anew: empty
        assert faust_patches.store_scan(table, 2) == []
        (aside,) = (path.parent / "set-aside").iterdir()
        assert aside.name.startswith(path.name + ".")
        assert (aside / sst.name).stat().st_size == half  # kept as it was
        assert "Sst file size mismatch" in (aside / "SET-ASIDE-REASON.txt").read_text()
        assert faust_patches.set_aside_count[0] == before + 1
    finally:
        for db in table.data._dbs.values():
            db.close()


def test_only_the_newest_corrupt_copies_are_kept(tmp_path):
    from streams.faust.stores import KEEP_SET_ASIDE

    for n in range(KEEP_SET_ASIDE + 2):
        db = tmp_path / "tables" / "st-1.db"
        db.mkdir(parents=True)
        (db / "n").write_text(str(n))
        faust_patches.set_aside(db, "test")
    kept = sorted((tmp_path / "tables" / "set-aside").iterdir())
    assert len(kept) == KEEP_SET_ASIDE
    assert {int((k / "n").read_text()) for k in kept} == {2, 3, 4}


def test_a_scan_over_a_corrupt_block_raises_where_upstream_ends_early(tmp_path):
    """Bit-flipped bytes inside an .sst: the database opens, and Faust's own iteration
    (rocksdict's `items()`) stops at the bad block as if the data ended; the scans the worker
    runs (the deadline index's rebuild, the lookup API's full copies) raise StoreError."""
    table = _rocksdb_table(tmp_path)
    _flip(_filled(table, 1))
    try:
        db = table.data._db_for_partition(1)
        upstream = sum(1 for _ in db.items())
        assert 0 < upstream < 20_000  # upstream: a short copy, no error
        with pytest.raises(faust_patches.StoreError) as raised:
            faust_patches.store_scan(table, 1)
        assert raised.value.corrupt and raised.value.partition == 1
        with pytest.raises(faust_patches.StoreError):
            faust_patches.store_items(db, None, 30_000)
    finally:
        for db in table.data._dbs.values():
            db.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")
def test_a_full_disk_is_a_store_error_not_a_bug(tmp_path):
    """RocksDB's "IO error: No space left on device" comes out as StoreError (not corrupt),
    which stops the worker with exit 74 instead of dead-lettering or restarting."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        table = _rocksdb_table(mount)
        with pytest.raises(faust_patches.StoreError) as raised:
            for n in range(1_000):  # 1,000 batches of 100 KiB: far past 2 MiB
                faust_patches.store_put_all(
                    table, 0, [(b"u%06d-%d" % (i, n), os.urandom(1024)) for i in range(100)]
                )
        assert not raised.value.corrupt and raised.value.partition == 0
        assert "No space left on device" in str(raised.value)
        for db in table.data._dbs.values():
            with contextlib.suppress(Exception):  # RocksDB refuses to flush it: no space
                db.close()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
