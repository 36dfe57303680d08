"""Tuning from history: which event names go with an intent's outcome, and how strongly.

For each intent with an outcome, the events are cut into episodes by the engine's rules (a
sign-out, or an idle gap longer than episodeTimeout). An episode "has the outcome" if the
intent's outcome occurs in it; a name is "seen" in it if it occurs before the first outcome
(later occurrences are neutral, as in the engine). For every declared signal, and for every
other name seen in at least `min_episodes` episodes (a candidate), the report gives:

- episodes with and without the name, and the hits (episodes with it that had the outcome);
- the raw lift and its evidence score under the configured measure (exactly the engine's
  `learning.lift` arithmetic, Laplace smoothing included);
- a 95% Wilson interval of the outcome rate with the name, carried through the same score;
- suggested weight `priorStrength × score`, rounded to two decimals, and the interval as
  weights; both stay within ±priorStrength because scores lie in [−1, 1].

`priorStrength` defaults to the intent's largest declared |weight| (1 if it has none), so
suggestions are on the scale of the weights already written.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from engine.config import EngineConfig
from engine.evaluate import IntentScore, evaluate
from engine.lift import baseline, lift_and_score, rates_lift_and_score
from engine.replay import Event

WILSON_Z = 1.959963984540054  # two-sided 95%


@dataclass(frozen=True, slots=True)
class SignalReport:
    """One declared or candidate signal of an intent."""

    name: str
    declared: float | None
    """The weight in the config, or None for a candidate."""
    with_episodes: int
    without_episodes: int
    hits: int
    lift: float
    score: float
    interval: tuple[float, float]
    """95% Wilson interval of the outcome rate with the signal, as weights."""
    suggested: float


@dataclass(frozen=True, slots=True)
class IntentReport:
    """Tuning for one intent."""

    intent: str
    outcome: str
    episodes: int
    outcomes: int
    prior_strength: float
    measure: str
    signals: list[SignalReport] = field(default_factory=list)


def episodes_of(config: EngineConfig, events: Iterable[Event]) -> list[list[Event]]:
    """Cut each user's events into episodes with the engine's rules (events sorted per user)."""
    timeout = config.episode_timeout_ms
    open_: dict[str, list[Event]] = {}
    done: list[list[Event]] = []
    for event in events:
        current = open_.get(event.user)
        if current and timeout is not None and event.at - current[-1].at > timeout:
            done.append(open_.pop(event.user))
            current = None
        if event.type == "end":
            if current:
                done.append(open_.pop(event.user))
            continue
        if event.type != "event":
            continue  # reveals are commands, not events
        open_.setdefault(event.user, []).append(event)
    done.extend(open_.values())
    return done


def tune(
    config: EngineConfig,
    events: Iterable[Event],
    *,
    min_episodes: int = 5,
    prior_strength: float | None = None,
) -> list[IntentReport]:
    """Report declared and candidate signals for every intent that has an outcome."""
    episodes = episodes_of(config, events)
    # An outcome (this intent's or another's) is what signals predict, not a signal: another
    # intent's outcome is a consequence of the same journey, never a prompt to show.
    outcomes_of_all = {i.outcome for i in config.intents.values() if i.outcome}
    reports = []
    for name, intent in config.intents.items():
        if intent.outcome is None:
            continue
        strength = prior_strength or max((abs(w) for w in intent.signals.values()), default=1.0)
        strength = strength or 1.0
        seen_in, outcomes = _count(episodes, intent.outcome)
        report = IntentReport(
            name, intent.outcome, len(episodes), outcomes, strength, config.learning.lift
        )
        candidates = sorted(
            n
            for n, (with_, _) in seen_in.items()
            if with_ >= min_episodes and n not in intent.signals and n not in outcomes_of_all
        )
        for signal in [*intent.signals, *candidates]:
            with_, hits = seen_in.get(signal, (0, 0))
            report.signals.append(
                _signal_report(
                    signal,
                    intent.signals.get(signal),
                    with_=with_,
                    hits=hits,
                    outcomes=outcomes,
                    episodes=len(episodes),
                    strength=strength,
                    measure=config.learning.lift,
                )
            )
        reports.append(report)
    return reports


def _count(episodes: list[list[Event]], outcome: str) -> tuple[dict[str, tuple[int, int]], int]:
    """Name -> (episodes it was seen in before the outcome, of which with the outcome)."""
    seen: dict[str, list[int]] = {}
    outcomes = 0
    for episode in episodes:
        names: set[str] = set()
        had_outcome = False
        for event in episode:
            if event.name == outcome:
                had_outcome = True
                break
            names.add(event.name or "")
        outcomes += had_outcome
        for name in names:
            counts = seen.setdefault(name, [0, 0])
            counts[0] += 1
            counts[1] += had_outcome
    return {name: (c[0], c[1]) for name, c in seen.items()}, outcomes


def _signal_report(
    name: str,
    declared: float | None,
    *,
    with_: int,
    hits: int,
    outcomes: int,
    episodes: int,
    strength: float,
    measure: str,
) -> SignalReport:
    misses = with_ - hits
    if with_ == 0:  # never seen: nothing to say
        return SignalReport(name, declared, 0, episodes, 0, 0.0, 0.0, (-strength, strength), 0.0)
    lift, score = lift_and_score(measure, hits, misses, outcomes, episodes)
    other = baseline(measure, hits, misses, outcomes, episodes)
    low, high = wilson(hits, with_)
    interval = (
        round(strength * rates_lift_and_score(measure, low, other)[1], 2),
        round(strength * rates_lift_and_score(measure, high, other)[1], 2),
    )
    return SignalReport(
        name,
        declared,
        with_,
        episodes - with_,
        hits,
        lift,
        score,
        interval,
        round(strength * score, 2),
    )


def wilson(successes: int, trials: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval of a proportion; endpoints can be exactly 0 or 1."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def report_to_dict(report: IntentReport) -> dict[str, object]:
    """The JSON form of an intent's report (`oracular tune --json`)."""
    return {
        "intent": report.intent,
        "outcome": report.outcome,
        "episodes": report.episodes,
        "outcomes": report.outcomes,
        "prior_strength": report.prior_strength,
        "measure": report.measure,
        "signals": [
            {
                "signal": s.name,
                "declared": s.declared,
                "episodes_with": s.with_episodes,
                "episodes_without": s.without_episodes,
                "hits": s.hits,
                "lift": s.lift,
                "score": s.score,
                "interval": list(s.interval),
                "suggested": s.suggested,
            }
            for s in report.signals
        ],
    }


def format_report(report: IntentReport) -> str:
    """The text table of `oracular tune`; a score column only where it differs from lift."""
    show_score = any(abs(s.score - s.lift) > 1e-12 for s in report.signals)
    head = ["signal", "declared", "with", "without", "hits", "lift"]
    head += ["score"] if show_score else []
    head += ["interval", "suggested"]
    rows = [head]
    for s in report.signals:
        row = [
            s.name,
            "-" if s.declared is None else f"{s.declared:g}",
            str(s.with_episodes),
            str(s.without_episodes),
            str(s.hits),
            f"{s.lift:.3f}",
        ]
        row += [f"{s.score:.3f}"] if show_score else []
        row += [f"[{s.interval[0]:.2f}, {s.interval[1]:.2f}]", f"{s.suggested:.2f}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        f"{report.intent} (outcome {report.outcome}): {report.outcomes} of {report.episodes} "
        f"episodes with the outcome; {report.measure}; priorStrength {report.prior_strength:g}",
        *(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in rows
        ),
    ]
    return "\n".join(lines)


def suggested_weights(reports: Iterable[IntentReport]) -> Mapping[str, Mapping[str, float]]:
    """Intent -> signal -> suggested weight, for declared and candidate signals."""
    return {r.intent: {s.name: s.suggested for s in r.signals} for r in reports}


SCALES: Final = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0)
"""The factors `compare` tries on the suggested weights."""


@dataclass(frozen=True, slots=True)
class Variant:
    """One set of weights for the declared signals, scored on the same events."""

    name: str
    """`config` (as written), `suggested` (tune's weights) or `fitted` (tune's weights times
    the factor of SCALES with the lowest Brier score on these events, per intent)."""
    weights: Mapping[str, Mapping[str, float]]
    """Intent -> declared signal -> weight."""
    scores: Mapping[str, IntentScore]
    """Intent -> its scores with these weights."""
    scale: Mapping[str, float] = field(default_factory=dict)
    """`fitted`: intent -> the factor chosen."""


def compare(
    config: EngineConfig, events: Sequence[Event], reports: Iterable[IntentReport]
) -> list[Variant]:
    """`tune --evaluate`: the config's weights, tune's suggestion, and the suggestion fitted to
    the config's prior and threshold, each evaluated (engine.evaluate) on `events`.

    tune's weights rank signals (their ratios), but their size is `priorStrength × score`:
    the evidence they add up to need not be what the intent's prior, priorWeight and threshold
    were set for, and a suggestion can lose every reveal. `fitted` multiplies them by the
    factor of SCALES whose replay has the lowest Brier score (per intent: intents learn and
    predict independently), on the same events: an in-sample fit, to be checked on other data.
    Only the declared signals change; candidates are left to the user.
    """
    suggested = {
        r.intent: {s.name: s.suggested for s in r.signals if s.declared is not None}
        for r in reports
    }
    declared = {n: dict(i.signals) for n, i in config.intents.items() if n in suggested}
    base = Variant("config", declared, _scores(config, events, declared))
    by_scale = {
        factor: (weights, _scores(config, events, weights))
        for factor in SCALES
        for weights in [
            {n: {s: round(w * factor, 2) for s, w in ws.items()} for n, ws in suggested.items()}
        ]
    }
    best = {
        intent: min(SCALES, key=lambda f: _brier(by_scale[f][1][intent])) for intent in suggested
    }
    fitted = Variant(
        "fitted",
        {intent: by_scale[f][0][intent] for intent, f in best.items()},
        {intent: by_scale[f][1][intent] for intent, f in best.items()},
        best,
    )
    as_suggested = Variant("suggested", by_scale[1.0][0], by_scale[1.0][1])
    return [base, as_suggested, fitted]


def _scores(
    config: EngineConfig, events: Sequence[Event], weights: Mapping[str, Mapping[str, float]]
) -> dict[str, IntentScore]:
    intents = {
        n: dataclasses.replace(i, signals=dict(weights.get(n, i.signals)))
        for n, i in config.intents.items()
    }
    result = evaluate(dataclasses.replace(config, intents=intents), events)
    return {s.intent: s for s in result.scores}


def _brier(score: IntentScore) -> float:
    return math.inf if math.isnan(score.brier) else score.brier


def format_comparison(variants: Sequence[Variant]) -> str:
    """The variants side by side per intent, and the weights of each."""
    lines = [
        "tune -> evaluate: the declared signals' weights as configured, as suggested, and as "
        "suggested times the factor with the lowest Brier score (fitted), each replayed on "
        "the same events",
        f"{'intent':<10} {'weights':<12} {'AUC':>6} {'Brier':>7} {'reveals':>8} "
        f"{'precision':>9} {'recall':>7}  weights",
    ]
    intents = sorted({i for v in variants for i in v.scores})
    for intent in intents:
        for variant in variants:
            score = variant.scores[intent]
            shown = ", ".join(f"{s}: {w:g}" for s, w in variant.weights.get(intent, {}).items())
            name = variant.name
            if intent in variant.scale:
                name += f" x{variant.scale[intent]:g}"
            lines.append(
                f"{intent:<10} {name:<12} {_fmt(score.auc):>6} {_fmt(score.brier, 4):>7} "
                f"{score.reveals:>8,} {_fmt(score.precision):>9} {_fmt(score.recall):>7}  "
                f"{{ {shown} }}"
            )
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"
