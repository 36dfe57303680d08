"""Ticks: the records the worker's timer sends to its own ticks topic, one per partition.

A tick is a msgpack array `[sent_at]`: the wall-clock time (epoch ms) the timer sent it at. It
travels through the same partition as the input it sits beside, so the partition's owner
applies it in order with the input: it closes the episodes due by the partition's watermark.

A worker that was frozen while writing its changelog (`streams/runtime/fencing.py`) sends
`[sent_at, [key, ...]]`: the users whose last changelog record may be the frozen worker's
stale one. The partition's owner writes those users' current states again.

Anything else in the topic (a record some other tool wrote) reads as a tick without a time
(the worker uses its own clock) and without users; so does a `sent_at` that is not an integer
of epoch milliseconds from 1970 to the end of year 9999 (the engine's time range).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgpack

from engine.durations import is_time


@dataclass(frozen=True)
class Tick:
    """A decoded tick."""

    sent_at: int | None = None
    """When the timer sent it (epoch ms), if the record says."""
    rewrite: list[bytes] = field(default_factory=list)
    """Users (state keys) whose state the partition's owner writes again."""


def encode_tick(sent_at: int, rewrite: Iterable[bytes] = ()) -> bytes:
    """A tick's record value."""
    keys = list(rewrite)
    value: bytes = msgpack.packb([sent_at, keys] if keys else [sent_at])
    return value


def decode_tick(value: bytes | None) -> Tick:
    """Read a tick; never raises (see the module's last paragraph)."""
    try:
        decoded = msgpack.unpackb(value or b"")
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return Tick()
    if not isinstance(decoded, list) or not decoded:
        return Tick()
    sent_at = decoded[0] if is_time(decoded[0]) else None
    keys = decoded[1] if len(decoded) > 1 and isinstance(decoded[1], list) else []
    return Tick(sent_at, [key for key in keys if isinstance(key, bytes)])
