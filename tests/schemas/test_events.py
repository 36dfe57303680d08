"""Input decoding: native events and commands, Segment messages, limits and error texts."""

from __future__ import annotations

import json
import re

import msgpack
import pytest

from engine import Event
from schemas.events import (
    MAX_MESSAGE_BYTES,
    DecodeError,
    IgnoredMessage,
    decode_event,
    show_time,
)

TS = 1_767_261_600_000


def _nested(depth):
    value = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            {"id": "e1", "user": "u1", "name": "pricing.viewed", "ts": TS},
            Event("u1", TS, name="pricing.viewed", id="e1"),
        ),
        ({"user": "u1", "name": "x", "ts": "2026-01-01T10:00:00Z"}, Event("u1", TS, name="x")),
        ({"user": "u1", "name": "x", "ts": "2026-01-01T11:00:00+01:00"}, Event("u1", TS, name="x")),
        (
            {"user": "u1", "name": "x", "ts": "2026-01-01T10:00:00"},
            Event("u1", TS, name="x"),
        ),  # UTC
        ({"user": "u1", "name": "x", "ts": float(TS)}, Event("u1", TS, name="x")),
        ({"user": "u1", "type": "end", "ts": TS}, Event("u1", TS, type="end")),
        (
            {"user": "u1", "type": "revealed", "intent": "upgrade", "ts": TS, "id": 7},
            Event("u1", TS, type="revealed", intent="upgrade", id="7"),
        ),
        (
            {
                "type": "track",
                "userId": "u9",
                "anonymousId": "a1",
                "event": "Signed Up",
                "timestamp": "2026-01-01T10:00:00.000Z",
                "messageId": "m-1",
                "properties": {"plan": "pro"},
            },
            Event("u9", TS, name="Signed Up", id="m-1"),
        ),
        (
            {"type": "page", "anonymousId": "a1", "name": "Pricing", "timestamp": TS},
            Event("a1", TS, name="page.viewed"),
        ),
        (
            {"type": "screen", "userId": "u2", "timestamp": TS},
            Event("u2", TS, name="screen.viewed"),
        ),
        (
            {"user": "u1", "name": "x", "ts": TS, "extra": {"producers": "may add fields"}},
            Event("u1", TS, name="x"),
        ),
        (
            {"type": "track", "userId": 0, "anonymousId": "a1", "event": "x", "timestamp": TS},
            Event("0", TS, name="x"),
        ),  # an integer user id of 0 is a user id (not a missing one)
        (
            {"type": "track", "userId": "", "anonymousId": "a1", "event": "x", "timestamp": TS},
            Event("a1", TS, name="x"),
        ),  # an empty userId is none: anonymousId
        ({"user": "u1", "name": "x", "ts": TS, "id": ""}, Event("u1", TS, name="x")),
        (
            {"type": "track", "userId": "u9", "event": "x", "timestamp": TS, "messageId": ""},
            Event("u9", TS, name="x"),
        ),  # an empty id is no id: the outputs count inputs instead (docs/messages.md)
    ],
)
@pytest.mark.parametrize("encode", [msgpack.packb, lambda m: json.dumps(m).encode()])
def test_messages_decode_to_events(message, expected, encode):
    """Native and Segment messages, msgpack or JSON, become engine events."""
    assert decode_event(encode(message)) == expected


def test_missing_ts_falls_back_to_the_record_timestamp():
    """Without ts the Kafka record timestamp is the event time."""
    raw = msgpack.packb({"user": "u1", "name": "x"})
    assert decode_event(raw, fallback_ts=TS).at == TS
    with pytest.raises(DecodeError, match="field 'ts' is missing and the record has no timestamp"):
        decode_event(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff\xfe", "not valid msgpack or JSON"),
        (b"{not json", "not valid JSON"),
        (msgpack.packb([1, 2]), "a message must be a map/object (got list)"),
        (
            msgpack.packb({"user": 5, "name": "x", "ts": TS}),
            "field 'user' must be a non-empty string (got 5)",
        ),
        (
            msgpack.packb({"user": "u", "name": "", "ts": TS}),
            "field 'name' must be a non-empty string",
        ),
        (
            msgpack.packb({"name": "x", "ts": TS}),
            "field 'user' is missing (the message has 'name', 'ts')",
        ),
        (
            msgpack.packb({"user": "u", "name": "x", "ts": "yesterday"}),
            "field 'ts' must be epoch milliseconds or an ISO-8601 time (got 'yesterday')",
        ),
        (
            msgpack.packb({"user": "u", "name": "x", "ts": True}),
            "field 'ts' must be epoch milliseconds",
        ),
        (
            msgpack.packb({"user": "u", "type": "delete", "ts": TS}),
            "field 'type' must be one of end, erase, event",
        ),
        (
            msgpack.packb({"user": "u", "type": "revealed", "ts": TS}),
            "field 'intent' is missing",
        ),
        (
            msgpack.packb({"type": "track", "event": "x", "timestamp": TS}),
            "needs 'userId' or 'anonymousId'",
        ),
        (
            msgpack.packb({"user": "u" * 600, "name": "x", "ts": TS}),
            "field 'user' is longer than 512",
        ),
        (b"{" + b" " * MAX_MESSAGE_BYTES + b"}", f"the limit is {MAX_MESSAGE_BYTES}"),
        (
            msgpack.packb({"user": "u", "name": "x", "ts": TS, "p": list(range(300))}),
            "an array in the message has 300 items; the limit is 256",
        ),
        (
            json.dumps({"user": "u", "name": "x", "ts": TS, "p": list(range(300))}).encode(),
            "has 300 items; the limit is 256",
        ),
        (
            json.dumps({"user": "u", "name": "x", "ts": TS, "p": _nested(18)}).encode(),
            "nests deeper than 16 levels",
        ),
        (msgpack.packb({1: "int keys"}), "not valid msgpack"),
    ],
)
def test_bad_messages_say_what_is_wrong(raw, message):
    """Each broken rule gives a DecodeError naming the field; the payload is never dumped."""
    with pytest.raises(DecodeError) as caught:
        decode_event(raw)
    assert message in str(caught.value)
    assert len(str(caught.value)) < 300


def test_other_segment_types_are_ignored_not_dead_lettered():
    """identify/group/alias carry no event: IgnoredMessage, which the shell counts."""
    with pytest.raises(IgnoredMessage):
        decode_event(json.dumps({"type": "identify", "userId": "u1"}).encode())


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"user": "\ud800", "name": "x", "ts": TS}, "field 'user' is a string with a lone"),
        ({"user": "u", "name": "x", "ts": 2**64}, "field 'ts' is 18446744073709551616: must be"),
        ({"user": "u", "name": "x", "ts": 10**5000}, "field 'ts' is an integer of 16610 bits"),
        ({"user": "u", "name": "x", "ts": float("inf")}, "field 'ts' is inf: must be a whole"),
        ({"user": "u", "type": ["end"], "ts": TS}, "field 'type' must be one of"),
        ({"type": "track", "userId": "a\udfff", "event": "x"}, "field 'userId' is a string with"),
        ({"user": "u", "name": "x", "ts": TS, "id": 2**70}, "field 'id' must be a string"),
        ({"type": "track", "userId": 10**5000, "event": "x"}, "needs 'userId' or 'anonymousId'"),
    ],
)
def test_event_from_message_checks_mappings_it_did_not_parse(message, fragment):
    """File readers parse their own mappings: the field rules alone still hold them."""
    from schemas.events import event_from_message

    with pytest.raises(DecodeError) as caught:
        event_from_message(message, fallback_ts=TS)
    assert fragment in str(caught.value)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[1, 2, 3]", "the message is a JSON array, expected an object"),
        (b'"x"', "the message is a JSON string, expected an object"),
        (b"5", "the message is a JSON number, expected an object"),
        (msgpack.packb("x"), "the message is a msgpack string, expected a map"),
        (msgpack.packb(-5), "a message must be a map/object (got int)"),
    ],
)
def test_non_object_messages_say_what_they_are(raw, message):
    """A top-level value that is not an object is named, not "not valid msgpack or JSON"."""
    with pytest.raises(DecodeError, match=re.escape(message)):
        decode_event(raw)


# --- the usual input's fast path ------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from schemas.events import MAX_STRING, _plain_event, decode_message, event_from_message  # noqa: E402

_EDGE_VALUES = st.one_of(
    st.text(max_size=6),
    st.text(alphabet="ab\u00e9\ud7ff", min_size=1, max_size=4),
    st.sampled_from(["", "x" * MAX_STRING, "x" * (MAX_STRING + 1), "é" * 300, "\u2028"]),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, -1, TS, 253_402_300_799_999, 253_402_300_800_000, 2**63 - 1]),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True),
    st.binary(max_size=3),
    st.lists(st.integers(min_value=0, max_value=9), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(min_value=0, max_value=9), max_size=2),
)
_KEYS = st.sampled_from(["user", "ts", "name", "id", "type", "intent", "extra", "USER"])


def _general(raw: bytes) -> Event | str:
    try:
        return event_from_message(decode_message(raw), fallback_ts=None)
    except (DecodeError, IgnoredMessage) as exc:
        return f"{type(exc).__name__}: {exc}"


_NAMES = st.one_of(st.text(alphabet="ab.", min_size=1, max_size=3), _EDGE_VALUES)
_TIMES = st.one_of(
    st.sampled_from([-1, 0, TS, 253_402_300_799_999, 253_402_300_800_000, True, float(TS)]),
    _EDGE_VALUES,
)
_USUAL_SHAPE = st.fixed_dictionaries(
    {"user": _NAMES, "ts": _TIMES, "name": _NAMES}, optional={"id": _EDGE_VALUES}
)


@settings(max_examples=3000)
@given(st.one_of(st.dictionaries(_KEYS, _EDGE_VALUES, min_size=2, max_size=5), _USUAL_SHAPE))
def test_the_fast_path_decodes_exactly_what_the_general_path_accepts(message):
    raw = msgpack.packb(message)
    general = _general(raw)
    fast = _plain_event(raw)
    if fast is not None:  # it only ever accepts what the general path accepts, as it does
        assert fast == general
    if not isinstance(general, str):
        assert decode_event(raw) == general


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb({"user": "u1", "ts": TS, "name": "x"}),
        msgpack.packb({"id": 7, "user": "u1", "name": "x", "ts": TS}),
        msgpack.packb({"id": "e1", "user": "u1", "name": "x", "ts": TS}),
    ],
)
def test_the_usual_input_takes_the_fast_path(raw):
    assert _plain_event(raw) == _general(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x84\xa4user\xa2u1\xa2ts\xcf" + TS.to_bytes(8, "big") + b"\xa4name\xa1x\xa4user\xa2u2",
        msgpack.packb({"user": "u1", "ts": TS, "name": "x"}) + b"\x00",
        msgpack.packb({"user": "u1", "ts": True, "name": "x"}),
        msgpack.packb({"user": "u1", "ts": float(TS), "name": "x"}),
        msgpack.packb({"user": "é" * 300, "ts": TS, "name": "x"}),
        msgpack.packb({"user": "u1", "ts": TS, "name": "x", "type": "end"}),
        msgpack.packb({"user": "u1", "ts": TS, "name": "x" * (MAX_STRING + 1)}),
        msgpack.packb({"user": "u1", "ts": TS, "name": b"x"}, use_bin_type=True),
    ],
    ids=[
        "duplicate key",
        "trailing byte",
        "bool ts",
        "float ts",
        "user over MAX_STRING bytes",
        "type",
        "long name",
        "binary name",
    ],
)
def test_anything_unusual_takes_the_general_path(raw):
    assert _plain_event(raw) is None


# --- device clock skew, corrected as Segment corrects it ------------------------------------

DEVICE_AHEAD = 10 * 365 * 86_400_000  # a device clock ten years ahead
SEGMENT = {"type": "track", "userId": "u1", "event": "x", "messageId": "m1"}


@pytest.mark.parametrize(
    ("fields", "record_ts", "expected"),
    [
        # The device's clock is ten years ahead; it sent 5 s after the event; the server
        # received it 2 s later (receivedAt): the event happened 7 s before receivedAt.
        (
            {
                "timestamp": show_time(TS + DEVICE_AHEAD),
                "sentAt": show_time(TS + DEVICE_AHEAD + 5_000),
                "receivedAt": show_time(TS + 7_000),
            },
            None,
            TS + 2_000,
        ),
        # No receivedAt: the Kafka record's timestamp is the time it was received.
        (
            {
                "timestamp": show_time(TS + DEVICE_AHEAD),
                "sentAt": show_time(TS + DEVICE_AHEAD + 5_000),
            },
            TS + 9_000,
            TS + 4_000,
        ),
        # Segment's own output shape: `timestamp` is corrected already, `originalTimestamp`
        # is the device's: correcting again from the originals gives the same time.
        (
            {
                "timestamp": show_time(TS + 2_000),
                "originalTimestamp": show_time(TS + DEVICE_AHEAD),
                "sentAt": show_time(TS + DEVICE_AHEAD + 5_000),
                "receivedAt": show_time(TS + 7_000),
            },
            TS + 60_000,
            TS + 2_000,
        ),
        # Without sentAt there is nothing to correct by; a file line without receivedAt
        # (no record) counts as received when sent.
        ({"timestamp": show_time(TS), "receivedAt": show_time(TS + 7_000)}, TS + 9_000, TS),
        ({"timestamp": show_time(TS), "sentAt": show_time(TS + 5_000)}, None, TS),
    ],
)
def test_a_segment_message_is_corrected_for_its_device_clock(fields, record_ts, expected):
    raw = json.dumps({**SEGMENT, **fields}).encode()
    assert decode_event(raw, fallback_ts=record_ts).at == expected


def test_a_native_event_is_corrected_by_sent_at_against_its_record():
    ahead = TS + DEVICE_AHEAD
    value = {"user": "u1", "name": "x", "ts": ahead, "sent_at": ahead + 500}
    assert decode_event(msgpack.packb(value), fallback_ts=TS + 800).at == TS + 300
    assert decode_event(msgpack.packb(value)).at == TS + DEVICE_AHEAD  # no record: as sent


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"timestamp": show_time(TS), "sentAt": "soon"}, "field 'sentAt' must be"),
        (
            {"timestamp": show_time(TS), "sentAt": show_time(TS), "receivedAt": []},
            "field 'receivedAt'",
        ),
        (
            {
                "timestamp": "1970-01-01T00:00:01Z",
                "sentAt": show_time(TS + 5_000),
                "receivedAt": show_time(TS),
            },
            "corrected for the device's clock skew",
        ),
    ],
)
def test_a_bad_correction_field_is_refused_by_name(fields, problem):
    with pytest.raises(DecodeError, match=problem):
        decode_event(json.dumps({**SEGMENT, **fields}).encode(), fallback_ts=TS)
