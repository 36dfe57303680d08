"""The usual Segment event's short path (`schemas.events._plain_segment`) builds the Event the
general `_from_segment` builds, and leaves every message it cannot build alike to it: for
generated track/page/screen messages whose fields take ordinary and odd values, the same
Event or the same error text, with and without a record timestamp."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Event
from schemas import events
from schemas.events import MAX_STRING, DecodeError, IgnoredMessage, event_from_message


def _outcome(obj: dict[str, object], fallback: object) -> tuple[str, object]:
    try:
        return ("ok", event_from_message(obj, fallback_ts=fallback))  # type: ignore[arg-type]
    except (DecodeError, IgnoredMessage) as exc:
        return (type(exc).__name__, str(exc))


def _general(obj: dict[str, object], fallback: object) -> tuple[str, object]:
    plain = events._plain_segment
    events._plain_segment = lambda *args: None  # type: ignore[assignment]
    try:
        return _outcome(obj, fallback)
    finally:
        events._plain_segment = plain  # type: ignore[assignment]


_GOOD_STRINGS = st.sampled_from(["u1", "usr_00206b07689", "x" * MAX_STRING])
_ODD_STRINGS = st.sampled_from(["", "é", "\ud800", "x" * (MAX_STRING + 1)])
_ODD_IDS = _ODD_STRINGS | st.none() | st.integers(-(2**65), 2**65) | st.booleans() | st.just(1.5)
_GOOD_TIMES = st.sampled_from(
    [
        "2026-01-05T09:42:29.946Z",
        "2026-01-05T09:42:30.521Z",
        "2026-01-05T09:42:30Z",
        "2026-01-05T09:42:30.521123Z",
        "2026-01-05T09:42:30.5215+01:00",
        "2026-01-05T09:42:30.521",
        "2026-01-05",
        "1970-01-01T00:00:00.000Z",
        "1970-01-01T00:00:00.001Z",
        "9999-12-31T23:59:59.999Z",
        "9999-12-31T23:59:59.998Z",
    ]
)
_ODD_TIMES = (
    st.sampled_from(
        [
            "2026-02-30T00:00:00Z",
            "1969-12-31T23:59:59.999Z",
            "9999-12-31T23:59:59.999-01:00",
            "0001-01-01T00:00:00+14:00",
            "not a time",
            "x" * 70,
            "",
        ]
    )
    | st.none()
    | st.integers(-5, 253402300800000)
    | st.floats()
    | st.just(True)
)
_FALLBACKS = st.sampled_from([None, 0, -1, 1767600000000, 253402300799999, 2**70, -(2**70), True])
_FIELDS = (
    ("userId", _GOOD_STRINGS, _ODD_IDS),
    ("anonymousId", _GOOD_STRINGS, _ODD_IDS),
    ("event", _GOOD_STRINGS, _ODD_IDS),
    ("messageId", _GOOD_STRINGS, _ODD_IDS),
    ("timestamp", _GOOD_TIMES, _ODD_TIMES),
    ("sentAt", _GOOD_TIMES, _ODD_TIMES),
    ("receivedAt", _GOOD_TIMES, _ODD_TIMES),
    ("originalTimestamp", _GOOD_TIMES, _ODD_TIMES),
)


@st.composite
def _segments(draw: st.DrawFn) -> dict[str, object]:
    """A track, page or screen message whose fields are each missing, usual (most often, so
    that whole messages take the plain path) or odd."""
    obj: dict[str, object] = {"type": draw(st.sampled_from(["track", "page", "screen"]))}
    for field, good, odd in _FIELDS:
        choice = draw(st.integers(0, 5))
        if choice >= 2:
            obj[field] = draw(good)
        elif choice == 1:
            obj[field] = draw(odd)
    return obj


@settings(max_examples=1500, deadline=None)
@given(_segments(), _FALLBACKS)
def test_the_plain_segment_path_decides_as_the_general_one(obj, fallback):
    assert _outcome(obj, fallback) == _general(obj, fallback)


_USUAL = {
    "type": "track",
    "event": "Plan Upgraded",
    "userId": "u1",
    "messageId": "m1",
    "timestamp": "2026-01-05T09:42:29.946Z",
    "sentAt": "2026-01-05T09:42:30.521Z",
}


def test_a_record_timestamp_out_of_range_is_no_time_of_receipt():
    obj = {**_USUAL, "sentAt": "1970-01-01T00:00:00.001Z"}  # sent long before the event
    for fallback in (-1, 2**70, -(2**70), True, None):
        assert _outcome(obj, fallback) == _general(obj, fallback)


def test_the_usual_segment_event_takes_the_plain_path():
    for fallback in (None, 1767600000000):
        event = events._plain_segment(_USUAL, "track", fallback)
        assert event is not None
        assert _outcome(_USUAL, fallback) == _general(_USUAL, fallback) == ("ok", event)


def test_event_fields_are_in_the_order_the_plain_path_passes_them():
    """`_plain_segment` builds each Event by position: a field added or moved in
    engine/replay.py must be added or moved there too."""
    assert [f.name for f in fields(Event)] == ["user", "at", "name", "type", "intent", "id"]
