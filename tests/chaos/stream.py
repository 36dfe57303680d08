"""The chaos stream: good events paced at real time, with malformed messages and producer
retries mixed in.

Every message is generated from the seed, with times relative to the stream's start; `place`
pins them to the wall clock when production begins. Good events stay inside the product's
live == replay contract: each message's Kafka record timestamp is its event time, the stream is
globally time-ordered (so every partition is), and it is produced at real time (an event is sent
when the wall clock reaches its time), so no input is older than the worker's clock allows.

Producers deliver at least once: a share of the good events is sent again with the same id
(`RETRIED`), half right after the original and half a few seconds later, as an SDK retrying a
batch or a relay restarted from an older position does. Each retry must be skipped
(`duplicate_id`): applied once, never dead-lettered. A retry carries one extra field the worker
ignores (`attempt`), which keeps it labelled apart from its original.

Every message's bytes are unique, so the read-back input topic can be labelled by generation
alone (`Message.label`), never by the product's own decoder.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

import msgpack

from bench.synthetic import FILLER, event_names
from engine import EngineConfig, Event
from schemas.events import encode_event

BAD_KINDS = (
    "invalid_json",  # a JSON object cut short
    "wrong_key",  # a valid event keyed by another user
    "missing_user",  # no "user" field
    "deep_json",  # JSON nested 20,000 levels (under the byte limit)
    "deep_msgpack",  # msgpack arrays nested 20,000 levels
    "oversized",  # a message over the 64 KiB limit
    "long_user",  # a 600-character user id (over the 512-character limit)
    "bad_ts",  # "ts" that is neither epoch ms nor ISO-8601
    "far_future",  # a well-formed event dated 2036: a device clock years ahead
)
"""The malformed messages the suite mixes in; each must reach the dead-letter topic."""

SESSION_GAP_MS = (100, 2_000)  # between events of one session: well under the 4 s timeout
IDLE_GAP_MS = (4_500, 40_000)  # between sessions: over the timeout, so the timer closes them
SESSION_EVENTS = (2, 8)
SIGN_OUT = 0.3  # a session ends with an `end` command this often
REVEALED = 0.08  # filler events that are `revealed` commands instead
JSON_SHARE = 0.1  # good events sent as JSON rather than msgpack
RETRIED = 0.03  # good events a producer sends a second time, with the same id
RETRY_LATER_MS = (1_000, 15_000)  # how much later a "later" retry is sent
YEAR_2036_MS = 2_082_758_400_000


@dataclass(frozen=True, slots=True)
class Message:
    """One input message: good (`event` set) or malformed (`bad` names the kind)."""

    at: int
    """Event time and record timestamp, ms (relative until `place`)."""
    key: bytes
    value: bytes
    event: Event | None = None
    bad: str | None = None
    retry: str | None = None
    """For a producer's retry of a good event: "once" (sent right after it) or "later"."""

    @property
    def label(self) -> str:
        """The event id (`retry:<id>` for a retry), or `bad:<kind>`."""
        if self.event is not None:
            assert self.event.id is not None
            return self.event.id if self.retry is None else f"retry:{self.event.id}"
        return f"bad:{self.bad}"


def user_name(n: int) -> str:
    return f"cu-{n:05d}"


def generate(
    config: EngineConfig, *, events: int, duration_ms: int, bad_share: float, seed: int
) -> list[Message]:
    """`events` good events over about `duration_ms`, plus `bad_share` of malformed messages.

    Users have sessions (short gaps) separated by idle gaps longer than the episode timeout.
    There are as many users as make `events` fill the duration (thousands for 50,000 events).
    Times start at 0: call `place` before producing.
    """
    rng = random.Random(seed)
    signals, outcomes = event_names(config)
    intents = sorted(config.intents)
    per_user = duration_ms / _mean_cycle_ms() * _mean_session()
    users = max(10, math.ceil(events / per_user * 1.15))
    timeline: list[tuple[int, int, str, str | None]] = []  # (at, user, type, name or intent)
    for user in range(users):
        at = rng.randrange(0, IDLE_GAP_MS[1])
        while at < duration_ms:
            for _ in range(rng.randint(*SESSION_EVENTS)):
                timeline.append((at, user, *_pick(rng, signals, outcomes, intents)))
                at += rng.randint(*SESSION_GAP_MS)
            if rng.random() < SIGN_OUT:
                timeline.append((at, user, "end", None))
            at += rng.randint(*IDLE_GAP_MS)
    timeline.sort(key=lambda item: item[0])  # stable: each user's events keep their order
    timeline = [item for item in timeline if item[0] < duration_ms][:events]
    good = [_good(n, item, rng) for n, item in enumerate(timeline)]
    bad = [_bad(rng, kind, good, n) for n, kind in enumerate(_bad_kinds(rng, events, bad_share))]
    retries = [_retry(m, rng) for m in good if rng.random() < RETRIED]
    # Stable: a retry sent "once" (at its original's time) stays after the original.
    return sorted(good + bad + retries, key=lambda m: m.at)


def place(messages: list[Message], start_ms: int) -> list[Message]:
    """The stream with every time moved to `start_ms` + its relative time (bytes re-encoded)."""
    placed = []
    for m in messages:
        at = m.at + start_ms
        if m.event is not None:
            e = m.event
            event_at = e.at + start_ms  # a later retry keeps its original's event time
            event = Event(e.user, event_at, name=e.name, type=e.type, intent=e.intent, id=e.id)
            as_json = m.value[:1] == b"{"
            extra = {} if m.retry is None else {"attempt": 2}
            value = encode_event(event, as_json=as_json, **extra)
            placed.append(Message(at, m.key, value, event=event, retry=m.retry))
        else:
            placed.append(Message(at, m.key, _rebase(m.value, at), bad=m.bad))
    return placed


def sentinels(partitions: int, at: int, partition_of: object) -> list[Message]:
    """One good event per partition at `at`, by users whose ids hash there (`partition_of`)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        user = f"sentinel-{n}"
        found.setdefault(partition_of(user.encode(), partitions), user)  # type: ignore[operator]
        n += 1
    out = []
    for p in range(partitions):
        event = Event(found[p], at, name="page.viewed", id=f"sentinel-{p}")
        out.append(Message(at, event.user.encode(), encode_event(event), event=event))
    return out


# --- good events ------------------------------------------------------------------------------


def _pick(
    rng: random.Random, signals: list[str], outcomes: list[str], intents: list[str]
) -> tuple[str, str]:
    roll = rng.random()
    if roll < 0.03:
        return "event", rng.choice(outcomes)
    if roll < 0.45:
        return "event", rng.choice(signals)
    if rng.random() < REVEALED:
        return "revealed", rng.choice(intents)
    return "event", rng.choice(FILLER)


def _good(n: int, item: tuple[int, int, str, str | None], rng: random.Random) -> Message:
    at, user, kind, what = item
    uid = user_name(user)
    if kind == "event":
        event = Event(uid, at, name=what, id=f"c{n}")
    elif kind == "revealed":
        event = Event(uid, at, type="revealed", intent=what, id=f"c{n}")
    else:
        event = Event(uid, at, type="end", id=f"c{n}")
    as_json = rng.random() < JSON_SHARE
    return Message(at, uid.encode(), encode_event(event, as_json=as_json), event=event)


def _retry(original: Message, rng: random.Random) -> Message:
    """The producer sending `original` again: right after it, or a few seconds later."""
    assert original.event is not None
    kind = "once" if rng.random() < 0.5 else "later"
    at = original.at if kind == "once" else original.at + rng.randint(*RETRY_LATER_MS)
    as_json = original.value[:1] == b"{"
    value = encode_event(original.event, as_json=as_json, attempt=2)
    return Message(at, original.key, value, event=original.event, retry=kind)


def _mean_session() -> float:
    return sum(SESSION_EVENTS) / 2


def _mean_cycle_ms() -> float:
    return _mean_session() * sum(SESSION_GAP_MS) / 2 + sum(IDLE_GAP_MS) / 2


# --- malformed messages -----------------------------------------------------------------------

_TS = "@TS@"  # where a malformed message's (relative) time goes; `place` rewrites it


def _bad_kinds(rng: random.Random, events: int, share: float) -> list[str]:
    """About `share` × events kinds, every kind at least once."""
    count = max(len(BAD_KINDS), round(events * share))
    kinds = list(BAD_KINDS) + [rng.choice(BAD_KINDS) for _ in range(count - len(BAD_KINDS))]
    rng.shuffle(kinds)
    return kinds


def _bad(rng: random.Random, kind: str, good: list[Message], n: int) -> Message:
    """A malformed message of `kind` at the time of a random good event, keyed by its user."""
    host = rng.choice(good)
    assert host.event is not None
    user, tag = host.event.user, f"bad{n}"
    body: dict[str, object] = {"id": tag, "user": user, "name": "page.viewed", "ts": _TS}
    key = user.encode()
    if kind == "invalid_json":
        value = json.dumps(body).encode()[:-7]
    elif kind == "wrong_key":
        other = rng.choice(good).event
        assert other is not None
        key = (other.user if other.user != user else user + "x").encode()
        value = json.dumps(body).encode()
    elif kind == "missing_user":
        del body["user"]
        value = json.dumps(body).encode()
    elif kind == "deep_json":
        value = json.dumps(body).encode()[:-1] + b',"deep":' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    elif kind == "deep_msgpack":
        value = b"\x91" * 20_000 + msgpack.packb(tag)
    elif kind == "oversized":
        value = json.dumps({**body, "pad": "x" * 70_000}).encode()
    elif kind == "long_user":
        long_user = f"{tag}-" + "u" * 600
        key = long_user.encode()
        value = json.dumps({**body, "user": long_user}).encode()
    elif kind == "far_future":
        value = json.dumps({**body, "ts": YEAR_2036_MS}).encode()
    else:  # bad_ts
        value = json.dumps({**body, "ts": f"yesterday-{_TS}"}).encode()
    return Message(host.at, key, value, bad=kind)


def _rebase(value: bytes, at: int) -> bytes:
    """Put the message's absolute time `at` where the relative-time marker is."""
    # The marker is quoted ("@TS@") where it stands for a number, bare inside a string.
    return value.replace(f'"{_TS}"'.encode(), str(at).encode()).replace(
        _TS.encode(), str(at).encode()
    )
