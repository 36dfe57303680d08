"""Output messages: predictions, closed episodes and dead letters, and their encodings.

Ids are deterministic and unambiguous, so a consumer can drop the duplicates at-least-once
delivery may bring, and a replay and a live run can be compared message by message:

- a prediction: `<user>:<event id>`, or `<user>:#<n>` for an event without an id, where n
  counts the inputs applied to that user (1 for its first);
- a closed episode: `<user>:<started_at>/<n>`, n counting the user's closed episodes;
- an erasure: `<user>:#erased@<erase time>` (on the predictions topic).

In `<user>` and `<event id>`, the characters `%`, `:`, `#` and `/` are written as `%25`,
`%3A`, `%23` and `%2F`, so no two different (user, event id) pairs give the same id and an
explicit event id never looks like a counter (`docs/messages.md`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgpack

from engine import ClosedEpisode, Prediction, Step

PREDICTIONS: Final = "oracular.predictions"
EPISODES: Final = "oracular.episodes"
DLQ: Final = "oracular.events.dlq"

Format = Literal["msgpack", "json"]


_ESCAPES: Final = str.maketrans({"%": "%25", ":": "%3A", "#": "%23", "/": "%2F"})


def id_part(text: str) -> str:
    """`text` with the id separators escaped (see the module's docs)."""
    if "%" in text or ":" in text or "#" in text or "/" in text:  # seldom: translate is slow
        return text.translate(_ESCAPES)
    return text


def prediction_id(user: str, event_id: str | None, seq: int, at: int | None = None) -> str:
    """The id of the prediction an input produced (`seq`: the user's applied-input count).

    An input without an id is named by `seq`, and, where a user can start again from nothing
    (`stateTtl`), by its applied time `at` too: `seq` starts again with the user, while the
    applied times of a user's later life all come after those of the earlier one.
    """
    if event_id is not None:
        ref = id_part(event_id)
    elif at is None:
        ref = f"#{seq}"
    else:
        ref = f"#{seq}@{at}"
    return f"{id_part(user)}:{ref}"


def episode_id(user: str, started_at: int, number: int) -> str:
    """The id of a user's `number`-th closed episode."""
    return f"{id_part(user)}:{started_at}/{number}"


def prediction_message(
    user: str, step: Step, seq: int, *, lives: bool = False
) -> dict[str, Any] | None:
    """The `oracular.predictions` message for one applied event, or None if nothing changed.

    Args:
        user: the user id.
        step: the engine's step for the event.
        seq: how many inputs the user has had applied, this one included.
        lives: a user may start again from nothing (`stateTtl`): an input without an id is
            named by its applied time too (`prediction_id`).
    """
    if not step.predictions:
        return None
    event = step.event
    intents: dict[str, Any] = {}
    for name, prediction in step.predictions.items():
        entry = _prediction_fields(prediction)
        wiped = step.wiped.get(name)
        if wiped is not None:
            entry["before_outcome"] = {"p": wiped.p, "lower": wiped.lower}
        intents[name] = entry
    return {
        "id": prediction_id(user, event.id, seq, step.at if lives else None),
        "user": user,
        "at": step.at,
        "type": event.type,
        "event": event.name if event.type == "event" else event.intent,
        "intents": intents,
    }


def erased_message(user: str, erased_at: int, command: str | None) -> dict[str, Any]:
    """The `oracular.predictions` message that says the user was erased at `erased_at` (by
    the erase command `command`, its id if it had one): a downstream store deletes the user's
    predictions on it. Its id is the same however often the command is applied."""
    return {
        "id": f"{id_part(user)}:#erased@{erased_at}",
        "user": user,
        "at": erased_at,
        "type": "erased",
        "event": command,
        "intents": {},
    }


def _prediction_fields(prediction: Prediction) -> dict[str, Any]:
    return {
        "p": prediction.p,
        "lower": prediction.lower,
        "reveal": prediction.reveal,
        "suppressed_until": prediction.suppressed_until,
    }


def episode_message(user: str, closed: ClosedEpisode, number: int) -> dict[str, Any]:
    """The `oracular.episodes` message for the user's `number`-th closed episode."""
    return {
        "id": episode_id(user, closed.started_at, number),
        "user": user,
        "started_at": closed.started_at,
        "closed_at": closed.closed_at,
        "reason": closed.reason,
        "intents": {
            name: {"verdict": verdict.verdict, "signals": list(verdict.signals)}
            for name, verdict in closed.intents.items()
        },
    }


def dlq_message(
    error: str,
    *,
    topic: str,
    partition: int | None,
    offset: int | None,
    key: bytes | None,
    value: bytes | None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """The `oracular.events.dlq` record: the reason, where it came from, the original bytes.

    The record fits `max_bytes` (default `DLQ_MAX_BYTES`) once encoded by `encode_output`, in
    either format. When the whole record would not (or `error`, `key` or `topic` is longer
    than `DLQ_MAX_ERROR`, `DLQ_MAX_KEY` or `DLQ_MAX_TOPIC`), those are cut to their limits and
    `value` to the longest prefix that fits, and the record adds `truncated: True`,
    `value_size` and `value_sha256` (length and SHA-256 hex of the original value; None
    without one), plus `key_size` and `key_sha256` when the key was cut.

    Raises:
        ValueError: `max_bytes` is below `DLQ_MIN_BYTES` (a setting is wrong, not the input).
    """
    budget = DLQ_MAX_BYTES if max_bytes is None else max_bytes
    if budget < DLQ_MIN_BYTES:
        msg = f"the dead-letter budget is {budget} bytes; it must be at least {DLQ_MIN_BYTES}"
        raise ValueError(msg)
    error = _encodable(error)
    record: dict[str, Any] = {
        "error": error,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key,
        "value": value,
    }
    small = (
        len(error) <= DLQ_MAX_ERROR
        and len(topic) <= DLQ_MAX_TOPIC
        and (key is None or len(key) <= DLQ_MAX_KEY)
    )
    if small and max(_dlq_sizes(record, value)) <= budget:
        return record
    return _truncated_dlq(record, budget)


DLQ_MAX_BYTES: Final = 900_000
"""Default budget of an encoded dead letter: the producer refuses records over 1,000,000
bytes (`max.request.size`, our producer's default); 100 kB stay for the record's key, headers
and batch framing."""
DLQ_MIN_BYTES: Final = 32 * 1024
"""Smallest budget accepted: room for the cut error, key and topic in the worst JSON escaping
(12 bytes a character, 6 a byte: about 28 kB) and some of the value."""
DLQ_MAX_ERROR: Final = 1024
"""Longest error text kept (characters); the decoder's reasons are under 300."""
DLQ_MAX_KEY: Final = 2048
"""Longest key kept (bytes): a valid key is a user id of at most 512 characters in UTF-8."""
DLQ_MAX_TOPIC: Final = 255
"""Longest topic name kept (characters): Kafka allows 249."""

_JSON_SIX: Final = bytes(
    b for b in range(256) if (b < 0x20 and b not in b"\b\t\n\f\r") or b >= 0x7F
)
"""Bytes `encode_output` writes in JSON as six characters (`\\u00XX`, latin-1 then ASCII)."""
_JSON_TWO: Final = b'"\\\b\t\n\f\r'
"""Bytes written as two characters (`\\"`, `\\\\`, `\\n`, ...)."""


def _truncated_dlq(record: dict[str, Any], budget: int) -> dict[str, Any]:
    """`record` with error, key and topic cut to their limits and value to what fits."""
    error: str = record["error"]
    key: bytes | None = record["key"]
    value: bytes | None = record["value"]
    out = dict(record)
    if len(error) > DLQ_MAX_ERROR:
        note = f"... (cut from {len(error)} characters)"
        out["error"] = error[: DLQ_MAX_ERROR - len(note)] + note
    out["topic"] = record["topic"][:DLQ_MAX_TOPIC]
    out["truncated"] = True
    out["value_size"] = None if value is None else len(value)
    out["value_sha256"] = None if value is None else hashlib.sha256(value).hexdigest()
    if key is not None and len(key) > DLQ_MAX_KEY:
        out["key"] = key[:DLQ_MAX_KEY]
        out["key_size"] = len(key)
        out["key_sha256"] = hashlib.sha256(key).hexdigest()
    if value is not None:
        out["value"] = value[: _longest_prefix(out, value, budget)]
    return out


def _longest_prefix(record: dict[str, Any], value: bytes, budget: int) -> int:
    """How many bytes of `value` fit, as `record`'s value, within `budget` in both formats."""
    packed, text = _dlq_sizes(record, b"")
    low, high = 0, max(0, min(len(value), budget - packed))
    while low < high:  # the largest n with both sizes <= budget (both grow with n)
        n = (low + high + 1) // 2
        if max(_dlq_sizes_for(packed, text, value[:n])) <= budget:
            low = n
        else:
            high = n - 1
    return low


def _dlq_sizes(record: Mapping[str, Any], value: bytes | None) -> tuple[int, int]:
    """(msgpack, JSON) length of `record` encoded with `value` as its value, computed
    from a copy without the value plus the value's exact encoded length."""
    shell = {**record, "value": None if value is None else b""}
    packed = len(encode_output(shell, "msgpack"))
    text = len(encode_output(shell, "json"))
    if value is None:
        return packed, text
    return _dlq_sizes_for(packed, text, value)


def _dlq_sizes_for(packed: int, text: int, value: bytes) -> tuple[int, int]:
    """Sizes given those of the record with an empty value (2 bytes `c4 00`, 2 chars `""`)."""
    size = len(value)
    header = 2 if size < 0x100 else 3 if size < 0x10000 else 5
    six = size - len(value.translate(None, _JSON_SIX))
    two = size - len(value.translate(None, _JSON_TWO))
    return packed - 2 + header + size, text + size + 5 * six + two


def _encodable(text: str) -> str:
    """`text`, with lone surrogates written as `\\udXXX` (msgpack cannot encode them)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


_pack = msgpack.Packer().pack
"""One Packer for every output, not one per call (`msgpack.packb`): about a microsecond an
output. Safe from any thread: packing plain values runs in C under the GIL, calling no
Python code."""


def encode_output(message: Mapping[str, Any], fmt: Format = "msgpack") -> bytes:
    """Encode an output message as msgpack (default) or JSON (bytes as latin-1 strings)."""
    if fmt == "msgpack":
        packed: bytes = _pack(message)
        return packed
    return _JSON.encode(message).encode()


def decode_output(raw: bytes) -> dict[str, Any]:
    """Decode an output message encoded by `encode_output` (either format)."""
    if raw[:1] == b"{":
        decoded: dict[str, Any] = json.loads(raw)
        return decoded
    result: dict[str, Any] = msgpack.unpackb(raw, raw=False)
    return result


def _json_bytes(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")  # lossless: every byte maps to one code point
    msg = f"cannot encode {type(value).__name__} as JSON"
    raise TypeError(msg)


_JSON: Final = json.JSONEncoder(separators=(",", ":"), default=_json_bytes)
"""`json.dumps(message, separators=(",", ":"), default=_json_bytes)` without building an
encoder per call (what `json.dumps` does when given options): the same text, without an
encoder built per output. Safe from any thread: `encode` keeps no state between calls."""
