"""Config validation: one clear message per problem, each naming its path."""

from __future__ import annotations

import logging
import pickle

import pytest

from engine import ConfigError, EngineConfig, parse_duration

BASE = {"intents": {"upgrade": {"signals": {"pricing.viewed": 3}, "outcome": "upgrade.completed"}}}


def _with_intent(**fields):
    return {"intents": {"upgrade": {**BASE["intents"]["upgrade"], **fields}}}


INVALID_CONFIGS = [
    (
        {"intents": {"upgrade": {"signals": {"x": "3"}}}},
        "intents.upgrade.signals.x: weight must be a finite number (got '3')",
    ),
    (
        {"intents": {"upgrade": {"signals": {"x": True}}}},
        "intents.upgrade.signals.x: weight must be a finite number (got True)",
    ),
    (
        {"intents": {"upgrade": {"signals": {"x": float("nan")}}}},
        "intents.upgrade.signals.x: weight must be a finite number (got nan)",
    ),
    (
        {"intents": {"upgrade": {"signals": {"x": 1}, "colour": 1}}},
        "intents.upgrade.colour: unknown key; expected one of attribution, cooldown",
    ),
    ({**BASE, "episodTimeout": "30m"}, "episodTimeout: unknown key; expected one of"),
    ({**BASE, "learning": {"gian": 2}}, "learning.gian: unknown key"),
    ({**BASE, "episodeTimeout": "-5m"}, "episodeTimeout: must be a duration such as"),
    ({**BASE, "episodeTimeout": -5}, "episodeTimeout: must not be negative (got -5)"),
    ({**BASE, "episodeTimeout": 1.5}, "must be a whole number of milliseconds (got 1.5)"),
    ({**BASE, "episodeTimeout": "soon"}, "episodeTimeout: must be a duration such as 500ms"),
    (
        {**BASE, "episodeTimeout": 253_402_300_800_000},
        "episodeTimeout: must be at most 253402300799999 ms, about 8,000 years",
    ),
    (_with_intent(cooldown=2.0**63), "intents.upgrade.cooldown: must be at most 253402300799999"),
    ({**BASE, "episodeTimeout": True}, "episodeTimeout: must be a duration such as 30m"),
    (_with_intent(prior=0), "intents.upgrade.prior: must be > 0 (got 0)"),
    (
        {"intents": {"upgrade": {"signals": {"x": 1e308}}}},
        "intents.upgrade.signals.x: weight must be between -1e+06 and 1e+06 (got 1e+308)",
    ),
    (
        {"intents": {"upgrade": {"signals": {"x": -(10**400)}}}},
        "intents.upgrade.signals.x: weight must be a finite number (got -1000000000000000000",
    ),
    (_with_intent(z=10**400), "intents.upgrade.z: must be a finite number (got 10000000000"),
    (_with_intent(priorWeight=1e7), "intents.upgrade.priorWeight: must be <= 1e+06 (got 1"),
    ({**BASE, "learning": {"gain": 2e6}}, "learning.gain: must be <= 1e+06 (got 2000000.0)"),
    (
        {**BASE, "learning": {"priorEpisodes": 10**400}},
        "learning.priorEpisodes: must be a finite number (got 1000",
    ),
    ({**BASE, "episodeTimeout": 10**400}, "episodeTimeout: must be at most 253402300799999 ms"),
    ({**BASE, "episodeTimeout": -(10**400)}, "episodeTimeout: must not be negative (got -1000"),
    (_with_intent(prior=1), "intents.upgrade.prior: must be < 1 (got 1)"),
    (_with_intent(priorWeight=0), "intents.upgrade.priorWeight: must be > 0 (got 0)"),
    (_with_intent(threshold=1.5), "intents.upgrade.threshold: must be <= 1 (got 1.5)"),
    (_with_intent(z=-1), "intents.upgrade.z: must be >= 0 (got -1)"),
    (_with_intent(halfLife="0d"), "intents.upgrade.halfLife: must be longer than 0"),
    (_with_intent(cooldown="-1h"), "intents.upgrade.cooldown: must be a duration"),
    (
        _with_intent(resetOnOutcome="yes"),
        "intents.upgrade.resetOnOutcome: must be true or false (got 'yes')",
    ),
    (_with_intent(outcome=""), "intents.upgrade.outcome: must be an event name"),
    ({**BASE, "learning": {"priorEpisodes": 0}}, "learning.priorEpisodes: must be > 0 (got 0)"),
    ({**BASE, "learning": {"gain": -0.1}}, "learning.gain: must be >= 0 (got -0.1)"),
    (
        {**BASE, "learning": {"lift": "magic"}},
        "learning.lift: must be one of normalized-difference, absolute-difference",
    ),
    ({**BASE, "learning": []}, "learning: must be a mapping (got list)"),
    ({"intents": {}}, "intents: must declare at least one intent"),
    ({}, "intents: is required"),
    ({"intents": ["upgrade"]}, "intents: must be a mapping of intent names (got list)"),
    ({"intents": {"upgrade": {"outcome": "x"}}}, "intents.upgrade.signals: is required"),
    ({"intents": {"upgrade": 3}}, "intents.upgrade: must be a mapping with `signals`"),
    ([], "the config must be a mapping (got list)"),
]
"""(config, message) pairs: one problem each; schemas/ tests check the JSON Schema agrees."""


@pytest.mark.parametrize(("config", "message"), INVALID_CONFIGS)
def test_each_problem_has_one_message_with_its_path(config, message):
    """Every rule of SPEC §2 gives its own message, naming the path and the value."""
    with pytest.raises(ConfigError) as caught:
        EngineConfig.from_dict(config)
    assert len(caught.value.problems) == 1, caught.value.problems
    assert message in str(caught.value)


def test_all_problems_are_reported_at_once():
    """Three mistakes, three lines: a user fixes them in one pass."""
    config = {
        "episodeTimeout": "x",
        "learning": {"gain": -1},
        "intents": {"a": {"signals": {"s": "heavy"}, "prior": 2}},
    }
    with pytest.raises(ConfigError) as caught:
        EngineConfig.from_dict(config)
    paths = [path for path, _ in caught.value.problems]
    assert paths == ["episodeTimeout", "learning.gain", "intents.a.signals.s", "intents.a.prior"]
    assert str(caught.value).startswith("invalid oracular config (4 problems):\n  episodeTimeout:")


def test_defaults_and_durations_are_read():
    """Defaults from SPEC §2 ([ours]) and every duration unit."""
    config = EngineConfig.from_dict(
        {
            "episodeTimeout": "30m",
            "learning": {"halfLife": "90d", "priorEpisodes": 0.5},
            "intents": {
                "upgrade": {
                    "signals": {"a": 1},
                    "outcome": "o",
                    "halfLife": "7d",
                    "attribution": "2w",
                }
            },
        }
    )
    upgrade = config.intents["upgrade"]
    assert config.episode_timeout_ms == 30 * 60_000
    assert config.learning.half_life_ms == 90 * 86_400_000
    assert config.learning.prior_episodes == 0.5  # any positive real is valid
    assert (config.learning.gain, config.learning.lift) == (2.0, "normalized-difference")
    assert (upgrade.half_life_ms, upgrade.attribution_ms) == (7 * 86_400_000, 14 * 86_400_000)
    assert (upgrade.prior, upgrade.prior_weight, upgrade.threshold, upgrade.z) == (
        0.15,
        10,
        0.5,
        1.0,
    )
    assert (upgrade.cooldown_ms, upgrade.reset_on_outcome) == (86_400_000, True)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("30m", 1_800_000),
        ("12h", 43_200_000),
        ("7d", 604_800_000),
        ("2w", 1_209_600_000),
        ("1.5h", 5_400_000),
        (250, 250),
        (0, 0),
        (" 3d ", 259_200_000),
    ],
)
def test_durations(text, ms):
    """Durations are ms numbers or strings with a unit."""
    assert parse_duration(text) == ms


def test_to_dict_reads_back_equal():
    """to_dict is from_dict's inverse (serialize embeds configs this way)."""
    config = EngineConfig.from_dict(
        {**BASE, "episodeTimeout": 90_001, "learning": {"lift": "log-lift", "halfLife": "30d"}}
    )
    assert EngineConfig.from_dict(config.to_dict()) == config


def test_a_config_survives_pickle():
    """The lookup API process gets the config pickled; a compiled engine (`make compiled`)
    too: its classes carry the frozen dataclasses' pickling pair explicitly."""
    config = EngineConfig.from_dict(
        {**BASE, "episodeTimeout": 90_001, "learning": {"lift": "log-lift", "halfLife": "30d"}}
    )
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config
    assert copy.signal_index == config.signal_index
    assert copy.outcome_index == config.outcome_index
    assert copy.touched_index == config.touched_index
    assert copy.attribution_intents == config.attribution_intents
    assert copy.warnings == config.warnings


def test_deprecated_lift_logs_one_warning_per_load(caplog):
    """Six measures are deprecated upstream: accepted, with one warning per config load."""
    with caplog.at_level(logging.WARNING, logger="engine.config"):
        EngineConfig.from_dict({**BASE, "learning": {"lift": "risk-ratio"}})
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "learning.lift: 'risk-ratio' is deprecated upstream; "
        "'normalized-difference' (the default) is the supported measure"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.config"):
        EngineConfig.from_dict(BASE)
    assert caplog.records == []


def test_outcome_listed_as_a_signal_warns_once_and_is_allowed(caplog):
    """Allowed (as the original engine allows it), but never seen: warn once."""
    with caplog.at_level(logging.WARNING, logger="engine.config"):
        config = EngineConfig.from_dict(
            {"intents": {"x": {"signals": {"buy": 1, "cart": 1}, "outcome": "buy"}}}
        )
    assert len(caplog.records) == 1
    assert "intents.x.outcome: 'buy' is also one of this intent's signals" in caplog.text
    assert config.signal_index == {"cart": ("x",)}
    assert config.outcome_index == {"buy": ("x",)}


def test_the_per_event_lookups_match_the_intents():
    """`touched_index` and `attribution_intents`, built once per config for the per-event
    path, say what a walk over the intents says: an event touches the intents whose outcome
    it is, then those that list it as a signal (not their own outcome), each once."""
    config = EngineConfig.from_dict(
        {
            "intents": {
                "a": {"signals": {"buy": 1, "cart": 1}, "outcome": "buy", "attribution": "1d"},
                "b": {"signals": {"buy": 2, "cart": -1, "view": 1}, "outcome": "cart"},
                "c": {"signals": {"view": 1}},
                "d": {"signals": {"cart": 1}, "outcome": "buy", "attribution": "2h"},
            }
        }
    )
    expected: dict[str, tuple[str, ...]] = {}
    for event in ("buy", "cart", "view", "other"):
        outcomes = [n for n, i in config.intents.items() if i.outcome == event]
        signals = [
            n for n, i in config.intents.items() if event in i.signals and i.outcome != event
        ]
        touched = tuple(dict.fromkeys(outcomes + signals))
        if touched:
            expected[event] = touched
    assert config.touched_index == expected
    assert expected == {"buy": ("a", "d", "b"), "cart": ("b", "a", "d"), "view": ("b", "c")}
    assert config.attribution_intents == (("a", config.intents["a"]), ("d", config.intents["d"]))


def _with_duration(key: str, value: str) -> dict[str, object]:
    return {**BASE, key: value} if key == "episodeTimeout" else _with_intent(**{key: value})


@pytest.mark.parametrize("key", ["episodeTimeout", "halfLife", "cooldown", "attribution"])
def test_a_duration_beyond_8000_years_is_refused_as_text_too(key):
    """The longest duration is what keeps every deadline, cooldown end and attribution end a
    storable time: `100000000000d` would make a cooldown's end overflow the 64-bit integers a
    stored state and an output are written with."""
    with pytest.raises(ConfigError, match=r"must be at most 253402300799999 ms"):
        EngineConfig.from_dict(_with_duration(key, "100000000000d"))
    EngineConfig.from_dict(_with_duration(key, "2932896d"))  # 2,932,896 days: just within


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2.3d", 198_720_000),
        ("1.001s", 1001),
        ("1.005s", 1005),
        ("1.15h", 4_140_000),
        ("0.0001m", 6),
        ("0.00001h", 36),
        ("0.00001d", 864),
        ("0.00001w", 6048),
        ("1.10000w", 665_280_000),
    ],
)
def test_a_decimal_duration_is_exact(text, ms):
    """The number is read as a decimal, not a float: float('1.001') * 1000 is not 1001."""
    assert parse_duration(text) == ms


def test_every_millisecond_as_seconds_is_accepted():
    """Each of 0.000s .. 2.999s is its whole number of milliseconds (945 of them failed with
    float arithmetic)."""
    for ms in range(3000):
        assert parse_duration(f"{ms // 1000}.{ms % 1000:03d}s") == ms


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.5ms", "no decimal places with ms (got '1.5ms')"),
        ("1.0ms", "no decimal places with ms"),
        ("1.0001s", "at most 3 decimal places with s (got '1.0001s')"),
        ("0.00001m", "at most 4 decimal places with m"),
        ("1.000001h", "at most 5 decimal places with h"),
        ("1.000001d", "at most 5 decimal places with d"),
        ("1.000001w", "at most 5 decimal places with w"),
    ],
)
def test_a_duration_with_too_many_decimal_places_is_refused(text, message):
    """A string duration has at most the decimal places that keep every value whole ms."""
    with pytest.raises(ValueError, match=r"must be a whole number of milliseconds: ") as info:
        parse_duration(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        (
            {"priorWeight": 1e-323, "prior": 0.01},
            "priorWeight",
            "too small: prior·priorWeight must be a positive float",
        ),
        (
            {"priorWeight": 5e-324},
            "priorWeight",
            "too small: prior·priorWeight must be a positive float",
        ),
        (
            {"priorWeight": 1e-310, "prior": 0.9999999999999999},
            "priorWeight",
            "too small: (1 − prior)·priorWeight must be a positive float",
        ),
    ],
)
def test_a_prior_weight_whose_prior_underflows_is_refused(fields, where, message):
    """α0 = prior·priorWeight and β0 = (1 − prior)·priorWeight must not be 0 as floats. (The
    JSON Schema cannot state a product: a validator-only rule.)"""
    with pytest.raises(ConfigError) as caught:
        EngineConfig.from_dict(_with_intent(**fields))
    assert len(caught.value.problems) == 1
    path, text = caught.value.problems[0]
    assert path == f"intents.upgrade.{where}"
    assert text.startswith(message)


@pytest.mark.parametrize("weight", [1e-200, 1e-320])
def test_a_tiny_prior_weight_whose_prior_stays_positive_is_valid(weight):
    """SPEC §2: only priorWeight ≤ 0 is invalid; tiny ones predict (tests/engine/test_predict)."""
    config = EngineConfig.from_dict(_with_intent(priorWeight=weight, prior=0.5))
    assert config.intents["upgrade"].prior_weight == weight


@pytest.mark.parametrize("k", [1e6 + 1, 1e9, 1e100, 1e308, 1.7976931348623157e308])
def test_any_positive_prior_episodes_is_valid(k):
    """SPEC §2: 'any positive real is valid'; it was capped at 1e6."""
    config = EngineConfig.from_dict({**BASE, "learning": {"priorEpisodes": k}})
    assert config.learning.prior_episodes == k
    assert EngineConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("obj", "path", "name"),
    [
        ({"intents": {"u": {"signals": {"a\ud800": 1}}}}, "intents.u.signals", "'a\\ud800'"),
        ({"intents": {"u\udfff": {"signals": {"a": 1}}}}, "intents", "'u\\udfff'"),
        (
            {"intents": {"u": {"signals": {"a": 1}, "outcome": "\ud800o"}}},
            "intents.u.outcome",
            "'\\ud800o'",
        ),
    ],
)
def test_a_name_that_is_not_unicode_text_is_refused(obj, path, name):
    """A lone surrogate (json.loads makes one of "\\ud800") was accepted, and then serialize
    raised UnicodeEncodeError: refused, with one message that prints in UTF-8."""
    with pytest.raises(ConfigError) as caught:
        EngineConfig.from_dict(obj)
    assert caught.value.problems == (
        (path, f"name {name} is not valid Unicode text (it holds a lone surrogate)"),
    )
    str(caught.value).encode("utf-8")


def test_an_unknown_key_that_is_not_unicode_text_prints():
    with pytest.raises(ConfigError) as caught:
        EngineConfig.from_dict({"intents": {"u": {"signals": {}, "x\ud800": 1}}})
    assert [path for path, _ in caught.value.problems] == ["intents.u.'x\\ud800'"]
    str(caught.value).encode("utf-8")
