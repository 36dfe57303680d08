"""The fast JSON parse (`schemas.events._JSON_FAST`, the walk skipped when nothing can break a
rule) decides every message as the general parse and walk did: the same mapping or the same
error text, for hand-picked edge cases and for generated JSON texts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import events
from schemas.events import MAX_KEYS, MAX_TEXT, DecodeError, decode_message


class _Refuse:
    def decode(self, text: str) -> object:
        raise events._NotFast


def _decided(raw: bytes) -> object:
    try:
        return ("ok", decode_message(raw))
    except DecodeError as exc:
        return ("error", str(exc))


def _general(raw: bytes) -> object:
    fast = events._JSON_FAST
    events._JSON_FAST = _Refuse()  # type: ignore[misc]
    try:
        return _decided(raw)
    finally:
        events._JSON_FAST = fast  # type: ignore[misc]


def _same(raw: bytes) -> None:
    got, want = _decided(raw), _general(raw)
    if got[0] == "ok" and want[0] == "ok":
        # NaN != NaN: compare the texts json writes (with the types of the numbers)
        assert json.dumps(got[1], default=repr) == json.dumps(want[1], default=repr)
        assert _types(got[1]) == _types(want[1])
    else:
        assert got == want


def _types(value: object) -> object:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


EDGES = [
    b'{"a": 1}',
    b'{"a": 999999999999999999}',  # 18 digits: fast
    b'{"a": -999999999999999999}',
    b'{"a": 9223372036854775807}',  # 19 digits: the general path
    b'{"a": -9223372036854775808}',
    b'{"a": -9223372036854775809}',
    b'{"a": 18446744073709551615}',
    b'{"a": 18446744073709551616}',
    b'{"a": 123456789012345678901}',
    b'{"a": 1' + b"0" * 5000 + b"}",
    b'{"a": 1e308}',
    b'{"a": 1e309}',
    b'{"a": -1e400}',
    b'{"a": 1.' + b"0" * 70 + b"}",
    b'{"a": NaN}',
    b'{"a": Infinity}',
    b'{"a": -Infinity}',
    b'{"a": 1, "a": 2}',
    b'{"a": {"b": 1, "b": 2}, "c": 1e999}',
    b'{"a": 1e999, "b": {"c": 1, "c": 2}}',
    b'{"a": 1, "b": ',
    b'{"a": 12345678901234567890123, "b": ',
    b'{"a": "\\ud800"}',
    b'{"\\ud800": 1}',
    b'{"a": "\\ud83d\\ude00"}',
    b'{"a": "' + b"x" * (MAX_TEXT + 1) + b'"}',
    b'{"a": "' + b"x" * MAX_TEXT + b'"}',
    b'{"a": [' + b",".join(b"1" for _ in range(MAX_KEYS + 1)) + b"]}",
    b'{"a": [' + b",".join(b"1" for _ in range(MAX_KEYS)) + b"]}",
    b'{"a": ' + b"[" * 16 + b"]" * 16 + b"}",
    b'{"a": ' + b"[" * 17 + b"]" * 17 + b"}",
    b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}",
    b"[1, 2]",
    b'"text"',
    b"12",
    b'{"type": "track", "event": "Pricing Viewed", "userId": "u", "timestamp": 5}',
]


@pytest.mark.parametrize("raw", EDGES, ids=range(len(EDGES)))
def test_the_fast_parse_decides_an_edge_case_as_the_general_one(raw):
    _same(raw)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _VALUES, max_size=8))
def test_the_fast_parse_decides_generated_json_as_the_general_one(value):
    _same(json.dumps(value).encode())


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _VALUES, max_size=8), st.integers(0, 400), st.data())
def test_the_fast_parse_decides_cut_or_doubled_json_as_the_general_one(value, cut, data):
    text = json.dumps(value)
    # a cut text (a syntax error somewhere) and a text with a key written twice
    _same(text[: cut % (len(text) + 1)].encode())
    if value:
        key = data.draw(st.sampled_from(sorted(value)))
        doubled = text[:-1] + ", " + json.dumps(key) + ": 1}"
        _same(doubled.encode())
