"""Scoring predictions against what happened: Brier, log loss, ROC AUC, calibration, reveals.

The events are replayed exactly as the stream processor would apply them. After every applied
event (other than the intent's own outcome), each intent with an outcome makes one prediction:
its `p` and `reveal` at that moment. The prediction is a *positive* when the intent's outcome
occurs later for the same user, in the same episode, or, for an intent with attribution, no
later than the episode's close + attribution. Episodes still open at the end of the data only
count outcomes that were observed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.learning import effective_weight
from engine.predict import predict
from engine.replay import END_OF_TIME, Event, Replayer, Step

BINS = 10
LOG_CLIP = 1e-15


@dataclass(slots=True)
class _Point:
    intent: str
    p: float
    reveal: bool
    index: int
    """Position in the user's stream: the outcome must come after it."""
    episode: int
    """started_at of the event's episode."""
    label: bool = False


@dataclass(frozen=True, slots=True)
class CalibrationBin:
    """Predictions with p in [low, high): how many, their mean p, how often the outcome came."""

    low: float
    high: float
    count: int
    mean_p: float
    observed: float


@dataclass(frozen=True, slots=True)
class IntentScore:
    """One intent's scores."""

    intent: str
    predictions: int
    positives: int
    brier: float
    log_loss: float
    auc: float | None
    """None when all predictions share one label (AUC is undefined)."""
    calibration: list[CalibrationBin]
    reveals: int
    precision: float | None
    recall: float | None


@dataclass
class Evaluation:
    """Per-intent scores plus the points behind them (for plots)."""

    scores: list[IntentScore]
    weights: dict[str, list[tuple[int, str, float]]] = field(default_factory=dict)
    """Intent -> (time, signal, effective weight) after each of its signals' events."""
    scored: dict[str, list[tuple[float, bool, bool]]] = field(default_factory=dict)
    """Intent -> (p, followed by the outcome, reveal) of each prediction scored."""


def evaluate(config: EngineConfig, events: Iterable[Event]) -> Evaluation:
    """Replay `events` and score every intent that has an outcome."""
    replayer = Replayer(config)
    intents = [name for name, intent in config.intents.items() if intent.outcome]
    points: dict[str, list[_Point]] = {}
    # (user, intent) -> (index in the user's stream, episode start, time) of each outcome
    outcomes: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    closes: dict[tuple[str, int], int] = {}  # (user, episode start) -> close time
    weights: dict[str, list[tuple[int, str, float]]] = {name: [] for name in intents}
    position: dict[str, int] = {}
    for event in events:
        step = replayer.feed(event)
        index = position[event.user] = position.get(event.user, -1) + 1
        if step.closed is not None:
            closes[(event.user, step.closed.started_at)] = step.closed.closed_at
        episode = step.state.episode.started_at
        if event.type != "event" or episode is None:
            continue
        for name in intents:
            if event.name == config.intents[name].outcome:
                outcomes.setdefault((event.user, name), []).append((index, episode, step.at))
                continue
            prediction = predict(step.state, name, step.at)
            points.setdefault(event.user, []).append(
                _Point(name, prediction.p, prediction.reveal, index, episode)
            )
            if event.name is not None and event.name in config.intents[name].signals:
                _record_weight(weights[name], step, name, event.name)
    for user, closed in replayer.close_due(END_OF_TIME):
        closes[(user, closed.started_at)] = closed.closed_at
    _label(config, points, outcomes, closes)
    by_intent = {
        name: [p for ps in points.values() for p in ps if p.intent == name] for name in intents
    }
    scores = [_score(name, by_intent[name]) for name in intents]
    scored = {name: [(p.p, p.label, p.reveal) for p in ps] for name, ps in by_intent.items()}
    return Evaluation(scores, weights, scored)


def _record_weight(out: list[tuple[int, str, float]], step: Step, intent: str, signal: str) -> None:
    config = step.state.config
    *_, weight = effective_weight(
        step.state.intents[intent], config.intents[intent], config.learning, signal, step.at
    )
    out.append((step.at, signal, weight))


def _label(
    config: EngineConfig,
    points: dict[str, list[_Point]],
    outcomes: dict[tuple[str, str], list[tuple[int, int, int]]],
    closes: dict[tuple[str, int], int],
) -> None:
    """Mark each point whose intent's outcome followed in time (see the module docstring)."""
    for user, user_points in points.items():
        for point in user_points:
            window = config.intents[point.intent].attribution_ms
            closed_at = closes.get((user, point.episode))
            for index, episode, at in outcomes.get((user, point.intent), ()):
                if index <= point.index:
                    continue
                if episode == point.episode or (
                    window is not None and (closed_at is None or at <= closed_at + window)
                ):
                    point.label = True
                    break


def _score(intent: str, points: list[_Point]) -> IntentScore:
    count = len(points)
    positives = sum(p.label for p in points)
    if count == 0:
        return IntentScore(intent, 0, 0, math.nan, math.nan, None, [], 0, None, None)
    brier = sum((p.p - p.label) ** 2 for p in points) / count
    log_loss = (
        -sum(math.log(min(max(p.p if p.label else 1 - p.p, LOG_CLIP), 1.0)) for p in points) / count
    )
    reveals = [p for p in points if p.reveal]
    true_reveals = sum(p.label for p in reveals)
    return IntentScore(
        intent,
        count,
        positives,
        brier,
        log_loss,
        roc_auc([(p.p, p.label) for p in points]),
        calibration(points),
        len(reveals),
        true_reveals / len(reveals) if reveals else None,
        true_reveals / positives if positives else None,
    )


def roc_auc(scored: list[tuple[float, bool]]) -> float | None:
    """Area under the ROC curve: the Mann-Whitney U statistic, ties counting a half."""
    positives = sum(label for _, label in scored)
    negatives = len(scored) - positives
    if positives == 0 or negatives == 0:
        return None
    ordered = sorted(scored, key=lambda item: item[0])
    rank_sum = 0.0
    i = 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:
            j += 1
        mean_rank = (i + 1 + j) / 2  # ranks i+1 .. j share their mean
        rank_sum += mean_rank * sum(label for _, label in ordered[i:j])
        i = j
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def roc_curve(scored: list[tuple[float, bool]]) -> list[tuple[float, float]]:
    """The ROC curve: (false positive rate, true positive rate) at each threshold on p, from
    (0, 0) to (1, 1); empty when one label is missing."""
    return [(fp, tp) for fp, tp, _ in _sweep(scored)]


def precision_recall_curve(scored: list[tuple[float, bool]]) -> list[tuple[float, float]]:
    """(recall, precision) at each threshold on p, the highest threshold first; empty when
    there is no positive."""
    return [(tp, precision) for _, tp, precision in _sweep(scored)[1:]]


def _sweep(scored: list[tuple[float, bool]]) -> list[tuple[float, float, float]]:
    """(fpr, tpr, precision) after admitting each distinct p, highest first (ties together)."""
    positives = sum(label for _, label in scored)
    negatives = len(scored) - positives
    if positives == 0 or negatives == 0:
        return []
    ordered = sorted(scored, key=lambda item: -item[0])
    out = [(0.0, 0.0, 1.0)]
    tp = fp = 0
    i = 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:
            tp += ordered[j][1]
            fp += not ordered[j][1]
            j += 1
        out.append((fp / negatives, tp / positives, tp / (tp + fp)))
        i = j
    return out


def calibration(points: list[_Point]) -> list[CalibrationBin]:
    """Ten bins of p: [0, 0.1), …, [0.9, 1.0]; empty bins are left out."""
    bins: list[list[_Point]] = [[] for _ in range(BINS)]
    for point in points:
        bins[min(int(point.p * BINS), BINS - 1)].append(point)
    return [
        CalibrationBin(
            i / BINS,
            (i + 1) / BINS,
            len(b),
            sum(p.p for p in b) / len(b),
            sum(p.label for p in b) / len(b),
        )
        for i, b in enumerate(bins)
        if b
    ]


def format_scores(evaluation: Evaluation) -> str:
    """The text report of `oracular evaluate`."""
    lines = []
    for s in evaluation.scores:
        auc = "n/a" if s.auc is None else f"{s.auc:.3f}"
        precision = "n/a" if s.precision is None else f"{s.precision:.3f}"
        recall = "n/a" if s.recall is None else f"{s.recall:.3f}"
        lines += [
            f"{s.intent}: {s.predictions} predictions, {s.positives} followed by the outcome",
            f"  brier {s.brier:.4f}  log loss {s.log_loss:.4f}  roc auc {auc}",
            f"  reveal: {s.reveals} reveals, precision {precision}, recall {recall}",
            "  calibration   bin        n  mean p  observed",
            *(
                f"              [{b.low:.1f},{b.high:.1f}) {b.count:5d}  {b.mean_p:.3f}   "
                f"{b.observed:.3f}"
                for b in s.calibration
            ),
        ]
    return "\n".join(lines)
