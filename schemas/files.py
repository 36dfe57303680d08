"""Event files for offline tools: JSON lines or a msgpack stream of native/Segment messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgpack

from engine import Event
from schemas.events import (
    MAX_KEYS,
    MAX_MESSAGE_BYTES,
    DecodeError,
    IgnoredMessage,
    decode_message,
    event_from_message,
)

FileFormat = Literal["jsonl", "msgpack"]


@dataclass(frozen=True, slots=True)
class Line:
    """One message of a file: its 0-based index, the event or why there is none, its bytes."""

    index: int
    event: Event | None
    error: str | None = None
    """Why the message is dead-lettered (None for events and ignored messages)."""
    ignored: bool = False
    raw: bytes = b""


def file_format(path: Path, declared: str | None = None) -> FileFormat:
    """The format named, else guessed from the suffix (.msgpack/.mpk: msgpack, else JSONL)."""
    if declared in ("jsonl", "msgpack"):
        return declared  # type: ignore[return-value]
    return "msgpack" if path.suffix in (".msgpack", ".mpk") else "jsonl"


def read_lines(handle: BinaryIO, fmt: FileFormat) -> Iterator[Line]:
    """Yield every message of an open binary file, decoded or with the reason it is not."""
    messages = _jsonl(handle) if fmt == "jsonl" else _msgpack(handle)
    for index, (where, raw, obj, parse_error) in enumerate(messages):
        if parse_error is not None:
            yield Line(index, None, f"{where}: {parse_error}", raw=raw)
            continue
        try:
            yield Line(index, event_from_message(obj), raw=raw)
        except IgnoredMessage:
            yield Line(index, None, ignored=True, raw=raw)
        except DecodeError as exc:
            yield Line(index, None, f"{where}: {exc}", raw=raw)


Parsed = tuple[str, bytes, Any, str | None]
"""(where in the file, the message's bytes, the parsed mapping or None, the error or None)"""


def _jsonl(handle: BinaryIO) -> Iterator[Parsed]:
    for line_no, raw in enumerate(handle, start=1):
        stripped = raw.strip()
        if not stripped:
            continue
        where = f"line {line_no}"
        if stripped[:1] != b"{":
            yield where, stripped, None, "not a JSON object (a line must start with '{')"
            continue
        try:
            yield where, stripped, decode_message(stripped), None
        except DecodeError as exc:
            yield where, stripped, None, str(exc)


def _msgpack(handle: BinaryIO) -> Iterator[Parsed]:
    unpacker = msgpack.Unpacker(
        handle,
        raw=False,
        max_buffer_size=MAX_MESSAGE_BYTES * 16,
        max_array_len=MAX_KEYS,
        max_map_len=MAX_KEYS,
        max_ext_len=0,
    )
    index = 0
    try:
        for index, obj in enumerate(unpacker):
            where = f"message {index + 1}"
            raw = msgpack.packb(obj)
            if not isinstance(obj, dict):
                yield where, raw, None, f"a message must be a map (got {type(obj).__name__})"
            else:
                yield where, raw, obj, None
    except (ValueError, msgpack.FormatError, msgpack.StackError) as exc:
        where = f"after message {index + 1}"
        yield where, b"", None, f"the msgpack stream is corrupt from here on: {exc}"


def write_jsonl(handle: Any, message: dict[str, Any], topic: str) -> None:
    """Write one output message as a JSON line with its topic (bytes as latin-1 text)."""
    handle.write(
        json.dumps(
            {"topic": topic, **message},
            separators=(",", ":"),
            default=lambda b: b.decode("latin-1"),
        )
    )
    handle.write("\n")
