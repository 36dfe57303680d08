"""Building sessions through the public API, for the pinned-number tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine import EngineConfig, EngineState, create_state, end_episode, observe

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WEEK = 7 * DAY

MONDAY_10 = 1_767_607_200_000
"""Monday 2026-01-05 10:00:00 UTC in epoch ms."""

QUICKSTART: Mapping[str, Any] = {
    "signals": {"pricing.viewed": 3, "limit.hit": 2},
    "outcome": "upgrade.completed",
    "halfLife": "7d",
}


def config(intents: Mapping[str, Any], **top: Any) -> EngineConfig:
    """An EngineConfig from the users' camelCase form."""
    return EngineConfig.from_dict({"intents": dict(intents), **top})


def session(
    state: EngineState, start: int, events: Iterable[str], *, gap: int = MINUTE, end: bool = True
) -> EngineState:
    """Observe `events` a `gap` apart from `start`, then sign out one gap after the last."""
    at = start
    for name in events:
        state = observe(state, name, at)
        at += gap
    return end_episode(state, at) if end else state


def sessions(
    cfg: EngineConfig, plan: Iterable[tuple[int, Iterable[str]]], start: int = MONDAY_10
) -> EngineState:
    """Run `count` sessions of `events` for each (count, events) in `plan`, an hour apart."""
    state = create_state(cfg)
    at = start
    for count, events in plan:
        for _ in range(count):
            state = session(state, at, events)
            at += HOUR
    return state
