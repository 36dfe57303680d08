"""The batch commit protocol: what makes "nothing lost, live = replay" true.

`BatchCommit` takes each applied batch from its outputs to its acknowledged inputs, in one
order, with the fence asked before every write. The runtime (`streams/runtime/app.py`) applies
the batch and hands it here; the Faust side reaches it only through `Host`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, Protocol

from streams.runtime.faults import KillSwitch
from streams.runtime.fencing import FrozenWhileWriting
from streams.runtime.processor import Batch, InMessage, Processor, StateWrite
from streams.runtime.sending import Sent, acknowledged, forget, hand_over

log = logging.getLogger("oracular.worker")

Progress = Callable[[list[InMessage]], None]
"""Told the messages of each batch once they are acked (a backfill's progress)."""


class Host(Protocol):
    """What the commit needs of the app it runs in (the Faust app, or a test's fake)."""

    def producer(self) -> Any:
        """The Kafka producer records are handed to (`streams.runtime.sending`)."""

    def generation(self) -> int:
        """The consumer group generation messages are read in now."""

    def ack(self, events: list[Any]) -> None:
        """Acknowledge `events`: their offsets may be committed."""

    def abandon(self, events: list[Any]) -> None:
        """Give `events` up unacknowledged: the partitions' owners read them again."""

    def crashed(self) -> bool:
        """True once the worker crashed."""

    async def crash(self, exc: BaseException) -> None:
        """Stop the worker because of `exc`."""


class StateWriter(Protocol):
    """The state table as the commit writes it (`streams.runtime.state_table.FaustTable`)."""

    def set_all(self, writes: list[StateWrite]) -> None: ...

    async def send_changelog(
        self,
        producer: Any,
        writes: list[StateWrite],
        before_sending: Callable[[], Awaitable[None]],
    ) -> Any: ...

    async def changelog_acknowledged(
        self, sent: Any, before_persisting: Callable[[], Awaitable[None]]
    ) -> None: ...


class Fencing(Protocol):
    """The fence as the commit asks it (`streams.runtime.fencing.Fence`)."""

    def dropping(self, generation: int, events: list[Any]) -> bool: ...

    def drop(self, generation: int, events: list[Any]) -> list[Any]: ...

    async def may_write(self, generation: int) -> bool: ...

    async def confirm(self, generation: int) -> None: ...

    async def leave_repairs(self, writes: list[StateWrite], stalled_s: float) -> NoReturn: ...


class BatchCommit:
    """One applied batch at a time, from its outputs to its acknowledged inputs.

    The steps, in order, and the invariant each keeps:

    1. **Outputs handed over** (`commit`): the fence is asked first; a worker that may not
       write for the batch's generation sends nothing. *No output leaves a fenced worker.*
    2. **Outputs acknowledged** (by the next `commit`, after it applied, or `write_held`):
       the states the batch changed are staged, not written, until the broker has every
       output. *A stored state that records an input as applied implies its outputs were
       delivered*, so skipping redelivered inputs never loses an output.
    3. **States written** (the local store, then the changelog records handed over): only
       after the previous batch's changelog is acknowledged and the fence is asked again.
       While a backlog waits, the states of a few batches are held and written together
       (at most `write_interval_s` old, and before half the cache is unwritten). *The
       changelog never runs ahead of the outputs, and a user changed in several held batches
       is one record.*
    4. **Changelog acknowledged** (a task: `finished` waits for it): the fence confirms the
       worker was not evicted while the records travelled. *A restore from the changelog can
       never fall behind the committed offsets.*
    5. **Inputs acked**: only now may their offsets be committed. *A crash anywhere before
       re-applies the batch and re-sends its outputs with the same ids.*

    Failure paths: an output not delivered, or a changelog record not delivered, stops the
    worker (`Host.crash`) with nothing of the batch (nor anything held) acked; a fenced
    generation drops the batch and everything held, unwritten and unacked
    (streams/runtime/fencing.py); a frozen worker whose changelog may have landed after a new
    owner's sends repair ticks and exits (`Fence.leave_repairs`).
    """

    def __init__(
        self,
        host: Host,
        processor: Processor,
        table: StateWriter,
        fence: Fencing,
        outputs: Mapping[str, str],
        *,
        write_interval_s: float,
        batch_max: int,
        faults: KillSwitch | None = None,
        progress: Callable[[], Progress] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Commit batches the `processor` applied, writing `table`, asking `fence`.

        `outputs`: output role -> topic name. `write_interval_s`: how long states may be
        held while a backlog waits (0: never held); `batch_max`: a full batch (the buffer
        holds a backlog when at least this many events wait). `progress()`, called as a
        batch's states are written, gives what is told its messages once they are acked.
        """
        self.host, self.processor, self.table, self.fence = host, processor, table, fence
        self.outputs = dict(outputs)
        self.write_interval_s, self.batch_max = write_interval_s, batch_max
        self.faults = faults or KillSwitch(None, 0)
        self.progress = progress
        self.clock = clock
        self.buffered: Callable[[], int] = lambda: 0
        """Events waiting in the agent's buffer (set by the agent)."""
        self._finishing: asyncio.Future[None] | None = None
        """The last batch's changelog acknowledgement and acks, while on their way."""
        self._outputs: Sent = []
        """The last batch's outputs, handed to the producer, not yet acknowledged."""
        self._held: list[Any] = []
        self._held_messages: list[InMessage] = []
        self._held_since = 0.0
        self._held_generation: int | None = None

    @property
    def held(self) -> tuple[Any, ...]:
        """Events of applied batches whose states are not written yet."""
        return tuple(self._held)

    def holding(self) -> bool:
        """True while events are held (the agent then takes an empty batch when its buffer
        runs dry, to write them)."""
        return bool(self._held)

    async def admit(self, generation: int, events: list[Any]) -> bool:
        """False (the events given up) when a batch read in `generation` was already fenced:
        nothing of it may be applied."""
        if self.fence.dropping(generation, events):
            await self.finished()
            return False
        return True

    async def commit(
        self,
        batch: Batch,
        events: list[Any],
        messages: list[InMessage],
        generation: int,
        lap: Callable[[str], None] = lambda _: None,
    ) -> int | None:
        """Steps 1-3 for an applied `batch` of `events` (read in `generation`): hand its
        outputs over, write what is held once the previous outputs and changelog are
        acknowledged (unless it may wait), then hold this batch's states. Returns the states
        written, or None when the fence dropped the batch. `lap(stage)` marks each stage."""
        fence = self.fence
        if not await fence.may_write(generation):
            self._fenced(generation, events)
            return None
        names = self.outputs
        sending = await hand_over(
            self.host.producer(), [(names[o.role], None, o.key, o.value) for o in batch.outputs]
        )
        lap("outputs")
        # The previous changelog was on its way while this batch applied (it read those states
        # from the cache and the store, written before). It must be acknowledged before this
        # batch may write states: the fence's checks below cover the time since its records
        # were queued only when nothing of them is still on the way.
        try:
            await self.finished()
            lap("previous changelog")
            if not await fence.may_write(generation):
                forget(sending)
                self._fenced(generation, events)
                return None
            # The previous batch's outputs travelled meanwhile: once the broker has them, the
            # states held so far may be written (now, or with later ones while a backlog
            # waits).
            await self._outputs_delivered()
        except BaseException:
            forget(sending)  # the worker stops or fences itself: whoever re-applies re-sends
            raise
        writes = 0
        if self._held and not self._may_defer(generation):
            writes = await self._write(generation)
        lap("states")
        # The batch's states are held from now on (the next batch reads them), but written only
        # once every output is acknowledged: a failed delivery stops the worker before any
        # state records the inputs as applied (`_outputs_delivered`).
        self._outputs = sending
        if not self._held:
            self._held_since, self._held_generation = self.clock(), generation
        self._held.extend(events)
        self._held_messages.extend(messages)
        # While the outputs travel, encode the states that will be written with them.
        self.processor.stage(batch, encode=lambda: not self._may_defer(generation))
        lap("held")
        return writes

    async def write_held(self) -> None:
        """Write the held states once their outputs are delivered, and then ack their events
        (the buffer ran dry, a rebalance waits for the acks, or the worker stops)."""
        await self.finished()
        await self._outputs_delivered()
        if self._held:
            await self._write(self.host.generation())

    async def stopping(self) -> None:
        """The agent stops: write what is held (unless the worker crashed: its inputs are read
        again), then wait for the last changelog and acks."""
        if self._held and not self.host.crashed():
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

    def drop_held(self, why: str) -> None:
        """Drop the held events with their states, unwritten and unacked (a rebalance, a
        recovery): they are read again from the committed offsets."""
        dropped = self.processor.discard()
        self._forget_outputs()
        if self._held:
            log.warning(
                "%s with %s input(s) applied whose %s state(s) were not written: they are "
                "read again from the committed offsets",
                why,
                len(self._held),
                dropped,
            )
            self.host.abandon(self._held)
            self._held, self._held_messages = [], []

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
            self.drop_held("an output was not delivered")
            log.critical(
                "an output was not delivered (%s: %s): stopping the worker. Nothing held is "
                "acknowledged; on restart the inputs are redelivered and the outputs sent again",
                type(exc).__name__,
                exc,
            )
            await self.host.crash(exc)
            raise
        self.faults.reached("outputs")

    def _may_defer(self, generation: int) -> bool:
        """True when the held states may wait for a later batch: a full batch waits in the
        buffer (a backlog: the next batch follows at once), the oldest held state is younger
        than the write interval, and fewer than half the cache's users are unwritten. A user
        changed in several of those batches is then written once, one changelog record
        instead of one per batch. At live rates a batch writes its own states: holding them
        whenever a few events had arrived meanwhile made writes of seconds' worth of states
        that held the loop up (BENCHMARKS.md)."""
        cache = self.processor.cache
        now = self.clock()
        # Asked before a batch's states are held too (nothing held yet: they would be the first).
        held_generation, since = (
            (self._held_generation, self._held_since) if self._held else (generation, now)
        )
        return (
            self.write_interval_s > 0
            and generation == held_generation
            and self.buffered() >= self.batch_max
            and now - since < self.write_interval_s
            and self.processor.staged() < cache.limit // 2
        )

    async def _write(self, generation: int) -> int:
        """Write the held users' states and send their changelog records; a task acks the
        held events once the broker has them all. Nothing is written (and the events are
        dropped for their partitions' owners to read again) when the worker may not write
        for `generation`, or the events were read in another one. Returns the states
        written."""
        fence = self.fence
        if generation != self._held_generation:  # (a rebalance drops them: never here)
            self.drop_held("a new consumer generation")
            return 0
        if not await fence.may_write(generation):
            self._fenced(generation, [])
            return 0
        events, messages = self._held, self._held_messages
        self._held, self._held_messages = [], []

        def store(writes: list[StateWrite]) -> None:
            self.table.set_all(writes)
            self.faults.reached("stored")

        # The next batch reads these states from the cache. Should their changelog records
        # not be delivered, the worker stops (`_changelog_failed`) before it acks anything.
        writes = self.processor.commit(store)
        try:
            sent = await self.table.send_changelog(
                self.host.producer(), writes, lambda: fence.confirm(generation)
            )
        except Exception as exc:
            await self._changelog_failed(exc, writes)
        if writes:
            self.faults.reached("handed")
        progress = None if self.progress is None else self.progress()
        self._finishing = asyncio.ensure_future(
            self._finish(events, sent, writes, messages, progress, generation=generation)
        )
        return len(writes)

    async def _finish(
        self,
        events: list[Any],
        sent: Any,
        writes: list[StateWrite],
        messages: list[InMessage],
        progress: Progress | None,
        *,
        generation: int,
    ) -> None:
        """A batch's last steps: its changelog acknowledged, then its events acked."""
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
        self.host.ack(events)
        self.faults.reached("acked")
        if progress is not None:
            progress(messages)

    async def _changelog_failed(self, exc: Exception, writes: list[StateWrite]) -> NoReturn:
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
        await self.host.crash(exc)
        raise exc

    def _fenced(self, generation: int, events: list[Any]) -> None:
        """The worker may not write for `generation`: drop `events` and the held ones, with
        the held states, unwritten and unacked (streams/runtime/fencing.py)."""
        self.processor.discard()
        self._forget_outputs()
        self.fence.drop(generation, self._held + events)
        self._held, self._held_messages = [], []

    def _forget_outputs(self) -> None:
        """Stop waiting for the last batch's outputs (their states are dropped: whoever
        applies the inputs again sends them again, with the same ids)."""
        forget(self._outputs)
        self._outputs = []
