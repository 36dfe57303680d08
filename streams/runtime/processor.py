"""The worker's decisions, without Faust: apply input messages and ticks to per-user states.

The Faust agent (`streams/runtime/app.py`) hands each batch of messages to `Processor.run_batch`
with a `Batch` that reads and writes the state table; `oracular replay` (`streams/tools/replay.py`)
feeds file lines to the same `Processor` with a dict as the table. The processor decodes,
deduplicates, applies the engine, decides the outputs and keeps each partition's clock and
the timer's deadline index, so the worker, a backfill and a replay decide every output in one
place. Everything here is synchronous and testable with a dict as the table.

Per message, exactly one of: applied, skipped as redelivered (its offset is at or below the
user's last applied offset), skipped as a duplicate id (a producer's retry of an event the user
applied within the dedupe window), ignored (a Segment message with no event), or dead-lettered
with the reason (among them an input whose time runs further ahead of its record's timestamp,
or of the clock, than the allowed skew: a wrong device clock must not drag its user into the
future). Nothing raises out of `run_batch` for a bad message, and nothing a message carries
can stop its partition: an unexpected error in one message's handling is caught at that
message, dead-lettered and counted.

Time (docs/time.md): each partition has a watermark, the largest event time applied on it
minus the allowed lateness. The wall clock moves it only while the partition is caught up and
idle. A tick closes the episodes whose deadline
(last event + episodeTimeout) is before the watermark, *at* that deadline, exactly as the
user's next event would close them.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from engine import (
    ClosedEpisode,
    EngineConfig,
    EngineError,
    Event,
    StateFormatError,
    Step,
    apply_event,
    close_if_due,
    create_state,
)
from engine.dedupe import RecentIds, forget_before, remember
from schemas.events import DecodeError, IgnoredMessage, decode_event, show_time
from schemas.outputs import (
    Format,
    dlq_message,
    encode_output,
    episode_message,
    erased_message,
    prediction_message,
)
from schemas.plausible import EARLIEST_MS, implausible
from schemas.stored import StoredUser, decode_stored, encode_stored, id_digest, stored_index
from schemas.ticks import decode_tick
from streams.runtime.erasure import OFFLINE_KEY, Erasures, MarkerError, encode_marker, is_marker
from streams.settings import default

log = logging.getLogger(__name__)

HANDLED: Final = (
    "applied",
    "redelivered",
    "duplicate_id",
    "dead_lettered",
    "ignored",
    "erasures",
    "erased",
)
"""Every consumed input message is counted as exactly one of these: `redelivered` is an
input at or below its user's last applied offset (Kafka delivered it again after a crash or a
rebalance), `duplicate_id` a producer's retry: an event id the user applied within the dedupe
window; `erasures` an erase command applied, `erased` an input of an erased user at or before
its erase time, skipped (streams/runtime/erasure.py)."""
REPORTED: Final = (
    *HANDLED,
    "late",
    "predictions",
    "episodes",
    "closed_by_timer",
    "ticks",
    "behind_watermark",
    "closed_early",
    "clock_ahead",
    "implausible_times",
    "ids_forgotten_early",
    "quarantined",
    "internal_errors",
    "gaps",
    "refetched",
    "fenced_batches",
    "expired",
)
"""The counters the worker's summary line shows, in order."""

PREDICTIONS: Final = "predictions"
EPISODES: Final = "episodes"
DLQ: Final = "dlq"

StateWrite = tuple[bytes, bytes | None, int]
"""A user's state to store: (key, encoded state, partition); None deletes the user (its
changelog record is a tombstone)."""

_CLOSED_EARLY_LOGGED: Final = 20
"""The first this many `closed_early` inputs are logged one by one, then every 1,000th."""


@dataclass(frozen=True, slots=True)
class TimePolicy:
    """How a partition's watermark moves (docs/time.md has the contract)."""

    lateness_ms: int = default("lateness_ms")
    """The watermark trails the largest event time by this: disorder across users within it
    changes nothing. Product SDKs batch events for up to a minute; two covers that."""
    idle_ms: int = default("idle_ms")
    """A caught-up partition with no input for this long lets the wall clock run its clock on
    from its newest event time, so silent users close on time in live traffic."""
    max_skew_ms: int = default("max_skew_ms")
    """An event time may run ahead of its record's timestamp (and of the worker's clock) by
    this before it stops moving the watermark: one client's wrong clock closes nobody else's
    episode."""
    hold_until_end: bool = False
    """A bounded run (backfill, replay) closes nothing until a partition reached its end, so
    its outputs do not depend on the order of the topic at all."""


@dataclass(slots=True)
class PartitionClock:
    """One input partition's time."""

    event_time: int | None = None
    """The largest event time applied on it."""
    last_input_wall: int | None = None
    """Wall time (ms) the partition last had input, or was assigned to this worker."""
    watermark: int | None = None
    """The highest watermark a tick has closed episodes at."""


@dataclass(slots=True)  # not frozen: one per input (see engine/state.py); never changed
class InMessage:
    """One consumed record, from either the input topic or the ticks topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None


@dataclass(slots=True)  # not frozen: one per output (see engine/state.py); never changed
class Output:
    """A message to publish: the output role (predictions, episodes, dlq), key and value."""

    role: str
    key: bytes | None
    value: bytes
    """The encoded message (empty when the processor encodes none: offline runs)."""
    message: dict[str, Any] = field(default_factory=dict, compare=False)
    """The message before encoding (offline runs write it as a JSON line)."""


class Table:
    """What the processor needs of the state table; `streams/runtime/app.py` adapts Faust's."""

    def get(self, key: bytes, partition: int) -> bytes | None:  # pragma: no cover - interface
        """The stored value of `key`, read on `partition` (its input's)."""
        raise NotImplementedError

    def set(self, key: bytes, value: bytes | None, partition: int) -> None:  # pragma: no cover
        """Store `value`, written to `partition` (None: delete the key)."""
        raise NotImplementedError


@dataclass
class _Slot:
    user: StoredUser
    partition: int
    """The partition its state is read from and written to (its input's)."""
    dirty: bool = False
    encoded: bytes | None = None
    """`encode_stored(user)`, once `Processor.stage` made it (a slot's user never changes
    after its batch: a later batch that changes the user makes a slot of its own)."""
    gone: bool = False
    """The user expired: its stored state is deleted, and `user` is a new user's, which an
    input later in the batch starts from (and is then written instead)."""


class StateCache:
    """Decoded users kept between batches: the most recently used of them, and those whose
    newest state is not written yet; `limit` users in all.

    A batch's users go in once the batch's outputs are handed to the producer
    (`Processor.stage`). The worker writes their states once those outputs are acknowledged,
    or, while a backlog waits, a few batches later (`unwritten`, written by
    `Processor.commit`): either way a batch reads each user's newest state from
    here. A written user stays as the most recently used; one never written
    is never evicted, and the worker writes them all before half the limit is unwritten.
    Entries of partitions this worker no longer owns are dropped, and the whole cache after a
    recovery, since the table may have changed underneath.
    """

    def __init__(self, limit: int) -> None:
        """Keep at most `limit` users (0: none cached once written)."""
        self.limit = limit
        self.users: OrderedDict[bytes, StoredUser] = OrderedDict()
        self.unwritten: dict[bytes, _Slot] = {}
        """Users changed by batches whose states are not written yet, with the partition to
        write each on."""
        self.hits = self.misses = 0

    def get(self, key: bytes) -> StoredUser | None:
        """The cached written user, now the most recently used, or None (a batch reads an
        unwritten one from `unwritten` first, with the partition it is to be written on)."""
        user = self.users.get(key)
        if user is None:
            self.misses += 1
            return None
        self.hits += 1
        self.users.move_to_end(key)
        return user

    def peek(self, key: bytes) -> StoredUser | None:
        """The cached user or None, read-only: no hit or miss counted, the LRU order kept.

        Safe from another thread: dict lookups, atomic under the GIL, that
        never mutate or iterate the cache. A user leaves `unwritten` only after it is in
        `users`, so it is always in one of them; the StoredUser returned and its engine state
        are replaced, never changed, when its user changes.
        """
        slot = self.unwritten.get(key)
        if slot is not None:
            return slot.user
        return self.users.get(key)

    def put(self, key: bytes, user: StoredUser) -> None:
        """Cache `user` (evicting the least recently used beyond the limit)."""
        if self.limit <= 0:
            return
        users = self.users
        users[key] = user
        users.move_to_end(key)
        room = max(self.limit - len(self.unwritten), 0)
        while len(users) > room:
            users.popitem(last=False)

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget the users of `partitions`, unwritten ones included."""
        gone = set(partitions)
        for key in [k for k, u in self.users.items() if u.partition in gone]:
            del self.users[key]
        for key in [k for k, slot in self.unwritten.items() if slot.user.partition in gone]:
            del self.unwritten[key]

    def clear(self) -> None:
        """Forget everyone, unwritten users included."""
        self.users.clear()
        self.unwritten.clear()


@dataclass
class Batch:
    """One batch's reads, writes and outputs: each user read once and written once."""

    table: Table
    config: EngineConfig
    slots: dict[bytes, _Slot] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    cache: StateCache | None = None
    unwritten: Mapping[bytes, _Slot] = field(default_factory=dict)
    """Users changed by earlier batches and not written yet (`StateCache.unwritten`)."""
    timer_closes_left: int | None = None
    """How many more episodes the timer may close in this batch (None: no limit)."""
    markers: dict[bytes, StateWrite] = field(default_factory=dict)
    """Erasure markers the batch wrote: marker key -> its write (streams/runtime/erasure.py)."""

    def slot(self, key: bytes, message: InMessage) -> _Slot:
        """The user's state for this batch, from the cache or read from the table (a new
        user's initial state when there is none).

        Raises:
            StateFormatError: the stored value cannot be read (it is left as it is).
        """
        slot = self.slots.get(key)  # (most inputs: a user the batch has read already)
        if slot is not None:
            return slot
        slot = self.stored_slot(key, message)
        if slot is None:
            user = StoredUser(create_state(self.config), message.partition, -1)
            slot = self.slots[key] = _Slot(user, message.partition)
        return slot

    def stored_slot(self, key: bytes, message: InMessage) -> _Slot | None:
        """The user's state for this batch if the user has one (in this batch, the cache or
        the table), else None.

        Raises:
            StateFormatError: the stored value cannot be read (it is left as it is).
        """
        slot = self.slots.get(key)
        if slot is None:
            unwritten = self.unwritten.get(key)
            if unwritten is not None:  # changed by an earlier batch, to be written with this
                slot = self.slots[key] = _Slot(unwritten.user, unwritten.partition, dirty=True)
                return slot
            user = None if self.cache is None else self.cache.get(key)
            if user is None:
                raw = self.table.get(key, message.partition)
                if raw is None:
                    return None
                user = decode_stored(raw, self.config)
            slot = self.slots[key] = _Slot(user, message.partition)
        return slot

    def writes(self) -> Iterable[StateWrite]:
        """(key, value, partition) of every user the batch changed (None: deleted)."""
        for key, slot in self.slots.items():
            if slot.dirty:
                yield key, None if slot.gone else encode_stored(slot.user), slot.partition
        yield from self.markers.values()


class Processor:
    """Applies batches of messages; keeps partition clocks, the deadline index and counters."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        events_topic: str,
        ticks_topic: str,
        time: TimePolicy | None = None,
        output_format: Format | None = "msgpack",
        stop_offsets: Mapping[int, int] | None = None,
        cache_users: int = 0,
        timer_closes_per_batch: int | None = None,
        faults: tuple[type[BaseException], ...] = (),
        index_users: bool = True,
        erasure_key: bytes = OFFLINE_KEY,
    ) -> None:
        """Set up for one worker; partitions' time starts unknown. `faults`: exceptions of
        the machine (the table's storage errors) that a message must never be dead-lettered
        for: they are raised (the worker stops, streams/runtime/failstop.py). `index_users`:
        keep the deadline and expiry indexes as inputs apply (an offline run, which closes
        nothing until its end, fills them itself then). `erasure_key` keys the digests of
        erased users' markers (streams/runtime/erasure.py)."""
        self.index_users = index_users
        self.config = config
        self.faults: tuple[type[BaseException], ...] = (MemoryError, *faults)
        self.events_topic, self.ticks_topic = events_topic, ticks_topic
        self.time = time or TimePolicy()
        self.output_format: Format | None = output_format
        """How outputs are encoded; None: not at all (`Output.value` is empty), for offline
        runs, which write each output's `message` as a JSON line themselves."""
        self.stop_offsets = stop_offsets
        """A backfill's end: partition -> the first offset not to apply (None: no end)."""
        self.counts: Counter[str] = Counter()
        self.by_partition: Counter[tuple[str, int]] = Counter()
        """(outcome, input partition) -> inputs: the HANDLED outcomes and `late`, per
        partition (the worker's /metrics labels them; `counts` has the totals)."""
        self.closed_by_reason: Counter[str] = Counter()
        """Episode reason (`end`, `timeout`) -> episodes closed, the timer's closes included."""
        self.clocks: dict[int, PartitionClock] = {}
        self.next_offset: dict[int, int] = {}
        """Partition -> the next input offset to handle: one past the highest handled, or
        the committed offset when the partition was assigned (`expect`)."""
        self.open: dict[int, dict[bytes, int]] = {}
        """Partition -> user key -> the timeout deadline of the user's open episode."""
        self.deadlines: dict[int, list[tuple[int, bytes]]] = {}
        """Partition -> heap of (deadline, user key): for every user in `open`, an entry at
        or before its deadline there. An event that moves a deadline later (nearly every
        event) pushes nothing: its old entry, once due, is filed again at the new deadline
        (`close_due`). An entry of a user no longer in `open` is stale and skipped; the heap
        is compacted when stale entries outnumber live ones, so it holds at most about two
        entries per open episode."""
        self.rewrite: dict[int, list[bytes]] = {}
        """Partition -> users to write again on its next batch (see `rebuild`)."""
        self.expiries: dict[int, OrderedDict[bytes, int]] = {}
        """With `stateTtl`: partition -> user key -> when the user expires (its newest event
        time + the TTL), in the order the users were last applied to, which is nearly the
        order of their times (`expire_due`)."""
        self.committed_input: Callable[[int], int | None] | None = None
        """The worker's committed offset of an input partition (None when unknown). A tick
        deletes an expired user only once its last input is committed: an input read again
        after a crash must find the state that says it was applied. None: every input
        handled is durable (the offline runs)."""
        self.cache = StateCache(cache_users)
        """Decoded users between batches (see `batch`, `hold` and `written`)."""
        self.timer_closes_per_batch = timer_closes_per_batch
        """Most episodes the timer closes in one batch (None: every due one). When a
        partition's watermark jumps (live input after a backlog of old events), thousands of
        episodes fall due at once; closing them all in one batch stalled the worker for
        seconds. The rest stay due and close on the next ticks, at the same deadlines, so the
        outputs do not change, only when they are published."""
        self.more_due: set[int] = set()
        """Partitions whose last tick left due episodes open (the per-batch limit): the worker
        ticks them again at once instead of a tick interval later."""
        self.ticks_left_due: set[tuple[int, int]] = set()
        """(partition, offset) of the ticks that left due episodes open: a backfill's
        partition is finished only by a tick that closed all of them (`Backfill.advance`)."""
        self.ticks_at_end: set[tuple[int, int]] = set()
        """A bounded run's ticks handled with their partition at its end (the ones that close
        what is due there): only such a tick finishes a backfill's partition. A tick handled
        before the partition's last inputs in the same batch closes nothing, though the
        partition is at its end once the batch is written (`took_tick_at_end`)."""
        self.quarantined: set[bytes] = set()
        """Users whose stored state cannot be read: their inputs are dead-lettered."""
        self.erasures = Erasures(erasure_key)
        """Erased users' erase times (streams/runtime/erasure.py)."""
        self.unwritten_markers: dict[bytes, StateWrite] = {}
        """Erasure markers of staged batches, written with the staged users by `commit`."""
        self._gap_logged: dict[int, int] = {}

    def batch(self, table: Table) -> Batch:
        """A new batch over `table` that reads through the cache."""
        return Batch(
            table,
            self.config,
            cache=self.cache if self.cache.limit > 0 else None,
            unwritten=self.cache.unwritten,
            timer_closes_left=self.timer_closes_per_batch,
        )

    def stage(self, batch: Batch, *, encode: Callable[[], bool] = lambda: False) -> None:
        """Keep the batch's users for the next batches: the users it changed as unwritten
        (`commit` writes them), the others cached. Call once its outputs are handed to the
        producer; the worker commits only once they are acknowledged, so a state is never
        stored before its outputs are out. `encode()`, asked once they are staged: True
        encodes the changed states now (while the outputs travel), not when committed."""
        cache = self.cache
        unwritten = cache.unwritten
        changed = []
        for key, slot in batch.slots.items():
            if slot.dirty:
                # The user's older state may stay in `users` until `commit` replaces it:
                # every read looks in `unwritten` first, and an entry of `users` is always a
                # written state, the one to read again if the staged ones are discarded.
                unwritten[key] = slot
                changed.append(slot)
            elif key not in unwritten:
                cache.put(key, slot.user)
        self.unwritten_markers.update(batch.markers)
        if changed and encode():
            for slot in changed:
                if slot.encoded is None and not slot.gone:
                    slot.encoded = encode_stored(slot.user)

    def commit(self, store: Callable[[list[StateWrite]], None]) -> list[StateWrite]:
        """Write every staged user's newest state with `store` (key, value, partition), then
        cache them as written; returns the writes (for their changelog records)."""
        cache = self.cache
        unwritten = cache.unwritten
        writes: list[StateWrite] = [
            (
                key,
                None
                if slot.gone
                else encode_stored(slot.user)
                if slot.encoded is None
                else slot.encoded,
                slot.partition,
            )
            for key, slot in unwritten.items()
        ]
        writes += self.unwritten_markers.values()
        store(writes)
        self.unwritten_markers.clear()
        self.erasures.written()
        for key, slot in list(unwritten.items()):
            if slot.gone:
                cache.users.pop(key, None)
            else:
                cache.put(key, slot.user)
            del unwritten[key]  # after `put`: a lookup finds the user in one or the other
        return writes

    def discard(self) -> int:
        """Forget the staged users (their inputs are read again); how many."""
        dropped = len(self.cache.unwritten)
        self.cache.unwritten.clear()
        self.unwritten_markers.clear()
        self.erasures.discard()
        return dropped

    def staged(self) -> int:
        """Users staged and not committed yet."""
        return len(self.cache.unwritten)

    def note_refetched(self, total: int) -> None:
        """Input records the gap filler read from the broker so far (`refetched`)."""
        self.counts["refetched"] = total

    def note_fenced_batch(self) -> None:
        """A batch the fence dropped unwritten (`fenced_batches`)."""
        self.counts["fenced_batches"] += 1

    def take_more_due(self, owned: Iterable[int]) -> list[int]:
        """The partitions among `owned` whose due episodes the last tick did not all close
        (they get a tick again now); none after this call."""
        due = sorted(self.more_due & set(owned))
        self.more_due.clear()
        return due

    def took_tick_at_end(self, tick: tuple[int, int]) -> bool:
        """True when the tick (partition, offset) was handled with its partition at its end
        (a bounded run) and closed every episode due there; False when it came before the
        partition's end, or closed only part of them (the rest go on a tick sent again). The
        tick is forgotten as this answers."""
        at_end = tick in self.ticks_at_end and tick not in self.ticks_left_due
        self.ticks_at_end.discard(tick)
        self.ticks_left_due.discard(tick)
        return at_end

    def write_again(self, partition: int, keys: Iterable[bytes]) -> None:
        """Write these users of `partition` again on its next tick (their last changelog
        record was stale)."""
        self.rewrite.setdefault(partition, []).extend(keys)

    def count_input(self, outcome: str, partition: int) -> None:
        """Count one input's outcome (a HANDLED name, or `late`), in total and per partition."""
        self.counts[outcome] += 1
        self.by_partition[outcome, partition] += 1

    def handled(self) -> int:
        """Input messages handled so far (each counted as exactly one of HANDLED)."""
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
    ) -> None:
        """Apply `messages` in order; outputs and writes accumulate in `batch`. The wall
        clock is read once for the batch's inputs (a batch lasts milliseconds; the clock only
        decides idleness and clocks running ahead by far more) and at each tick."""
        now: int | None = None
        next_offset, ticks_topic, stop = self.next_offset, self.ticks_topic, self.stop_offsets
        for message in messages:
            partition, offset = message.partition, message.offset
            if self.rewrite and partition in self.rewrite:
                self._write_again(batch, message, self.rewrite.pop(partition))
            if message.topic == ticks_topic:
                at_end = caught_up(partition)
                if at_end and self.time.hold_until_end:
                    self.ticks_at_end.add((partition, offset))
                self.on_tick(batch, message, at_end, wall_ms())
                continue
            if stop is not None and offset >= stop.get(partition, 0):  # beyond a backfill's end
                self.counts["beyond_end"] += 1
                continue
            expected = next_offset.get(partition)
            if expected is not None and offset > expected:
                self._note_gap(message, expected)
            if now is None:
                now = wall_ms()
            self.on_input(batch, message, now)
            if expected is None or offset >= expected:
                next_offset[partition] = offset + 1

    def _write_again(self, batch: Batch, message: InMessage, keys: list[bytes]) -> None:
        """Write users again unchanged (one changelog record each), on `message`'s partition.
        Users without a state here are left alone: this worker writes them when it applies
        their input (an expired user a stale record brings back expires again at the next
        tick)."""
        for key in keys:
            try:
                slot = batch.stored_slot(key, message)
            except StateFormatError:
                continue
            if slot is None:
                continue
            slot.dirty = True
            self.counts["rewritten"] += 1

    def _note_gap(self, message: InMessage, expected: int) -> None:
        """Count (and log once per hole) input offsets that were never delivered: `message`
        came after `expected`, the partition's next offset (`run_batch` compares them).

        Offsets of a partition are contiguous unless the log itself has holes: transaction
        markers and aborted records (read_committed), compaction, or retention deleting input
        before it was read. Those are real and nothing is missing, so the message is applied.
        (Faust's own drop of fetched input around rebalances is fixed in
        `streams/faust/delivery.py`; this count is the cheap check that it stays fixed.)
        """
        self.counts["gaps"] += 1
        if self._gap_logged.get(message.partition) != expected:
            self._gap_logged[message.partition] = expected
            log.info(
                "input partition %s: offsets %s..%s were not delivered (transaction markers, "
                "compaction or retention); going on",
                message.partition,
                expected,
                message.offset - 1,
            )

    def on_input(self, batch: Batch, message: InMessage, wall_ms: int | None = None) -> None:
        """Decode, check, deduplicate and apply one input message; raises only `faults`."""
        clock = self._clock(message.partition)
        if wall_ms is not None:
            clock.last_input_wall = wall_ms
        try:
            try:
                event = decode_event(message.value or b"", fallback_ts=message.timestamp_ms)
            except IgnoredMessage:
                self.count_input("ignored", message.partition)
                return
            except DecodeError as exc:
                self.dead_letter(batch, message, str(exc))
                return
            self.apply(batch, message, event, wall_ms)
        except self.faults:
            raise  # the machine's fault, not the input's: never a dead letter
        except Exception as exc:
            self.counts["internal_errors"] += 1
            log.exception(
                "input %s:%s:%s could not be handled; dead-lettered",
                message.topic,
                message.partition,
                message.offset,
            )
            self.dead_letter(batch, message, f"internal error: {type(exc).__name__}: {exc}")

    def apply(
        self, batch: Batch, message: InMessage, event: Event, wall_ms: int | None = None
    ) -> None:
        """Apply one decoded input to its user (the worker's and the offline runs' path).

        All that can fail (the key check, reading the state, the engine, encoding the
        outputs) happens before the batch changes, so a failure dead-letters the message
        and leaves the user as it was. `wall_ms` is the run's clock (docs/time.md).
        """
        if event.type == "erase":
            self._erase(batch, message, event, wall_ms)
            return
        found = self._user_of(batch, message, event, wall_ms)
        if found is None:
            return
        key, slot = found
        if self._skipped(batch, message, event, slot, wall_ms):
            return
        ttl = self.config.state_ttl_ms
        if ttl is not None and slot.user.clock is not None and event.at - slot.user.clock > ttl:
            self._expire(batch, message, key, slot, event.at)  # the user starts again
        digest = None
        if event.id is not None and self.config.dedupe_window_ms > 0:
            digest = id_digest(event.id)
            if digest in slot.user.recent:  # a producer's retry (engine/dedupe.py)
                self.count_input("duplicate_id", message.partition)
                return
        try:
            step = apply_event(slot.user.state, event)
        except EngineError as exc:
            self.dead_letter(batch, message, str(exc))
            return
        self._commit(batch, message, key, slot, step, digest=digest)

    def _user_of(
        self, batch: Batch, message: InMessage, event: Event, wall_ms: int | None
    ) -> tuple[bytes, _Slot] | None:
        """The input's user key and state, or None once the input is done with: dead-lettered
        (a key that is not its user, a user whose stored state cannot be read), or skipped
        as an erased user's."""
        try:
            key = _user_key(message.key, event.user)
        except DecodeError as exc:
            self.dead_letter(batch, message, str(exc))
            return None
        erased_at = self.erasures.erased_at(key, message.partition)
        if erased_at is not None and event.at <= erased_at:
            self._skip_erased(batch, message, event, wall_ms)
            return None
        if key in self.quarantined:
            self.dead_letter(batch, message, _quarantine_reason(event.user, "see earlier"))
            return None
        try:
            return key, batch.slot(key, message)
        except StateFormatError as exc:
            self.quarantined.add(key)
            self.counts["quarantined"] = len(self.quarantined)
            log.error("user %r quarantined: its stored state is unreadable: %s", event.user, exc)
            self.dead_letter(batch, message, _quarantine_reason(event.user, str(exc)))
            return None

    def _skipped(
        self, batch: Batch, message: InMessage, event: Event, slot: _Slot, wall_ms: int | None
    ) -> bool:
        """Whether the input is done with before the engine sees it: redelivered, or
        dead-lettered for a clock running too far ahead."""
        if message.offset <= slot.user.last_offset:
            # A redelivery after a crash. The local store already has this input, but its
            # changelog record may not have left before the crash: write the state again so
            # a restore from the changelog cannot fall behind the committed offsets.
            self.count_input("redelivered", message.partition)
            slot.dirty = True
            return True
        return self._refused_ahead(batch, message, event.at, wall_ms)

    def _skip_erased(
        self, batch: Batch, message: InMessage, event: Event, wall_ms: int | None
    ) -> None:
        """Skip an input of an erased user at or before its erase time (`erased`).

        Its time still moves the partition's clock, as it did when the worker applied it
        before the erasure (the time contract reads the stream's event times, whoever they
        belong to). A clock running too far ahead is refused first, as it was then.
        """
        if self._refused_ahead(batch, message, event.at, wall_ms):
            return
        clock = self._clock(message.partition)
        if clock.event_time is None or event.at > clock.event_time:
            clock.event_time = event.at
        self.count_input("erased", message.partition)

    def _erase(self, batch: Batch, message: InMessage, event: Event, wall_ms: int | None) -> None:
        """Apply an erase command: delete the user's state (a changelog tombstone, even where
        none is stored here, so no stale value survives compaction), whether or not it can be
        read; remember the erasure by a marker; publish the `erased` message."""
        try:
            key = _user_key(message.key, event.user)
        except DecodeError as exc:
            self.dead_letter(batch, message, str(exc))
            return
        if self._refused_ahead(batch, message, event.at, wall_ms):
            return  # an erase time in the future would erase what is yet to come
        partition = message.partition
        erasures = self.erasures
        marker = erasures.key(key)
        erased_at = max(event.at, erasures.erased_at(key, partition) or event.at)
        # The output is made first: encoding can fail, and the batch is then unchanged.
        message_out = self._output(
            PREDICTIONS, key, erased_message(event.user, erased_at, event.id)
        )
        fresh = StoredUser(create_state(self.config), partition, -1)
        batch.slots[key] = _Slot(fresh, partition, dirty=True, gone=True)
        self.quarantined.discard(key)  # an unreadable state is deleted like any other
        self.counts["quarantined"] = len(self.quarantined)
        self._unindex(partition, key)
        erasures.record(partition, marker, erased_at)
        batch.markers[marker] = (marker, encode_marker(partition, erased_at, event.id), partition)
        batch.outputs.append(message_out)
        self.counts[PREDICTIONS] += 1
        self.count_input("erasures", partition)

    def _commit(
        self,
        batch: Batch,
        message: InMessage,
        key: bytes,
        slot: _Slot,
        step: Step,
        *,
        digest: bytes | None,
    ) -> None:
        """Record an applied input: its outputs, the user's new stored state, the clocks."""
        event, user, closed = step.event, slot.user, step.closed
        inputs = user.inputs + 1
        episodes = user.episodes if closed is None else user.episodes + 1
        # The outputs are made (and encoded) first: that can fail, and the batch is unchanged.
        episode = None
        if closed is not None:
            episode = self._output(EPISODES, key, episode_message(event.user, closed, episodes))
        prediction = None
        predicted = prediction_message(
            event.user, step, inputs, lives=self.config.state_ttl_ms is not None
        )
        if predicted is not None:
            prediction = self._output(PREDICTIONS, key, predicted)
        # Nothing below can fail: commit the input to the batch.
        partition = message.partition
        clock = self.clocks.get(partition) or self._clock(partition)
        if clock.watermark is not None or user.timer_close is not None:
            self._count_time(event, step.at, user, clock)
        if clock.event_time is None or event.at > clock.event_time:
            clock.event_time = event.at
        if event.at < EARLIEST_MS:
            self._count_implausible(event)
        user_clock = user.clock
        if user_clock is None or event.at > user_clock:
            user_clock = event.at
        slot.user = StoredUser(  # every field by position: keywords cost twice the call
            step.state,
            partition,
            message.offset,
            inputs,
            episodes,
            user_clock,
            user.timer_close if event.type == "revealed" else None,
            None,  # tick_offset: an input, not a tick, wrote this state
            self._recent_ids(user, step.at, digest),
            user.packed,
        )
        slot.partition = partition
        slot.dirty = True
        slot.gone = False
        counts = self.counts
        counts["applied"] += 1  # `_count_applied`, inline: this runs once per applied input
        self.by_partition["applied", partition] += 1
        if step.late:
            self.count_input("late", partition)
        outputs = batch.outputs
        if closed is not None and episode is not None:  # (the one implies the other)
            self.closed_by_reason[closed.reason] += 1
            counts[EPISODES] += 1
            outputs.append(episode)
        if prediction is not None:
            counts[PREDICTIONS] += 1
            outputs.append(prediction)
        if self.index_users:
            self._index(partition, key, slot.user)

    def _recent_ids(self, user: StoredUser, at: int, digest: bytes | None) -> RecentIds:
        """The user's remembered ids after an input applied at `at` (with the id `digest`)."""
        config = self.config
        window = config.dedupe_window_ms
        if digest is None:
            return forget_before(user.recent, at - window)
        recent, early = remember(
            user.recent, digest, at, window_ms=window, max_ids=config.dedupe_max_ids
        )
        if early:
            self.counts["ids_forgotten_early"] += early
        return recent

    def _refused_ahead(
        self, batch: Batch, message: InMessage, at: int, wall_ms: int | None
    ) -> bool:
        """Dead-letter the input if its time `at` runs too far ahead (`clock_ahead`)."""
        ahead = self._too_far_ahead(at, message.timestamp_ms, wall_ms)
        if ahead is None:
            return False
        self.counts["clock_ahead"] += 1
        self.dead_letter(batch, message, ahead)
        return True

    def _too_far_ahead(self, at: int, record_ms: int | None, clock_ms: int | None) -> str | None:
        """Why an input at `at` is refused, or None: its time runs more than the allowed skew
        ahead of the earlier of its record's timestamp and the clock of the run (a wrong device
        clock, which must not move its user, or anyone, into the future).

        The record's timestamp decides whenever it is known and not later than the clock, so
        a live run and a backfill of the same topic decide alike; a file has no records, so
        a replay decides by its own clock (docs/time.md).
        """
        if record_ms is not None and record_ms > 0:
            if clock_ms is not None and clock_ms < record_ms:
                reference, what = clock_ms, "the worker's clock"
            else:
                reference, what = record_ms, "its record's timestamp"
        elif clock_ms is not None:
            reference, what = clock_ms, "the clock of the run"
        else:
            return None
        skew = self.time.max_skew_ms
        if at <= reference + skew:
            return None
        return (
            f"the event time {show_time(at)} runs {at - reference:,} ms ahead of {what} "
            f"{show_time(reference)}, more than the allowed clock skew of {skew:,} ms "
            "(ORACULAR_MAX_SKEW_MS): the device's clock is wrong; correct it, or send sentAt "
            "(sent_at) with the event so the skew is corrected"
        )

    def _count_implausible(self, event: Event) -> None:
        """Count an applied input dated before 2000: valid, but no real product's event (a
        wrong unit upstream, most often epoch seconds). The worker applies it as sent, so live
        still equals replay (the offline tools stop on it instead); said once in the log."""
        self.counts["implausible_times"] += 1
        if self.counts["implausible_times"] == 1:
            problem = implausible(event.at, int(time.time() * 1000))
            log.warning(
                "user %r: event time %s; applied as sent, and counted as implausible_times "
                "(said once): fix the producer's time unit",
                event.user,
                problem,
            )

    def _count_time(self, event: Event, at: int, user: StoredUser, clock: PartitionClock) -> None:
        """Count inputs outside the live = replay contract (docs/time.md)."""
        if clock.watermark is not None and event.at < clock.watermark:
            self.counts["behind_watermark"] += 1
        if event.type != "revealed" and user.timer_close is not None and at <= user.timer_close:
            # The timer closed this user's episode at `timer_close`, and this input is not
            # later than that: a replay would have kept the episode open for it.
            self.counts["closed_early"] += 1
            n = self.counts["closed_early"]
            if n <= _CLOSED_EARLY_LOGGED or n % 1000 == 0:
                log.warning(
                    "user %r: input at %s arrived after the timer closed the episode at %s "
                    "(arrived later than the allowed lateness); it starts a new episode, "
                    "where a replay would have kept one (closed_early=%s)",
                    event.user,
                    show_time(at),
                    show_time(user.timer_close),
                    n,
                )

    # --- time ----------------------------------------------------------------------------

    def watermark(self, partition: int, caught_up: bool, now_ms: int) -> int | None:
        """The partition's watermark at wall time `now_ms` (None: nothing may close yet).

        The largest event time minus the lateness; while the partition is caught up and has
        been idle for the idle time, its clock runs on from that event time with the wall
        clock (never past the wall clock). A bounded run holds everything until its end.
        """
        policy = self.time
        clock = self._clock(partition)
        newest = clock.event_time
        if policy.hold_until_end:
            if not caught_up:
                return None
            end = now_ms if newest is None else max(newest, now_ms)
            return end - policy.lateness_ms
        if newest is None:
            return None  # no event time yet: nothing on the partition can be due
        watermark = newest - policy.lateness_ms
        quiet_since = clock.last_input_wall
        if caught_up and quiet_since is not None and now_ms - quiet_since >= policy.idle_ms:
            runs_to = min(newest + now_ms - quiet_since, now_ms)
            watermark = max(watermark, runs_to - policy.lateness_ms)
        return watermark

    def on_tick(self, batch: Batch, message: InMessage, caught_up: bool, wall_ms: int) -> None:
        """Close the due episodes of the tick's partition at its watermark (after writing
        again the users a frozen worker may have left a stale changelog record of)."""
        self.counts["ticks"] += 1
        tick = decode_tick(message.value)
        rewrites = tick.rewrite
        if rewrites:
            log.warning(
                "partition %s: writing %s user(s) again whose last changelog record may be a "
                "frozen worker's",
                message.partition,
                len(rewrites),
            )
            self._write_again(batch, message, rewrites)
        now = tick.sent_at or wall_ms
        watermark = self.watermark(message.partition, caught_up, now)
        if watermark is not None:
            self.close_due(batch, message, watermark)
            self.expire_due(batch, message, watermark)

    def close_due(self, batch: Batch, message: InMessage, watermark: int) -> int:
        """Close the episodes of `message`'s partition due before `watermark`; how many."""
        partition = message.partition
        clock = self._clock(partition)
        if clock.watermark is None or watermark > clock.watermark:
            clock.watermark = watermark
        heap = self.deadlines.get(partition)
        live = self.open.get(partition, {})
        closed = 0
        self.more_due.discard(partition)
        while heap and heap[0][0] < watermark:
            if batch.timer_closes_left is not None and closed >= batch.timer_closes_left:
                self.more_due.add(partition)  # the rest on the next tick (`more_due`)
                if message.topic == self.ticks_topic:
                    self.ticks_left_due.add((partition, message.offset))
                break
            deadline, key = heapq.heappop(heap)
            current = live.get(key)
            if current != deadline:
                if current is not None and current > deadline:  # moved later by an event
                    heapq.heappush(heap, (current, key))
                continue  # else stale: the episode closed, or an entry of its own is earlier
            del live[key]
            try:
                slot = batch.slot(key, message)
            except StateFormatError:
                continue  # counted and dead-lettered when an input of the user arrives
            transition = close_if_due(slot.user.state, watermark)
            if transition.closed is None:
                continue
            user = slot.user
            number = user.episodes + 1
            self._publish_close(batch, key, transition.closed, number)
            slot.user = StoredUser(
                transition.state,
                user.partition,
                user.last_offset,
                user.inputs,
                number,
                user.clock,
                transition.closed.closed_at,
                message.offset if message.topic == self.ticks_topic else None,
                user.recent,
                user.packed,
            )
            slot.partition = message.partition
            slot.dirty = True
            self.counts["closed_by_timer"] += 1
            closed += 1
        if partition not in self.more_due:  # (a tick read again after a rebalance)
            self.ticks_left_due.discard((partition, message.offset))
        if batch.timer_closes_left is not None:
            batch.timer_closes_left -= closed
        return closed

    def expire_due(self, batch: Batch, message: InMessage, watermark: int) -> int:
        """Delete the users of `message`'s partition that expired before `watermark`
        (`stateTtl`: newest event time + TTL < watermark, the rule `apply` applies when such
        a user's next input comes first); how many.

        A user whose episode is still open waits for `close_due` to close it (the per-batch
        limit can leave it open), and one whose last input is not committed yet waits for
        the commit (`committed_input`). Deleting publishes nothing: the episode's close
        came at its deadline, long before.
        """
        ttl = self.config.state_ttl_ms
        partition = message.partition
        queue = self.expiries.get(partition)
        if ttl is None or not queue:
            return 0
        due = self._due_expiries(queue, watermark, batch.timer_closes_left, message)
        committed = None if self.committed_input is None else self.committed_input(partition)
        if self.committed_input is not None and committed is None:
            return 0  # nothing committed here yet: any input may be read again
        still_open = self.open.get(partition, {})
        expired = waiting = 0
        for key in due:
            if key in still_open:
                waiting += 1
                continue
            try:
                slot = batch.stored_slot(key, message)
            except StateFormatError:
                slot = None  # counted and dead-lettered when an input of the user arrives
            clock = None if slot is None or slot.gone else slot.user.clock
            if slot is None or clock is None:
                del queue[key]
                continue
            user = slot.user
            if clock + ttl >= watermark:  # (the queue is kept current: not expected)
                queue[key] = clock + ttl
                queue.move_to_end(key)
                continue
            if committed is not None and user.last_offset >= committed:
                waiting += 1
                continue  # its last input may be read again: the next tick deletes it
            self._expire(batch, message, key, slot, watermark)
            expired += 1
        if waiting and self.time.hold_until_end and message.topic == self.ticks_topic:
            # A backfill's partition is finished only by a tick that left nothing due (the
            # next regular tick tries again; live, the next tick does anyway).
            self.ticks_left_due.add((partition, message.offset))
        if batch.timer_closes_left is not None:
            batch.timer_closes_left -= expired
        return expired

    def _due_expiries(
        self, queue: Mapping[bytes, int], watermark: int, limit: int | None, message: InMessage
    ) -> list[bytes]:
        """The users at the head of `queue` expired before `watermark`, at most `limit`."""
        due: list[bytes] = []
        for key, expires in queue.items():
            if expires >= watermark:
                break
            if limit is not None and len(due) >= limit:
                self.more_due.add(message.partition)  # the rest on the next tick (`close_due`)
                if message.topic == self.ticks_topic:
                    self.ticks_left_due.add((message.partition, message.offset))
                break
            due.append(key)
        return due

    def _expire(self, batch: Batch, message: InMessage, key: bytes, slot: _Slot, at: int) -> None:
        """The user of `slot` expired by `at`: its open episode closes as the timer closes it
        (at its deadline), its stored state is deleted, and `slot` holds a new user."""
        user = slot.user
        closed = close_if_due(user.state, at).closed
        if closed is not None:
            self._publish_close(batch, key, closed, user.episodes + 1)
        partition = message.partition
        slot.user = StoredUser(create_state(self.config), partition, -1)
        slot.partition = partition
        slot.dirty = slot.gone = True
        self.counts["expired"] += 1
        self._unindex(partition, key)

    def _unindex(self, partition: int, key: bytes) -> None:
        """Take a deleted user out of the deadline and expiry indexes."""
        self.open.get(partition, {}).pop(key, None)
        queue = self.expiries.get(partition)
        if queue is not None:
            queue.pop(key, None)

    def _publish_close(self, batch: Batch, key: bytes, closed: ClosedEpisode, number: int) -> None:
        """Publish the user's `number`-th episode, closed without an input (by the timer, or
        as the user expired), and count it."""
        batch.outputs.append(
            self._output(EPISODES, key, episode_message(key.decode(), closed, number))
        )
        self.counts[EPISODES] += 1
        self.closed_by_reason[closed.reason] += 1

    def dead_letter(self, batch: Batch, message: InMessage, error: str) -> None:
        """Publish the message to the dead-letter topic with the reason and its origin."""
        self.count_input("dead_lettered", message.partition)
        record = dlq_message(
            error,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
        )
        # The record's key may be cut to fit the producer's limit; the Kafka key is cut alike.
        key = record["key"] if isinstance(record.get("key"), bytes) else message.key
        value = b"" if self.output_format is None else encode_output(record, "msgpack")
        batch.outputs.append(Output(DLQ, key, value, record))

    # --- partitions and the deadline index -----------------------------------------------

    def rebuild(
        self,
        items: Iterable[tuple[bytes, bytes]],
        wall_ms: int | None = None,
        committed_ticks: Callable[[int], int | None] | None = None,
    ) -> None:
        """Rebuild clocks and the deadline index from the table's (key, value) pairs.

        Called after recovery. Each partition's event time is the largest of its users'
        clocks, and its idle time starts now (`wall_ms`). Deadlines use the current
        `episodeTimeout`, so a changed timeout applies to episodes already open.

        Users last written by a tick at or past the committed offset of its ticks partition
        (`committed_ticks`; None: unknown, so every such user) may be in the local store
        without their changelog record: the next batch of their partition writes them again.
        """
        self.open, self.deadlines, self.rewrite = {}, {}, {}
        self.cache.clear()
        timeout, ttl = self.config.episode_timeout_ms, self.config.state_ttl_ms
        expiries: dict[int, list[tuple[int, bytes]]] = {}
        self.erasures.clear()
        self.unwritten_markers.clear()
        for key, raw in items:
            if is_marker(key):
                try:
                    self.erasures.load(key, raw)
                except MarkerError:
                    self.counts["unreadable_states"] += 1
                continue
            try:
                index = stored_index(raw)
            except EngineError:
                self.counts["unreadable_states"] += 1
                continue
            clock = self._clock(index.partition)
            if index.tick_offset is not None:
                committed = None if committed_ticks is None else committed_ticks(index.partition)
                if committed is None or index.tick_offset >= committed:
                    self.rewrite.setdefault(index.partition, []).append(key)
            if wall_ms is not None:
                clock.last_input_wall = wall_ms
            if index.clock is not None and (
                clock.event_time is None or index.clock > clock.event_time
            ):
                clock.event_time = index.clock
            if timeout is not None and index.open_since is not None:
                deadline = index.open_since + timeout
                self.open.setdefault(index.partition, {})[key] = deadline
                self.deadlines.setdefault(index.partition, []).append((deadline, key))
            if ttl is not None and index.clock is not None:
                expiries.setdefault(index.partition, []).append((index.clock + ttl, key))
        for heap in self.deadlines.values():
            heapq.heapify(heap)
        self.expiries = {p: OrderedDict((k, t) for t, k in sorted(e)) for p, e in expiries.items()}

    def open_episodes(self) -> int:
        """Users with an open episode in the deadline index."""
        return sum(len(users) for users in self.open.values())

    def index_entries(self) -> int:
        """Entries in the deadline heaps, stale ones included (bounded: see `deadlines`)."""
        return sum(len(heap) for heap in self.deadlines.values())

    def expect(self, partition: int, offset: int) -> None:
        """Start `partition` at `offset` (its committed offset) unless it is known already."""
        self.next_offset.setdefault(partition, offset)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop the time, index and cached users of partitions this worker no longer owns."""
        partitions = list(partitions)
        for partition in partitions:
            self.clocks.pop(partition, None)
            self.next_offset.pop(partition, None)
            self.open.pop(partition, None)
            self.deadlines.pop(partition, None)
            self.rewrite.pop(partition, None)
            self.expiries.pop(partition, None)
            self._gap_logged.pop(partition, None)
        self.cache.drop(partitions)
        self.erasures.drop(partitions)

    def _clock(self, partition: int) -> PartitionClock:
        clock = self.clocks.get(partition)
        if clock is None:
            clock = self.clocks[partition] = PartitionClock()
        return clock

    def _index(self, partition: int, key: bytes, user: StoredUser) -> None:
        ttl = self.config.state_ttl_ms
        if ttl is not None and user.clock is not None:
            queue = self.expiries.get(partition)
            if queue is None:
                queue = self.expiries[partition] = OrderedDict()
            queue[key] = user.clock + ttl
            queue.move_to_end(key)
        live = self.open.get(partition)
        if live is None:
            live = self.open[partition] = {}
        timeout = self.config.episode_timeout_ms
        episode = user.state.episode
        if timeout is None or episode.started_at is None or episode.last_event_at is None:
            live.pop(key, None)
            return
        deadline = episode.last_event_at + timeout
        filed = live.get(key)
        live[key] = deadline
        if filed is not None and filed <= deadline:
            return  # its entry at `filed` or earlier is in the heap (see `deadlines`)
        heap = self.deadlines.setdefault(partition, [])
        heapq.heappush(heap, (deadline, key))
        if len(heap) > 2 * len(live) + 1024:
            # Drop stale entries: the heap stays within about two entries per open episode.
            heap[:] = [(d, k) for k, d in live.items()]
            heapq.heapify(heap)

    def _output(self, role: str, key: bytes, message: dict[str, Any]) -> Output:
        fmt = self.output_format
        return Output(role, key, b"" if fmt is None else encode_output(message, fmt), message)


def _quarantine_reason(user: str, detail: str) -> str:
    return (
        f"the stored state of user {user[:64]!r} cannot be read ({detail}); it is kept as it "
        "is and the user's inputs go to the dead-letter topic until it is repaired or reset"
    )


def _user_key(key: bytes | None, user: str) -> bytes:
    """The table key: the message key, which must be the user id (it decides the partition)."""
    if key is None:
        msg = f"the message has no key: key it by the user id ({user[:64]!r}) with murmur2"
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
