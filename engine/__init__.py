"""The oracular engine: per-user episodes, online learning and calibrated intent predictions.

A pure, deterministic port of the original oracular engine (its model is explained in
`engine/README.md`): standard library only, no I/O, no clock, no randomness; every transition
returns a new state and leaves its input untouched.
"""

from engine.config import EngineConfig, IntentConfig, LearningConfig
from engine.durations import parse_duration
from engine.episodes import (
    ClosedEpisode,
    IntentVerdict,
    Transition,
    close_if_due,
    end_episode,
    episode_closed,
    timeout_deadline,
)
from engine.errors import (
    ConfigError,
    EngineError,
    InvalidEventError,
    InvalidTimeError,
    StateFormatError,
    StateVersionError,
    UnknownIntentError,
)
from engine.lift import LIFT_MEASURES
from engine.observe import observe, observe_transition
from engine.predict import (
    Explanation,
    Prediction,
    SignalExplanation,
    explain,
    mark_revealed,
    predict,
    predict_many,
    should_reveal,
)
from engine.replay import END_OF_TIME, Event, Replayer, ReplayResult, Step, apply_event, replay
from engine.serialize import (
    FORMAT_VERSION,
    MIGRATIONS,
    deserialize,
    serialize,
    state_from_record,
    state_to_record,
)
from engine.state import (
    EngineState,
    EpisodeState,
    Evidence,
    IntentState,
    PendingEpisode,
    SignalRecord,
    create_state,
)

__all__ = [
    "END_OF_TIME",
    "FORMAT_VERSION",
    "LIFT_MEASURES",
    "MIGRATIONS",
    "ClosedEpisode",
    "ConfigError",
    "EngineConfig",
    "EngineError",
    "EngineState",
    "EpisodeState",
    "Event",
    "Evidence",
    "Explanation",
    "IntentConfig",
    "IntentState",
    "IntentVerdict",
    "InvalidEventError",
    "InvalidTimeError",
    "LearningConfig",
    "PendingEpisode",
    "Prediction",
    "ReplayResult",
    "Replayer",
    "SignalExplanation",
    "SignalRecord",
    "StateFormatError",
    "StateVersionError",
    "Step",
    "Transition",
    "UnknownIntentError",
    "apply_event",
    "close_if_due",
    "create_state",
    "deserialize",
    "end_episode",
    "episode_closed",
    "explain",
    "mark_revealed",
    "observe",
    "observe_transition",
    "parse_duration",
    "predict",
    "predict_many",
    "replay",
    "serialize",
    "should_reveal",
    "state_from_record",
    "state_to_record",
    "timeout_deadline",
]
