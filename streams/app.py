"""The Faust app: topics, the state table, the agent, the timer and the summary log.

Run it with `oracular worker --config FILE` (or `faust -A streams.app worker`, reading the
`ORACULAR_*` environment variables of `streams/settings.py`).

The agent is thin: it takes a batch of messages (input and ticks, co-partitioned), lets
`streams.processor.Processor` decide everything, then:
1. publishes the batch's outputs and waits until the broker has them (`producer.flush`);
2. writes each changed user's state once (one changelog record per user per batch);
3. acks the batch's messages, so their offsets may be committed.
In that order, a stored state that records an input as applied implies its outputs were
delivered, so skipping redelivered inputs (offset <= the user's last applied offset) never
loses an output; a crash before (2) re-applies the batch and re-sends outputs with the same ids.
Messages are acked by hand (`noack_take`): a batch interrupted by a crash or shutdown is never
committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import faust
from faust.exceptions import ConsumerNotStarted
from faust.types import TP

from engine import EngineConfig
from schemas.config import load_config
from schemas.stored import stored_version
from streams import faust_patches  # applied on import: every worker runs patched
from streams.gapfill import GapFiller, fill_holes
from streams.processor import (
    DLQ,
    EPISODES,
    PREDICTIONS,
    InMessage,
    Processor,
    Table,
    TimePolicy,
    encode_tick,
)
from streams.progress import Progress
from streams.settings import ROCKSDB_OPTIONS, Settings, describe, settings_from_env

log = logging.getLogger("oracular.worker")

STATE_TABLE = "oracular-state"


def raw_topic(app: Any, *names: str, partitions: int, internal: bool = False) -> Any:
    """A Faust topic of raw bytes keys and values: every byte goes through `schemas/`."""
    return app.topic(
        *names,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
        internal=internal,
    )


@contextlib.contextmanager
def on_partition_of(event: Any) -> Iterator[None]:
    """Make `event` Faust's current event, so table reads and writes use its partition.

    Faust picks a table's RocksDB partition and changelog partition from the current event.
    Inside a batch that is the batch's last message, not the one whose user is being read or
    written, so each access names its own message. (faust-streaming 0.15.3; pinned.)
    """
    with faust_patches.current_event(event):
        yield


class FaustTable(Table):
    """`streams.processor.Table` over a Faust table with bytes keys and values."""

    def __init__(self, table: Any) -> None:
        """Wrap `table`."""
        self.table = table

    def get(self, key: bytes, context: Any) -> bytes | None:
        """Read on the partition of `context`."""
        with on_partition_of(context):
            value: bytes | None = self.table.get(key)
            return value

    def set(self, key: bytes, value: bytes, context: Any) -> None:
        """Write the local store on the partition of `context` (no changelog record: the
        worker sends a batch's records together with `send_changelog`)."""
        with on_partition_of(context):
            self.table.data[key] = value

    async def send_changelog(
        self,
        producer: Any,
        writes: list[tuple[bytes, bytes, Any]],
        before_sending: Callable[[], None] = lambda: None,
    ) -> None:
        """Send the changelog records of values just stored and wait for the broker.

        The records go straight to the producer (Faust's per-record `send_soon` path and its
        per-record callback cost more than the rest of a batch), then each partition's last
        changelog offset is stored once, as Faust's callback would store it per record: a
        restart with the datadir kept reads the changelog from there. Raises what a failed
        delivery raises.
        """
        topic = self.table.changelog_topic.get_topic_name()
        futures = []
        for key, value, context in writes:
            before_sending()  # a send may yield to the loop: check before each one
            futures.append(
                await producer.send(topic, key, value, context.message.partition, None, None)
            )
        before_sending()  # queued, not yet flushed
        await producer.flush()
        last: dict[int, int] = {}
        for metadata in await asyncio.gather(*futures):
            last[metadata.partition] = max(last.get(metadata.partition, -1), metadata.offset)
        for partition, offset in last.items():
            self.table.data.set_persisted_offset(TP(topic, partition), offset)


def fence_stale_changelog_records(
    table: Any, repair: Callable[[int, bytes], None] | None = None
) -> None:
    """Make restores and standbys skip changelog records older than the value they hold.

    A worker frozen past its session timeout (a long GC pause, a stopped VM) comes back as a
    zombie: before it learns that its partitions moved, it may finish the batch in hand and
    write states to the changelog *after* the new owner wrote newer ones. Kafka cannot fence
    it without transactions, so the records are ordered by the user's own write version
    (`schemas.stored.stored_version`: last applied offset, then episodes closed): a record
    older than the value already stored (or already seen in the batch) is skipped. The new
    owner's local store never reads the changelog, so only restores and standbys need this.
    The partitions' persisted offsets still advance past skipped records. Where a skipped
    record is the last of its user in the log (compaction would keep it), `repair(partition,
    key)` is called: the partition's owner writes the user's state again after recovery.
    """
    apply = table.apply_changelog_batch

    def apply_newer(batch: Any) -> None:
        kept: list[Any] = []
        newest: dict[tuple[int, bytes], tuple[int, int] | None] = {}
        last: dict[Any, int] = {}
        stale_last: set[tuple[int, bytes]] = set()
        skipped = 0
        for event in batch:
            message = event.message
            last[message.tp] = max(last.get(message.tp, -1), message.offset)
            where = (message.partition, message.key)
            if message.value is None:
                newest[where] = None
                kept.append(event)
                continue
            version = stored_version(message.value)
            if where in newest:
                current = newest[where]
            else:
                with on_partition_of(event):
                    raw = table.data.get(message.key)
                current = None if raw is None else stored_version(raw)
            if version is not None and current is not None and version < current:
                skipped += 1
                stale_last.add(where)
                continue
            newest[where] = version
            stale_last.discard(where)
            kept.append(event)
        apply(kept)
        if repair is not None:
            for partition, key in stale_last:
                repair(partition, key)
        for tp, offset in last.items():
            table.data.set_persisted_offset(tp, offset)
        if skipped:
            log.warning(
                "changelog: skipped %s record(s) older than the state already held "
                "(written late by a worker that had lost its partitions)",
                skipped,
            )

    table.apply_changelog_batch = apply_newer


EXIT_FENCED: Final = 75
REPAIR_KEYS_PER_TICK: Final = 200
"""Users named per repair tick: a user id is at most 512 characters (2 KiB of UTF-8), so a
tick stays below half the producer's 1 MB record limit."""


class FrozenWhileWriting(Exception):
    """The worker was frozen while sending a batch's changelog records."""

    def __init__(self, stalled_s: float) -> None:
        """How long the loop stood still."""
        super().__init__(f"frozen for {stalled_s:.1f} s")
        self.stalled_s = stalled_s


"""Exit code of a worker that stopped itself after a freeze (sysexits EX_TEMPFAIL: restart)."""


class Lease:
    """Notices when the worker's event loop stopped running for long (see `_may_write`).

    `keep` renews it four times a second; a renewal older than `limit_s` means the loop was
    stalled that long: the process was frozen, or a single step ran that long.
    """

    def __init__(self, limit_s: float) -> None:
        """Doubt membership after a stall longer than `limit_s`."""
        self.limit_s = limit_s
        self.renewed = time.monotonic()
        self.stalls = 0
        """Stalls seen so far (each counted once)."""
        self.counted = False
        self.stalled_since_rebalance = False
        """A stall was seen since the last rebalance: this worker may have been a zombie, so
        its local copies of the partitions it loses are not trusted (`_Runtime.revoked`)."""

    def renew(self) -> None:
        """The loop is running now."""
        self.renewed = time.monotonic()
        self.counted = False

    def stalled_s(self) -> float | None:
        """How long the loop was stalled, when that is longer than the limit; else None."""
        stalled = time.monotonic() - self.renewed
        if stalled > self.limit_s:
            if not self.counted:
                self.stalls += 1
                self.counted = True
            self.stalled_since_rebalance = True
            return stalled
        return None

    async def keep(self) -> None:
        """Renew until cancelled (noting any stall it finds)."""
        while True:
            self.stalled_s()
            self.renew()
            await asyncio.sleep(0.25)


class GcPolicy:
    """Keeps Python's cyclic collector off the long-lived states.

    The cache of decoded states and the deadline index are large and long-lived; left in the
    collector's generations, every full collection walks them (tens of ms of p99 latency,
    BENCHMARKS.md). So young objects are collected and the survivors frozen (`gc.freeze`)
    every `FREEZE_S`; frozen objects are still freed by reference counting when a state is
    evicted. Once an hour everything is unfrozen and fully collected, so cyclic garbage that
    happened to be frozen while still in use is reclaimed: one full collection an hour.
    """

    FREEZE_S: Final = 30.0
    THAW_S: Final = 3600.0

    def __init__(self) -> None:
        """Start counting from now."""
        self.frozen_at = self.thawed_at = time.monotonic()

    def freeze(self) -> None:
        """Collect the young generations and freeze what survives."""
        gc.collect(1)
        gc.freeze()
        self.frozen_at = time.monotonic()

    def tick(self) -> None:
        """Freeze, or thaw and collect everything, when it is time."""
        now = time.monotonic()
        if now - self.thawed_at >= self.THAW_S:
            gc.unfreeze()
            gc.collect()
            self.thawed_at = now
            self.freeze()
        elif now - self.frozen_at >= self.FREEZE_S:
            self.freeze()


class KillSwitch:
    """Crash tests only: SIGKILL this worker at one step of its n-th batch.

    `ORACULAR_TEST_KILL_AT=STEP:N` with STEP one of outputs (delivered), stored (local store
    written), changelog (changelog records acknowledged) or acked (inputs acknowledged), and N
    the batch to reach that step, counted from 1. Unset (always, outside tests): off.
    """

    STEPS: Final = ("outputs", "stored", "changelog", "acked")

    def __init__(self, step: str | None, batch: int) -> None:
        """Kill at `step` of the `batch`-th batch (None: never)."""
        self.step, self.batch = step, batch
        self.seen: dict[str, int] = {}

    @classmethod
    def from_env(cls) -> KillSwitch:
        """From ORACULAR_TEST_KILL_AT."""
        spec = os.environ.get("ORACULAR_TEST_KILL_AT", "")
        if not spec:
            return cls(None, 0)
        step, _, batch = spec.partition(":")
        if step not in cls.STEPS or not batch.isdigit():
            msg = f"ORACULAR_TEST_KILL_AT={spec!r}: must be STEP:N, STEP one of {cls.STEPS}"
            raise ValueError(msg)
        return cls(step, int(batch))

    def reached(self, step: str) -> None:
        """Count `step`; SIGKILL this process when it is the chosen one."""
        if self.step != step:
            return
        self.seen[step] = self.seen.get(step, 0) + 1
        if self.seen[step] == self.batch:
            log.warning("ORACULAR_TEST_KILL_AT: killing the worker after %s", step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Backfill:
    """A bounded run: from `start` up to (not including) `stop` offsets, then `done()`."""

    start: dict[int, int]
    """Partition -> the first offset to apply."""
    stop: dict[int, int]
    """Partition -> the end offset captured when the backfill started."""
    done: Callable[[], None]
    """Called once every partition is handled up to `stop` and has had a tick after that
    (so the episodes due by then are closed)."""
    finished: set[int] = field(default_factory=set)
    """Partitions handled up to `stop` that have had a tick since."""
    reached: bool = False
    """`done()` was called."""
    progress: Progress | None = None
    """Advanced with the messages handled so far (of stop − start)."""


def create_app(
    settings: Settings, config: EngineConfig, backfill: Backfill | None = None
) -> faust.App:
    """Build the worker's Faust app for `settings` and the engine `config`.

    With `backfill`, inputs at or past its stop offsets are not applied and `backfill.done`
    is called when the end is reached.
    """
    settings.state_dir.parent.mkdir(parents=True, exist_ok=True)
    topics = settings.topics
    partitions = topics.events.partitions
    app = faust.App(
        settings.app_id,
        broker=settings.broker_url,
        broker_credentials=settings.credentials(),
        datadir=str(settings.state_dir),
        store="rocksdb://",
        topic_partitions=partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=settings.standby_replicas,
        # A stopped or killed worker leaves the group within this, not Faust's default 60 s.
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=max(settings.session_timeout_s / 5, 1.0),
        broker_commit_interval=settings.commit_interval_s,
        # At-least-once, not Faust's exactly_once (transactions; open issues in faust-streaming):
        # redeliveries are skipped by each user's last applied offset, and a re-sent output
        # keeps its id, so consumers drop it (docs/operations.md, "What the worker does").
        processing_guarantee="at_least_once",
        producer_acks=-1,
        consumer_auto_offset_reset="earliest",
        web_enabled=settings.web_port is not None,
        web_port=settings.web_port or 6066,
    )

    inputs = raw_topic(app, topics.events.name, topics.ticks.name, partitions=partitions)
    ticks = raw_topic(app, topics.ticks.name, partitions=partitions)
    outputs = {
        PREDICTIONS: topics.predictions.name,
        EPISODES: topics.episodes.name,
        DLQ: topics.dlq.name,
    }
    table = app.Table(
        STATE_TABLE,
        key_type=bytes,
        value_type=bytes,
        partitions=partitions,
        options=dict(ROCKSDB_OPTIONS),
    )
    processor = Processor(
        config,
        events_topic=topics.events.name,
        ticks_topic=topics.ticks.name,
        time=TimePolicy(
            lateness_ms=settings.lateness_ms,
            idle_ms=settings.idle_ms,
            max_skew_ms=settings.max_skew_ms,
            hold_until_end=backfill is not None,
        ),
        output_format=settings.output_format,  # type: ignore[arg-type]  # checked: msgpack|json
        stop_offsets=None if backfill is None else backfill.stop,
        cache_users=settings.state_cache_users,
    )
    runtime = _Runtime(app, processor, FaustTable(table), outputs, settings, backfill=backfill)
    fence_stale_changelog_records(table, runtime.repair)
    app.oracular = runtime  # type: ignore[attr-defined]  # for tests and web views
    if backfill is None:  # the lookup API, health and metrics (streams/api.py, docs/serving.md)
        from streams.api import install_serving  # noqa: PLC0415 - aiohttp only in workers

        install_serving(app, runtime)

    @app.agent(inputs, concurrency=1)  # concurrency 1: per-user order
    async def process(stream: Any) -> None:
        async for events in stream.noack_take(settings.batch_max, settings.batch_window_s):
            for event in await runtime.run_batch(events):
                await stream.ack(event)
            runtime.faults.reached("acked")

    @app.timer(settings.tick_interval_s)
    async def tick() -> None:
        await runtime.send_ticks(ticks)

    @app.task
    async def keep_lease() -> None:
        await runtime.lease.keep()

    @app.timer(settings.summary_interval_s)
    async def summary() -> None:
        runtime.log_summary()

    @table.on_recover
    async def rebuild_deadlines() -> None:
        runtime.rebuild(table)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust's signal typing
    async def forget(app: Any, revoked: set[TP], **_: Any) -> None:
        partitions = [tp.partition for tp in revoked if tp.topic == topics.events.name]
        processor.forget(partitions)
        runtime.revoked(partitions)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def final_summary(app: Any, **_: Any) -> None:
        runtime.log_summary()
        await runtime.gaps.close()

    del process, tick, keep_lease, summary, rebuild_deadlines, forget, final_summary  # registered
    return app


class _Runtime:
    """The agent's and timer's bodies, with what they share."""

    def __init__(
        self,
        app: Any,
        processor: Processor,
        table: FaustTable,
        outputs: dict[str, str],
        settings: Settings,
        *,
        backfill: Backfill | None = None,
    ) -> None:
        self.app, self.processor, self.table = app, processor, table
        self.settings = settings
        self.output_names = outputs
        self.backfill = backfill
        self.events_topic = settings.topics.events.name
        self.started = time.monotonic()
        self._last_summary = (self.started, 0)
        self.faults = KillSwitch.from_env()
        self.memory = GcPolicy()
        self.lease = Lease(settings.session_timeout_s / 2)
        self._stalls_seen = 0
        self._fenced_in: int | None = None
        """The generation a batch was dropped in; until a newer one, nothing is written."""
        self.repairs: dict[int, set[bytes]] = {}
        self.gaps = GapFiller(settings.broker, settings.client_kwargs())

    async def run_batch(self, events: list[Any]) -> list[Any]:
        """Apply a batch (outputs delivered, then states written); returns the events to ack:
        all of them, since every message is applied, skipped as a duplicate or dead-lettered."""
        generation = self.app.consumer_generation_id  # the group generation it was read in
        if self._fenced_in is not None:
            if generation == self._fenced_in:
                # Read before the rebalance this worker was told about: its partitions may be
                # someone else's by now, and it holds no assignment to write for yet.
                faust_patches.abandon(self.app.consumer, events)
                return []
            self._fenced_in = None  # assigned anew (and sought to the committed offsets)
        batch = self.processor.batch(self.table)
        messages = [_in_message(event) for event in events]
        self._expect_committed(messages)
        messages = await fill_holes(
            self.gaps, messages, dict(self.processor.next_offset), self.events_topic
        )
        self.processor.counts["refetched"] = self.gaps.filled
        self.processor.run_batch(batch, messages, self.caught_up, _wall_ms)
        if not await self._may_write(generation):
            return self._fence(generation, events)
        # Straight to the producer: Faust's Topic.send costs ~16% of the worker's throughput
        # (BENCHMARKS.md). The states are written only once every output is acknowledged,
        # so a failed delivery raises here, before any state records the inputs as applied.
        producer = self.app.producer
        sent = [
            await producer.send(self.output_names[o.role], o.key, o.value, None, None, None)
            for o in batch.outputs
        ]
        await producer.flush()
        await asyncio.gather(*sent)
        self.faults.reached("outputs")
        if not await self._may_write(generation):
            return self._fence(generation, events)
        self._stalls_seen = self.lease.stalls
        writes = list(batch.writes())
        for key, value, context in writes:
            self.table.set(key, value, context)
        self.faults.reached("stored")
        try:
            # Every changelog record acknowledged before the inputs are: a restore from the
            # changelog can never fall behind the committed offsets.
            await self.table.send_changelog(producer, writes, self._unless_frozen)
            self._unless_frozen()  # frozen while the records were on their way?
        except FrozenWhileWriting as frozen:
            await self._leave_repairs(writes, frozen.stalled_s)
        except Exception as exc:
            log.critical(
                "a state's changelog record was not delivered (%s: %s): stopping the worker. "
                "Nothing of this batch is acknowledged; on restart its inputs are redelivered "
                "and the states written again",
                type(exc).__name__,
                exc,
            )
            await self.app.crash(exc)
            raise
        self.faults.reached("changelog")
        self.processor.remember(batch)
        if self.backfill is not None:
            self._backfill_progress(messages)
        return events

    def _fence(self, generation: int, events: list[Any]) -> list[Any]:
        """Drop a batch unwritten and unacknowledged (the partitions' owners re-read it), and
        every batch after it until this worker is assigned partitions in a newer generation:
        whatever it read before that may belong to another worker by now."""
        faust_patches.abandon(self.app.consumer, events)
        self._fenced_in = generation
        return []

    async def _may_write(self, generation: int) -> bool:
        """False when this worker was paused long enough to have lost its partitions.

        A worker frozen past its session timeout (a GC or VM pause, SIGSTOP) is evicted from
        the group, but until its next heartbeat it does not know, and a batch it had in hand
        would write outputs and states *after* the partitions' new owner wrote newer ones: a
        zombie. Kafka cannot fence it without transactions, so the worker fences itself: when
        its loop was stalled for more than half the session timeout (`Lease`), it writes
        nothing until the group coordinator confirms, by a heartbeat sent after the stall,
        that it is still a member of the current generation. Told it is not (or a rebalance
        began, or the generation changed), the batch is dropped unwritten and unacknowledged,
        and taken off Faust's in-flight set so the rebalance does not wait for it (the
        partitions' owners re-read it from the committed offsets). While the coordinator does
        not answer it keeps asking: writing on a guess is what a zombie does. A stall during
        the confirmation starts it again.
        """
        stalled = self.lease.stalled_s()
        if stalled is None:
            return True
        app = self.app
        log.warning(
            "the worker was paused for %.1f s (over half the session timeout): confirming it "
            "still belongs to its group before writing",
            stalled,
        )
        waited_since = time.monotonic()
        while True:
            self.lease.renew()  # a stall from here on is one during the question
            stalls = self.lease.stalls
            answer = faust_patches.UNKNOWN
            if not app.rebalancing and app.consumer_generation_id == generation:
                answer = await faust_patches.membership(app.consumer)
            if app.rebalancing or app.consumer_generation_id != generation:
                answer = faust_patches.LOST
            if self.lease.stalled_s() is not None or self.lease.stalls != stalls:
                continue  # frozen again while asking: the answer may predate an eviction
            if answer == faust_patches.MEMBER:
                return True
            if answer in (faust_patches.LOST, faust_patches.REBALANCING):
                self.processor.counts["fenced_batches"] += 1
                log.warning(
                    "it did not (%s): the batch in hand is dropped unwritten; its inputs are "
                    "re-read by the partitions' owners",
                    answer,
                )
                return False
            if time.monotonic() - waited_since > self.settings.session_timeout_s:
                log.warning("the group coordinator has not answered yet; still asking")
                waited_since = time.monotonic()
            await asyncio.sleep(0.1)

    def _unless_frozen(self) -> None:
        """Raise `FrozenWhileWriting` if the process was frozen (stalled past the lease's
        limit) since the batch last confirmed it may write: its changelog records could land
        after a new owner's (a zombie's writes). Checked before each record is queued and once
        they are all acknowledged. A batch that merely took that long is rare, and the
        repair and restart that follow are safe for it."""
        lease = self.lease
        stalled = lease.stalled_s()
        if stalled is not None or lease.stalls != self._stalls_seen:
            # Frozen since the last check (the loop may have run since, when queueing the
            # records had to wait, and renewed the lease: the count still shows it).
            raise FrozenWhileWriting(stalled or time.monotonic() - lease.renewed)

    async def _leave_repairs(self, writes: list[tuple[bytes, bytes, Any]], stalled: float) -> None:
        """After a freeze while writing the changelog: make sure the users' newest states end
        up last in the changelog, then exit.

        Records queued before the freeze go out when the process resumes, possibly after the
        partitions' new owner wrote newer states of the same users; compaction would keep the
        older ones. So once they are out, a tick naming those users is sent to each of their
        partitions: the tick comes after them in time, and its partition's owner (whoever that
        is now) writes each named user's current state again, last. Then the worker exits
        (`EXIT_FENCED`): nothing of the batch is acknowledged, so its inputs are redelivered to
        whoever owns the partitions (a supervisor restarts this worker).
        """
        log.critical(
            "the worker was frozen for %.1f s while writing its changelog: asking the "
            "partitions' owners to write those %s user(s) again, then exiting (its partitions "
            "may have new owners)",
            stalled,
            len(writes),
        )
        try:
            await asyncio.wait_for(self._send_repairs(writes), self.settings.session_timeout_s)
        except Exception as exc:  # exiting regardless; say what was missed
            log.critical("the repair ticks were not all sent (%s: %s)", type(exc).__name__, exc)
        logging.shutdown()
        os._exit(EXIT_FENCED)

    async def _send_repairs(self, writes: list[tuple[bytes, bytes, Any]]) -> None:
        producer = self.app.producer
        await producer.flush()  # whatever was queued goes out before the ticks
        by_partition: dict[int, list[bytes]] = {}
        for key, _value, context in writes:
            by_partition.setdefault(context.message.partition, []).append(key)
        ticks = self.settings.topics.ticks.name
        sent = []
        for partition, keys in by_partition.items():
            for start in range(0, len(keys), REPAIR_KEYS_PER_TICK):
                value = encode_tick(_wall_ms(), keys[start : start + REPAIR_KEYS_PER_TICK])
                sent.append(await producer.send(ticks, None, value, partition, None, None))
        await producer.flush()
        await asyncio.gather(*sent)

    def _expect_committed(self, messages: list[InMessage]) -> None:
        """A partition's first input after (re)assignment is expected at its committed offset
        (the processor counts a later one as a gap in the log)."""
        consumer = self.app.consumer
        for message in messages:
            if (
                message.topic == self.events_topic
                and message.partition not in self.processor.next_offset
            ):
                tp = TP(self.events_topic, message.partition)
                offset = faust_patches.committed_offset(consumer, tp)
                if offset is not None:
                    self.processor.expect(message.partition, offset)

    def _backfill_progress(self, messages: list[InMessage]) -> None:
        backfill = self.backfill
        assert backfill is not None
        if backfill.progress is not None:
            handled = sum(
                self.processor.next_offset.get(p, start) - start
                for p, start in backfill.start.items()
            )
            backfill.progress.advance(handled, count=len(messages))
        ticks = self.settings.topics.ticks.name
        for message in messages:
            if message.topic == ticks and self.caught_up(message.partition):
                backfill.finished.add(message.partition)
        if not backfill.reached and backfill.finished >= backfill.stop.keys():
            backfill.reached = True
            backfill.done()

    def caught_up(self, partition: int) -> bool:
        """True when every input message of `partition` up to its end offset is handled.

        The end offset is the last stable offset (the worker reads committed records only),
        or in a backfill the end offset captured at its start. Where the partition ends in
        records the worker never receives (transaction markers, aborted records), it is
        caught up once the consumer has read past them and everything delivered is handled.
        """
        if self.backfill is not None:
            first = self.backfill.start.get(partition, 0)
            reached = self.processor.next_offset.get(partition, first)
            return reached >= self.backfill.stop.get(partition, 0)
        tp = TP(self.events_topic, partition)
        consumer = self.app.consumer
        end = faust_patches.end_offset(consumer, tp)
        if end is None:
            return False
        handled = self.processor.next_offset.get(partition)
        if handled is None:
            # Nothing handled since this worker took the partition: where its committed
            # offset is the end offset, nothing is waiting.
            handled = faust_patches.committed_offset(consumer, tp)
        if handled is None:
            return False
        if handled >= end:
            return True
        through = faust_patches.delivered_through(consumer, tp)
        delivered = faust_patches.read_offset(consumer, tp)
        return through is not None and through >= end and handled >= (delivered or handled)

    async def send_ticks(self, ticks: Any) -> None:
        """One tick per owned input partition, unless a rebalance or recovery is under way."""
        app = self.app
        self.memory.tick()
        if app.rebalancing or getattr(app, "in_recovery", False):
            return
        now = _wall_ms()
        for tp in app.consumer.assignment():
            if tp.topic == self.settings.topics.ticks.name:
                await ticks.send(value=encode_tick(now), partition=tp.partition)

    def repair(self, partition: int, key: bytes) -> None:
        """After recovery, write `key` again: the changelog's last record of it is stale."""
        self.repairs.setdefault(partition, set()).add(key)

    def revoked(self, partitions: list[int]) -> None:
        """Partitions lost in a rebalance. After a stall (this worker may have been a zombie
        whose late writes advanced its local copies' persisted offsets past another owner's
        writes), their next restore here starts from the beginning of the changelog."""
        if not self.lease.stalled_since_rebalance:
            return
        self.lease.stalled_since_rebalance = False
        topic = self.table.table.changelog_topic.get_topic_name()
        for partition in partitions:
            self.table.table.data.set_persisted_offset(TP(topic, partition), -1)
        log.warning(
            "after a stall, the local copies of partitions %s will be restored in full",
            partitions,
        )

    def rebuild(self, table: Any) -> None:
        consumer, ticks = self.app.consumer, self.settings.topics.ticks.name
        self.processor.rebuild(
            table.items(),
            _wall_ms(),
            lambda p: faust_patches.committed_offset(consumer, TP(ticks, p)),
        )
        for partition, keys in self.repairs.items():
            self.processor.rewrite.setdefault(partition, []).extend(keys)
        if self.repairs:
            log.warning(
                "rewriting %s user(s) whose last changelog record was stale",
                sum(map(len, self.repairs.values())),
            )
        self.repairs = {}
        log.info(
            "deadline index rebuilt: %s users with an open episode",
            self.processor.open_episodes(),
        )
        self.memory.freeze()
        self.lease.renew()  # a long restore is not a freeze

    def log_summary(self) -> None:
        now = time.monotonic()
        handled = self.processor.handled()
        since, before = self._last_summary
        rate = (handled - before) / max(now - since, 1e-9)
        self._last_summary = (now, handled)
        log.info(
            "oracular summary: events_per_s=%.0f %s lag=%s",
            rate,
            self.processor.summary(),
            self._lag(),
        )

    def _lag(self) -> int | str:
        consumer = self.app.consumer
        handled_at = dict(self.processor.next_offset)
        # An assigned input partition that has handled nothing since assignment (one whose
        # fetching stalled included) is behind by what lies past its committed offset: not
        # counting it showed a stalled partition as lag=0.
        try:
            assigned = consumer.assignment()
        except ConsumerNotStarted:  # a summary at a shutdown before the consumer started
            assigned = set()
        for tp in assigned:
            if tp.topic == self.events_topic and tp.partition not in handled_at:
                committed = faust_patches.committed_offset(consumer, tp)
                if committed is not None:
                    handled_at[tp.partition] = committed
        total = 0
        for partition, handled in handled_at.items():
            end = faust_patches.end_offset(consumer, TP(self.events_topic, partition))
            if end is None:
                return "unknown"
            if not self.caught_up(partition):  # caught up: only markers may be left
                total += max(end - handled, 0)
        return total


def _in_message(event: Any) -> InMessage:
    message = event.message
    timestamp = message.timestamp
    return InMessage(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        value=message.value,
        timestamp_ms=round(timestamp * 1000) if timestamp else None,
        context=event,
    )


def _wall_ms() -> int:
    return int(time.time() * 1000)


def app_from_env() -> faust.App:
    """The app `faust -A streams.app` and `oracular worker` run: settings from ORACULAR_*."""
    settings = settings_from_env()
    config = load_config(settings.config_path)
    log.info("oracular worker settings:\n%s", describe(settings))
    return create_app(settings, config)


def __getattr__(name: str) -> Any:
    """`streams.app.app`, built from the environment on first use (for `faust -A streams.app`)."""
    if name == "app":
        built = app_from_env()
        globals()["app"] = built
        return built
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
