"""Output messages: predictions, closed episodes and dead letters, and their encodings.

Ids are deterministic and unambiguous, so a consumer can drop the duplicates at-least-once
delivery may bring, and a replay and a live run can be compared message by message:

- a prediction: `<user>:<event id>`, or `<user>:#<n>` for an event without an id, where n
  counts the inputs applied to that user (1 for its first);
- a closed episode: `<user>:<started_at>/<n>`, n counting the user's closed episodes.

In `<user>` and `<event id>`, the characters `%`, `:`, `#` and `/` are written as `%25`,
`%3A`, `%23` and `%2F`, so no two different (user, event id) pairs give the same id and an
explicit event id never looks like a counter (`docs/messages.md`).
"""

from __future__ import annotations

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
    return text.translate(_ESCAPES)


def prediction_id(user: str, event_id: str | None, seq: int) -> str:
    """The id of the prediction an input produced (`seq`: the user's applied-input count)."""
    ref = f"#{seq}" if event_id is None else id_part(event_id)
    return f"{id_part(user)}:{ref}"


def episode_id(user: str, started_at: int, number: int) -> str:
    """The id of a user's `number`-th closed episode."""
    return f"{id_part(user)}:{started_at}/{number}"


def prediction_message(user: str, step: Step, seq: int) -> dict[str, Any] | None:
    """The `oracular.predictions` message for one applied event, or None if nothing changed.

    Args:
        user: the user id.
        step: the engine's step for the event.
        seq: how many inputs the user has had applied, this one included.
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
        "id": prediction_id(user, event.id, seq),
        "user": user,
        "at": step.at,
        "type": event.type,
        "event": event.name if event.type == "event" else event.intent,
        "intents": intents,
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
) -> dict[str, Any]:
    """The `oracular.events.dlq` record: the reason, where it came from, the original bytes."""
    return {
        "error": error,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key,
        "value": value,
    }


def encode_output(message: Mapping[str, Any], fmt: Format = "msgpack") -> bytes:
    """Encode an output message as msgpack (default) or JSON (bytes as latin-1 strings)."""
    if fmt == "msgpack":
        return bytes(msgpack.packb(message))
    return json.dumps(message, separators=(",", ":"), default=_json_bytes).encode()


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
