"""The engine's state: records replaced wholesale on every change, never mutated.

Mappings inside the state are plain dicts treated as read-only: a transition builds new dicts
for what it changes and shares everything else with the previous state (structural sharing), so
`prev` stays valid after `observe` returns `next`, as `episode_closed(prev, next)` needs.

Counts and evidence that decay are stored *valued at* a time (`at`): the stored number is the
amount as of `at`, and a read at a later time t multiplies it by 2^(−(t − at)/halfLife).
Exponential decay is linear, so this equals decaying every recorded amount from its own moment.

The records are plain slotted dataclasses, not frozen ones, and so are the per-event results
around them (`Transition`, `Step`, `Prediction`) and the stream's per-message records: a
frozen dataclass's generated `__init__` sets each field through `object.__setattr__`, about
four times the cost of a plain one, and an event builds about a dozen records (a sixth of the
engine's CPU went to those constructors). Nothing changes a record once built: every function
here returns new ones, and a caller must not assign to them either. They hash by value
(`unsafe_hash`, safe because they are never changed) as frozen ones would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from engine.config import EngineConfig


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class SignalRecord:
    """Learned counts: episodes with (hits) and without (misses) the outcome.

    Used for one signal (`IntentState.learned[signal]`: episodes in which the signal was seen)
    and for the intent's base rate (`IntentState.episodes`: all its episodes). Floats, because
    attribution shares and decay give fractions.
    """

    hits: float = 0.0
    misses: float = 0.0
    at: int = 0
    """Epoch ms the counts are valued at (the last time they changed)."""


EpisodeCounts = SignalRecord
"""The intent's base-rate counts have the same shape as a signal's."""


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class Evidence:
    """Evidence one signal added to the intent's Beta, valued at `at` (decays with halfLife)."""

    alpha: float = 0.0
    beta: float = 0.0
    at: int = 0


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class PendingEpisode:
    """A closed episode an attribution intent holds while it waits for the outcome."""

    closed_at: int
    """Epoch ms the episode closed; its window ends at closed_at + attribution."""
    signals: list[str]
    """The intent's signals seen in it (sorted), each to get a share of a hit or a miss.
    A list, never mutated (replaced with the episode)."""


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class IntentState:
    """Everything one intent remembers for one user."""

    episodes: SignalRecord = field(default_factory=SignalRecord)
    """Base rate: episodes with (hits) and without (misses) the outcome."""
    learned: Mapping[str, SignalRecord] = field(default_factory=dict)
    """Declared signal -> its learned counts. Every declared signal has an entry."""
    evidence: Mapping[str, Evidence] = field(default_factory=dict)
    """Signal -> evidence it added since the last reset (only signals that added some)."""
    seen: Mapping[str, int] = field(default_factory=dict)
    """Signal -> occurrences in the open episode since the intent's last outcome."""
    resolved: bool = False
    """The outcome arrived in the open episode: the close gives no miss and holds nothing."""
    pending: list[PendingEpisode] = field(default_factory=list)
    """Closed episodes waiting for the outcome (attribution), oldest first, at most 32.
    A list, replaced wholesale, never mutated."""
    last_outcome_at: int | None = None
    last_revealed_at: int | None = None


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class EpisodeState:
    """The one open episode, shared by all intents; both fields None when none is open."""

    started_at: int | None = None
    last_event_at: int | None = None
    """Time of the last event in the open episode; the idle gap is measured from it."""


NO_EPISODE = EpisodeState()


@dataclass(slots=True, unsafe_hash=True)  # never changed: see engine/state.py
class EngineState:
    """One user's engine state. Build it with `create_state(config)`."""

    config: EngineConfig = field(repr=False)
    """The config the state runs under. Not serialized into compact blobs; never migrated."""
    episode: EpisodeState = NO_EPISODE
    intents: Mapping[str, IntentState] = field(default_factory=dict)
    clock: int | None = None
    """The latest time any transition was applied at: time never runs backwards in a state."""


class EvidenceAmounts(Protocol):
    """What a prediction reads of one signal's evidence (an `Evidence`, or a stored one as
    decoded)."""

    @property
    def alpha(self) -> float: ...
    @property
    def beta(self) -> float: ...
    @property
    def at(self) -> int: ...


class Predictable(Protocol):
    """What a prediction reads of an intent: its evidence, its last outcome and its last
    reveal. An `IntentState` is one; so is a stored intent record decoded as it is, whose
    other parts a prediction never reads (`Reading`)."""

    @property
    def evidence(self) -> Mapping[str, EvidenceAmounts]: ...
    @property
    def last_outcome_at(self) -> int | None: ...
    @property
    def last_revealed_at(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Reading:
    """What a prediction reads of a user's state, and no more: the config, the clock and, per
    declared intent, a `Predictable`. `predict_read` takes it as it takes an `EngineState` and
    gives the same predictions; nothing else does (no `observe`, no `explain`: those need the
    counts a reading leaves out). A reader that only predicts builds one from a stored value
    in a fraction of a full state's time (`engine.serialize.reading_from_proven`)."""

    config: EngineConfig
    intents: Mapping[str, Predictable]
    clock: int | None


def create_state(config: EngineConfig) -> EngineState:
    """Return a fresh state for `config`: no episode, every intent at its prior.

    Args:
        config: the validated config (`EngineConfig.from_dict`).

    Returns:
        The initial state.
    """
    return EngineState(
        config=config,
        intents={name: fresh_intent(intent.signals) for name, intent in config.intents.items()},
    )


def fresh_intent(signals: Mapping[str, float]) -> IntentState:
    """Return an intent that has learned nothing, with a zero record for each signal."""
    zero = SignalRecord()
    return IntentState(learned=dict.fromkeys(signals, zero))
