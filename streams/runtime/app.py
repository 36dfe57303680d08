"""The Faust app: topics, the state table, the agent, the timer and the summary log.

`create_runtime` builds it. The worker (`streams/worker.py`: `oracular worker`, `faust -A
streams.worker worker`) adds the lookup API to it; a backfill runs it as it is.

The agent is thin: it takes a batch of messages (input and ticks, co-partitioned), lets
`streams.runtime.processor.Processor` decide everything, then hands the batch to
`streams.runtime.commit.BatchCommit`, which publishes its outputs, writes its states once the
broker has them, and acks its messages once their changelog records are acknowledged (the
order, and the invariant each step keeps, are in its docstring). Messages are taken a batch at
a time and acked by hand (`faust_patches.take_batches`): a batch interrupted by a crash or
shutdown is never committed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

import faust
from faust.types import TP

from engine import EngineConfig
from schemas.ticks import encode_tick
from streams.faust import patches as faust_patches
from streams.faust.config import ConsumerSettings
from streams.faust.config import (
    configure as configure_consumer,  # applied on import: every worker runs patched
)
from streams.runtime.backfill import Backfill
from streams.runtime.commit import BatchCommit, Progress
from streams.runtime.datadir import DatadirError, DatadirInUse
from streams.runtime.datadir import prepare as prepare_datadir
from streams.runtime.diskguard import DiskGuard
from streams.runtime.erasure import erasure_key
from streams.runtime.failstop import FAIL_STOP
from streams.runtime.faults import KillSwitch
from streams.runtime.fencing import Fence
from streams.runtime.gapfill import GapFiller, fill_holes
from streams.runtime.memory import GcPolicy
from streams.runtime.positions import Positions
from streams.runtime.processor import DLQ, EPISODES, PREDICTIONS, InMessage, Processor, TimePolicy
from streams.runtime.quiet_logs import quiet_aiokafka_logs
from streams.runtime.restored import check_restored
from streams.runtime.shutdown import StopDeadline
from streams.runtime.state_table import FaustTable, Written, fence_stale_changelog_records
from streams.settings import ROCKSDB_OPTIONS, Settings
from streams.settings.exits import EXIT_DATADIR_IN_USE, EXIT_USAGE
from streams.settings.topics import STATE_TABLE, ProductTopics

log = logging.getLogger("oracular.worker")

PRODUCER_BATCH_BYTES: Final = 256 * 1024
"""Largest record batch the worker fills per partition (Faust's default is 16 KiB). A write of
a backlog's held states (a few thousand changelog records of 1-2 KiB) came to dozens of
batches per partition, and aiokafka hands a partition's next batch over only once the one
before it is on its way: a write of a few thousand states spent most of its time in those
waits (BENCHMARKS.md). Well below the broker's 1 MiB limit on a record batch
(`message.max.bytes`)."""
TIMER_CLOSES_PER_BATCH: Final = 1_500
"""The longest a mass close holds input up: a batch of this many timer closes (the closes,
their states' encoding, outputs and changelog) stays a short pause (BENCHMARKS.md)."""


def raw_topic(app: Any, *names: str, partitions: int, internal: bool = False) -> Any:
    """A Faust topic of raw bytes keys and values: every byte goes through `schemas/`."""
    return app.topic(
        *names,
        schema=faust_patches.RawSchema(),
        partitions=partitions,
        internal=internal,
    )


def create_runtime(
    settings: Settings, config: EngineConfig, backfill: Backfill | None = None
) -> Runtime:
    """Build the worker's Faust app for `settings` and the engine `config`, and the runtime
    its agent and timers run (`Runtime.app` is the app). The one place that reads the whole
    settings: each part gets the few values it uses.

    With `backfill`, inputs at or past its stop offsets are not applied and `backfill.done`
    is called when the end is reached.
    """
    quiet_aiokafka_logs()
    topics = settings.topics
    try:  # private (0700), and this app's: refuse another app's state (streams/runtime/datadir.py)
        prepare_datadir(settings.state_dir, settings.app_id, topics.events.name)
    except DatadirError as exc:
        print(f"oracular worker: {exc}", file=sys.stderr)
        raise SystemExit(
            EXIT_DATADIR_IN_USE if isinstance(exc, DatadirInUse) else EXIT_USAGE
        ) from exc
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
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        consumer_auto_offset_reset="earliest",
        web_enabled=settings.web_port is not None,
        web_port=settings.web_port or 6066,
        # Faust's own web server (only with ORACULAR_WEB_PORT) binds where the lookup API
        # does, and never serves its raw table views (`/table/<name>/<key>`: stored state,
        # unauthenticated) nor its `/router` (the cluster's worker URLs): the lookup API
        # reads users through the token and routes by itself.
        web_bind=settings.api_host,
        web_tables_enabled=False,
        web_router_enabled=False,
        # What ORACULAR_WEB_PORT promises: Faust's statistics pages, its sensors at `/` and
        # the partition assignment at `/assignment/` (off unless Faust's debug mode otherwise,
        # leaving only `{"status": "OK"}`).
        web_stats_enabled=True,
    )

    # How the patched consumer fetches and where it runs (streams/faust/config.py): on this
    # loop, not in Faust's thread, unless told; ticks alone do not keep its fetches short (an
    # idle worker fetches twice a second, not 500 times).
    configure_consumer(
        app,
        ConsumerSettings(
            fetch_max_wait_ms=settings.fetch_max_wait_ms,
            on_worker_loop=settings.consumer_loop == "worker",
            quiet_topics=frozenset({topics.ticks.name}),
        ),
    )
    inputs = raw_topic(app, topics.events.name, topics.ticks.name, partitions=partitions)
    ticks = raw_topic(app, topics.ticks.name, partitions=partitions)
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
        erasure_key=erasure_key(settings),
        # A mass of due closes (a backfill's end, live input after a backlog) is spread over
        # ticks sent at once, so no batch stalls the worker for seconds on them.
        timer_closes_per_batch=TIMER_CLOSES_PER_BATCH,
        faults=(faust_patches.StoreError,),  # a storage fault stops the worker (failstop.py)
    )
    if backfill is not None:
        processor.erasures.learn_markers(backfill.erased)
    runtime = Runtime(
        app,
        processor,
        FaustTable(table),
        topics,
        fence=Fence(
            app,
            session_timeout_s=settings.session_timeout_s,
            ticks_topic=topics.ticks.name,
            on_fenced=processor.note_fenced_batch,
        ),
        gaps=GapFiller(settings.broker, settings.client_kwargs()),
        write_interval_s=settings.state_write_interval_s,
        batch_max=settings.batch_max,
        backfill=backfill,
        ticks=ticks,
        disk=DiskGuard(settings.state_dir, settings.min_free_bytes),
    )
    fence_stale_changelog_records(table, runtime.repair, runtime.table.tap)
    FAIL_STOP.set_aside = lambda partition: faust_patches.set_aside(
        faust_patches.store_path(table, partition), "found corrupt while the worker read it"
    )

    # Every body below stops the worker when an exception escapes it (FAIL_STOP.guarded,
    # streams/runtime/failstop.py): Faust would log it and go on, or restart the agent around
    # a batch whose states were lost.
    guarded = FAIL_STOP.guarded

    @app.agent(inputs, concurrency=1)  # concurrency 1: per-user order
    @guarded("the processing agent")
    async def process(stream: Any) -> None:
        runtime.commit.buffered = lambda: faust_patches.buffered(stream)
        batches = faust_patches.take_batches(
            stream, settings.batch_max, settings.batch_window_s, runtime.commit.holding
        )
        try:
            async for events in batches:
                await runtime.run_batch(events)
        except Exception as exc:  # stopped here: the finally must not write what is held
            FAIL_STOP.stop("the processing agent", exc)
        finally:
            await runtime.stopping()  # what is held, then the last changelog and its acks

    @app.timer(settings.tick_interval_s)
    @guarded("the tick timer")
    async def tick() -> None:
        await runtime.send_ticks()

    @app.task
    @guarded("the lease")
    async def keep_lease() -> None:
        await runtime.fence.lease.keep()

    @app.task
    async def bound_the_stop() -> None:  # from the start: a stop may come at any time
        StopDeadline(lambda: app.should_stop, settings.shutdown_timeout_s).start()

    @app.timer(settings.summary_interval_s)
    @guarded("the summary timer")
    async def summary() -> None:
        runtime.log_summary()

    @table.on_recover
    @guarded("the deadline index's rebuild")
    async def rebuild_deadlines() -> None:
        await runtime.check_restored()  # before any input applies on what was restored
        runtime.rebuild(table)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # faust's signal typing
    @guarded("the partitions' revocation")
    async def forget(app: Any, revoked: set[TP], **_: Any) -> None:
        partitions = [tp.partition for tp in revoked if tp.topic == topics.events.name]
        processor.forget(partitions)
        runtime.revoked(partitions)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def final_summary(app: Any, **_: Any) -> None:
        runtime.log_summary()
        await runtime.gaps.close()

    del (
        process,
        tick,
        keep_lease,
        bound_the_stop,
        summary,
        rebuild_deadlines,
        forget,
        final_summary,
    )  # registered
    return runtime


class Runtime:
    """The agent's and timers' bodies, with what they share. A batch is applied here and
    committed by `BatchCommit` (streams/runtime/commit.py); fencing (`Fence`), positions
    (`Positions`), memory (`GcPolicy`), backfill progress (`Backfill`) and crash tests
    (`KillSwitch`) are parts of their own."""

    def __init__(
        self,
        app: Any,
        processor: Processor,
        table: FaustTable,
        topics: ProductTopics,
        *,
        fence: Fence,
        gaps: GapFiller,
        write_interval_s: float,
        batch_max: int,
        backfill: Backfill | None = None,
        ticks: Any,
        disk: DiskGuard | None = None,
    ) -> None:
        self.app, self.processor, self.table = app, processor, table
        self.disk = disk or DiskGuard(Path("."), 0)
        """The datadir's free space: input waits while it is low."""
        self.backfill = backfill
        self.events_topic = topics.events.name
        self.ticks_topic = topics.ticks.name
        self.positions = Positions(app, processor, self.events_topic, backfill)
        events = self.events_topic
        processor.committed_input = lambda p: faust_patches.committed_offset(
            app.consumer, TP(events, p)
        )  # an expired user is deleted only once its last input is committed
        self.fence = fence
        self.faults = KillSwitch.from_env()
        self.memory = GcPolicy(log)
        self.commit = BatchCommit(
            _FaustHost(app),
            processor,
            table,
            self.fence,
            {
                PREDICTIONS: topics.predictions.name,
                EPISODES: topics.episodes.name,
                DLQ: topics.dlq.name,
            },
            write_interval_s=write_interval_s,
            batch_max=batch_max,
            faults=self.faults,
            progress=None if backfill is None else self._backfill_progress,
        )
        self.repairs: dict[int, set[bytes]] = {}
        self.ticks = ticks
        """The ticks topic (Faust's), which the timer's ticks are sent to."""
        self.gaps = gaps
        self.batch_timers: list[Callable[[float, int], None]] = []
        """Told each batch's seconds and events (`time_batches`)."""
        self._last_summary = (time.monotonic(), 0)

    def time_batches(self, timer: Callable[[float, int], None]) -> None:
        """Call `timer(seconds, events)` after every batch (the lookup API's metrics)."""
        self.batch_timers.append(timer)

    def watch_writes(self, listener: Written) -> None:
        """Tell `listener` every write to the table's local copies (the lookup API's replica):
        the batches' states, restored and standby changelog records."""
        self.table.tap.listener = listener

    async def run_batch(self, events: list[Any]) -> None:
        """One batch, timed for `time_batches`."""
        if not self.batch_timers:
            await self._run_batch(events)
            return
        started = time.perf_counter()
        try:
            await self._run_batch(events)
        finally:
            took = time.perf_counter() - started
            for timer in self.batch_timers:
                timer(took, len(events))

    async def _run_batch(self, events: list[Any]) -> None:
        """Apply a batch and commit it (`BatchCommit.commit`: its outputs handed over now, its
        states written once the broker has them, its events acked once their changelog is).
        Every message is applied, skipped as a duplicate or dead-lettered; none is acked when
        the worker fenced itself (streams/runtime/fencing.py). No events: write what is
        held."""
        commit = self.commit
        if self.disk.low() and not await self._space_for(events):
            return
        generation = self.app.consumer_generation_id  # the group generation it was read in
        if not events:
            await commit.write_held()
            return
        if not await commit.admit(generation, events):
            return
        clock = _StageClock()
        batch = self.processor.batch(self.table)
        messages = [_in_message(event) for event in events]
        self.positions.expect_committed(messages)
        messages = await fill_holes(
            self.gaps, messages, dict(self.processor.next_offset), self.events_topic
        )
        self.processor.note_refetched(self.gaps.filled)
        self.processor.run_batch(batch, messages, self.positions.caught_up, _wall_ms)
        if self.processor.more_due:  # a mass of due closes goes on at once, batch by batch:
            await self.tick_again()  # the next tick travels while this batch is written
        clock.lap("apply")
        # The outputs go out at once (in record batches, streams/runtime/sending.py): a
        # prediction waits for nothing of an earlier batch.
        writes = await commit.commit(batch, events, messages, generation, clock.lap)
        if writes is not None:
            clock.report(len(messages), len(batch.outputs), writes)

    async def _space_for(self, events: list[Any]) -> bool:
        """Wait, applying nothing, until the datadir has space again (`DiskGuard`). False
        when a rebalance or a stop comes first: the batch is then given up unapplied and
        unacked, for whoever owns its partitions next to read again (acked or still in
        flight, Faust's rebalance and stop would wait for it)."""
        try:
            if await self.disk.wait_for_space(lambda: bool(self.app.rebalancing)):
                return True
        except asyncio.CancelledError:
            self.commit.host.abandon(events)
            raise
        self.commit.host.abandon(events)
        return False

    def _backfill_progress(self) -> Progress:
        """As a batch's states are written: what tells the backfill its messages once acked
        (judged by the handled offsets as of now)."""
        backfill = self.backfill
        assert backfill is not None
        next_offset = self.positions.handled_offsets()

        def advance(messages: list[InMessage]) -> None:
            backfill.advance(
                messages, next_offset, self.ticks_topic, self.processor.took_tick_at_end
            )

        return advance

    async def stopping(self) -> None:
        """The agent stops: what is held written, the last changelog and acks awaited."""
        await self.commit.stopping()

    async def finished(self) -> None:
        """Wait until the last batch's changelog is acknowledged and its events acked."""
        await self.commit.finished()

    async def send_ticks(self) -> None:
        """One tick per owned input partition, unless a rebalance or recovery is under way."""
        app = self.app
        self.memory.tick()
        if app.rebalancing or getattr(app, "in_recovery", False):
            return
        if self.backfill is not None:
            await self._check_deleted_input()
        ticks_topic = self.ticks_topic
        await self._tick(
            tp.partition for tp in app.consumer.assignment() if tp.topic == ticks_topic
        )

    async def _check_deleted_input(self) -> None:
        """A backfill whose remaining input the broker deleted (retention) would wait for it
        forever: ask for the log starts of the partitions still behind."""
        assert self.backfill is not None
        behind = self.backfill.behind(self.processor.next_offset)
        owned = {tp.partition for tp in self.app.consumer.assignment()}
        tps = [TP(self.events_topic, p) for p in behind if p in owned]
        if tps:
            starts = await self.app.consumer.earliest_offsets(*tps)
            self.backfill.note_log_starts(
                {tp.partition: offset for tp, offset in starts.items() if offset is not None},
                self.processor.next_offset,
            )

    async def tick_again(self) -> None:
        """A tick now for the partitions whose due episodes the last tick did not all close."""
        owned = {tp.partition for tp in self.app.consumer.assignment()}
        await self._tick(self.processor.take_more_due(owned))

    async def _tick(self, partitions: Iterable[int]) -> None:
        """A tick stamped now to each of `partitions` of the ticks topic."""
        now = _wall_ms()
        for partition in partitions:
            await self.ticks.send(value=encode_tick(now), partition=partition)

    def repair(self, partition: int, key: bytes) -> None:
        """After recovery, write `key` again: the changelog's last record of it is stale."""
        self.repairs.setdefault(partition, set()).add(key)

    def revoked(self, partitions: list[int]) -> None:
        """Partitions lost in a rebalance: after a stall, their local copies are not trusted.
        Held events the agent did not get to write (it writes them before Faust's rebalance
        goes on, unless fenced) are dropped with their states: read again from the committed
        offsets, by whoever owns their partitions now."""
        self.commit.drop_held("the partitions were revoked")
        if self.fence.distrusts_revoked():
            self.table.restore_in_full(partitions)
            log.warning(
                "after a stall, the local copies of partitions %s will be restored in full",
                partitions,
            )

    async def check_restored(self) -> None:
        """Stop (StateNotRestored) when an owned input partition's changelog partition, which
        holds state, was not assigned here (streams/runtime/restored.py)."""
        app, changelog = self.app, self.table.changelog_topic
        owned = [tp.partition for tp in app.consumer.assignment() if tp.topic == self.events_topic]
        active = [tp.partition for tp in app.assignor.assigned_actives() if tp.topic == changelog]
        await check_restored(
            owned, active, lambda ps: self.gaps.end_offsets(changelog, ps), changelog
        )

    def rebuild(self, table: Any) -> None:
        """After recovery: the processor's clocks and deadline index from the table, and the
        users to write again."""
        self.commit.drop_held("recovered")
        consumer, ticks = self.app.consumer, self.ticks_topic
        self.processor.rebuild(
            faust_patches.store_active_items(table),  # checksums verified, corruption raised
            _wall_ms(),
            lambda p: faust_patches.committed_offset(consumer, TP(ticks, p)),
        )
        for partition, keys in self.repairs.items():
            self.processor.write_again(partition, keys)
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
        self.memory.tune()
        self.memory.freeze()
        self.fence.lease.renew()  # a long restore is not a freeze

    def log_summary(self) -> None:
        """The summary line: the rate since the last one, the counters and the lag."""
        now = time.monotonic()
        handled = self.processor.handled()
        since, before = self._last_summary
        rate = (handled - before) / max(now - since, 1e-9)
        self._last_summary = (now, handled)
        log.info(
            "oracular summary: events_per_s=%.0f %s lag=%s",
            rate,
            self.processor.summary(),
            self.positions.lag(),
        )


class _FaustHost:
    """`streams.runtime.commit.Host` over the Faust app: its producer, generation, acks."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def producer(self) -> Any:
        return faust_patches.kafka_producer(self.app)

    def generation(self) -> int:
        return int(self.app.consumer_generation_id)

    def ack(self, events: list[Any]) -> None:
        faust_patches.ack_all(self.app, events)

    def abandon(self, events: list[Any]) -> None:
        faust_patches.abandon(self.app.consumer, events)

    def crashed(self) -> bool:
        return FAIL_STOP.stopping is not None or bool(self.app.crashed)

    async def crash(self, exc: BaseException) -> None:
        FAIL_STOP.stop("the batch commit", exc)


class _StageClock:
    """Times a batch's stages; a batch slower than `SLOW_BATCH_S` is logged with them, so a
    latency spike can be told apart: the engine, the waits for the broker, the states'."""

    SLOW_BATCH_S: Final = 0.25

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.stages: list[tuple[str, float]] = []

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages.append((stage, now - self.last))
        self.last = now

    def report(self, messages: int, outputs: int, writes: int) -> None:
        total = self.last - self.started
        if total >= self.SLOW_BATCH_S:
            log.info(
                "slow batch: %s messages, %s outputs, %s states in %.0f ms (%s)",
                messages,
                outputs,
                writes,
                total * 1000,
                ", ".join(f"{stage} {seconds * 1000:.0f} ms" for stage, seconds in self.stages),
            )


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
    )


def _wall_ms() -> int:
    return int(time.time() * 1000)
