"""The msgspec path of `decode_stored`, `stored_index` and `stored_version`
(`schemas.stored._proven`) reads a value exactly as the msgpack path does, or leaves it to
that path: the same user (same floats, bit for bit) for every value the worker writes, and
the same results or the same error texts for a value with any leaf replaced by an odd one,
with bytes flipped, cut or added, or with a repeated key. Its encoder writes msgpack's bytes."""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any, get_args

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, create_state
from engine.dedupe import NO_IDS, remember
from engine.serialize import FORMAT_VERSION
from schemas.stored import (
    STORED_VERSION,
    StoredUser,
    decode_stored,
    encode_stored,
    id_digest,
    stored_index,
    stored_version,
)
from tests.engine.strategies import T0, cases, final
from tests.engine.test_serialize import CFG, _busy_state
from tests.engine.test_serialize_plain import ODD, _leaves, _set

STORED = sys.modules["schemas.stored"]
SERIALIZE = sys.modules["engine.serialize"]

MORE_ODD = [
    b"",
    b"x" * 8,
    "x" * 8,
    -0.0,
    2**53 + 1,
    2**63 + 1,
    2**64 - 1,
    -(2**63),
    1e300,
    1.0000000000000002e300,
    1.5e-320,
    [None],
    {"x": 1},
    {1: [0.0, 0.0, 0]},
]


def _outcome(raw: bytes, config: EngineConfig) -> tuple[Any, ...]:
    """What `decode_stored`, `stored_index` and `stored_version` make of `raw`."""
    return (_of(decode_stored, raw, config), _of(stored_index, raw), _of(stored_version, raw))


def _of(read: Any, *args: Any) -> tuple[Any, ...]:
    try:
        got = read(*args)
    except Exception as exc:  # the same exception, type and text, is the point
        return ("error", type(exc).__name__, str(exc))
    return ("value", repr(got))  # repr: NaN compares unequal to itself; -0.0 equal to 0.0


def _old(raw: bytes, config: EngineConfig) -> tuple[Any, ...]:
    """What the three give without the msgspec paths (the whole value's and the header's)."""
    proven, header = STORED._proven, STORED._DECODE_V3_HEADER
    STORED._proven = lambda raw: None
    STORED._DECODE_V3_HEADER = _refuse
    try:
        return _outcome(raw, config)
    finally:
        STORED._proven, STORED._DECODE_V3_HEADER = proven, header


def _refuse(raw: bytes) -> Any:
    raise msgspec.DecodeError("the header path is off")


def _same_or_only_the_record_unreadable(raw: bytes, config: EngineConfig) -> None:
    """The three read `raw` as the msgpack path does, except where that path refused the
    whole value only because its state record is not msgpack-decodable (a string that is not
    UTF-8, a map keyed by a map) while the header is proven: then `stored_index` and
    `stored_version` read the header (`_header_fields`), and `decode_stored` still refuses."""
    new, old = _outcome(raw, config), _old(raw, config)
    if new == old:
        return
    assert new[0] == old[0] and new[0][0] == "error", (new, old)
    header = STORED._DECODE_V3_HEADER(raw)  # proven, or this raises and the test fails
    assert new[1] == _of(stored_index, raw) and new[2] == ("value", repr((header[2], header[6])))
    assert old[1][0] == "error" and old[2] == ("value", "None")


@st.composite
def stored_users(draw: st.DrawFn) -> tuple[EngineConfig, StoredUser]:
    """A generated user's state with a generated header around it, as the worker stores it."""
    case = draw(cases(max_size=16))
    config = EngineConfig.from_dict(case.config)
    state = final(create_state(config), case.steps)
    recent = NO_IDS
    for number in range(draw(st.integers(0, 3))):
        recent, _ = remember(recent, id_digest(f"e{number}"), T0 + number, window_ms=9, max_ids=4)
    offsets = st.integers(0, 2**63 - 1)
    user = StoredUser(
        state,
        draw(st.integers(0, 2**31 - 1)),
        draw(st.integers(-1, 2**63 - 1)),
        draw(offsets),
        draw(offsets),
        state.clock,
        draw(st.none() | st.just(T0)),
        draw(st.none() | offsets),
        recent,
    )
    return config, user


def test_the_typed_decoder_reads_the_versions_the_module_writes() -> None:
    stored = STORED._StoredV3
    assert get_args(get_args(stored)[0]) == (STORED_VERSION,)
    assert get_args(get_args(get_args(stored)[4])[0]) == (FORMAT_VERSION,)


@settings(max_examples=200, deadline=None)
@given(stored_users())
def test_every_written_value_takes_the_msgspec_path_and_reads_the_same(drawn: Any) -> None:
    config, user = drawn
    raw = encode_stored(user)
    assert STORED._proven(raw) is not None
    new = decode_stored(raw, config)
    assert _outcome(raw, config) == _old(raw, config)
    assert new == user
    assert encode_stored(new) == raw


def with_an_odd_leaf(user: StoredUser, data: Any) -> bytes | None:
    """`user`'s stored value with one leaf replaced by an odd value (None: an int msgpack
    cannot hold, so no bytes to read)."""
    value = msgpack.unpackb(encode_stored(user), strict_map_key=False)
    path = data.draw(st.sampled_from(list(_leaves(value))))
    odd = data.draw(st.sampled_from(ODD + MORE_ODD))
    try:
        return bytes(msgpack.packb(_set(copy.deepcopy(value), path, odd)))
    except OverflowError:
        return None


def with_changed_bytes(user: StoredUser, data: Any) -> bytes:
    """`user`'s stored value with 1 to 3 bytes flipped, cut or inserted, or cut short."""
    raw = bytearray(encode_stored(user))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        byte = data.draw(st.integers(0, 255))
        if kind == "flip":
            raw[at] = byte
        elif kind == "cut":
            del raw[at]
        elif kind == "insert":
            raw.insert(at, byte)
        else:
            del raw[at:]
        if not raw:
            break
    return bytes(raw)


@settings(max_examples=500, deadline=None)
@given(stored_users(), st.data())
def test_a_value_with_an_odd_leaf_reads_as_the_msgpack_path_reads_it(drawn: Any, data) -> None:
    config, user = drawn
    raw = with_an_odd_leaf(user, data)
    if raw is not None:
        _same_or_only_the_record_unreadable(raw, config)


@settings(max_examples=300, deadline=None)
@given(stored_users(), st.data())
def test_changed_bytes_read_as_the_msgpack_path_reads_them(drawn: Any, data) -> None:
    config, user = drawn
    _same_or_only_the_record_unreadable(with_changed_bytes(user, data), config)


@pytest.mark.parametrize(
    "path", [(), ("upgrade", 1), ("upgrade", 2), ("churn", 1), ("churn", 2), ("churn", 3)]
)
def test_a_repeated_map_key_reads_as_the_msgpack_path_reads_it(path: tuple[Any, ...]) -> None:
    """msgpack.packb cannot write a key twice: the map is written by hand, its first key
    again at the end with the last entry's value (both decoders keep the last value)."""
    user = StoredUser(_busy_state(), 0, 5, 1, 0, T0)
    raw = encode_stored(user)
    target = msgpack.unpackb(raw, strict_map_key=False)[4][5]
    for step in path:
        target = target[step]
    assert 0 < len(target) < 15
    items = [*target.items(), (next(iter(target)), list(target.values())[-1])]
    doubled = bytes((0x80 | len(items),)) + b"".join(
        msgpack.packb(k) + msgpack.packb(v) for k, v in items
    )
    assert raw.count(msgpack.packb(target)) == 1
    changed = raw.replace(msgpack.packb(target), doubled)
    assert _outcome(changed, CFG) == _old(changed, CFG)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, -32, -33])
    | st.sampled_from([-128, -129, -32768, -32769, -(2**31), -(2**31) - 1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=60,
)


@settings(max_examples=500, deadline=None)
@given(_VALUES)
def test_the_encoder_writes_msgpacks_bytes(value: Any) -> None:
    assert STORED._packb(value) == msgpack.packb(value)


@pytest.mark.parametrize("length", [15, 16, 31, 32, 255, 256, 65535, 65536])
def test_the_encoder_writes_msgpacks_headers_for_every_length(length: int) -> None:
    for value in (
        "x" * length,
        b"x" * length,
        [None] * length,
        {str(n): n for n in range(length)},
    ):
        assert STORED._packb(value) == msgpack.packb(value)


@settings(max_examples=200, deadline=None)
@given(stored_users())
def test_a_restore_reads_the_header_of_every_written_value_without_its_record(
    drawn: Any,
) -> None:
    """`stored_index` and `stored_version` (a restore's two reads of every user) take the
    header path for every value the worker writes, and give what the whole value's path
    gives."""
    config, user = drawn
    raw = encode_stored(user)
    header = STORED._DECODE_V3_HEADER(raw)
    assert bytes(header[4]) == msgpack.packb(msgpack.unpackb(raw, strict_map_key=False)[4])
    assert _outcome(raw, config) == _old(raw, config)


def test_a_record_that_is_not_msgpack_decodable_leaves_the_header_readable() -> None:
    """The one difference kept on purpose: a state record with a string that is not UTF-8."""
    config, user = CFG, StoredUser(create_state(CFG), 3, 41, 5, 1, T0, None, None, NO_IDS)
    raw = encode_stored(user)
    at = raw.index(b"upgrade")  # an intent name: a msgpack str inside the record
    broken = raw[:at] + b"\xff" + raw[at + 1 :]
    assert _of(decode_stored, broken, config)[0] == "error"
    assert stored_version(broken) == (41, 1)
    assert stored_index(broken).partition == 3
    assert _old(broken, config)[2] == ("value", "None")  # the msgpack path refused it all


@st.composite
def changed_configs(draw: st.DrawFn, config: dict[str, Any]) -> EngineConfig:
    """`config` (camelCase) changed as a redeploy may change it: an intent dropped or added,
    a signal dropped or added, attribution switched off; or left as it is."""
    changed = copy.deepcopy(config)
    intents = changed["intents"]
    name = draw(st.sampled_from(sorted(intents)))
    signals = intents[name]["signals"]
    change = draw(st.sampled_from(["none", "drop intent", "add intent", "drop", "add", "off"]))
    if change == "drop intent" and len(intents) > 1:
        del intents[name]
    elif change == "add intent":
        intents["new"] = {"signals": {"docs.read": 1.0}, "outcome": "upgrade.completed"}
    elif change == "drop" and len(signals) > 1:
        del signals[draw(st.sampled_from(sorted(signals)))]
    elif change == "add":
        signals["added.signal"] = 2.0
    elif change == "off":
        intents[name].pop("attribution", None)
    return EngineConfig.from_dict(changed)


def _fits_as_before(state: Any) -> bool:
    """`engine.serialize._fit_to_config`'s test of a state that fits, as it was written before
    its loops (all() over generators)."""
    config = state.config
    return state.intents.keys() == config.intents.keys() and all(
        _intent_fits_as_before(state.intents[name], intent_config)
        for name, intent_config in config.intents.items()
    )


def _intent_fits_as_before(intent: Any, config: Any) -> bool:
    declared = config.signals.keys()
    return (
        intent.learned.keys() == declared
        and intent.evidence.keys() <= declared
        and intent.seen.keys() <= declared
        and (config.attribution_ms is not None or not intent.pending)
        and all(set(held.signals) <= declared for held in intent.pending)
    )


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_value_read_under_a_changed_config_reads_as_the_msgpack_path_reads_it(data) -> None:
    """Under a config other than the one it was written under, the msgspec path fits the
    state to it as the msgpack path does (the same user, bit for bit), and a state is kept
    as it is exactly when the fit's old test said it fits."""
    case = data.draw(cases(max_size=16))
    written = EngineConfig.from_dict(case.config)
    user = StoredUser(final(create_state(written), case.steps), 0, 1)
    raw = encode_stored(user)
    other = data.draw(changed_configs(case.config))
    assert _outcome(raw, other) == _old(raw, other)
    moved = dataclasses.replace(user.state, config=other)
    assert (SERIALIZE._fit_to_config(moved) is moved) == _fits_as_before(moved)
