"""The state table's values: one user's engine state plus what the worker needs around it.

    [STORED_VERSION, partition, last_offset, deadline | None, state_record]

- `partition` and `last_offset`: the source partition and offset of the last input applied;
  an input at or below `last_offset` was already applied (a redelivery) and is skipped.
- `deadline`: when the open episode times out (last event + episodeTimeout), so the worker
  rebuilds its timer index on assignment without decoding every state.
- `state_record`: `engine.state_to_record(state, include_config=False)`; the config is the
  worker's. Packed with the C msgpack codec (same bytes as `engine.serialize`, faster).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgpack

from engine import (
    EngineConfig,
    EngineState,
    StateFormatError,
    state_from_record,
    state_to_record,
    timeout_deadline,
)

STORED_VERSION: Final = 1


@dataclass(slots=True)
class StoredUser:
    """A user's stored state, decoded."""

    state: EngineState
    partition: int
    last_offset: int
    """Source offset of the last input applied (−1: none yet)."""


def encode_stored(user: StoredUser) -> bytes:
    """The table value for `user`."""
    record = state_to_record(user.state, include_config=False)
    deadline = timeout_deadline(user.state)
    value: bytes = msgpack.packb(
        [STORED_VERSION, user.partition, user.last_offset, deadline, record]
    )
    return value


def decode_stored(raw: bytes, config: EngineConfig) -> StoredUser:
    """Decode a table value under the worker's config.

    Raises:
        StateFormatError: the bytes are not a stored user (or a newer version).
    """
    _, partition, last_offset, _, record = _header(raw)
    return StoredUser(state_from_record(record, config=config), partition, last_offset)


def stored_deadline(raw: bytes) -> tuple[int, int | None]:
    """(partition, timeout deadline) of a table value, for rebuilding the timer index."""
    _, partition, _, deadline, _ = _header(raw)
    return partition, deadline


def _header(raw: bytes) -> list[Any]:
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        msg = f"stored state is not msgpack: {exc}"
        raise StateFormatError(msg) from exc
    if not isinstance(value, list) or len(value) != 5 or not isinstance(value[0], int):
        msg = "stored state is not a [version, partition, offset, deadline, state] array"
        raise StateFormatError(msg)
    if value[0] > STORED_VERSION:
        msg = (
            f"stored state version {value[0]} is newer than this worker reads "
            f"({STORED_VERSION}); deploy the newer worker or reset the app id"
        )
        raise StateFormatError(msg)
    return value
