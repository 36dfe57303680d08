"""Input messages: native events and commands, and Segment-spec messages, to `engine.Event`.

Native (msgpack or JSON, one object per line in files):
    {"id": "e1", "user": "u1", "name": "pricing.viewed", "ts": 1767261600000}
    {"user": "u1", "type": "end", "ts": ...}                       sign-out -> end_episode
    {"user": "u1", "type": "revealed", "intent": "upgrade", "ts": ...}   -> mark_revealed
Segment spec: `track` (`event`), `page` (-> "page.viewed"), `screen` (-> "screen.viewed"), with
`userId` (else `anonymousId`), `timestamp` and `messageId`; other Segment types are ignored.

Input is untrusted: sizes are limited before anything is parsed, and every rule broken gives a
`DecodeError` that names the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import msgpack

from engine import Event

MAX_MESSAGE_BYTES: Final = 64 * 1024
MAX_STRING: Final = 512
"""Longest user id, event name, intent or id accepted (characters)."""
MAX_KEYS: Final = 256
"""Most keys or items in any map or array of a message (Segment properties included)."""

SEGMENT_EVENT_TYPES: Final = {"track": None, "page": "page.viewed", "screen": "screen.viewed"}
SEGMENT_OTHER_TYPES: Final = frozenset({"identify", "group", "alias"})
COMMANDS: Final = frozenset({"event", "end", "revealed"})


class SchemaError(Exception):
    """Root of the errors raised by `schemas`."""


class DecodeError(SchemaError):
    """A message that cannot become an event; the text says which field and why."""


class IgnoredMessage(SchemaError):
    """A well-formed message that carries no event for the engine (Segment identify, ...)."""


def decode_event(raw: bytes, *, fallback_ts: int | None = None) -> Event:
    """Decode one message's bytes (JSON if it starts with `{`, else msgpack) to an Event.

    Args:
        raw: the message value.
        fallback_ts: the Kafka record timestamp (epoch ms), used when the message has no `ts`.

    Raises:
        DecodeError: the bytes or the fields break a rule.
        IgnoredMessage: a Segment message type that carries no event.
    """
    return event_from_message(decode_message(raw), fallback_ts=fallback_ts)


def decode_message(raw: bytes) -> dict[str, Any]:
    """Parse the bytes of one message into a mapping, within the size limits."""
    if len(raw) > MAX_MESSAGE_BYTES:
        msg = f"message is {len(raw)} bytes; the limit is {MAX_MESSAGE_BYTES}"
        raise DecodeError(msg)
    if raw.lstrip()[:1] == b"{":
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = f"not valid JSON: {exc}"
            raise DecodeError(msg) from exc
        _check_sizes(obj)
    else:
        try:
            obj = msgpack.unpackb(
                raw,
                raw=False,
                strict_map_key=True,
                max_str_len=MAX_MESSAGE_BYTES,
                max_bin_len=MAX_MESSAGE_BYTES,
                max_array_len=MAX_KEYS,
                max_map_len=MAX_KEYS,
                max_ext_len=0,
            )
        except (
            ValueError,
            TypeError,
            msgpack.ExtraData,
            msgpack.FormatError,
            msgpack.StackError,
        ) as exc:
            msg = f"not valid msgpack or JSON: {exc}"
            raise DecodeError(msg) from exc
    if not isinstance(obj, dict):
        msg = f"a message must be a map/object (got {type(obj).__name__})"
        raise DecodeError(msg)
    return obj


def event_from_message(obj: Mapping[str, Any], *, fallback_ts: int | None = None) -> Event:
    """Turn a parsed message (native or Segment) into an Event."""
    kind = obj.get("type", "event")
    if kind in SEGMENT_EVENT_TYPES or kind in SEGMENT_OTHER_TYPES:
        return _from_segment(obj, kind, fallback_ts)
    if kind not in COMMANDS:
        choices = ", ".join(sorted(COMMANDS | set(SEGMENT_EVENT_TYPES)))
        msg = f"field 'type' must be one of {choices} (got {_show(kind)})"
        raise DecodeError(msg)
    user = _string(obj, "user")
    at = _time(obj.get("ts"), "ts", fallback_ts)
    event_id = _optional_string(obj, "id")
    if kind == "end":
        return Event(user, at, type="end", id=event_id)
    if kind == "revealed":
        return Event(user, at, type="revealed", intent=_string(obj, "intent"), id=event_id)
    return Event(user, at, name=_string(obj, "name"), id=event_id)


def _from_segment(obj: Mapping[str, Any], kind: str, fallback_ts: int | None) -> Event:
    if kind in SEGMENT_OTHER_TYPES:
        msg = f"Segment {kind!r} messages carry no event"
        raise IgnoredMessage(msg)
    user = obj.get("userId") or obj.get("anonymousId")
    if not isinstance(user, str | int) or isinstance(user, bool) or user == "":
        msg = "a Segment message needs 'userId' or 'anonymousId' (a string)"
        raise DecodeError(msg)
    user = str(user)
    if len(user) > MAX_STRING:
        msg = f"field 'userId' is longer than {MAX_STRING} characters"
        raise DecodeError(msg)
    name = SEGMENT_EVENT_TYPES[kind]
    if name is None:
        name = _string(obj, "event")
    at = _time(obj.get("timestamp"), "timestamp", fallback_ts)
    return Event(user, at, name=name, id=_optional_string(obj, "messageId"))


def _string(obj: Mapping[str, Any], field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str) or not value:
        msg = f"field {field!r} must be a non-empty string (got {_show(value)})"
        raise DecodeError(msg)
    if len(value) > MAX_STRING:
        msg = f"field {field!r} is longer than {MAX_STRING} characters ({len(value)})"
        raise DecodeError(msg)
    return value


def _optional_string(obj: Mapping[str, Any], field: str) -> str | None:
    if obj.get(field) is None:
        return None
    value = obj[field]
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or len(value) > MAX_STRING:
        msg = f"field {field!r} must be a string of at most {MAX_STRING} characters"
        raise DecodeError(msg)
    return value


def _time(value: object, field: str, fallback: int | None) -> int:
    """Epoch ms from an int, an integral float, or an ISO-8601 string (naive = UTC)."""
    if value is None:
        if fallback is None:
            msg = f"field {field!r} is missing and the record has no timestamp"
            raise DecodeError(msg)
        return fallback
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        return value
    elif isinstance(value, float) and value.is_integer():
        return int(value)
    elif isinstance(value, str) and len(value) <= 64:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            return round(parsed.timestamp() * 1000)
    msg = f"field {field!r} must be epoch milliseconds or an ISO-8601 time (got {_show(value)})"
    raise DecodeError(msg)


def _check_sizes(obj: object, depth: int = 0) -> None:
    """JSON has no length limits of its own: bound nesting, map and array sizes."""
    if depth > 16:
        msg = "message nests deeper than 16 levels"
        raise DecodeError(msg)
    if isinstance(obj, dict | list):
        if len(obj) > MAX_KEYS:
            msg = f"a map or array in the message has {len(obj)} items; the limit is {MAX_KEYS}"
            raise DecodeError(msg)
        for item in obj.values() if isinstance(obj, dict) else obj:
            _check_sizes(item, depth + 1)


def _show(value: object) -> str:
    """A short description of a bad value: its type, and a truncated repr for scalars."""
    if isinstance(value, dict | list):
        return f"{type(value).__name__} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
