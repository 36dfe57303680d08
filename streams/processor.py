"""The worker's decisions, without Faust: apply input messages and ticks to per-user states.

The Faust agent (`streams/app.py`) hands each batch of messages to `Processor.run_batch` with a
`Batch` that reads and writes the state table; the processor decodes, deduplicates, applies the
engine, decides the outputs and keeps the timer's deadline index. Everything here is
synchronous and testable with a dict as the table.

Per message, exactly one of: applied, skipped as a duplicate (its offset is at or below the
user's last applied offset), ignored (a Segment message with no event), or dead-lettered with
the reason. Nothing raises out of `run_batch` for a bad message.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from engine import (
    EngineConfig,
    EngineError,
    apply_event,
    close_if_due,
    create_state,
    timeout_deadline,
)
from schemas.events import DecodeError, IgnoredMessage, decode_event
from schemas.outputs import Format, dlq_message, encode_output, episode_message, prediction_message
from schemas.stored import StoredUser, decode_stored, encode_stored, stored_deadline

HANDLED: Final = ("applied", "duplicates", "dead_lettered", "ignored")
"""Every consumed input message is counted as exactly one of these."""
REPORTED: Final = (*HANDLED, "late", "predictions", "episodes", "closed_by_timer", "ticks")
"""The counters the worker's summary line shows, in order."""

PREDICTIONS: Final = "predictions"
EPISODES: Final = "episodes"
DLQ: Final = "dlq"


@dataclass(frozen=True, slots=True)
class InMessage:
    """One consumed record, from either the input topic or the ticks topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    context: Any = None
    """The Faust event it came from: table reads and writes for it use its partition."""


@dataclass(frozen=True, slots=True)
class Output:
    """A message to publish: the output role (predictions, episodes, dlq), key and value."""

    role: str
    key: bytes | None
    value: bytes


class Table:
    """What the processor needs of the state table; `streams/app.py` adapts Faust's."""

    def get(self, key: bytes, context: Any) -> bytes | None:  # pragma: no cover - interface
        """The stored value of `key`, read on the partition of `context`."""
        raise NotImplementedError

    def set(self, key: bytes, value: bytes, context: Any) -> None:  # pragma: no cover
        """Store `value`, written to the partition of `context`."""
        raise NotImplementedError


@dataclass
class _Slot:
    user: StoredUser
    context: Any
    dirty: bool = False


@dataclass
class Batch:
    """One batch's reads, writes and outputs: each user read once and written once."""

    table: Table
    config: EngineConfig
    slots: dict[bytes, _Slot] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)

    def slot(self, key: bytes, message: InMessage) -> _Slot:
        """The user's state for this batch, read from the table the first time."""
        slot = self.slots.get(key)
        if slot is None:
            raw = self.table.get(key, message.context)
            user = (
                StoredUser(create_state(self.config), message.partition, -1)
                if raw is None
                else decode_stored(raw, self.config)
            )
            slot = self.slots[key] = _Slot(user, message.context)
        return slot

    def writes(self) -> Iterable[tuple[bytes, bytes, Any]]:
        """(key, value, context) of every user the batch changed."""
        for key, slot in self.slots.items():
            if slot.dirty:
                yield key, encode_stored(slot.user), slot.context


class Processor:
    """Applies batches of messages; keeps watermarks, the deadline index and the counters."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        events_topic: str,
        ticks_topic: str,
        grace_ms: int,
        output_format: Format = "msgpack",
        stop_offsets: Mapping[int, int] | None = None,
    ) -> None:
        """Set up for one worker; partitions' time starts unknown."""
        self.config = config
        self.events_topic, self.ticks_topic = events_topic, ticks_topic
        self.grace_ms = grace_ms
        self.output_format: Format = output_format
        self.stop_offsets = stop_offsets
        """A backfill's end: partition -> the first offset not to apply (None: no end)."""
        self.counts: Counter[str] = Counter()
        self.event_time: dict[int, int] = {}
        """Partition -> the largest event time applied on it (its event-time watermark)."""
        self.next_offset: dict[int, int] = {}
        """Partition -> the next input offset to handle: one past the highest handled, or
        the committed offset when the partition was assigned (`expect`)."""
        self.deadlines: dict[int, list[tuple[int, bytes]]] = {}
        """Partition -> heap of (timeout deadline, user key); stale entries are skipped."""

    def handled(self) -> int:
        """Input messages handled so far (applied, duplicates, dead-lettered or ignored)."""
        return sum(self.counts[name] for name in HANDLED)

    def summary(self, separator: str = " ") -> str:
        """The counters as `name=value` pairs."""
        return separator.join(f"{name}={self.counts[name]}" for name in REPORTED)

    # --- batches -------------------------------------------------------------------------

    def run_batch(
        self,
        batch: Batch,
        messages: Iterable[InMessage],
        caught_up: Callable[[int], bool],
        wall_ms: Callable[[], int],
    ) -> dict[int, int]:
        """Apply `messages` in order; outputs and writes accumulate in `batch`.

        Returns:
            Partition -> offset to re-read from, for each partition whose input skipped
            ahead (see `_skipped_ahead`). Its messages from the first one past the hole on
            were not applied: the caller must seek back and must not ack them.
        """
        rewinds: dict[int, int] = {}
        for message in messages:
            partition = message.partition
            if message.topic == self.ticks_topic:
                self.on_tick(batch, message, caught_up(partition), wall_ms())
            elif partition in rewinds or self._skipped_ahead(message):
                rewinds.setdefault(partition, self.next_offset[partition])
                self.counts["rewound"] += 1
            elif self._beyond_end(message):
                self.counts["beyond_end"] += 1
            else:
                self.on_input(batch, message)
                self.next_offset[partition] = max(
                    self.next_offset.get(partition, 0), message.offset + 1
                )
        return rewinds

    def _skipped_ahead(self, message: InMessage) -> bool:
        """True when `message` comes after a hole: earlier offsets were never delivered.

        Input offsets are contiguous here (no transactions, no compaction on the input), so
        a message past the next expected offset means Faust dropped messages in between.
        faust-streaming 0.15.3 does that around rebalances: its fetch loop drops a message
        below the highest offset it has read, and marks holes as acked. Applying the later
        message would break the user's order and, worse, make the missing ones look like
        redeliveries; so it is not applied, and the partition is re-read from the hole.
        """
        expected = self.next_offset.get(message.partition)
        return expected is not None and message.offset > expected

    def _beyond_end(self, message: InMessage) -> bool:
        stop = self.stop_offsets
        return stop is not None and message.offset >= stop.get(message.partition, 0)

    def on_input(self, batch: Batch, message: InMessage) -> None:
        """Decode, check, deduplicate and apply one input message."""
        try:
            event = decode_event(message.value or b"", fallback_ts=message.timestamp_ms)
            key = _user_key(message.key, event.user)
        except IgnoredMessage:
            self.counts["ignored"] += 1
            return
        except DecodeError as exc:
            self.dead_letter(batch, message, str(exc))
            return
        slot = batch.slot(key, message)
        if message.offset <= slot.user.last_offset:
            # A redelivery after a crash. The local store already has this input, but its
            # changelog record may not have left before the crash: write the state again so
            # a restore from the changelog cannot fall behind the committed offsets.
            self.counts["duplicates"] += 1
            slot.dirty = True
            return
        try:
            step = apply_event(slot.user.state, event)
        except (EngineError, ValueError) as exc:
            self.dead_letter(batch, message, str(exc))
            return
        slot.user = StoredUser(step.state, message.partition, message.offset)
        slot.context = message.context
        slot.dirty = True
        self.counts["applied"] += 1
        self.counts["late"] += step.late
        previous = self.event_time.get(message.partition)
        if previous is None or step.at > previous:
            self.event_time[message.partition] = step.at
        if step.closed is not None:
            self._emit(batch, EPISODES, key, episode_message(event.user, step.closed))
        predictions = prediction_message(event.user, step, message.offset)
        if predictions is not None:
            self._emit(batch, PREDICTIONS, key, predictions)
        self._index(message.partition, key, step.state)

    def on_tick(self, batch: Batch, message: InMessage, caught_up: bool, wall_ms: int) -> None:
        """Close the due episodes of the tick's partition.

        The watermark is the partition's event time; while the partition is caught up, wall
        clock minus the grace joins it, so silent users close on time live while a replay or
        backfill closes nothing early. Closes are at last event + timeout either way.
        """
        self.counts["ticks"] += 1
        partition = message.partition
        watermark = self.event_time.get(partition)
        if caught_up:
            sent_at = _tick_time(message.value) or wall_ms
            wall = sent_at - self.grace_ms
            watermark = wall if watermark is None else max(watermark, wall)
        heap = self.deadlines.get(partition)
        if watermark is None or not heap:
            return
        while heap and heap[0][0] < watermark:
            deadline, key = heapq.heappop(heap)
            slot = batch.slot(key, message)
            if timeout_deadline(slot.user.state) != deadline:
                continue  # a later event moved the deadline; its own entry is in the heap
            transition = close_if_due(slot.user.state, watermark)
            if transition.closed is None:
                continue
            user = slot.user
            slot.user = StoredUser(transition.state, user.partition, user.last_offset)
            slot.context = message.context
            slot.dirty = True
            self.counts["closed_by_timer"] += 1
            self._emit(batch, EPISODES, key, episode_message(key.decode(), transition.closed))

    def dead_letter(self, batch: Batch, message: InMessage, error: str) -> None:
        """Publish the message to the dead-letter topic with the reason and its origin."""
        self.counts["dead_lettered"] += 1
        record = dlq_message(
            error,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
        )
        batch.outputs.append(Output(DLQ, message.key, encode_output(record, "msgpack")))

    # --- the deadline index --------------------------------------------------------------

    def rebuild(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Rebuild the deadline index from the table's (key, value) pairs after recovery."""
        self.deadlines = {}
        for key, raw in items:
            try:
                partition, deadline = stored_deadline(raw)
            except EngineError:
                self.counts["unreadable_states"] += 1
                continue
            if deadline is not None:
                self.deadlines.setdefault(partition, []).append((deadline, key))
        for heap in self.deadlines.values():
            heapq.heapify(heap)

    def expect(self, partition: int, offset: int) -> None:
        """Start `partition` at `offset` (its committed offset) unless it is known already."""
        self.next_offset.setdefault(partition, offset)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the time and index of partitions this worker no longer owns."""
        for partition in partitions:
            self.event_time.pop(partition, None)
            self.next_offset.pop(partition, None)
            self.deadlines.pop(partition, None)

    def _index(self, partition: int, key: bytes, state: Any) -> None:
        deadline = timeout_deadline(state)
        if deadline is not None:
            heapq.heappush(self.deadlines.setdefault(partition, []), (deadline, key))

    def _emit(self, batch: Batch, role: str, key: bytes, message: dict[str, Any]) -> None:
        self.counts[role] += 1
        batch.outputs.append(Output(role, key, encode_output(message, self.output_format)))


def _user_key(key: bytes | None, user: str) -> bytes:
    """The table key: the message key, which must be the user id (it decides the partition)."""
    if key is None:
        msg = f"the message has no key: key it by the user id ({user!r}) with murmur2"
        raise DecodeError(msg)
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"the message key is not UTF-8 ({len(key)} bytes): key it by the user id"
        raise DecodeError(msg) from exc
    if text != user:
        msg = f"the message key {text[:64]!r} is not its user {user[:64]!r}: key by user id"
        raise DecodeError(msg)
    return key


def encode_tick(wall_ms: int) -> bytes:
    """A tick's value: the wall-clock time the timer sent it at."""
    value: bytes = msgpack.packb([wall_ms])
    return value


def _tick_time(value: bytes | None) -> int | None:
    try:
        decoded = msgpack.unpackb(value or b"")
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if isinstance(decoded, list) and decoded and isinstance(decoded[0], int):
        return int(decoded[0])
    return None
