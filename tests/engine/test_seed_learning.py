"""Every number of the original engine's documented learning rules (engine/README.md, "The
model"), reached through observe/end_episode/explain.

Expected values are the original's (rounded as it printed them) and the exact fractions they
come from; the exact ones are asserted at rel=1e-12 because the engine computes them in float64
from whole counts (no decay is configured here).
"""

from __future__ import annotations

import math

import pytest

from engine import explain
from tests.engine.helpers import MONDAY_10, config, sessions

A_SESSION = ("signal.a", "outcome")  # A seen, outcome follows
B_SESSION = ("signal.b",)  # B seen, nothing follows
NEITHER = ("page.viewed",)  # a session with neither signal nor outcome
AB = {"signals": {"signal.a": 1, "signal.b": 1}, "outcome": "outcome"}


def _worked_example(prior_episodes: float | None = None):
    learning = {} if prior_episodes is None else {"learning": {"priorEpisodes": prior_episodes}}
    cfg = config({"x": AB}, **learning)
    # Twenty sessions, interleaved: ten with A and the outcome, ten with B and nothing.
    state = sessions(cfg, [(1, A_SESSION), (1, B_SESSION)] * 10)
    return explain(state, "x", at=MONDAY_10 + 30 * 3_600_000)


@pytest.mark.parametrize(
    ("prior_episodes", "signal", "seed_value", "exact"),
    [
        (None, "signal.a", 1.27, 14 / 11),  # k = 10: "A counts 27% more than you said"
        (None, "signal.b", 0.06, 2 / 33),  # k = 10: "B has all but vanished"
        (2, "signal.a", 1.58, 122 / 77),  # "With priorEpisodes: 2 the same history gives A 1.58"
        (50, "signal.a", 1.07, 650 / 605),  # "with 50 it gives 1.07"
    ],
)
def test_worked_example_effective_weights(prior_episodes, signal, seed_value, exact):
    """The original's worked example: twenty sessions, A always followed by the outcome, B never."""
    got = _worked_example(prior_episodes).signals[signal].effective
    assert round(got, 2) == seed_value
    assert got == pytest.approx(exact, rel=1e-12)


def test_worked_example_intermediate_values():
    """hits/misses, learned ±1.82 and the base rate of the worked example."""
    result = _worked_example()
    a, b = result.signals["signal.a"], result.signals["signal.b"]
    assert (a.hits, a.misses, b.hits, b.misses) == (10, 0, 0, 10)
    assert (result.episodes.hits, result.episodes.misses) == (10, 10)
    assert round(a.lift, 3) == 0.909 and round(b.lift, 3) == -0.909
    assert round(a.learned, 2) == 1.82 and round(b.learned, 2) == -1.82


@pytest.mark.parametrize("w0", [1.0, 3.0, -2.0])
def test_one_confirmed_session_then_five_without_moves_weight_by_1_017(w0):
    """Early-episode learning: A + outcome once, then five sessions with neither."""
    cfg = config({"x": {"signals": {"signal.a": w0}, "outcome": "outcome"}})
    state = sessions(cfg, [(1, A_SESSION), (5, NEITHER)])
    a = explain(state, "x", at=MONDAY_10 + 10 * 3_600_000).signals["signal.a"]
    assert round(a.lift, 2) == 0.61  # qWith = 2/3, qWithout = 1/7
    assert a.learned == pytest.approx(2 * abs(w0) * 11 / 18, rel=1e-12)  # 1.22 × |w0|
    expected = (10 * w0 + (5 / 6) * a.learned) / (10 + 5 / 6)
    assert a.effective == pytest.approx(expected, rel=1e-12)
    if w0 > 0:
        assert round(a.effective / w0, 3) == 1.017


@pytest.mark.parametrize("confirmed", [1, 2, 3, 7])
def test_confirmed_sessions_without_contrast_keep_the_initial_weight_exactly(confirmed):
    """Nothing drifts after outcomes while no session lacks the signal: nEff is 0."""
    cfg = config({"x": {"signals": {"signal.a": 1.5}, "outcome": "outcome"}})
    state = sessions(cfg, [(confirmed, A_SESSION)])
    a = explain(state, "x", at=MONDAY_10 + 20 * 3_600_000).signals["signal.a"]
    assert a.hits == confirmed
    assert a.effective == 1.5  # exactly w0


@pytest.mark.parametrize("learning", [{}, {"halfLife": "30d"}, {"lift": "odds-ratio"}])
def test_signal_present_in_every_episode_keeps_its_initial_weight(learning):
    """app.opened fires in every session, with and without the outcome: it never learns."""
    cfg = config(
        {"x": {"signals": {"app.opened": 0.5, "signal.a": 1}, "outcome": "outcome"}},
        learning=learning,
    )
    plan = [
        (3, ("app.opened", "signal.a", "outcome")),
        (4, ("app.opened",)),
        (2, ("app.opened", "outcome")),
    ]
    state = sessions(cfg, plan)
    result = explain(state, "x", at=MONDAY_10 + 12 * 3_600_000)
    opened = result.signals["app.opened"]
    assert opened.hits + opened.misses == pytest.approx(
        result.episodes.hits + result.episodes.misses, rel=1e-12
    )
    assert opened.effective == 0.5
    assert result.signals["signal.a"].effective != 1  # the discriminating signal did learn


def test_signal_never_present_has_nothing_to_learn():
    """Absent but never present: learned is 0 and the weight stands."""
    cfg = config({"x": AB})
    state = sessions(cfg, [(4, ("signal.a", "outcome")), (3, NEITHER)])
    b = explain(state, "x", at=MONDAY_10 + 9 * 3_600_000).signals["signal.b"]
    assert (b.hits, b.misses, b.learned, b.effective) == (0, 0, 0, 1)


def test_association_rule_example_gives_27_over_16():
    """Two successful signal episodes, three unsuccessful ones without it: lift 27/16."""
    cfg = config(
        {"x": {"signals": {"signal.a": 1}, "outcome": "outcome"}},
        learning={"lift": "association-rule"},
    )
    state = sessions(cfg, [(2, A_SESSION), (3, NEITHER)])
    a = explain(state, "x", at=MONDAY_10 + 6 * 3_600_000).signals["signal.a"]
    assert a.lift == pytest.approx(27 / 16, rel=1e-12)
    assert a.score == pytest.approx((27 / 16 - 1) / (27 / 16 + 1), rel=1e-12)
    assert a.learned == pytest.approx(2 * a.score, rel=1e-12)


# History "up": 2 sessions with A and the outcome, 2 sessions with neither -> q = 3/4, b = 1/4.
# History "down": 2 sessions with A and no outcome, 2 with only the outcome -> q = 1/4, b = 3/4.
UP = [(2, A_SESSION), (2, NEITHER)]
DOWN = [(2, ("signal.a",)), (2, ("outcome",))]
LN3 = math.log(3)


@pytest.mark.parametrize(
    ("measure", "history", "raw", "score"),
    [
        ("normalized-difference", UP, 2 / 3, 2 / 3),  # (q − b) / (1 − b)
        ("normalized-difference", DOWN, -2 / 3, -2 / 3),  # (q − b) / b
        ("absolute-difference", UP, 0.5, 0.5),  # q − b
        ("relative-lift", UP, 2.0, 2 / 3),  # (q − b) / b = 2 -> 2 / (1 + 2)
        ("relative-lift", DOWN, -2 / 3, -0.4),  # raw minimum is −1, so the score stays > −0.5
        ("risk-ratio", UP, 3.0, 0.5),  # by definition: a ratio of 3 gives a score of 0.5
        ("risk-ratio", DOWN, 1 / 3, -0.5),  # by definition: a ratio of 1/3 gives −0.5
        ("log-lift", UP, LN3, LN3 / (1 + LN3)),  # ln 3 -> x / (1 + |x|)
        ("odds-ratio", UP, 9.0, 0.8),  # (3/4 / 1/4) / (1/4 / 3/4) = 9 -> 8/10
        ("odds-ratio", DOWN, 1 / 9, -0.8),
        ("association-rule", UP, 1.5, 0.2),  # q / P(B), P(B) = (2 + 2) / (4 + 4)
    ],
)
def test_each_lift_measure_and_its_evidence_score(measure, history, raw, score):
    """The lift table: raw measure and evidence score for every measure, via explain."""
    cfg = config(
        {"x": {"signals": {"signal.a": 1}, "outcome": "outcome"}}, learning={"lift": measure}
    )
    state = sessions(cfg, history)
    a = explain(state, "x", at=MONDAY_10 + 6 * 3_600_000).signals["signal.a"]
    assert a.lift == pytest.approx(raw, rel=1e-12)
    assert a.score == pytest.approx(score, rel=1e-12)
    assert a.learned == pytest.approx(2 * score, rel=1e-12)  # gain 2 × |w0| 1 × score


@pytest.mark.parametrize(
    "measure", ["relative-lift", "risk-ratio", "log-lift", "odds-ratio", "association-rule"]
)
def test_ratio_measures_stay_finite_at_extreme_rates(measure):
    """The ε clamp keeps ratio and log measures finite when smoothed counts are huge."""
    from engine.lift import lift_and_score

    for hits, misses, outcomes, episodes in [(1e300, 0, 1e300, 1e300), (0, 1e300, 0, 1e300)]:
        raw, score = lift_and_score(measure, hits, misses, outcomes, episodes)
        assert math.isfinite(raw) and -1 <= score <= 1


@pytest.mark.parametrize("gain", [0.0, 0.5, 2.0, 3.0])
def test_learned_estimate_is_capped_by_gain(gain):
    """learned lives in [−gain·|w0|, gain·|w0|], whatever the history."""
    cfg = config(
        {"x": {"signals": {"signal.a": -2}, "outcome": "outcome"}}, learning={"gain": gain}
    )
    state = sessions(cfg, [(30, A_SESSION), (30, NEITHER)])
    a = explain(state, "x", at=MONDAY_10 + 70 * 3_600_000).signals["signal.a"]
    assert abs(a.learned) <= gain * 2 + 1e-12
    assert a.learned == pytest.approx(gain * 2 * a.score, rel=1e-12)
