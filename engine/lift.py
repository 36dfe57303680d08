"""From hits and misses to a weight: the learning formulas as small pure functions.

A signal's counts (hits: episodes with it that ended in the outcome; misses: those that did
not) and the intent's base rate give q, the outcome rate with the signal, and b, the rate
without it, both Laplace-smoothed. A lift measure compares them and maps the result to an
evidence score in [−1, 1]; the learned weight is gain × |w0| × score, and the effective weight
blends it with the initial weight w0 by the contrast count nEff (engine/README.md, "The model").
The formulas and their names are the original oracular engine's.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Final

EPSILON: Final = sys.float_info.epsilon  # 2.220446049250313e-16, as JavaScript's Number.EPSILON

DEFAULT_LIFT: Final = "normalized-difference"


def _clamp(rate: float) -> float:
    """Clamp a rate to [ε, 1 − ε] so ratio and log measures stay finite."""
    return min(max(rate, EPSILON), 1.0 - EPSILON)


def _ratio_score(ratio: float) -> float:
    """Evidence score of a ratio R: (R − 1) / (R + 1); 1 → 0, 3 → 0.5, 1/3 → −0.5."""
    return (ratio - 1.0) / (ratio + 1.0)


def _unbounded_score(x: float) -> float:
    """Evidence score of a relative or log lift x: x / (1 + |x|)."""
    return x / (1.0 + abs(x))


def normalized_difference(q: float, b: float) -> float:
    """(q − b) / (1 − b) if q ≥ b, else (q − b) / b. Already in [−1, 1]; the default."""
    return (q - b) / (1.0 - b) if q >= b else (q - b) / b


def absolute_difference(q: float, b: float) -> float:
    """q − b. Already in [−1, 1]."""
    return q - b


def relative_lift(q: float, b: float) -> float:
    """(q − b) / b, with q and b clamped to [ε, 1 − ε]."""
    q, b = _clamp(q), _clamp(b)
    return (q - b) / b


def risk_ratio(q: float, b: float) -> float:
    """q / b, with q and b clamped to [ε, 1 − ε]."""
    return _clamp(q) / _clamp(b)


def log_lift(q: float, b: float) -> float:
    """ln(q / b), with q and b clamped to [ε, 1 − ε]."""
    return math.log(_clamp(q) / _clamp(b))


def odds_ratio(q: float, b: float) -> float:
    """(q / (1 − q)) / (b / (1 − b)), with q and b clamped to [ε, 1 − ε]."""
    q, b = _clamp(q), _clamp(b)
    return (q / (1.0 - q)) / (b / (1.0 - b))


def association_rule(q: float, base: float) -> float:
    """P(A,B) / (P(A) × P(B)) = q / P(B), where `base` is P(B) = (outcomes + 2) / (episodes + 4).

    One is added to each cell of the signal × outcome table, so P(A,B) / P(A) is exactly the
    smoothed q. Both inputs are clamped to [ε, 1 − ε].
    """
    return _clamp(q) / _clamp(base)


# name -> (raw measure, evidence score of the raw value, compares against P(B) instead of b)
LiftMeasure = tuple[Callable[[float, float], float], Callable[[float], float], bool]


def _identity(x: float) -> float:
    return x


LIFT_MEASURES: Final[dict[str, LiftMeasure]] = {
    "normalized-difference": (normalized_difference, _identity, False),
    "absolute-difference": (absolute_difference, _identity, False),
    "relative-lift": (relative_lift, _unbounded_score, False),
    "risk-ratio": (risk_ratio, _ratio_score, False),
    "log-lift": (log_lift, _unbounded_score, False),
    "odds-ratio": (odds_ratio, _ratio_score, False),
    "association-rule": (association_rule, _ratio_score, True),
}

DEPRECATED_LIFTS: Final = frozenset(LIFT_MEASURES) - {DEFAULT_LIFT}


def lift_and_score(
    measure: str, hits: float, misses: float, outcomes: float, episodes: float
) -> tuple[float, float]:
    """Return (raw lift, evidence score in [−1, 1]) of one signal under `measure`.

    Args:
        measure: a name in `LIFT_MEASURES`.
        hits: episodes in which the signal was seen and the outcome followed.
        misses: episodes in which the signal was seen and the outcome did not follow.
        outcomes: episodes of the intent that ended with the outcome (its base-rate hits).
        episodes: all episodes of the intent (base-rate hits + misses).

    Returns:
        The raw measure and its evidence score; `learned = gain × |w0| × score`.
    """
    n_with = hits + misses
    q = (hits + 1.0) / (n_with + 2.0)
    return rates_lift_and_score(measure, q, baseline(measure, hits, misses, outcomes, episodes))


def baseline(measure: str, hits: float, misses: float, outcomes: float, episodes: float) -> float:
    """What q is compared with: b = (outcomes − hits + 1) / (nWithout + 2), Laplace-smoothed,
    or for association-rule lift the overall rate P(B) = (outcomes + 2) / (episodes + 4)."""
    if LIFT_MEASURES[measure][2]:
        return (outcomes + 2.0) / (episodes + 4.0)
    n_without = max(episodes - hits - misses, 0.0)
    return (max(outcomes - hits, 0.0) + 1.0) / (n_without + 2.0)


def rates_lift_and_score(measure: str, q: float, other: float) -> tuple[float, float]:
    """(raw lift, evidence score) of an outcome rate q against `baseline`'s rate."""
    raw_fn, score_fn, _ = LIFT_MEASURES[measure]
    raw = raw_fn(q, other)
    return raw, max(-1.0, min(1.0, score_fn(raw)))


def n_eff(n_with: float, n_without: float) -> float:
    """Contrast count (nWith × nWithout) / (nWith + nWithout); 0 if either side is 0."""
    if n_with <= 0.0 or n_without <= 0.0:
        return 0.0
    return (n_with * n_without) / (n_with + n_without)


def learned_weight(initial: float, gain: float, score: float, n_with: float) -> float:
    """learned = gain × |w0| × score; 0 while the signal was never seen (nWith = 0)."""
    if n_with <= 0.0:
        return 0.0
    return gain * abs(initial) * score


def blend(initial: float, learned: float, contrast: float, prior_episodes: float) -> float:
    """effective = (k × w0 + nEff × learned) / (k + nEff), k = learning.priorEpisodes."""
    if contrast <= 0.0:
        return initial  # no counterfactual: the developer's weight stands, exactly
    effective = (prior_episodes * initial + contrast * learned) / (prior_episodes + contrast)
    if math.isfinite(effective):
        return effective
    # k·w0 overflowed (k near 1e308, which priorEpisodes may be): the same blend divided
    # through by k. Only then, so every finite result stays bit for bit what it was.
    share = contrast / prior_episodes
    return (initial + share * learned) / (1.0 + share)
