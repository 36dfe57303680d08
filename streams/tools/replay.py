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
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from engine import END_OF_TIME, EngineConfig, EngineState, Event, serialize
from schemas.files import Line
from schemas.stored import decode_stored, encode_stored, stored_index
from streams.runtime.processor import (
    Batch,
    InMessage,
    Output,
    Processor,
    Table,
    TimePolicy,
)
from streams.tools.held import HeldUsers

TICKS: Final = "<end of input>"
FINISH_CHUNK: Final = 10_000
"""Users `finish` closes or deletes at a time (each chunk's users then held as a batch's)."""
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


class OfflineRun:
    """Feeds lines or events to a `Processor`; yields the outputs.

    The users stay decoded between batches, as the worker's `StateCache` keeps them: a batch's
    changed users are held as they are, not encoded into a table and decoded again by the
    next batch; beyond `memory_users` of them, the least recently used are written to disk
    (`streams.tools.held`). Encoding a user and decoding it again gives the same user (the
    stored format is lossless), so the outputs are those of a run through the table; `stored`
    and `states` still go through the stored bytes, so they are what the worker would store
    and read.

    Nothing indexes the users' deadlines while the run goes on (a replay closes nothing by a
    timer until the end): `finish` reads every held user once, so the run's memory is bounded
    by `memory_users`, not by the number of users.
    """

    def __init__(
        self,
        config: EngineConfig,
        source: str = "<events>",
        clock_ms: int | None = None,
        *,
        memory_users: int | None = None,
        spill_dir: str | None = None,
        erased: Mapping[str, int] | None = None,
    ) -> None:
        """`source` names the input in dead-letter records (as the topic does live);
        `clock_ms` is the run's clock (default: now) for the bound on clocks running ahead;
        `memory_users`: most users held decoded (None: every user), the others written under
        `spill_dir` (the system's temporary directory: None); `erased`: user -> erase time,
        read ahead from the input (`schemas.files.scan_erasures`): those users' inputs at or
        before it are skipped wherever they stand, not only after their erase command."""
        self.config = config
        self.source = source
        self.clock_ms = int(time.time() * 1000) if clock_ms is None else clock_ms
        self.processor = Processor(
            config,
            events_topic=source,
            ticks_topic=TICKS,
            time=TimePolicy(hold_until_end=True),
            output_format=None,  # each output's message is written as a JSON line
            index_users=False,  # `finish` reads every user instead
        )
        if erased:
            self.processor.erasures.learn(erased)
        limit = sys.maxsize if memory_users is None else max(memory_users, 1)
        self._held = HeldUsers(limit, spill_dir)
        self.table = self._held.table
        self._batch = self._new_batch()
        self._pending = 0

    def user_count(self) -> int:
        """Users held (after `finish`: the users the run ends with)."""
        return self._held.count()

    @property
    def written_to_disk(self) -> int:
        """Users written to disk so far, because more than `memory_users` were held."""
        return self._held.written

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
        """`finish_chunks` as one list."""
        return [output for chunk in self.finish_chunks(until) for output in chunk]

    def finish_chunks(self, until: int = END_OF_TIME) -> Iterator[list[Output]]:
        """Close the episodes due by the final watermark `until`, in the order of their
        deadlines (then users), as the worker's timer closes them; then delete the users
        expired by then (`stateTtl`). The last outputs, a chunk of users at a time (a history's
        end closes an episode of nearly every user: held at once, they were most of the run's
        memory)."""
        yield self._batch.outputs
        self._store()
        processor, tick = self.processor, InMessage(TICKS, 0, 0, None, None, None)
        timeout, ttl = self.config.episode_timeout_ms, self.config.state_ttl_ms
        if timeout is not None:
            for chunk in _chunks(self._due(until, timeout), FINISH_CHUNK):
                processor.open = {0: {key: deadline for deadline, key in chunk}}
                processor.deadlines = {0: chunk}  # sorted: a heap already
                processor.close_due(self._batch, tick, until)
                yield self._batch.outputs
                self._store()
            processor.open, processor.deadlines = {}, {}
        if ttl is not None:
            expired = ((key, at) for key, at in self._expiries(ttl) if at < until)
            for chunk in _chunks(expired, FINISH_CHUNK):
                processor.expiries = {0: OrderedDict(chunk)}
                processor.expire_due(self._batch, tick, until)
                yield self._batch.outputs
                self._store()
            processor.expiries = {}

    def states(self) -> dict[str, EngineState]:
        """Each user's final state (after `finish`), read back from its stored bytes."""
        return dict(self.final_states())

    def final_states(self) -> Iterator[tuple[str, EngineState]]:
        """`states`, one user at a time, in the order first stored."""
        for key, raw in self._encoded():
            yield key.decode(), decode_stored(raw, self.config).state

    def stored(self) -> dict[str, bytes]:
        """Each user's final table value, as the worker would store it."""
        return {key.decode(): raw for key, raw in self._encoded()}

    def encoded(self) -> Iterator[tuple[bytes, bytes]]:
        """Each user's final table value (after `finish`), in the order first stored, one at
        a time."""
        return self._encoded()

    def close(self) -> None:
        """Remove what the run wrote to disk."""
        self._held.close()

    def _encoded(self) -> Iterator[tuple[bytes, bytes]]:
        for key, user in self._held.held():
            yield key, user if isinstance(user, bytes) else encode_stored(user)

    def _due(self, until: int, timeout: int) -> Iterator[tuple[int, bytes]]:
        """(deadline, user) of every open episode due before `until`, sorted."""
        due = (
            (since + timeout, key)
            for key, since in self._open_since()
            if since is not None and since + timeout < until
        )
        spill = self._held.table.spill
        if spill is None:
            yield from sorted(due)
            return
        offset = 1 << 63  # deadlines may be negative: sort them as unsigned numbers
        keyed = ((deadline + offset).to_bytes(8, "big") + key for deadline, key in due)
        for value in spill.sorted_keys(keyed):
            yield int.from_bytes(value[:8], "big") - offset, value[8:]

    def _open_since(self) -> Iterator[tuple[bytes, int | None]]:
        for key, user in self._held.held():
            if isinstance(user, bytes):
                yield key, stored_index(user).open_since
            else:
                episode = user.state.episode
                yield key, None if episode.started_at is None else episode.last_event_at

    def _expiries(self, ttl: int) -> Iterator[tuple[bytes, int]]:
        for key, user in self._held.held():
            clock = stored_index(user).clock if isinstance(user, bytes) else user.clock
            if clock is not None:
                yield key, clock + ttl

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
        self._held.keep(
            (key, None if slot.gone else slot.user)
            for key, slot in self._batch.slots.items()
            if slot.dirty
        )
        self.processor.erasures.written()  # its markers stay in memory: nothing to undo
        self._batch = self._new_batch()
        self._pending = 0


def replay_outputs(
    config: EngineConfig,
    events: Iterable[Event],
    *,
    until: int = END_OF_TIME,
    clock_ms: int | None = None,
    erased: Mapping[str, int] | None = None,
) -> tuple[list[Output], OfflineRun]:
    """Every output of `events` replayed offline, and the run (for its states and counts);
    `erased` as `OfflineRun` takes it."""
    run = OfflineRun(config, clock_ms=clock_ms, erased=erased)
    outputs: list[Output] = []
    for index, event in enumerate(events):
        outputs.extend(run.feed_event(index, event))
    outputs.extend(run.finish(until))
    return outputs, run


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def encoded_state(state: EngineState) -> str:
    """A state as base64 of its compact serialization (the `--states` file's field)."""
    return base64.b64encode(serialize(state, include_config=False)).decode()
