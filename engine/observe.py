"""`observe`: one event applied to one user's state.

Order inside `observe(state, name, at)`:
1. close a timed-out episode at last event + episodeTimeout;
2. settle held episodes whose attribution window ended before `at`;
3. open or extend the episode, then for each intent: the outcome path if `name` is its
   outcome, else the signal path if `name` is one of its signals. Effective weights are
   computed from the counts as of `at`, after (1) and (2).
"""

from __future__ import annotations

from engine.config import EngineConfig
from engine.episodes import Transition, clamp_time, close_timed_out, settle
from engine.errors import InvalidEventError
from engine.learning import credit_pending, decay_factor, effective_weight, judge
from engine.state import EngineState, EpisodeState, Evidence, IntentState


def observe(state: EngineState, name: str, at: int) -> EngineState:
    """Apply the event `name` at `at` and return the next state.

    Any event opens an episode if none is open and extends it otherwise; event names the
    config does not mention do only that.

    Args:
        state: the user's state (not modified).
        name: the event name, e.g. "pricing.viewed".
        at: epoch milliseconds; an earlier time than the state's clock is taken as the clock.

    Returns:
        The next state.

    Raises:
        InvalidTimeError: if `at` is not an int from 1970 to the end of year 9999.
        InvalidEventError: if `name` is not a non-empty string.
    """
    return observe_transition(state, name, at).state


def observe_transition(state: EngineState, name: str, at: int) -> Transition:
    """`observe`, also returning the episode that the event's idle gap closed, if any."""
    if not isinstance(name, str) or not name:
        msg = f"an event name must be a non-empty string (got {type(name).__name__} {name!r:.40})"
        raise InvalidEventError(msg)
    at = clamp_time(state, at)
    timed_out = close_timed_out(state, at)
    return Transition(observe_settled(settle(timed_out.state, at), name, at), timed_out.closed)


def observe_settled(state: EngineState, name: str, at: int) -> EngineState:
    """Step 3 of `observe_transition`, on `state` already brought to `at` (steps 1 and 2: the
    episode that timed out closed, held episodes settled), with `at` no earlier than the
    state's clock: the next state. For a caller that reads the state as of `at` too."""
    episode = state.episode
    started = episode.started_at if episode.started_at is not None else at
    config = state.config
    outcome_of = config.outcome_index.get(name, ())
    signal_of = config.signal_index.get(name, ())
    intents = state.intents
    if outcome_of or signal_of:
        intents = dict(intents)
        for intent_name in outcome_of:
            intents[intent_name] = _on_outcome(intents[intent_name], config, intent_name, at)
        for intent_name in signal_of:
            if intent_name not in outcome_of:  # both outcome and signal: the outcome path only
                intents[intent_name] = _on_signal(
                    intents[intent_name], config, intent_name, name, at
                )
    return EngineState(config, EpisodeState(started, at), intents, at)


def _on_outcome(intent: IntentState, config: EngineConfig, name: str, at: int) -> IntentState:
    """Hits for the held episodes (shares) and the seen signals; count one episode with it."""
    intent_config = config.intents[name]
    half_life = config.learning.half_life_ms
    if intent.pending:
        intent = credit_pending(intent, intent_config, at, half_life)
    intent = judge(intent, tuple(sorted(intent.seen)), 1.0, at, half_life)
    return IntentState(
        intent.episodes,
        intent.learned,
        {} if intent_config.reset_on_outcome else intent.evidence,
        {},
        True,
        intent.pending,
        at,
        intent.last_revealed_at,
    )


def _on_signal(
    intent: IntentState, config: EngineConfig, name: str, signal: str, at: int
) -> IntentState:
    """Add e = effective weight / n to α (or |e| to β), n = the signal's repeat count."""
    intent_config = config.intents[name]
    repeat = intent.seen.get(signal, 0) + 1
    weight = effective_weight(intent, intent_config, config.learning, signal, at)[3]
    amount = weight / repeat
    seen = dict(intent.seen)
    seen[signal] = repeat
    evidence = intent.evidence
    if amount != 0.0:
        evidence = dict(evidence)
        evidence[signal] = _add_evidence(
            evidence.get(signal), amount, at, intent_config.half_life_ms
        )
    return IntentState(
        intent.episodes,
        intent.learned,
        evidence,
        seen,
        intent.resolved,
        intent.pending,
        intent.last_outcome_at,
        intent.last_revealed_at,
    )


def _add_evidence(
    current: Evidence | None, amount: float, at: int, half_life_ms: int | None
) -> Evidence:
    alpha, beta = 0.0, 0.0
    if current is not None:
        factor = decay_factor(at - current.at, half_life_ms)
        alpha, beta = current.alpha * factor, current.beta * factor
    if amount > 0.0:
        return Evidence(alpha + amount, beta, at)
    return Evidence(alpha, beta - amount, at)
