"""Lag per input partition: what the summary line, /readyz and /metrics report."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.exceptions import ConsumerNotStarted
from faust.types import TP

from streams.faust import internals as faust_internals
from streams.runtime.backfill import Backfill
from streams.runtime.positions import Positions

EVENTS = "in"


class FakeConsumer:
    """What the lag reads of Faust's consumer: the assignment, committed and end offsets."""

    def __init__(self, ends: dict[int, int | None], committed: dict[int, int]) -> None:
        self.ends, self._committed_offset = ends, {TP(EVENTS, p): o for p, o in committed.items()}
        self._read_offset: dict[TP, int] = {}
        self.started = True

    def assignment(self) -> set[TP]:
        if not self.started:
            raise ConsumerNotStarted("not started")
        return {TP(EVENTS, p) for p in self.ends} | {TP("ticks", 0)}

    def highwater(self, tp: TP) -> int | None:
        return self.ends[tp.partition]


def positions(consumer: Any, handled: dict[int, int]) -> Positions:
    processor: Any = SimpleNamespace(next_offset=handled)
    return Positions(SimpleNamespace(consumer=consumer), processor, EVENTS, backfill=None)


def test_each_partition_lags_by_what_lies_between_handled_and_its_end():
    """Handled since assignment: from there; nothing handled yet: from the committed offset
    (a stalled partition is not lag 0); caught up: nothing."""
    consumer = FakeConsumer({0: 10, 1: 50, 2: 7}, committed={1: 20, 2: 7})
    at = positions(consumer, {0: 4})
    assert at.partition_lags() == {0: 6, 1: 30, 2: 0}
    assert at.lag() == 36


def test_a_partition_whose_end_is_not_known_yet_makes_the_total_unknown():
    consumer = FakeConsumer({0: 10, 1: None}, committed={1: 0})
    at = positions(consumer, {0: 10})
    assert at.partition_lags() == {0: 0, 1: None}
    assert at.lag() == "unknown"


def test_before_the_consumer_starts_only_handled_partitions_count():
    consumer = FakeConsumer({0: 10}, committed={})
    consumer.started = False
    assert positions(consumer, {0: 8}).partition_lags() == {0: 2}


def test_a_partition_read_past_its_trailing_transaction_markers_has_no_lag():
    """Offset 9 of partition 0 is a commit marker (never delivered): handled up to 9 with the
    consumer past it, the partition is caught up, not one behind."""
    consumer = FakeConsumer({0: 10}, committed={})
    tp = TP(EVENTS, 0)
    consumer._read_offset[tp] = 9  # the next offset the fetch loop would deliver
    consumer._oracular_delivered = {tp: faust_internals._Delivered(position=10, read_offset=9)}
    at = positions(consumer, {0: 9})
    assert at.partition_lags() == {0: 0}
    assert at.lag() == 0


def test_a_backfill_partition_taken_over_with_nothing_left_is_caught_up_at_its_committed_offset():
    """A process of a parallel backfill that takes over a partition another one finished
    receives no input there: its committed offset (the stop) says it is caught up."""
    consumer = FakeConsumer({0: 100, 1: 50}, committed={1: 50})
    plan = Backfill(start={0: 0, 1: 0}, stop={0: 100, 1: 50}, done=lambda: None)
    processor: Any = SimpleNamespace(next_offset={0: 60})
    at = Positions(SimpleNamespace(consumer=consumer), processor, EVENTS, backfill=plan)
    assert at.handled_offsets() == {0: 60, 1: 50}
    assert at.caught_up(1)
    assert not at.caught_up(0)
