"""oracular evaluate's scores on a small hand-computed case."""

from __future__ import annotations

import itertools
import math

import pytest

from engine import Event
from engine.evaluate import evaluate, format_scores, roc_auc
from tests.engine.helpers import HOUR, MINUTE, MONDAY_10, config

T = MONDAY_10
P_S = (1.5 + 3) / (10 + 3)  # prior 0.15 × 10 plus the signal's 3: α = 4.5, β = 8.5


def _events():
    return [
        Event("u1", T, name="s"),
        Event("u1", T + 1, name="o"),
        Event("u1", T + 2, type="end"),
        Event("u2", T, name="s"),
        Event("u2", T + 1, name="page"),
        Event("u2", T + 2, type="end"),
        Event("u3", T, name="page"),
        Event("u3", T + 1, type="end"),
    ]


def test_hand_computed_scores():
    """Four predictions: u1's s (then the outcome), u2's s and page, u3's page."""
    cfg = config({"x": {"signals": {"s": 3}, "outcome": "o"}})
    [score] = evaluate(cfg, _events()).scores
    assert (score.predictions, score.positives) == (4, 1)
    points = [(P_S, 1), (P_S, 0), (P_S, 0), (0.15, 0)]
    assert score.brier == pytest.approx(sum((p - y) ** 2 for p, y in points) / 4)
    assert round(score.brier, 4) == 0.1724
    loss = -(math.log(P_S) + 2 * math.log(1 - P_S) + math.log(0.85)) / 4
    assert score.log_loss == pytest.approx(loss) and round(loss, 4) == 0.5183
    assert score.auc == pytest.approx(2 / 3)  # beats 0.15, ties the two other P_S
    assert [(b.low, b.count, round(b.observed, 4)) for b in score.calibration] == [
        (0.1, 1, 0.0),
        (0.3, 3, 0.3333),
    ]
    assert (score.reveals, score.precision, score.recall) == (0, None, 0.0)
    assert "roc auc 0.667" in format_scores(evaluate(cfg, _events()))


def test_attribution_window_counts_a_later_episode_as_positive():
    """With attribution, an outcome after the close but inside the window labels the event."""
    events = [
        Event("u1", T, name="s"),
        Event("u1", T + MINUTE, type="end"),
        Event("u1", T + HOUR, name="o"),
    ]
    plain = config({"x": {"signals": {"s": 3}, "outcome": "o"}})
    held = config({"x": {"signals": {"s": 3}, "outcome": "o", "attribution": "1d"}})
    assert evaluate(plain, events).scores[0].positives == 0
    assert evaluate(held, events).scores[0].positives == 1
    late = [*events[:2], Event("u1", T + MINUTE + 25 * HOUR, name="o")]
    assert evaluate(held, late).scores[0].positives == 0


def test_reveal_precision_and_recall():
    """A reveal followed by the outcome is a true positive."""
    cfg = config(
        {
            "x": {
                "signals": {"s": 10},
                "outcome": "o",
                "prior": 0.5,
                "priorWeight": 2,
                "threshold": 0.6,
            }
        }
    )
    events = [
        Event("u1", T, name="s"),
        Event("u1", T + 1, name="o"),
        Event("u2", T, name="s"),
        Event("u2", T + 1, type="end"),
    ]
    [score] = evaluate(cfg, events).scores
    assert (score.reveals, score.precision, score.recall) == (2, 0.5, 1.0)


@pytest.mark.parametrize(
    ("scored", "auc"),
    [
        ([(0.9, True), (0.1, False)], 1.0),
        ([(0.1, True), (0.9, False)], 0.0),
        ([(0.5, True), (0.5, False)], 0.5),
        ([(0.2, True), (0.1, False), (0.3, False)], 0.5),
        ([(0.5, True)], None),
    ],
)
def test_roc_auc(scored, auc):
    """Mann-Whitney AUC, ties counting a half; undefined with one class."""
    assert roc_auc(scored) == auc


def test_roc_and_precision_recall_curves():
    from engine.evaluate import precision_recall_curve, roc_curve

    scored = [(0.9, True), (0.8, False), (0.8, True), (0.3, False), (0.1, True)]
    assert roc_curve(scored) == [(0.0, 0.0), (0.0, 1 / 3), (0.5, 2 / 3), (1.0, 2 / 3), (1.0, 1.0)]
    assert precision_recall_curve(scored) == [
        (1 / 3, 1.0),
        (2 / 3, 2 / 3),
        (2 / 3, 0.5),
        (1.0, 0.6),
    ]
    assert roc_curve([(0.5, True)]) == [] and precision_recall_curve([(0.5, False)]) == []
    # The area under the ROC curve's steps (trapezoids: ties count a half) is roc_auc's.
    curve = roc_curve(scored)
    area = sum((x2 - x1) * (y1 + y2) / 2 for (x1, y1), (x2, y2) in itertools.pairwise(curve))
    assert area == pytest.approx(roc_auc(scored))


def test_the_evaluation_keeps_every_scored_prediction_for_the_plots():
    events = [
        Event(user="u1", name="a", at=MONDAY_10),
        Event(user="u1", name="b", at=MONDAY_10 + MINUTE),
        Event(user="u1", name="o", at=MONDAY_10 + 2 * MINUTE),
        Event(user="u2", name="a", at=MONDAY_10 + HOUR),
    ]
    result = evaluate(config({"x": {"signals": {"a": 2, "b": 1}, "outcome": "o"}}), events)
    [score] = result.scores
    assert len(result.scored["x"]) == score.predictions
    assert sum(label for _, label, _ in result.scored["x"]) == score.positives
