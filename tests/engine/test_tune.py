"""oracular tune's numbers on a small hand-computed history."""

from __future__ import annotations

import pytest

from engine import Event
from engine.tune import format_report, report_to_dict, tune, wilson
from tests.engine.helpers import HOUR, MINUTE, MONDAY_10, config

CFG = config({"x": {"signals": {"a": 2}, "outcome": "o"}}, episodeTimeout="30m")


def _history():
    """Six episodes (gaps of an hour close them), three with the outcome.

    u1: [a, o] [a, b]    u2: [b, o] [c]    u3: [a, o, c] [b]
    a is seen in 3 episodes, 2 with the outcome; b in 3, 1 with it; c in 1 (u3's c comes
    after the outcome: neutral).
    """
    plan = {
        "u1": [["a", "o"], ["a", "b"]],
        "u2": [["b", "o"], ["c"]],
        "u3": [["a", "o", "c"], ["b"]],
    }
    events = []
    for user, sessions in plan.items():
        at = MONDAY_10
        for names in sessions:
            for name in names:
                events.append(Event(user, at, name=name))
                at += MINUTE
            at += HOUR
    return events


def test_hand_computed_suggestions_and_intervals():
    """Suggested weights and 95% Wilson intervals as weights (priorStrength = |w0| = 2)."""
    [report] = tune(CFG, _history(), min_episodes=2)
    assert (report.episodes, report.outcomes, report.prior_strength) == (6, 3, 2)
    a, b = report.signals
    # a: q = (2+1)/(3+2) = 0.6 against b = (3-2+1)/(3+2) = 0.4 -> (0.6-0.4)/0.6 = 1/3.
    assert (a.name, a.declared, a.with_episodes, a.without_episodes, a.hits) == ("a", 2, 3, 3, 2)
    assert a.lift == pytest.approx(1 / 3) and a.score == pytest.approx(1 / 3)
    assert a.suggested == 0.67
    # Wilson(2 of 3) = [0.2077, 0.9385]: (0.2077-0.4)/0.4 and (0.9385-0.4)/0.6, times 2.
    assert a.interval == (-0.96, 1.80)
    # b (a candidate): q = 0.4 against 0.6 -> -1/3; its interval mirrors a's.
    assert (b.name, b.declared, b.with_episodes, b.hits) == ("b", None, 3, 1)
    assert b.suggested == -0.67 and b.interval == (-1.80, 0.96)
    # c was seen (before an outcome) in one episode only: not a candidate at min_episodes=2.
    assert [s.name for s in report.signals] == ["a", "b"]


def test_names_after_the_outcome_are_neutral():
    """c after u3's outcome does not count as seen in that episode."""
    [report] = tune(CFG, _history(), min_episodes=1)
    c = next(s for s in report.signals if s.name == "c")
    assert (c.with_episodes, c.hits) == (1, 0)  # only u2's second episode


def test_ratio_measure_shows_a_score_column_and_stays_in_bounds():
    """With risk-ratio the score differs from the raw lift: the table shows both."""
    cfg = config(
        {"x": {"signals": {"a": 2}, "outcome": "o"}},
        episodeTimeout="30m",
        learning={"lift": "risk-ratio"},
    )
    [report] = tune(cfg, _history(), min_episodes=2)
    a = report.signals[0]
    assert a.lift == pytest.approx(0.6 / 0.4) and a.score == pytest.approx(0.2)
    assert all(-2 <= end <= 2 for s in report.signals for end in s.interval)
    table = format_report(report)
    assert "score" in table.splitlines()[1] and "lift" in table.splitlines()[1]
    assert "score" not in format_report(tune(CFG, _history(), min_episodes=2)[0]).splitlines()[1]
    as_json = report_to_dict(report)
    assert as_json["signals"][0]["lift"] == a.lift and as_json["signals"][0]["score"] == a.score


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (2, 3, 0.2077, 0.9385),
        (0, 5, 0.0, 0.4345),
        (5, 5, 0.5655, 1.0),
        (0, 0, 0.0, 1.0),
    ],
)
def test_wilson_interval(k, n, low, high):
    """Wilson endpoints, exactly 0 or 1 at the extremes."""
    got = wilson(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_other_intents_outcomes_are_not_offered_as_signals():
    cfg = config(
        {
            "x": {"signals": {"a": 1}, "outcome": "o"},
            "y": {"signals": {"b": 1}, "outcome": "p"},
        }
    )
    events = []
    for n in range(8):
        start = MONDAY_10 + n * 2 * HOUR
        events += [
            Event(user=f"u{n}", name="a", at=start),
            Event(user=f"u{n}", name="p", at=start + MINUTE),
            Event(user=f"u{n}", name="o", at=start + 2 * MINUTE),
        ]
    names = {r.intent: [s.name for s in r.signals] for r in tune(cfg, events, min_episodes=1)}
    assert names["x"] == ["a"]  # `p`, y's outcome, is no candidate for x
    assert names["y"] == ["b", "a"]  # `o` came after `p`: neutral; `a` before it: a candidate


def test_compare_evaluates_the_config_the_suggestion_and_the_fitted_scale():
    from engine.evaluate import evaluate
    from engine.tune import SCALES, compare, format_comparison

    cfg = config({"x": {"signals": {"a": 1, "b": 1}, "outcome": "o", "threshold": 0.3}})
    events = []
    for n in range(12):
        start = MONDAY_10 + n * 2 * HOUR
        events += [Event(user=f"u{n}", name="a" if n % 3 else "b", at=start)]
        if n % 3:
            events += [Event(user=f"u{n}", name="o", at=start + MINUTE)]
    reports = tune(cfg, events, min_episodes=1)
    config_, suggested, fitted = compare(cfg, events, reports)
    assert [v.name for v in (config_, suggested, fitted)] == ["config", "suggested", "fitted"]
    assert config_.scores["x"] == evaluate(cfg, events).scores[0]
    assert suggested.weights["x"] == {s.name: s.suggested for s in reports[0].signals}
    factor = fitted.scale["x"]
    assert factor in SCALES
    assert fitted.weights["x"] == {
        n: round(w * factor, 2) for n, w in suggested.weights["x"].items()
    }
    assert fitted.scores["x"].brier <= suggested.scores["x"].brier
    text = format_comparison([config_, suggested, fitted])
    assert f"x          fitted x{factor:g}" in text
