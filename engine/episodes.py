"""Episodes: opening, closing on sign-out or idle timeout, and what a close does to each intent.

One episode is open at a time, shared by all intents. A close judges every intent that has an
outcome: resolved (the outcome came) → nothing more; attribution set → the episode is held;
otherwise → a miss for each seen signal and one episode without the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from engine.durations import is_time
from engine.errors import InvalidTimeError
from engine.learning import hold, judge, settle_expired
from engine.state import NO_EPISODE, EngineState, IntentState, PendingEpisode, Reading

Reason = Literal["end", "timeout"]
Verdict = Literal["miss", "held", "resolved"]

END: Final[Reason] = "end"
TIMEOUT: Final[Reason] = "timeout"


@dataclass(frozen=True, slots=True)
class IntentVerdict:
    """What a close did to one intent that has an outcome."""

    verdict: Verdict
    signals: tuple[str, ...]
    """Signals the close judged (missed or held), sorted; for a resolved intent, those seen
    after its outcome, which stay neutral."""


@dataclass(frozen=True, slots=True)
class ClosedEpisode:
    """An episode that closed: when, why, and each intent's verdict (intents with an outcome)."""

    started_at: int
    closed_at: int
    reason: Reason
    intents: Mapping[str, IntentVerdict]


@dataclass(slots=True)  # not frozen: built up to 3 times per event (see engine/state.py)
class Transition:
    """A state transition's result: the next state and the episode it closed, if any."""

    state: EngineState
    closed: ClosedEpisode | None = None


def clamp_time(state: EngineState | Reading, at: object) -> int:
    """Validate `at` (epoch ms, an int from 1970 to the end of year 9999) and never let it run
    behind the state's clock."""
    if not is_time(at):
        raise InvalidTimeError(at)
    clock = state.clock
    return at if clock is None or at > clock else clock


def timeout_deadline(state: EngineState) -> int | None:
    """The moment the open episode times out (last event + episodeTimeout), or None."""
    timeout = state.config.episode_timeout_ms
    last = state.episode.last_event_at
    if timeout is None or last is None:
        return None
    return last + timeout


def close_timed_out(state: EngineState, at: int) -> Transition:
    """Close the open episode if the idle gap up to `at` is longer than episodeTimeout.

    The episode closes at the moment it timed out (last event + timeout), not at `at`; a gap
    exactly equal to the timeout does not close it.
    """
    deadline = timeout_deadline(state)
    if deadline is None or at <= deadline:
        return Transition(state)
    return close_episode(state, deadline, TIMEOUT)


def settle(state: EngineState, before: int) -> EngineState:
    """Turn every held episode whose attribution window ended before `before` into a miss."""
    half_life = state.config.learning.half_life_ms
    changed: dict[str, IntentState] | None = None
    intents = state.intents
    # Only intents with attribution hold episodes (`settle_expired` leaves any other as is),
    # and each intent settles on its own, so the order they are visited in does not matter.
    for name, config in state.config.attribution_intents:
        intent = intents.get(name)
        if intent is None or not intent.pending:
            continue
        settled = settle_expired(intent, config, before, half_life)
        if settled is not intent:
            changed = changed if changed is not None else dict(state.intents)
            changed[name] = settled
    if changed is None:
        return state
    return EngineState(state.config, state.episode, changed, state.clock)


def close_episode(state: EngineState, at: int, reason: Reason) -> Transition:
    """Close the open episode at `at` and judge every intent (see the module docstring).

    Windows that ended before `at` are settled first, so the state is as of `at` when the
    close is judged (this matters for the 32-episode cap).
    """
    started_at = state.episode.started_at
    if started_at is None:
        return Transition(state)
    state = settle(state, at)
    half_life = state.config.learning.half_life_ms
    intents = dict(state.intents)
    verdicts: dict[str, IntentVerdict] = {}
    for name, config in state.config.intents.items():
        intent = intents[name]
        seen = tuple(sorted(intent.seen))
        if config.outcome is None:
            pass  # never learns: nothing to judge
        elif intent.resolved:
            verdicts[name] = IntentVerdict("resolved", seen)
        elif config.attribution_ms is not None:
            intent = hold(intent, PendingEpisode(at, list(seen)), half_life)
            verdicts[name] = IntentVerdict("held", seen)
        else:
            intent = judge(intent, seen, 0.0, at, half_life)
            verdicts[name] = IntentVerdict("miss", seen)
        intents[name] = _end_episode_marks(intent)
    clock = at if state.clock is None or at > state.clock else state.clock
    closed = ClosedEpisode(started_at, at, reason, verdicts)
    return Transition(EngineState(state.config, NO_EPISODE, intents, clock), closed)


def _end_episode_marks(intent: IntentState) -> IntentState:
    if not intent.seen and not intent.resolved:
        return intent
    return IntentState(
        intent.episodes,
        intent.learned,
        intent.evidence,
        {},
        False,
        intent.pending,
        intent.last_outcome_at,
        intent.last_revealed_at,
    )


def end_episode_transition(state: EngineState, at: int) -> Transition:
    """Sign-out at `at`: close the open episode (or the timed-out one at its timeout)."""
    at = clamp_time(state, at)
    if state.episode.started_at is None:
        return Transition(state)
    timed_out = close_timed_out(state, at)
    if timed_out.closed is not None:
        return timed_out
    return close_episode(state, at, END)


def end_episode(state: EngineState, at: int) -> EngineState:
    """Close the open episode at `at`, as a sign-out does.

    With no open episode nothing changes (the same state is returned). If the open episode
    had already timed out before `at`, it closes at its timeout moment instead, exactly as the
    next `observe` would have closed it.

    Args:
        state: the user's state (not modified).
        at: epoch milliseconds.

    Returns:
        The next state.

    Raises:
        InvalidTimeError: if `at` is not an int from 1970 to the end of year 9999.
    """
    return end_episode_transition(state, at).state


def close_if_due(state: EngineState, watermark: int) -> Transition:
    """Close the open episode if it timed out before `watermark` (the stream timer's call).

    Due means last event + episodeTimeout < watermark, the same strict rule `observe` applies
    lazily, so a timer close and a lazy close give identical states.
    """
    return close_timed_out(state, watermark)


def episode_closed(prev: EngineState, next_state: EngineState) -> bool:
    """An episode closed between `prev` and `next_state`: prev had one open and next has a
    different one (or none)."""
    started = prev.episode.started_at
    return started is not None and next_state.episode.started_at != started
