"""Input messages: native events and commands, and Segment-spec messages, to `engine.Event`.

Native (msgpack or JSON, one object per line in files):
    {"id": "e1", "user": "u1", "name": "pricing.viewed", "ts": 1767261600000}
    {"user": "u1", "type": "end", "ts": ...}                       sign-out -> end_episode
    {"user": "u1", "type": "revealed", "intent": "upgrade", "ts": ...}   -> mark_revealed
    {"user": "u1", "type": "erase", "ts": ..., "id": ..., "reason": ...}  -> the user erased
Segment spec: `track` (`event`), `page` (-> "page.viewed"), `screen` (-> "screen.viewed"), with
`userId` (else `anonymousId`), `timestamp` and `messageId`; other Segment types are ignored.

Input is untrusted. Whatever its bytes, `decode_event` raises only `DecodeError` (the text
names the field and the rule) or `IgnoredMessage`; nothing it accepts can make a later
encoder or the engine fail. The limits below are checked before or while parsing:

- the message size, before anything else;
- JSON: UTF-8 only (no byte order mark), nesting checked by a scan that skips strings *before*
  `json.loads` (so a deep document never reaches its recursion), integers of more than 20
  digits and long number literals never converted, NaN/Infinity and overflowing floats
  rejected, duplicate keys rejected;
- msgpack: `max_*_len` options bound every string, binary, array and map before it is
  allocated; extension types and duplicate keys are rejected; the C unpacker's own stack
  bounds nesting;
- then one walk over the parsed value: nesting depth, items per map or array, string lengths,
  string keys, lone surrogates, 64-bit integers, finite floats (with the field's path);
- event times are whole epoch milliseconds from 1970 to the end of year 9999 (so they fit a
  signed 64-bit integer, a JSON double exactly, and a `datetime`).

JSON is recognised by its first byte: every JSON text starts with an ASCII byte, while a
msgpack map starts with a byte >= 0x80 (a msgpack message whose first byte is ASCII is a
single small integer), so a non-object JSON value still gets a precise reason.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any, Final, TypeGuard

import msgpack
import msgspec

from engine import Event
from engine.durations import MAX_TIME_MS, MIN_TIME_MS
from schemas.plausible import unit_hint

MAX_MESSAGE_BYTES: Final = 64 * 1024
"""Largest message accepted (bytes). Segment caps a message at 32 KB; twice that leaves room
for native producers, and a dead letter of this size stays far below the producer's 1 MB."""
MAX_STRING: Final = 512
"""Longest user id, event name, intent or id accepted (characters): ids and names are short;
longer values are payloads, and they are copied into every output and state key."""
MAX_KEYS: Final = 256
"""Most keys or items in any map or array of a message (Segment properties included): real
analytics properties have tens of keys; this bounds the work per message."""
MAX_DEPTH: Final = 16
"""Most levels of maps/arrays below the top-level object. Segment messages nest 3-4 levels
(context.page.*); 16 is generous and keeps every recursive walk and parser shallow."""
MAX_TEXT: Final = 8 * 1024
"""Longest string anywhere in a message, keys included (characters): a URL or a user agent in
the properties fits (8 KiB is the common server limit for a URL); longer strings are blobs."""
MAX_INT_DIGITS: Final = 20
"""Most digits of a JSON integer: 2**64 - 1 has 20. Longer literals are rejected before
conversion (Python's int() is slow on long strings and refuses more than 4,300 digits)."""
MAX_NUMBER_CHARS: Final = 64
"""Longest JSON number literal with a fraction or exponent: a double needs at most 24
characters (-1.2345678901234567e-308); 64 allows fixed-point notation."""
INT_MIN: Final = -(2**63)
"""Smallest integer accepted anywhere: msgpack's (signed 64-bit) range."""
INT_MAX: Final = 2**64 - 1
"""Largest integer accepted anywhere: msgpack's (unsigned 64-bit) range."""
MIN_TS: Final = MIN_TIME_MS
"""Earliest event time (epoch ms): 1970-01-01T00:00:00Z. Analytics events predate nothing."""
MAX_TS: Final = MAX_TIME_MS
"""Latest event time (epoch ms): 9999-12-31T23:59:59.999Z, the last instant a `datetime` can
hold. It fits a signed 64-bit integer with room for any timeout added to it, and is below
2**53, so JSON consumers read it exactly."""
MAX_ISO_CHARS: Final = 64
"""Longest ISO-8601 time string: the longest form (microseconds and an offset) has 32."""
MAX_MSGPACK_EXT: Final = 12
"""Longest msgpack extension payload let through to the unpacker: a msgpack timestamp (12
bytes), so it is reported by field; other extension types are rejected as they are read."""

SEGMENT_EVENT_TYPES: Final = {"track": None, "page": "page.viewed", "screen": "screen.viewed"}
SEGMENT_OTHER_TYPES: Final = frozenset({"identify", "group", "alias"})
COMMANDS: Final = frozenset({"event", "end", "revealed", "erase"})

_UTF8_BOM: Final = b"\xef\xbb\xbf"
_JSON_STRING: Final = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
# A JSON text up to the opening quote of a string that is never closed: text outside strings
# and whole strings as the JSON scanner reads them, then a quote. Possessive: each character
# is matched one way and never retried, so this takes one pass; and once it fails, every
# quote outside a string starts a `_JSON_STRING` (one that did not was retried from each later
# quote by the substitution: quadratic on an unterminated `"\"\"\"...`).
_UNTERMINATED: Final = re.compile(r'(?:[^"]++|"(?:[^"\\]++|\\.)*+")*+"', re.DOTALL)
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_LONG_DIGITS: Final = re.compile(f"[0-9]{{{MAX_INT_DIGITS + 1}}}")
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")  # the only way JSON writes one
_JSON_KINDS: Final = {
    "dict": "object",
    "list": "array",
    "str": "string",
    "int": "number",
    "float": "number",
    "bool": "boolean",
    "NoneType": "null",
}
_MSGPACK_KINDS: Final = {
    "dict": "map",
    "list": "array",
    "str": "string",
    "bytes": "binary",
    "int": "integer",
    "float": "float",
    "bool": "boolean",
    "NoneType": "nil",
    "Timestamp": "timestamp",
}


class SchemaError(Exception):
    """Root of the errors raised by `schemas`."""


class DecodeError(SchemaError):
    """A message that cannot become an event; the text says which field and why."""


class IgnoredMessage(SchemaError):
    """A well-formed message that carries no event for the engine (Segment identify, ...)."""


def show_time(ms: int) -> str:
    """Epoch milliseconds as an ISO-8601 UTC time, for messages people read."""
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def event_message(event: Event, **extra: Any) -> dict[str, Any]:
    """The native input message of `event` (what `decode_event` reads back), plus `extra`
    fields (producers' own analytics properties, which the worker ignores)."""
    message: dict[str, Any] = {"user": event.user, "ts": event.at}
    if event.type != "event":
        message["type"] = event.type
    for name in ("name", "intent", "id"):
        value = getattr(event, name)
        if value is not None:
            message[name] = value
    message.update(extra)
    return message


def erase_command(user: str, at: int, reason: str | None = None) -> dict[str, Any]:
    """The input message that erases `user` at `at` (`oracular forget`, `DELETE
    /v1/users/{user}`), with a new id that names it in the `erased` output.

    Raises:
        DecodeError: the user or the reason breaks a rule of the input (as a message would).
    """
    command: dict[str, Any] = {
        "id": f"erase-{uuid.uuid4().hex}",
        "user": user,
        "type": "erase",
        "ts": at,
    }
    if reason:
        command["reason"] = reason
    event_from_message(command)  # the worker must accept what is sent
    return command


def encode_event(event: Event, *, as_json: bool = False, **extra: Any) -> bytes:
    """`event` as an input message's bytes: msgpack (the default) or JSON."""
    message = event_message(event, **extra)
    if as_json:
        return json.dumps(message, separators=(",", ":")).encode()
    packed: bytes = msgpack.packb(message)
    return packed


def decode_event(raw: bytes, *, fallback_ts: int | None = None) -> Event:
    """Decode one message's bytes (JSON if it starts with an ASCII byte, else msgpack).

    Args:
        raw: the message value.
        fallback_ts: the Kafka record timestamp (epoch ms), used when the message has no `ts`.

    Raises:
        DecodeError: the bytes or the fields break a rule (for any bytes, nothing else).
        IgnoredMessage: a Segment message type that carries no event.
    """
    event = _plain_event(raw)
    if event is not None:
        return event
    return event_from_message(decode_message(raw), fallback_ts=fallback_ts)


_PLAIN_KEYS: Final = (frozenset({"user", "ts", "name"}), frozenset({"user", "ts", "name", "id"}))


def _plain_event(raw: bytes) -> Event | None:
    """The usual input, decoded without the general path's calls, or None for anything else.

    The usual input is a small msgpack map with exactly `user`, `ts`, `name` and maybe `id`:
    non-empty strings of at most MAX_STRING bytes, epoch milliseconds in range, and a string or
    an integer for the id. For such a map `decode_message` finds nothing to refuse (msgpack's
    strict UTF-8 cannot carry a lone surrogate) and `event_from_message` builds exactly this
    Event, at three times the cost: a dozen Python calls for checks these fields pass
    trivially. Anything else, valid or not, gives None and takes the general path, which
    decides and explains. Tests hold the two paths equal.
    """
    header = raw[0] if raw else 0
    if not 0x83 <= header <= 0x84:  # a fixmap of 3 or 4 entries
        return None
    try:
        obj = msgpack.unpackb(raw, raw=False, max_str_len=MAX_STRING, max_bin_len=0)
    except Exception:  # any: the general path explains what is wrong
        return None
    if type(obj) is not dict or len(obj) != header - 0x80 or obj.keys() not in _PLAIN_KEYS:
        return None  # (fewer entries than the header: a duplicate key, refused there)
    user, at, name, event_id = obj["user"], obj["ts"], obj["name"], obj.get("id")
    if (
        type(user) is not str
        or type(name) is not str
        or type(at) is not int
        or not (user and name and MIN_TS <= at <= MAX_TS)
    ):
        return None
    if type(event_id) is int:
        event_id = str(event_id)  # msgpack's integers are all within the 64-bit limits
    elif event_id == "":
        event_id = None  # an empty id is no id (`_optional_string`)
    elif event_id is not None and type(event_id) is not str:
        return None
    return Event(user, at, name=name, id=event_id)


def decode_message(raw: bytes) -> dict[str, Any]:
    """Parse the bytes of one message into a mapping, within the limits (module docs)."""
    if raw[:1] == b"{":  # the usual JSON message: none of the checks below can refuse it
        proven = _proven_json(raw)
        if proven is not None:
            return proven
    if len(raw) > MAX_MESSAGE_BYTES:
        msg = f"message is {len(raw)} bytes; the limit is {MAX_MESSAGE_BYTES}"
        raise DecodeError(msg)
    if not raw:
        msg = "the message is empty (0 bytes): expected a msgpack map or a JSON object"
        raise DecodeError(msg)
    if raw.startswith(_UTF8_BOM):
        msg = "the message starts with a UTF-8 byte order mark: send JSON without it"
        raise DecodeError(msg)
    if raw[0] < 0x80:
        (obj, surrogates, walked), fmt, kinds = _parse_json(raw), "JSON", _JSON_KINDS
    else:
        obj, surrogates, walked = _parse_msgpack(raw), False, False
        fmt, kinds = "msgpack", _MSGPACK_KINDS
    if not isinstance(obj, dict):
        name = type(obj).__name__
        kind = kinds.get(name, name)
        expected = "an object" if fmt == "JSON" else "a map"
        msg = (
            f"a message must be a map/object (got {name}): "
            f"the message is a {fmt} {kind}, expected {expected}"
        )
        raise DecodeError(msg)
    if not walked:
        _check_tree(obj, surrogates)
    return obj


def event_from_message(obj: Mapping[str, Any], *, fallback_ts: int | None = None) -> Event:
    """Turn a parsed message (native or Segment) into an Event."""
    kind = obj.get("type", "event")
    if isinstance(kind, str) and (kind in SEGMENT_EVENT_TYPES or kind in SEGMENT_OTHER_TYPES):
        return _from_segment(obj, kind, fallback_ts)
    if not isinstance(kind, str) or kind not in COMMANDS:
        choices = ", ".join(sorted(COMMANDS | set(SEGMENT_EVENT_TYPES)))
        msg = f"field 'type' must be one of {choices} (got {_show(kind)})"
        raise DecodeError(msg)
    user = _string(obj, "user")
    at = _time(obj.get("ts"), "ts", fallback_ts)
    if obj.get("sent_at") is not None and obj.get("ts") is not None:
        at = _corrected(at, "ts", (obj["sent_at"], "sent_at"), None, fallback_ts)
    event_id = _optional_string(obj, "id")
    if kind == "end":
        return Event(user, at, type="end", id=event_id)
    if kind == "revealed":
        return Event(user, at, type="revealed", intent=_string(obj, "intent"), id=event_id)
    if kind == "erase":
        _optional_string(obj, "reason")  # the operator's note: checked, kept in the input only
        return Event(user, at, type="erase", id=event_id)
    return Event(user, at, name=_string(obj, "name"), id=event_id)


def _from_segment(obj: Mapping[str, Any], kind: str, fallback_ts: int | None) -> Event:
    if kind in SEGMENT_EVENT_TYPES:
        event = _plain_segment(obj, kind, fallback_ts)
        if event is not None:
            return event
    if kind in SEGMENT_OTHER_TYPES:
        msg = f"Segment {kind!r} messages carry no event"
        raise IgnoredMessage(msg)
    field = "userId" if obj.get("userId") not in (None, "") else "anonymousId"
    user = obj.get(field)
    if (
        not isinstance(user, str | int)
        or isinstance(user, bool)
        or user == ""
        or (isinstance(user, int) and not INT_MIN <= user <= INT_MAX)
    ):
        msg = "a Segment message needs 'userId' or 'anonymousId' (a string)"
        raise DecodeError(msg)
    user = str(user)
    if len(user) > MAX_STRING:
        msg = f"field {field!r} is longer than {MAX_STRING} characters ({len(user)})"
        raise DecodeError(msg)
    if not user.isascii():  # ASCII of at most MAX_STRING characters: nothing to refuse
        _check_unicode(user, field)
    name = SEGMENT_EVENT_TYPES[kind]
    if name is None:
        name = _string(obj, "event")
    device = "originalTimestamp" if obj.get("originalTimestamp") is not None else "timestamp"
    if obj.get("sentAt") is not None and obj.get(device) is not None:
        at = _time(obj[device], device, None)
        sent = (obj["sentAt"], "sentAt")
        at = _corrected(at, device, sent, obj.get("receivedAt"), fallback_ts)
    else:
        at = _time(obj.get("timestamp"), "timestamp", fallback_ts)
    return Event(user, at, name=name, id=_optional_string(obj, "messageId"))


def _plain_segment(obj: Mapping[str, Any], kind: str, fallback_ts: int | None) -> Event | None:
    """The usual Segment event decoded with fewer calls, or None: `_from_segment` decides.

    The usual event has a `userId`, an event name (`track`) and a `messageId` that are ASCII
    strings of at most MAX_STRING characters (nothing for `_string` and `_optional_string` to
    refuse or convert), no `originalTimestamp`, and ISO-8601 times that `_iso_ms` takes. For
    it this computes what `_from_segment` computes, the same way (`_iso_parse`, the skew
    correction's formula); any other value, or a time out of range, gives None.
    """
    user, message_id = obj.get("userId"), obj.get("messageId")
    name = SEGMENT_EVENT_TYPES[kind] or obj.get("event")
    if not (
        _short_ascii(user)
        and _short_ascii(name)
        and (message_id is None or message_id == "" or _short_ascii(message_id))
        and obj.get("originalTimestamp") is None
    ):
        return None
    at = _plain_iso(obj.get("timestamp"))
    sent_value = obj.get("sentAt")
    # Each `Event` by position (user, at, name, type, intent, id): keywords cost twice the call.
    if at is None or sent_value is None:
        return None if at is None else Event(user, at, name, "event", None, message_id or None)
    sent, received = _plain_iso(sent_value), obj.get("receivedAt")
    if received is not None:
        received = _plain_iso(received)
    elif type(fallback_ts) is int and _in_range(fallback_ts):
        received = fallback_ts
    else:
        received = sent  # no time of receipt: `at` as it is (`_corrected`)
    if sent is None or received is None or not _in_range(received - (sent - at)):
        return None
    return Event(user, received - (sent - at), name, "event", None, message_id or None)


def _short_ascii(value: object) -> TypeGuard[str]:
    """A non-empty ASCII string of at most MAX_STRING characters: a field nothing refuses."""
    return type(value) is str and 0 < len(value) <= MAX_STRING and value.isascii()


def _plain_iso(value: object) -> int | None:
    """`_iso_ms` of a string it accepts, else None (it would explain why)."""
    if type(value) is not str or len(value) > MAX_ISO_CHARS:
        return None
    try:
        at = _iso_parse(value)
    except (ValueError, OverflowError):
        return None
    return at if _in_range(at) else None


def _corrected(
    at: int, field: str, sent: tuple[object, str], received: object, record_ts: int | None
) -> int:
    """The device time `at` corrected for the device's clock skew, as Segment corrects it:
    `received - (sent - at)`, where `sent` is the device's own time of sending and `received`
    the server's time of receiving: the message's `receivedAt`, else its record's timestamp.
    Both differences come from one clock each, so a device clock off by years gives the
    right time. With neither (a file line without `receivedAt`), `at` as it is: the message
    counts as received when it was sent. `sent` is the sending time's value and field name.
    """
    sent_value, sent_field = sent
    sent_ms = _time(sent_value, sent_field, None)
    if received is not None:
        received_ms = _time(received, "receivedAt", None)
    elif type(record_ts) is int and _in_range(record_ts):
        received_ms = record_ts
    else:
        return at
    corrected = received_ms - (sent_ms - at)
    if not _in_range(corrected):
        msg = (
            f"field {field!r} corrected for the device's clock skew ({sent_field} "
            f"{sent_ms} received at {received_ms}) is {corrected}: must be epoch milliseconds "
            f"between {MIN_TS} and {MAX_TS}"
        )
        raise DecodeError(msg)
    return corrected


def _string(obj: Mapping[str, Any], field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str) or not value:
        if field not in obj:  # say what the message has: `event` for `name`, `userId`, ...
            keys = [repr(k) for k in list(obj)[:8] if isinstance(k, str) and len(k) <= 64]
            has = f" (the message has {', '.join(keys)})" if keys else ""
            msg = f"field {field!r} is missing{has}"
        else:
            msg = f"field {field!r} must be a non-empty string (got {_show(value)})"
        raise DecodeError(msg)
    if len(value) > MAX_STRING:
        msg = f"field {field!r} is longer than {MAX_STRING} characters ({len(value)})"
        raise DecodeError(msg)
    if not value.isascii():  # ASCII of at most MAX_STRING characters: nothing to refuse
        _check_unicode(value, field)
    return value


def _optional_string(obj: Mapping[str, Any], field: str) -> str | None:
    """The field as a string; None when it is missing, null or empty (an empty id is no id:
    the outputs then count the user's inputs instead, as for a missing one)."""
    if obj.get(field) in (None, ""):
        return None
    value = obj[field]
    if isinstance(value, int) and not isinstance(value, bool) and INT_MIN <= value <= INT_MAX:
        value = str(value)
    if not isinstance(value, str) or len(value) > MAX_STRING:
        msg = f"field {field!r} must be a string of at most {MAX_STRING} characters"
        raise DecodeError(msg)
    if not value.isascii():  # ASCII of at most MAX_STRING characters: nothing to refuse
        _check_unicode(value, field)
    return value


def parse_time(value: object, field: str) -> int:
    """A time as the inputs give it (epoch ms, or an ISO-8601 string; naive = UTC) in epoch ms:
    what a flag (`--until`, `--at`) or the lookup API's `at` take too.

    Raises:
        DecodeError: neither, or out of range; the text names `field`.
    """
    return _time(value, field, None)


def _time(value: object, field: str, fallback: int | None) -> int:
    """Epoch ms from an int, an integral float, or an ISO-8601 string (naive = UTC)."""
    if value is None:
        if fallback is None:
            msg = f"field {field!r} is missing and the record has no timestamp"
            raise DecodeError(msg)
        if isinstance(fallback, bool) or not isinstance(fallback, int) or not _in_range(fallback):
            msg = (
                f"field {field!r} is missing and the record timestamp {_show(fallback)} is not "
                f"epoch milliseconds between {MIN_TS} and {MAX_TS}"
            )
            raise DecodeError(msg)
        return fallback
    if isinstance(value, bool):
        pass
    elif isinstance(value, int | float):
        return _epoch_ms(value, field)
    elif isinstance(value, str):
        return _iso_ms(value, field)
    msg = f"field {field!r} must be epoch milliseconds or an ISO-8601 time (got {_show(value)})"
    raise DecodeError(msg)


def _epoch_ms(value: float, field: str) -> int:
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        msg = f"field {field!r} is {_show(value)}: must be a whole number of epoch milliseconds"
        raise DecodeError(msg)
    if not MIN_TS <= value <= MAX_TS:
        hint = unit_hint(value)
        msg = (
            f"field {field!r} is {_show(value)}: "
            f"must be epoch milliseconds between {MIN_TS} and {MAX_TS}"
        ) + (f"; {hint}" if hint else "")
        raise DecodeError(msg)
    return int(value)


def _iso_ms(value: str, field: str) -> int:
    if len(value) > MAX_ISO_CHARS:
        msg = (
            f"field {field!r} is a string of {len(value)} characters: an ISO-8601 time "
            f"has at most {MAX_ISO_CHARS}"
        )
        raise DecodeError(msg)
    try:
        at = _iso_parse(value)
    except (ValueError, OverflowError) as exc:
        msg = f"field {field!r} must be epoch milliseconds or an ISO-8601 time (got {_show(value)})"
        raise DecodeError(msg) from exc
    if not _in_range(at):
        msg = (
            f"field {field!r} is {_show(value)}: must be a time between "
            "1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z"
        )
        raise DecodeError(msg)
    return at


def _iso_parse(value: str) -> int:
    """Epoch ms of an ISO-8601 time (naive = UTC); ValueError or OverflowError if none."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return round(parsed.timestamp() * 1000)


def _in_range(at: int) -> bool:
    return MIN_TS <= at <= MAX_TS


# --- parsing ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _LongNumber:
    """A JSON number literal too long to convert; the walk reports it with its field."""

    chars: int
    integer: bool


def _parse_json(raw: bytes) -> tuple[object, bool, bool]:
    """The parsed value, whether its strings may hold lone surrogates, and whether it is
    known to pass the walk (`_check_tree`) already: see `_JSON_FAST`."""
    first = raw.lstrip()[:1]
    label = "not valid JSON" if first in (b"{", b"[") else "not valid msgpack or JSON"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{label}: the bytes are not UTF-8 ({exc.reason} at byte {exc.start})"
        raise DecodeError(msg) from exc
    brackets = text.count("[") + text.count("{")
    if brackets > MAX_DEPTH + 1:  # else it cannot nest too deep
        _check_json_depth(text, label)
    surrogates = _SURROGATE_ESCAPE.search(text) is not None
    try:
        obj = _JSON_FAST.decode(text)
    except _NotFast:
        pass  # a number the fast hooks do not take: parsed again below, as ever
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        msg = f"{label}: {exc}"
        raise DecodeError(msg) from exc
    else:
        # Every number is in range and finite (the hooks took them), keys are strings (JSON
        # has no others); a string of more than MAX_TEXT characters needs a longer text, a
        # container of more than MAX_KEYS items that many commas, a container nested deeper
        # than MAX_DEPTH more brackets; lone surrogates need a `\uD8..` escape. Without any
        # of those, the walk has nothing to refuse.
        clean = (
            len(text) <= MAX_TEXT
            and text.count(",") < MAX_KEYS
            and brackets <= MAX_DEPTH + 1
            and not surrogates
        )
        return obj, surrogates, clean
    # A literal of more than 20 digits (an integer) or 64 characters (a float: at most four
    # non-digits) holds a run of 21 digits; without one, no number needs the length hooks.
    decoder = _JSON_CHECKED if _LONG_DIGITS.search(text) else _JSON_PLAIN
    try:
        obj = decoder.decode(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        msg = f"{label}: {exc}"
        raise DecodeError(msg) from exc
    return obj, surrogates, False


def _proven_json(raw: bytes) -> dict[str, Any] | None:
    """The object msgspec parses from `raw` when it is provably the one `decode_message`'s
    stdlib path (`_parse_json`: `_JSON_FAST`, then no walk) returns, else None and that path
    decides, with its own error texts. msgspec parses a Segment message about 4x faster
    than the stdlib with its hooks; what it does not check itself is proven from the bytes,
    cheaply and soundly (a proof that fails only costs the stdlib parse):

    - no backslash: no escape, so no lone surrogate and every string is its bytes;
    - the walk has nothing to refuse (as `_parse_json`'s `clean`): at most MAX_TEXT bytes,
      fewer than MAX_KEYS commas, at most MAX_DEPTH + 1 brackets (so msgspec never nests
      deep either);
    - no run of more than 18 digits: every integer fits in 64 bits (msgspec makes Python
      ints of any size), and every float literal is shorter than MAX_NUMBER_CHARS (3 digit
      runs and 4 other characters at most); floats go through `_fast_float`, the stdlib
      hook itself, so they are the same values and a non-finite one stops the parse;
    - no duplicate key: `_no_duplicate_key`.

    msgspec accepts no text the stdlib refuses (tests/schemas/test_json_proven.py) and keeps
    the keys in their order, so the dict is equal, key order and number types included.
    """
    if len(raw) > MAX_TEXT:
        return None
    marks = raw.translate(None, _NOT_A_MARK)  # one pass, then counts on a short text
    if (
        b"\\" in marks
        or marks.count(b",") >= MAX_KEYS
        or marks.count(b"[") + marks.count(b"{") > MAX_DEPTH + 1
        or _DIGIT_RUN in raw.translate(_DIGITS_AS_ZERO)
    ):
        return None
    try:
        obj = _MSGSPEC_JSON.decode(raw)
    except Exception:  # any: malformed, bad UTF-8, a number `_fast_float` stops
        return None
    if type(obj) is not dict or not _no_duplicate_key(marks.count(b":"), obj):
        return None
    return obj


def _no_duplicate_key(colons: int, obj: dict[str, Any]) -> bool:
    """Whether no map of a backslash-free JSON text with `colons` colons (parsed: `obj`)
    repeats a key.

    A colon in JSON text is a key's separator or a character of a string; without escapes
    every string of `obj` is written in the text as it is. msgspec's compact encoding of
    `obj` writes one colon per key of `obj` and every string's colons. A repeated key keeps
    one entry in `obj` (and drops the other's value with its keys and strings), so the
    encoding has fewer colons than the text; without one, the same number.
    """
    return colons == _MSGSPEC_ENCODE(obj).count(b":")


def _check_json_depth(text: str, label: str) -> None:
    unterminated = _UNTERMINATED.match(text)
    if unterminated:  # every bracket after its quote is inside the string
        start = unterminated.end() - 1
        msg = f"{label}: a string is not terminated (it starts at character {start})"
        raise DecodeError(msg)
    outside = _JSON_STRING.sub("", text)
    depth = _json_depth(outside)
    if depth > MAX_DEPTH + 1:
        msg = (
            f"the message nests deeper than {MAX_DEPTH} levels "
            f"({depth - 1} maps/arrays inside the top-level object); the limit is {MAX_DEPTH}"
        )
        raise DecodeError(msg)


def _json_depth(outside: str) -> int:
    """The deepest nesting of `[`/`{` in a JSON text whose strings were removed.

    `_JSON_STRING` removes strings as the JSON scanner reads them (a quote ends a string unless
    escaped) up to any syntax error, so for every prefix the scanner parses, the count here is
    its recursion depth: a bound checked before json.loads can recurse.
    """
    marks = _NOT_BRACKET.sub("", outside)
    opening = marks.count("[") + marks.count("{")
    if opening <= MAX_DEPTH + 1:
        return opening  # cannot nest deeper than it opens (the common, cheap case)
    return max(accumulate(map(_BRACKET_STEP.__getitem__, marks)))


def _json_int(text: str) -> int | _LongNumber:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        return _LongNumber(digits, integer=True)
    return int(text)


def _json_float(text: str) -> float | _LongNumber:
    if len(text) > MAX_NUMBER_CHARS:
        return _LongNumber(len(text), integer=False)
    return float(text)


def unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A JSON object's or msgpack map's pairs as a dict; DecodeError when a key comes twice
    (which copy counts differs between parsers). The lookup API's bodies use it too."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[Any] = set()
        for key, _ in pairs:
            if key in seen:
                msg = (
                    f"key {_show(key)} appears more than once in one map/object: "
                    "duplicate keys are ambiguous"
                )
                raise DecodeError(msg)
            seen.add(key)
    return obj


class _NotFast(Exception):
    """A number `_JSON_FAST` leaves to the general parse (raised from its hooks)."""


def _fast_int(text: str) -> int:
    if len(text) - text.startswith("-") > _FAST_INT_DIGITS:
        raise _NotFast
    return int(text)


def _fast_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _NotFast
    value = float(text)
    if not math.isfinite(value):
        raise _NotFast
    return value


def _not_fast(text: str) -> float:
    raise _NotFast


_FAST_INT_DIGITS: Final = 18
"""Digits of an integer `_JSON_FAST` takes: any of 18 digits fits in a signed 64-bit integer."""

_JSON_FAST: Final = json.JSONDecoder(
    parse_int=_fast_int,
    parse_float=_fast_float,
    parse_constant=_not_fast,
    object_pairs_hook=unique_keys,
)
"""The first parse of every JSON message: a number that may break a rule (an integer of more
than 18 digits, a float literal longer than MAX_NUMBER_CHARS or not finite, NaN, Infinity)
stops it with `_NotFast`, and the message is parsed again with `_JSON_PLAIN` or
`_JSON_CHECKED`, then walked, as before. Until it stops, it calls the same hooks on the same
text as those (numbers convert alike), so it raises the same errors at the same places; a
parse it finishes has every number within the walk's rules, which lets the walk be skipped
when the text's size, commas and brackets show nothing else can break one (`_parse_json`).
The general path scanned each message for long digit runs and walked every value (together
most of a Segment message's decode, BENCHMARKS.md); this one makes a Python call per number
instead."""

_MSGSPEC_JSON: Final = msgspec.json.Decoder(float_hook=_fast_float)
"""`_proven_json`'s parser: its floats are the stdlib's, from the same hook."""
_MSGSPEC_ENCODE: Final = msgspec.json.Encoder().encode
_NOT_A_MARK: Final = bytes(b for b in range(256) if b not in b",[{:\\")
"""Every byte but the few `_proven_json` counts: deleted, they leave a short text."""
_DIGITS_AS_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_DIGIT_RUN: Final = b"0" * (_FAST_INT_DIGITS + 1)
"""A run of digits too long for `_fast_int`, in a text whose digits were all made `0`."""

_JSON_PLAIN: Final = json.JSONDecoder(
    parse_constant=float,  # NaN, Infinity: rejected by the walk, with the field
    object_pairs_hook=unique_keys,
)
_JSON_CHECKED: Final = json.JSONDecoder(
    parse_int=_json_int,
    parse_float=_json_float,
    parse_constant=float,
    object_pairs_hook=unique_keys,
)


def _parse_msgpack(raw: bytes) -> object:
    """The message's value, duplicate keys refused.

    A flat map (the usual event) is parsed without the duplicate-key hook, a Python call per
    map: its header says how many entries it has, so a parsed dict with fewer had a duplicate.
    Anything else (nested containers, whose headers are not at hand) is parsed again with it.
    """
    parsed = _unpack(raw, None)
    if isinstance(parsed, dict) and len(parsed) == _map_length(raw):
        for value in parsed.values():
            if isinstance(value, dict | list):
                break
        else:
            return parsed
    return _unpack(raw, unique_keys)


def _map_length(raw: bytes) -> int | None:
    """The entry count in the header of the msgpack map `raw` starts with (else None)."""
    first = raw[0]
    if 0x80 <= first <= 0x8F:
        return first & 0x0F
    if first == 0xDE:
        return int.from_bytes(raw[1:3], "big")
    if first == 0xDF:
        return int.from_bytes(raw[1:5], "big")
    return None


def _unpack(raw: bytes, pairs_hook: Callable[[list[tuple[Any, Any]]], object] | None) -> object:
    try:
        return msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            object_pairs_hook=pairs_hook,
            ext_hook=_reject_ext,
            max_str_len=4 * MAX_TEXT,  # UTF-8 takes at most 4 bytes a character
            max_bin_len=MAX_TEXT,
            max_array_len=MAX_KEYS,
            max_map_len=MAX_KEYS,
            max_ext_len=MAX_MSGPACK_EXT,
        )
    except msgpack.StackError as exc:
        msg = f"the message nests deeper than {MAX_DEPTH} levels (msgpack stack exceeded)"
        raise DecodeError(msg) from exc
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        detail = str(exc) or type(exc).__name__
        limit = _MSGPACK_LIMIT.fullmatch(detail)
        if limit is not None:
            raise DecodeError(_limit_text(int(limit[1]), limit[2])) from exc
        msg = f"not valid msgpack or JSON: {detail}"
        raise DecodeError(msg) from exc


_MSGPACK_LIMIT: Final = re.compile(
    r"([0-9]{1,20}) exceeds max_(str|bin|array|map|ext)_len\([0-9]+\)"
)
"""The unpacker's text for a `max_*_len` it refused (the length its header gives)."""


def _limit_text(length: int, kind: str) -> str:
    """A msgpack length limit's error in the words of the walk's (the unpacker, which refuses
    it before allocating, does not say where)."""
    if kind == "array":
        return f"an array in the message has {length} items; the limit is {MAX_KEYS}"
    if kind == "map":
        return f"a map in the message has {length} items; the limit is {MAX_KEYS}"
    if kind == "str":
        return (
            f"a string in the message is {length} bytes of UTF-8, more than {MAX_TEXT} "
            f"characters can take; the limit is {MAX_TEXT} characters"
        )
    if kind == "bin":
        return f"a binary in the message is {length} bytes; the limit is {MAX_TEXT}"
    return "a msgpack extension value is in the message: extension types are not accepted"


def _reject_ext(code: int, data: bytes) -> object:
    msg = f"not valid msgpack or JSON: msgpack extension type {code} is not accepted"
    raise DecodeError(msg)


class _Bad(Exception):
    """A rule broken inside the parsed value; the path is collected while unwinding."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []  # innermost first


def _check_tree(obj: dict[str, Any], surrogates: bool) -> None:
    """Check the parsed message and everything inside it (the limits in the module docs).

    Args:
        obj: the top-level map.
        surrogates: whether strings may hold lone surrogates (JSON with `\\uD8..` escapes
            only: strict UTF-8, as in msgpack and raw JSON text, cannot encode them).
    """
    try:
        _walk(obj, 0, surrogates)
    except _Bad as bad:
        msg = f"{_where(tuple(reversed(bad.path)))} {bad.problem}"
        raise DecodeError(msg) from None


def _walk(value: object, depth: int, surrogates: bool) -> None:
    """Raise `_Bad` for the first rule `value` breaks; a type the parsers make for nothing a
    message may carry (a msgpack timestamp, an unconverted number) is refused."""
    if isinstance(value, dict | list):  # first: leaves are mostly checked by `_plain`
        _walk_container(value, depth, surrogates)
    elif isinstance(value, str):
        _text(value, surrogates)
    elif isinstance(value, bool | bytes) or value is None:
        return  # msgpack's max_bin_len bounds binary
    elif isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            msg = f"is {_show(value)}: integers must fit in 64 bits"
            raise _Bad(msg)
    elif isinstance(value, float):
        if not math.isfinite(value):
            msg = f"is {value!r}: NaN and Infinity are not accepted"
            raise _Bad(msg)
    elif isinstance(value, _LongNumber):
        if value.integer:
            what = f"an integer of {value.chars} digits"
            limit = f"{MAX_INT_DIGITS} digits (64-bit integers)"
        else:
            what = f"a number literal of {value.chars} characters"
            limit = f"{MAX_NUMBER_CHARS} characters"
        msg = f"is {what}; the limit is {limit}"
        raise _Bad(msg)
    else:
        name = _MSGPACK_KINDS.get(type(value).__name__, type(value).__name__)
        msg = f"is a msgpack {name}, which a message cannot carry"
        raise _Bad(msg)


def _walk_container(value: dict[Any, Any] | list[Any], depth: int, surrogates: bool) -> None:
    if depth > MAX_DEPTH:
        msg = f"nests deeper than {MAX_DEPTH} levels below the top; the limit is {MAX_DEPTH}"
        raise _Bad(msg)
    if len(value) > MAX_KEYS:
        msg = f"has {len(value)} items; the limit is {MAX_KEYS}"
        raise _Bad(msg)
    depth += 1
    if isinstance(value, list):
        for index, item in enumerate(value):
            if not _plain(item, surrogates):
                try:
                    _walk(item, depth, surrogates)
                except _Bad as bad:
                    bad.path.append(index)
                    raise
        return
    for key, item in value.items():
        if not isinstance(key, str):
            msg = f"has a {type(key).__name__} key: map keys must be strings"
            raise _Bad(msg)
        if not _plain(key, surrogates):
            _text(key, surrogates, what="has a key")  # reported at the map, not the key
        if not _plain(item, surrogates):
            try:
                _walk(item, depth, surrogates)
            except _Bad as bad:
                bad.path.append(key)
                raise


def _plain(value: object, surrogates: bool) -> bool:
    """A scalar that breaks no rule, decided without a call into `_walk` (the common case)."""
    if isinstance(value, str):
        return len(value) <= MAX_TEXT and (not surrogates or value.isascii())
    if isinstance(value, int):
        return INT_MIN <= value <= INT_MAX  # bools too
    return value is None or (isinstance(value, float) and math.isfinite(value))


def _text(value: str, surrogates: bool, what: str = "is a string") -> None:
    if len(value) > MAX_TEXT:
        msg = f"{what} of {len(value)} characters; the limit is {MAX_TEXT}"
        raise _Bad(msg)
    found = _SURROGATE.search(value) if surrogates and not value.isascii() else None
    if found:
        msg = f"{what} with a lone UTF-16 surrogate ({found.group()!r}): not valid Unicode"
        raise _Bad(msg)


def _check_unicode(value: str, field: str) -> None:
    """A field of a mapping that may not have been walked (the file readers parse their own)."""
    try:
        _text(value, surrogates=True)
    except _Bad as bad:
        msg = f"field {field!r} {bad.problem}"
        raise DecodeError(msg) from None


def _where(path: tuple[str | int, ...]) -> str:
    """`field 'a.b[2]'` for a path in the message (long keys cut), `the message` for the root."""
    if not path:
        return "the message"
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            shown = part if len(part) <= 40 else f"{part[:37]}..."
            text += f".{shown}" if text else shown
    if len(text) > 120:
        text = f"...{text[-117:]}"
    return f"field {text!r}"  # repr escapes surrogates and control characters


def _show(value: object) -> str:
    """A short description of a bad value: its type, and a truncated repr for scalars."""
    if isinstance(value, dict | list):
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, int) and not -(10**40) < value < 10**40:
        return f"an integer of {value.bit_length()} bits"  # repr may refuse a huge int
    if isinstance(value, str) and len(value) > 40:
        value = value[:40]
    if isinstance(value, bytes) and len(value) > 40:
        value = value[:40]
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
