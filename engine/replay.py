"""Offline replay: a stream of user events through one engine state per user.

This is the reference the stream processor is held to: for the same events, the live pipeline
must publish the same predictions and closed episodes and store the same states. Both call
`apply_event` and `close_due`, so the decisions are made in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from engine.config import EngineConfig
from engine.episodes import (
    ClosedEpisode,
    clamp_time,
    close_if_due,
    close_timed_out,
    end_episode_transition,
    settle,
)
from engine.errors import InvalidEventError
from engine.observe import observe_settled
from engine.predict import Prediction, mark_revealed, predict_many, predict_settled
from engine.state import EngineState, create_state

EventType = Literal["event", "end", "revealed", "erase"]

END_OF_TIME: Final = (1 << 63) - 1
"""The default watermark at the end of a replay: every open episode with a timeout is due."""


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class Event:
    """One input: an analytics event, a sign-out (`end`) or a reveal (`revealed`); or an
    erasure (`erase`), which the stream processor applies and the engine refuses."""

    user: str
    at: int
    """Epoch milliseconds."""
    name: str | None = None
    """The event name; required for type "event"."""
    type: EventType = "event"
    intent: str | None = None
    """The intent shown, for type "revealed"."""
    id: str | None = None
    """The producer's event id, if any; output ids derive from it."""


@dataclass(slots=True)  # not frozen: built per event (see engine/state.py)
class Step:
    """What one event did to its user's state."""

    event: Event
    at: int
    """The time the event was applied at (its own, or the user's clock if it was late)."""
    state: EngineState
    """The user's state after the event."""
    predictions: Mapping[str, Prediction]
    """Intents whose prediction at `at` the event changed, with the new prediction."""
    closed: ClosedEpisode | None = None
    """The episode the event closed (a sign-out, or an idle gap before it)."""
    wiped: Mapping[str, Prediction] = field(default_factory=dict)
    """On an intent's own outcome: the estimate just before the reset wiped it."""

    @property
    def late(self) -> bool:
        """True when the event was older than the user's last event time."""
        return self.at != self.event.at


def apply_event(state: EngineState, event: Event) -> Step:
    """Apply one input to its user's state and say what changed.

    Raises:
        InvalidTimeError: `event.at` is not an int.
        UnknownIntentError: a `revealed` names an intent the config does not declare.
        InvalidEventError: an event without a name, or a revealed without an intent.
    """
    at = clamp_time(state, event.at)
    config = state.config
    if event.type == "end":
        transition = end_episode_transition(state, at)
        return Step(event, at, transition.state, {}, transition.closed)
    if event.type == "revealed":
        if event.intent is None:
            msg = "a revealed command needs the intent that was shown"
            raise InvalidEventError(msg)
        after = mark_revealed(state, event.intent, at)
        shown = (event.intent,)
        before = _predictions(state, shown, at)
        return Step(event, at, after, _changed(before, _predictions(after, shown, at)))
    if not isinstance(event.name, str) or not event.name:
        msg = "an event needs a name (a non-empty string)"
        if event.type == "erase":
            msg = (
                "an erase deletes the user's state: the stream processor applies it, not the engine"
            )
        raise InvalidEventError(msg)
    touched = config.touched_index.get(event.name)
    # The state as of `at` is both what the predictions before the event are read from and
    # what the event applies to: brought there once (an idle gap's close is the costly part).
    timed_out = close_timed_out(state, at)
    view = settle(timed_out.state, at)
    after = observe_settled(view, event.name, at)
    if touched is None:  # most events: no intent's prediction can change
        return Step(event, at, after, {}, timed_out.closed)
    before = predict_settled(view, at, touched)
    outcome_of = config.outcome_index.get(event.name)
    wiped = {name: before[name] for name in outcome_of} if outcome_of else {}
    # The next state is as of `at` already (its clock is `at`, the held episodes settled).
    predictions = _changed(before, predict_settled(after, at, touched))
    return Step(event, at, after, predictions, timed_out.closed, wiped)


def _predictions(state: EngineState, intents: tuple[str, ...], at: int) -> dict[str, Prediction]:
    """`predict` of each of `intents` at `at` (the state brought to `at` once for all)."""
    return predict_many(state, at, intents) if intents else {}


def _changed(
    before: Mapping[str, Prediction], now: Mapping[str, Prediction]
) -> dict[str, Prediction]:
    """The predictions of `now` that differ from `before`'s."""
    return {name: new for name, new in now.items() if new != before[name]}


class Replayer:
    """Keeps one state per user and applies events to them in order."""

    def __init__(self, config: EngineConfig) -> None:
        """Start with no users; each user's state is created on its first event."""
        self.config = config
        self.states: dict[str, EngineState] = {}

    def feed(self, event: Event) -> Step:
        """Apply `event` to its user's state and keep the result.

        With `stateTtl`, a user whose last event is more than the TTL before `event` has
        expired (docs/lifecycle.md): the event starts a new state, and the step reports the
        old state's episode closed, as applying the event to the old state would have.
        """
        state = self.states.get(event.user)
        if state is None:
            return self._start(event)
        ttl = self.config.state_ttl_ms
        if ttl is not None and state.clock is not None and event.at - state.clock > ttl:
            step = self._start(event)
            closed = close_if_due(state, event.at).closed
            return step if closed is None else dataclasses.replace(step, closed=closed)
        step = apply_event(state, event)
        self.states[event.user] = step.state
        return step

    def _start(self, event: Event) -> Step:
        step = apply_event(create_state(self.config), event)
        self.states[event.user] = step.state
        return step

    def close_due(self, watermark: int = END_OF_TIME) -> Iterator[tuple[str, ClosedEpisode]]:
        """Close every episode that timed out before `watermark`, as a live worker's timer does."""
        for user, state in self.states.items():
            transition = close_if_due(state, watermark)
            if transition.closed is not None:
                self.states[user] = transition.state
                yield user, transition.closed


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Everything a replay produced."""

    steps: list[Step]
    closed_at_end: list[tuple[str, ClosedEpisode]]
    """Episodes closed by the final watermark, with their users."""
    states: dict[str, EngineState]
    """The final state per user."""


def replay(
    config: EngineConfig,
    events: Iterable[Event | tuple[str, str, int]],
    *,
    until: int = END_OF_TIME,
) -> ReplayResult:
    """Replay `events` (Event objects or `(user, name, at)` tuples) from fresh states.

    Args:
        config: the engine config.
        events: in the order the stream would deliver them (per user, by time).
        until: the final watermark; episodes due by then are closed, as a live worker's
            timer closes them once its clock passes them. Default: the end of time.

    Returns:
        The per-event steps, the episodes closed at the end, and the final states.
    """
    replayer = Replayer(config)
    steps = [replayer.feed(e if isinstance(e, Event) else Event(e[0], e[2], e[1])) for e in events]
    closed = list(replayer.close_due(until))
    return ReplayResult(steps, closed, replayer.states)
