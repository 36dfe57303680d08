"""The per-user state table as the processor sees it: Faust's RocksDB table, read and written
one user at a time on the right partition, its changelog written per batch.

Faust keeps a table in one RocksDB database per partition plus a compacted changelog topic it
restores from. The worker writes the local store and sends the changelog records itself, once
per user per batch (`FaustTable.send_changelog`), and restores skip records older than the
state they already hold (`fence_stale_changelog_records`), so a late write by a worker that
had lost its partitions can never move a user back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faust.types import TP

from schemas.stored import stored_version
from streams.faust import patches as faust_patches
from streams.runtime.failstop import FAIL_STOP
from streams.runtime.processor import Table
from streams.runtime.sending import Sent, acknowledged, hand_over, no_check

log = logging.getLogger("oracular.worker")


Written = Callable[[int, Sequence[tuple[bytes, bytes | None]]], None]
"""Told each write to a local copy: (partition, [(key, value; None for a deletion)])."""


class WriteTap:
    """Where the writes to the table's local copies are told (the lookup API's replica,
    `streams.lookup.replica.Feed`): the worker's batches, restored and standby records."""

    def __init__(self) -> None:
        self.listener: Written | None = None

    def __call__(self, partition: int, items: Sequence[tuple[bytes, bytes | None]]) -> None:
        if self.listener is not None:
            self.listener(partition, items)


class FaustTable(Table):
    """`streams.runtime.processor.Table` over a Faust table with bytes keys and values."""

    def __init__(self, table: Any, tap: WriteTap | None = None) -> None:
        """Wrap `table`; `tap` is told every write."""
        self.table = table
        self.tap = tap or WriteTap()

    def get(self, key: bytes, partition: int) -> bytes | None:
        """Read on `partition`."""
        return faust_patches.store_get(self.table, partition, key)

    def set(self, key: bytes, value: bytes | None, partition: int) -> None:
        """Write the local store on `partition`, None deleting the key (no changelog record:
        the worker sends a batch's records together with `send_changelog`)."""
        self.set_all([(key, value, partition)])

    def set_all(self, writes: list[tuple[bytes, bytes | None, int]]) -> None:
        """`set` each of `writes` (key, value, partition; None deletes the key), one RocksDB
        write batch per partition."""
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for key, value, partition in writes:
            by_partition.setdefault(partition, []).append((key, value))
        for partition, items in by_partition.items():
            faust_patches.store_put_all(self.table, partition, items)
            self.tap(partition, items)

    @property
    def changelog_topic(self) -> str:
        """The changelog topic's name."""
        name: str = self.table.changelog_topic.get_topic_name()
        return name

    async def send_changelog(
        self,
        producer: Any,
        writes: list[tuple[bytes, bytes | None, int]],
        before_sending: Callable[[], Awaitable[None]] = no_check,
    ) -> Sent:
        """Hand the changelog records of values just stored to the producer; returns them for
        `changelog_acknowledged`, which waits for the broker.

        The records go straight to the aiokafka producer in record batches
        (`streams.runtime.sending.hand_over`; Faust's per-record `send_soon` path and its per-record
        callback cost more than the rest of a batch).
        """
        topic = self.changelog_topic
        records = [(topic, partition, key, value) for key, value, partition in writes]
        return await hand_over(producer, records, before_sending)

    async def changelog_acknowledged(
        self, sent: Sent, before_persisting: Callable[[], Awaitable[None]] = no_check
    ) -> None:
        """Wait until the broker has the records `send_changelog` handed over, then store each
        partition's last changelog offset once, as Faust's callback would store it per record:
        a restart with the datadir kept reads the changelog from there. Raises what a failed
        delivery raises, or what `before_persisting()` raises, before storing anything.

        The stored offset says "this local copy holds every changelog record up to here". It
        does only while this worker was the partition's one writer: a worker frozen past its
        session timeout has lost the partition, and its records, queued before the freeze,
        land after the records its successor wrote meanwhile, which this copy never read.
        Storing their offsets would make the next restore here skip the successor's records
        (users stale or missing, their inputs committed and never read again), so
        `before_persisting` (the fence's membership check) comes first.
        """
        topic = self.changelog_topic
        offsets = await acknowledged(sent)
        await before_persisting()
        for (_, partition), offset in offsets.items():
            faust_patches.set_persisted_offset(self.table, TP(topic, partition), offset)

    def restore_in_full(self, partitions: list[int]) -> None:
        """Make the next restore of `partitions` here read their changelog from the start."""
        topic = self.changelog_topic
        for partition in partitions:
            faust_patches.set_persisted_offset(self.table, TP(topic, partition), -1)


def fence_stale_changelog_records(
    table: Any,
    repair: Callable[[int, bytes], None] | None = None,
    tap: WriteTap | None = None,
) -> None:
    """Make restores and standbys skip changelog records older than the value they hold.

    A worker frozen past its session timeout (a long GC pause, a stopped VM) comes back as a
    zombie: before it learns that its partitions moved, it may finish the batch in hand and
    write states to the changelog *after* the new owner wrote newer ones (streams/runtime/fencing.py
    keeps that rare). Kafka cannot fence it without transactions, so the records are ordered
    by the user's own write version (`schemas.stored.stored_version`: last applied offset,
    then episodes closed): a record older than the value already stored (or already seen in
    the batch) is skipped. The new owner's local store never reads the changelog, so only
    restores and standbys need this. The partitions' persisted offsets still advance past
    skipped records. Where a skipped record is the last of its user in the log (compaction
    would keep it), `repair(partition, key)` is called: the partition's owner writes the
    user's state again after recovery. `tap` is told the records applied.
    """

    def skipping_stale(apply: Callable[[Any], None]) -> Callable[[Any], None]:
        def apply_newer_or_stop(batch: Any) -> None:
            # Raised in Faust's recovery, a storage fault would stop the restore and leave the
            # worker running on part of its state: it stops the worker instead.
            try:
                apply_newer(batch)
            except Exception as exc:
                FAIL_STOP.stop("the changelog restore", exc)

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
                    raw = faust_patches.store_get(table, message.partition, message.key)
                    current = None if raw is None else stored_version(raw)
                if version is not None and current is not None and version < current:
                    skipped += 1
                    stale_last.add(where)
                    continue
                newest[where] = version
                stale_last.discard(where)
                kept.append(event)
            apply(kept)
            if tap is not None and kept:
                applied: dict[int, list[tuple[bytes, bytes | None]]] = {}
                for event in kept:
                    message = event.message
                    applied.setdefault(message.partition, []).append((message.key, message.value))
                for partition, items in applied.items():
                    tap(partition, items)
            if repair is not None:
                for partition, key in stale_last:
                    repair(partition, key)
            for tp, offset in last.items():
                faust_patches.set_persisted_offset(table, tp, offset)
            if skipped:
                # Expected in a full restore over a local copy (its values are newer than
                # the log's early records); otherwise a late write by a worker that had lost
                # its partitions.
                log.info(
                    "changelog: skipped %s record(s) older than the state already held here",
                    skipped,
                )

        return apply_newer_or_stop

    faust_patches.wrap_changelog_apply(table, skipping_stale)
