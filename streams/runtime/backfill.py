"""`oracular backfill`: the stream processor over an input topic's history, then exit.

A backfill runs the normal worker under a fresh app id (its own consumer group, state and
changelog), from the beginning of the input topic (or from `--since`), up to the end offsets
captured when it starts. The processor is the live worker's; only time differs: a backfill
closes no episode until a partition has reached its end offset (users' own events still close
theirs), then one more tick closes what is due by then: the later of the partition's newest
event time and the wall clock, minus the lateness (docs/time.md). So a backfill equals
`oracular replay --until` that watermark, whatever the order of the topic, and output ids
derive from the events, so running the same backfill twice gives identical ids.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from streams.runtime.processor import InMessage
from streams.runtime.progress import Progress

log = logging.getLogger("oracular.worker")


@dataclass
class Backfill:
    """A bounded run of the worker: from `start` up to (not including) `stop` offsets, then
    `done()`."""

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
    erased: dict[str, int] = field(default_factory=dict)
    """`Range.erased`: the processor knows them before the first input."""
    deleted: dict[int, int] = field(default_factory=dict)
    """Partition -> its log start, where the broker deleted the input up to the stop offset
    before it was read (retention): nothing is left there to handle."""
    owned: Callable[[], set[int]] | None = None
    """In one of several processes (`oracular backfill --processes`): the input partitions
    this process owns now (empty while a rebalance is under way). `done()` is then called
    once every partition it owns is finished, not every partition: the others are the other
    processes' (their parent stops them all once each has called it)."""

    def caught_up(self, partition: int, next_offset: Mapping[int, int]) -> bool:
        """True when `partition` is handled up to its stop offset, or what is left of it was
        deleted by the broker."""
        reached = next_offset.get(partition, self.start.get(partition, 0))
        stop = self.stop.get(partition, 0)
        return reached >= stop or self.deleted.get(partition, -1) >= stop

    def behind(self, next_offset: Mapping[int, int]) -> list[int]:
        """The partitions not yet handled up to their stop offsets."""
        return [p for p in sorted(self.stop) if not self.caught_up(p, next_offset)]

    def note_log_starts(self, log_start: Mapping[int, int], next_offset: Mapping[int, int]) -> None:
        """Given the log start offsets of partitions still behind: a partition whose input up
        to its stop offset is gone from the broker ends here, with a warning (the backfill's
        results miss those events)."""
        for partition, first in log_start.items():
            stop = self.stop.get(partition, 0)
            if (
                first >= stop
                and partition not in self.deleted
                and not self.caught_up(partition, next_offset)
            ):
                self.deleted[partition] = first
                reached = next_offset.get(partition, self.start.get(partition, 0))
                log.warning(
                    "input partition %s: offsets %s..%s were deleted by the broker (retention) "
                    "before the backfill read them; the backfill ends the partition without "
                    "them. Keep the input topic's history (retention.ms=-1) to backfill it",
                    partition,
                    reached,
                    stop - 1,
                )

    def advance(
        self,
        messages: Iterable[InMessage],
        next_offset: Mapping[int, int],
        ticks_topic: str,
        at_end: Callable[[tuple[int, int]], bool],
    ) -> None:
        """After a batch is written: move the progress line on, note partitions that had a
        tick once caught up, and call `done()` when every partition has.

        Only a tick for which `at_end((partition, offset))` is True finishes its partition
        (`Processor.took_tick_at_end`, which forgets the tick as it answers): one handled
        with the partition at its end, that closed every episode due there. A tick handled
        before the partition's last inputs, in the same batch or in one held with it, closed
        nothing, though the partition is caught up by the time the batch is written; one that
        closed only part of the due episodes (a batch closes at most so many; the worker
        ticks again at once for the rest) leaves the rest to the next."""
        batch = list(messages)
        if self.progress is not None:
            handled = sum(next_offset.get(p, start) - start for p, start in self.start.items())
            self.progress.advance(handled, count=len(batch))
        for message in batch:
            if message.topic != ticks_topic:
                continue
            if not at_end((message.partition, message.offset)):
                continue
            if self.caught_up(message.partition, next_offset):
                self.finished.add(message.partition)
        required = self.stop.keys() if self.owned is None else self.owned()
        if not self.reached and required and self.finished >= required:
            self.reached = True
            self.done()


@dataclass(frozen=True)
class Range:
    """Per partition: where the backfill starts and where it stops."""

    start: dict[int, int]
    stop: dict[int, int]
    erased: dict[str, int] = field(default_factory=dict)
    """The erased users' markers (hex keys, streams/runtime/erasure.py) -> erase time, read
    ahead from the range: the backfill skips their inputs from the start."""

    @property
    def total(self) -> int:
        """Messages to handle."""
        return sum(max(self.stop[p] - self.start[p], 0) for p in self.stop)

    def handled(self, committed: Mapping[int, int]) -> int:
        """Messages handled, given the consumer group's committed offsets."""
        return sum(
            min(max(committed.get(p, start) - start, 0), max(self.stop[p] - start, 0))
            for p, start in self.start.items()
        )

    def to_json(self) -> str:
        """The range as JSON (handed to the processes of a parallel backfill)."""
        return json.dumps({"start": self.start, "stop": self.stop, "erased": self.erased})

    @classmethod
    def from_json(cls, text: str) -> Range:
        """The range `to_json` wrote."""
        value = json.loads(text)
        return cls(
            {int(p): int(o) for p, o in value["start"].items()},
            {int(p): int(o) for p, o in value["stop"].items()},
            {str(k): int(t) for k, t in value.get("erased", {}).items()},
        )
