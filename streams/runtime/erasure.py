"""Erased users: the markers that keep an erased user's old inputs from bringing it back.

An erase command (`{"user": ..., "type": "erase", "ts": ...}` on the input topic, written by
`oracular forget` or `DELETE /v1/users/{user}`) deletes its user's state, as an expiry does,
and leaves a **marker** in the state table in the user's place (docs/lifecycle.md):

- key: `0xFF` + a keyed BLAKE2b digest of the user id (16 bytes). No user's key starts with
  0xFF (a user key is UTF-8 text, where that byte never occurs), so a marker is never read as
  a user, and the user id itself is nowhere in the store or the changelog. The digest is
  keyed by `ORACULAR_ERASURE_KEY`: without the key, nobody can check a guessed id against
  the markers.
- value: msgpack `[TAG, partition, erased_at, command id or nil]`.

Markers are changelogged and restored with the users, so on every restart an input of an
erased user at or before its erase time is skipped (counted `erased`) instead of starting the
user again; later ones start a new user. The offline runs and a backfill, which start with no
state, learn the erasures by reading their input ahead (`known`): they skip the erased users'
inputs from the start of the history, not only after the command.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgpack

MARKER_PREFIX: Final = b"\xff"
"""The first byte of every marker's key, and of no user's (see the module docs)."""
TAG: Final = "oracular.erased/1"
DIGEST_BYTES: Final = 16
OFFLINE_KEY: Final = b"oracular offline run"
"""The digest key of a run whose markers never leave its memory (replay, tune, evaluate)."""
PUBLIC_KEY: Final = b"oracular erasure markers"
"""The digest key when ORACULAR_ERASURE_KEY is unset (docs/lifecycle.md says to set one)."""


def erasure_key(settings: Any) -> bytes:
    """The digest key of the worker's markers: ORACULAR_ERASURE_KEY, else the public one."""
    key: str | None = settings.erasure_key
    return PUBLIC_KEY if not key else key.encode()


class MarkerError(ValueError):
    """A marker's stored value cannot be read."""


def is_marker(key: bytes) -> bool:
    """Whether a state table key is an erasure marker's (else it is a user's)."""
    return key[:1] == MARKER_PREFIX


def marker_key(secret: bytes, user_key: bytes) -> bytes:
    """The state table key of the marker of the user whose key is `user_key`."""
    digest = hashlib.blake2b(user_key, key=secret[:64], digest_size=DIGEST_BYTES).digest()
    return MARKER_PREFIX + digest


def encode_marker(partition: int, erased_at: int, command: str | None) -> bytes:
    """A marker's stored value."""
    packed: bytes = msgpack.packb([TAG, partition, erased_at, command])
    return packed


def decode_marker(raw: bytes) -> tuple[int, int]:
    """(partition, erase time) of a marker's stored value.

    Raises:
        MarkerError: the value is not a marker this version wrote.
    """
    try:
        value = msgpack.unpackb(raw, raw=False)
    except Exception as exc:  # any: the bytes are not msgpack
        msg = f"an erasure marker is not msgpack ({type(exc).__name__})"
        raise MarkerError(msg) from exc
    if (
        not isinstance(value, list)
        or len(value) != 4
        or value[0] != TAG
        or type(value[1]) is not int
        or type(value[2]) is not int
    ):
        msg = f"an erasure marker is not [{TAG!r}, partition, erased_at, command]"
        raise MarkerError(msg)
    return value[1], value[2]


class Erasures:
    """The erase times of the erased users a processor knows, by marker key."""

    def __init__(self, secret: bytes) -> None:
        """Know no erasure yet; `secret` keys the digests."""
        self.secret = secret
        self.stored: dict[int, dict[bytes, int]] = {}
        """Partition -> marker key -> erase time: the markers of the state table (read at a
        restore, and written since)."""
        self.known: dict[bytes, int] = {}
        """Marker key -> erase time, of every partition: read ahead from the input."""
        self._undo: list[tuple[int, bytes, int | None]] = []
        """(partition, marker, the erase time before) of every marker recorded since the last
        `written`: `discard` puts them back."""

    def key(self, user_key: bytes) -> bytes:
        """The marker key of a user key."""
        return marker_key(self.secret, user_key)

    def learn(self, users: Mapping[str, int]) -> None:
        """Know these users (id -> erase time) as erased: read ahead from the input."""
        for user, erased_at in users.items():
            self._know(self.key(user.encode()), erased_at)

    def learn_markers(self, markers: Mapping[str, int]) -> None:
        """Know these markers (hex key -> erase time) as erased: read ahead by a backfill."""
        for marker, erased_at in markers.items():
            self._know(bytes.fromhex(marker), erased_at)

    def _know(self, marker: bytes, erased_at: int) -> None:
        self.known[marker] = max(erased_at, self.known.get(marker, erased_at))

    def erased_at(self, user_key: bytes, partition: int) -> int | None:
        """The user's latest erase time, or None if it was never erased."""
        stored = self.stored.get(partition)
        if not stored and not self.known:
            return None  # nearly always: a hash per input only where erasures exist
        marker = self.key(user_key)
        times = [t for t in ((stored or {}).get(marker), self.known.get(marker)) if t is not None]
        return max(times) if times else None

    def record(self, partition: int, marker: bytes, at: int) -> int:
        """Remember an erasure at `at`; returns the marker's erase time (the latest)."""
        stored = self.stored.setdefault(partition, {})
        before = stored.get(marker)
        self._undo.append((partition, marker, before))
        erased_at = at if before is None else max(before, at)
        stored[marker] = erased_at
        return erased_at

    def load(self, key: bytes, raw: bytes) -> None:
        """A marker read from the state table (a restore).

        Raises:
            MarkerError: the value cannot be read.
        """
        partition, erased_at = decode_marker(raw)
        self.stored.setdefault(partition, {})[key] = erased_at

    def written(self) -> None:
        """The markers recorded so far are written: `discard` keeps them."""
        self._undo.clear()

    def discard(self) -> None:
        """Forget the markers recorded since they were last written (their commands are
        read again)."""
        for partition, marker, before in reversed(self._undo):
            stored = self.stored.setdefault(partition, {})
            if before is None:
                stored.pop(marker, None)
            else:
                stored[marker] = before
        self._undo.clear()

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget the stored markers of partitions no longer owned here."""
        gone = set(partitions)
        for partition in gone:
            self.stored.pop(partition, None)
        self._undo = [entry for entry in self._undo if entry[0] not in gone]

    def clear(self) -> None:
        """Forget the stored markers (a restore reads them again)."""
        self.stored.clear()
        self._undo.clear()

    def count(self) -> int:
        """Markers stored in the owned partitions."""
        return sum(len(markers) for markers in self.stored.values())
