"""No input bytes escape the decoder or the encoders (issue 10, item 1).

One row per kind of bad input: `decode_event` raises `DecodeError` (or `IgnoredMessage`, where
that is the documented behaviour) and nothing else, with a message that names the field and
the limit. Property tests then throw random bytes and random nested values at it; every event
it accepts must encode as an output in both formats; and every dead letter fits its budget.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from datetime import datetime

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine import Event
from schemas.events import (
    INT_MAX,
    MAX_DEPTH,
    MAX_KEYS,
    MAX_MESSAGE_BYTES,
    MAX_STRING,
    MAX_TEXT,
    MAX_TS,
    DecodeError,
    IgnoredMessage,
    decode_event,
)
from schemas.outputs import (
    DLQ_MAX_BYTES,
    DLQ_MAX_ERROR,
    DLQ_MAX_KEY,
    DLQ_MIN_BYTES,
    decode_output,
    dlq_message,
    encode_output,
)

TS = 1_767_261_600_000
BASE = {"user": "u1", "name": "pricing.viewed", "ts": TS}


def _json(message: object) -> bytes:
    return json.dumps(message).encode()


def _pack(message: object) -> bytes:
    return msgpack.packb(message)


def _with(**fields: object) -> dict[str, object]:
    """BASE with some fields replaced (None values kept: a null field is a case)."""
    return {**BASE, **fields}


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _json_text(prefix: str, inner: str) -> bytes:
    """A native JSON message whose last field's value is the raw JSON text `inner`."""
    return f'{{"user": "u1", "name": "x", "ts": {TS}, "{prefix}": {inner}}}'.encode()


# (raw bytes, fallback_ts, expected exception, a fragment its message must contain)
BAD_INPUTS = [
    # --- the review's five escapes ---
    pytest.param(
        _json_text("properties", "[" * 25_000 + "]" * 25_000),
        None,
        DecodeError,
        f"nests deeper than {MAX_DEPTH} levels",
        id="json-nested-25k-deep",  # was RecursionError inside json.loads
    ),
    pytest.param(
        b"[" * 30_000 + b"]" * 30_000,
        None,
        DecodeError,
        f"nests deeper than {MAX_DEPTH} levels",
        id="json-top-level-array-30k-deep",  # depth is checked before any top-level rule
    ),
    pytest.param(
        b'{"user": "u1", "name": "x", "ts": ' + b"9" * 5000 + b"}",
        None,
        DecodeError,
        "field 'ts' is an integer of 5000 digits; the limit is 20 digits",
        id="json-int-5000-digits",  # was ValueError (int-string conversion limit)
    ),
    pytest.param(
        b'{"user": "u1", "name": "x", "ts": 1e30}',
        None,
        DecodeError,
        "field 'ts' is 1e+30: must be epoch milliseconds between 0 and 253402300799999",
        id="json-ts-1e30",  # was decoded, then OverflowError encoding the outputs
    ),
    pytest.param(
        _pack(_with(ts=2**64 - 1)),
        None,
        DecodeError,
        "field 'ts' is 18446744073709551615: must be epoch milliseconds between 0 and",
        id="msgpack-ts-2**64-1",  # was OverflowError in the state write after publishing
    ),
    pytest.param(
        b'{"user": "u1", "name": "x", "blob": "' + b"a" * 1_000_000 + b'"}',
        None,
        DecodeError,
        f"bytes; the limit is {MAX_MESSAGE_BYTES}",
        id="one-megabyte-message",  # rejected by size first; its dead letter is tested below
    ),
    # --- bytes that are neither format ---
    pytest.param(b"", None, DecodeError, "the message is empty", id="empty-bytes"),
    pytest.param(
        b'{"user": "\xff\xfe", "name": "x", "ts": 1}',
        None,
        DecodeError,
        "not valid JSON: the bytes are not UTF-8 (invalid start byte at byte 10)",
        id="json-invalid-utf8",  # json.loads(bytes) would guess UTF-16/32; we only take UTF-8
    ),
    pytest.param(
        b"\x83\xa4user\xa2\xff\xfe\xa4name\xa1x\xa2ts\x01",
        None,
        DecodeError,
        "not valid msgpack or JSON: 'utf-8' codec can't decode",
        id="msgpack-invalid-utf8-string",
    ),
    pytest.param(
        _pack(BASE)[:-3],
        None,
        DecodeError,
        "not valid msgpack or JSON: Unpack failed: incomplete input",
        id="msgpack-truncated",
    ),
    pytest.param(
        _pack(BASE) + b"\x00",
        None,
        DecodeError,
        "not valid msgpack or JSON",
        id="msgpack-trailing-bytes",  # one message is one value
    ),
    pytest.param(b"\xc1", None, DecodeError, "not valid msgpack", id="msgpack-reserved-byte"),
    pytest.param(
        b'{"user": "u1", "name": "x", "ts": 1',
        None,
        DecodeError,
        "not valid JSON: Expecting",
        id="json-truncated",
    ),
    pytest.param(
        b'{"user": "u1", "name": "x' + b"[" * 5000,
        None,
        DecodeError,
        "not valid JSON: a string is not terminated",
        id="json-unterminated-string-with-brackets",  # not mistaken for nesting
    ),
    pytest.param(
        b'\xef\xbb\xbf{"user": "u1", "name": "x", "ts": 1}',
        None,
        DecodeError,
        "starts with a UTF-8 byte order mark",
        id="json-with-bom",
    ),
    # --- not an object at the top ---
    pytest.param(
        b"[1,2,3]", None, DecodeError, "the message is a JSON array, expected an object", id="[]"
    ),
    pytest.param(
        b'"x"', None, DecodeError, "the message is a JSON string, expected an object", id="str"
    ),
    pytest.param(
        b"5", None, DecodeError, "the message is a JSON number, expected an object", id="5"
    ),
    pytest.param(b" true", None, DecodeError, "the message is a JSON boolean", id="json-true"),
    pytest.param(b"null", None, DecodeError, "the message is a JSON null", id="json-null"),
    pytest.param(
        _pack([1, 2, 3]),
        None,
        DecodeError,
        "the message is a msgpack array, expected a map",
        id="msgpack-array",
    ),
    pytest.param(b"\xc0", None, DecodeError, "the message is a msgpack nil", id="msgpack-nil"),
    # --- msgpack types a message cannot carry ---
    pytest.param(
        _pack(_with(properties=msgpack.ExtType(5, b"xyz"))),
        None,
        DecodeError,
        "msgpack extension type 5 is not accepted",
        id="msgpack-ext-type",
    ),
    pytest.param(
        _pack(_with(ts=msgpack.Timestamp(1_767_261_600, 0))),
        None,
        DecodeError,
        "field 'ts' is a msgpack timestamp, which a message cannot carry",
        id="msgpack-timestamp-ext",  # epoch ms or ISO-8601 only
    ),
    pytest.param(
        _pack({1: "u1", "name": "x", "ts": TS}),
        None,
        DecodeError,
        "int is not allowed for map key",
        id="msgpack-int-key",
    ),
    pytest.param(
        _pack(_with(properties={(1, 2): "x"})),
        None,
        DecodeError,
        "not allowed for map key",
        id="msgpack-array-key-in-properties",  # would be unhashable in a dict
    ),
    pytest.param(
        _pack({b"user": "u1", "name": "x", "ts": TS}),
        None,
        DecodeError,
        "the message has a bytes key: map keys must be strings",
        id="msgpack-binary-key",
    ),
    pytest.param(
        _pack(_with(user=b"u1")),
        None,
        DecodeError,
        "field 'user' must be a non-empty string (got b'u1')",
        id="binary-user",  # binary where a string is expected
    ),
    pytest.param(
        _pack(_with(name=b"pricing.viewed")),
        None,
        DecodeError,
        "field 'name' must be a non-empty string",
        id="binary-name",
    ),
    pytest.param(
        _pack(_with(ts=b"2026-01-01T10:00:00Z")),
        None,
        DecodeError,
        "field 'ts' must be epoch milliseconds or an ISO-8601 time (got b'",
        id="binary-ts",
    ),
    pytest.param(
        _pack(_with(properties={"blob": b"\x00" * (MAX_TEXT + 1)})),
        None,
        DecodeError,
        f"a binary in the message is {MAX_TEXT + 1} bytes; the limit is {MAX_TEXT}",
        id="msgpack-long-binary",
    ),
    pytest.param(
        _pack(_with(properties={"text": "é" * (2 * MAX_TEXT + 1)})),
        None,
        DecodeError,
        f"a string in the message is {4 * MAX_TEXT + 2} bytes of UTF-8, more than {MAX_TEXT} "
        f"characters can take; the limit is {MAX_TEXT} characters",
        id="msgpack-string-over-the-byte-bound",  # refused by the unpacker, before allocating
    ),
    pytest.param(
        _pack(_with(properties=msgpack.ExtType(5, b"x" * 100))),
        None,
        DecodeError,
        "a msgpack extension value is in the message: extension types are not accepted",
        id="msgpack-long-extension",
    ),
    # --- nesting and sizes ---
    pytest.param(
        _json(_with(properties={"a": _nested(MAX_DEPTH)})),
        None,
        DecodeError,
        f"nests deeper than {MAX_DEPTH} levels",
        id="json-extra-nesting-in-properties",
    ),
    pytest.param(
        _pack(_with(properties={"a": _nested(MAX_DEPTH)})),
        None,
        DecodeError,
        "field 'properties.a" + "[0]" * (MAX_DEPTH - 1) + f"' nests deeper than {MAX_DEPTH} levels",
        id="msgpack-extra-nesting-in-properties",
    ),
    pytest.param(
        b"\x81\xa1p" + b"\x91" * 30_000 + b"\x00",
        None,
        DecodeError,
        f"nests deeper than {MAX_DEPTH} levels (msgpack stack exceeded)",
        id="msgpack-nested-30k-deep",
    ),
    pytest.param(
        _json(_with(properties={"list": list(range(10_000))})),
        None,
        DecodeError,
        f"field 'properties.list' has 10000 items; the limit is {MAX_KEYS}",
        id="json-huge-array",
    ),
    pytest.param(
        _pack(_with(properties={"list": list(range(10_000))})),
        None,
        DecodeError,
        f"an array in the message has 10000 items; the limit is {MAX_KEYS}",
        id="msgpack-huge-array",
    ),
    pytest.param(
        b"\x81\xa1p\xdd\xff\xff\xff\xff",
        None,
        DecodeError,
        f"an array in the message has 4294967295 items; the limit is {MAX_KEYS}",
        id="msgpack-array-header-claims-4g-items",  # refused before allocating
    ),
    pytest.param(
        b"\xdf\xff\xff\xff\xff",
        None,
        DecodeError,
        f"a map in the message has 4294967295 items; the limit is {MAX_KEYS}",
        id="msgpack-map-header-claims-4g-pairs",
    ),
    pytest.param(
        _json({**BASE, **{f"k{i}": i for i in range(MAX_KEYS + 1)}}),
        None,
        DecodeError,
        f"the message has {MAX_KEYS + 4} items; the limit is {MAX_KEYS}",
        id="json-too-many-keys",
    ),
    pytest.param(
        _json(_with(properties={"text": "a" * (MAX_TEXT + 1)})),
        None,
        DecodeError,
        f"field 'properties.text' is a string of {MAX_TEXT + 1} characters; the limit is",
        id="json-long-string-in-properties",
    ),
    pytest.param(
        _json(_with(properties={"k" * (MAX_TEXT + 1): 1})),
        None,
        DecodeError,
        f"field 'properties' has a key of {MAX_TEXT + 1} characters; the limit is {MAX_TEXT}",
        id="json-long-key",
    ),
    # --- text ---
    pytest.param(
        b'{"user": "\\ud800", "name": "x", "ts": 1}',
        None,
        DecodeError,
        "field 'user' is a string with a lone UTF-16 surrogate ('\\ud800'): not valid Unicode",
        id="json-lone-surrogate-user",  # msgpack could not encode it in the outputs
    ),
    pytest.param(
        b'{"user": "u1", "name": "x", "ts": 1, "properties": {"\\udfff": 1}}',
        None,
        DecodeError,
        "field 'properties' has a key with a lone UTF-16 surrogate ('\\udfff')",
        id="json-lone-surrogate-key",
    ),
    pytest.param(
        b'{"user": "u1", "name": "a\\ud83d", "ts": 1}',
        None,
        DecodeError,
        "field 'name' is a string with a lone UTF-16 surrogate",
        id="json-half-a-surrogate-pair",
    ),
    pytest.param(
        _json(_with(user=None)),
        None,
        DecodeError,
        "field 'user' must be a non-empty string (got None)",
        id="null-user",
    ),
    pytest.param(
        _json(_with(user="")),
        None,
        DecodeError,
        "field 'user' must be a non-empty string (got '')",
        id="empty-user",
    ),
    pytest.param(
        _pack(_with(user="u" * 10_000)),
        None,
        DecodeError,
        f"field 'user' is a string of 10000 characters; the limit is {MAX_TEXT}",
        id="user-of-10k-chars",
    ),
    pytest.param(
        _pack(_with(user="u" * (MAX_STRING + 1))),
        None,
        DecodeError,
        f"field 'user' is longer than {MAX_STRING} characters ({MAX_STRING + 1})",
        id="user-over-the-id-limit",  # within MAX_TEXT: the field's own limit speaks
    ),
    pytest.param(
        _json(_with(name="n" * (MAX_STRING + 1))),
        None,
        DecodeError,
        f"field 'name' is longer than {MAX_STRING} characters ({MAX_STRING + 1})",
        id="event-name-over-the-name-limit",
    ),
    pytest.param(
        _json(_with(name="n" * 10_000)),
        None,
        DecodeError,
        f"field 'name' is a string of 10000 characters; the limit is {MAX_TEXT}",
        id="event-name-of-10k-chars",
    ),
    pytest.param(
        _json({"type": "track", "userId": "u1", "event": "e" * 10_000, "timestamp": TS}),
        None,
        DecodeError,
        f"field 'event' is a string of 10000 characters; the limit is {MAX_TEXT}",
        id="segment-event-name-of-10k-chars",
    ),
    pytest.param(
        _json({"type": "track", "anonymousId": "a" * 10_000, "event": "e", "timestamp": TS}),
        None,
        DecodeError,
        f"field 'anonymousId' is a string of 10000 characters; the limit is {MAX_TEXT}",
        id="segment-anonymous-id-of-10k-chars",
    ),
    pytest.param(
        _json(_with(id="i" * 10_000)),
        None,
        DecodeError,
        f"field 'id' is a string of 10000 characters; the limit is {MAX_TEXT}",
        id="event-id-of-10k-chars",
    ),
    pytest.param(
        _json(_with(type=["event"])),
        None,
        DecodeError,
        "field 'type' must be one of end, erase, event, page, revealed, screen, track "
        "(got list of 1)",
        id="type-is-a-list",  # unhashable: was a TypeError in `kind in ...`
    ),
    # --- numbers ---
    pytest.param(
        _json(_with(ts=-1)),
        None,
        DecodeError,
        "field 'ts' is -1: must be epoch milliseconds between 0 and 253402300799999",
        id="negative-ts",
    ),
    pytest.param(
        _json(_with(ts=MAX_TS + 1)),
        None,
        DecodeError,
        "field 'ts' is 253402300800000: must be epoch milliseconds between 0 and",
        id="ts-after-year-9999",
    ),
    pytest.param(
        _json(_with(ts=1_767_261_600_000.5)),
        None,
        DecodeError,
        "field 'ts' is 1767261600000.5: must be a whole number of epoch milliseconds",
        id="float-ts-with-fraction",
    ),
    pytest.param(
        _json(_with(ts=True)),
        None,
        DecodeError,
        "field 'ts' must be epoch milliseconds or an ISO-8601 time (got True)",
        id="ts-as-bool",
    ),
    pytest.param(
        b'{"user": "u1", "name": "x", "ts": NaN}',
        None,
        DecodeError,
        "field 'ts' is nan: NaN and Infinity are not accepted",
        id="json-nan-ts",
    ),
    pytest.param(
        b'{"user": "u1", "name": "x", "ts": 1, "p": [-Infinity]}',
        None,
        DecodeError,
        "field 'p[0]' is -inf: NaN and Infinity are not accepted",
        id="json-infinity-in-properties",
    ),
    pytest.param(
        b'{"user": "u1", "name": "x", "ts": 1e999}',
        None,
        DecodeError,
        "field 'ts' is inf: NaN and Infinity are not accepted",
        id="json-float-overflowing-to-inf",
    ),
    pytest.param(
        _pack(_with(ts=math.nan)),
        None,
        DecodeError,
        "field 'ts' is nan: NaN and Infinity are not accepted",
        id="msgpack-nan-ts",
    ),
    pytest.param(
        _json_text("p", "1" * 30),
        None,
        DecodeError,
        "field 'p' is an integer of 30 digits; the limit is 20 digits",
        id="json-long-int-in-properties",
    ),
    pytest.param(
        _json_text("p", "99999999999999999999"),
        None,
        DecodeError,
        "field 'p' is 99999999999999999999: integers must fit in 64 bits",
        id="json-20-digit-int-beyond-64-bits",
    ),
    pytest.param(
        _json_text("p", "0." + "1" * 100),
        None,
        DecodeError,
        "field 'p' is a number literal of 102 characters; the limit is 64 characters",
        id="json-long-float-literal",
    ),
    # --- ISO-8601 times ---
    pytest.param(
        _json(_with(ts="99999-01-01T00:00:00Z")),
        None,
        DecodeError,
        "field 'ts' must be epoch milliseconds or an ISO-8601 time (got '99999-01-01",
        id="iso-ts-year-99999",
    ),
    pytest.param(
        _json(_with(ts="0001-01-01T00:00:00+05:00")),
        None,
        DecodeError,
        "field 'ts' is '0001-01-01T00:00:00+05:00': must be a time between 1970-01-01",
        id="iso-ts-year-1",
    ),
    pytest.param(
        _json(_with(ts="9999-12-31T23:59:59-23:59")),
        None,
        DecodeError,
        "must be a time between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z",
        id="iso-ts-beyond-9999-by-its-offset",
    ),
    pytest.param(
        _json(_with(ts="2026-01-01T10:00:00" + "0" * 100)),
        None,
        DecodeError,
        "field 'ts' is a string of 119 characters: an ISO-8601 time has at most 64",
        id="iso-ts-too-long",
    ),
    # --- fallback (the Kafka record timestamp) ---
    pytest.param(
        _json({"user": "u1", "name": "x"}),
        -1,
        DecodeError,
        "field 'ts' is missing and the record timestamp -1 is not epoch milliseconds",
        id="missing-ts-and-record-timestamp-minus-1",
    ),
    # --- duplicate keys ---
    pytest.param(
        b'{"user": "u1", "user": "u2", "name": "x", "ts": 1}',
        None,
        DecodeError,
        "key 'user' appears more than once in one map/object",
        id="json-duplicate-keys",  # which one wins is parser-dependent
    ),
    pytest.param(
        b"\x84\xa4user\xa2u1\xa4user\xa2u2\xa4name\xa1x\xa2ts\x01",
        None,
        DecodeError,
        "key 'user' appears more than once in one map/object",
        id="msgpack-duplicate-keys",
    ),
    pytest.param(  # a map 16 header (16 entries or more), flat: parsed without the hook
        b"\xde\x00\x12\xa4user\xa2u1\xa4name\xa1x\xa2ts\x01"
        + b"".join(bytes((0xA2, 0x6B, 0x30 + i, i)) for i in range(14))
        + b"\xa4name\xa1y",
        None,
        DecodeError,
        "key 'name' appears more than once in one map/object",
        id="msgpack-map16-duplicate-keys",
    ),
    pytest.param(  # nested: parsed again with the hook, which finds the inner duplicate
        b"\x84\xa4user\xa2u1\xa4name\xa1x\xa2ts\x01\xa1p\x82\xa1a\x01\xa1a\x02",
        None,
        DecodeError,
        "key 'a' appears more than once in one map/object",
        id="msgpack-nested-duplicate-keys",
    ),
    # --- documented as ignored, not dead-lettered ---
    pytest.param(
        _json({"type": "identify", "userId": "u1", "traits": {"plan": "pro"}}),
        None,
        IgnoredMessage,
        "Segment 'identify' messages carry no event",
        id="segment-identify-is-ignored",
    ),
]


@pytest.mark.parametrize(("raw", "fallback", "error", "fragment"), BAD_INPUTS)
def test_bad_input_raises_only_decode_errors_that_say_why(raw, fallback, error, fragment):
    """Each kind of bad input: the documented exception, naming the field and the limit."""
    with pytest.raises((DecodeError, IgnoredMessage)) as caught:
        decode_event(raw, fallback_ts=fallback)
    assert type(caught.value) is error
    assert fragment in str(caught.value)
    assert len(str(caught.value)) < 300  # the payload is never dumped


@pytest.mark.parametrize(("raw", "fallback", "error", "fragment"), BAD_INPUTS)
def test_the_dead_letter_of_every_bad_input_fits_and_round_trips(raw, fallback, error, fragment):
    """The DLQ record of each bad input encodes in both formats, within the budget."""
    with pytest.raises((DecodeError, IgnoredMessage)) as caught:
        decode_event(raw, fallback_ts=fallback)
    record = dlq_message(
        str(caught.value), topic="oracular.events", partition=0, offset=7, key=b"u1", value=raw
    )
    for fmt in ("msgpack", "json"):
        encoded = encode_output(record, fmt)
        assert len(encoded) <= DLQ_MAX_BYTES
        decoded = decode_output(encoded)
        assert decoded["error"] == str(caught.value)
        value = decoded["value"].encode("latin-1") if fmt == "json" else decoded["value"]
        assert raw.startswith(value)


# --- edges that must still be accepted ---------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (_with(ts=0), Event("u1", 0, name="pricing.viewed")),  # the earliest time
        (_with(ts=MAX_TS), Event("u1", MAX_TS, name="pricing.viewed")),  # the latest
        (_with(ts=float(MAX_TS)), Event("u1", MAX_TS, name="pricing.viewed")),
        (
            _with(ts="9999-12-31T23:59:59.999Z"),
            Event("u1", MAX_TS, name="pricing.viewed"),
        ),
        (_with(ts="1970-01-01T00:00:00Z"), Event("u1", 0, name="pricing.viewed")),
        (_with(user="u" * MAX_STRING), Event("u" * MAX_STRING, TS, name="pricing.viewed")),
        (
            _with(name='a "quoted" [[[[{{{{ name ]]\\'),
            Event("u1", TS, name='a "quoted" [[[[{{{{ name ]]\\'),
        ),  # brackets and escapes in strings are not nesting
        (
            _with(properties={"a": _nested(MAX_DEPTH - 1)}),
            Event("u1", TS, name="pricing.viewed"),
        ),  # exactly MAX_DEPTH levels below the top
        (
            _with(properties={"big": INT_MAX, "small": -(2**63), "f": 1.5e300}),
            Event("u1", TS, name="pricing.viewed"),
        ),  # the extremes of the 64-bit range
        (_with(id=2**64 - 1), Event("u1", TS, name="pricing.viewed", id=str(2**64 - 1))),
        (
            _with(user="用户🙂", name="ページ.viewed"),
            Event("用户🙂", TS, name="ページ.viewed"),
        ),
    ],
)
@pytest.mark.parametrize("encode", [_pack, _json, lambda m: json.dumps(m, indent=2).encode()])
def test_edges_within_the_limits_are_accepted(message, expected, encode):
    """Values at each limit (times, lengths, depth, integers) still decode."""
    assert decode_event(encode(message)) == expected


def test_json_may_start_with_whitespace():
    """Leading JSON whitespace is still JSON (and a message, not an error)."""
    assert decode_event(b"\r\n\t " + _json(BASE)) == Event("u1", TS, name="pricing.viewed")


# --- the JSON nesting pre-scan ----------------------------------------------------------------


def _reference_scan(text: str) -> tuple[int | None, int]:
    """(where an unterminated string starts, or None; the deepest nesting outside strings):
    the JSON scanner's reading of strings, one character at a time."""
    depth = deepest = 0
    in_string = escaped = False
    start = 0
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string, start = True, index
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return (start if in_string else None), deepest


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet='"\\[]{}a\n', max_size=80))
def test_the_nesting_pre_scan_reads_strings_as_the_json_scanner_does(body):
    """Brackets inside strings are not nesting; an unterminated string is named as such."""
    from schemas.events import _check_json_depth

    text = "{" * (MAX_DEPTH + 2) + body
    unterminated, deepest = _reference_scan(text)
    try:
        _check_json_depth(text, "not valid JSON")
    except DecodeError as exc:
        if unterminated is not None:
            assert str(exc) == (
                f"not valid JSON: a string is not terminated (it starts at character "
                f"{unterminated})"
            )
        else:
            assert f"({deepest - 1} maps/arrays inside the top-level object)" in str(exc)
    else:
        assert unterminated is None and deepest <= MAX_DEPTH + 1


@pytest.mark.parametrize(
    "tail",
    [b'\\"', b"\\", b'"', b'\\\\"', b'"",', b"[]"],
    ids=["escaped-quotes", "backslashes", "quotes", "escaped-backslash-quote", "strings", "[]"],
)
def test_the_nesting_pre_scan_takes_one_pass(tail):
    """A 64 KiB message of one repeated pattern is refused in milliseconds (the regex that
    removed strings was retried from every quote of an unterminated one: 25 s at 64 KiB).
    Measured in this process's CPU time, so a busy machine does not count; the bound is about
    1,000 times what the one pass needs and 1/10 of what the quadratic scan took."""
    raw = b"{" * 20 + b'"'
    raw += tail * ((MAX_MESSAGE_BYTES - len(raw)) // len(tail))
    start = time.process_time()
    with pytest.raises(DecodeError):
        decode_event(raw)
    assert time.process_time() - start < 2.0


# --- properties ----------------------------------------------------------------------------


def _decode_or_reject(raw: bytes, fallback_ts: int | None = None) -> Event | None:
    """decode_event's result, or None for a DecodeError/IgnoredMessage; any other exception
    propagates and fails the test."""
    try:
        event = decode_event(raw, fallback_ts=fallback_ts)
    except (DecodeError, IgnoredMessage) as exc:
        assert str(exc)
        assert len(str(exc)) < 300
        return None
    assert isinstance(event, Event)
    _assert_encodable(event)
    return event


def _assert_encodable(event: Event) -> None:
    """An accepted event encodes inside a prediction-like output, both formats, losslessly."""
    message = {
        "id": f"{event.user}:{event.id}",
        "user": event.user,
        "at": event.at,
        "type": event.type,
        "event": event.name if event.type == "event" else event.intent,
        "intents": {
            "upgrade": {"p": 0.5, "lower": 0.25, "reveal": False, "suppressed_until": None}
        },
    }
    for fmt in ("msgpack", "json"):
        assert decode_output(encode_output(message, fmt)) == message


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits for JSON
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)  # surrogates included
    | st.binary(max_size=20)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=40,
)
_TIMES = (
    st.integers()
    | st.floats()
    | st.booleans()
    | st.none()
    | st.datetimes().map(lambda d: d.isoformat())
    | st.text(max_size=40)
)
_MESSAGES = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["event", "end", "revealed", "track", "page", "screen", "identify"])
        | _SCALARS,
        "user": st.text(max_size=20) | _SCALARS,
        "userId": st.text(max_size=20) | _SCALARS,
        "anonymousId": st.text(max_size=20) | _SCALARS,
        "name": st.text(max_size=20) | _SCALARS,
        "event": st.text(max_size=20) | _SCALARS,
        "intent": st.text(max_size=20) | _SCALARS,
        "id": st.text(max_size=20) | _SCALARS,
        "messageId": st.text(max_size=20) | _SCALARS,
        "ts": _TIMES,
        "timestamp": _TIMES,
        "properties": _VALUES,
    },
)


_FIELDS = ("user", "name", "ts", "id", "type", "intent", "properties")
_ONE_FIELD_OFF = st.builds(
    lambda field, value, kind: {**BASE, "type": kind, "intent": "upgrade", field: value},
    st.sampled_from(_FIELDS),
    _VALUES | _TIMES,
    st.sampled_from(["event", "end", "revealed"]),
)  # a valid message with one field replaced: most reach the field checks and the encoders
_ONE_SEGMENT_FIELD_OFF = st.builds(
    lambda field, value, kind: {
        "type": kind,
        "userId": "u1",
        "event": "Signed Up",
        "timestamp": TS,
        field: value,
    },
    st.sampled_from(("userId", "anonymousId", "event", "timestamp", "messageId", "context")),
    _VALUES | _TIMES,
    st.sampled_from(["track", "page", "screen"]),
)


def _json_dump(value: object) -> bytes:
    """JSON text of any value: bytes as latin-1 strings, NaN/Infinity and surrogates as
    Python writes them (the decoder must refuse them, not crash)."""
    return json.dumps(value, default=lambda b: b.decode("latin-1")).encode()


def _pack_or_none(value: object) -> bytes | None:
    try:
        return msgpack.packb(value)
    except (OverflowError, UnicodeEncodeError):
        return None  # beyond what msgpack can carry: nothing to decode


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300), fallback=st.none() | st.integers())
@example(raw=b"\x91" * 2000, fallback=None)
@example(raw=b"[" * 2000, fallback=None)
@example(raw=b'{"a":' * 2000, fallback=None)
def test_random_bytes_never_raise_anything_else(raw, fallback):
    """Any bytes and any record timestamp: an Event, DecodeError or IgnoredMessage."""
    _decode_or_reject(raw, fallback)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.sampled_from([b"{", b"[", b'{"user":', b"\x81", b"\x83\xa4user", b"\xde\x00\x03"]),
    tail=st.binary(max_size=200),
)
def test_random_bytes_after_a_plausible_start_never_raise_anything_else(prefix, tail):
    """Bytes that start like a JSON object or a msgpack map get past the first byte."""
    _decode_or_reject(prefix + tail)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=_VALUES | _MESSAGES | _ONE_FIELD_OFF | _ONE_SEGMENT_FIELD_OFF,
    fallback=st.none() | st.integers(0, MAX_TS),
)
def test_random_values_never_raise_anything_else(value, fallback):
    """Random nested values and messages, as JSON and as msgpack: accepted events encode."""
    _decode_or_reject(_json_dump(value), fallback)
    packed = _pack_or_none(value)
    if packed is not None:
        _decode_or_reject(packed, fallback)


_FIRST = datetime(1970, 1, 1)  # noqa: DTZ001 - hypothesis bounds are naive; naive ISO = UTC
_LAST = datetime(9999, 12, 31, 23, 59, 59, 999000)  # noqa: DTZ001 - MAX_TS
_TEXT = st.text(
    st.characters(exclude_categories=["Cs"]), min_size=1, max_size=MAX_STRING
)  # any Unicode but surrogates


@given(
    user=_TEXT,
    name=_TEXT,
    at=st.integers(0, MAX_TS)
    | st.floats(0, MAX_TS).map(float.__floor__).map(float)
    | st.datetimes(_FIRST, _LAST).map(lambda d: d.isoformat()),
    event_id=st.none() | _TEXT | st.integers(0, 2**64 - 1),
    fmt=st.sampled_from(["json", "msgpack"]),
)
def test_accepted_events_encode_as_outputs(user, name, at, event_id, fmt):
    """Every valid event decodes, and its fields round-trip through both output formats."""
    message = {"user": user, "name": name, "ts": at, "id": event_id}
    raw = _json_dump(message) if fmt == "json" else msgpack.packb(message)
    event = _decode_or_reject(raw)
    assert event is not None
    assert (event.user, event.name) == (user, name)
    assert 0 <= event.at <= MAX_TS


# --- dead letters --------------------------------------------------------------------------


def _values():
    return {
        "random": os.urandom,  # mostly bytes JSON writes as \\u00XX (6 characters each)
        "ascii": lambda n: b"a" * n,  # one byte, one character
        "worst": lambda n: b"\xff" * n,  # the worst JSON expansion
    }


@pytest.mark.parametrize("size", [1_000_000, 5_000_000])
@pytest.mark.parametrize("kind", ["random", "ascii", "worst"])
@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_a_large_dead_letter_is_cut_to_fit_the_producer(size, kind, fmt):
    """1 MB and 5 MB values: the encoded record fits 900,000 bytes and says what was cut."""
    value = _values()[kind](size)
    record = dlq_message(
        "message is too big",
        topic="oracular.events",
        partition=3,
        offset=42,
        key=b"u1",
        value=value,
    )
    encoded = encode_output(record, fmt)
    assert len(encoded) <= DLQ_MAX_BYTES < 1_000_000
    decoded = decode_output(encoded)
    kept = decoded["value"].encode("latin-1") if fmt == "json" else decoded["value"]
    assert value.startswith(kept)
    assert len(kept) > 100_000  # cut to fit, not emptied
    assert decoded["truncated"] is True
    assert decoded["value_size"] == size
    assert decoded["value_sha256"] == hashlib.sha256(value).hexdigest()
    assert {k: decoded[k] for k in ("error", "topic", "partition", "offset")} == {
        "error": "message is too big",
        "topic": "oracular.events",
        "partition": 3,
        "offset": 42,
    }
    assert decoded["key"] in (b"u1", "u1")


def test_a_small_dead_letter_is_unchanged():
    """Below the budget the record is exactly the original fields."""
    record = dlq_message("bad", topic="t", partition=0, offset=1, key=None, value=b"\xff" * 1000)
    assert record == {
        "error": "bad",
        "topic": "t",
        "partition": 0,
        "offset": 1,
        "key": None,
        "value": b"\xff" * 1000,
    }


def test_a_huge_key_and_error_are_cut_too():
    """A 1 MB key and a 1 MB error (with a lone surrogate) are cut; the key's hash kept."""
    key = b"k" * 1_000_000
    error = "\ud800" + "e" * 1_000_000
    record = dlq_message(error, topic="t", partition=None, offset=None, key=key, value=None)
    for fmt in ("msgpack", "json"):
        assert len(encode_output(record, fmt)) <= DLQ_MAX_BYTES
    assert record["key"] == key[:DLQ_MAX_KEY]
    assert record["key_size"] == len(key)
    assert record["key_sha256"] == hashlib.sha256(key).hexdigest()
    assert len(record["error"]) <= DLQ_MAX_ERROR
    assert record["error"].startswith("\\ud800eee")
    assert record["error"].endswith("(cut from 1000006 characters)")  # \ud800 is 6 written
    assert (record["truncated"], record["value_size"], record["value_sha256"]) == (True, None, None)


@pytest.mark.parametrize("budget", [DLQ_MIN_BYTES, 100_000, 2_000_000])
def test_the_budget_is_configurable(budget):
    """Any budget from DLQ_MIN_BYTES up is kept, whatever the value's bytes."""
    value = os.urandom(3_000_000)
    record = dlq_message(
        "x", topic="t", partition=0, offset=0, key=b"k", value=value, max_bytes=budget
    )
    sizes = [len(encode_output(record, fmt)) for fmt in ("msgpack", "json")]
    assert max(sizes) <= budget
    assert max(sizes) > budget - 16  # the longest prefix that fits, not a cautious guess


def test_a_budget_below_the_minimum_is_a_setting_error():
    """A budget too small to hold the cut fields is refused, not silently exceeded."""
    with pytest.raises(ValueError, match=f"must be at least {DLQ_MIN_BYTES}"):
        dlq_message("x", topic="t", partition=0, offset=0, key=None, value=b"", max_bytes=1000)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(
    error=st.text(max_size=3000),
    key=st.none() | st.binary(max_size=5000),
    topic=st.text(max_size=300),
    byte=st.integers(0, 255),
    size=st.integers(0, 60_000),
    partition=st.none() | st.integers(0, 2**31),
    offset=st.none() | st.integers(-1, 2**63 - 1),
)
def test_any_dead_letter_fits_the_smallest_budget(error, key, topic, byte, size, partition, offset):
    """Whatever the fields hold (surrogates, control bytes), both encodings fit the budget."""
    value = bytes([byte]) * size
    record = dlq_message(
        error,
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        max_bytes=DLQ_MIN_BYTES,
    )
    for fmt in ("msgpack", "json"):
        encoded = encode_output(record, fmt)
        assert len(encoded) <= DLQ_MIN_BYTES
        assert decode_output(encoded)["offset"] == offset
    if record.get("truncated"):
        assert record["value_size"] == size
        assert value.startswith(record["value"])
    else:
        assert record["value"] == value


# --- stored states -------------------------------------------------------------------------


def _engine_config():
    from engine import EngineConfig

    return EngineConfig.from_dict(
        {"intents": {"upgrade": {"signals": {"pricing.viewed": 3}, "outcome": "upgraded"}}}
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"\x81\x91\x01\x01",  # a map keyed by an array: unhashable (was a TypeError)
        b"\x81\x80\x01",  # a map keyed by a map
        b"\x95\x02\x00\x00\xc0\x81\x91\x01\x01",  # the same inside a stored header
        b"\x91" * 3000,  # deeper than the unpacker's stack
        b"",  # nothing
        b"\xc1",  # a reserved byte
    ],
)
def test_unreadable_stored_states_raise_only_state_format_errors(raw):
    """Table values from a corrupt changelog: StateFormatError, which the worker counts."""
    from engine import StateFormatError
    from schemas.stored import decode_stored, stored_index

    with pytest.raises(StateFormatError):
        stored_index(raw)
    with pytest.raises(StateFormatError):
        decode_stored(raw, _engine_config())


@settings(max_examples=300)
@given(raw=st.binary(max_size=200) | _VALUES.map(_pack_or_none).filter(bool))
def test_random_stored_bytes_raise_only_engine_errors(raw):
    """Any bytes as a table value: decoded, or an EngineError (StateFormatError) and no other."""
    from engine import EngineError
    from schemas.stored import decode_stored, stored_index

    for read in (stored_index, lambda b: decode_stored(b, _engine_config())):
        try:
            read(raw)
        except EngineError as exc:
            assert str(exc)


@pytest.mark.parametrize(
    ("value", "sent_at"),
    [
        ([0], 0),
        ([MAX_TS], MAX_TS),
        ([TS, [b"k"]], TS),
        ([MAX_TS + 1], None),
        ([-1], None),
        ([2**64 - 1], None),
        ([False], None),
        ([float(TS)], None),
    ],
)
def test_a_tick_time_is_epoch_milliseconds_in_the_engines_range_or_none(value, sent_at):
    """A tick's `sent_at` becomes the timer's wall clock: only a time the engine can hold."""
    from schemas.ticks import decode_tick

    assert decode_tick(msgpack.packb(value)).sent_at == sent_at
