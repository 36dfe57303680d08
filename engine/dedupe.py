"""The event ids a user applied recently: a producer's retry of one of them counts once.

Analytics pipelines deliver at least once: an SDK resends a batch whose acknowledgement was
lost, a destination or a connector restarted from an older position sends a range again,
minutes later. Every copy carries the producer's event id (Segment's `messageId`), so a user
remembers the ids it applied within a window of *event time* (by default 24 hours, the window
Segment deduplicates `messageId` over) and skips a copy of one of them.

The record is part of the user's stored state, so it survives restarts and restores, and a
replay of the same events remembers and forgets exactly what the live worker did: it depends
only on the user's own inputs, in order, never on the wall clock.

Memory is bounded: an id is kept as a 64-bit hash (8 bytes) beside the user time it was applied
at (8 bytes), so a user costs 16 bytes per id remembered, and at most `max_ids` ids are kept
(`dedupeMaxIds`, default 1,000: 16,000 bytes). A user who sends more distinct ids than that
within the window forgets the oldest early: a retry of one of those is applied again, and each
id forgotten early is counted. Two different ids of one user share a hash with a probability
of about n²/2⁶⁵ (below 3·10⁻¹⁴ for 1,000 ids): negligible against any real producer's bugs.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Final

ENTRY_BYTES: Final = 8
"""Bytes of one id's hash, and of one applied time, in `RecentIds`."""
DEFAULT_WINDOW_MS: Final = 24 * 60 * 60 * 1000
"""How long (event time) an id is remembered by default: Segment's `messageId` window."""
DEFAULT_MAX_IDS: Final = 1000
"""Most ids remembered per user by default (16,000 bytes)."""


@dataclass(slots=True, unsafe_hash=True)  # not frozen: its __init__ cost a third of `remember`
class RecentIds:
    """A user's remembered ids: `hashes` and `times` hold one 8-byte big-endian entry per id,
    oldest first; `times` never decreases (a user's applied time never runs backwards).
    Never changed once built (`remember` builds a new one), like the engine's states."""

    hashes: bytes = b""
    times: bytes = b""

    def __len__(self) -> int:
        return len(self.hashes) // ENTRY_BYTES

    def __contains__(self, digest: bytes) -> bool:
        """Whether the id of `digest` (`schemas.stored.id_digest`) is remembered."""
        hashes = self.hashes
        start = hashes.find(digest)
        while start >= 0:
            if start % ENTRY_BYTES == 0:  # a match across two entries is no match
                return True
            start = hashes.find(digest, start + 1)
        return False

    def time_at(self, index: int) -> int:
        """The applied time of the `index`-th remembered id."""
        start = index * ENTRY_BYTES
        return int.from_bytes(self.times[start : start + ENTRY_BYTES], "big")


NO_IDS: Final = RecentIds()


def remember(
    recent: RecentIds, digest: bytes, at: int, *, window_ms: int, max_ids: int
) -> tuple[RecentIds, int]:
    """`recent` with the id of `digest` added as applied at `at`, the ids older than
    `at - window_ms` forgotten, and at most `max_ids` kept (the oldest go first).

    Returns the new record and how many ids it forgot *early*: inside the window, for the bound.
    `at` must not be earlier than the newest remembered time (a user's clock never runs back),
    and `max_ids` is at least 1.
    """
    hashes, times = recent.hashes, recent.times
    start = 0
    if times and int.from_bytes(times[:ENTRY_BYTES], "big") < at - window_ms:
        start = _first_at_or_after(recent, at - window_ms) * ENTRY_BYTES
    early = max((len(hashes) - start) // ENTRY_BYTES + 1 - max_ids, 0)
    start += early * ENTRY_BYTES
    stamp = at.to_bytes(ENTRY_BYTES, "big")
    if start:
        return RecentIds(hashes[start:] + digest, times[start:] + stamp), early
    return RecentIds(hashes + digest, times + stamp), early


def forget_before(recent: RecentIds, cutoff: int) -> RecentIds:
    """`recent` without the ids applied before `cutoff` (the same object if none is)."""
    keep_from = _first_at_or_after(recent, cutoff)
    if keep_from == 0:
        return recent
    start = keep_from * ENTRY_BYTES
    return RecentIds(recent.hashes[start:], recent.times[start:])


def _first_at_or_after(recent: RecentIds, cutoff: int) -> int:
    """The index of the first id applied at or after `cutoff` (`len(recent)` if none is)."""
    times = recent.times
    if not times or int.from_bytes(times[:ENTRY_BYTES], "big") >= cutoff:
        return 0  # the usual case: nothing has left the window
    return bisect_left(range(len(times) // ENTRY_BYTES), cutoff, key=recent.time_at)
