"""A deterministic synthetic clickstream for benchmarks: users, sessions, signals, outcomes."""

from __future__ import annotations

import random
from collections.abc import Iterator

from engine import EngineConfig, Event

MINUTE = 60_000
START = 1_767_261_600_000

FILLER = ("page.viewed", "button.clicked", "search.performed", "dashboard.viewed")


def event_names(config: EngineConfig) -> tuple[list[str], list[str]]:
    """(signal names, outcome names) declared in `config`, in a stable order."""
    signals = sorted({s for intent in config.intents.values() for s in intent.signals})
    outcomes = sorted({i.outcome for i in config.intents.values() if i.outcome})
    return signals, outcomes


def clickstream(config: EngineConfig, events: int, users: int, seed: int = 7) -> list[Event]:
    """`events` events over `users` users, interleaved in time order, per-user time sorted.

    About half the events are filler page views, 40% signals, 2% outcomes, 3% sign-outs, and
    one gap in ten is longer than a 30-minute timeout.
    """
    rng = random.Random(seed)
    signals, outcomes = event_names(config)
    clocks = [START + rng.randrange(0, 10 * MINUTE) for _ in range(users)]
    out: list[Event] = []
    for i in range(events):
        user = rng.randrange(users)
        gap = (
            rng.randrange(40 * MINUTE, 6 * 60 * MINUTE)
            if rng.random() < 0.1
            else rng.randrange(1_000, 5 * MINUTE)
        )
        clocks[user] += gap
        roll = rng.random()
        at = clocks[user]
        uid = f"user-{user:05d}"
        if roll < 0.03:
            out.append(Event(uid, at, type="end", id=f"e{i}"))
        elif roll < 0.05:
            out.append(Event(uid, at, name=rng.choice(outcomes), id=f"e{i}"))
        elif roll < 0.45:
            out.append(Event(uid, at, name=rng.choice(signals), id=f"e{i}"))
        else:
            out.append(Event(uid, at, name=rng.choice(FILLER), id=f"e{i}"))
    out.sort(key=lambda event: event.at)  # stable: each user's events stay in their order
    return out


def sessions_for(config: EngineConfig, user: str, episodes: int, seed: int = 3) -> Iterator[Event]:
    """`episodes` sign-out-terminated sessions of one user, a day apart."""
    rng = random.Random(seed)
    signals, outcomes = event_names(config)
    at = START
    for n in range(episodes):
        for _ in range(rng.randrange(2, 8)):
            at += rng.randrange(1_000, 3 * MINUTE)
            yield Event(user, at, name=rng.choice(signals + list(FILLER)), id=f"{user}-{n}")
        if rng.random() < 0.15:
            yield Event(user, at + 1_000, name=rng.choice(outcomes))
        yield Event(user, at + 2_000, type="end")
        at += 24 * 60 * MINUTE


def closing_marks(at: int, partitions: int) -> list[Event]:
    """One page view per partition, by a user whose id hashes there (murmur2), at time `at`.

    Appended a day after a generated stream, they move every partition's watermark past the
    stream's deadlines by event time, as later traffic would: a worker then closes exactly
    what `replay(..., until=at − lateness)` closes, without waiting on the wall clock.
    """
    from aiokafka.partitioner import DefaultPartitioner  # noqa: PLC0415 - not for the engine

    partitioner = DefaultPartitioner()
    every = list(range(partitions))
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        user = f"sentinel-{n}"
        found.setdefault(int(partitioner(user.encode(), every, every)), user)
        n += 1
    return [Event(found[p], at, name="page.viewed", id=f"sentinel-{p}") for p in range(partitions)]
