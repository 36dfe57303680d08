"""Reads and reveals: `predict`, `should_reveal`, `explain`, `mark_revealed`.

Each intent is a Beta(α, β): α0 = prior·priorWeight and β0 = (1 − prior)·priorWeight, plus the
evidence its signals added, decayed toward the prior with the intent's halfLife. Reads show the
state as of `at` (a timed-out episode closed, passed attribution windows settled, counts and
evidence decayed) and store nothing: the next `observe` stores the same verdicts.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from engine.config import IntentConfig
from engine.episodes import clamp_time, close_timed_out, settle, timeout_deadline
from engine.errors import UnknownIntentError
from engine.learning import counts_at, decay_factor, effective_weight
from engine.state import EngineState, IntentState, Predictable, Reading


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class Prediction:
    """An intent's estimate at one moment."""

    p: float
    """Posterior mean α / (α + β)."""
    sd: float
    """Posterior standard deviation sqrt(αβ / ((α+β)²(α+β+1)))."""
    lower: float
    """p − z·sd; a reveal needs it at or above the threshold too."""
    alpha: float
    beta: float
    reveal: bool
    """p ≥ threshold, lower ≥ threshold and no cooldown running (same as `should_reveal`)."""
    suppressed_until: int | None
    """End (epoch ms, exclusive) of the later cooldown still running, else None."""


@dataclass(frozen=True, slots=True)
class Counts:
    """Hits and misses as of the read's time."""

    hits: float
    misses: float


@dataclass(frozen=True, slots=True)
class SignalExplanation:
    """One declared signal's part in an intent, as of the read's time."""

    initial: float
    """w0, the weight in the config."""
    learned: float
    """gain × |w0| × score; 0 while the signal was never seen."""
    effective: float
    """The blend of initial and learned that the next occurrence would add (before /n)."""
    lift: float
    """The raw association measure (learning.lift); 0 while never seen."""
    score: float
    """The measure's evidence score in [−1, 1]."""
    hits: float
    misses: float
    seen: int
    """Occurrences in the open episode since the intent's last outcome."""
    contribution: float
    """Evidence it still adds: positive to α, negative to β."""
    impact: float
    """p minus the p without this signal's contribution."""


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why an intent's p is what it is."""

    intent: str
    at: int
    p: float
    alpha: float
    beta: float
    episodes: Counts
    """The base rate: episodes with (hits) and without (misses) the outcome."""
    signals: Mapping[str, SignalExplanation]


def as_of(state: EngineState, at: int) -> EngineState:
    """The state as a read at `at` shows it (nothing is stored)."""
    return settle(close_timed_out(state, at).state, at)


def as_of_span(state: EngineState, at: int) -> tuple[EngineState, int | None, int | None]:
    """`as_of(state, at)` and the read times it holds for: (view, after, until) such that
    `as_of(state, t)` is `view` for every `t` with `after < t <= until` (None: unbounded).

    A read changes the state at fixed moments only: the open episode's timeout deadline (past
    it, the episode is closed *at the deadline*, whatever `at` is) and each held episode's
    attribution window end (past it, a miss dated *at the window's end*). Between two such
    moments the view is the same; what depends on `at` itself (decay, cooldowns) is in
    `predict_settled`, computed per read. So a reader that keeps a user's view answers later
    reads from it until the next moment (a reader that only predicts needs no view at all:
    `predict_read`). Reads are `clamp_time`d first, as `predict_many` does.
    """
    moments: list[int] = []
    deadline = timeout_deadline(state)
    closed = close_timed_out(state, at).state  # `state` itself when at <= deadline
    if deadline is not None:
        moments.append(deadline)
    intents = state.config.intents
    for name, intent in closed.intents.items():
        config = intents.get(name)
        if intent.pending and config is not None and config.attribution_ms is not None:
            moments.extend(held.closed_at + config.attribution_ms for held in intent.pending)
    view = settle(closed, at)
    passed = [m for m in moments if at > m]
    ahead = [m for m in moments if at <= m]
    return view, max(passed, default=None), min(ahead, default=None)


def predict(state: EngineState, intent: str, at: int) -> Prediction:
    """Return the intent's prediction as of `at`.

    Args:
        state: the user's state (not modified).
        intent: a declared intent name.
        at: epoch milliseconds (an earlier time than the state's clock reads at the clock).

    Returns:
        The `Prediction`.

    Raises:
        UnknownIntentError: if the config does not declare `intent`.
        InvalidTimeError: if `at` is not an int from 1970 to the end of year 9999.
    """
    config = _intent_config(state, intent)
    at = clamp_time(state, at)
    return _prediction(as_of(state, at).intents[intent], config, at)


def predict_many(
    state: EngineState, at: int, intents: Sequence[str] | None = None
) -> dict[str, Prediction]:
    """Return `predict(state, name, at)` for each of `intents` (default: every declared one),
    bringing the state to `at` once for all of them instead of once per intent.

    Raises:
        UnknownIntentError: if the config does not declare one of `intents`.
        InvalidTimeError: if `at` is not an int from 1970 to the end of year 9999.
    """
    names = list(state.config.intents) if intents is None else list(intents)
    configs = [_intent_config(state, name) for name in names]
    at = clamp_time(state, at)
    view = as_of(state, at)
    return {
        name: _prediction(view.intents[name], config, at)
        for name, config in zip(names, configs, strict=True)
    }


def predict_settled(
    view: EngineState | Reading, at: int, intents: Sequence[str]
) -> dict[str, Prediction]:
    """`predict_many(state, at, intents)` given `view = as_of(state, at)` already, with `at`
    no earlier than the state's clock: for a caller that brought the state to `at` anyway.

    Raises:
        UnknownIntentError: if the config does not declare one of `intents`.
    """
    configs = view.config.intents
    states = view.intents
    predictions = {}
    for name in intents:
        # Not `_intent_config` for every name: a str key found in `configs` is declared.
        config = configs.get(name) if type(name) is str else None
        if config is None:
            config = _intent_config(view, name)  # raises UnknownIntentError, as documented
        predictions[name] = _prediction(states[name], config, at)
    return predictions


def predict_read(
    state: EngineState | Reading, at: int, intents: Sequence[str]
) -> dict[str, Prediction]:
    """`predict_many(state, at, intents)` with `at` no earlier than the state's clock, without
    bringing the state to `at`: for a reader that only predicts (the lookup API).

    A prediction reads of an intent only its evidence, its last outcome and its last reveal.
    Bringing a state to `at` (`as_of`: a timed-out episode closed, ended attribution windows
    settled) changes none of them: a close and a settle move the learned counts, the base
    rate, the seen signals and the held episodes, which the next `observe` uses. So the state
    predicts what its view predicts, bit for bit (tests/engine/test_properties.py), and
    closing the episode was most of a cold lookup's engine time for nothing. `explain` reads
    the counts: it still needs the view. For the same reason a `Reading` of the state (what
    predictions read, and no more) predicts what the state predicts.

    Raises:
        UnknownIntentError: if the config does not declare one of `intents`.
    """
    return predict_settled(state, at, intents)


def should_reveal(state: EngineState, intent: str, at: int) -> bool:
    """True when the intent's prompt should be shown now (`predict(...).reveal`)."""
    return predict(state, intent, at).reveal


def mark_revealed(state: EngineState, intent: str, at: int) -> EngineState:
    """Record that the app showed the intent's prompt at `at`: a cooldown starts.

    Raises:
        UnknownIntentError: if the config does not declare `intent`.
        InvalidTimeError: if `at` is not an int from 1970 to the end of year 9999.
    """
    _intent_config(state, intent)
    at = clamp_time(state, at)
    current = state.intents[intent]
    intents = dict(state.intents)
    intents[intent] = IntentState(
        current.episodes,
        current.learned,
        current.evidence,
        current.seen,
        current.resolved,
        current.pending,
        current.last_outcome_at,
        at,
    )
    return EngineState(state.config, state.episode, intents, at)


def explain(state: EngineState, intent: str, at: int) -> Explanation:
    """Return per signal its weights, counts, contribution and impact, as of `at`.

    Raises:
        UnknownIntentError: if the config does not declare `intent`.
        InvalidTimeError: if `at` is not an int from 1970 to the end of year 9999.
    """
    config = _intent_config(state, intent)
    at = clamp_time(state, at)
    view = as_of(state, at)
    current = view.intents[intent]
    alpha, beta = beta_parameters(current, config, at)
    p = alpha / (alpha + beta)
    learning = state.config.learning
    signals = {}
    for signal, initial in config.signals.items():
        lift, score, learned, effective = effective_weight(current, config, learning, signal, at)
        record = current.learned.get(signal)
        hits, misses = (
            (0.0, 0.0) if record is None else counts_at(record, at, learning.half_life_ms)
        )
        plus, minus = _evidence_at(current, signal, config, at)
        without = _p_without(
            current, config, at, signal, alpha_plus=(alpha, plus), beta_minus=(beta, minus)
        )
        signals[signal] = SignalExplanation(
            initial,
            learned,
            effective,
            lift,
            score,
            hits,
            misses,
            current.seen.get(signal, 0),
            plus - minus,
            p - without,
        )
    outcomes, without_outcome = counts_at(current.episodes, at, learning.half_life_ms)
    return Explanation(intent, at, p, alpha, beta, Counts(outcomes, without_outcome), signals)


def beta_parameters(intent: Predictable, config: IntentConfig, at: int) -> tuple[float, float]:
    """Return (α, β) at `at`: the prior plus every signal's evidence decayed to `at`."""
    alpha = config.prior * config.prior_weight
    beta = (1.0 - config.prior) * config.prior_weight
    evidence = intent.evidence
    # sorted: float sums must not depend on dict order (one entry needs no sort). This runs
    # twice per signal event, so `_evidence_at` is inlined: the same arithmetic.
    # `decay_factor` is inlined too: the same expression, without a call per signal.
    half_life = config.half_life_ms
    for signal in sorted(evidence) if len(evidence) > 1 else evidence:
        added = evidence[signal]
        elapsed = at - added.at
        if half_life is None or elapsed <= 0:
            alpha += added.alpha
            beta += added.beta
        else:
            factor = 2.0 ** (-elapsed / half_life)
            alpha += added.alpha * factor
            beta += added.beta * factor
    return alpha, beta


def suppressed_until(intent: Predictable, config: IntentConfig, at: int) -> int | None:
    """End of the later cooldown (after a reveal, after an outcome) still running at `at`."""
    # Written out for the two starts rather than looped over a tuple: this runs per read.
    until = None
    revealed, outcome = intent.last_revealed_at, intent.last_outcome_at
    if revealed is not None and at < revealed + config.cooldown_ms:
        until = revealed + config.cooldown_ms
    if outcome is not None:
        end = outcome + config.cooldown_ms
        if at < end and (until is None or end > until):
            until = end
    return until


def _prediction(intent: Predictable, config: IntentConfig, at: int) -> Prediction:
    alpha, beta = beta_parameters(intent, config, at)
    total = alpha + beta
    p = alpha / total
    sd = spread(alpha, beta, total)
    lower = p - config.z * sd
    until = suppressed_until(intent, config, at)
    reveal = p >= config.threshold and lower >= config.threshold and until is None
    return Prediction(p, sd, lower, alpha, beta, reveal, until)


def spread(alpha: float, beta: float, total: float) -> float:
    """The Beta(α, β) standard deviation sqrt(αβ / ((α+β)²(α+β+1))), `total` = α + β.

    That formula is the one every pinned result was computed with, so it stays wherever its
    products are normal floats. With a tiny priorWeight (1e-200) αβ and (α+β)³ underflow (to 0:
    a ZeroDivisionError, or to subnormals that lose precision); then the same value is computed
    as (α/(α+β))·(β/(α+β)) / (α+β+1), whose terms stay normal.
    """
    product = alpha * beta
    cube = total * total * (total + 1.0)
    if _TINY <= product < math.inf and _TINY <= cube < math.inf:
        return math.sqrt(product / cube)
    return math.sqrt((alpha / total) * (beta / total) / (total + 1.0))


_TINY: Final = sys.float_info.min  # the smallest normal float


def _p_without(
    intent: IntentState,
    config: IntentConfig,
    at: int,
    signal: str,
    *,
    alpha_plus: tuple[float, float],
    beta_minus: tuple[float, float],
) -> float:
    """p without `signal`'s evidence (`plus` of α, `minus` of β): (α − plus) / (α − plus + β −
    minus). What is left always holds the prior α0, β0; when α or β is so much larger than
    it (a tiny priorWeight next to the evidence) that the subtraction's rounding could cancel it
    away, even to 0/0, α and β are summed again without that signal instead."""
    (alpha, plus), (beta, minus) = alpha_plus, beta_minus
    alpha0 = config.prior * config.prior_weight
    beta0 = (1.0 - config.prior) * config.prior_weight
    if alpha0 >= alpha * _CANCELLATION and beta0 >= beta * _CANCELLATION:
        return (alpha - plus) / (alpha - plus + beta - minus)
    for other in sorted(intent.evidence):
        if other != signal:
            other_plus, other_minus = _evidence_at(intent, other, config, at)
            alpha0 += other_plus
            beta0 += other_minus
    return alpha0 / (alpha0 + beta0)


_CANCELLATION: Final = 1e-9
"""α − plus keeps the prior α0 to about (ulp(α)/α0) ≈ 1e-7 while α0 ≥ 1e-9·α."""


def _evidence_at(
    intent: IntentState, signal: str, config: IntentConfig, at: int
) -> tuple[float, float]:
    evidence = intent.evidence.get(signal)
    if evidence is None:
        return 0.0, 0.0
    factor = decay_factor(at - evidence.at, config.half_life_ms)
    return evidence.alpha * factor, evidence.beta * factor


def _intent_config(state: EngineState | Reading, intent: str) -> IntentConfig:
    if not isinstance(intent, str):  # a list is unhashable: say what is wrong, not that
        raise UnknownIntentError(intent, tuple(state.config.intents))
    config = state.config.intents.get(intent)
    if config is None:
        raise UnknownIntentError(intent, tuple(state.config.intents))
    return config
