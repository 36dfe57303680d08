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
import sys
import time
from collections.abc import Iterable
from typing import Any, Final

from engine import END_OF_TIME, EngineConfig, EngineState, Event, serialize
from schemas.files import Line
from schemas.stored import StoredUser, decode_stored, encode_stored
from streams.runtime.processor import (
    Batch,
    InMessage,
    Output,
    Processor,
    StateCache,
    Table,
    TimePolicy,
)

TICKS: Final = "<end of input>"
BATCH_LINES: Final = 5_000
"""Lines applied per batch (a batch's users are read once and kept in its slots)."""


class DictTable(Table):
    """The state table of an offline run."""

    def __init__(self) -> None:
        """Start empty."""
        self.values: dict[bytes, bytes] = {}

    def get(self, key: bytes, partition: int) -> bytes | None:
        """The stored value of `key`."""
        return self.values.get(key)

    def set(self, key: bytes, value: bytes | None, partition: int) -> None:
        """Store `value` (None: delete the key)."""
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value


class HeldUsers(StateCache):
    """An offline run's users, all held decoded, in the order they were first stored (the
    order of `stored`, `states` and the `--states` file): reading one does not reorder them."""

    def __init__(self) -> None:
        """Hold nobody yet."""
        super().__init__(sys.maxsize)

    def get(self, key: bytes) -> StoredUser | None:
        """The held user, or None."""
        return self.users.get(key)


class OfflineRun:
    """Feeds lines or events to a `Processor` over a `DictTable`; yields the outputs.

    The users stay decoded between batches, as the worker's `StateCache` keeps them: a batch's
    changed users are held as they are, not encoded into the table and decoded again by the
    next batch. Encoding a user and decoding it again gives the same user (the stored format
    is lossless), so the outputs are those of a run through the table; `stored` and `states`
    still go through the stored bytes, so they are what the worker would store and read.
    """

    def __init__(
        self, config: EngineConfig, source: str = "<events>", clock_ms: int | None = None
    ) -> None:
        """`source` names the input in dead-letter records (as the topic does live);
        `clock_ms` is the run's clock (default: now) for the bound on clocks running ahead."""
        self.config = config
        self.source = source
        self.clock_ms = int(time.time() * 1000) if clock_ms is None else clock_ms
        self.table = DictTable()
        """Stays empty: every user of the run is held in `users`."""
        self.processor = Processor(
            config,
            events_topic=source,
            ticks_topic=TICKS,
            time=TimePolicy(hold_until_end=True),
            output_format=None,  # each output's message is written as a JSON line
        )
        self._held = HeldUsers()
        self._batch = self._new_batch()
        self._pending = 0

    @property
    def users(self) -> dict[bytes, StoredUser]:
        """Each user's state as of the last finished batch (all of them after `finish`)."""
        return self._held.users

    @property
    def counts(self) -> Any:
        """The processor's counters (the worker's names)."""
        return self.processor.counts

    def feed_line(self, line: Line) -> list[Output]:
        """Apply one file line (decoded by `schemas.files.read_lines`)."""
        return self.feed_lines((line,))

    def feed_lines(self, lines: Iterable[Line]) -> list[Output]:
        """Apply file lines in order; their outputs, in order (as `feed_line` of each would
        give them, without a list of outputs handed over per line)."""
        processor, clock_ms = self.processor, self.clock_ms
        outputs: list[Output] = []
        for line in lines:
            event = line.event
            message = self._message(line.index, line.raw, event)
            if line.ignored:
                processor.count_input("ignored", message.partition)
            elif event is None:
                processor.dead_letter(self._batch, message, line.error or "undecodable")
            else:
                processor.apply(self._batch, message, event, clock_ms)
            self._one_more(outputs)
        return self._taken(outputs)

    def feed_event(self, index: int, event: Event) -> list[Output]:
        """Apply one event; `index` is its position (its offset in dead-letter records)."""
        message = self._message(index, None, event)
        self.processor.apply(self._batch, message, event, self.clock_ms)
        return self._after_one()

    def finish(self, until: int = END_OF_TIME) -> list[Output]:
        """Close the episodes due by the final watermark `until`, and delete the users
        expired by then (`stateTtl`); the last outputs."""
        tick = InMessage(TICKS, 0, 0, None, None, None)
        self.processor.close_due(self._batch, tick, until)
        self.processor.expire_due(self._batch, tick, until)
        outputs = self._batch.outputs
        self._store()
        return outputs

    def states(self) -> dict[str, EngineState]:
        """Each user's final state (after `finish`), read back from its stored bytes."""
        return {
            key.decode(): decode_stored(raw, self.config).state
            for key, raw in self._encoded().items()
        }

    def stored(self) -> dict[str, bytes]:
        """Each user's final table value, as the worker would store it."""
        return {key.decode(): raw for key, raw in self._encoded().items()}

    def _encoded(self) -> dict[bytes, bytes]:
        return {key: encode_stored(user) for key, user in self.users.items()}

    def _message(self, index: int, raw: bytes | None, event: Event | None) -> InMessage:
        key = None if event is None else event.user.encode()
        return InMessage(self.source, 0, index, key, raw, None)

    def _after_one(self) -> list[Output]:
        outputs: list[Output] = []
        self._one_more(outputs)
        return self._taken(outputs)

    def _one_more(self, outputs: list[Output]) -> None:
        """Count one more input in the batch; a full batch's outputs go to `outputs`, its
        users are held (`_store`) and a new batch starts."""
        self._pending += 1
        if self._pending >= BATCH_LINES:
            outputs += self._batch.outputs
            self._store()

    def _taken(self, outputs: list[Output]) -> list[Output]:
        """`outputs` with the batch's outputs so far added (taken out of the batch)."""
        outputs += self._batch.outputs
        self._batch.outputs = []
        return outputs

    def _new_batch(self) -> Batch:
        return Batch(self.table, self.config, cache=self._held)

    def _store(self) -> None:
        """Hold the batch's changed users and start a new batch."""
        users = self.users
        for key, slot in self._batch.slots.items():
            if slot.gone:
                users.pop(key, None)
            elif slot.dirty:
                users[key] = slot.user
        self._batch = self._new_batch()
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
