"""Hypothesis strategies for the engine's property tests: configs and one user's steps.

A config is drawn in the users' camelCase form (a plain dict) and built with
`EngineConfig.from_dict`, so a falsifying example prints as a config a person can paste. Steps
are tuples a person can read too:

    ("event", name, at)        -> engine.observe(state, name, at)
    ("end", at)                -> engine.end_episode(state, at)
    ("revealed", intent, at)   -> engine.mark_revealed(state, intent, at)

Times mostly move forward, with gaps from 0 ms up to several timeouts or attribution windows,
including the exact boundaries (a gap equal to episodeTimeout, ±1 ms); now and then one goes
backwards (a late event, which the engine reads at its clock).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from engine import (
    LIFT_MEASURES,
    EngineConfig,
    EngineState,
    Event,
    end_episode,
    mark_revealed,
    observe,
    parse_duration,
)

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WEEK = 7 * DAY

T0 = 1_767_607_200_000
"""Monday 2026-01-05 10:00:00 UTC in epoch ms: the first step's time."""

INTENT_NAMES = ("upgrade", "purchase", "trial")
SIGNAL_POOL = (
    "pricing.viewed",
    "limit.hit",
    "docs.read",
    "app.opened",
    "cart.added",
    "trial.started",
)
OUTCOME_POOL = ("upgrade.completed", "purchase.completed")
UNKNOWN_EVENTS = ("page.viewed", "settings.opened")
"""Event names no config mentions: they only open or extend the episode."""

LIFTS = tuple(LIFT_MEASURES)
"""All seven lift measures; the six deprecated ones log a warning on load (that is fine)."""

# Durations are drawn from short lists that mix ms numbers and strings, so that windows and
# timeouts both expire within a generated run and outlast it.
TIMEOUTS = (1, 500, "30s", 5 * MINUTE, "30m", "2h")
HALF_LIVES = (SECOND, "1m", 30 * MINUTE, "1h", "1d", "7d")
ATTRIBUTIONS = (0, 1, "2s", 10 * MINUTE, "1h", "1d", "14d")
LEARNING_HALF_LIVES = (MINUTE, "1h", "1d", "90d")
COOLDOWNS = (0, 1, "1s", MINUTE, "1h", "1d")

Step = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    """A config (camelCase dict, as users write it) and one user's steps."""

    config: Mapping[str, Any]
    steps: tuple[Step, ...]

    def engine_config(self) -> EngineConfig:
        """A fresh `EngineConfig` built from `config` (a deep copy: the dict stays as drawn)."""
        return EngineConfig.from_dict(copy.deepcopy(dict(self.config)))


# --- configs -------------------------------------------------------------------------------------

weights = st.one_of(
    st.just(0),
    st.integers(-3, 3),
    st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False),
)
"""Initial signal weights in [-3, 3], zero included (an int 0, or 0.0 / -0.0 from floats)."""


def _maybe(draw: st.DrawFn, out: dict[str, Any], key: str, values: st.SearchStrategy[Any]) -> None:
    """Set `out[key]` to a drawn value about half the time (otherwise leave the default)."""
    if draw(st.booleans()):
        out[key] = draw(values)


@st.composite
def intent_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """One intent: 1-4 signals, an optional outcome (now and then one of its own signals)."""
    names = draw(st.lists(st.sampled_from(SIGNAL_POOL), min_size=1, max_size=4, unique=True))
    intent: dict[str, Any] = {"signals": {name: draw(weights) for name in names}}
    outcome_kind = draw(st.integers(0, 9))
    if outcome_kind <= 5:
        intent["outcome"] = draw(st.sampled_from(OUTCOME_POOL))
    elif outcome_kind == 6:
        intent["outcome"] = draw(st.sampled_from(names))  # allowed; never "seen"
    elif outcome_kind == 7:
        intent["outcome"] = draw(st.sampled_from(SIGNAL_POOL))  # maybe another intent's signal
    # 8, 9: no outcome, the intent never learns
    _maybe(draw, intent, "halfLife", st.sampled_from(HALF_LIVES))
    _maybe(draw, intent, "attribution", st.sampled_from(ATTRIBUTIONS))
    _maybe(draw, intent, "cooldown", st.sampled_from(COOLDOWNS))
    _maybe(draw, intent, "resetOnOutcome", st.booleans())
    _maybe(draw, intent, "prior", st.floats(0.01, 0.99))
    _maybe(draw, intent, "priorWeight", st.floats(0.5, 20.0))
    _maybe(draw, intent, "threshold", st.floats(0.0, 1.0))
    _maybe(draw, intent, "z", st.floats(0.0, 2.0))
    return intent


@st.composite
def config_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A valid config in the users' camelCase form, 1-3 intents."""
    names = draw(st.lists(st.sampled_from(INTENT_NAMES), min_size=1, max_size=3, unique=True))
    config: dict[str, Any] = {"intents": {name: draw(intent_dicts()) for name in names}}
    _maybe(draw, config, "episodeTimeout", st.sampled_from(TIMEOUTS))
    learning: dict[str, Any] = {}
    _maybe(draw, learning, "gain", st.floats(0.0, 3.0))
    _maybe(draw, learning, "priorEpisodes", st.floats(0.0, 50.0, exclude_min=True))
    _maybe(draw, learning, "lift", st.sampled_from(LIFTS))
    _maybe(draw, learning, "halfLife", st.sampled_from(LEARNING_HALF_LIVES))
    empty_too: bool = draw(st.booleans())  # `learning: {}` is valid and means the defaults
    if learning or empty_too:
        config["learning"] = learning
    return config


def configs() -> st.SearchStrategy[EngineConfig]:
    """Validated configs (`EngineConfig.from_dict` of `config_dicts()`)."""
    return config_dicts().map(EngineConfig.from_dict)


def reordered(config: Mapping[str, Any]) -> dict[str, Any]:
    """The same config with its intents, and each intent's signals, declared in reverse order."""
    out = copy.deepcopy(dict(config))
    intents = {}
    for name, declared in reversed(list(out["intents"].items())):
        intent = dict(declared)
        intent["signals"] = dict(reversed(list(intent["signals"].items())))
        intents[name] = intent
    out["intents"] = intents
    return out


# --- steps ---------------------------------------------------------------------------------------


def event_names(config: Mapping[str, Any]) -> list[str]:
    """Names a step may observe: every signal and outcome of the config, and unknown names."""
    names: dict[str, None] = {}
    for intent in config["intents"].values():
        names.update(dict.fromkeys(intent["signals"]))
        if intent.get("outcome") is not None:
            names[intent["outcome"]] = None
    names.update(dict.fromkeys(UNKNOWN_EVENTS))
    return list(names)


def time_scales(config: Mapping[str, Any]) -> list[int]:
    """The config's durations in ms (timeout, windows, half-lives, cooldowns), at least 1 ms."""
    found = [config.get("episodeTimeout"), config.get("learning", {}).get("halfLife")]
    for intent in config["intents"].values():
        found += [intent.get(key) for key in ("halfLife", "attribution", "cooldown")]
    scales = {parse_duration(value) for value in found if value is not None}
    return sorted({scale for scale in scales if scale > 0} | {MINUTE})


@st.composite
def gaps(draw: st.DrawFn, scales: Sequence[int]) -> int:
    """A gap between two steps: mostly forward, now and then 0 or backwards (a late event)."""
    kind = draw(st.integers(0, 19))
    longest = max(scales)
    if kind < 3:
        return 0
    if kind < 8:
        return draw(st.integers(1, MINUTE))
    if kind < 13:  # a boundary: exactly a configured duration, or 1 ms either side
        scale = draw(st.sampled_from(scales))
        return max(0, scale + draw(st.sampled_from((-1, 0, 1))))
    if kind < 18:
        return draw(st.integers(0, 3 * longest))
    return -draw(st.integers(1, longest))


@st.composite
def step_lists(
    draw: st.DrawFn,
    config: Mapping[str, Any],
    *,
    min_size: int = 0,
    max_size: int = 24,
    start: int = T0,
    end_weight: int = 2,
) -> tuple[Step, ...]:
    """One user's steps under `config` (a camelCase dict), starting at `start`.

    `end_weight` out of 12 steps are sign-outs on average, 1 in 12 a reveal, the rest events.
    """
    names = event_names(config)
    intents = list(config["intents"])
    scales = time_scales(config)
    kinds = ["end"] * end_weight + ["revealed"] + ["event"] * (12 - end_weight - 1)
    shape = st.tuples(
        st.sampled_from(kinds), st.sampled_from(names), st.sampled_from(intents), gaps(scales)
    )
    # The length is drawn first (fairly evenly): plain st.lists keeps most runs to a few steps.
    size = draw(st.integers(min_size, max_size))
    drawn = draw(st.lists(shape, min_size=size, max_size=size))
    steps: list[Step] = []
    at = start
    for kind, name, intent, gap in drawn:
        at = max(0, at + gap)
        if kind == "event":
            steps.append(("event", name, at))
        elif kind == "end":
            steps.append(("end", at))
        else:
            steps.append(("revealed", intent, at))
    return tuple(steps)


@st.composite
def cases(draw: st.DrawFn, *, min_size: int = 0, max_size: int = 24, end_weight: int = 2) -> Case:
    """A config and one user's steps under it."""
    config = draw(config_dicts())
    steps = draw(step_lists(config, min_size=min_size, max_size=max_size, end_weight=end_weight))
    return Case(config, steps)


@st.composite
def multi_user_cases(
    draw: st.DrawFn, *, users: int = 3, max_size: int = 12
) -> tuple[Mapping[str, Any], dict[str, tuple[Step, ...]], tuple[str, ...]]:
    """A config, 1-`users` users' steps (each at least one), and an interleaving of them.

    The interleaving lists user ids; the i-th mention of a user stands for its i-th step, so
    each user's own order is kept, as a stream partitioned by user keeps it.
    """
    config = draw(config_dicts())
    count = draw(st.integers(1, users))
    per_user = {}
    for index in range(count):
        start = T0 + draw(st.integers(-HOUR, HOUR))
        per_user[f"user-{index}"] = draw(
            step_lists(config, min_size=1, max_size=max_size, start=start)
        )
    tokens = [user for user, steps in per_user.items() for _ in steps]
    order = tuple(draw(st.permutations(tokens)))
    return config, per_user, order


# --- running steps -------------------------------------------------------------------------------


def step_time(step: Step) -> int:
    """The time a step carries (its last item)."""
    return int(step[-1])


def apply(state: EngineState, step: Step) -> EngineState:
    """Apply one step through the public API."""
    kind = step[0]
    if kind == "event":
        return observe(state, step[1], step[2])
    if kind == "end":
        return end_episode(state, step[1])
    if kind == "revealed":
        return mark_revealed(state, step[1], step[2])
    msg = f"unknown step {step!r}"
    raise ValueError(msg)


def run(state: EngineState, steps: Iterable[Step]) -> list[EngineState]:
    """Apply `steps` in order from `state`; return the state after each step."""
    states = []
    for step in steps:
        state = apply(state, step)
        states.append(state)
    return states


def final(state: EngineState, steps: Iterable[Step]) -> EngineState:
    """The state after all `steps` (`state` itself when there are none)."""
    for step in steps:
        state = apply(state, step)
    return state


def to_event(user: str, step: Step) -> Event:
    """The `engine.Event` a replay reads for `step` of `user`."""
    kind = step[0]
    if kind == "event":
        return Event(user, step[2], name=step[1])
    if kind == "end":
        return Event(user, step[1], type="end")
    return Event(user, step[2], type="revealed", intent=step[1])
