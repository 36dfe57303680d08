"""Recovery: input resumed only after it is sought, changelog records never cleared (patched).
`Recovery.on_recovery_completed` and `TableManager.changelog_queue` of faust-streaming 0.15.3.

Upstream resumes the input partitions before seeking them to the committed offsets, so records
are delivered from the old position, the stream buffers are then cleared, and the fetch loop has
already moved past them (streams/faust/delivery.py). The changelog records on their way to a
restore are cleared the same way, after the consumer has read past them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from mode.utils.queues import ThrowableQueue


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


def _changelog_queue(self: TableManager) -> ThrowableQueue:
    """`TableManager.changelog_queue` of 0.15.3, the queue from the consumer to the restore
    (`Recovery._slurp_changelogs`), made without `clear_on_resume`.

    Upstream's queue is cleared by flow control on every revocation (`flow_control.clear`)
    and every resume (`flow_control.resume`), though the consumer has already read past the
    records in it. A record delivered after the clear (a fetch in flight) is applied, the
    partition's persisted offset moves past the cleared ones, and the next restore starts
    after them; a clear right after a restore's seek drops the records fetched since, and the
    restore goes on from the ones after. Either way the local copy misses changelog records
    for good, and its owner applies input to stale states and writes them back (a failover run
    with two rebalances during one restore: 238 users of 2,263). Kept, the queue holds each
    partition's records in the order fetched; the restore skips a record at or below the last
    offset it saw, so a re-read after a seek is not applied twice, and a partition revoked
    meanwhile gets its records applied in order to the local copy Faust keeps anyway.
    """
    if self._changelog_queue is None:
        _quiet_revoked_changelog_records()
        self._changelog_queue = self.app.FlowControlQueue(
            maxsize=self.app.conf.stream_buffer_maxsize,
            clear_on_resume=False,
        )
    return self._changelog_queue


class _RevokedChangelogRecords(logging.Filter):
    """Kept in the queue, records fetched for a changelog partition just revoked reach the
    restore after the revocation, which logs each at WARNING ("recovery unknown topic") and
    applies it in order to that partition's local copy. Expected at every rebalance now, and
    thousands a time: DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and str(record.msg).startswith(
            "recovery unknown topic"
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def _quiet_revoked_changelog_records() -> None:
    """Install _RevokedChangelogRecords on Faust's recovery logger (once)."""
    logger = logging.getLogger("faust.tables.recovery")
    if not any(isinstance(f, _RevokedChangelogRecords) for f in logger.filters):
        logger.addFilter(_RevokedChangelogRecords())
