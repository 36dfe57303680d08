"""Durations in the config: a number of milliseconds, or a string such as `30m` or `2w`."""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal
from typing import Final, TypeGuard

MS_PER_UNIT: Final[dict[str, int]] = {
    "ms": 1,
    "s": 1_000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
}

MIN_TIME_MS: Final = 0
"""The earliest time the engine takes (epoch ms): 1970-01-01T00:00:00Z."""
MAX_TIME_MS: Final = 253_402_300_799_999
"""The latest time the engine takes (epoch ms): 9999-12-31T23:59:59.999Z, the last instant a
`datetime` holds. Any such time plus any duration (`MAX_DURATION_MS`) fits the signed 64-bit
integers a serialized state and an output are written with."""


def is_time(value: object) -> TypeGuard[int]:
    """True for a time the engine takes: an int (not a bool) of epoch milliseconds from
    MIN_TIME_MS to MAX_TIME_MS."""
    return type(value) is int and MIN_TIME_MS <= value <= MAX_TIME_MS


MAX_DURATION_MS: Final = MAX_TIME_MS
"""The longest duration a config may give (about 8,000 years): a deadline, a cooldown's end
or an attribution window's end stays a storable time."""

MAX_DECIMAL_PLACES: Final[dict[str, int]] = {"ms": 0, "s": 3, "m": 4, "h": 5, "d": 5, "w": 5}
"""The most decimal places a string duration may have per unit: as many as keep every value a
whole number of milliseconds (60,000 = 6·10^4, 3,600,000 = 36·10^5, 86,400,000 = 864·10^5,
604,800,000 = 6048·10^5). The JSON Schema's duration pattern states the same rule."""

# ASCII digits only ([0-9], not \d, which in Python also matches other scripts' digits): the
# JSON Schema's pattern says the same.
_DURATION_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d|w)\s*$")


def parse_duration(value: object) -> int:
    """Return the duration `value` in whole milliseconds.

    Args:
        value: an int or float number of milliseconds, or a string `<number><unit>` with unit
            one of ms, s, m, h, d, w (e.g. `500ms`, `1.5h`, `7d`) and at most
            `MAX_DECIMAL_PLACES[unit]` decimal places (none with ms, 3 with s, 4 with m, 5
            with h, d and w), so that every such string is a whole number of milliseconds.

    Returns:
        The duration in milliseconds, >= 0.

    Raises:
        ValueError: with a message that says what was wrong and what is accepted.
    """
    if isinstance(value, bool):
        msg = f"must be a duration such as 30m or a number of milliseconds (got {value!r})"
        raise ValueError(msg)
    if isinstance(value, int):  # exact, whatever its size (a float holds less)
        return _checked_ms(value, value)
    if isinstance(value, float):
        return _whole_ms(value, value)
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match is None:
            msg = f"must be a duration such as 500ms, 30s, 30m, 12h, 7d or 2w (got {value!r:.40})"
            raise ValueError(msg)
        number, unit = match.groups()
        return _string_ms(number, unit, value)
    msg = f"must be a duration such as 30m or a number of milliseconds (got {type(value).__name__})"
    raise ValueError(msg)


def _string_ms(number: str, unit: str, original: str) -> int:
    """`number` (ASCII digits, perhaps a point) times the unit, exactly: a decimal, not a float
    (1.001 is not a float, so float('1.001') * 1000 is 1000.9999999999999)."""
    places = len(number.partition(".")[2])
    most = MAX_DECIMAL_PLACES[unit]
    if places > most:
        allowed = "no decimal places" if most == 0 else f"at most {most} decimal places"
        msg = (
            f"must be a whole number of milliseconds: {allowed} with {unit} (got {original!r:.40})"
        )
        raise ValueError(msg)
    # Decimal(str) is exact; the product is too with this precision (the unit has 9 digits
    # at most). An explicit context: the thread's current one may have been changed.
    ms = Context(prec=len(number) + 12).multiply(Decimal(number), MS_PER_UNIT[unit])
    if ms > MAX_DURATION_MS:  # compared before int(): the number may have any length
        msg = f"must be at most {MAX_DURATION_MS} ms, about 8,000 years (got {original!r:.40})"
        raise ValueError(msg)
    return _checked_ms(int(ms), original)


def _whole_ms(ms: float, original: object) -> int:
    if not math.isfinite(ms):
        msg = f"must be a finite duration (got {original!r:.40})"
        raise ValueError(msg)
    if ms < 0:
        msg = f"must not be negative (got {original!r:.40})"
        raise ValueError(msg)
    if ms != int(ms):
        msg = f"must be a whole number of milliseconds (got {original!r:.40})"
        raise ValueError(msg)
    return _checked_ms(int(ms), original)


def _checked_ms(ms: int, original: object) -> int:
    if ms < 0:
        msg = f"must not be negative (got {original!r:.40})"
        raise ValueError(msg)
    if ms > MAX_DURATION_MS:
        msg = f"must be at most {MAX_DURATION_MS} ms, about 8,000 years (got {original!r:.40})"
        raise ValueError(msg)
    return ms


def format_duration(ms: int) -> str | int:
    """Return `ms` as the shortest exact duration string (`7d`), or the int when none fits."""
    for unit in ("w", "d", "h", "m", "s"):
        size = MS_PER_UNIT[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return ms
