"""Adversarial inputs through the engine's public API: invalid and extreme times, names and
configs, duplicate and out-of-order events, round trips. Each test states the rule it holds
(engine/README.md and the engine's docstrings)."""

from __future__ import annotations

import logging
import math
import random

import pytest

from engine import (
    ConfigError,
    EngineConfig,
    EngineError,
    InvalidEventError,
    InvalidTimeError,
    StateFormatError,
    StateVersionError,
    UnknownIntentError,
    create_state,
    deserialize,
    end_episode,
    episode_closed,
    explain,
    mark_revealed,
    observe,
    predict,
    serialize,
    should_reveal,
    state_to_record,
)
from engine.packing import pack
from tests.engine.helpers import DAY, HOUR, MINUTE, MONDAY_10, QUICKSTART, config

T = MONDAY_10


def _busy_config() -> EngineConfig:
    return config(
        {
            "upgrade": {
                "signals": {"pricing.viewed": 3, "limit.hit": 2, "docs.read": -1},
                "outcome": "upgrade.completed",
                "halfLife": "7d",
                "attribution": "2d",
                "cooldown": "1h",
            },
            "churn": {
                "signals": {"cancel.viewed": 2, "pricing.viewed": 1},
                "outcome": "cancel",
                "resetOnOutcome": False,
            },
            "plain": {"signals": {"limit.hit": 1}},
        },
        episodeTimeout="30m",
        learning={"halfLife": "3d"},
    )


def _reads(state, at):
    """Everything the public reads show, as comparable tuples."""
    out = []
    for name in state.config.intents:
        e = explain(state, name, at)
        sigs = tuple(
            (s, v.initial, v.learned, v.effective, v.hits, v.misses, v.seen, v.contribution)
            for s, v in e.signals.items()
        )
        out.append((name, predict(state, name, at), e.p, e.episodes.hits, e.episodes.misses, sigs))
    return out


def _random_ops(seed: int, names, intents, count: int = 80):
    rnd = random.Random(seed)
    at = T
    ops = []
    for _ in range(count):
        step = rnd.choice(
            [0, 1, MINUTE, 29 * MINUTE, 30 * MINUTE, 30 * MINUTE + 1, HOUR, DAY, 3 * DAY]
        )
        at = max(0, at + (step if rnd.random() > 0.1 else -step))  # some late events
        r = rnd.random()
        if r < 0.8:
            ops.append(("observe", rnd.choice(names), at))
        elif r < 0.9:
            ops.append(("end", None, at))
        else:
            ops.append(("reveal", rnd.choice(intents), at))
    return ops


def _apply(state, op):
    kind, name, at = op
    if kind == "observe":
        return observe(state, name, at)
    if kind == "end":
        return end_episode(state, at)
    return mark_revealed(state, name, at)


NAMES = [
    "pricing.viewed",
    "limit.hit",
    "docs.read",
    "cancel.viewed",
    "upgrade.completed",
    "cancel",
    "unrelated",
    "ünïcødé 🚀",
]


# --- timestamps ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [1.5, float("nan"), float("inf"), -1, True, "1767607200000", None, 10**30, 2**63],
)
def test_invalid_timestamps_raise_a_clear_engine_error_and_change_nothing(bad):
    state = observe(create_state(_busy_config()), "pricing.viewed", T)
    before = serialize(state)
    for call in (
        lambda: observe(state, "limit.hit", bad),
        lambda: end_episode(state, bad),
        lambda: mark_revealed(state, "upgrade", bad),
        lambda: predict(state, "upgrade", bad),
        lambda: explain(state, "upgrade", bad),
        lambda: should_reveal(state, "upgrade", bad),
    ):
        with pytest.raises(InvalidTimeError, match="time must be"):
            call()
    assert serialize(state) == before


@pytest.mark.parametrize("bad", ["", None, 3, b"pricing.viewed", ["x"]])
def test_invalid_event_names_raise_invalid_event_error(bad):
    state = create_state(_busy_config())
    with pytest.raises(InvalidEventError, match="non-empty string"):
        observe(state, bad, T)


def test_late_event_is_applied_at_the_last_event_time():
    """The contract: a timestamp earlier than the last event time is treated as that last time."""
    cfg = config({"u": QUICKSTART}, episodeTimeout="30m")
    s = observe(create_state(cfg), "pricing.viewed", T + HOUR)
    late = observe(s, "limit.hit", T)  # an hour earlier: no idle gap, same episode
    on_time = observe(s, "limit.hit", T + HOUR)
    assert late == on_time
    assert late.episode.started_at == T + HOUR
    assert not episode_closed(s, late)


def test_equal_timestamps_and_zero_timeout_keep_one_episode():
    cfg = config({"u": QUICKSTART}, episodeTimeout=0)
    s0 = create_state(cfg)
    s1 = observe(s0, "pricing.viewed", T)
    s2 = observe(s1, "pricing.viewed", T)
    assert not episode_closed(s1, s2) and s2.intents["u"].seen == {"pricing.viewed": 2}
    s3 = observe(s2, "limit.hit", T + 1)  # gap 1 > timeout 0: closed at T + 0
    assert episode_closed(s2, s3)
    assert s3.intents["u"].episodes.misses == 1.0
    assert s3.intents["u"].learned["pricing.viewed"].misses == 1.0


def test_extreme_but_valid_times_work_and_round_trip():
    cfg = config({"u": {**QUICKSTART, "attribution": "2w"}}, episodeTimeout="30m")
    s = observe(create_state(cfg), "pricing.viewed", 0)
    s = observe(s, "limit.hit", 253_402_300_799_999)  # closes at 30m; its 2w window passed
    assert s.intents["u"].pending == []
    assert s.intents["u"].learned["pricing.viewed"].misses == 1.0
    assert s.intents["u"].episodes.misses == 1.0
    p = predict(s, "u", 253_402_300_799_999)
    assert math.isfinite(p.p) and math.isfinite(p.sd)
    assert deserialize(serialize(s)) == s


# --- episodes --------------------------------------------------------------------------------


def test_end_episode_twice_and_without_episode_changes_nothing():
    cfg = config({"u": QUICKSTART})
    fresh = create_state(cfg)
    assert end_episode(fresh, T) == fresh
    assert not episode_closed(fresh, end_episode(fresh, T))
    s1 = observe(fresh, "pricing.viewed", T)
    s2 = end_episode(s1, T + 1)
    s3 = end_episode(s2, T + 2)
    assert episode_closed(s1, s2) and not episode_closed(s2, s3)
    assert s3.intents["u"].episodes == s2.intents["u"].episodes
    assert s3.episode.started_at is None


def test_event_after_end_episode_opens_a_new_episode_and_close_counts_again():
    cfg = config({"u": QUICKSTART})
    s = end_episode(observe(create_state(cfg), "pricing.viewed", T), T + 1)
    s = observe(s, "pricing.viewed", T + 2)
    assert s.episode.started_at == T + 2
    assert s.intents["u"].seen == {"pricing.viewed": 1}
    s = end_episode(s, T + 3)
    assert s.intents["u"].episodes.misses == 2.0
    assert s.intents["u"].learned["pricing.viewed"].misses == 2.0


def test_outcome_with_no_open_episode_counts_and_other_intents_get_a_no_signal_miss():
    cfg = config({"u": QUICKSTART, "v": {"signals": {"x": 1}, "outcome": "y"}})
    s = end_episode(observe(create_state(cfg), "upgrade.completed", T), T + 1)
    assert (s.intents["u"].episodes.hits, s.intents["u"].episodes.misses) == (1.0, 0.0)
    assert (s.intents["v"].episodes.hits, s.intents["v"].episodes.misses) == (0.0, 1.0)


def test_read_at_deadline_does_not_close_but_one_ms_later_does():
    cfg = config({"u": QUICKSTART}, episodeTimeout="30m")
    s = observe(create_state(cfg), "pricing.viewed", T)
    assert explain(s, "u", T + 30 * MINUTE).episodes.misses == 0.0
    assert explain(s, "u", T + 30 * MINUTE).signals["pricing.viewed"].seen == 1
    assert explain(s, "u", T + 30 * MINUTE + 1).episodes.misses == 1.0
    assert explain(s, "u", T + 30 * MINUTE + 1).signals["pricing.viewed"].seen == 0
    assert s.intents["u"].episodes.misses == 0.0  # the read stored nothing


def test_end_episode_after_timeout_closes_at_the_timeout_moment():
    cfg = config({"u": QUICKSTART}, episodeTimeout="30m", learning={"halfLife": "1d"})
    s = observe(create_state(cfg), "pricing.viewed", T)
    a = end_episode(s, T + 5 * HOUR)
    b = observe(s, "unrelated", T + 5 * HOUR)
    assert a.intents["u"].episodes == b.intents["u"].episodes
    assert a.intents["u"].episodes.at == T + 30 * MINUTE


# --- names, intents ---------------------------------------------------------------------------


def test_unicode_and_very_long_names_work_and_round_trip():
    long = "é" * 100_000
    cfg = config({"ü🚀": {"signals": {long: 2, "日本": -1}, "outcome": "終了"}})
    s = observe(create_state(cfg), long, T)
    s = observe(s, "日本", T + 1)
    s = observe(s, "終了", T + 2)
    assert s.intents["ü🚀"].learned[long].hits == 1.0
    assert deserialize(serialize(s)) == s


def test_every_accepted_config_state_serializes():
    """The contract: round trip is exact — a config the validator accepts must give serializable
    states (or the validator must refuse the name with a ConfigError)."""
    try:
        cfg = EngineConfig.from_dict(
            {"intents": {"u": {"signals": {"a\ud800": 1}, "outcome": "o"}}}
        )
    except ConfigError:
        return
    s = observe(create_state(cfg), "a\ud800", T)
    assert deserialize(serialize(s)) == s


def test_unknown_intent_is_a_clear_error_in_every_intent_call():
    s = create_state(_busy_config())
    for call in (predict, explain, should_reveal, mark_revealed):
        with pytest.raises(UnknownIntentError, match="unknown intent 'nope'"):
            call(s, "nope", T)


def test_unknown_event_names_only_open_and_extend_the_episode():
    s0 = create_state(_busy_config())
    s1 = observe(s0, "never.declared", T)
    assert s1.intents == s0.intents
    assert s1.episode.started_at == T


def test_many_intents_sharing_signals_all_learn():
    cfg = config(
        {f"i{k}": {"signals": {"shared": 1, f"own{k}": 2}, "outcome": f"o{k}"} for k in range(300)}
    )
    s = observe(create_state(cfg), "shared", T)
    s = observe(s, "o7", T + 1)
    s = end_episode(s, T + 2)
    assert s.intents["i7"].learned["shared"].hits == 1.0
    assert s.intents["i8"].learned["shared"].misses == 1.0
    assert s.intents["i299"].episodes.misses == 1.0


# --- config edges -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"intents": {"u": {"signals": {"x": float("nan")}}}}, "intents.u.signals.x"),
        ({"intents": {"u": {"signals": {"x": "3"}}}}, "intents.u.signals.x"),
        ({"intents": {"u": {"signals": {"x": True}}}}, "intents.u.signals.x"),
        ({"intents": {"u": {"signals": {}, "prior": 0}}}, "intents.u.prior"),
        ({"intents": {"u": {"signals": {}, "prior": 1}}}, "intents.u.prior"),
        ({"intents": {"u": {"signals": {}, "priorWeight": 0}}}, "intents.u.priorWeight"),
        ({"intents": {"u": {"signals": {}, "cooldown": -1}}}, "intents.u.cooldown"),
        ({"intents": {"u": {"signals": {}, "halfLife": -5}}}, "intents.u.halfLife"),
        ({"intents": {"u": {"signals": {}}}, "episodeTimeout": -1}, "episodeTimeout"),
        (
            {"intents": {"u": {"signals": {}}}, "learning": {"priorEpisodes": 0}},
            "learning.priorEpisodes",
        ),
        ({"intents": {"u": {"signals": {}}}, "learning": {"gain": -0.1}}, "learning.gain"),
        ({"intents": {"u": {"signals": {}}}, "learning": {"lift": "bogus"}}, "learning.lift"),
        ({"intents": {"u": {"signals": {}, "halflife": "7d"}}}, "intents.u.halflife"),
    ],
)
def test_config_problems_name_their_path(obj, path):
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict(obj)
    assert [p for p, _ in info.value.problems] == [path]
    assert str(info.value).count("\n") == 1


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_dict(
            {
                "bogus": 1,
                "learning": {"gain": -1, "lift": "x"},
                "intents": {"a": {"signals": {"s": "w"}, "prior": 2}, "b": 3},
            }
        )
    paths = [p for p, _ in info.value.problems]
    assert paths == [
        "bogus",
        "learning.gain",
        "learning.lift",
        "intents.a.signals.s",
        "intents.a.prior",
        "intents.b",
    ]


@pytest.mark.parametrize("k", [1e7, 1e12])
def test_any_positive_prior_episodes_is_valid(k):
    """The contract: '`priorEpisodes` ≤ 0 (any positive real is valid)'."""
    cfg = EngineConfig.from_dict({"intents": {"u": QUICKSTART}, "learning": {"priorEpisodes": k}})
    assert cfg.learning.prior_episodes == k


def test_tiny_prior_episodes_is_valid_and_learns_at_once():
    cfg = config(
        {"u": {"signals": {"a": 1, "b": 1}, "outcome": "o"}}, learning={"priorEpisodes": 1e-300}
    )
    s = create_state(cfg)
    s = end_episode(observe(observe(s, "a", T), "o", T + 1), T + 2)
    s = end_episode(observe(s, "b", T + 3), T + 4)
    e = explain(s, "u", T + 5)
    assert math.isfinite(e.signals["a"].effective)
    assert e.signals["a"].effective == pytest.approx(e.signals["a"].learned)


@pytest.mark.parametrize("weight", [1e-200, 1e-320])
def test_tiny_positive_prior_weight_predicts(weight):
    """The contract: only `priorWeight` ≤ 0 is invalid; §4: p, sd = sqrt(αβ/((α+β)²(α+β+1)))."""
    cfg = config({"u": {"signals": {"a": 1}, "outcome": "o", "priorWeight": weight, "prior": 0.5}})
    p = predict(create_state(cfg), "u", T)
    assert p.p == pytest.approx(0.5)
    assert math.isfinite(p.sd) and p.sd == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize(
    ("text", "ms"), [("2.3d", 198_720_000), ("1.001s", 1001), ("1.15h", 4_140_000)]
)
def test_decimal_durations_that_are_whole_ms_are_accepted(text, ms):
    cfg = EngineConfig.from_dict({"episodeTimeout": text, "intents": {"u": QUICKSTART}})
    assert cfg.episode_timeout_ms == ms


def test_threshold_bounds_and_zero_cooldown():
    never = config({"u": {"signals": {"a": 1e6}, "outcome": "o", "threshold": 1}})
    s = observe(create_state(never), "a", T)
    assert not should_reveal(s, "u", T)
    always = config({"u": {"signals": {}, "threshold": 0, "z": 0, "cooldown": 0}})
    s = create_state(always)
    assert should_reveal(s, "u", T)
    s = mark_revealed(s, "u", T)
    assert should_reveal(s, "u", T) and predict(s, "u", T).suppressed_until is None


def test_cooldown_window_is_half_open_and_reports_the_later_end():
    cfg = config({"u": {"signals": {"a": 20}, "outcome": "o", "cooldown": "1h"}})
    s = observe(create_state(cfg), "a", T)
    assert should_reveal(s, "u", T)
    s = mark_revealed(s, "u", T)
    assert predict(s, "u", T + HOUR - 1).suppressed_until == T + HOUR
    assert predict(s, "u", T + HOUR).suppressed_until is None
    s = observe(s, "o", T + 30 * MINUTE)  # outcome cooldown ends later
    assert predict(s, "u", T + 45 * MINUTE).suppressed_until == T + 90 * MINUTE
    s = observe(s, "a", T + 31 * MINUTE)
    s = observe(s, "a", T + 32 * MINUTE)
    s = observe(s, "a", T + 33 * MINUTE)
    p = predict(s, "u", T + 89 * MINUTE)
    assert p.p >= 0.5 and not p.reveal
    assert predict(s, "u", T + 90 * MINUTE).reveal


def test_deprecated_lift_warns_exactly_once_per_load(caplog):
    with caplog.at_level(logging.WARNING, logger="engine.config"):
        EngineConfig.from_dict({"intents": {"u": QUICKSTART}, "learning": {"lift": "odds-ratio"}})
    assert len([r for r in caplog.records if "deprecated" in r.getMessage()]) == 1


# --- attribution boundaries -------------------------------------------------------------------


def test_attribution_zero_window_credits_only_at_the_close_moment():
    cfg = config({"u": {**QUICKSTART, "attribution": 0}})
    s = end_episode(observe(create_state(cfg), "pricing.viewed", T), T + 1)
    at_close = observe(s, "upgrade.completed", T + 1)
    assert at_close.intents["u"].learned["pricing.viewed"].hits == 1.0
    after = observe(s, "upgrade.completed", T + 2)
    assert after.intents["u"].learned["pricing.viewed"].misses == 1.0
    assert after.intents["u"].learned["pricing.viewed"].hits == 0.0


def test_read_shows_the_verdict_the_next_observe_stores_bit_for_bit():
    """Seed: reads settle and store nothing; the next observe stores the same verdict."""
    cfg = _busy_config()
    for seed in range(25):
        s = create_state(cfg)
        for op in _random_ops(seed, NAMES, list(cfg.intents), 50):
            s = _apply(s, op)
        if s.clock is None:
            continue
        for later in (0, 31 * MINUTE, 2 * DAY + 1, 9 * DAY):
            at = s.clock + later
            shown = _reads(s, at)
            stored = _reads(observe(s, "unrelated", at), at)
            for a, b in zip(shown, stored, strict=True):
                assert a[2:5] == b[2:5]
                assert [x[:6] for x in a[5]] == [x[:6] for x in b[5]]


# --- invariants, round trips, determinism, purity ---------------------------------------------


def test_signal_counts_never_exceed_the_base_rate():
    """The contract: every signal's hits + misses never exceeds the intent's episodes."""
    cfg = _busy_config()
    for seed in range(40):
        s = create_state(cfg)
        for op in _random_ops(seed, NAMES, list(cfg.intents), 100):
            s = _apply(s, op)
            if s.clock is None:
                continue
            for name in ("upgrade", "churn"):
                e = explain(s, name, s.clock)
                total = e.episodes.hits + e.episodes.misses
                for v in e.signals.values():
                    assert v.hits + v.misses <= total * (1 + 1e-12) + 1e-12


def test_round_trip_at_any_point_gives_identical_later_results():
    """The contract round trip is exact, and the restored state behaves identically afterwards."""
    cfg = _busy_config()
    for seed in range(30):
        ops = _random_ops(seed, NAMES, list(cfg.intents), 80)
        cut = random.Random(seed).randrange(len(ops))
        a = b = create_state(cfg)
        for k, op in enumerate(ops):
            if k == cut:
                full = deserialize(serialize(b))
                compact = deserialize(serialize(b, include_config=False), config=cfg)
                assert full == b and compact == b
                assert serialize(full) == serialize(b)
                b = compact
            a, b = _apply(a, op), _apply(b, op)
        assert serialize(a) == serialize(b)
        if a.clock is not None:
            assert _reads(a, a.clock + DAY) == _reads(b, b.clock + DAY)


def test_replaying_the_same_inputs_is_deterministic_and_inputs_are_never_mutated():
    cfg = _busy_config()
    ops = _random_ops(7, NAMES, list(cfg.intents), 120)
    runs = []
    for _ in range(2):
        s = create_state(cfg)
        for op in ops:
            before = serialize(s)
            nxt = _apply(s, op)
            if s.clock is not None:
                _reads(s, s.clock + DAY)
            assert serialize(s) == before
            s = nxt
        runs.append(serialize(s))
    assert runs[0] == runs[1]


def test_deserialize_with_config_prunes_and_adds_and_keeps_invariants():
    cfg = _busy_config()
    s = create_state(cfg)
    for op in _random_ops(3, NAMES, list(cfg.intents), 60):
        s = _apply(s, op)
    s = observe(s, "docs.read", s.clock)
    smaller = config(
        {
            "upgrade": {
                "signals": {"pricing.viewed": 3, "new.sig": 1},
                "outcome": "upgrade.completed",
                "halfLife": "7d",
                "attribution": "2d",
            },
            "fresh": {"signals": {"x": 1}, "outcome": "y"},
        },
        episodeTimeout="30m",
        learning={"halfLife": "3d"},
    )
    back = deserialize(serialize(s, include_config=False), config=smaller)
    assert set(back.intents) == {"upgrade", "fresh"}
    up = back.intents["upgrade"]
    assert set(up.learned) == {"pricing.viewed", "new.sig"}
    assert "docs.read" not in up.evidence and "docs.read" not in up.seen
    assert all(set(h.signals) <= {"pricing.viewed", "new.sig"} for h in up.pending)
    assert up.learned["new.sig"].hits == up.learned["new.sig"].misses == 0.0
    assert up.learned["pricing.viewed"] == s.intents["upgrade"].learned["pricing.viewed"]
    assert deserialize(serialize(back)) == back


# --- deserialize errors ------------------------------------------------------------------------


def test_future_version_is_refused_with_a_clear_error():
    record = state_to_record(create_state(_busy_config()))
    record[0] = 99
    with pytest.raises(StateVersionError, match="version 99 is newer"):
        deserialize(pack(record))


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x00",
        b"\xc1",
        b"\x93\x01\xc0",
        b"\xdd\xff\xff\xff\xff",
        pack([1, None, 1, 2, 3, {}]) + b"x",
    ],
)
def test_garbage_bytes_are_a_state_format_error(blob):
    with pytest.raises(StateFormatError):
        deserialize(blob)


def test_deeply_nested_garbage_is_a_state_format_error():
    """deserialize refuses bytes that are not a state with the engine's StateFormatError."""
    with pytest.raises(EngineError):
        deserialize(b"\x91" * 100_000 + b"\xc0")
