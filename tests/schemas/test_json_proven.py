"""The msgspec parse (`schemas.events._proven_json`) decides every message as the stdlib path
did: the same mapping (key order and number types included) or the same error text, and
through `decode_event` the same Event or the same error. It may only accept: any text it is
not sure of goes to the stdlib path, so these compare the two on texts made to sit at the
edges of its proofs (duplicate keys balanced by colons in strings, escapes, whitespace, long
digit runs, odd numbers, deep nesting, bad UTF-8)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.realistic import CONFIG, realistic_stream
from schemas import events
from schemas.config import load_config
from schemas.events import (
    MAX_DEPTH,
    MAX_KEYS,
    MAX_TEXT,
    DecodeError,
    IgnoredMessage,
    decode_event,
    decode_message,
)


def _outcome(decode, raw: bytes) -> tuple[str, object]:
    try:
        return ("ok", decode(raw))
    except DecodeError as exc:
        return ("error", str(exc))
    except IgnoredMessage as exc:
        return ("ignored", str(exc))


def _stdlib(decode, raw: bytes) -> tuple[str, object]:
    proven = events._proven_json
    events._proven_json = lambda raw: None  # type: ignore[assignment]
    try:
        return _outcome(decode, raw)
    finally:
        events._proven_json = proven  # type: ignore[assignment]


def _typed(value: object) -> object:
    """`value` with every leaf shown with its type (NaN != NaN, 1 == 1.0 == True)."""
    if isinstance(value, dict):
        return [(k, _typed(v)) for k, v in value.items()]  # the order too
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, repr(value))


def _same(raw: bytes) -> None:
    """`decode_message` and `decode_event` give what the stdlib path gives for `raw`."""
    got, want = _outcome(decode_message, raw), _stdlib(decode_message, raw)
    assert got[0] == want[0], raw
    if got[0] == "ok":
        assert _typed(got[1]) == _typed(want[1]), raw
    else:
        assert got == want, raw
    for fallback in (None, 1767600000000):

        def event(raw: bytes, fallback: int | None = fallback) -> object:
            return decode_event(raw, fallback_ts=fallback)

        assert _outcome(event, raw) == _stdlib(event, raw), raw


def _proven(raw: bytes) -> bool:
    return events._proven_json(raw) is not None


SEGMENT = (
    b'{"type":"track","event":"Plan Upgraded","userId":"u1","messageId":"m1",'
    b'"timestamp":"2026-01-05T09:42:29.946Z","sentAt":"2026-01-05T09:42:30.521Z",'
    b'"context":{"page":{"url":"https://app.example.com/a?b=c:d"}},'
    b'"properties":{"value":37.36,"n":3,"tags":["a:b",":",""]}}'
)

EDGES = [
    SEGMENT,
    SEGMENT.replace(b",", b", ").replace(b'":', b'": '),  # json.dumps' default spacing
    SEGMENT.replace(b'":', b'" :'),  # whitespace before every colon
    SEGMENT.replace(b'":', b'"\n:').replace(b",", b",\n"),
    # duplicate keys, at the top and nested, alone and with colons in strings to balance
    b'{"a":1,"a":1}',
    b'{"a":1,"a":2}',
    b'{"a":{"b":1,"b":1}}',
    b'{"a":[{"b":1},{"c":2,"c":2}]}',
    b'{"a":1,"b":"x","a":"y"}',
    b'{"a":":","a":1}',
    b'{"a":1,"a":1,"b":":"}',  # one colon short of balancing: the dup drops one
    b'{"a":1,"a":1,"b":"\\u003a"}',  # an escaped colon balances the count: escapes go
    b'{"a":{"x":1,"y":2},"a":{"x":1,"y":2}}',
    b'{"a" :1,"a":2}',
    b'{"a":1 ,"a" : 2}',
    b'{":":":",":":":"}',
    b'{"type":"track","type":"page","userId":"u","timestamp":5}',
    b'{"user":"u","ts":1,"name":"n","name":"m"}',
    # escapes, unicode escapes, surrogates
    b'{"a":"\\u00e9"}',
    b'{"a":"\\ud800"}',
    b'{"\\ud800":1}',
    b'{"a":"\\ud83d\\ude00"}',
    b'{"a":"\\"quoted\\""}',
    b'{"user":"u\\u0000","ts":1,"name":"n"}',
    '{"a":"é","b":"日本","c":"😀"}'.encode(),
    b'{"a":"\xed\xa0\x80"}',  # a surrogate in UTF-8: not UTF-8
    b'{"a":"\xff"}',
    b'{"a":"x\x01"}',
    b'{"a":"x\x7f"}',
    # numbers at and past each limit
    b'{"a":999999999999999999}',
    b'{"a":-999999999999999999}',
    b'{"a":9223372036854775807}',
    b'{"a":-9223372036854775809}',
    b'{"a":18446744073709551615}',
    b'{"a":18446744073709551616}',
    b'{"a":123456789012345678901}',
    b'{"a":1' + b"0" * 5000 + b"}",
    b'{"a":1e308}',
    b'{"a":1e309}',
    b'{"a":-1e400}',
    b'{"a":1E5,"b":-0,"c":-0.0,"d":0.1,"e":5e-324,"f":2.2250738585072014e-308}',
    b'{"a":0.1000000000000000055511151231257827021181583404541015625}',
    b'{"a":1.' + b"0" * 70 + b"}",
    b'{"a":123456789012345678.123456789012345678e-123456789012345678}',
    b'{"a":NaN}',
    b'{"a":Infinity}',
    b'{"a":-Infinity}',
    b'{"a":01}',
    b'{"a":1.}',
    b'{"a":.5}',
    b'{"a":+1}',
    b'{"user":"u","ts":1767600000000.0,"name":"n"}',
    b'{"user":"u","ts":1767600000000.5,"name":"n"}',
    b'{"user":"u","ts":"2026-01-05T09:42:29.946123+01:00","name":"n"}',
    # sizes: strings, items, nesting
    b'{"a":"' + b"x" * (MAX_TEXT - 8) + b'"}',
    b'{"a":"' + b"x" * (MAX_TEXT + 1) + b'"}',
    b'{"a":[' + b",".join(b"1" for _ in range(MAX_KEYS - 1)) + b"]}",
    b'{"a":[' + b",".join(b"1" for _ in range(MAX_KEYS + 1)) + b"]}",
    b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}",
    b'{"a":' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}",
    b'{"a":' + b"[" * 10000 + b"]" * 10000 + b"}",
    b'{"a":' + b"[" * 10000,
    b'{"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[{{{{{{{{{{,,,,"}',
    # syntax: cut, trailing, not an object, whitespace
    b'{"a":1,}',
    b'{"a":1} x',
    b'{"a":1}\x00',
    b'{"a":1}\x0c',
    b'\x0c{"a":1}',
    b' \t\r\n{"a":1} \t\r\n',
    b'{"a":1',
    b'{"a":"1',
    b"[1,2]",
    b'"text"',
    b"12",
    b"null",
    b"{}",
    b'{"type":"identify","userId":"u"}',
]


@pytest.mark.parametrize("raw", EDGES, ids=range(len(EDGES)))
def test_the_proven_parse_decides_an_edge_case_as_the_stdlib_path(raw):
    _same(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,"a":1}',
        b'{"a":":","a":1}',
        b'{"a":1,"a":1,"b":":"}',
        b'{"a":1,"a":1,"b":"\\u003a"}',
        b'{"a":{"b":1,"b":1}}',
        b'{"a":1,"b":[1,{"c":":","c":":"}]}',
    ],
)
def test_a_duplicate_key_is_never_proven(raw):
    assert not _proven(raw)
    assert "appears more than once" in _outcome(decode_message, raw)[1]  # type: ignore[operator]


def test_realistic_messages_take_the_proven_path_and_decode_alike():
    messages = realistic_stream(load_config(CONFIG), 400, 40, seed=3).messages
    assert all(_proven(raw) for raw in messages)  # else the fast path is dead code
    for raw in messages:
        _same(raw)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from([":", "a:b", "::", "", "[", "{", ",", '"', "\\", "\ud800", "é"])
)
_KEYS = st.text(max_size=6) | st.sampled_from(["a", ":", "a:", "type", "userId", "ts"])
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=30,
)
_OBJECTS = st.dictionaries(_KEYS, _VALUES, max_size=8)


def _texts(value: dict[str, object]) -> list[str]:
    """`value` as JSON the ways producers write it."""
    return [
        json.dumps(value, separators=(",", ":"), ensure_ascii=False),
        json.dumps(value, separators=(",", ":")),
        json.dumps(value),
        json.dumps(value, indent=1),
        json.dumps(value, separators=(" , ", " : ")),
    ]


@settings(max_examples=300, deadline=None)
@given(_OBJECTS)
def test_the_proven_parse_decides_generated_json_as_the_stdlib_path(value):
    for text in _texts(value):
        _same(text.encode("utf-8", "surrogatepass"))


def _doubled(text: str, key: str) -> list[str]:
    """`text` (an object) with `key` written again, at the end and at the start."""
    again = json.dumps(key, ensure_ascii=False)
    return [text[:-1] + f",{again}:1}}", "{" + f'{again}:":",' + text[1:]]


@settings(max_examples=300, deadline=None)
@given(_OBJECTS, st.integers(0, 10_000), st.data())
def test_the_proven_parse_decides_mutated_json_as_the_stdlib_path(value, at, data):
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    cut = at % (len(text) + 1)
    variants = [text[:cut], text[:cut] + text[cut + 1 :]]  # cut, and a character dropped
    variants.append(text[:cut] + data.draw(st.sampled_from(_INSERTS)) + text[cut:])
    if value:
        key = data.draw(st.sampled_from(sorted(value)))
        variants += _doubled(text, key)
        inner = value[key]
        if isinstance(inner, dict) and inner:  # a nested key written twice
            nested = json.dumps(inner, separators=(",", ":"), ensure_ascii=False)
            for twice in _doubled(nested, sorted(inner)[0]):
                variants.append(text.replace(nested, twice, 1))
    for variant in variants:
        _same(variant.encode("utf-8", "surrogatepass"))


_INSERTS = [
    " ",
    "\n",
    ":",
    '"',
    ",",
    "\\",
    "\\u003a",
    "\\ud800",
    "1" * 19,
    "9" * 25,
    "NaN",
    "1e999",
    "-",
    "[" * 20,
    "{",
    "}",
    "\x00",
    "é",
    "\udcff",
]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60))
def test_the_proven_parse_decides_random_bytes_in_an_object_as_the_stdlib_path(noise):
    _same(b'{"a":' + noise + b"}")
    _same(b'{"a":"' + noise + b'"}')
