"""A user's lifecycle on the processor alone: `stateTtl` expires users who went quiet.

The rule (docs/lifecycle.md): a user whose newest event time is more than the TTL behind an
input of theirs, or behind their partition's watermark at a tick, has expired. Its open
episode closes as the timer closes it, its state is deleted, and a later event starts a new
user. Live (ticks at any point) and the replay give the same outputs and keep the same users.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import END_OF_TIME, ConfigError, EngineConfig, Event
from streams.runtime.processor import TimePolicy

from .test_time import MIN, NAMES, TS, Live, replayed

HOUR = 60 * MIN
TTL = 6 * HOUR


def ttl_config(ttl: str = "6h", **extra) -> EngineConfig:
    return EngineConfig.from_dict(
        {
            "episodeTimeout": "30m",
            "stateTtl": ttl,
            "intents": {
                "upgrade": {
                    "signals": {"pricing.viewed": 3, "limit.hit": 2},
                    "outcome": "upgrade.completed",
                    "halfLife": "7d",
                    **extra,
                }
            },
        }
    )


CONFIG = ttl_config()


def live(config: EngineConfig = CONFIG, lateness: int = 2 * MIN) -> Live:
    return Live(TimePolicy(lateness_ms=lateness, idle_ms=END_OF_TIME), config)


def quiet_and_active() -> list[Event]:
    """`q` is active for an hour, then quiet; `a` keeps going for a day."""
    events = [Event("q", TS + n * 10 * MIN, name="pricing.viewed", id=f"q{n}") for n in range(6)]
    events += [Event("a", TS + n * HOUR, name="limit.hit", id=f"a{n}") for n in range(24)]
    return sorted(events, key=lambda e: e.at)


# --- the config ----------------------------------------------------------------------------


def test_state_ttl_is_read_written_back_and_off_by_default():
    assert CONFIG.state_ttl_ms == TTL
    assert EngineConfig.from_dict(CONFIG.to_dict()) == CONFIG
    plain = EngineConfig.from_dict({"episodeTimeout": "30m", "intents": {"i": {"signals": {}}}})
    assert plain.state_ttl_ms is None
    assert "stateTtl" not in plain.to_dict()  # configs without it hash as before


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"stateTtl": "30d"}, "needs episodeTimeout"),
        ({"episodeTimeout": "30m", "stateTtl": "30m"}, "longer than episodeTimeout"),
        ({"episodeTimeout": "30m", "stateTtl": 0}, "longer than episodeTimeout"),
        ({"episodeTimeout": "30m", "stateTtl": "soon"}, "stateTtl"),
    ],
)
def test_a_state_ttl_that_could_drop_an_open_episode_is_refused(config, problem):
    with pytest.raises(ConfigError) as raised:
        EngineConfig.from_dict({**config, "intents": {"i": {"signals": {}}}})
    assert problem in str(raised.value)
    assert "stateTtl" in str(raised.value)


def test_the_ttl_must_cover_the_longest_attribution_window():
    with pytest.raises(ConfigError, match=r"\(1470m\)"):
        ttl_config("1d", attribution="1d")
    assert ttl_config("1471m", attribution="1d").state_ttl_ms == 24 * HOUR + 31 * MIN


# --- expiry ----------------------------------------------------------------------------------


def test_a_quiet_user_expires_at_a_tick_and_the_live_run_equals_the_replay():
    run = live()
    for e in quiet_and_active():
        run.send(e)
        run.tick(0, caught_up=False)
    # q's last event was at TS + 50m: gone once the watermark passes TS + 50m + 6h.
    assert b"q" not in run.table.partitions[0]
    assert b"a" in run.table.partitions[0]
    assert run.processor.counts["expired"] == 1
    run.finish()
    expected, states = replayed(quiet_and_active(), config=CONFIG)
    assert run.by_id() == expected
    assert run.states() == states == {}  # the end of time expires everyone
    episodes = [o for o in run.outputs if "closed_at" in o and o["user"] == "q"]
    assert [e["reason"] for e in episodes] == ["timeout"]  # its episode closed, then it went


def test_until_keeps_the_users_active_within_the_ttl_of_it():
    events = quiet_and_active()
    _, states = replayed(events, until=TS + 24 * HOUR, config=CONFIG)
    assert set(states) == {"a"}


def test_a_user_who_comes_back_after_the_ttl_starts_fresh_in_both_runs():
    first = [Event("u", TS + n * MIN, name="pricing.viewed", id=f"u{n}") for n in range(3)]
    back = [Event("u", TS + TTL + 10 * HOUR, name="limit.hit", id="u9")]
    other = [Event("v", TS + TTL + 9 * HOUR, name="limit.hit", id="v0")]  # moves the watermark
    for ticks in (True, False):  # deleted by a tick first, or found expired by its input
        run = live()
        for e in [*first, *other, *back]:
            run.send(e)
            if ticks:
                run.tick(0, caught_up=False)
        run.finish()
        expected, _ = replayed([*first, *other, *back], config=CONFIG)
        assert run.by_id() == expected
        assert run.processor.counts["expired"] == 3  # u once, then u and v at the end
        back_prediction = expected["u:u9"]
        fresh, _ = replayed(back, config=CONFIG)
        assert back_prediction == fresh["u:u9"]  # nothing of u's first life is left


def test_inputs_without_ids_are_named_apart_in_each_life():
    config = ttl_config()
    first = [Event("u", TS + n * MIN, name="pricing.viewed") for n in range(2)]
    second = [Event("u", TS + TTL + HOUR + n * MIN, name="pricing.viewed") for n in range(2)]
    by_id, _ = replayed([*first, *second], config=config)
    predictions = sorted(k for k, v in by_id.items() if "closed_at" not in v)
    assert len(predictions) == 4  # two lives, each from #1: no id is reused
    assert predictions == sorted(
        [
            f"u:#1@{TS}",
            f"u:#2@{TS + MIN}",
            f"u:#1@{TS + TTL + HOUR}",
            f"u:#2@{TS + TTL + HOUR + MIN}",
        ]
    )


def test_a_user_is_deleted_only_once_its_last_input_is_committed():
    run = live()
    committed = {0: 0}
    run.processor.committed_input = committed.get
    for e in quiet_and_active():
        run.send(e)
        run.tick(0, caught_up=False)
    assert b"q" in run.table.partitions[0]  # its inputs could be read again after a crash
    assert run.processor.counts["expired"] == 0
    committed[0] = run.offset
    run.tick(0, caught_up=False)
    assert b"q" not in run.table.partitions[0]
    assert run.processor.counts["expired"] == 1


def test_the_expiry_index_is_rebuilt_after_a_restart():
    run = live()
    for e in quiet_and_active()[:8]:
        run.send(e)
    items = list(run.table.partitions[0].items())
    run.processor.rebuild(items)
    assert dict(run.processor.expiries[0]) == {
        b"q": TS + 50 * MIN + TTL,
        b"a": TS + HOUR + TTL,
    }


# --- the property: any schedule inside the contract gives the replay ---------------------

LATENESS = 5 * MIN


@st.composite
def schedules(draw):
    """Users with gaps around the TTL, arriving within the lateness of each other."""
    timeline = []
    for u in range(draw(st.integers(1, 4))):
        at = TS + draw(st.integers(0, 60 * MIN))
        for n in range(draw(st.integers(1, 6))):
            at += draw(st.sampled_from([0, MIN, 31 * MIN, TTL - 1, TTL, TTL + 1, 3 * TTL]))
            kind = draw(st.sampled_from(["event"] * 6 + ["end"]))
            name = draw(st.sampled_from(NAMES)) if kind == "event" else None
            ident = draw(st.sampled_from([f"u{u}-{n}", None]))
            timeline.append(Event(f"u{u}", at, name=name, type=kind, id=ident))
    timeline.sort(key=lambda e: e.at)
    return timeline


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(), st.booleans())
def test_any_schedule_gives_the_replay_with_expiry(order, every_message):
    run = live(lateness=LATENESS)
    for n, e in enumerate(order):
        run.send(e)
        if every_message or n % 3 == 0:
            run.tick(0, caught_up=False)
    run.finish()
    expected, states = replayed(order, config=CONFIG)
    assert run.by_id() == expected
    assert run.states() == states


def test_the_engine_replay_that_evaluate_and_tune_use_starts_an_expired_user_again():
    """`engine.replay` (what `evaluate` and `tune` apply) gives the worker's predictions and
    episode closes for a user who comes back after the TTL."""
    from engine import replay

    first = [Event("u", TS + n * MIN, name="pricing.viewed", id=f"u{n}") for n in range(3)]
    back = [Event("u", TS + TTL + HOUR, name="limit.hit", id="u9")]
    result = replay(CONFIG, [*first, *back])
    by_id, _ = replayed([*first, *back], config=CONFIG)
    worker_p = by_id["u:u9"]["intents"]["upgrade"]["p"]
    assert result.steps[-1].predictions["upgrade"].p == worker_p
    fresh = replay(CONFIG, back).steps[-1].predictions["upgrade"].p
    assert worker_p == fresh
    closed = result.steps[-1].closed
    assert closed is not None and closed.started_at == TS  # the first life's episode
    assert next(e for e in by_id.values() if "closed_at" in e)["closed_at"] == closed.closed_at
