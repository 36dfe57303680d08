"""Learned counts: recording hits and misses, attribution shares, and the effective weight."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from engine.config import IntentConfig, LearningConfig
from engine.lift import blend, learned_weight, lift_and_score, n_eff
from engine.state import IntentState, PendingEpisode, SignalRecord

MAX_PENDING: Final = 32
"""At most this many closed episodes wait per intent; past that the oldest is a miss at once."""

_ROUNDING: Final = 1e-12
"""Relative size below which a difference of float counts is rounding, not an episode."""


def decay_factor(elapsed_ms: int, half_life_ms: int | None) -> float:
    """2^(−elapsed / halfLife): the fraction of an amount still counted after `elapsed_ms`.

    No half-life means no decay (1.0); so does no elapsed time.
    """
    if half_life_ms is None or elapsed_ms <= 0:
        return 1.0
    factor: float = 2.0 ** (-elapsed_ms / half_life_ms)  # a float base and exponent: a float
    return factor


def counts_at(record: SignalRecord, at: int, half_life_ms: int | None) -> tuple[float, float]:
    """Return (hits, misses) of `record` valued at `at`."""
    factor = decay_factor(at - record.at, half_life_ms)
    return record.hits * factor, record.misses * factor


def add_counts(
    record: SignalRecord, hits: float, misses: float, at: int, half_life_ms: int | None
) -> SignalRecord:
    """Add `hits` and `misses` recorded at `at`; each amount decays from its own moment.

    An amount dated before the record's valuation time (an attribution window that ended
    before a later close was recorded) is decayed to that time rather than moving it back.
    """
    if at == record.at or (half_life_ms is None and at > record.at):
        # No decay (the factor would be 1.0, and x * 1.0 is x exactly): the same sums.
        return SignalRecord(record.hits + hits, record.misses + misses, at)
    if at > record.at:
        factor = decay_factor(at - record.at, half_life_ms)
        return SignalRecord(record.hits * factor + hits, record.misses * factor + misses, at)
    factor = decay_factor(record.at - at, half_life_ms)
    return SignalRecord(record.hits + hits * factor, record.misses + misses * factor, record.at)


def judge(
    intent: IntentState,
    signals: Iterable[str],
    hit: float,
    at: int,
    half_life_ms: int | None,
) -> IntentState:
    """Record one episode: `hit` of a hit and 1 − hit of a miss, to its signals and base rate.

    `hit` is 1 for an episode with the outcome, 0 for one without, and the attribution share
    c in between for a held episode when the outcome arrives.
    """
    return judge_all(intent, ((signals, hit, at),), half_life_ms)


Judgement = tuple[Iterable[str], float, int]
"""One episode to record: (its signals, its share of a hit, when)."""


def judge_all(
    intent: IntentState, judgements: Iterable[Judgement], half_life_ms: int | None
) -> IntentState:
    """`judge` each of `judgements` in order, building the intent once instead of once each:
    the same additions in the same order (an outcome credits up to 32 held episodes)."""
    learned = dict(intent.learned)
    episodes = intent.episodes
    for signals, hit, at in judgements:
        miss = 1.0 - hit
        for signal in signals:
            record = learned.get(signal)
            if record is not None:  # a signal pruned from the config learns nothing
                learned[signal] = add_counts(record, hit, miss, at, half_life_ms)
        episodes = add_counts(episodes, hit, miss, at, half_life_ms)
    return _replace_counts(intent, episodes, learned)


def settle_expired(
    intent: IntentState, config: IntentConfig, before: int, half_life_ms: int | None
) -> IntentState:
    """Turn held episodes whose attribution window ended before `before` into misses.

    A window ends at closed_at + attribution; an episode whose age equals the attribution
    exactly is still inside it. Each miss is dated at its window's end.
    """
    window = config.attribution_ms
    if not intent.pending or window is None:
        return intent
    for held in intent.pending:
        if before > held.closed_at + window:
            break
    else:
        return intent  # the usual case: every window is still open
    keep: list[PendingEpisode] = []
    misses: list[Judgement] = []
    for held in intent.pending:
        ends = held.closed_at + window
        if before > ends:
            misses.append((held.signals, 0.0, ends))
        else:
            keep.append(held)
    return _replace_pending(judge_all(intent, misses, half_life_ms), keep)


def hold(intent: IntentState, episode: PendingEpisode, half_life_ms: int | None) -> IntentState:
    """Hold a closed episode for attribution; past MAX_PENDING the oldest is a miss now."""
    pending = [*intent.pending, episode]
    if len(pending) > MAX_PENDING:
        oldest, pending = pending[0], pending[1:]
        intent = judge(intent, oldest.signals, 0.0, episode.closed_at, half_life_ms)
    return _replace_pending(intent, pending)


def credit_pending(
    intent: IntentState, config: IntentConfig, at: int, half_life_ms: int | None
) -> IntentState:
    """On the outcome at `at`: each held episode gets c = 2^(−age/halfLife) of a hit.

    The share uses the intent's own evidence half-life (no half-life: the full hit), so a
    Monday signal's credit for a Thursday outcome equals the fraction of its weight the
    engine still counts toward p on Thursday.
    """
    evidence_half_life = config.half_life_ms
    shares = [
        (held.signals, decay_factor(at - held.closed_at, evidence_half_life), at)
        for held in intent.pending
    ]
    return _replace_pending(judge_all(intent, shares, half_life_ms), [])


def effective_weight(
    intent: IntentState,
    config: IntentConfig,
    learning: LearningConfig,
    signal: str,
    at: int,
) -> tuple[float, float, float, float]:
    """Return (raw lift, score, learned, effective) of `signal` from its counts as of `at`."""
    initial = config.signals[signal]
    record = intent.learned.get(signal)
    if config.outcome is None or record is None:
        return 0.0, 0.0, 0.0, initial  # an intent without an outcome never learns
    # `counts_at` of both records, written out (this runs on every signal event).
    half_life = learning.half_life_ms
    factor = decay_factor(at - record.at, half_life)
    hits, misses = record.hits * factor, record.misses * factor
    base = intent.episodes
    factor = decay_factor(at - base.at, half_life)
    outcomes, without = base.hits * factor, base.misses * factor
    n_with = hits + misses
    if n_with <= 0.0:
        return 0.0, 0.0, 0.0, initial
    episodes = outcomes + without
    raw, score = lift_and_score(learning.lift, hits, misses, outcomes, episodes)
    learned = learned_weight(initial, learning.gain, score, n_with)
    n_without = episodes - n_with
    if n_without < _ROUNDING * episodes:
        # Decayed counts recorded at the same moments can differ in the last bit; a signal
        # present in every episode must still keep its initial weight exactly.
        n_without = 0.0
    contrast = n_eff(n_with, n_without)
    return raw, score, learned, blend(initial, learned, contrast, learning.prior_episodes)


def _replace_counts(
    intent: IntentState, episodes: SignalRecord, learned: Mapping[str, SignalRecord]
) -> IntentState:
    return IntentState(
        episodes,
        learned,
        intent.evidence,
        intent.seen,
        intent.resolved,
        intent.pending,
        intent.last_outcome_at,
        intent.last_revealed_at,
    )


def _replace_pending(intent: IntentState, pending: list[PendingEpisode]) -> IntentState:
    return IntentState(
        intent.episodes,
        intent.learned,
        intent.evidence,
        intent.seen,
        intent.resolved,
        pending,
        intent.last_outcome_at,
        intent.last_revealed_at,
    )
