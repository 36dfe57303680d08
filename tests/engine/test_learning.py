"""`engine.learning.add_counts`: amounts decay from their own moments, whichever comes first."""

from __future__ import annotations

import pytest

from engine.learning import add_counts, decay_factor
from engine.state import SignalRecord

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
