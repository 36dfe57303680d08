"""The engine's configuration: what users write (camelCase JSON/YAML) and its validated form.

`EngineConfig.from_dict` checks everything at once and raises one `ConfigError` listing every
problem with its path, so a user fixes a config in one pass. The JSON Schema in
`schemas/config.schema.json` describes the same rules for editors; a test keeps them in step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from engine.dedupe import DEFAULT_MAX_IDS, DEFAULT_WINDOW_MS
from engine.durations import format_duration, parse_duration
from engine.errors import ConfigError
from engine.lift import DEFAULT_LIFT, DEPRECATED_LIFTS, LIFT_MEASURES

log = logging.getLogger("engine.config")

DEFAULT_GAIN: Final = 2.0
DEFAULT_PRIOR_EPISODES: Final = 10.0
DEFAULT_PRIOR: Final = 0.15
DEFAULT_PRIOR_WEIGHT: Final = 10.0
DEFAULT_THRESHOLD: Final = 0.5
DEFAULT_Z: Final = 1.0
DEFAULT_COOLDOWN_MS: Final = 86_400_000  # one day
MAX_MAGNITUDE: Final = 1e6
"""The largest |weight|, gain, priorWeight and z: far beyond any useful value, and small enough
that α and β summed over any number of events stay finite floats (the Beta model's spread
multiplies α, β and the cube of their sum; a weight of 1e308 made p NaN). `priorEpisodes` has
no maximum: any positive real is valid (SPEC §2), and the blend stays finite up to 1e308."""

_TOP_KEYS: Final = frozenset(
    {
        "$schema",
        "episodeTimeout",
        "dedupeWindow",
        "dedupeMaxIds",
        "stateTtl",
        "learning",
        "intents",
    }
)
MAX_DEDUPE_IDS: Final = 100_000
"""The largest `dedupeMaxIds`: 1.6 MB of remembered ids per user is already far more than a
state should carry; a stream with more retries than that per user needs a dedupe store."""
_LEARNING_KEYS: Final = frozenset({"gain", "priorEpisodes", "lift", "halfLife"})
_INTENT_KEYS: Final = frozenset(
    {
        "signals",
        "outcome",
        "halfLife",
        "attribution",
        "prior",
        "priorWeight",
        "threshold",
        "z",
        "cooldown",
        "resetOnOutcome",
    }
)


def _frozen_getstate(obj: Any) -> list[object]:
    """dataclasses' `__getstate__` of a frozen slots class: the fields' values in order."""
    return [getattr(obj, f.name) for f in fields(obj)]


def _frozen_setstate(obj: Any, state: list[object]) -> None:
    """dataclasses' `__setstate__` of a frozen slots class (object.__setattr__: it is frozen)."""
    for f, value in zip(fields(obj), state, strict=False):
        object.__setattr__(obj, f.name, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class LearningConfig:
    """Engine-wide learning options (`learning:` in the config)."""

    gain: float = DEFAULT_GAIN
    """Cap on the learned estimate: learned lies in [-gain·|w0|, gain·|w0|]. >= 0."""
    prior_episodes: float = DEFAULT_PRIOR_EPISODES
    """k: how much contrast (nEff) it takes to weigh as much as the initial weight. > 0."""
    lift: str = DEFAULT_LIFT
    """Association measure, one of `engine.lift.LIFT_MEASURES`."""
    half_life_ms: int | None = None
    """Learned counts (hits, misses, base rate) decay at this rate; None: they never decay."""

    # Pickling (the lookup API process gets the config pickled): the pair dataclasses gives a
    # frozen slots class, written out because a mypyc-compiled class does not keep it
    # (`make compiled`); same state, same behaviour in the pure build.
    def __getstate__(self) -> list[object]:
        return _frozen_getstate(self)

    def __setstate__(self, state: list[object]) -> None:
        _frozen_setstate(self, state)


@dataclass(frozen=True, slots=True, kw_only=True)
class IntentConfig:
    """One intent: its signals with initial weights, its outcome and its prediction model."""

    signals: Mapping[str, float]
    """Signal name -> initial weight w0 (a finite number of at most `MAX_MAGNITUDE` either
    way; negative weights count against)."""
    outcome: str | None = None
    """The event the intent predicts; without one the intent never learns."""
    half_life_ms: int | None = None
    """Evidence decays toward the prior at this rate; also the attribution share's half-life."""
    attribution_ms: int | None = None
    """How long a closed episode waits for the outcome before it counts as a miss."""
    prior: float = DEFAULT_PRIOR
    """Prior mean of p, in (0, 1)."""
    prior_weight: float = DEFAULT_PRIOR_WEIGHT
    """Prior strength alpha0 + beta0, > 0."""
    threshold: float = DEFAULT_THRESHOLD
    """Reveal needs both p and its lower bound p - z·sd at or above this."""
    z: float = DEFAULT_Z
    """Width of the lower bound in standard deviations."""
    cooldown_ms: int = DEFAULT_COOLDOWN_MS
    """No reveal for this long after a reveal and after an outcome."""
    reset_on_outcome: bool = True
    """On the outcome, evidence returns to the prior (learned counts are kept)."""

    # Pickling: see LearningConfig.
    def __getstate__(self) -> list[object]:
        return _frozen_getstate(self)

    def __setstate__(self, state: list[object]) -> None:
        _frozen_setstate(self, state)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The validated config. Build it with `EngineConfig.from_dict`.

    `signal_index`, `outcome_index`, `touched_index` and `attribution_intents` are derived
    lookups for the per-event path (built once here: the config never changes); they are not
    part of equality.
    """

    intents: Mapping[str, IntentConfig]
    episode_timeout_ms: int | None = None
    """An idle gap longer than this closes the open episode; None: only end_episode closes."""
    learning: LearningConfig = field(default_factory=LearningConfig)
    dedupe_window_ms: int = DEFAULT_WINDOW_MS
    """A user remembers the event ids it applied for this long (event time), so a producer's
    retry of one counts once (`engine.dedupe`); 0: no deduplication by id."""
    dedupe_max_ids: int = DEFAULT_MAX_IDS
    """Most ids a user remembers (16 bytes each); past it the oldest are forgotten early."""
    state_ttl_ms: int | None = None
    """A user whose newest event is older than this (event time) has expired: its state is
    deleted, and a later event of the user starts a fresh one. None: users never expire. At
    least `episodeTimeout` plus the longest `attribution`, so an expiring user has no open
    episode and no held one (`expires_at`)."""
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """Non-fatal remarks found while loading (deprecated lift, outcome listed as a signal)."""
    signal_index: Mapping[str, tuple[str, ...]] = field(init=False, compare=False, repr=False)
    """Event name -> intents that list it as a signal (and not as their outcome)."""
    outcome_index: Mapping[str, tuple[str, ...]] = field(init=False, compare=False, repr=False)
    """Event name -> intents whose outcome it is."""
    touched_index: Mapping[str, tuple[str, ...]] = field(init=False, compare=False, repr=False)
    """Event name -> the intents whose prediction it can change: its `outcome_index` intents,
    then its `signal_index` ones not already listed."""
    attribution_intents: tuple[tuple[str, IntentConfig], ...] = field(
        init=False, compare=False, repr=False
    )
    """(name, config) of each intent with `attribution`: the only ones that hold episodes."""

    # Pickling: see LearningConfig.
    def __getstate__(self) -> list[object]:
        return _frozen_getstate(self)

    def __setstate__(self, state: list[object]) -> None:
        _frozen_setstate(self, state)

    def __post_init__(self) -> None:
        signal_index: dict[str, list[str]] = {}
        outcome_index: dict[str, list[str]] = {}
        for name, intent in self.intents.items():
            if intent.outcome is not None:
                outcome_index.setdefault(intent.outcome, []).append(name)
            for signal in intent.signals:
                if (
                    signal != intent.outcome
                ):  # the outcome is never a seen signal: it cannot learn from itself
                    signal_index.setdefault(signal, []).append(name)
        object.__setattr__(self, "signal_index", {k: tuple(v) for k, v in signal_index.items()})
        object.__setattr__(self, "outcome_index", {k: tuple(v) for k, v in outcome_index.items()})
        touched = {
            name: tuple(dict.fromkeys((*outcome_index.get(name, ()), *signal_index.get(name, ()))))
            for name in (*outcome_index, *signal_index)
        }
        object.__setattr__(self, "touched_index", touched)
        attribution = tuple(
            (name, intent)
            for name, intent in self.intents.items()
            if intent.attribution_ms is not None
        )
        object.__setattr__(self, "attribution_intents", attribution)

    @classmethod
    def from_dict(cls, obj: object) -> EngineConfig:
        """Validate a config as users write it (camelCase keys, durations as `30m` or ms).

        Args:
            obj: the parsed JSON/YAML document.

        Returns:
            The validated config. Deprecation and other warnings are logged once each, and kept
            in `warnings`.

        Raises:
            ConfigError: listing every problem, one per line, each with its path.
        """
        problems: list[tuple[str, str]] = []
        warnings: list[str] = []
        config = _read_config(obj, problems, warnings)
        if problems or config is None:
            raise ConfigError(problems)
        for warning in warnings:
            log.warning("%s", warning)
        return config

    def to_dict(self) -> dict[str, Any]:
        """Return the config in the users' camelCase form; `from_dict` reads it back equal."""
        out: dict[str, Any] = {}
        if self.episode_timeout_ms is not None:
            out["episodeTimeout"] = format_duration(self.episode_timeout_ms)
        # Only when set: the config embedded in serialized engine states stays as it was.
        if self.dedupe_window_ms != DEFAULT_WINDOW_MS:
            out["dedupeWindow"] = format_duration(self.dedupe_window_ms)
        if self.dedupe_max_ids != DEFAULT_MAX_IDS:
            out["dedupeMaxIds"] = self.dedupe_max_ids
        if self.state_ttl_ms is not None:
            out["stateTtl"] = format_duration(self.state_ttl_ms)
        learning: dict[str, Any] = {
            "gain": self.learning.gain,
            "priorEpisodes": self.learning.prior_episodes,
            "lift": self.learning.lift,
        }
        if self.learning.half_life_ms is not None:
            learning["halfLife"] = format_duration(self.learning.half_life_ms)
        out["learning"] = learning
        out["intents"] = {name: _intent_to_dict(i) for name, i in self.intents.items()}
        return out


def _intent_to_dict(intent: IntentConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"signals": dict(intent.signals)}
    if intent.outcome is not None:
        out["outcome"] = intent.outcome
    if intent.half_life_ms is not None:
        out["halfLife"] = format_duration(intent.half_life_ms)
    if intent.attribution_ms is not None:
        out["attribution"] = format_duration(intent.attribution_ms)
    out.update(
        prior=intent.prior,
        priorWeight=intent.prior_weight,
        threshold=intent.threshold,
        z=intent.z,
        cooldown=format_duration(intent.cooldown_ms),
        resetOnOutcome=intent.reset_on_outcome,
    )
    return out


# --- validation -------------------------------------------------------------------------------
# Each reader appends (path, message) problems and returns its best value, so one pass finds
# every problem in the document.


def _read_config(
    obj: object, problems: list[tuple[str, str]], warnings: list[str]
) -> EngineConfig | None:
    if not isinstance(obj, Mapping):
        problems.append(("", f"the config must be a mapping (got {type(obj).__name__})"))
        return None
    _unknown_keys(obj, _TOP_KEYS, "", problems)
    timeout = _duration(obj, "episodeTimeout", "", problems)
    window = _duration(obj, "dedupeWindow", "", problems)
    max_ids = _number(
        obj, "dedupeMaxIds", "", problems, DEFAULT_MAX_IDS, minimum=1, maximum=MAX_DEDUPE_IDS
    )
    if not float(max_ids).is_integer():
        problems.append(("dedupeMaxIds", f"must be a whole number (got {max_ids!r})"))
    ttl = _duration(obj, "stateTtl", "", problems)
    learning = _read_learning(obj.get("learning", {}), problems, warnings)
    intents_obj = obj.get("intents")
    intents: dict[str, IntentConfig] = {}
    if intents_obj is None:
        problems.append(("intents", "is required: declare at least one intent"))
    elif not isinstance(intents_obj, Mapping):
        problems.append(
            ("intents", f"must be a mapping of intent names (got {_kind(intents_obj)})")
        )
    elif not intents_obj:
        problems.append(("intents", "must declare at least one intent"))
    else:
        for name, intent_obj in intents_obj.items():
            intent = _read_intent(name, intent_obj, problems, warnings)
            if intent is not None:
                intents[str(name)] = intent
    if ttl is not None:
        _check_state_ttl(ttl, timeout, intents, problems)
    return EngineConfig(
        intents=intents,
        episode_timeout_ms=timeout,
        learning=learning,
        dedupe_window_ms=DEFAULT_WINDOW_MS if window is None else window,
        dedupe_max_ids=int(max_ids) if float(max_ids).is_integer() else DEFAULT_MAX_IDS,
        state_ttl_ms=ttl,
        warnings=tuple(warnings),
    )


def _check_state_ttl(
    ttl: int,
    timeout: int | None,
    intents: Mapping[str, IntentConfig],
    problems: list[tuple[str, str]],
) -> None:
    """An expiring user must have nothing left to close or settle: its open episode closed
    by the timeout, and every held episode's attribution window over."""
    if timeout is None:
        problems.append(
            ("stateTtl", "needs episodeTimeout: an expiring user's open episode closes by it")
        )
        return
    windows = [i.attribution_ms for i in intents.values() if i.attribution_ms is not None]
    needed = timeout + max(windows, default=0)
    if ttl <= needed:
        problems.append(
            (
                "stateTtl",
                f"must be longer than episodeTimeout plus the longest attribution "
                f"({format_duration(needed)}), so an expiring user has no episode left open "
                f"or held (got {format_duration(ttl)})",
            )
        )


def _read_learning(
    obj: object, problems: list[tuple[str, str]], warnings: list[str]
) -> LearningConfig:
    if not isinstance(obj, Mapping):
        problems.append(("learning", f"must be a mapping (got {_kind(obj)})"))
        return LearningConfig()
    _unknown_keys(obj, _LEARNING_KEYS, "learning", problems)
    gain = _number(
        obj, "gain", "learning", problems, DEFAULT_GAIN, minimum=0.0, maximum=MAX_MAGNITUDE
    )
    prior_episodes = _number(
        obj,
        "priorEpisodes",
        "learning",
        problems,
        DEFAULT_PRIOR_EPISODES,
        exclusive_minimum=0.0,  # no maximum: any positive real is valid (SPEC §2)
    )
    lift = obj.get("lift", DEFAULT_LIFT)
    if not isinstance(lift, str) or lift not in LIFT_MEASURES:
        choices = ", ".join(LIFT_MEASURES)
        problems.append(("learning.lift", f"must be one of {choices} (got {lift!r:.40})"))
        lift = DEFAULT_LIFT
    elif lift in DEPRECATED_LIFTS:
        warnings.append(
            f"learning.lift: {lift!r} is deprecated upstream; "
            f"{DEFAULT_LIFT!r} (the default) is the supported measure"
        )
    half_life = _duration(obj, "halfLife", "learning", problems, positive=True)
    return LearningConfig(
        gain=gain, prior_episodes=prior_episodes, lift=lift, half_life_ms=half_life
    )


def _read_intent(
    name: object, obj: object, problems: list[tuple[str, str]], warnings: list[str]
) -> IntentConfig | None:
    if isinstance(name, str) and not _is_text(name):
        problems.append(("intents", _not_text(name)))
        return None
    path = f"intents.{name}"
    if not isinstance(name, str) or not name:
        problems.append((path, "intent names must be non-empty strings"))
        return None
    if not isinstance(obj, Mapping):
        problems.append((path, f"must be a mapping with `signals` (got {_kind(obj)})"))
        return None
    _unknown_keys(obj, _INTENT_KEYS, path, problems)
    signals = _read_signals(obj.get("signals"), f"{path}.signals", problems)
    outcome = obj.get("outcome")
    if outcome is not None and (not isinstance(outcome, str) or not outcome):
        problems.append((f"{path}.outcome", f"must be an event name (got {outcome!r:.40})"))
        outcome = None
    elif outcome is not None and not _is_text(outcome):
        problems.append((f"{path}.outcome", _not_text(outcome)))
        outcome = None
    if outcome is not None and outcome in signals:
        warnings.append(
            f"{path}.outcome: {outcome!r} is also one of this intent's signals; "
            "it is never counted as seen, so it adds no evidence and cannot learn from itself"
        )
    reset = obj.get("resetOnOutcome", True)
    if not isinstance(reset, bool):
        problems.append((f"{path}.resetOnOutcome", f"must be true or false (got {reset!r:.40})"))
        reset = True
    half_life_ms = _duration(obj, "halfLife", path, problems, positive=True)
    attribution_ms = _duration(obj, "attribution", path, problems)
    before = len(problems)
    prior = _number(
        obj,
        "prior",
        path,
        problems,
        DEFAULT_PRIOR,
        exclusive_minimum=0.0,
        exclusive_maximum=1.0,
    )
    prior_weight = _number(
        obj,
        "priorWeight",
        path,
        problems,
        DEFAULT_PRIOR_WEIGHT,
        exclusive_minimum=0.0,
        maximum=MAX_MAGNITUDE,
    )
    if len(problems) == before:
        _check_prior_parameters(path, prior, prior_weight, problems)
    return IntentConfig(
        signals=signals,
        outcome=outcome,
        half_life_ms=half_life_ms,
        attribution_ms=attribution_ms,
        prior=prior,
        prior_weight=prior_weight,
        threshold=_number(
            obj, "threshold", path, problems, DEFAULT_THRESHOLD, minimum=0.0, maximum=1.0
        ),
        z=_number(obj, "z", path, problems, DEFAULT_Z, minimum=0.0, maximum=MAX_MAGNITUDE),
        cooldown_ms=_or_default(_duration(obj, "cooldown", path, problems), DEFAULT_COOLDOWN_MS),
        reset_on_outcome=reset,
    )


def _check_prior_parameters(
    path: str,
    prior: float,
    prior_weight: float,
    problems: list[tuple[str, str]],
) -> None:
    """α0 = prior·priorWeight and β0 = (1 − prior)·priorWeight must be positive floats: a
    product that underflows to 0 (priorWeight 1e-323) leaves Beta(0, β), no distribution, and
    with both 0 a p of 0/0 once the evidence has decayed away."""
    for name, product in (
        ("prior·priorWeight", prior * prior_weight),
        ("(1 − prior)·priorWeight", (1.0 - prior) * prior_weight),
    ):
        if product == 0.0:  # only a given priorWeight < 1 can do it: the default is 10
            problems.append(
                (
                    f"{path}.priorWeight",
                    f"too small: {name} must be a positive float "
                    f"(got prior {prior!r}, priorWeight {prior_weight!r})",
                )
            )
            return


def _read_signals(obj: object, path: str, problems: list[tuple[str, str]]) -> dict[str, float]:
    if obj is None:
        problems.append((path, "is required: a mapping of event name to initial weight"))
        return {}
    if not isinstance(obj, Mapping):
        problems.append((path, f"must be a mapping of event name to weight (got {_kind(obj)})"))
        return {}
    signals: dict[str, float] = {}
    for signal, weight in obj.items():
        if isinstance(signal, str) and not _is_text(signal):
            problems.append((path, _not_text(signal)))
        elif not isinstance(signal, str) or not signal:
            problems.append((f"{path}.{signal}", "signal names must be non-empty strings"))
        elif not _is_finite_number(weight):
            problems.append(
                (f"{path}.{signal}", f"weight must be a finite number (got {weight!r:.40})")
            )
        elif abs(weight) > MAX_MAGNITUDE:
            rule = f"weight must be between -{MAX_MAGNITUDE:g} and {MAX_MAGNITUDE:g}"
            problems.append((f"{path}.{signal}", f"{rule} (got {weight:g})"))
        else:
            signals[signal] = float(weight)
    return signals


def _number(
    obj: Mapping[str, Any],
    key: str,
    parent: str,
    problems: list[tuple[str, str]],
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    exclusive_maximum: float | None = None,
) -> float:
    if key not in obj:
        return default
    value = obj[key]
    path = f"{parent}.{key}" if parent else key
    if not _is_finite_number(value):
        problems.append((path, f"must be a finite number (got {value!r:.40})"))
        return default
    number = float(value)
    rule = None
    if minimum is not None and number < minimum:
        rule = f"must be >= {minimum:g}"
    elif maximum is not None and number > maximum:
        rule = f"must be <= {maximum:g}"
    elif exclusive_minimum is not None and number <= exclusive_minimum:
        rule = f"must be > {exclusive_minimum:g}"
    elif exclusive_maximum is not None and number >= exclusive_maximum:
        rule = f"must be < {exclusive_maximum:g}"
    if rule is not None:
        problems.append((path, f"{rule} (got {value!r})"))
        return default
    return number


def _duration(
    obj: Mapping[str, Any],
    key: str,
    parent: str,
    problems: list[tuple[str, str]],
    *,
    positive: bool = False,
) -> int | None:
    if obj.get(key) is None:
        return None
    path = f"{parent}.{key}" if parent else key
    try:
        ms = parse_duration(obj[key])
    except ValueError as exc:
        problems.append((path, str(exc)))
        return None
    if positive and ms == 0:
        problems.append((path, "must be longer than 0 (omit it to switch decay off)"))
        return None
    return ms


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def _unknown_keys(
    obj: Mapping[Any, Any], allowed: frozenset[str], path: str, problems: list[tuple[str, str]]
) -> None:
    for key in obj:
        if key not in allowed:
            shown = key if not isinstance(key, str) or _is_text(key) else ascii(key)
            where = f"{path}.{shown}" if path else str(shown)
            choices = ", ".join(sorted(k for k in allowed if not k.startswith("$")))
            problems.append((where, f"unknown key; expected one of {choices}"))


def _is_text(name: str) -> bool:
    """Whether `name` is valid Unicode text: no lone surrogate (json.loads makes one of
    "\\ud800"), which UTF-8, and so a serialized state or an output, cannot hold."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_text(name: str) -> str:
    return f"name {name!r:.60} is not valid Unicode text (it holds a lone surrogate)"


def _is_finite_number(value: object) -> bool:
    """An int or float that is finite as a float (an int too large for a float is not)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range, e.g. 400 digits in a YAML file
        return False


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__
