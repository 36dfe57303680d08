"""`engine.learning.add_counts`: amounts decay from their own moments, whichever comes first."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import (
    EngineConfig,
    create_state,
    deserialize,
    end_episode,
    explain,
    observe,
    predict,
    serialize,
)
from engine.learning import add_counts, decay_factor, judge_all
from engine.lift import LIFT_MEASURES, blend
from engine.state import IntentState, SignalRecord

DAY = 86_400_000


@pytest.mark.parametrize("half_life", [None, 7 * DAY])
@pytest.mark.parametrize("offset", [-3 * DAY, 0, 2 * DAY])
def test_counts_are_added_valued_at_the_later_moment(half_life, offset):
    """At the record's time or with no half-life: plain sums; later: the record decays to the
    new time; earlier: the amount decays to the record's time, which stays."""
    record = SignalRecord(1.5, 2.25, 10 * DAY)
    at = record.at + offset
    added = add_counts(record, 1.0, 0.5, at, half_life)
    if offset >= 0:
        factor = decay_factor(offset, half_life)
        assert added == SignalRecord(1.5 * factor + 1.0, 2.25 * factor + 0.5, at)
    else:
        factor = decay_factor(-offset, half_life)
        assert added == SignalRecord(1.5 + 1.0 * factor, 2.25 + 0.5 * factor, record.at)
    assert added.at == max(at, record.at)
    if half_life is None or offset == 0:
        assert (added.hits, added.misses) == (2.5, 2.75)


@pytest.mark.parametrize("k", [1e6 + 1, 1e200, 1e302, 1e308, 1.7976931348623157e308])
@pytest.mark.parametrize("lift", sorted(LIFT_MEASURES))
def test_a_huge_prior_episodes_keeps_every_weight_finite(k, lift):
    """priorEpisodes has no maximum (SPEC §2): k·w0 overflows for k near 1e308 and w0 = 1e6,
    which made the effective weight inf (and p NaN); the blend is then divided through by k."""
    cfg = EngineConfig.from_dict(
        {
            "episodeTimeout": "30m",
            "learning": {"priorEpisodes": k, "gain": 1e6, "lift": lift},
            "intents": {"u": {"signals": {"a": 1e6, "b": -1e6, "c": 1}, "outcome": "o"}},
        }
    )
    state = create_state(cfg)
    at = DAY
    for events in (["a", "o"], ["b"], ["a", "b", "c"], ["c", "o"], ["a"], ["b", "o"]) * 3:
        for name in events:
            state = observe(state, name, at)
            at += 1
        state = end_episode(state, at)
        at += 1
    explanation = explain(state, "u", at)
    for name, signal in explanation.signals.items():
        assert math.isfinite(signal.effective), name
        if k >= 1e200:  # the contrast of a few episodes weighs nothing against k
            assert signal.effective == pytest.approx(signal.initial, rel=1e-6)
    prediction = predict(state, "u", at)
    assert all(math.isfinite(x) for x in (prediction.p, prediction.sd, prediction.lower))
    assert deserialize(serialize(state)) == state


def test_the_blend_is_unchanged_where_it_does_not_overflow():
    """Bit for bit the documented (k·w0 + nEff·learned) / (k + nEff) while that is finite."""
    for k in (0.5, 10.0, 1e6, 1e300):
        assert blend(3.0, 5.5, 2.5, k) == (k * 3.0 + 2.5 * 5.5) / (k + 2.5)
    assert blend(1e6, 2e12, 4.0, 1e308) == pytest.approx(1e6, rel=1e-12)


_SIGNALS = ("a", "b", "c")
_amounts = st.floats(min_value=0.0, max_value=1e6)
_times = st.integers(min_value=0, max_value=400 * DAY)
_records = st.builds(SignalRecord, _amounts, _amounts, _times)


@given(
    learned=st.dictionaries(st.sampled_from(_SIGNALS), _records),
    base=_records,
    verdicts=st.lists(
        st.tuples(
            st.lists(st.sampled_from((*_SIGNALS, "pruned")), max_size=4),
            st.sampled_from([0.0, 1.0]) | st.floats(min_value=0.0, max_value=1.0),
            _times,
        ),
        max_size=6,
    ),
    half_life=st.sampled_from([None, 1, 7 * DAY]),
)
def test_judging_several_episodes_at_once_is_judging_them_one_by_one(
    learned, base, verdicts, half_life
):
    """`judge_all` (an outcome crediting its held episodes, expired windows settling) builds
    the intent once; each count must still be the one the episodes judged one after the other
    give, to the last bit: the reference below is the one-at-a-time code it replaced."""
    intent = IntentState(base, learned)
    expected = intent
    for signals, hit, at in verdicts:
        counts = dict(expected.learned)
        for signal in signals:
            if signal in counts:
                counts[signal] = add_counts(counts[signal], hit, 1.0 - hit, at, half_life)
        episodes = add_counts(expected.episodes, hit, 1.0 - hit, at, half_life)
        expected = IntentState(episodes, counts)
    judged = judge_all(intent, verdicts, half_life)
    assert judged == expected
    assert intent == IntentState(base, learned)  # the input is left as it was
