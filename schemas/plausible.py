"""Event times a product's analytics could really have: the guard against a wrong unit.

Epoch seconds read as milliseconds land in January 1970; microseconds and nanoseconds land
far beyond year 9999 (the decoder refuses those). Every one of them is a valid number, so a
file of them replays without an error and looks like a bad model (episodes merged, weights
turned around, no reveals). The offline tools therefore stop at the first time outside
[2000-01-01, now + a year] and say which unit it looks like; the decoder's refusal of a time
beyond 9999 says it too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

EARLIEST_MS: Final = 946_684_800_000
"""2000-01-01T00:00:00Z: no product analytics event is older."""
AHEAD_MS: Final = 366 * 24 * 3600 * 1000
"""How far after now an event time may be (a device clock set wrong is not this far)."""
LATEST_MS: Final = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, the decoder's bound."""
HINT: Final = "it looks like epoch "
"""How a unit guess starts (`unit_hint`), in messages that carry one."""

_SCALES: Final = (("seconds", 1_000.0), ("microseconds", 1e-3), ("nanoseconds", 1e-6))


def unit_hint(value: float, latest_ms: int = LATEST_MS) -> str | None:
    """'it looks like epoch seconds (as milliseconds: 2025-11-05T10:01:40Z)' when `value`, read
    in another unit, is a time from 2000 to `latest_ms`; else None."""
    for unit, to_ms in _SCALES:
        try:
            ms = value * to_ms
        except OverflowError:  # an int beyond any float: no unit makes it a time
            return None
        if EARLIEST_MS <= ms <= latest_ms:
            return f"{HINT}{unit} (as milliseconds: {_iso(int(ms))})"
    return None


def implausible(at_ms: int, now_ms: int) -> str | None:
    """Why an event time (epoch ms) cannot be a real event's, with the likely unit; None if
    it can: from 2000 to a year after `now_ms`."""
    latest = now_ms + AHEAD_MS
    if EARLIEST_MS <= at_ms <= latest:
        return None
    where = "before 2000" if at_ms < EARLIEST_MS else "more than a year after now"
    hint = unit_hint(at_ms, latest)
    return f"{at_ms} is {_iso(at_ms)}, {where}" + (f": {hint}" if hint else "")


def _iso(ms: int) -> str:
    try:
        text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return f"{ms} ms"
    return text.replace("+00:00", "Z")
