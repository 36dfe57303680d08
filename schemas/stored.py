"""The state table's values: one user's engine state plus what the worker needs around it.

Version 3 (written by this worker):

    [3, partition, last_offset, open_since, state_record, inputs, episodes, clock, timer_close,
     tick_offset, recent_hashes, recent_times]

- `partition` and `last_offset`: the source partition and offset of the last input applied;
  an input at or below `last_offset` was already applied (a redelivery) and is skipped.
- `open_since`: the last event time of the open episode (None when none is open), so the
  worker rebuilds its timer index on assignment without decoding every state. The deadline
  is computed from it with the *current* `episodeTimeout`, so a changed timeout applies to
  episodes that were already open.
- `state_record`: `engine.state_to_record(state, include_config=False)`; the config is the
  worker's. Packed with msgspec's C encoder (the same bytes as `msgpack.packb` and
  `engine.serialize`, faster), each intent's part packed again only when the intent changed
  (`encode_stored`); read back by a typed msgspec decode when it proves the value is one this
  module writes (`_proven`), else by msgpack and the engine's checked path.
- `inputs`, `episodes`: how many inputs were applied to the user and how many of its
  episodes closed. Output ids are built from them (see `schemas.outputs`), so they are the
  same in a live run, a backfill and a replay of the same events.
- `clock`: the user's latest event time (an input dated too far ahead is dead-lettered, never
  applied: docs/time.md); the partition's watermark after a restart is the largest of these.
- `timer_close`: when the timer (not the user's own event) closed the user's last episode,
  its close time, else None. A later event of the user at or before it shows the close came
  too early: counted as `closed_early` (see docs/time.md).
- `tick_offset`: when a tick wrote the user last (a timer close), the tick's offset on the
  ticks topic, else None. After a restart, users written by a tick at or past the committed
  ticks offset are written again, so the changelog cannot miss a timer close that the local
  store has (the tick itself is redelivered, but finds nothing left to close).
- `recent_hashes`, `recent_times`: the event ids the user applied within the dedupe window
  (`engine.dedupe.RecentIds`: 8 bytes each, oldest first), so a producer's retry counts once.

Version 2 (the first ten fields) is read with no remembered ids.
Version 1 (`[1, partition, last_offset, deadline, state_record]`) is still read: the missing
fields are derived from the state (inputs and episodes start at 0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, NamedTuple, get_args

import msgpack
import msgspec

from engine import (
    EngineConfig,
    EngineState,
    StateFormatError,
    state_from_record,
)
from engine.dedupe import ENTRY_BYTES, NO_IDS, RecentIds
from engine.durations import MAX_TIME_MS, MIN_TIME_MS, is_time
from engine.serialize import (
    MAX_AMOUNT,
    MAX_COUNT,
    intent_to_record,
    reading_from_proven,
    record_head,
    state_from_proven,
)
from engine.state import IntentState, Reading

STORED_VERSION: Final = 3
_LENGTHS: Final = {1: 5, 2: 10, 3: 12}
"""Fields of a stored value, by version."""
_MAX_PARTITION: Final = 2**31 - 1
"""Kafka's partitions and offsets are signed 32- and 64-bit integers."""
_MAX_OFFSET: Final = 2**63 - 1


@dataclass(slots=True)
class StoredUser:
    """A user's stored state, decoded."""

    state: EngineState
    partition: int
    last_offset: int
    """Source offset of the last input applied (−1: none yet)."""
    inputs: int = 0
    """Inputs applied to this user so far."""
    episodes: int = 0
    """Episodes of this user closed so far."""
    clock: int | None = None
    """The latest event time of this user (it counts toward its partition's watermark)."""
    timer_close: int | None = None
    """The close time of the user's last episode when the timer closed it, else None."""
    tick_offset: int | None = None
    """The offset of the tick that wrote this state last, if a tick did."""
    recent: RecentIds = NO_IDS
    """The event ids applied within the dedupe window (a retry of one is skipped)."""
    packed: dict[str, tuple[IntentState, bytes]] | None = field(
        default=None, compare=False, repr=False
    )
    """Intent name -> (the intent, its packed name and record) as `encode_stored` last wrote
    them: an intent that is still the same object is not packed again. The processor hands
    it from a user's StoredUser to the next."""


@dataclass(frozen=True, slots=True)
class StoredIndex:
    """What the timer index needs of a stored user, read without decoding its state."""

    partition: int
    open_since: int | None
    """The open episode's last event time, or None."""
    clock: int | None
    """See `StoredUser.clock`."""
    tick_offset: int | None = None
    """See `StoredUser.tick_offset`."""


def id_digest(event_id: str) -> bytes:
    """The 8-byte hash an event id is remembered by (`StoredUser.recent`): BLAKE2b, the same
    in every process and version, so a restored or replayed user recognises its ids."""
    data = event_id.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=ENTRY_BYTES).digest()


def encode_stored(user: StoredUser) -> bytes:
    """The table value for `user`.

    The bytes are exactly `msgpack.packb([STORED_VERSION, ..., state_to_record(state), ...])`
    (tests hold it to that), assembled from parts: msgpack writes an array or map as a header
    followed by its items' own encodings, so an intent's part can be packed once and reused
    while the intent is unchanged (an event changes one or two intents of a user; repacking
    every intent cost about a tenth of the worker's CPU).
    """
    state = user.state
    episode = state.episode
    started, last = episode.started_at, episode.last_event_at
    head = [
        STORED_VERSION,
        user.partition,
        user.last_offset,
        last if started is not None else None,
    ]
    recent = user.recent
    tail = [
        user.inputs,
        user.episodes,
        user.clock,
        user.timer_close,
        user.tick_offset,
        recent.hashes,
        recent.times,
    ]
    packed = user.packed
    if packed is None:
        packed = user.packed = {}
    parts = [
        _ARRAY_OF_12,
        _packb(head)[1:],  # a short array's header is one byte: the items' encodings follow
        _RECORD_ARRAY,
        _packb(record_head(state, include_config=False))[1:],
        _map_header(len(state.intents)),
    ]
    for name, intent in state.intents.items():
        done = packed.get(name)
        if done is None or done[0] is not intent:
            done = packed[name] = (intent, _packb(name) + _packb(intent_to_record(intent)))
        parts.append(done[1])
    parts.append(_packb(tail)[1:])
    return b"".join(parts)


_packb = msgspec.msgpack.Encoder().encode
"""msgspec's encoder writes the bytes `msgpack.packb` writes for every type a stored value
holds (None, bool, ints of 64 bits, float64, str, bytes, lists, str-keyed dicts: the
smallest int and header forms, floats always as float64; tests/schemas/test_stored_proven.py
holds the two to that) in less than half msgpack's time."""
_ARRAY_OF_12: Final = b"\x9c"  # msgpack fixarray headers: 0x90 | length
_RECORD_ARRAY: Final = b"\x96"


def _map_header(length: int) -> bytes:
    """msgpack's header of a map of `length` entries (fixmap, map 16 or map 32)."""
    if length < 16:
        return bytes((0x80 | length,))
    if length < 1 << 16:
        return b"\xde" + length.to_bytes(2, "big")
    return b"\xdf" + length.to_bytes(4, "big")


def decode_stored(raw: bytes, config: EngineConfig) -> StoredUser:
    """Decode a table value under the worker's config.

    Raises:
        StateFormatError: the bytes are not a stored user (or a newer version).
    """
    proven = _proven(raw)
    if proven is not None:
        return _proven_user(proven, config)
    return _unproven_user(raw, config)


def _unproven_user(raw: bytes, config: EngineConfig) -> StoredUser:
    """`decode_stored` of a value `_proven` left to the msgpack path, with its error texts."""
    value = _header(raw)
    try:
        state = state_from_record(value[4], config=config)
    except StateFormatError:
        raise
    except Exception as exc:
        msg = f"stored state is unreadable: {type(exc).__name__}: {exc}"
        raise StateFormatError(msg) from exc
    if value[0] == 1:
        return StoredUser(state, value[1], value[2], clock=state.clock)
    recent = NO_IDS if value[0] == 2 or not value[10] else RecentIds(value[10], value[11])
    inputs, episodes, clock, timer_close, tick_offset = value[5:10]
    return StoredUser(
        state, value[1], value[2], inputs, episodes, clock, timer_close, tick_offset, recent
    )


def decode_reading(raw: bytes, config: EngineConfig) -> tuple[EngineState | Reading, int, int]:
    """(what predictions read of the user, its partition, its last offset) from a table value,
    for a reader that only predicts: `decode_stored`'s checks and errors, its state's
    predictions, in a third of its time (`engine.serialize.reading_from_proven`; a value only
    the msgpack path reads gives its whole state).

    Raises:
        StateFormatError: the bytes are not a stored user (or a newer version).
    """
    proven = _proven(raw)
    if proven is not None:
        return reading_from_proven(proven[4], config), proven[1], proven[2]
    stored = _unproven_user(raw, config)
    return stored.state, stored.partition, stored.last_offset


def _proven(raw: bytes) -> tuple[Any, ...] | None:
    """A version-3 value as this module writes it, decoded by msgspec into `_StoredV3`
    (every type and range `_header` and `engine.serialize`'s plain path check, checked in C,
    in less time than msgpack's untyped unpacking alone takes), or None for anything else:
    the msgpack path (`_header`) then decides, with its error texts."""
    try:
        value: tuple[Any, ...] = _DECODE_V3(raw)
    except (msgspec.DecodeError, ValueError):  # ValueError: invalid UTF-8 in a string
        return None
    return value if _recent_ids(value[10], value[11]) else None


def _proven_user(value: tuple[Any, ...], config: EngineConfig) -> StoredUser:
    """`decode_stored` of a `_proven` value: the records built without a check per number
    (the msgpack path checks each in Python; BENCHMARKS.md has the two paths' costs)."""
    state = state_from_proven(value[4], config)
    partition, last_offset, _, _, inputs, episodes, clock, timer_close, tick_offset = value[1:10]
    hashes, times = value[10], value[11]
    recent = RecentIds(hashes, times) if hashes else NO_IDS
    return StoredUser(
        state, partition, last_offset, inputs, episodes, clock, timer_close, tick_offset, recent
    )


# What `_proven` proves: the types `_ints` and `engine.serialize._plain_state` accept,
# in their ranges (msgspec refuses a bool for an int, NaN for a bounded float, a str for bytes).
_Time = Annotated[int, msgspec.Meta(ge=MIN_TIME_MS, le=MAX_TIME_MS)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=_MAX_OFFSET)]
_Amount = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_AMOUNT)]
_Counts = tuple[_Amount, _Amount, _Time]


class _EvidenceRecord(NamedTuple):
    """A signal's evidence as stored (alpha, beta, at), named as `engine.state.Evidence` is:
    a decoded intent is read as it is by predictions (`engine.serialize.reading_from_proven`).
    msgspec decodes it as fast as a plain tuple, and as strictly (exactly three items)."""

    alpha: _Amount
    beta: _Amount
    at: _Time


class _IntentRecord(NamedTuple):
    """An intent's record as stored, its fields named as `engine.state.IntentState`'s."""

    episodes: _Counts
    learned: dict[str, _Counts]
    evidence: dict[str, _EvidenceRecord]
    seen: dict[str, Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]]
    resolved: bool
    pending: list[tuple[_Time, list[str]]]
    last_outcome_at: _Time | None
    last_revealed_at: _Time | None


_Record = tuple[
    Literal[1],  # FORMAT_VERSION (a test holds them equal)
    None,  # the config: the worker's, never stored
    _Time | None,  # clock
    _Time | None,  # episode started
    _Time | None,  # episode's last event
    dict[str, _IntentRecord],
]
_StoredV3 = tuple[
    Literal[3],  # STORED_VERSION (a test holds them equal)
    Annotated[int, msgspec.Meta(ge=0, le=_MAX_PARTITION)],
    Annotated[int, msgspec.Meta(ge=-1, le=_MAX_OFFSET)],
    _Time | None,  # open since
    _Record,
    _Count,  # inputs
    _Count,  # episodes
    _Time | None,  # clock
    _Time | None,  # timer close
    _Count | None,  # tick offset
    bytes,  # recent hashes
    bytes,  # recent times
]
_DECODE_V3: Final = msgspec.msgpack.Decoder(_StoredV3).decode
_V3_FIELDS: Final = get_args(_StoredV3)
_HeaderV3: Final = tuple.__class_getitem__(
    (*_V3_FIELDS[:4], msgspec.Raw, *_V3_FIELDS[5:])  # the state record: skipped, nothing built
)
"""`_StoredV3` with its state record (index 4) left as undecoded bytes; every header field
typed and ranged as there."""
_DECODE_V3_HEADER: Final = msgspec.msgpack.Decoder(_HeaderV3).decode


def _header_fields(raw: bytes) -> Sequence[Any]:
    """The header fields of a value (index 4, the state record, left as undecoded bytes):
    `_fields`' values wherever they are read, in a fifth of its time, for the two reads a
    restore makes of every user (`stored_version`, `stored_index`).

    The typed decode checks every header field as `_fields` does; anything it does not prove
    takes `_fields`, with its errors. The state record is not checked here, as `_fields`
    checks none of its numbers either: a record the engine cannot read is quarantined when
    the worker reads the user (`decode_stored`). One difference is kept on purpose: a record
    that is not even msgpack-decodable (a string that is not UTF-8, a map keyed by a map)
    made `_fields` refuse the whole value, and here counts like any other unreadable record.
    """
    try:
        value: Sequence[Any] = _DECODE_V3_HEADER(raw)
    except (msgspec.DecodeError, ValueError):
        return _fields(raw)
    return value if _recent_ids(value[10], value[11]) else _fields(raw)


def stored_index(raw: bytes) -> StoredIndex:
    """The partition, open episode and clock of a table value, for rebuilding the timer index.

    Version 1 values store a deadline computed with the timeout of the day they were written;
    their state is decoded instead, so a changed timeout applies to them too.
    """
    value = _header_fields(raw)
    if value[0] == 1:
        episode = _v1_episode(value[4])
        return StoredIndex(value[1], episode[0], episode[1])
    return StoredIndex(value[1], value[3], value[7], value[9])


def stored_version(raw: bytes) -> tuple[int, int] | None:
    """The order of a user's writes: (last applied offset, episodes closed); None if unreadable.

    Every write that changes a user raises it (an applied input raises the offset, a timer
    close the episode count; rewrites repeat it), so of two values of one user the one with
    the lower version is the older, whichever arrived last in the changelog.
    """
    try:
        value = _header_fields(raw)
    except StateFormatError:
        return None
    return value[2], (value[6] if value[0] >= 2 else 0)


def _v1_episode(record: Any) -> tuple[int | None, int | None]:
    """(open episode's last event time, clock) of a version-1 value's state record.

    The record is `[version, config, clock, episode_started_at, episode_last_event_at, ...]`
    (see `engine.serialize`); only those three fields are read.
    """
    if not isinstance(record, list) or len(record) < 5:
        msg = "stored state record is not a [version, config, clock, started, last, ...] array"
        raise StateFormatError(msg)
    clock, started, last = record[2], record[3], record[4]
    if not all(v is None or is_time(v) for v in (clock, started, last)):
        msg = (
            "stored state record has a time that is not epoch milliseconds between "
            f"{MIN_TIME_MS} and {MAX_TIME_MS}"
        )
        raise StateFormatError(msg)
    return (last if started is not None else None), clock


def _fields(raw: bytes) -> Sequence[Any]:
    """The value's fields, checked as `_header` checks them: by the typed decode when it
    proves them."""
    proven = _proven(raw)
    return _header(raw) if proven is None else proven


def _header(raw: bytes) -> list[Any]:
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # TypeError: a map key that is itself a map or array (unhashable) under
        # strict_map_key=False; UnpackException covers ExtraData, FormatError, StackError.
        msg = f"stored state is not msgpack: {exc or type(exc).__name__}"
        raise StateFormatError(msg) from exc
    if not isinstance(value, list) or not value or not isinstance(value[0], int):
        msg = "stored state is not a [version, partition, offset, ...] array"
        raise StateFormatError(msg)
    if value[0] > STORED_VERSION:
        msg = (
            f"stored state version {value[0]} is newer than this worker reads "
            f"({STORED_VERSION}); deploy the newer worker or reset the app id"
        )
        raise StateFormatError(msg)
    expected = _LENGTHS.get(value[0])
    if expected is None:
        msg = f"stored state version {value[0]} is not one this worker reads (1 to 3)"
        raise StateFormatError(msg)
    if len(value) != expected or not _ints(value):
        msg = f"stored state version {value[0]} does not have its {expected} fields"
        raise StateFormatError(msg)
    return value


def _ints(value: list[Any]) -> bool:
    """The header fields are ints (or None where allowed) in their ranges, as this module
    writes them: a partition and offsets as Kafka numbers them, counts not negative, times
    epoch milliseconds the engine can hold (a clock past them would move the partition's
    watermark to the end of time on a rebuild)."""
    ok = _is_int(value[1], 0, _MAX_PARTITION) and _is_int(value[2], -1, _MAX_OFFSET)
    if value[0] == 1:
        return ok and (value[3] is None or type(value[3]) is int)  # a deadline (not read)
    return (
        ok
        and all(v is None or is_time(v) for v in (value[3], value[7], value[8]))
        and _is_int(value[5], 0, _MAX_OFFSET)
        and _is_int(value[6], 0, _MAX_OFFSET)
        and (value[9] is None or _is_int(value[9], 0, _MAX_OFFSET))
        and (value[0] == 2 or _recent_ids(value[10], value[11]))
    )


def _recent_ids(hashes: object, times: object) -> bool:
    """Two byte strings of one 8-byte entry per remembered id each."""
    return (
        type(hashes) is bytes
        and type(times) is bytes
        and len(hashes) == len(times)
        and len(hashes) % ENTRY_BYTES == 0
    )


def _is_int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high  # not a bool
