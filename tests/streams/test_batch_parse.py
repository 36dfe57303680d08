"""A batch body read by the typed msgspec decode (`serving._typed_batch`) is the batch the
`json.loads` path (`serving._parsed_batch`) reads, and a body the typed decode is not sure of
goes to that path, so every refusal keeps its status and message. Compared on valid bodies and
on random mutations of them: bytes inserted, deleted or replaced with the tokens that sit at the
edges of the typed decode (escapes, lone surrogates, duplicate keys, numbers for bools, floats
and strings for ints, bad UTF-8, deep nesting)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.durations import MAX_TIME_MS, MIN_TIME_MS
from schemas.config import load_config
from streams.lookup import serving
from streams.lookup.serving import MAX_BATCH, MAX_USER_CHARS, ApiError, parse_batch
from tests.streams.test_cli_replay import CONFIG

_CONFIG = load_config(CONFIG)
_INTENTS = sorted(_CONFIG.intents)


def outcome(parse: Any, body: bytes) -> tuple[Any, ...]:
    try:
        return ("ok", parse(body, _CONFIG))
    except ApiError as exc:
        return ("error", exc.status, exc.message, exc.extra, exc.retry_after)


def old_path(body: bytes, config: Any) -> Any:
    """`parse_batch` as it was: the size limit, then the `json.loads` path."""
    if len(body) > serving.MAX_BODY_BYTES:
        return parse_batch(body, config)  # the limit comes first on both paths
    return serving._parsed_batch(body, config)


def same(body: bytes) -> None:
    assert outcome(parse_batch, body) == outcome(old_path, body), body[:300]


GOOD_USERS = st.text(min_size=1, max_size=8)
USERS = st.one_of(
    GOOD_USERS,
    st.sampled_from(["", "u1", "\u2028", "é", "😀", "a\\b", '"', "x" * MAX_USER_CHARS]),
    st.just("y" * (MAX_USER_CHARS + 1)),
)
GOOD_INTENTS = st.one_of(st.none(), st.lists(st.sampled_from(_INTENTS), max_size=4))
INTENTS = st.one_of(
    GOOD_INTENTS,
    st.sampled_from(_INTENTS),
    st.lists(st.sampled_from([*_INTENTS, "teleport", ""]), max_size=4),
    st.lists(st.integers(), max_size=2),
)
GOOD_ITEMS = st.one_of(
    GOOD_USERS, st.builds(lambda u, i: {"user": u, "intents": i}, GOOD_USERS, GOOD_INTENTS)
)
ITEMS = st.one_of(
    USERS,
    st.builds(lambda u, i: {"user": u, "intents": i}, USERS, INTENTS),
    st.builds(lambda u: {"user": u}, USERS),
    st.builds(lambda u: {"user": u, "extra": 1}, USERS),
    st.builds(lambda i: {"intents": i}, INTENTS),
    st.sampled_from([None, 5, True, [], ["u"], {}]),
)
GOOD_AT = st.integers(min_value=MIN_TIME_MS, max_value=MAX_TIME_MS)
AT = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=MIN_TIME_MS - 3, max_value=MIN_TIME_MS + 3),
    st.integers(min_value=MAX_TIME_MS - 3, max_value=MAX_TIME_MS + 3),
    st.sampled_from([True, False, None, 1.5, 1e3, "17", "x", "1e3", [], {}]),
)
FLAG = st.one_of(st.booleans(), st.sampled_from([0, 1, None, "true", []]))


def some(draw: Any, good: Any, any_: Any) -> Any:
    """Mostly a valid value (so most bodies reach the typed decode's own checks), else any."""
    return draw(good if draw(st.integers(0, 4)) else any_)


@st.composite
def bodies(draw: Any) -> dict[str, Any]:
    size = draw(st.sampled_from([0, 1, 2, 5, MAX_BATCH, MAX_BATCH + 1]))
    users = [some(draw, GOOD_ITEMS, ITEMS) for _ in range(min(size, 5))]
    body: dict[str, Any] = {"users": users + ["u"] * (size - len(users))}
    for name, good, values in (
        ("at", GOOD_AT, AT),
        ("explain", st.booleans(), FLAG),
        ("stale", st.booleans(), FLAG),
    ):
        if draw(st.booleans()):
            body[name] = some(draw, good, values)
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.sampled_from(["limit", "user", "Users", "users "]))] = 1
    if draw(st.integers(0, 19)) == 0:
        body = {k: body[k] for k in reversed(body)}
    return body


def encoded(body: dict[str, Any], ascii_only: bool, compact: bool) -> bytes:
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(body, ensure_ascii=ascii_only, separators=separators).encode(
        "utf-8", "surrogatepass"
    )


TOKENS = [
    b'"',
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"\\u0075",
    b"\\n",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b" ",
    b"\t",
    b"\x00",
    b"\x1f",
    b"\xff",
    b"\xc3",
    b"\xef\xbb\xbf",
    b"null",
    b"true",
    b"0",
    b"1",
    b"-",
    b".5",
    b"e3",
    b"E-2",
    b"NaN",
    b"Infinity",
    b"99999999999999999999",
    b'"users":',
    b'"users":["dup"],',
    b'"user":"dup",',
    b'"intents":',
    b'"at":',
    b'"explain":',
    b'"stale":',
    b"[" * 40,
]


@st.composite
def mutated(draw: Any) -> bytes:
    raw = bytearray(encoded(draw(bodies()), draw(st.booleans()), draw(st.booleans())))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            raw[at:at] = draw(st.sampled_from(TOKENS))
        elif op == "delete":
            del raw[at : at + draw(st.integers(1, 4))]
        else:
            raw[at : at + 1] = draw(st.sampled_from(TOKENS))
    return bytes(raw)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), st.booleans(), st.booleans())
def test_a_body_is_read_as_the_json_path_reads_it(
    body: dict[str, Any], ascii_only: bool, compact: bool
) -> None:
    same(encoded(body, ascii_only, compact))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_body_is_read_or_refused_as_the_json_path_does(raw: bytes) -> None:
    same(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"users":["a"],"users":["b"]}',
        b'{"users":[{"user":"a","user":"b"}]}',
        b'{"users":[7],"users":["b"]}',
        b'{"users":["b"],"users":[7]}',
        b'{"\\u0075sers":["a"]}',
        b'{"users":["\\ud800"]}',
        b'{"users":["\\ud83d\\ude00"]}',
        b'{"users":["a"],"at":1e3}',
        b'{"users":["a"],"at":-0}',
        b'{"users":["a"],"at":99999999999999999999}',
        b'{"users":["a"],"at":"17"}',
        b'{"users":["a"],"explain":1}',
        b'{"users":["a"],"explain":null}',
        b'{"users":["a"],"at":null}',
        b'{"users":[{"user":"a","intents":"churn"}]}',
        b'{"users":[{"user":"a","intents":null}]}',
        b'{"users":[{"user":"a","intents":["churn","churn"]}]}',
        b'{"users":["a\\u0000"]}',
        b'\xef\xbb\xbf{"users":["a"]}',
        b' {"users":["a"]}\n',
        b'{"users":["a"]} x',
        b'{"users":' + b"[" * 40 + b"]" * 40 + b"}",
        b'{"users":[' + b'"u",' * MAX_BATCH + b'"u"]}',
        b"[]",
        b"null",
        b"",
    ],
)
def test_the_typed_decode_s_edges(raw: bytes) -> None:
    same(raw)


def test_a_well_formed_batch_takes_the_typed_path() -> None:
    """The fast path is taken for the common body (else the tests above prove nothing)."""
    users = [f"user-{n}" for n in range(100)]
    body = {"users": [*users[:50], *({"user": u, "intents": [_INTENTS[0]]} for u in users[50:])]}
    for extra in ({}, {"at": 1_700_000_000_000, "explain": True, "stale": False}):
        raw = json.dumps({**body, **extra}).encode()
        typed = serving._typed_batch(raw, _CONFIG)
        assert typed is not None and typed == serving._parsed_batch(raw, _CONFIG)
