"""`Backfill`: when a bounded run is over, including input the broker deleted under it."""

from __future__ import annotations

import logging

import pytest

from streams.runtime.backfill import Backfill, Range
from streams.runtime.processor import InMessage

EVENTS, TICKS = "oracular.events", "oracular.ticks"


def _tick(partition: int, offset: int = 0) -> InMessage:
    return InMessage(TICKS, partition, offset, None, b"", None)


def _every_tick_at_end(tick: tuple[int, int]) -> bool:
    """As `Processor.took_tick_at_end` answers when each tick came with its partition at its
    end and closed everything due."""
    return True


def _backfill() -> tuple[Backfill, list[str]]:
    ended: list[str] = []
    run = Backfill(start={0: 0, 1: 0}, stop={0: 100, 1: 50}, done=lambda: ended.append("done"))
    return run, ended


def test_a_backfill_ends_once_every_partition_is_handled_and_had_a_tick():
    run, ended = _backfill()
    handled = {0: 100, 1: 20}
    run.advance([_tick(0), _tick(1)], handled, TICKS, _every_tick_at_end)
    assert ended == [] and run.behind(handled) == [1]
    handled[1] = 50
    run.advance([_tick(1)], handled, TICKS, _every_tick_at_end)
    assert ended == ["done"] and run.behind(handled) == []


def test_input_deleted_up_to_the_stop_ends_its_partition_with_a_warning(caplog):
    """Retention deleted partition 1 from offset 20 on, up to past its stop (50): nothing is
    left to deliver there, so the run ends instead of waiting forever, and says so."""
    run, ended = _backfill()
    handled = {0: 100, 1: 20}
    with caplog.at_level(logging.WARNING, logger="oracular.worker"):
        run.note_log_starts({1: 57}, handled)
    assert run.behind(handled) == [] and run.caught_up(1, handled)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "offsets 20..49 were deleted by the broker" in warning
    run.advance([_tick(0), _tick(1)], handled, TICKS, _every_tick_at_end)
    assert ended == ["done"]


@pytest.mark.parametrize("log_start", [0, 20, 49])
def test_input_still_there_below_the_stop_is_waited_for(log_start, caplog):
    """A log start below the stop leaves records to deliver: the partition stays behind."""
    run, ended = _backfill()
    handled = {0: 100, 1: 20}
    run.note_log_starts({1: log_start}, handled)
    run.advance([_tick(0), _tick(1)], handled, TICKS, _every_tick_at_end)
    assert ended == [] and run.behind(handled) == [1] and not caplog.records


def test_one_process_of_several_ends_once_the_partitions_it_owns_are_done():
    """`--processes`: a process owning partition 0 only ends when 0 is done, whatever 1 is;
    while a rebalance is under way (it owns nothing) it does not end."""
    ended: list[str] = []
    owned: set[int] = set()
    run = Backfill(
        start={0: 0, 1: 0},
        stop={0: 100, 1: 50},
        done=lambda: ended.append("done"),
        owned=lambda: owned,
    )
    handled = {0: 100}
    run.advance(
        [_tick(0)], handled, TICKS, _every_tick_at_end
    )  # partition 0 done (caught up, then a tick) ...
    assert ended == []  # ... but while it owns nothing (a rebalance) it never ends
    owned.add(0)
    run.advance(
        [_tick(1)], handled, TICKS, _every_tick_at_end
    )  # 1 is far behind, but another process's
    assert ended == ["done"]


def test_owning_an_unfinished_partition_keeps_a_process_running():
    ended: list[str] = []
    run = Backfill(
        start={0: 0, 1: 0},
        stop={0: 100, 1: 50},
        done=lambda: ended.append("done"),
        owned=lambda: {0, 1},
    )
    run.advance([_tick(0), _tick(1)], {0: 100, 1: 49}, TICKS, _every_tick_at_end)
    assert ended == []
    run.advance([_tick(1)], {0: 100, 1: 50}, TICKS, _every_tick_at_end)
    assert ended == ["done"]


def test_a_range_survives_json_and_counts_handled_messages_from_committed_offsets():
    span = Range(start={0: 10, 1: 0, 2: 5}, stop={0: 110, 1: 50, 2: 5})
    assert Range.from_json(span.to_json()) == span
    erased = Range(span.start, span.stop, {"ff" + "ab" * 16: 1_767_261_600_000})
    assert Range.from_json(erased.to_json()) == erased  # a parallel backfill's processes
    assert span.total == 150
    assert span.handled({}) == 0
    assert span.handled({0: 60, 1: 50}) == 100
    assert span.handled({0: 500, 1: 0, 2: 9}) == 100  # never past a partition's stop


def test_only_a_tick_the_processor_handled_at_the_end_finishes_a_partition():
    """Caught up once the batch is written is not enough: a tick handled before the
    partition's end (or that left closes due) finishes nothing; the next one at the end
    does (tests/streams/test_processor.py runs this with the processor)."""
    run, ended = _backfill()
    handled = {0: 100, 1: 50}
    at_end = {(0, 8), (1, 4)}
    run.advance([_tick(0, offset=7), _tick(1, offset=3)], handled, TICKS, at_end.__contains__)
    assert ended == [] and run.finished == set()
    run.advance([_tick(0, offset=8)], handled, TICKS, at_end.__contains__)
    assert ended == [] and run.finished == {0}
    run.advance([_tick(1, offset=4)], handled, TICKS, at_end.__contains__)
    assert ended == ["done"]
