"""serialize/deserialize: versioned msgpack, exact round trip, migrations, pruning."""

from __future__ import annotations

import math

import msgpack
import pytest

from engine import (
    FORMAT_VERSION,
    StateFormatError,
    StateVersionError,
    create_state,
    deserialize,
    end_episode,
    explain,
    observe,
    serialize,
    state_to_record,
)
from engine.packing import PackingError, pack, unpack
from tests.engine.helpers import HOUR, MINUTE, MONDAY_10, QUICKSTART, config, session

CFG = config(
    {
        "upgrade": {**QUICKSTART, "attribution": "14d"},
        "churn": {"signals": {"cancel.viewed": 2, "feature.used": -1}, "outcome": "cancel"},
    },
    episodeTimeout="30m",
    learning={"halfLife": "90d"},
)


def _busy_state():
    state = create_state(CFG)
    state = session(state, MONDAY_10, ["pricing.viewed", "cancel.viewed", "feature.used"])
    state = session(state, MONDAY_10 + HOUR, ["limit.hit", "upgrade.completed", "pricing.viewed"])
    state = session(state, MONDAY_10 + 2 * HOUR, ["pricing.viewed"], end=False)
    return observe(state, "cancel.viewed", MONDAY_10 + 2 * HOUR + 3 * MINUTE + 7)


def test_round_trip_is_exact_and_bytes_are_stable():
    """deserialize(serialize(s)) == s, floats bit for bit; re-serializing gives the same bytes."""
    state = _busy_state()
    blob = serialize(state)
    back = deserialize(blob)
    assert back == state
    assert serialize(back) == blob
    a = state.intents["upgrade"].evidence["pricing.viewed"].alpha
    assert (
        math.copysign(1, a) == 1
        and back.intents["upgrade"].evidence["pricing.viewed"].alpha.hex() == a.hex()
    )


def test_blob_is_msgpack_with_the_version_first():
    """The bytes are plain msgpack any client can read, version first."""
    record = msgpack.unpackb(serialize(_busy_state()))
    assert record[0] == FORMAT_VERSION == 1
    assert record[1]["intents"]["upgrade"]["attribution"] == "2w"


def test_c_msgpack_encoding_of_the_record_gives_the_same_bytes():
    """The stream processor may pack state_to_record with the C msgpack codec: same bytes."""
    state = _busy_state()
    for include in (True, False):
        record = state_to_record(state, include_config=include)
        assert msgpack.packb(record) == serialize(state, include_config=include)


def test_compact_blob_needs_the_config():
    """Without the embedded config the caller must pass one; with it the state is equal."""
    state = _busy_state()
    blob = serialize(state, include_config=False)
    assert len(blob) < len(serialize(state))
    assert deserialize(blob, config=CFG) == state
    with pytest.raises(StateFormatError, match="serialized without its config: pass config="):
        deserialize(blob)


def test_newer_version_is_refused_with_what_to_do():
    """A state from a newer engine: a clear error, not a guess."""
    record = state_to_record(_busy_state())
    record[0] = FORMAT_VERSION + 1
    with pytest.raises(StateVersionError, match="version 2 is newer than this engine reads"):
        deserialize(msgpack.packb(record))


def test_older_version_runs_the_migrate_hook():
    """A version-0 record (a hypothetical older layout) is upgraded by the migrate hook."""
    state = _busy_state()
    current = state_to_record(state)
    old = [0, current[1], current[2], [current[3], current[4]], current[5]]  # v0: episode pair

    def migrate(record, version):
        assert version == 0
        return [1, record[1], record[2], *record[3], record[4]]

    assert deserialize(msgpack.packb(old), migrate=migrate) == state
    with pytest.raises(StateVersionError, match="no migration from state format version 0"):
        deserialize(msgpack.packb(old))


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", "truncated msgpack data"),
        (b"\xc1", "unsupported msgpack type code 0xc1"),
        (msgpack.packb({"version": 1}), "expected an array that starts with a version"),
        (msgpack.packb([1, None, 0]), "not a serialized engine state"),
        (
            msgpack.packb([1, None, None, None, None, {"x": [1, 2]}]),
            "not a serialized engine state",
        ),
    ],
)
def test_garbage_is_a_clear_state_format_error(blob, message):
    """Bytes that are not a state never raise anything but StateFormatError."""
    with pytest.raises(StateFormatError, match=message):
        deserialize(blob, config=CFG)


def test_config_prunes_removed_intents_and_signals_and_adds_new_ones():
    """deserialize(config=) swaps the config in: removed names pruned, new ones fresh."""
    state = _busy_state()
    new = config(
        {
            "upgrade": {
                "signals": {"pricing.viewed": 3, "seats.viewed": 1},
                "outcome": "upgrade.completed",
                "halfLife": "7d",
                "attribution": "14d",
            },
            "invite": {"signals": {"team.viewed": 2}, "outcome": "invite.sent"},
        },
        episodeTimeout="30m",
        learning={"halfLife": "90d"},
    )
    back = deserialize(serialize(state), config=new)
    assert set(back.intents) == {"upgrade", "invite"}
    upgrade = back.intents["upgrade"]
    assert set(upgrade.learned) == {"pricing.viewed", "seats.viewed"}
    assert upgrade.learned["pricing.viewed"] == state.intents["upgrade"].learned["pricing.viewed"]
    assert upgrade.learned["seats.viewed"].hits == upgrade.learned["seats.viewed"].misses == 0
    assert "limit.hit" not in upgrade.evidence and "limit.hit" not in upgrade.seen
    assert all("limit.hit" not in held.signals for held in upgrade.pending)
    assert back.intents["invite"] == create_state(new).intents["invite"]
    assert back.config is new
    explain(back, "upgrade", MONDAY_10 + 3 * HOUR)  # the pruned state is usable


def test_switching_attribution_off_turns_held_episodes_into_misses():
    """Held episodes under a config without attribution take a miss dated at their close."""
    state = create_state(CFG)
    state = session(state, MONDAY_10, ["pricing.viewed"])
    assert len(state.intents["upgrade"].pending) == 1
    plain = config({"upgrade": QUICKSTART}, learning={"halfLife": "90d"})
    back = deserialize(serialize(state), config=plain)
    assert back.intents["upgrade"].pending == []
    assert back.intents["upgrade"].episodes.misses == 1
    assert back.intents["upgrade"].learned["pricing.viewed"].misses == 1


def test_inputs_stay_valid_after_transitions():
    """observe/end_episode never mutate their input: prev serializes the same afterwards."""
    prev = _busy_state()
    before = serialize(prev)
    end_episode(observe(prev, "upgrade.completed", MONDAY_10 + 5 * HOUR), MONDAY_10 + 6 * HOUR)
    assert serialize(prev) == before


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        127,
        128,
        255,
        256,
        65535,
        65536,
        2**32 - 1,
        2**32,
        2**64 - 1,
        -1,
        -32,
        -33,
        -128,
        -129,
        -32768,
        -32769,
        -(2**31),
        -(2**31) - 1,
        -(2**63),
        0.0,
        -0.0,
        1.5,
        float("inf"),
        1e-300,
        "",
        "a" * 31,
        "a" * 32,
        "é" * 200,
        "x" * 70_000,
        b"",
        b"\x00" * 300,
        [],
        [1] * 15,
        [1] * 16,
        list(range(70_000)),
        {},
        {str(i): i for i in range(16)},
        {"nested": [{"a": [None, 1.0]}]},
    ],
)
def test_packing_matches_the_msgpack_package_byte_for_byte(value):
    """engine.packing encodes like msgpack.packb and decodes msgpack's output."""
    assert pack(value) == msgpack.packb(value)
    assert unpack(msgpack.packb(value)) == msgpack.unpackb(msgpack.packb(value))


def test_unpack_rejects_trailing_bytes_and_absurd_lengths():
    """Malformed input is refused, not over-allocated."""
    with pytest.raises(PackingError, match="1 trailing bytes"):
        unpack(pack(1) + b"\x00")
    with pytest.raises(PackingError, match="truncated"):
        unpack(b"\xdd\xff\xff\xff\xff")  # an array of 4 billion items in 5 bytes


def test_deeply_nested_bytes_fail_fast_with_a_state_format_error():
    """100,000 nested one-item arrays raised RecursionError; the unpacker stops at MAX_DEPTH
    (a state nests 6 deep), before recursing any further."""
    with pytest.raises(StateFormatError, match="nested deeper than 32 levels"):
        deserialize(b"\x91" * 100_000 + b"\xc0")
    with pytest.raises(StateFormatError, match="nested deeper than 32 levels"):
        deserialize(b"\x81\x00" * 50_000 + b"\xc0")
    nested: object = None
    for _ in range(32):
        nested = [nested]
    assert unpack(pack(nested)) == nested  # 32 levels still read
    with pytest.raises(PackingError, match="nested deeper"):
        unpack(pack([nested]))


def test_max_depth_leaves_room_for_every_state():
    """The deepest record (held episodes with signals, the config embedded) reads back."""
    cfg = config({"u": {**QUICKSTART, "attribution": "14d"}}, episodeTimeout="30m")
    state = session(create_state(cfg), MONDAY_10, ["pricing.viewed", "limit.hit"])
    assert state.intents["u"].pending
    assert deserialize(serialize(state)) == state


@pytest.mark.parametrize("blob", ["\x91\xc0", [1], None, 5])
def test_deserialize_of_something_that_is_not_bytes_is_a_type_error(blob):
    with pytest.raises(TypeError, match="deserialize takes the bytes serialize returned"):
        deserialize(blob)


def test_deserialize_with_a_config_that_is_not_an_engine_config_is_a_type_error():
    blob = serialize(create_state(CFG), include_config=False)
    with pytest.raises(TypeError, match=r"config= takes an EngineConfig .* \(got dict\)"):
        deserialize(blob, config=CFG.to_dict())
    assert deserialize(bytearray(blob), config=CFG) == create_state(CFG)


@pytest.mark.parametrize("version", [True, False, 1.0, "1", None])
def test_a_version_that_is_not_an_int_is_a_state_format_error(version):
    """True == 1 in Python, but it is no format version."""
    record = state_to_record(create_state(CFG))
    record[0] = version
    with pytest.raises(StateFormatError, match="starts with a version"):
        deserialize(pack(record))


def test_an_infinite_time_in_a_record_is_a_state_format_error():
    """int(inf) raised OverflowError through deserialize."""
    state = session(create_state(CFG), MONDAY_10, ["pricing.viewed"], end=False)
    record = state_to_record(state)
    record[2] = float("inf")
    with pytest.raises(StateFormatError):
        deserialize(pack(record))


def test_a_migrate_hook_that_returns_no_record_is_a_state_format_error():
    record = state_to_record(create_state(CFG))
    record[0] = 0
    with pytest.raises(StateFormatError, match="migrate hook"):
        deserialize(pack(record), migrate=lambda rec, version: None)


@pytest.mark.parametrize(
    ("where", "value"),
    [(0, -5.0), (0, float("nan")), (1, float("inf")), (2, -1)],
    ids=["alpha -5", "alpha NaN", "beta inf", "time -1"],
)
def test_a_record_holding_a_number_the_engine_never_makes_is_no_state(where, value):
    """Negative evidence made the next `observe` fail with `math domain error`, NaN gave p =
    NaN: such bytes are refused when read, naming the number."""
    record = msgpack.unpackb(serialize(_busy_state()), strict_map_key=False)
    record[5]["upgrade"][2]["pricing.viewed"][where] = value
    with pytest.raises(StateFormatError, match="not a possible engine state: intent 'upgrade'"):
        deserialize(msgpack.packb(record))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ((2,), 1.5),  # the clock
        ((2,), "5"),
        ((5, "upgrade", 0, 2), True),  # a count's time
        ((5, "upgrade", 0, 0), "2"),  # a count
        ((5, "upgrade", 4), 1),  # resolved
    ],
    ids=["time 1.5", "time '5'", "time true", "count '2'", "resolved 1"],
)
def test_a_record_field_of_another_type_is_no_state(path, value):
    """`int()`, `float()` and `str()` took a time 1.5 as 1 and a count "2" as 2.0: such bytes
    are not what `serialize` writes, so they are refused, not coerced."""
    record = msgpack.unpackb(serialize(_busy_state()), strict_map_key=False)
    target = record
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(StateFormatError, match="expected"):
        deserialize(msgpack.packb(record))


def test_a_name_that_is_not_a_string_is_no_state():
    record = msgpack.unpackb(serialize(_busy_state()), strict_map_key=False)
    record[5]["upgrade"][1][7] = record[5]["upgrade"][1].pop("pricing.viewed")
    with pytest.raises(StateFormatError, match="expected a name"):
        deserialize(msgpack.packb(record))
