"""The Faust app: topics, the state table, the agent, the timer and the summary log.

Run it with `oracular worker --config FILE` (or `faust -A streams.runtime.app worker`, reading the
`ORACULAR_*` environment variables of `streams/settings/`).

The agent is thin: it takes a batch of messages (input and ticks, co-partitioned), lets
`streams.runtime.processor.Processor` decide everything, then:
1. publishes the batch's outputs; the broker's acknowledgement is awaited by the next batch,
   after it applied (or by an empty batch when no input waits), so the round trip overlaps it;
2. once the broker has them all, writes each changed user's state once (one changelog record
   per user per batch; while a backlog waits, once for the batches applied within
   `ORACULAR_STATE_WRITE_INTERVAL_S`);
3. once the changelog records are acknowledged, acks the batch's messages, so their offsets
   may be committed.
In that order, a stored state that records an input as applied implies its outputs were
delivered, so skipping redelivered inputs (offset <= the user's last applied offset) never
loses an output; a crash before (2) re-applies the batch and re-sends outputs with the same ids.
Messages are taken a batch at a time and acked by hand (`faust_patches.take_batches`): a batch
interrupted by a crash or shutdown is never committed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, NoReturn

import faust
from faust.types import TP

from engine import EngineConfig
from schemas.config import load_config
from schemas.ticks import encode_tick
from streams.faust import patches as faust_patches  # applied on import: every worker runs patched
from streams.runtime.backfill import Backfill
from streams.runtime.datadir import DatadirError
from streams.runtime.datadir import prepare as prepare_datadir
from streams.runtime.faults import KillSwitch
from streams.runtime.fencing import Fence, FrozenWhileWriting
from streams.runtime.gapfill import GapFiller, fill_holes
from streams.runtime.memory import GcPolicy
from streams.runtime.positions import Positions
from streams.runtime.processor import DLQ, EPISODES, PREDICTIONS, InMessage, Processor, TimePolicy
from streams.runtime.sending import Sent, acknowledged, hand_over
from streams.runtime.state_table import FaustTable, fence_stale_changelog_records
from streams.settings import ROCKSDB_OPTIONS, Settings, describe, settings_from_env
from streams.settings.exits import EXIT_USAGE
from streams.settings.topics import STATE_TABLE

log = logging.getLogger("oracular.worker")

PRODUCER_BATCH_BYTES: Final = 256 * 1024
"""Largest record batch the worker fills per partition (Faust's default is 16 KiB). A write of
a backlog's held states (a few thousand changelog records of 1-2 KiB) came to dozens of
batches per partition, and aiokafka hands a partition's next batch over only once the one
before it is on its way: a write of 4,000 states spent 150 ms in those waits. Well below the
broker's 1 MiB limit on a record batch (`message.max.bytes`)."""
TIMER_CLOSES_PER_BATCH: Final = 1_500
"""The longest a mass close holds input up: a batch of 1,500 timer closes takes about 0.1 s
(closes 28 µs each, their states' encoding 20 µs each, outputs and changelog; BENCHMARKS.md)."""


def raw_topic(app: Any, *names: str, partitions: int, internal: bool = False) -> Any:
    """A Faust topic of raw bytes keys and values: every byte goes through `schemas/`."""
    return app.topic(
        *names,
        schema=faust_patches.RawSchema(),
        partitions=partitions,
        internal=internal,
    )


class _TransientCoordinatorErrors(logging.Filter):
    """aiokafka logs a retriable "Group Coordinator Request failed" at ERROR; a fresh broker
    answers so while it creates its offsets topic, and aiokafka retries at once. INFO, then:
    an ERROR line in a healthy first start sends people looking for a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno == logging.ERROR
            and str(record.msg).startswith("Group Coordinator Request failed")
            and record.args
            and getattr(
                record.args[0] if isinstance(record.args, tuple) else None, "retriable", False
            )
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg += " (retrying)"
        return True


def quiet_transient_coordinator_errors() -> None:
    """Install _TransientCoordinatorErrors on aiokafka's group coordinator logger (once)."""
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    if not any(isinstance(f, _TransientCoordinatorErrors) for f in logger.filters):
        logger.addFilter(_TransientCoordinatorErrors())


def create_app(
    settings: Settings, config: EngineConfig, backfill: Backfill | None = None
) -> faust.App:
    """Build the worker's Faust app for `settings` and the engine `config`.

    With `backfill`, inputs at or past its stop offsets are not applied and `backfill.done`
    is called when the end is reached.
    """
    quiet_transient_coordinator_errors()
    topics = settings.topics
    try:  # private (0700), and this app's: refuse another app's state (streams/runtime/datadir.py)
        prepare_datadir(settings.state_dir, settings.app_id, topics.events.name)
    except DatadirError as exc:
        print(f"oracular worker: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from exc
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

    app.fetch_max_wait_ms = settings.fetch_max_wait_ms  # type: ignore[attr-defined]  # faust_patches
    # The consumer runs on this loop, not in Faust's thread, unless told (faust_patches).
    app.consumer_on_worker_loop = settings.consumer_loop == "worker"  # type: ignore[attr-defined]
    # Ticks alone do not keep the consumer's fetches short (faust_patches): an idle worker
    # fetches twice a second, not 500 times.
    app.fetch_quiet_topics = {topics.ticks.name}  # type: ignore[attr-defined]  # faust_patches
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
        # A mass of due closes (a backfill's end, live input after a backlog) is spread over
        # ticks sent at once, so no batch stalls the worker for seconds on them.
        timer_closes_per_batch=TIMER_CLOSES_PER_BATCH,
    )
    runtime = _Runtime(
        app, processor, FaustTable(table), outputs, settings, ticks=ticks, backfill=backfill
    )
    fence_stale_changelog_records(table, runtime.repair)
    app.oracular = runtime  # type: ignore[attr-defined]  # for tests and web views
    if (
        backfill is None
    ):  # the lookup API, health and metrics (streams/lookup/api.py, docs/serving.md)
        from streams.lookup.api import install_serving  # noqa: PLC0415 - aiohttp only in workers

        install_serving(app, runtime)

    @app.agent(inputs, concurrency=1)  # concurrency 1: per-user order
    async def process(stream: Any) -> None:
        runtime.buffered = lambda: faust_patches.buffered(stream)
        batches = faust_patches.take_batches(
            stream, settings.batch_max, settings.batch_window_s, lambda: bool(runtime.held)
        )
        try:
            async for events in batches:
                await runtime.run_batch(events)
        finally:
            await runtime.stopping()  # what is held, then the last changelog and its acks

    @app.timer(settings.tick_interval_s)
    async def tick() -> None:
        await runtime.send_ticks()

    @app.task
    async def keep_lease() -> None:
        await runtime.fence.lease.keep()

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
    """The agent's and timers' bodies, with what they share. Batch application is here;
    fencing (`Fence`), positions (`Positions`), memory (`GcPolicy`), backfill progress
    (`Backfill`) and crash tests (`KillSwitch`) are parts of their own."""

    def __init__(
        self,
        app: Any,
        processor: Processor,
        table: FaustTable,
        outputs: dict[str, str],
        settings: Settings,
        *,
        ticks: Any,
        backfill: Backfill | None = None,
    ) -> None:
        self.app, self.processor, self.table = app, processor, table
        self.settings = settings
        self.output_names = outputs
        self.backfill = backfill
        self.events_topic = settings.topics.events.name
        self.positions = Positions(app, processor, self.events_topic, backfill)
        self.fence = Fence(app, settings, processor.counts)
        self.faults = KillSwitch.from_env()
        self.memory = GcPolicy(log)
        self.repairs: dict[int, set[bytes]] = {}
        self.ticks = ticks
        """The ticks topic (Faust's), which the timer's ticks are sent to."""
        self.gaps = GapFiller(settings.broker, settings.client_kwargs())
        self._finishing: asyncio.Future[None] | None = None
        """The last batch's `_finish`, while its changelog records are on their way."""
        self._outputs: Sent = []
        """The last batch's outputs, handed to the producer: its states (held) are written
        once the broker has them all (`_outputs_delivered`)."""
        self.held: list[Any] = []
        """Events of applied batches whose states are not written yet (`_may_defer`): acked
        once they are, with the messages they came as (a backfill's progress)."""
        self._held_messages: list[InMessage] = []
        self._held_since = 0.0
        self._held_generation: int | None = None
        self.buffered: Callable[[], int] = lambda: 0
        """Events waiting in the agent's buffer (set by the agent)."""
        self._last_summary = (time.monotonic(), 0)

    async def run_batch(self, events: list[Any]) -> None:
        """Apply a batch and hand its outputs to the producer; its states are written once
        the broker has the outputs, which the next batch (or, when none comes at once, an
        empty one) waits for after applying, so the round trip overlaps the next batch's
        window and apply. The changelog's delivery is finished by a task (`_finish`), which
        acks the events then. While a backlog waits, the states of a few batches are written
        together instead (`_may_defer`). Every message is applied, skipped as a duplicate or
        dead-lettered; none is acked when the worker fenced itself (streams/runtime/fencing.py). No
        events: write what is held."""
        fence = self.fence
        generation = self.app.consumer_generation_id  # the group generation it was read in
        if not events:
            await self.write_held()
            return
        if fence.dropping(generation, events):
            await self.finished()
            return
        clock = _StageClock()
        batch = self.processor.batch(self.table)
        messages = [_in_message(event) for event in events]
        self.positions.expect_committed(messages)
        messages = await fill_holes(
            self.gaps, messages, dict(self.processor.next_offset), self.events_topic
        )
        self.processor.counts["refetched"] = self.gaps.filled
        self.processor.run_batch(batch, messages, self.positions.caught_up, _wall_ms)
        if self.processor.more_due:  # a mass of due closes goes on at once, batch by batch:
            await self.tick_again()  # the next tick travels while this batch is written
        clock.lap("apply")
        # The outputs go out at once (in record batches, streams/runtime/sending.py): a prediction
        # waits for nothing of an earlier batch. The fence is asked first, as before any
        # write: a worker frozen long enough to have lost its partitions sends nothing.
        if not await fence.may_write(generation):
            self._fenced(generation, events)
            return
        producer = faust_patches.kafka_producer(self.app)
        names = self.output_names
        sending = await hand_over(
            producer, [(names[o.role], None, o.key, o.value) for o in batch.outputs]
        )
        clock.lap("outputs")
        # The previous changelog was on its way while this batch applied (it read those states
        # from the cache and the store, written before). It must be acknowledged before this
        # batch may write states: the fence's checks below cover the time since its records
        # were queued only when nothing of them is still on the way.
        try:
            await self.finished()
            clock.lap("previous changelog")
            if not await fence.may_write(generation):
                _forget(sending)
                self._fenced(generation, events)
                return
            # The previous batch's outputs travelled meanwhile: once the broker has them, the
            # states held so far may be written (now, or with later ones while a backlog
            # waits).
            await self._outputs_delivered()
        except BaseException:
            _forget(sending)  # the worker stops or fences itself: whoever re-applies re-sends
            raise
        writes = 0
        if self.held and not self._may_defer(generation):
            writes = await self._write(generation)
        clock.lap("states")
        # The batch's states are held from now on (the next batch reads them), but written only
        # once every output is acknowledged: a failed delivery stops the worker before any
        # state records the inputs as applied (`_outputs_delivered`).
        self._outputs = sending
        self.processor.hold(batch)
        if not self.held:
            self._held_since, self._held_generation = time.monotonic(), generation
        self.held.extend(events)
        self._held_messages.extend(messages)
        if not self._may_defer(generation):
            # While the outputs travel, encode the states that will be written with them.
            self.processor.encode(batch)
        clock.lap("held")
        clock.report(len(messages), len(batch.outputs), writes)

    async def _outputs_delivered(self) -> None:
        """Wait until the broker has the last batch's outputs. A failed delivery stops the
        worker: the held states are dropped unwritten and nothing held is acked, so a restart
        reads their inputs again and sends their outputs with the same ids."""
        sent, self._outputs = self._outputs, []
        if not sent:
            return
        try:
            await acknowledged(sent)
        except Exception as exc:
            self._drop_held("an output was not delivered")
            log.critical(
                "an output was not delivered (%s: %s): stopping the worker. Nothing held is "
                "acknowledged; on restart the inputs are redelivered and the outputs sent again",
                type(exc).__name__,
                exc,
            )
            await self.app.crash(exc)
            raise
        self.faults.reached("outputs")

    def _may_defer(self, generation: int) -> bool:
        """True when the held states may wait for a later batch: a full batch waits in the
        buffer (a backlog: the next batch follows at once), the oldest held state is younger
        than `ORACULAR_STATE_WRITE_INTERVAL_S`, and fewer than half the cache's users are
        unwritten. A user changed in several of those batches is then written once, one
        changelog record instead of one per batch. At live rates a batch writes its own
        states as it always did: holding them whenever a few events had arrived meanwhile
        made writes of seconds' worth of states that held the loop up for 100 ms (p99 at half
        load 61-73 ms against 30-31, BENCHMARKS.md)."""
        interval = self.settings.state_write_interval_s
        cache = self.processor.cache
        now = time.monotonic()
        # Asked before a batch's states are held too (nothing held yet: they would be the first).
        held_generation, since = (
            (self._held_generation, self._held_since) if self.held else (generation, now)
        )
        return (
            interval > 0
            and generation == held_generation
            and self.buffered() >= self.settings.batch_max
            and now - since < interval
            and len(cache.unwritten) < cache.limit // 2
        )

    async def write_held(self) -> None:
        """Write the held states once their outputs are delivered, and then ack their events
        (the buffer ran dry, a rebalance waits for the acks, or the worker stops)."""
        await self.finished()
        await self._outputs_delivered()
        if self.held:
            await self._write(self.app.consumer_generation_id)

    async def _write(self, generation: int) -> int:
        """Write the held users' states and send their changelog records; a task acks the
        held events once the broker has them all. Nothing is written (and the events are
        dropped for their partitions' owners to read again) when the worker may not write
        for `generation`, or the events were read in another one. Returns the states
        written."""
        fence = self.fence
        if generation != self._held_generation:  # (a rebalance drops them: never here)
            self._drop_held("a new consumer generation")
            return 0
        if not await fence.may_write(generation):
            self._fenced(generation, [])
            return 0
        events, messages = self.held, self._held_messages
        self.held, self._held_messages = [], []
        writes = self.processor.unwritten_writes()
        self.table.set_all(writes)
        self.faults.reached("stored")
        # The next batch reads these states from the cache. Should their changelog records
        # not be delivered, the worker stops (`_changelog_failed`) before it acks anything.
        self.processor.written()
        try:
            sent = await self.table.send_changelog(
                faust_patches.kafka_producer(self.app), writes, lambda: fence.confirm(generation)
            )
        except Exception as exc:
            await self._changelog_failed(exc, writes)
        if writes:
            self.faults.reached("handed")
        self._finishing = asyncio.ensure_future(
            self._finish(
                events, sent, writes, messages, self._handled_offsets(), generation=generation
            )
        )
        return len(writes)

    def _handled_offsets(self) -> dict[int, int]:
        """What a backfill's progress and end are judged by, as of this batch."""
        if self.backfill is None:
            return {}  # unused
        return self.positions.handled_offsets()

    async def stopping(self) -> None:
        """The agent stops: write what is held (unless the worker crashed: its inputs are read
        again), then wait for the last changelog and acks."""
        if self.held and not self.app.crashed:
            try:
                await self.write_held()
            except Exception as exc:  # stopping regardless: the inputs are read again
                log.warning("held states not written at shutdown (%s: %s)", type(exc).__name__, exc)
        await self.finished()

    async def finished(self) -> None:
        """Wait until the last batch's changelog is acknowledged and its events acked (raises
        what a failed delivery raised): before the next batch writes, and at the end."""
        finishing, self._finishing = self._finishing, None
        if finishing is not None:
            await finishing

    async def _finish(
        self,
        events: list[Any],
        sent: Sent,
        writes: list[tuple[bytes, bytes, Any]],
        messages: list[InMessage],
        next_offset: dict[int, int],
        *,
        generation: int,
    ) -> None:
        """A batch's last step: its changelog acknowledged, then its events acked."""
        try:
            # Every changelog record acknowledged before the inputs are: a restore from the
            # changelog can never fall behind the committed offsets.
            # Evicted (frozen) while the records were on their way? Then they may have landed
            # after a new owner's: nothing of them is acked, and their offsets are not stored
            # locally.
            await self.table.changelog_acknowledged(sent, lambda: self.fence.confirm(generation))
        except Exception as exc:
            await self._changelog_failed(exc, writes)
        self.faults.reached("changelog")
        faust_patches.ack_all(self.app, events)
        self.faults.reached("acked")
        if self.backfill is not None:
            self.backfill.advance(
                messages,
                next_offset,
                self.settings.topics.ticks.name,
                self.processor.ticks_left_due,
            )

    async def _changelog_failed(
        self, exc: Exception, writes: list[tuple[bytes, bytes, Any]]
    ) -> NoReturn:
        """A batch's changelog records may not all be on the broker: repair and exit after a
        freeze (streams/runtime/fencing.py), else stop the worker with nothing of the batch
        acked."""
        if isinstance(exc, FrozenWhileWriting):
            await self.fence.leave_repairs(writes, exc.stalled_s)
        log.critical(
            "a state's changelog record was not delivered (%s: %s): stopping the worker. "
            "Nothing of this batch is acknowledged; on restart its inputs are redelivered "
            "and the states written again",
            type(exc).__name__,
            exc,
        )
        await self.app.crash(exc)
        raise exc

    async def send_ticks(self) -> None:
        """One tick per owned input partition, unless a rebalance or recovery is under way."""
        app = self.app
        self.memory.tick()
        if app.rebalancing or getattr(app, "in_recovery", False):
            return
        if self.backfill is not None:
            await self._check_deleted_input()
        ticks_topic = self.settings.topics.ticks.name
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
        await self._tick(sorted(self.processor.more_due & owned))
        self.processor.more_due.clear()

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
        self._drop_held("the partitions were revoked")
        if self.fence.distrusts_revoked():
            self.table.restore_in_full(partitions)
            log.warning(
                "after a stall, the local copies of partitions %s will be restored in full",
                partitions,
            )

    def _fenced(self, generation: int, events: list[Any]) -> None:
        """The worker may not write for `generation`: drop `events` and the held ones, with
        the held states, unwritten and unacked (streams/runtime/fencing.py)."""
        self.processor.drop_unwritten()
        self._forget_outputs()
        self.fence.drop(generation, self.held + events)
        self.held, self._held_messages = [], []

    def _forget_outputs(self) -> None:
        """Stop waiting for the last batch's outputs (their states are dropped: whoever
        applies the inputs again sends them again, with the same ids)."""
        _forget(self._outputs)
        self._outputs = []

    def _drop_held(self, why: str) -> None:
        dropped = self.processor.drop_unwritten()
        self._forget_outputs()
        if self.held:
            log.warning(
                "%s with %s input(s) applied whose %s state(s) were not written: they are "
                "read again from the committed offsets",
                why,
                len(self.held),
                dropped,
            )
            faust_patches.abandon(self.app.consumer, self.held)
            self.held, self._held_messages = [], []

    def rebuild(self, table: Any) -> None:
        """After recovery: the processor's clocks and deadline index from the table, and the
        users to write again."""
        self._drop_held("recovered")
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


def _forget(sent: Sent) -> None:
    """Stop waiting for record batches handed to the producer (their errors are retrieved, so
    asyncio does not report them as never retrieved)."""
    for _, _, _, future in sent:
        future.add_done_callback(_retrieved)


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Take a forgotten delivery's outcome, so asyncio does not report it as never retrieved."""
    if not future.cancelled():
        future.exception()


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
    """The app `faust -A streams.runtime.app` and `oracular worker` run: settings from
    ORACULAR_*."""
    settings = settings_from_env()
    config = load_config(settings.config_path)
    log.info("oracular worker settings:\n%s", describe(settings))
    return create_app(settings, config)


def __getattr__(name: str) -> Any:
    """`streams.runtime.app.app`, built from the environment on first use (for `faust -A
    streams.runtime.app`)."""
    if name == "app":
        built = app_from_env()
        globals()["app"] = built
        return built
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
