"""Adversarial inputs on the input side (schemas/): events, event files, config, stored state.

Each test asserts what docs/messages.md, docs/tools.md or docs/configuration.md require: a bad
input is refused with a clear reason, promptly, and costs nothing but itself.
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ConfigError, EngineConfig, Event, create_state
from engine.replay import apply_event
from schemas.events import (
    MAX_TS,
    DecodeError,
    IgnoredMessage,
    _plain_event,
    decode_event,
    decode_message,
    event_from_message,
)

TS = 1_767_261_600_000
GOOD = {"user": "u1", "name": "pricing.viewed", "ts": TS}


def _general(raw: bytes) -> Event | str:
    try:
        return event_from_message(decode_message(raw), fallback_ts=None)
    except (DecodeError, IgnoredMessage) as exc:
        return f"{type(exc).__name__}: {exc}"


# --- events: the fast path ----------------------------------------------------------------
# The property test in test_events.py builds its inputs with msgpack.packb, so it never sees
# non-canonical encodings (str8/str16/str32 for short strings, uint64/int64 for small ints),
# binary-typed keys, extension values, duplicate keys or a header that lies about its count.
# This one builds the bytes itself.


def _str(data: bytes, form: int) -> bytes:
    n = len(data)
    if form == 0 and n < 32:
        return bytes([0xA0 | n]) + data
    if form == 1 and n < 256:
        return b"\xd9" + bytes([n]) + data
    if form == 2:
        return b"\xda" + struct.pack(">H", n) + data
    if form == 3 and n < 256:
        return b"\xc4" + bytes([n]) + data  # bin 8: a binary, not a string
    return b"\xdb" + struct.pack(">I", n) + data


def _int(value: int, form: int) -> bytes:
    if form == 0 and 0 <= value < 128:
        return bytes([value])
    if form <= 2 and 0 <= value < 2**64:
        return b"\xcf" + struct.pack(">Q", value)
    if -(2**63) <= value < 2**63:
        return b"\xd3" + struct.pack(">q", value)
    return b"\xcf" + struct.pack(">Q", value % 2**64)


_FORM = st.integers(0, 4)
_RAW_TEXT = st.sampled_from(
    [b"u", b"x", b"", b"\xff", b"\xed\xa0\x80", b"a" * 512, b"a" * 513, "é".encode() * 256]
)
_RAW_INT = st.sampled_from([0, 1, -1, TS, MAX_TS, MAX_TS + 1, 2**63, 2**64 - 1, -(2**63)])
_RAW_OTHER = st.sampled_from(
    [
        b"\xc0",
        b"\xc2",
        b"\xc3",
        b"\xcb" + struct.pack(">d", float(TS)),
        b"\xd6\xff\x00\x00\x00\x01",  # a msgpack timestamp
        b"\xd4\x05\x00",  # ext 5
        b"\xc7\x00\x05",  # ext 5, empty
        b"\x90",
        b"\x80",
    ]
)
_RAW_VALUE = st.one_of(
    st.builds(_str, _RAW_TEXT, _FORM), st.builds(_int, _RAW_INT, _FORM), _RAW_OTHER
)
_RAW_KEY = st.builds(_str, st.sampled_from([b"user", b"ts", b"name", b"id", b"type", b"x"]), _FORM)


@settings(max_examples=2000)
@given(
    header=st.sampled_from([0x83, 0x84]),
    pairs=st.lists(st.tuples(_RAW_KEY, _RAW_VALUE), min_size=2, max_size=5),
    trailing=st.sampled_from([b"", b"\x00"]),
)
def test_the_fast_path_agrees_on_hand_built_msgpack(header, pairs, trailing):
    """Any encoding of a 3- or 4-entry map: the fast path gives None or the general result."""
    raw = bytes([header]) + b"".join(k + v for k, v in pairs) + trailing
    fast = _plain_event(raw)
    if fast is not None:
        assert fast == _general(raw)


# --- events: Segment ------------------------------------------------------------------------


def test_a_segment_integer_user_id_of_zero_is_a_user_like_any_other():
    """docs/messages.md: "the user is `userId`, else `anonymousId`" (integers are accepted)."""
    message = {"type": "track", "event": "x", "timestamp": TS}
    assert decode_event(json.dumps({**message, "userId": 5}).encode()).user == "5"
    assert decode_event(json.dumps({**message, "userId": 0}).encode()).user == "0"


# --- events: JSON nesting pre-scan ----------------------------------------------------------


# (a message that made the nesting pre-scan quadratic: test_bad_input.py,
# test_the_nesting_pre_scan_takes_one_pass)


# --- event files: msgpack streams -----------------------------------------------------------


def _file_lines(data: bytes, fmt: str = "msgpack"):
    from schemas.files import read_lines

    return list(read_lines(io.BytesIO(data), fmt))  # type: ignore[arg-type]


def _deep(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


_PACKED_GOOD = msgpack.packb(GOOD)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            b"\x84\xa4user\xa2u1\xa4name\xa1x\xa2ts\xcf"
            + TS.to_bytes(8, "big")
            + b"\xa4user\xa2u2",
            id="duplicate key",
        ),
        pytest.param(msgpack.packb({**GOOD, "p": float("nan")}), id="NaN"),
        pytest.param(msgpack.packb({**GOOD, "p": ["a" * 8000] * 10}), id="80 KB message"),
        pytest.param(msgpack.packb({**GOOD, "p": msgpack.ExtType(5, b"")}), id="empty extension"),
        pytest.param(msgpack.packb({**GOOD, "p": _deep(40)}), id="40 levels"),
        pytest.param(msgpack.packb({**GOOD, b"k": 1}), id="binary key"),
        pytest.param(msgpack.packb({**GOOD, "p": "a" * 9000}), id="long string"),
        pytest.param(msgpack.packb({**GOOD, "ts": float("inf")}), id="infinite ts"),
    ],
)
def test_a_msgpack_file_message_the_worker_dead_letters_is_dead_lettered_by_replay(raw):
    """docs/tools.md: "`replay` handles both as the live worker does: unparseable rows are
    dead-lettered"; "msgpack: a stream of the same messages" (docs/messages.md limits)."""
    with pytest.raises(DecodeError):
        decode_event(raw)
    lines = _file_lines(raw)
    assert len(lines) == 1
    assert lines[0].event is None
    assert lines[0].error


@pytest.mark.parametrize(
    "bad",
    [
        msgpack.packb({**GOOD, "p": msgpack.Timestamp(1)}, datetime=False),
        msgpack.packb({**GOOD, "p": msgpack.ExtType(5, b"abc")}),
        msgpack.packb({**GOOD, "p": {1: 2}}),
    ],
    ids=["timestamp value", "extension value", "int map key"],
)
def test_one_bad_msgpack_file_message_costs_only_itself(bad):
    """The worker dead-letters such a message alone (decode_event); replay must too."""
    with pytest.raises(DecodeError):
        decode_event(bad)
    lines = _file_lines(bad + _PACKED_GOOD)
    assert [line.event is None for line in lines] == [True, False]
    assert lines[1].event == Event("u1", TS, name="pricing.viewed")


def test_a_truncated_last_msgpack_message_is_reported():
    """Nothing is lost silently; docs/tools.md: unparseable rows are dead-lettered."""
    lines = _file_lines(_PACKED_GOOD + _PACKED_GOOD[:-3])
    assert len(lines) == 2
    assert lines[0].event is not None
    assert lines[1].event is None and lines[1].error


def test_a_corrupt_first_msgpack_message_is_not_placed_after_itself():
    """docs/tools.md: errors name the message ("`message N` in msgpack")."""
    (line,) = _file_lines(b"\xc1" + _PACKED_GOOD)
    assert line.event is None
    assert "message 1" in line.error
    assert "after message 1" not in line.error


def test_a_json_lines_file_with_a_byte_order_mark_is_not_called_a_non_object():
    """docs/tools.md: a line that is not an object is named for what it is; this one is an
    object behind a BOM (the worker says "byte order mark"; CSV strips it)."""
    line, _ = _file_lines(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n{}\n", "jsonl")
    assert line.event is not None or "byte order mark" in (line.error or "")


# --- config files ---------------------------------------------------------------------------

_CONFIG_OK = "intents:\n  up:\n    signals: {a: 1}\n"


def _load(tmp_path: Path, name: str, data: bytes) -> EngineConfig:
    from schemas.config import load_config

    path = tmp_path / name
    path.write_bytes(data)
    return load_config(path)


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    """Never a bare traceback for a user's mistake (a bad config file)."""
    with pytest.raises(ConfigError, match=r"cfg\.yaml"):
        _load(tmp_path, "cfg.yaml", b"\xff\xfe" + _CONFIG_OK.encode("utf-16-le"))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("cfg.yaml", _CONFIG_OK + "episodeTimeout: 1" + "0" * 5000 + "\n"),
        ("cfg.json", '{"intents": {"up": {"signals": {"a": 1' + "0" * 5000 + "}}}}"),
    ],
    ids=["yaml", "json"],
)
def test_a_huge_integer_in_a_config_file_is_a_config_error(tmp_path, name, text):
    """docs/configuration.md: one clear error per problem, naming the path, never a traceback."""
    with pytest.raises(ConfigError):
        _load(tmp_path, name, text.encode())


@pytest.mark.parametrize(
    ("name", "text"),
    [("cfg.json", "[" * 100_000 + "]" * 100_000), ("cfg.yaml", "[" * 5_000 + "]" * 5_000)],
    ids=["json", "yaml"],
)
def test_a_deeply_nested_config_file_is_a_config_error(tmp_path, name, text):
    """Never a bare traceback for a bad config."""
    with pytest.raises(ConfigError):
        _load(tmp_path, name, text.encode())


@pytest.mark.parametrize(("text", "ms"), [("1.001s", 1001), ("1.005s", 1005), ("2.002s", 2002)])
def test_a_duration_that_is_a_whole_number_of_milliseconds_is_accepted(tmp_path, text, ms):
    """docs/configuration.md: durations are `<number><unit>` ... "must be a whole number of
    milliseconds" -- which 1.001s (1001 ms) is."""
    config = _load(tmp_path, "cfg.yaml", (_CONFIG_OK + f"episodeTimeout: '{text}'\n").encode())
    assert config.episode_timeout_ms == ms


@pytest.mark.parametrize("text", ["1.5ms", "0.0001s"])
def test_the_schema_refuses_a_duration_the_validator_refuses(text):
    """docs/configuration.md: the JSON Schema is kept in step with the validator."""
    import jsonschema

    from schemas.config import config_schema

    config = {"episodeTimeout": text, "intents": {"up": {"signals": {"a": 1}}}}
    with pytest.raises(ConfigError):
        EngineConfig.from_dict(config)
    errors = list(jsonschema.Draft202012Validator(config_schema()).iter_errors(config))
    assert errors


# --- stored state ---------------------------------------------------------------------------


def _stored_value() -> tuple[EngineConfig, list]:
    from schemas.stored import StoredUser, encode_stored

    config = EngineConfig.from_dict(
        {"intents": {"upgrade": {"signals": {"pricing.viewed": 3}, "outcome": "upgraded"}}}
    )
    state = apply_event(create_state(config), Event("u1", TS, name="pricing.viewed")).state
    raw = encode_stored(StoredUser(state, 0, 5, 1, 0, TS, None, None))
    return config, msgpack.unpackb(raw)


def _evidence(value: list) -> list:
    return value[4][5]["upgrade"][2]["pricing.viewed"]  # [alpha, beta, at]


def _negative_evidence(value: list) -> None:
    _evidence(value)[0] = -5.0


def _nan_evidence(value: list) -> None:
    _evidence(value)[0] = float("nan")


def _clock_past_the_end_of_time(value: list) -> None:
    value[7] = 2**64 - 1


@pytest.mark.parametrize(
    ("corrupt", "in_header"),
    [(_negative_evidence, False), (_nan_evidence, False), (_clock_past_the_end_of_time, True)],
    ids=["negative evidence", "NaN evidence", "clock past MAX_TS"],
)
def test_a_stored_value_with_impossible_numbers_is_unreadable(corrupt, in_header):
    """decode_stored: "StateFormatError: the bytes are not a stored user"; the worker
    quarantines such a user instead of applying events to it (streams/runtime/processor.py), and
    rebuild() skips a header stored_index cannot read."""
    from engine import StateFormatError
    from schemas.stored import decode_stored, stored_index

    config, value = _stored_value()
    corrupt(value)
    raw = msgpack.packb(value)
    with pytest.raises(StateFormatError):
        decode_stored(raw, config)
    if in_header:
        with pytest.raises(StateFormatError):
            stored_index(raw)


def test_an_intact_stored_value_decodes():
    """The baseline of the test above: the uncorrupted value reads back."""
    from schemas.stored import decode_stored

    config, value = _stored_value()
    user = decode_stored(msgpack.packb(value), config)
    assert user.last_offset == 5 and user.clock == TS


# --- ticks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sent_at", [2**64 - 1, MAX_TS + 1, -5, True])
def test_a_tick_time_that_is_not_epoch_milliseconds_is_no_time(sent_at):
    """schemas/ticks.py: a tick is `[sent_at]`, "the wall-clock time (epoch ms)"; "anything
    else ... reads as a tick without a time"."""
    from schemas.ticks import decode_tick

    assert decode_tick(msgpack.packb([sent_at])).sent_at is None
