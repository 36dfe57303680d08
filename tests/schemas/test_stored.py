"""The state table's value encoding (`schemas.stored`): the bytes assembled from reused
per-intent parts are exactly msgpack's encoding of the whole value."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings

from engine import EngineConfig, StateFormatError, create_state, observe, state_to_record
from engine.dedupe import NO_IDS, remember
from engine.durations import MAX_TIME_MS
from schemas.stored import (
    STORED_VERSION,
    StoredUser,
    decode_stored,
    encode_stored,
    id_digest,
    stored_index,
    stored_version,
)
from tests.engine.strategies import T0, Case, apply, cases


def _plain(user: StoredUser) -> bytes:
    """The value as one `msgpack.packb` call writes it (the layout the module documents)."""
    state = user.state
    value: bytes = msgpack.packb(
        [
            STORED_VERSION,
            user.partition,
            user.last_offset,
            state.episode.last_event_at if state.episode.started_at is not None else None,
            state_to_record(state, include_config=False),
            user.inputs,
            user.episodes,
            user.clock,
            user.timer_close,
            user.tick_offset,
            user.recent.hashes,
            user.recent.times,
        ]
    )
    return value


@settings(max_examples=150, deadline=None)
@given(cases(max_size=30))
def test_encoding_a_user_step_by_step_gives_msgpacks_bytes_of_the_whole_value(case: Case) -> None:
    config = EngineConfig.from_dict(case.config)
    state = create_state(config)
    packed: Any = None  # handed from each StoredUser to the next, as the processor does
    recent = NO_IDS
    for number, step in enumerate(case.steps):
        state = apply(state, step)
        if number % 3:  # some steps remember an id, as inputs with ids do
            digest = id_digest(f"event-{number}")
            recent, _ = remember(recent, digest, T0 + number, window_ms=5, max_ids=4)
        user = StoredUser(
            state,
            partition=number % 3,
            last_offset=number,
            inputs=number + 1,
            episodes=number // 2,
            clock=state.clock,
            timer_close=None if number % 2 else T0 + number,
            tick_offset=number if number % 4 == 0 else None,
            recent=recent,
            packed=packed,
        )
        encoded = encode_stored(user)
        assert encoded == _plain(user), f"step {number}: {step!r}"
        assert decode_stored(encoded, config) == user
        packed = user.packed
        assert packed is not None
        assert {name: part[0] for name, part in packed.items()} == dict(state.intents)


def test_many_intents_take_a_map16_header_and_unchanged_intents_are_not_repacked() -> None:
    intents = {
        f"intent-{n:02}": {"signals": {"pricing.viewed": 1.0}, "outcome": f"done.{n}"}
        for n in range(20)
    }
    config = EngineConfig.from_dict({"intents": intents})
    user = StoredUser(create_state(config), partition=0, last_offset=-1)
    first = encode_stored(user)
    assert first == _plain(user)
    assert first.find(b"\xde\x00\x14") > 0  # the 20 intents' map 16 header
    parts = dict(user.packed or {})
    state = observe(user.state, "done.7", T0)  # only intent-07 changes (its outcome)
    changed = StoredUser(state, partition=0, last_offset=0, inputs=1, packed=user.packed)
    assert encode_stored(changed) == _plain(changed)
    assert changed.packed is not None
    repacked = [name for name, part in changed.packed.items() if part is not parts[name]]
    assert repacked == ["intent-07"]


# --- impossible numbers ---------------------------------------------------------------------

_CONFIG = EngineConfig.from_dict(
    {"intents": {"upgrade": {"signals": {"pricing.viewed": 3}, "outcome": "upgraded"}}}
)


def _value() -> list[Any]:
    """A real stored value (msgpack-decoded) with an open episode, evidence, counts and a
    remembered id."""
    state = observe(create_state(_CONFIG), "pricing.viewed", T0)
    recent, _ = remember(NO_IDS, id_digest("e1"), T0, window_ms=1000, max_ids=10)
    user = StoredUser(state, 0, 5, 1, 0, T0, None, 3, recent)
    value: list[Any] = msgpack.unpackb(encode_stored(user))
    return value


def _set(*path: Any) -> Any:
    """A corruption: set the value at `path` (the last item is the new value)."""
    *where, last, new = path

    def corrupt(value: list[Any]) -> None:
        for step in where:
            value = value[step]
        value[last] = new

    return corrupt


_INTENT = (4, 5, "upgrade")
_HEADER_CORRUPTIONS = {
    "partition -1": _set(1, -1),
    "partition 2**31": _set(1, 2**31),
    "partition True": _set(1, True),
    "last offset -2": _set(2, -2),
    "open since -1": _set(3, -1),
    "open since past MAX_TIME_MS": _set(3, MAX_TIME_MS + 1),
    "inputs -1": _set(5, -1),
    "episodes -1": _set(6, -1),
    "clock 2**64-1": _set(7, 2**64 - 1),
    "clock -1": _set(7, -1),
    "timer close past MAX_TIME_MS": _set(8, MAX_TIME_MS + 1),
    "tick offset -1": _set(9, -1),
    "recent hashes not bytes": _set(10, "x" * 8),
    "recent hashes cut": _set(10, b"1234567"),
    "recent times missing one": _set(11, b""),
}
_STATE_CORRUPTIONS = {
    "state clock past MAX_TIME_MS": _set(4, 2, MAX_TIME_MS + 1),
    "episode start -1": _set(4, 3, -1),
    "episode last event 2**63": _set(4, 4, 2**63),
    "base-rate hits NaN": _set(*_INTENT, 0, 0, float("nan")),
    "base-rate misses -1": _set(*_INTENT, 0, 1, -1.0),
    "learned hits inf": _set(*_INTENT, 1, "pricing.viewed", 0, float("inf")),
    "learned time -1": _set(*_INTENT, 1, "pricing.viewed", 2, -1),
    "evidence alpha -5": _set(*_INTENT, 2, "pricing.viewed", 0, -5.0),
    "evidence alpha NaN": _set(*_INTENT, 2, "pricing.viewed", 0, float("nan")),
    "evidence beta 1e308": _set(*_INTENT, 2, "pricing.viewed", 1, 1e308),
    "evidence time past MAX_TIME_MS": _set(*_INTENT, 2, "pricing.viewed", 2, MAX_TIME_MS + 1),
    "seen -1": _set(*_INTENT, 3, "pricing.viewed", -1),
    "last outcome -1": _set(*_INTENT, 6, -1),
    "last reveal past MAX_TIME_MS": _set(*_INTENT, 7, MAX_TIME_MS + 1),
}


@pytest.mark.parametrize(
    "corrupt", list(_HEADER_CORRUPTIONS.values()), ids=list(_HEADER_CORRUPTIONS)
)
def test_a_header_number_out_of_its_range_makes_the_value_unreadable(corrupt):
    """The worker quarantines such a user (decode_stored), a rebuild skips it (stored_index),
    and the changelog's compaction cannot order it (stored_version)."""
    value = _value()
    corrupt(value)
    raw = msgpack.packb(value)
    with pytest.raises(StateFormatError, match="does not have its 12 fields"):
        decode_stored(raw, _CONFIG)
    with pytest.raises(StateFormatError):
        stored_index(raw)
    assert stored_version(raw) is None


@pytest.mark.parametrize("corrupt", list(_STATE_CORRUPTIONS.values()), ids=list(_STATE_CORRUPTIONS))
def test_a_state_number_the_engine_never_makes_makes_the_value_unreadable(corrupt):
    """Negative evidence made the engine fail with `math domain error` on the user's next
    event (dead-lettered as an internal error, not quarantined); NaN was published as p."""
    value = _value()
    corrupt(value)
    with pytest.raises(StateFormatError, match="not a possible engine state"):
        decode_stored(msgpack.packb(value), _CONFIG)


def test_a_version_1_value_with_a_time_out_of_range_is_unreadable():
    value = _value()
    record = value[4]
    record[2] = MAX_TIME_MS + 1  # the state's clock, which stored_index reads from a v1 value
    raw = msgpack.packb([1, value[1], value[2], None, record])
    with pytest.raises(StateFormatError):
        stored_index(raw)
    with pytest.raises(StateFormatError):
        decode_stored(raw, _CONFIG)


def test_the_uncorrupted_value_reads_back():
    """The baseline of the corruptions above."""
    raw = msgpack.packb(_value())
    user = decode_stored(raw, _CONFIG)
    assert (user.last_offset, user.clock, user.tick_offset) == (5, T0, 3)
    assert id_digest("e1") in user.recent and id_digest("e2") not in user.recent
    assert stored_index(raw).open_since == T0
    assert stored_version(raw) == (5, 0)


def test_a_version_2_value_reads_back_with_no_remembered_ids():
    """Values written before deduplication by id (ten fields) are read as they were."""
    value = _value()
    raw = msgpack.packb([2, *value[1:10]])
    user = decode_stored(raw, _CONFIG)
    assert (user.last_offset, user.inputs, user.tick_offset) == (5, 1, 3)
    assert user.recent == NO_IDS
    assert stored_index(raw).open_since == T0
    assert stored_version(raw) == (5, 0)


def test_version_0_is_refused_by_name():
    raw = msgpack.packb([0, *_value()[1:]])
    with pytest.raises(StateFormatError, match="version 0 is not one this worker reads"):
        decode_stored(raw, _CONFIG)
