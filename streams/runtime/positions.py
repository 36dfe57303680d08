"""Where the worker stands on each input partition: caught up or not, and how far behind.

Whether a partition is caught up decides time (a caught-up, idle partition's clock runs on
with the wall clock: docs/time.md), and the lag is what the summary line and `/readyz` report.
The offsets come from the consumer (committed, end, delivered); the handled ones from the
processor.
"""

from __future__ import annotations

from typing import Any

from faust.exceptions import ConsumerNotStarted
from faust.types import TP

from streams.faust import patches as faust_patches
from streams.runtime.backfill import Backfill
from streams.runtime.processor import InMessage, Processor


class Positions:
    """Catch-up and lag of the input partitions this worker owns."""

    def __init__(
        self, app: Any, processor: Processor, events_topic: str, backfill: Backfill | None
    ) -> None:
        """For the worker of Faust `app`; a backfill is caught up at its stop offsets."""
        self.app, self.processor = app, processor
        self.events_topic, self.backfill = events_topic, backfill

    def expect_committed(self, messages: list[InMessage]) -> None:
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

    def handled_offsets(self) -> dict[int, int]:
        """Partition -> the next input offset to handle: the processor's, or where nothing
        was handled since this worker took the partition, its committed offset (a partition
        taken over from another process of a parallel backfill may have nothing left)."""
        offsets = dict(self.processor.next_offset)
        consumer = self.app.consumer
        for tp in consumer.assignment():
            if tp.topic == self.events_topic and tp.partition not in offsets:
                committed = faust_patches.committed_offset(consumer, tp)
                if committed is not None:
                    offsets[tp.partition] = committed
        return offsets

    def caught_up(self, partition: int) -> bool:
        """True when every input message of `partition` up to its end offset is handled.

        The end offset is the last stable offset (the worker reads committed records only),
        or in a backfill the end offset captured at its start. Where the partition ends in
        records the worker never receives (transaction markers, aborted records), it is
        caught up once the consumer has read past them and everything delivered is handled.
        """
        if self.backfill is not None:
            return self.backfill.caught_up(partition, self.handled_offsets())
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

    def lag(self) -> int | str:
        """Input messages of the owned partitions not handled yet ("unknown" before the
        consumer knows a partition's end)."""
        lags = self.partition_lags().values()
        return "unknown" if None in lags else sum(lag for lag in lags if lag is not None)

    def partition_lags(self) -> dict[int, int | None]:
        """Input messages not handled yet, per owned input partition (None: the consumer
        does not know the partition's end yet). A caught-up partition has none, even when
        records the worker never receives (transaction markers) are left before its end."""
        consumer = self.app.consumer
        handled_at = dict(self.processor.next_offset)
        # An assigned input partition that has handled nothing since assignment (one whose
        # fetching stalled included) is behind by what lies past its committed offset: not
        # counting it showed a stalled partition as lag=0.
        try:
            assigned = consumer.assignment()
        except (ConsumerNotStarted, AssertionError, AttributeError, KeyError):
            assigned = set()  # a read at a start or shutdown, before or after the consumer
        for tp in assigned:
            if tp.topic == self.events_topic and tp.partition not in handled_at:
                committed = faust_patches.committed_offset(consumer, tp)
                if committed is not None:
                    handled_at[tp.partition] = committed
        lags: dict[int, int | None] = {}
        for partition, handled in handled_at.items():
            end = faust_patches.end_offset(consumer, TP(self.events_topic, partition))
            if end is None:
                lags[partition] = None
            else:  # caught up: only markers may be left
                lags[partition] = 0 if self.caught_up(partition) else max(end - handled, 0)
        return lags
