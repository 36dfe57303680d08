"""Offline runs: events from a file (or a list) through the worker's own `Processor`.

`oracular replay` and the tests' expected outputs use this, so a replay, a backfill and the
live worker decide every output in one place (`streams/runtime/processor.py`). The state table is a
dict; the run is one partition whose closes are held until the end (`TimePolicy.hold_until_end`),
then the final watermark (`--until`, default the end of time) closes what is due by then.

A file has no Kafka records, so the one rule that needs a record's timestamp, the bound on how
far an event time may run ahead (docs/time.md), is applied against the run's own clock: the
time the run started, unless `clock_ms` (`--clock`) sets it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable
from typing import Any, Final

from engine import END_OF_TIME, EngineConfig, EngineState, Event, serialize
from schemas.files import Line
from schemas.stored import decode_stored
from streams.runtime.processor import Batch, InMessage, Output, Processor, Table, TimePolicy

TICKS: Final = "<end of input>"
BATCH_LINES: Final = 5_000
"""Lines applied per batch: the states of one batch are held decoded, then stored."""


class DictTable(Table):
    """The state table of an offline run."""

    def __init__(self) -> None:
        """Start empty."""
        self.values: dict[bytes, bytes] = {}

    def get(self, key: bytes, partition: int) -> bytes | None:
        """The stored value of `key`."""
        return self.values.get(key)

    def set(self, key: bytes, value: bytes, partition: int) -> None:
        """Store `value`."""
        self.values[key] = value


class OfflineRun:
    """Feeds lines or events to a `Processor` over a `DictTable`; yields the outputs."""

    def __init__(
        self, config: EngineConfig, source: str = "<events>", clock_ms: int | None = None
    ) -> None:
        """`source` names the input in dead-letter records (as the topic does live);
        `clock_ms` is the run's clock (default: now) for the bound on clocks running ahead."""
        self.config = config
        self.source = source
        self.clock_ms = int(time.time() * 1000) if clock_ms is None else clock_ms
        self.table = DictTable()
        self.processor = Processor(
            config,
            events_topic=source,
            ticks_topic=TICKS,
            time=TimePolicy(hold_until_end=True),
            output_format=None,  # each output's message is written as a JSON line
        )
        self._batch = Batch(self.table, config)
        self._pending = 0

    @property
    def counts(self) -> Any:
        """The processor's counters (the worker's names)."""
        return self.processor.counts

    def feed_line(self, line: Line) -> list[Output]:
        """Apply one file line (decoded by `schemas.files.read_lines`)."""
        message = self._message(line.index, line.raw, line.event)
        if line.ignored:
            self.processor.count_input("ignored", message.partition)
        elif line.event is None:
            self.processor.dead_letter(self._batch, message, line.error or "undecodable")
        else:
            self.processor.apply(self._batch, message, line.event, self.clock_ms)
        return self._after_one()

    def feed_event(self, index: int, event: Event) -> list[Output]:
        """Apply one event; `index` is its position (its offset in dead-letter records)."""
        message = self._message(index, None, event)
        self.processor.apply(self._batch, message, event, self.clock_ms)
        return self._after_one()

    def finish(self, until: int = END_OF_TIME) -> list[Output]:
        """Close the episodes due by the final watermark `until`; the last outputs."""
        tick = InMessage(TICKS, 0, 0, None, None, None)
        self.processor.close_due(self._batch, tick, until)
        outputs = self._batch.outputs
        self._store()
        return outputs

    def states(self) -> dict[str, EngineState]:
        """Each user's final state (after `finish`)."""
        return {
            key.decode(): decode_stored(raw, self.config).state
            for key, raw in self.table.values.items()
        }

    def stored(self) -> dict[str, bytes]:
        """Each user's final table value, as the worker would store it."""
        return {key.decode(): raw for key, raw in self.table.values.items()}

    def _message(self, index: int, raw: bytes | None, event: Event | None) -> InMessage:
        key = None if event is None else event.user.encode()
        return InMessage(self.source, 0, index, key, raw, None)

    def _after_one(self) -> list[Output]:
        outputs, self._batch.outputs = self._batch.outputs, []
        self._pending += 1
        if self._pending >= BATCH_LINES:
            self._store()
        return outputs

    def _store(self) -> None:
        """Write the batch's changed users to the table and start a new batch."""
        for key, value, partition in self._batch.writes():
            self.table.set(key, value, partition)
        self._batch = Batch(self.table, self.config)
        self._pending = 0


def replay_outputs(
    config: EngineConfig,
    events: Iterable[Event],
    *,
    until: int = END_OF_TIME,
    clock_ms: int | None = None,
) -> tuple[list[Output], OfflineRun]:
    """Every output of `events` replayed offline, and the run (for its states and counts)."""
    run = OfflineRun(config, clock_ms=clock_ms)
    outputs: list[Output] = []
    for index, event in enumerate(events):
        outputs.extend(run.feed_event(index, event))
    outputs.extend(run.finish(until))
    return outputs, run


def encoded_state(state: EngineState) -> str:
    """A state as base64 of its compact serialization (the `--states` file's field)."""
    return base64.b64encode(serialize(state, include_config=False)).decode()
