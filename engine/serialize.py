"""`serialize` / `deserialize`: a state as versioned msgpack bytes, and back.

The record is a msgpack array whose first item is the format version:

    [version, config | None, clock, episode_started_at, episode_last_event_at, {intent: [
        [base_hits, base_misses, at],           # episodes (base rate)
        {signal: [hits, misses, at]},           # learned
        {signal: [alpha, beta, at]},            # evidence
        {signal: repeat_count},                 # seen
        resolved, [[closed_at, [signal, ...]], ...],  # pending
        last_outcome_at, last_revealed_at]}]

Floats are float64, so a round trip is exact bit for bit. Older versions are upgraded by the
functions in `MIGRATIONS` (version n -> n + 1, eventsourcing's upcaster convention) or by a
caller's `migrate` hook; newer versions are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from engine.config import EngineConfig, IntentConfig
from engine.durations import MAX_TIME_MS, MIN_TIME_MS
from engine.errors import ConfigError, StateFormatError, StateVersionError
from engine.learning import judge
from engine.packing import PackingError, pack, unpack
from engine.state import (
    EngineState,
    EpisodeState,
    Evidence,
    IntentState,
    PendingEpisode,
    Predictable,
    Reading,
    SignalRecord,
    fresh_intent,
)

FORMAT_VERSION: Final = 1

Record = list[Any]
Migration = Callable[[Record], Record]

MIGRATIONS: dict[int, Migration] = {}
"""Version n -> a function upgrading a version-n record to version n + 1."""


def serialize(state: EngineState, *, include_config: bool = True) -> bytes:
    """Encode `state` as msgpack bytes that start with the format version.

    Args:
        state: the state to encode.
        include_config: embed the config so `deserialize(blob)` needs none; the stream
            processor leaves it out (every user shares one config) and passes `config=`.

    Returns:
        The bytes; `deserialize(serialize(s)) == s`.
    """
    return pack(state_to_record(state, include_config=include_config))


def state_to_record(state: EngineState, *, include_config: bool = True) -> Record:
    """The state as plain msgpack-able values (see the module docstring for the layout)."""
    return [
        *record_head(state, include_config=include_config),
        {name: intent_to_record(intent) for name, intent in state.intents.items()},
    ]


def record_head(state: EngineState, *, include_config: bool = True) -> Record:
    """`state_to_record` but its last item (the intents' map)."""
    return [
        FORMAT_VERSION,
        state.config.to_dict() if include_config else None,
        state.clock,
        state.episode.started_at,
        state.episode.last_event_at,
    ]


def intent_to_record(intent: IntentState) -> list[Any]:
    """One intent's part of `state_to_record` (the value under its name)."""
    return [
        _counts(intent.episodes),
        # `_counts` inlined: every write of a changed intent runs this for each signal
        {name: [r.hits, r.misses, r.at] for name, r in intent.learned.items()},
        {name: [e.alpha, e.beta, e.at] for name, e in intent.evidence.items()},
        dict(intent.seen),
        intent.resolved,
        [[held.closed_at, list(held.signals)] for held in intent.pending],
        intent.last_outcome_at,
        intent.last_revealed_at,
    ]


def _counts(record: SignalRecord) -> list[Any]:
    return [record.hits, record.misses, record.at]


def deserialize(
    blob: bytes,
    *,
    config: EngineConfig | None = None,
    migrate: Callable[[Record, int], Record] | None = None,
) -> EngineState:
    """Decode bytes from `serialize`.

    Args:
        blob: the serialized state.
        config: the config to run under; intents and signals it no longer declares are
            pruned and new ones start fresh. Required when the blob carries no config.
        migrate: optional hook `(record, version) -> record` upgrading a record of an older
            version to the current one; without it the registered `MIGRATIONS` run.

    Returns:
        The state.

    Raises:
        StateVersionError: the blob was written by a newer engine, or no migration reaches it.
        StateFormatError: the bytes are not a serialized engine state.
        TypeError: `blob` is not bytes, or `config` not an `EngineConfig`.
    """
    if not isinstance(blob, bytes | bytearray | memoryview):
        msg = f"deserialize takes the bytes serialize returned (got {type(blob).__name__})"
        raise TypeError(msg)
    _check_config(config)
    try:
        record = unpack(blob)
    except PackingError as exc:
        msg = f"not a serialized engine state: {exc}"
        raise StateFormatError(msg) from exc
    return state_from_record(record, config=config, migrate=migrate)


def state_from_record(
    record: Any,
    *,
    config: EngineConfig | None = None,
    migrate: Callable[[Record, int], Record] | None = None,
) -> EngineState:
    """Build a state from a decoded record (see `deserialize`)."""
    _check_config(config)
    record = _upgrade(record, migrate)
    if config is not None:
        fast = _plain_state(record, config)
        if fast is not None:
            return _fit_to_config(fast)
    try:
        _, stored_config, clock, started_at, last_event_at, intents = record
        if config is None:
            if stored_config is None:
                msg = "this state was serialized without its config: pass config= to deserialize"
                raise StateFormatError(msg)
            config = EngineConfig.from_dict(stored_config)
        state = EngineState(
            config,
            EpisodeState(_opt_int(started_at), _opt_int(last_event_at)),
            {_name(name): _intent_from_record(value) for name, value in intents.items()},
            _opt_int(clock),
        )
    except (TypeError, ValueError, AttributeError, OverflowError, ConfigError) as exc:
        msg = f"not a serialized engine state (version {FORMAT_VERSION}): {exc}"
        raise StateFormatError(msg) from exc
    check_state(state)
    return _fit_to_config(state)


def _plain_state(record: Record, config: EngineConfig) -> EngineState | None:
    """The state of a record as `state_to_record` writes it, built without a call per number,
    or None for anything else (the checked path then decides and explains).

    It accepts only what the checked path accepts, and builds the same state: the same types
    exactly (floats for amounts, not the ints the checked path converts), and every number in
    the ranges `check_state` holds it to, so that check is passed already. The checked path
    made several Python calls per signal (`_record`, `_float`, `_int`, `_name`) and then
    walked the built state again for `check_state`: about two thirds of a stored user's
    decode (`python -m bench.offline`).
    """
    if len(record) != 6:
        return None
    _, _, clock, started_at, last_event_at, records = record
    if not (_plain_time(clock) and _plain_time(started_at) and _plain_time(last_event_at)):
        return None
    if type(records) is not dict:
        return None
    intents: dict[str, IntentState] = {}
    for name, value in records.items():
        if type(name) is not str:
            return None
        intent = _plain_intent(value)
        if intent is None:
            return None
        intents[name] = intent
    return EngineState(config, EpisodeState(started_at, last_event_at), intents, clock)


def state_from_proven(record: Sequence[Any], config: EngineConfig) -> EngineState:
    """The state of a record whose every type and range a typed decoder has already proven
    (`schemas.stored`'s msgspec decoder): what `_plain_state` accepts, with tuples where it
    has lists, and the same state `state_from_record(record, config=config)` builds.

    Nothing is checked again: the records are built from the decoded values as they are
    (the record's dicts and lists are taken over, so the caller must not keep them).
    """
    _, _, clock, started_at, last_event_at, records = record
    intents = {name: _proven_intent(value) for name, value in records.items()}
    state = EngineState(config, EpisodeState(started_at, last_event_at), intents, clock)
    return _fit_to_config(state)


def reading_from_proven(record: Sequence[Any], config: EngineConfig) -> Reading:
    """What predictions read of `state_from_proven(record, config)`, without building it: for
    a reader that only predicts (the lookup API), in a third of the time.

    The record is proven as for `state_from_proven`, with each intent's record decoded so
    that it names its evidence, last outcome and last reveal (`Predictable`:
    `schemas.stored` decodes intent records as named tuples), and taken as it is. Fitting it
    to `config` as `_fit_to_config` does changes, of what predictions read, only this: an
    intent the record lacks is fresh, and evidence of a signal no longer declared is dropped
    (held episodes judged when attribution was switched off move learned counts and the base
    rate, which predictions do not read). So the reading predicts what the state does.
    """
    stored = record[5]
    intents: dict[str, Predictable] = {}
    for name, intent_config in config.intents.items():
        intent = stored.get(name)
        if intent is None:
            intents[name] = _FRESH_READ
        elif intent.evidence.keys() <= intent_config.signals.keys():
            intents[name] = intent  # the common case: stored under the same config
        else:
            intents[name] = IntentState(
                evidence=_only(intent.evidence, intent_config.signals),
                last_outcome_at=intent.last_outcome_at,
                last_revealed_at=intent.last_revealed_at,
            )
    return Reading(config, intents, record[2])


_FRESH_READ: Final = IntentState()
"""What predictions read of a fresh intent (`fresh_intent`: no evidence, no outcome, no
reveal)."""


def _proven_intent(value: Sequence[Any]) -> IntentState:
    episodes, learned, evidence, seen, resolved, pending, outcome_at, revealed_at = value
    return IntentState(
        SignalRecord(*episodes),
        # Comprehensions, not dict(zip(keys, starmap(Record, values), strict=True)): a fifth
        # less time for these few-entry maps (the zip, starmap and dict calls cost more than
        # the one frame a comprehension adds; BENCHMARKS.md, cold batch lookups).
        {signal: SignalRecord(*counts) for signal, counts in learned.items()},
        {signal: Evidence(*amounts) for signal, amounts in evidence.items()},
        seen,
        resolved,
        [PendingEpisode(*held) for held in pending],
        outcome_at,
        revealed_at,
    )


def _plain_time(at: object) -> bool:
    return at is None or (type(at) is int and MIN_TIME_MS <= at <= MAX_TIME_MS)


def _plain_intent(value: object) -> IntentState | None:  # noqa: PLR0911 - an exit per check
    if type(value) is not list or len(value) != 8:
        return None
    episodes, learned, evidence, seen, resolved, pending, outcome_at, revealed_at = value
    if type(resolved) is not bool or not (_plain_time(outcome_at) and _plain_time(revealed_at)):
        return None
    base = _plain_record(episodes)
    if base is None or type(learned) is not dict or type(seen) is not dict:
        return None
    counts: dict[str, SignalRecord] = {}
    for signal, numbers in learned.items():  # `_plain_record` inlined: a call per signal
        if type(signal) is not str or type(numbers) is not list or len(numbers) != 3:
            return None
        hits, misses, at = numbers
        if not (
            type(hits) is float
            and type(misses) is float
            and type(at) is int
            and 0.0 <= hits <= MAX_AMOUNT
            and 0.0 <= misses <= MAX_AMOUNT
            and MIN_TIME_MS <= at <= MAX_TIME_MS
        ):
            return None
        counts[signal] = SignalRecord(hits, misses, at)
    for signal, count in seen.items():
        if type(signal) is not str or type(count) is not int or not 0 <= count <= MAX_COUNT:
            return None
    amounts = _plain_evidence(evidence)
    held = _plain_pending(pending)
    if amounts is None or held is None:
        return None
    return IntentState(base, counts, amounts, dict(seen), resolved, held, outcome_at, revealed_at)


def _plain_evidence(evidence: object) -> dict[str, Evidence] | None:
    if type(evidence) is not dict:
        return None
    amounts: dict[str, Evidence] = {}
    for signal, numbers in evidence.items():
        if type(signal) is not str or type(numbers) is not list or len(numbers) != 3:
            return None
        alpha, beta, at = numbers
        if not (
            type(alpha) is float
            and type(beta) is float
            and type(at) is int
            and 0.0 <= alpha <= MAX_AMOUNT
            and 0.0 <= beta <= MAX_AMOUNT
            and MIN_TIME_MS <= at <= MAX_TIME_MS
        ):
            return None
        amounts[signal] = Evidence(alpha, beta, at)
    return amounts


def _plain_pending(pending: object) -> list[PendingEpisode] | None:
    if type(pending) is not list:
        return None
    held: list[PendingEpisode] = []
    for entry in pending:
        if type(entry) is not list or len(entry) != 2:
            return None
        closed_at, names = entry
        if type(closed_at) is not int or not MIN_TIME_MS <= closed_at <= MAX_TIME_MS:
            return None
        if type(names) is not list or not all(type(n) is str for n in names):
            return None
        held.append(PendingEpisode(closed_at, list(names)))
    return held


def _plain_record(numbers: object) -> SignalRecord | None:
    if type(numbers) is not list or len(numbers) != 3:
        return None
    hits, misses, at = numbers
    if (
        type(hits) is float
        and type(misses) is float
        and type(at) is int
        and 0.0 <= hits <= MAX_AMOUNT
        and 0.0 <= misses <= MAX_AMOUNT
        and MIN_TIME_MS <= at <= MAX_TIME_MS
    ):
        return SignalRecord(hits, misses, at)
    return None


MAX_AMOUNT: Final = 1e300
"""Largest count or evidence amount a state may hold. Events add at most 1e6 (the config's
bound on weights) each, so no user comes near; and a sum of such amounts over a user's signals
stays finite (a stored 1e308 would make α infinite and `p` NaN)."""
MAX_COUNT: Final = 2**63 - 1
"""Largest seen-count (a signal's occurrences in the open episode), as msgpack stores ints."""


def check_state(state: EngineState) -> None:
    """Refuse a decoded state holding numbers the engine never makes (`state_from_record`
    checks types and shape first): times outside MIN_TIME_MS..MAX_TIME_MS, counts or
    evidence that are negative, NaN, infinite or beyond `MAX_AMOUNT`. Applied, such a state
    fails inside the engine (negative evidence: `math domain error`) or publishes NaN.

    Raises:
        StateFormatError: naming the first impossible number.
    """
    if not _possible(state):
        _explain_impossible(state)
        msg = "not a possible engine state: a number out of its range"  # (not reached)
        raise StateFormatError(msg)


def _possible(state: EngineState) -> bool:
    """`check_state`'s rules, without building a name for every number (that took a third
    of the decode's time)."""
    episode = state.episode
    optional = [state.clock, episode.started_at, episode.last_event_at]
    times: list[int] = []
    amounts: list[float] = []
    for intent in state.intents.values():
        for record in (intent.episodes, *intent.learned.values()):
            amounts += (record.hits, record.misses)
            times.append(record.at)
        for evidence in intent.evidence.values():
            amounts += (evidence.alpha, evidence.beta)
            times.append(evidence.at)
        times += [held.closed_at for held in intent.pending]
        optional += (intent.last_outcome_at, intent.last_revealed_at)
        if (
            intent.seen
            and not 0 <= min(intent.seen.values()) <= max(intent.seen.values()) <= MAX_COUNT
        ):
            return False
    times += [at for at in optional if at is not None]
    total = sum(amounts)  # NaN if any amount is: min and max cannot be trusted with NaN
    return (
        not math.isnan(total)
        and min(amounts, default=0.0) >= 0.0
        and max(amounts, default=0.0) <= MAX_AMOUNT
        and min(times, default=MIN_TIME_MS) >= MIN_TIME_MS
        and max(times, default=MIN_TIME_MS) <= MAX_TIME_MS
    )


def _explain_impossible(state: EngineState) -> None:
    """Raise StateFormatError naming the first number `_possible` refused."""
    episode = state.episode
    times: list[tuple[str, int | None]] = [
        ("clock", state.clock),
        ("episode start", episode.started_at),
        ("episode's last event", episode.last_event_at),
    ]
    for name, intent in state.intents.items():
        records = [("episodes", intent.episodes)]
        records += [(f"learned {signal!r}", record) for signal, record in intent.learned.items()]
        amounts: list[tuple[str, float]] = []
        for what, record in records:
            amounts += _named_counts(f"intent {name!r} {what}", record)
            times.append((f"intent {name!r} {what} time", record.at))
        for signal, evidence in intent.evidence.items():
            what = f"intent {name!r} evidence {signal!r}"
            amounts += [(f"{what} alpha", evidence.alpha), (f"{what} beta", evidence.beta)]
            times.append((f"{what} time", evidence.at))
        _check_amounts(amounts)
        times += [(f"intent {name!r} held episode", held.closed_at) for held in intent.pending]
        times += [
            (f"intent {name!r} last outcome", intent.last_outcome_at),
            (f"intent {name!r} last reveal", intent.last_revealed_at),
        ]
        for signal, count in intent.seen.items():
            if not 0 <= count <= MAX_COUNT:
                msg = f"not a possible engine state: intent {name!r} saw {signal!r} {count} times"
                raise StateFormatError(msg)
    for what, at in times:
        if at is not None and not MIN_TIME_MS <= at <= MAX_TIME_MS:
            msg = (
                f"not a possible engine state: {what} is {at}, not epoch milliseconds between "
                f"{MIN_TIME_MS} and {MAX_TIME_MS}"
            )
            raise StateFormatError(msg)


def _named_counts(what: str, record: SignalRecord) -> list[tuple[str, float]]:
    return [(f"{what} hits", record.hits), (f"{what} misses", record.misses)]


def _check_amounts(amounts: Iterable[tuple[str, float]]) -> None:
    for what, amount in amounts:
        if not 0.0 <= amount <= MAX_AMOUNT:  # False for NaN too
            msg = (
                f"not a possible engine state: {what} is {amount!r}; counts and evidence are "
                f"finite, at least 0 and at most {MAX_AMOUNT:g}"
            )
            raise StateFormatError(msg)


def _check_config(config: object) -> None:
    if config is not None and not isinstance(config, EngineConfig):
        msg = (
            "config= takes an EngineConfig (build one with EngineConfig.from_dict) or None "
            f"(got {type(config).__name__})"
        )
        raise TypeError(msg)


def _is_version(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is no version 1


def _upgrade(record: Any, migrate: Callable[[Record, int], Record] | None) -> Record:
    if not isinstance(record, list) or not record or not _is_version(record[0]):
        msg = "not a serialized engine state: expected an array that starts with a version"
        raise StateFormatError(msg)
    version = record[0]
    if version > FORMAT_VERSION:
        msg = (
            f"state format version {version} is newer than this engine reads "
            f"(up to {FORMAT_VERSION}); deploy the newer engine or reset the state table"
        )
        raise StateVersionError(msg)
    if version < FORMAT_VERSION and migrate is not None:
        record = migrate(record, version)
        if not isinstance(record, list) or not record or not _is_version(record[0]):
            msg = "the migrate hook must return an array that starts with a version"
            raise StateFormatError(msg)
    while record[0] < FORMAT_VERSION:
        step = MIGRATIONS.get(record[0])
        if step is None:
            msg = (
                f"no migration from state format version {record[0]} to {FORMAT_VERSION}; "
                "pass migrate= or reset the state table"
            )
            raise StateVersionError(msg)
        record = step(record)
    upgraded: Record = record
    return upgraded


def _intent_from_record(value: Any) -> IntentState:
    episodes, learned, evidence, seen, resolved, pending, outcome_at, revealed_at = value
    return IntentState(
        _record(episodes),
        {_name(name): _record(counts) for name, counts in learned.items()},
        {
            _name(name): Evidence(_float(a), _float(b), _int(at))
            for name, (a, b, at) in evidence.items()
        },
        {_name(name): _int(count) for name, count in seen.items()},
        _bool(resolved),
        [PendingEpisode(_int(at), [_name(name) for name in names]) for at, names in pending],
        _opt_int(outcome_at),
        _opt_int(revealed_at),
    )


def _record(value: Any) -> SignalRecord:
    hits, misses, at = value
    return SignalRecord(_float(hits), _float(misses), _int(at))


# What `state_to_record` writes, and nothing it would not: a time `1.5` or `"5"`, a count
# `"2"` or a name `5` is no state (`int()`, `float()` and `str()` took them as one).


def _int(value: Any) -> int:
    if type(value) is not int:
        msg = f"expected an integer, got {type(value).__name__} {value!r:.40}"
        raise TypeError(msg)
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _float(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:  # a count written by a packer that kept whole floats as ints
        return float(value)
    msg = f"expected a number, got {type(value).__name__} {value!r:.40}"
    raise TypeError(msg)


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        msg = f"expected true or false, got {type(value).__name__} {value!r:.40}"
        raise TypeError(msg)
    return value


def _name(value: Any) -> str:
    if type(value) is not str:
        msg = f"expected a name (a string), got {type(value).__name__} {value!r:.40}"
        raise TypeError(msg)
    return value


def _fit_to_config(state: EngineState) -> EngineState:
    """Prune intents and signals the config no longer declares; add new ones fresh."""
    config = state.config
    if state.intents.keys() == config.intents.keys():
        # Loops, not all() over generators: this runs on every decoded user (the worker's and
        # each cold lookup's), almost always to find it fits.
        for name, intent_config in config.intents.items():
            if not _fits(state.intents[name], intent_config):
                break
        else:
            return state  # the common case: stored under the same config
    intents: dict[str, IntentState] = {}
    for name, intent_config in config.intents.items():
        current = state.intents.get(name)
        intents[name] = (
            fresh_intent(intent_config.signals)
            if current is None
            else _fit_intent(current, intent_config, config.learning.half_life_ms)
        )
    return EngineState(config, state.episode, intents, state.clock)


def _fits(intent: IntentState, config: IntentConfig) -> bool:
    declared = config.signals.keys()
    if not (
        intent.learned.keys() == declared
        and intent.evidence.keys() <= declared
        and intent.seen.keys() <= declared
    ):
        return False
    if not intent.pending:
        return True
    if config.attribution_ms is None:
        return False
    return all(set(held.signals) <= declared for held in intent.pending)


def _fit_intent(intent: IntentState, config: IntentConfig, half_life_ms: int | None) -> IntentState:
    declared = config.signals
    learned = {name: intent.learned.get(name, SignalRecord()) for name in declared}
    pending = [
        PendingEpisode(held.closed_at, [s for s in held.signals if s in declared])
        for held in intent.pending
    ]
    fitted = IntentState(
        intent.episodes,
        learned,
        _only(intent.evidence, declared),
        _only(intent.seen, declared),
        intent.resolved,
        pending,
        intent.last_outcome_at,
        intent.last_revealed_at,
    )
    if config.attribution_ms is None and pending:
        # Attribution was switched off: held episodes take the verdict an intent without
        # attribution gives, a miss dated at their close.
        for held in pending:
            fitted = judge(fitted, held.signals, 0.0, held.closed_at, half_life_ms)
        fitted = IntentState(
            fitted.episodes,
            fitted.learned,
            fitted.evidence,
            fitted.seen,
            fitted.resolved,
            [],
            fitted.last_outcome_at,
            fitted.last_revealed_at,
        )
    return fitted


def _only(mapping: Mapping[str, Any], declared: Mapping[str, float]) -> dict[str, Any]:
    return {name: value for name, value in mapping.items() if name in declared}
