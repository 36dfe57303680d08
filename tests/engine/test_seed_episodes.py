"""The original engine's documented episode rules and attribution table (engine/README.md,
"The model"), through the public API."""

from __future__ import annotations

import pytest

from engine import (
    SignalRecord,
    create_state,
    end_episode,
    episode_closed,
    explain,
    observe,
    observe_transition,
    predict,
)
from tests.engine.helpers import DAY, HOUR, MINUTE, MONDAY_10, QUICKSTART, WEEK, config, session

ATTRIBUTED = {**QUICKSTART, "attribution": "14d"}


def _monday_session(cfg):
    """Monday 10:00 a session with pricing.viewed and limit.hit, ending at 10:10."""
    state = create_state(cfg)
    state = observe(state, "pricing.viewed", MONDAY_10)
    state = observe(state, "limit.hit", MONDAY_10 + 5 * MINUTE)
    return end_episode(state, MONDAY_10 + 10 * MINUTE)


@pytest.mark.parametrize(
    ("upgrade_after", "share", "hits", "misses", "with_outcome", "without"),
    [
        (1 * DAY, 0.906, 0.906, 0.094, 1.906, 0.094),  # Tuesday 10:10
        (3 * DAY, 0.743, 0.743, 0.257, 1.743, 0.257),  # Thursday 10:10
        (7 * DAY, 0.500, 0.500, 0.500, 1.500, 0.500),  # next Monday 10:10
        (14 * DAY, 0.250, 0.250, 0.750, 1.250, 0.750),  # two Mondays later: still in window
    ],
)
def test_attribution_table_row(upgrade_after, share, hits, misses, with_outcome, without):
    """The attribution table: the upgrade arrives later, in a session of its own."""
    cfg = config({"upgrade": ATTRIBUTED})
    closed_at = MONDAY_10 + 10 * MINUTE
    state = _monday_session(cfg)
    arrives = closed_at + upgrade_after
    state = observe(state, "upgrade.completed", arrives)
    result = explain(state, "upgrade", at=arrives)
    for signal in ("pricing.viewed", "limit.hit"):
        record = state.intents["upgrade"].learned[signal]
        assert round(record.hits, 3) == hits and round(record.misses, 3) == misses
        assert result.signals[signal].hits == pytest.approx(2 ** (-upgrade_after / WEEK))
    assert round(result.signals["pricing.viewed"].hits, 3) == share
    episodes = state.intents["upgrade"].episodes
    assert round(episodes.hits, 3) == with_outcome and round(episodes.misses, 3) == without
    assert state.intents["upgrade"].pending == []


def test_attribution_table_never_row_window_passes():
    """No upgrade: once the 14-day window passes, Monday's session is a plain miss."""
    cfg = config({"upgrade": ATTRIBUTED})
    state = _monday_session(cfg)
    window_end = MONDAY_10 + 10 * MINUTE + 2 * WEEK
    at_end = explain(state, "upgrade", at=window_end)  # age == attribution: still held
    assert (at_end.episodes.hits, at_end.episodes.misses) == (0, 0)
    after = explain(state, "upgrade", at=window_end + 1)  # reads settle, store nothing
    pricing = after.signals["pricing.viewed"]
    assert (pricing.hits, pricing.misses) == (0.0, 1.0)
    assert (after.episodes.hits, after.episodes.misses) == (0.0, 1.0)
    assert state.intents["upgrade"].episodes.misses == 0  # the read stored nothing
    stored = observe(state, "page.viewed", window_end + 1)  # the next observe stores it
    assert stored.intents["upgrade"].learned["pricing.viewed"].misses == 1.0
    assert stored.intents["upgrade"].episodes.misses == 1.0
    assert stored.intents["upgrade"].pending == []


def test_expired_window_miss_is_dated_at_the_window_end():
    """With learning.halfLife the expired miss decays from the window's end, not the read."""
    cfg = config({"upgrade": ATTRIBUTED}, learning={"halfLife": "30d"})
    state = _monday_session(cfg)
    window_end = MONDAY_10 + 10 * MINUTE + 2 * WEEK
    later = window_end + 30 * DAY
    result = explain(state, "upgrade", at=later)
    assert result.episodes.misses == pytest.approx(0.5, rel=1e-12)
    stored = observe(state, "page.viewed", later)
    # Stored counts are valued at the moment they last changed: the miss, at the window end.
    assert stored.intents["upgrade"].episodes == SignalRecord(0.0, 1.0, window_end)
    assert explain(stored, "upgrade", at=later).episodes.misses == pytest.approx(0.5, rel=1e-12)


def test_attribution_holds_at_the_close_so_the_misses_difference_is_zero():
    """For an intent with attribution the misses difference is 0 at the close."""
    cfg = config({"upgrade": ATTRIBUTED, "plain": QUICKSTART})
    prev = observe(create_state(cfg), "pricing.viewed", MONDAY_10)
    nxt = end_episode(prev, MONDAY_10 + 10 * MINUTE)
    assert episode_closed(prev, nxt)
    held = nxt.intents["upgrade"]
    assert held.episodes.misses - prev.intents["upgrade"].episodes.misses == 0
    assert held.learned["pricing.viewed"].misses == 0
    assert [(p.closed_at, p.signals) for p in held.pending] == [
        (MONDAY_10 + 10 * MINUTE, ["pricing.viewed"])
    ]
    plain = nxt.intents["plain"]
    assert plain.episodes.misses - prev.intents["plain"].episodes.misses == 1
    assert plain.learned["pricing.viewed"].misses == 1 and plain.learned["limit.hit"].misses == 0


def test_at_most_32_episodes_wait_and_the_oldest_overflows_as_a_miss():
    """The 33rd held episode pushes the oldest out as a miss at once."""
    cfg = config({"upgrade": ATTRIBUTED})
    state = create_state(cfg)
    for i in range(32):
        state = session(state, MONDAY_10 + i * HOUR, ["pricing.viewed"])
    assert len(state.intents["upgrade"].pending) == 32
    assert state.intents["upgrade"].episodes.misses == 0
    first_closed = state.intents["upgrade"].pending[0].closed_at
    state = session(state, MONDAY_10 + 32 * HOUR, ["limit.hit"])
    upgrade = state.intents["upgrade"]
    assert len(upgrade.pending) == 32
    assert upgrade.pending[0].closed_at > first_closed
    assert upgrade.episodes.misses == 1
    assert upgrade.learned["pricing.viewed"].misses == 1  # the oldest held pricing.viewed
    assert upgrade.learned["limit.hit"].misses == 0  # the newest is still held


def test_idle_gap_closes_the_old_episode_at_the_moment_it_timed_out():
    """episodeTimeout 30m: an event 31 minutes later closes the old episode at +30m first."""
    cfg = config({"upgrade": QUICKSTART}, episodeTimeout="30m", learning={"halfLife": "30m"})
    prev = observe(create_state(cfg), "pricing.viewed", MONDAY_10)
    step = observe_transition(prev, "limit.hit", MONDAY_10 + 31 * MINUTE)
    nxt = step.state
    assert episode_closed(prev, nxt)
    assert step.closed is not None and step.closed.closed_at == MONDAY_10 + 30 * MINUTE
    assert step.closed.reason == "timeout"
    assert nxt.episode.started_at == MONDAY_10 + 31 * MINUTE  # the new event opened the next
    assert nxt.intents["upgrade"].episodes.misses - prev.intents["upgrade"].episodes.misses == 1
    # The miss is dated at the timeout: one learning half-life (30m) after +30m it counts half.
    later = explain(nxt, "upgrade", at=MONDAY_10 + 60 * MINUTE)
    assert later.episodes.misses == pytest.approx(0.5, rel=1e-12)
    assert later.signals["pricing.viewed"].misses == pytest.approx(0.5, rel=1e-12)
    assert nxt.intents["upgrade"].seen == {"limit.hit": 1}  # the new episode saw only limit.hit


def test_gap_exactly_equal_to_the_timeout_does_not_close():
    """Only a gap *longer* than episodeTimeout closes the episode."""
    cfg = config({"upgrade": QUICKSTART}, episodeTimeout="30m")
    prev = observe(create_state(cfg), "pricing.viewed", MONDAY_10)
    nxt = observe(prev, "limit.hit", MONDAY_10 + 30 * MINUTE)
    assert not episode_closed(prev, nxt)
    assert nxt.episode.started_at == MONDAY_10
    assert nxt.intents["upgrade"].seen == {"pricing.viewed": 1, "limit.hit": 1}


def test_episode_closed_across_end_episode_and_not_without_an_episode():
    """episode_closed is true across end_episode; end_episode with nothing open changes nothing."""
    cfg = config({"upgrade": QUICKSTART})
    fresh = create_state(cfg)
    assert end_episode(fresh, MONDAY_10) is fresh
    assert not episode_closed(fresh, end_episode(fresh, MONDAY_10))
    opened = observe(fresh, "page.viewed", MONDAY_10)
    assert not episode_closed(fresh, opened)
    ended = end_episode(opened, MONDAY_10 + MINUTE)
    assert episode_closed(opened, ended) and ended.episode.started_at is None


def test_close_without_outcome_misses_seen_signals_once_and_counts_the_episode():
    """Every seen signal takes one miss however often it occurred; signal-less episodes count."""
    cfg = config({"upgrade": QUICKSTART})
    state = session(create_state(cfg), MONDAY_10, ["pricing.viewed"] * 3)
    state = session(state, MONDAY_10 + HOUR, ["page.viewed"])  # saw no signal at all
    upgrade = state.intents["upgrade"]
    assert upgrade.learned["pricing.viewed"].misses == 1
    assert upgrade.learned["limit.hit"].misses == 0
    assert (upgrade.episodes.hits, upgrade.episodes.misses) == (0, 2)


def test_outcome_hits_seen_signals_resolves_and_later_signals_are_neutral():
    """Outcome: hits, base-rate hit, seen cleared; a signal after it is neutral at the close."""
    cfg = config({"upgrade": QUICKSTART})
    state = create_state(cfg)
    state = observe(state, "pricing.viewed", MONDAY_10)
    state = observe(state, "pricing.viewed", MONDAY_10 + MINUTE)
    state = observe(state, "upgrade.completed", MONDAY_10 + 2 * MINUTE)
    upgrade = state.intents["upgrade"]
    assert upgrade.learned["pricing.viewed"].hits == 1  # once per episode
    assert upgrade.episodes.hits == 1 and upgrade.seen == {} and upgrade.resolved
    assert upgrade.last_outcome_at == MONDAY_10 + 2 * MINUTE
    state = observe(state, "limit.hit", MONDAY_10 + 3 * MINUTE)
    state = end_episode(state, MONDAY_10 + 4 * MINUTE)
    upgrade = state.intents["upgrade"]
    assert upgrade.learned["limit.hit"].hits == 0 and upgrade.learned["limit.hit"].misses == 0
    assert (upgrade.episodes.hits, upgrade.episodes.misses) == (1, 0)


def test_second_outcome_in_an_episode_hits_the_signals_seen_since_the_first():
    """Neutral signals get a hit if a second outcome arrives; one more episode counts."""
    cfg = config({"upgrade": QUICKSTART})
    state = session(
        create_state(cfg),
        MONDAY_10,
        ["pricing.viewed", "upgrade.completed", "limit.hit", "upgrade.completed"],
    )
    upgrade = state.intents["upgrade"]
    assert upgrade.learned["pricing.viewed"].hits == 1 and upgrade.learned["limit.hit"].hits == 1
    assert upgrade.episodes.hits == 2


def test_outcome_that_no_episode_preceded_still_counts():
    """An outcome as a user's very first event counts one episode with the outcome."""
    cfg = config({"upgrade": QUICKSTART})
    state = observe(create_state(cfg), "upgrade.completed", MONDAY_10)
    assert state.intents["upgrade"].episodes.hits == 1
    state = end_episode(state, MONDAY_10 + MINUTE)
    assert state.intents["upgrade"].episodes.misses == 0  # resolved: no miss at the close


def test_event_that_is_both_signal_and_outcome_is_never_seen():
    """It cannot learn from itself: no evidence, never in the seen list."""
    cfg = config({"x": {"signals": {"buy": 2, "cart": 1}, "outcome": "buy"}})
    state = observe(create_state(cfg), "buy", MONDAY_10)
    x = state.intents["x"]
    assert x.seen == {} and x.evidence == {} and x.episodes.hits == 1
    assert x.learned["buy"].hits == 0
    assert predict(state, "x", MONDAY_10).p == pytest.approx(0.15)


def test_repeats_within_an_episode_add_less():
    """The n-th occurrence adds effective weight / n; an outcome restarts the count."""
    cfg = config({"x": {"signals": {"s": 1}, "outcome": "o", "resetOnOutcome": False}})
    state = create_state(cfg)
    alphas = []
    for i, name in enumerate(["s", "s", "s", "o", "s"]):
        state = observe(state, name, MONDAY_10 + i)
        alphas.append(predict(state, "x", MONDAY_10 + i).alpha)
    added = [round(b - a, 12) for a, b in zip([1.5, *alphas], alphas, strict=False)]
    assert added == [1.0, 0.5, round(1 / 3, 12), 0.0, 1.0]


def test_intent_without_outcome_never_learns():
    """No outcome: nothing is judged and the weights stay initial."""
    cfg = config({"x": {"signals": {"s": 2}}})
    state = session(create_state(cfg), MONDAY_10, ["s", "s"])
    state = session(state, MONDAY_10 + HOUR, ["other"])
    x = explain(state, "x", at=MONDAY_10 + 2 * HOUR)
    assert (x.episodes.hits, x.episodes.misses) == (0, 0)
    assert x.signals["s"].effective == 2 and x.signals["s"].misses == 0
