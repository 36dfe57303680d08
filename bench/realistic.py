"""A realistic clickstream for benchmarks: Segment-shaped JSON with a real product's density.

`bench/synthetic.py` is dense in signals but thin in everything else: small native msgpack
events, sessions cut by sign-outs. A product's stream, as its Segment producers send it, is
different where the offline path spends its time (issue 34):

- JSON messages in the Segment shape (`track` and `page` calls, an `identify` per user):
  `userId`, `anonymousId`, `messageId`, ISO-8601 `timestamp` and `sentAt`, `properties` and a
  `context` (library, page, user agent, locale), 500-900 bytes each;
- about half the events change a prediction (a signal or an outcome of an intent; the rest
  are page views and other clicks);
- sessions of 5 to 30 events, seconds to minutes apart, hours to days between sessions, so
  sessions close by the idle timeout (no sign-out events);
- the intents and signals of a config (`bench/realistic.yaml`: 3 intents of 12, 8 and 6
  signals); any config with 1-3 intents of 5-15 signals works.

Everything comes from one `random.Random(seed)`: a seed gives the same bytes every time
(tests/bench/test_realistic.py holds the generator to these properties).
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from engine import EngineConfig

CONFIG: Final = Path(__file__).with_name("realistic.yaml")
START: Final = 1_767_603_600_000  # 2026-01-05T09:00:00Z
SECOND: Final = 1_000
MINUTE: Final = 60 * SECOND
HOUR: Final = 60 * MINUTE
DAY: Final = 24 * HOUR

SESSION_EVENTS: Final = (5, 30)
"""Events per session, both ends included."""
SIGNAL_SHARE: Final = 0.5
"""Chance that an event in a session is a signal of an intent (the others are filler, and
an outcome now and then): with outcomes this makes about half the events change a prediction."""
OUTCOME_CHANCE: Final = 0.06
"""Chance that a session leaning to an intent ends with that intent's outcome."""
IDENTIFY_SHARE: Final = 0.01
"""Identify calls among the messages (ignored by the worker, as Segment's are)."""

PAGES: Final = (
    ("Dashboard", "/dashboard"),
    ("Projects", "/projects"),
    ("Settings", "/settings"),
    ("Reports", "/reports"),
    ("Docs", "/docs/getting-started"),
    ("Search", "/search"),
)
TRACK_FILLER: Final = (
    "Button Clicked",
    "Search Performed",
    "Project Opened",
    "Filter Applied",
    "Notification Opened",
    "Comment Added",
)
AGENTS: Final = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
)
LOCALES: Final = ("en-US", "en-GB", "de-DE", "fr-FR", "ja-JP", "pt-BR")
PLANS: Final = ("free", "team", "business")


@dataclass(frozen=True, slots=True)
class RealisticStream:
    """The generated stream: the messages' bytes in time order, and how it was built."""

    messages: list[bytes]
    """JSON Segment messages, one per line of a file (no newline), in time order."""
    users: int
    sessions: list[int]
    """Each session's event count (identify calls not included)."""
    seed: int


def realistic_stream(
    config: EngineConfig, events: int, users: int, seed: int = 11
) -> RealisticStream:
    """About `events` events (whole sessions: a few more) of `users` users, in time order.

    Each user has an `identify` at its first message and sessions spread over about four
    weeks; each session leans to one intent (or none), whose signals then make most of its
    signal events.
    """
    rng = random.Random(seed)
    words = _Words.of(config)
    people = [_person(rng, n) for n in range(users)]
    clocks = [START + rng.randrange(0, 3 * DAY) for _ in range(users)]
    timed: list[tuple[int, int, bytes]] = []  # (time, order, message): a stable time sort
    sessions: list[int] = []

    def add(at: int, message: dict[str, Any]) -> None:
        timed.append((at, len(timed), _json(message)))

    for n, person in enumerate(people):  # every user gets an identify and a first session
        add(clocks[n], _identify(rng, person, clocks[n]))
    total = 0
    first = list(range(users))
    while total < events:
        user = first.pop() if first else rng.randrange(users)
        session, at = _session(rng, words, people[user], clocks[user])
        for when, message in session:
            add(when, message)
        length = sum(message["type"] != "identify" for _, message in session)
        sessions.append(length)
        total += length
        clocks[user] = at + rng.randrange(2 * HOUR, 4 * DAY)
    timed.sort()
    return RealisticStream([raw for _, _, raw in timed], users, sessions, seed)


def realistic_messages(config: EngineConfig, users: int, seed: int = 11) -> Iterator[bytes]:
    """The same kind of stream without an end, made as it is read (`make soak` produces an
    hour of it): messages in time order, memory bounded by the sessions open at a time.

    Each user's next session starts 2 h to 4 days after its last one ends (its first within
    three days of START, after an `identify`). Sessions are made in the order they start;
    a message is let out once the next session to be made starts after it, so nothing made
    later can come before it.
    """
    rng = random.Random(seed)
    words = _Words.of(config)
    people = [_person(rng, n) for n in range(users)]
    starts = [(START + rng.randrange(0, 3 * DAY), n) for n in range(users)]
    heapq.heapify(starts)
    met: set[int] = set()
    waiting: list[tuple[int, int, bytes]] = []  # (time, order, message): a stable time order
    made = 0

    def add(at: int, message: dict[str, Any]) -> None:
        nonlocal made
        heapq.heappush(waiting, (at, made, _json(message)))
        made += 1

    while True:
        start, user = heapq.heappop(starts)
        person = people[user]
        if user not in met:
            met.add(user)
            add(start, _identify(rng, person, start))
        session, end = _session(rng, words, person, start)
        for when, message in session:
            add(when, message)
        heapq.heappush(starts, (end + rng.randrange(2 * HOUR, 4 * DAY), user))
        horizon = starts[0][0]
        while waiting and waiting[0][0] <= horizon:
            yield heapq.heappop(waiting)[2]


@dataclass(frozen=True, slots=True)
class _Words:
    """A config's names the generator draws from."""

    intents: list[str]
    signals: dict[str, list[str]]
    every_signal: list[str]
    outcomes: dict[str, str | None]

    @classmethod
    def of(cls, config: EngineConfig) -> _Words:
        intents = sorted(config.intents)
        signals = {name: sorted(config.intents[name].signals) for name in intents}
        return cls(
            intents,
            signals,
            sorted({s for names in signals.values() for s in names}),
            {name: config.intents[name].outcome for name in intents},
        )


def _session(
    rng: random.Random, words: _Words, person: _Person, at: int
) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """One session of `person` after `at`: its (time, message)s (an identify now and then
    among them) and its last event's time. It leans to one intent (or none)."""
    length = rng.randint(*SESSION_EVENTS)
    lean = rng.choice([*words.intents, None])
    out: list[tuple[int, dict[str, Any]]] = []
    for i in range(length):
        at += rng.randrange(2 * SECOND, 3 * MINUTE)
        if i == length - 1 and lean is not None and rng.random() < OUTCOME_CHANCE:
            name = words.outcomes[lean]
        else:
            name = None
        if name is None and rng.random() < SIGNAL_SHARE:
            pool = (
                words.signals[lean]
                if lean is not None and rng.random() < 0.8
                else words.every_signal
            )
            name = rng.choice(pool)
        message = _filler(rng, person, at) if name is None else _track(rng, person, name, at)
        if rng.random() < IDENTIFY_SHARE:
            out.append((at, _identify(rng, person, at)))
        out.append((at, message))
    return out, at


def _json(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class _Person:
    user_id: str
    anonymous_id: str
    agent: str
    locale: str
    plan: str


def _person(rng: random.Random, n: int) -> _Person:
    hexes = f"{rng.getrandbits(128):032x}"
    anonymous = f"{hexes[:8]}-{hexes[8:12]}-4{hexes[13:16]}-a{hexes[17:20]}-{hexes[20:]}"
    return _Person(
        f"usr_{n:05d}{rng.getrandbits(24):06x}",
        anonymous,
        rng.choice(AGENTS),
        rng.choice(LOCALES),
        rng.choice(PLANS),
    )


def iso_time(ms: int) -> str:
    """Epoch ms as analytics.js writes times: ISO 8601 UTC, milliseconds, a Z."""
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _common(rng: random.Random, person: _Person, at: int, path: str) -> dict[str, Any]:
    """The fields every analytics.js call carries."""
    return {
        "userId": person.user_id,
        "anonymousId": person.anonymous_id,
        "messageId": f"ajs-next-{rng.getrandbits(96):024x}",
        "timestamp": iso_time(at),
        "sentAt": iso_time(at + rng.randrange(5, 900)),
        "context": {
            "library": {"name": "analytics.js", "version": "next-1.72.0"},
            "page": {
                "path": path,
                "url": f"https://app.example.com{path}",
                "referrer": "https://app.example.com/dashboard",
                "title": "Example App",
            },
            "userAgent": person.agent,
            "locale": person.locale,
            "timezone": "Europe/Berlin",
        },
        "integrations": {},
    }


def _track(rng: random.Random, person: _Person, name: str, at: int) -> dict[str, Any]:
    path = "/" + name.lower().split()[0]
    message = {"type": "track", "event": name, **_common(rng, person, at, path)}
    message["properties"] = {
        "plan": person.plan,
        "source": rng.choice(("web", "web", "email", "in-app")),
        "value": round(rng.random() * 100, 2),
    }
    return message


def _filler(rng: random.Random, person: _Person, at: int) -> dict[str, Any]:
    if rng.random() < 0.6:
        title, path = rng.choice(PAGES)
        message = {"type": "page", "name": title, **_common(rng, person, at, path)}
        message["properties"] = {"title": title, "path": path, "search": ""}
        return message
    return _track(rng, person, rng.choice(TRACK_FILLER), at)


def _identify(rng: random.Random, person: _Person, at: int) -> dict[str, Any]:
    message = {"type": "identify", **_common(rng, person, at, "/settings")}
    message["traits"] = {"plan": person.plan, "locale": person.locale}
    return message
