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
