"""`schemas.stored.decode_reading`: what predictions read of a stored user, without its whole
state (the lookup API's reads). For every value the worker writes, under the config it was
written with or a changed one, at any read time, the reading predicts what the whole state
`decode_stored` gives predicts, bit for bit, with the same position; a value `decode_stored`
refuses, the reading refuses with the same error."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, EngineState, create_state
from engine.predict import predict_read
from engine.state import Reading
from schemas.stored import StoredUser, decode_reading, decode_stored, encode_stored
from tests.engine.strategies import T0, cases, final
from tests.engine.test_serialize import CFG, _busy_state
from tests.schemas.test_stored_proven import (
    changed_configs,
    stored_users,
    with_an_odd_leaf,
    with_changed_bytes,
)

DAY = 86_400_000


def _predictions(state: Any, at: int) -> str:
    """Every declared intent's prediction at `at` (from the state's clock on), as repr:
    -0.0 is not 0.0."""
    at = at if state.clock is None else max(at, state.clock)
    return repr(predict_read(state, at, list(state.config.intents)))


def _read(read: Any, raw: bytes, config: EngineConfig) -> tuple[Any, ...]:
    try:
        got = read(raw, config)
    except Exception as exc:  # the same exception, type and text, is the point
        return ("error", type(exc).__name__, str(exc))
    return ("value", got)


def _same(raw: bytes, config: EngineConfig, at: int) -> None:
    """`decode_reading(raw)` is `decode_stored(raw)` as far as a lookup goes: the same error,
    or the same partition, last offset and clock, and the same predictions at `at`."""
    whole, reading = _read(decode_stored, raw, config), _read(decode_reading, raw, config)
    if whole[0] == "error":
        assert reading == whole
        return
    assert reading[0] == "value", reading
    stored: StoredUser = whole[1]
    state, partition, last_offset = reading[1]
    assert (partition, last_offset) == (stored.partition, stored.last_offset)
    assert state.clock == stored.state.clock and state.config is config
    assert _predictions(state, at) == _predictions(stored.state, at)


@st.composite
def written_and_read(draw: st.DrawFn) -> tuple[bytes, EngineConfig]:
    """A user's value as the worker writes it, and the config it is read under: the one it
    was written with, or that one changed as a redeploy may change it."""
    case = draw(cases(max_size=16))
    written = EngineConfig.from_dict(case.config)
    user = StoredUser(
        final(create_state(written), case.steps),
        draw(st.integers(0, 2**31 - 1)),
        draw(st.integers(-1, 2**63 - 1)),
    )
    read_under = draw(st.just(written) | changed_configs(case.config))
    return encode_stored(user), read_under


@settings(max_examples=300, deadline=None)
@given(written_and_read(), st.integers(0, 40 * DAY))
def test_a_reading_predicts_what_the_whole_state_predicts(drawn: Any, later: int) -> None:
    raw, config = drawn
    state, _, _ = decode_reading(raw, config)
    assert isinstance(state, Reading)  # the value took the reading's path
    _same(raw, config, T0 + later)


@settings(max_examples=300, deadline=None)
@given(stored_users(), st.data())
def test_a_value_with_an_odd_leaf_reads_as_the_whole_decode_reads_it(drawn: Any, data) -> None:
    config, user = drawn
    raw = with_an_odd_leaf(user, data)
    if raw is not None:
        _same(raw, config, T0 + DAY)


@settings(max_examples=200, deadline=None)
@given(stored_users(), st.data())
def test_changed_bytes_read_as_the_whole_decode_reads_them(drawn: Any, data) -> None:
    config, user = drawn
    _same(with_changed_bytes(user, data), config, T0 + DAY)


@settings(max_examples=100, deadline=None)
@given(stored_users(), st.sampled_from([1, 2]))
def test_an_older_version_reads_as_its_whole_state(drawn: Any, version: int) -> None:
    """A value of an older layout (only the msgpack path reads it) gives its whole state."""
    config, user = drawn
    value = msgpack.unpackb(encode_stored(user), strict_map_key=False)
    old = [version, *value[1:3], None, value[4]] if version == 1 else [2, *value[1:10]]
    raw = msgpack.packb(old)
    state, _, _ = decode_reading(raw, config)
    assert isinstance(state, EngineState)
    _same(raw, config, T0 + DAY)


def test_a_signal_or_intent_the_config_dropped_is_not_read() -> None:
    """Under a redeployed config that dropped a signal with evidence, an intent, and added
    one, the reading predicts what the refitted whole state predicts: without that signal's
    evidence, the added intent at its prior (and the tests above can tell)."""
    state = _busy_state()
    evidence = state.intents["churn"].evidence
    assert "cancel.viewed" in evidence  # the evidence the changed config drops
    raw = encode_stored(StoredUser(state, 3, 9))
    changed = CFG.to_dict()
    del changed["intents"]["churn"]["signals"]["cancel.viewed"]
    del changed["intents"]["upgrade"]
    changed["intents"]["new"] = {"signals": {"docs.read": 1.0}, "outcome": "upgrade.completed"}
    config = EngineConfig.from_dict(changed)
    reading, _, _ = decode_reading(raw, config)
    assert isinstance(reading, Reading) and set(reading.intents) == {"churn", "new"}
    assert "cancel.viewed" not in reading.intents["churn"].evidence
    at = state.clock + DAY
    _same(raw, config, at)
    before = predict_read(decode_stored(raw, CFG).state, at, ["churn"])["churn"]
    assert predict_read(reading, at, ["churn"])["churn"].p != before.p  # the evidence moved p
