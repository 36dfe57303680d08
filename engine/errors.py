"""Exceptions raised by the engine, all under one root, `EngineError`.

The engine raises only for contract violations: a bad config, an impossible state, or a call
that names something the config does not declare. Which of these a stream processor dead-letters
and which stop it is the shell's decision, not the engine's.
"""

from __future__ import annotations

from engine.durations import MAX_TIME_MS, MIN_TIME_MS


class EngineError(Exception):
    """Root of every error the engine raises."""


class ConfigError(EngineError):
    """Raised by `EngineConfig.from_dict` when the config breaks one or more rules.

    `problems` holds one `(path, message)` pair per problem, in document order; the exception
    text lists them one per line, so a user fixes them all in one pass.
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        lines = [f"{path}: {message}" if path else message for path, message in self.problems]
        count = len(lines)
        head = f"invalid oracular config ({count} problem{'s' if count != 1 else ''}):"
        super().__init__("\n".join([head, *(f"  {line}" for line in lines)]))


class UnknownIntentError(EngineError):
    """Raised when a call names an intent the state's config does not declare."""

    def __init__(self, intent: str, declared: tuple[str, ...]) -> None:
        self.intent = intent
        self.declared = declared
        choices = ", ".join(repr(name) for name in declared) or "none"
        super().__init__(
            f"unknown intent {intent!r}: the config declares {choices}; "
            "add it under `intents:` or use one of those names"
        )


class InvalidTimeError(EngineError):
    """Raised when a timestamp is not a whole number of epoch milliseconds from 1970 to the
    end of year 9999 (0 to 253,402,300,799,999)."""

    def __init__(self, value: object) -> None:
        self.value = value
        if isinstance(value, int) and not isinstance(value, bool):
            problem = f"epoch milliseconds from {MIN_TIME_MS} (1970) to {MAX_TIME_MS} (year 9999)"
            super().__init__(f"time must be {problem} (got {value!r:.40})")
            return
        super().__init__(
            f"time must be epoch milliseconds as an int (got {type(value).__name__} {value!r:.40})"
        )


class InvalidEventError(EngineError):
    """An input the engine cannot apply: an event without a name, a reveal without an intent."""


class StateFormatError(EngineError):
    """Raised by `deserialize` for bytes that are not a serialized engine state.

    The message says what was wrong; the bytes themselves are never quoted (they may be large
    or sensitive).
    """


class StateVersionError(StateFormatError):
    """Raised by `deserialize` for a state written by a newer engine, or one no migration reaches.

    Operators: deploy the engine version that wrote the state, or reset the state table
    (`oracular reset APP_ID`) and replay the input topic.
    """
