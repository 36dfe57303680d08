"""Consumer delivery: Faust's fetch loop and the offsets it acks and commits (patched).
`Consumer._drain_messages`, `_add_gap` and `_new_offset` of faust-streaming 0.15.3, fixed.

faust-streaming 0.15.3 (with aiokafka 0.14.0) loses input around rebalances. Its fetch loop
(`Consumer._drain_messages`) keeps `_read_offset` per partition and drops every fetched record
below it. `seek` and `perform_seek` store the *next offset to read* there, the loop stores the
*last offset delivered*, and the loop writes it after awaiting each delivery, even when a seek
or a revocation happened meanwhile: when the consumer re-reads from the committed offset, the
records in between are dropped as if delivered. The loop also marks forward jumps as acked
("gaps") one offset too far (including the record it is about to deliver), and the commit path
(`_new_offset`, with `_add_gap`) commits past an unacked record at the head of a partition
(upstream issue #606; its fix, PR #707, is not merged). Each function here is a copy of the
0.15.3 method changed as little as the fix needs; its docstring says what changed and why.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any, cast

from faust.transport import consumer as consumer_module
from faust.transport.consumer import CONSUMER_FETCHING, Consumer
from faust.types import TP

from streams.faust.internals import _fetched_after_seeks, _keep_delivered_positions


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
