"""The lookup API's decisions, without HTTP or Faust: routing, validation and answers.

`streams/lookup/api.py` serves these over HTTP on every worker (docs/serving.md). Everything here is
synchronous and testable without a broker:

- `partition_for`: the partition of a user id, murmur2 as Kafka's default partitioner (the
  producers' partitioner, so the partition that holds the user's state);
- `route`: what a worker does with a lookup for a partition (answer, forward, 503);
- `answer`: a user's predictions computed by `engine.predict` at the request time from the
  state of that one user (`read_user`: its stored bytes decoded, whole or only what
  predictions read, the prior when the user is unknown);
- request validation with bounded sizes, raising `ApiError` with the status to answer.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from engine import EngineConfig, EngineState, create_state, explain
from engine.durations import MAX_TIME_MS, MIN_TIME_MS
from engine.episodes import clamp_time
from engine.predict import predict_read
from engine.state import Reading
from schemas.events import DecodeError, parse_time, unique_keys
from schemas.stored import decode_reading, decode_stored

FORWARDED_HEADER: Final = "X-Oracular-Forwarded"
"""Set on a forwarded request (to the forwarding worker's URL): the receiver never forwards it
again, so a lookup takes at most one hop even while workers disagree about the routing."""
MAX_BATCH: Final = 1000
"""Most users in one `POST /v1/lookup`."""
MAX_BODY_BYTES: Final = 512 * 1024
"""Largest request body accepted (a full batch with intents fits easily)."""
MAX_USER_CHARS: Final = 512
"""Longest user id (the input decoder's string limit, schemas/events.py)."""
RETRY_AFTER_S: Final = 1
"""Retry-After of a 503 while a partition moves or is restored."""

Role = Literal["active", "standby"]


class ApiError(Exception):
    """A request the API refuses: the HTTP status, a message saying what to do, extras."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        retry_after: int | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON error body: `{"error": message, ...extras}`."""
        return {"error": self.message, "status": self.status, **self.extra}


def partition_for(user: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2 of the UTF-8 key) gives `user`."""
    return (murmur2(user.encode("utf-8")) & 0x7FFFFFFF) % partitions


_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """`aiokafka.partitioner.murmur2` (Kafka's), 1.5x faster: a batch routes every user, and
    the owner of a forwarded batch routes them again. Its words read by `struct`, each step
    masked once; the same hash for every input (tests/streams/test_answer_json.py)."""
    length = len(data)
    h = 0x9747B28C ^ length
    whole = length & ~3
    for (word,) in struct.iter_unpack("<I", data[:whole]):
        k = (word * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    if whole < length:  # the last 1-3 bytes, little-endian
        h = ((h ^ int.from_bytes(data[whole:], "little")) * _M) & _MASK
    h = ((h ^ (h >> 13)) * _M) & _MASK
    return h ^ (h >> 15)


def config_identity(config: EngineConfig) -> str:
    """A short hash of the engine config, so a client sees which config answered."""
    text = json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- validation ---------------------------------------------------------------------------


def check_user(user: object) -> str:
    """A user id from a path or a batch item: a non-empty string of bounded length."""
    if not isinstance(user, str) or not user:
        raise ApiError(400, "a user id must be a non-empty string")
    if len(user) > MAX_USER_CHARS:
        raise ApiError(400, f"a user id is at most {MAX_USER_CHARS} characters ({len(user)})")
    try:
        user.encode("utf-8")  # the record key; a lone surrogate (JSON "\ud800") has none
    except UnicodeEncodeError as exc:
        msg = f"a user id must be valid Unicode text (a lone surrogate at {exc.start})"
        raise ApiError(400, msg) from exc
    return user


def check_intents(config: EngineConfig, intents: object) -> list[str] | None:
    """The intents asked for (None: all), each one declared by the config, else 400."""
    if intents is None:
        return None
    if isinstance(intents, str):
        intents = [intents]
    if not isinstance(intents, list) or not all(isinstance(i, str) for i in intents):
        raise ApiError(400, "intents must be a list of intent names")
    declared = sorted(config.intents)
    unknown = [i for i in intents if i not in config.intents]
    if unknown:
        raise ApiError(
            400,
            f"unknown intent {unknown[0][:64]!r}: the config declares {', '.join(declared)}",
            declared=declared,
        )
    return list(dict.fromkeys(intents))


def parse_bool(raw: str | None, name: str) -> bool:
    """A query flag: true/false/1/0/yes/no (absent: false)."""
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in ("1", "true", "yes", ""):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ApiError(400, f"?{name}= must be true or false (got {raw[:32]!r})")


_EPOCH_MS: Final = re.compile(r"-?[0-9]{1,19}")
"""ASCII digits only: `str.isdigit` and `int` also take "²" and full-width digits."""


def parse_at(raw: object, now_ms: int) -> int:
    """The read time: `?at=` (or a batch's `at`) epoch milliseconds or an ISO-8601 time (as
    `oracular query --at` and the inputs take), else now."""
    if raw is None:
        return now_ms
    if isinstance(raw, bool):
        raise ApiError(400, "at must be epoch milliseconds (an integer) or an ISO-8601 time")
    if isinstance(raw, int):
        at = raw
    elif isinstance(raw, str) and _EPOCH_MS.fullmatch(raw):
        at = int(raw)
    elif isinstance(raw, str) and raw[:1].isdigit():
        try:
            at = parse_time(raw, "at")
        except DecodeError:
            msg = f"at must be epoch milliseconds or an ISO-8601 time (got {raw[:32]!r})"
            raise ApiError(400, msg) from None
    else:
        msg = f"at must be epoch milliseconds or an ISO-8601 time (got {str(raw)[:32]!r})"
        raise ApiError(400, msg)
    if not MIN_TIME_MS <= at <= MAX_TIME_MS:
        msg = f"at must be epoch milliseconds from {MIN_TIME_MS} to {MAX_TIME_MS} (got {at})"
        raise ApiError(400, msg)
    return at


MAX_JSON_DEPTH: Final = 32
"""Deepest nesting of arrays and objects a request body may have (a batch needs 3)."""


_STRINGS: Final = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS: Final = re.compile(r"[^\[\]{}]+")


def parse_json(body: bytes) -> Any:
    """A request body as JSON: UTF-8, nested at most MAX_JSON_DEPTH deep, else 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not UTF-8 (byte {exc.start})") from exc
    depth = 0
    for char in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):  # json.loads recurses per level
        depth += 1 if char in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, f"the body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DecodeError as exc:  # a key twice: the input path refuses such messages too
        raise ApiError(400, f"the body is refused: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not JSON: {str(exc)[:200]}") from exc


def batch_body(at: int, counts: Mapping[str, int], results: list[Any]) -> dict[str, Any]:
    """The JSON answer of a `POST /v1/lookup`, its keys in this order (`batch_counts` reads
    its head)."""
    return {"at": at, "counts": counts, "results": results}


_ENCODE: Final = msgspec.json.Encoder().encode
_EXPONENT: Final = re.compile(rb"e[-0-9]")
_NUMBER_WITH_EXPONENT: Final = re.compile(rb"[:,\[]-?[0-9.]+e")
"""msgspec writes a float otherwise than `repr` in exponent form (msgspec `1e16`, `1e-7`; repr
`1e+16`, `1e-07`) or below 1e-4 in fixed form (msgspec `0.00001`, repr `1e-05`); its other
floats have repr's digits and form (shortest round trip: tests/streams/test_answer_json.py).
`_EXPONENT` is the quick look (a literal first: 8x faster than the exact pattern), which text
matches too (a config hash "…5e3…"); the exact pattern then decides. Text can match it too
(a user "a,1e"): then json.dumps, never a wrong byte."""


def answer_json(body: dict[str, Any]) -> bytes:
    """A lookup answer's JSON, the very bytes of `json.dumps(body, separators=(",", ":"),
    allow_nan=False)` (ASCII: non-ASCII text escaped as json does), by msgspec (4x faster on
    a batch of 100). For a dict of str keys, str, int, float, bool, None and lists: a body
    with another float form (see `_NUMBER_WITH_EXPONENT`), a lone surrogate or an unsupported type
    goes to json.dumps. It relies on answers holding no NaN or infinity (the engine's
    predictions of a decoded state are finite): msgspec writes those as null."""
    try:
        encoded = _ENCODE(body)
    except (TypeError, ValueError, msgspec.EncodeError):
        encoded = None
    if (
        encoded is None
        or b"0.0000" in encoded
        or (_EXPONENT.search(encoded) and _NUMBER_WITH_EXPONENT.search(encoded))
    ):
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    if not encoded.isascii() or b"\x7f" in encoded:  # in strings: json.dumps \u-escapes them
        encoded = _NOT_JSON_ASCII.sub(_escape, encoded.decode()).encode()
    return encoded


_NOT_JSON_ASCII: Final = re.compile(r"[^\x00-\x7e]")


def _escape(match: re.Match[str]) -> str:
    """json.dumps's ensure_ascii escape of one character (a surrogate pair above U+FFFF)."""
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}"


_DECODER: Final = json.JSONDecoder()


def batch_counts(payload: bytes, at: int, users: int) -> dict[str, int] | None:
    """The `counts` of another worker's batch answer for `users` users at `at`, read from its
    head only (`{"at":AT,"counts":{...},"results":[`, as `batch_body` is encoded), so a batch
    forwarded whole can be passed on without decoding and encoding its results again. None
    when the head is not that, or the counts do not add up to `users` (then the caller
    decodes the whole answer)."""
    head = b'{"at":%d,"counts":' % at
    if not payload.startswith(head):
        return None
    text = payload[len(head) : len(head) + 512].decode("utf-8", errors="replace")
    try:
        counts, end = _DECODER.raw_decode(text)
    except ValueError:
        return None
    if (
        not isinstance(counts, dict)
        or not all(type(v) is int and v >= 0 for v in counts.values())
        or sum(counts.values()) != users
        or not text.startswith(',"results":[', end)
    ):
        return None
    return counts


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One user of a `POST /v1/lookup`."""

    user: str
    intents: list[str] | None


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """A validated `POST /v1/lookup` body."""

    items: list[BatchItem]
    at: int | None
    explain: bool
    stale: bool

    def to_json(self, items: Iterable[BatchItem], at: int) -> dict[str, Any]:
        """The body forwarded to another worker for `items` (same time, same flags)."""
        return {
            "users": [{"user": i.user, "intents": i.intents} for i in items],
            "at": at,
            "explain": self.explain,
            "stale": self.stale,
        }


def parse_batch(body: bytes, config: EngineConfig, max_bytes: int = MAX_BODY_BYTES) -> BatchRequest:
    """Validate a batch body: `{"users": ["u1", {"user": "u2", "intents": [...]}], "at"?,
    "explain"?, "stale"?}`, at most MAX_BATCH users."""
    if len(body) > max_bytes:
        raise ApiError(413, f"the body is {len(body)} bytes; the limit is {max_bytes}")
    typed = _typed_batch(body, config)
    return typed if typed is not None else _parsed_batch(body, config)


class _TypedItem(msgspec.Struct, forbid_unknown_fields=True):
    user: str
    intents: list[str] | None = None


class _TypedBatch(msgspec.Struct, forbid_unknown_fields=True):
    users: list[str | _TypedItem]
    at: int | None = None
    explain: bool = False
    stale: bool = False


_BATCH: Final = msgspec.json.Decoder(_TypedBatch)


def _typed_batch(body: bytes, config: EngineConfig) -> BatchRequest | None:
    """The batch of a well-formed body, read by a typed msgspec decode (2-2.5x faster than
    `json.loads` and the checks of a dict), else None: then `_parsed_batch` decides, so every
    refusal keeps its own status and message (tests/streams/test_batch_parse.py compares the
    two on mutated bodies).

    Only a body `_parsed_batch` accepts the same way gets through: msgspec takes the last of
    duplicate keys as json does, refuses a lone surrogate, bad UTF-8, a float or a bool for
    an int and a number for a bool, and the schema nests 4 deep at most (so the depth limit
    holds); the rest (a batch's size, each user and intent, `at`'s range) is checked here
    with the same functions, any refusal sending the body to the full path."""
    try:
        typed = _BATCH.decode(body)
    except (msgspec.DecodeError, ValueError):  # ValueError: bad UTF-8
        return None
    if not _keys_once(body, typed):
        return None
    if not typed.users or len(typed.users) > MAX_BATCH:
        return None
    try:
        items = [_typed_item(entry, config) for entry in typed.users]
        at = None if typed.at is None else parse_at(typed.at, 0)
    except ApiError:
        return None
    return BatchRequest(items, at, typed.explain, typed.stale)


def _keys_once(body: bytes, typed: _TypedBatch) -> bool:
    """True when no object of `body` can have named a key twice (msgspec keeps the last copy;
    `parse_json` refuses the body): each key's quoted name occurs no more often than the
    decoded batch accounts for. An escape anywhere, or a name that also occurs as a value,
    sends the body to the full path, which decides exactly."""
    if b"\\" in body:
        return False
    objects = [item for item in typed.users if isinstance(item, _TypedItem)]
    return (
        body.count(b'"users"') == 1
        and body.count(b'"at"') <= 1
        and body.count(b'"explain"') <= 1
        and body.count(b'"stale"') <= 1
        and body.count(b'"user"') == len(objects)
        and body.count(b'"intents"') == sum(item.intents is not None for item in objects)
    )


def _typed_item(entry: str | _TypedItem, config: EngineConfig) -> BatchItem:
    if isinstance(entry, str):
        return BatchItem(check_user(entry), None)
    return BatchItem(check_user(entry.user), check_intents(config, entry.intents))


def _parsed_batch(body: bytes, config: EngineConfig) -> BatchRequest:
    """`parse_batch` by `json.loads`: any body, each refusal with its status and message."""
    obj = parse_json(body)
    if not isinstance(obj, dict):
        raise ApiError(400, 'the body must be a JSON object: {"users": [...]}')
    unknown = sorted(set(obj) - {"users", "at", "explain", "stale"})
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0][:64]!r}: use users, at, explain, stale")
    users = obj.get("users")
    if not isinstance(users, list) or not users:
        raise ApiError(400, "users must be a non-empty list of user ids or {user, intents}")
    if len(users) > MAX_BATCH:
        raise ApiError(413, f"{len(users)} users; one lookup takes at most {MAX_BATCH}")
    items = [_batch_item(n, entry, config) for n, entry in enumerate(users)]
    at = obj.get("at")
    for flag in ("explain", "stale"):
        if not isinstance(obj.get(flag, False), bool):
            raise ApiError(400, f"{flag} must be true or false")
    return BatchRequest(
        items,
        None if at is None else parse_at(at, 0),
        bool(obj.get("explain", False)),
        bool(obj.get("stale", False)),
    )


def _batch_item(n: int, entry: object, config: EngineConfig) -> BatchItem:
    """`users[n]`: a user id, or `{"user": ..., "intents": [...]}`."""
    if isinstance(entry, dict):
        extra = sorted(set(entry) - {"user", "intents"})
        if extra:
            raise ApiError(400, f"users[{n}]: unknown field {str(extra[0])[:64]!r}")
        user, intents = entry.get("user"), entry.get("intents")
    else:
        user, intents = entry, None
    try:
        return BatchItem(check_user(user), check_intents(config, intents))
    except ApiError as exc:
        raise ApiError(exc.status, f"users[{n}]: {exc.message}", **exc.extra) from exc


def parse_reveal(
    body: bytes, config: EngineConfig, now_ms: int, max_skew_ms: int = 60_000
) -> tuple[str, int]:
    """(intent, ts) of a `POST /v1/users/{user}/revealed` body `{"intent": ..., "ts"?}`: one
    declared intent; `ts` no further ahead of `now_ms` than `max_skew_ms` (a reveal dated in
    the future would move the user's state there for good)."""
    if len(body) > 4096:
        raise ApiError(413, f"the body is {len(body)} bytes; the limit is 4096")
    obj = parse_json(body or b"null")
    if not isinstance(obj, dict) or "intent" not in obj:
        raise ApiError(400, 'the body must be {"intent": "<declared intent>"} (ts optional)')
    unknown = sorted(set(obj) - {"intent", "ts"})
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0][:64]!r}: use intent and ts")
    intents = check_intents(config, obj["intent"])
    if not isinstance(obj["intent"], str) or not intents:
        raise ApiError(400, "intent must be one declared intent name")
    ts = parse_at(obj.get("ts"), now_ms)
    if ts > now_ms + max_skew_ms:
        msg = (
            f"ts {ts} is {ts - now_ms} ms ahead of this worker's clock; a reveal may be at most "
            f"ORACULAR_MAX_SKEW_MS ({max_skew_ms} ms) ahead"
        )
        raise ApiError(400, msg, max_skew_ms=max_skew_ms)
    return intents[0], ts


def parse_erase(body: bytes) -> str | None:
    """The reason of a `DELETE /v1/users/{user}` body: empty, or `{"reason": "..."}`."""
    if not body.strip():
        return None
    if len(body) > 4096:
        raise ApiError(413, f"the body is {len(body)} bytes; the limit is 4096")
    obj = parse_json(body)
    if not isinstance(obj, dict):
        raise ApiError(400, 'the body must be empty or {"reason": "<why>"}')
    unknown = sorted(set(obj) - {"reason"})
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0][:64]!r}: use reason")
    reason = obj.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 1024):
        raise ApiError(400, "reason must be a string of at most 1024 characters")
    return reason or None


# --- routing ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What this worker knows about one partition at the moment of a lookup."""

    local: Role | None
    """This worker holds it as the active owner or a standby (its RocksDB is open), or not."""
    settling: bool
    """A rebalance or table recovery is under way here (the active copy may be moving)."""
    owner: str | None
    """URL of the owning worker in the current assignment (None: unknown/unassigned)."""
    me: str
    """This worker's URL."""


@dataclass(frozen=True, slots=True)
class Route:
    """What to do with a lookup: answer locally (as `role`), forward to `url`, or refuse."""

    action: Literal["local", "forward", "unavailable"]
    role: Role | None = None
    url: str | None = None
    reason: str = ""


def route(partition: int, view: PartitionView, *, stale: bool, forwarded: bool) -> Route:
    """Decide how a lookup for `partition` is served on this worker.

    The owner answers from its active copy once it is not rebalancing or restoring. A
    non-owner forwards one hop to the owner; a forwarded request is never forwarded again
    (the loop guard). With `stale`, a standby copy here answers without a hop.
    """
    if view.local == "active" and not view.settling:
        return Route("local", role="active")
    if stale and view.local is not None:
        return Route("local", role=view.local)
    reason = ""
    if view.local == "active" or view.owner == view.me:
        reason = f"partition {partition} is being rebalanced or restored here"
    elif forwarded:
        reason = (
            f"partition {partition} is not owned here (forwarded by a worker whose routing "
            "is out of date: a rebalance is under way)"
        )
    elif view.owner is None:
        reason = f"partition {partition} has no owner right now (rebalancing)"
    if reason:
        return Route("unavailable", reason=reason)
    return Route("forward", url=view.owner)


# --- answers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserRead:
    """One user read from the local table copy (or the prior, if unknown): the whole state,
    or only what predictions read of it (a `Reading`: enough for an answer without
    `explain`)."""

    state: EngineState | Reading
    known: bool
    partition: int
    last_offset: int | None


def read_user(
    raw: bytes | None, config: EngineConfig, partition: int, *, full: bool = False
) -> UserRead:
    """Decode one user's stored bytes (None: an unknown user, whose state is the prior): what
    predictions read of it (`decode_reading`, a third of a whole state's time), or with `full`
    its whole state (what `explain` needs)."""
    if raw is None:
        return UserRead(create_state(config), False, partition, None)
    if full:
        stored = decode_stored(raw, config)
        return UserRead(stored.state, True, stored.partition, stored.last_offset)
    state, stored_partition, last_offset = decode_reading(raw, config)
    return UserRead(state, True, stored_partition, last_offset)


def answer(
    read: UserRead,
    user: str,
    *,
    intents: Sequence[str] | None,
    at: int,
    with_explain: bool,
    served_by: Mapping[str, Any],
    config_id: str,
    app_id: str | None = None,
    with_status: bool = False,
) -> dict[str, Any]:
    """The JSON answer for one user: predictions at `at`, where they came from (the app id,
    the config's hash, the worker); first, with `with_status`, a batch result's status."""
    state = read.state
    names = list(state.config.intents) if intents is None else intents
    at = clamp_time(state, at)  # time never runs backwards in a state
    out: dict[str, Any] = {}
    # Only the intents asked are predicted, from the state as it is: bringing it to `at`
    # (closing a timed-out episode) changes nothing a prediction reads (`predict_read`), and
    # was a third of a cold lookup's CPU.
    for name, prediction in predict_read(state, at, names).items():
        item: dict[str, Any] = {
            "p": prediction.p,
            "lower": prediction.lower,
            "reveal": prediction.reveal,
            "suppressed_until": prediction.suppressed_until,
        }
        if with_explain:
            if not isinstance(state, EngineState):  # a caller's mistake, not a client's
                msg = "an answer with explain needs the whole state (read_user(full=True))"
                raise TypeError(msg)
            item["explain"] = explanation(state, name, at)
        out[name] = item
    # Built in place, in the answer's key order (not `{"status": ..., **answer}` afterwards:
    # a batch of 100 built its results twice).
    body: dict[str, Any] = {"status": "found" if read.known else "unknown"} if with_status else {}
    body["user"] = user
    body["known"] = read.known
    body["at"] = at
    body["as_of"] = state.clock
    body["position"] = {"partition": read.partition, "offset": read.last_offset}
    body["served_by"] = dict(served_by)
    if app_id is not None:
        body["app"] = app_id
    body["config"] = config_id
    body["intents"] = out
    return body


def explanation(state: EngineState, intent: str, at: int) -> dict[str, Any]:
    """`engine.explain` as JSON: base-rate counts and per signal its weights and counts."""
    found = explain(state, intent, at)
    return {
        "p": found.p,
        "alpha": found.alpha,
        "beta": found.beta,
        "episodes": {"hits": found.episodes.hits, "misses": found.episodes.misses},
        "signals": {
            name: {
                "initial": s.initial,
                "learned": s.learned,
                "effective": s.effective,
                "hits": s.hits,
                "misses": s.misses,
                "seen": s.seen,
                "contribution": s.contribution,
                "impact": s.impact,
            }
            for name, s in found.signals.items()
        },
    }


# --- forwards -----------------------------------------------------------------------------


class PeerAnswerError(ValueError):
    """Another worker's answer is not what was asked for (the message says how)."""


def check_peer_answer(payload: bytes, user: str, partition: int) -> dict[str, Any]:
    """Another worker's 200 answer for `user`: a JSON lookup answer for that user on that
    partition, else PeerAnswerError."""
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        msg = "not JSON"
        raise PeerAnswerError(msg) from exc
    if not isinstance(body, dict) or not isinstance(body.get("intents"), dict):
        msg = "not a lookup answer (no intents)"
        raise PeerAnswerError(msg)
    if body.get("user") != user:
        msg = f"an answer for another user ({str(body.get('user'))[:64]!r})"
        raise PeerAnswerError(msg)
    position = body.get("position")
    if not isinstance(position, dict) or position.get("partition") != partition:
        msg = f"an answer from another partition than {partition}"
        raise PeerAnswerError(msg)
    return body


class _PeerResult(msgspec.Struct):
    user: str  # the one field read; the others are skipped (their JSON syntax still checked)


class _PeerBatch(msgspec.Struct):
    results: list[_PeerResult]


_PEER_BATCH: Final = msgspec.json.Decoder(_PeerBatch)


def is_peer_batch_for(payload: bytes, users: Sequence[str]) -> bool:
    """True when another worker's batch answer is certainly one `check_peer_batch` accepts for
    `users`: JSON, its results one object per user, in order, each with that `user` (read by
    msgspec, 3x faster than json.loads, without building the results). False: not sure (not
    ASCII, as every answer `answer_json` writes is, or anything msgspec refuses that json may
    take, such as NaN): then `check_peer_batch` decides. Duplicate keys: the last, as json."""
    if not payload.isascii():
        return False
    try:
        results = _PEER_BATCH.decode(payload).results
    except (msgspec.DecodeError, RecursionError):
        return False
    return len(results) == len(users) and all(
        result.user == user for result, user in zip(results, users, strict=True)
    )


def check_peer_batch(payload: bytes, users: Sequence[str]) -> list[dict[str, Any]]:
    """Another worker's 200 batch answer for `users`, in order: its results, else
    PeerAnswerError."""
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        msg = "not JSON"
        raise PeerAnswerError(msg) from exc
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list) or len(results) != len(users):
        msg = f"not a batch answer for {len(users)} users"
        raise PeerAnswerError(msg)
    for n, (result, user) in enumerate(zip(results, users, strict=True)):
        if not isinstance(result, dict) or result.get("user") != user:
            msg = f"results[{n}] is not an answer for user {user[:64]!r}"
            raise PeerAnswerError(msg)
    return results
