"""Event files for offline tools: JSON lines or a msgpack stream of native/Segment messages."""

from __future__ import annotations

import csv
import io
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

FileFormat = Literal["jsonl", "msgpack", "csv"]


@dataclass(frozen=True, slots=True)
class CsvColumns:
    """Which CSV columns hold the user, the event name and the time (epoch ms or ISO-8601)."""

    user: str = "user"
    event: str = "event"
    time: str = "time"


@dataclass(frozen=True, slots=True)
class Line:
    """One message of a file: its 0-based index, the event or why there is none, its bytes."""

    index: int
    event: Event | None
    error: str | None = None
    """Why the message is dead-lettered (None for events and ignored messages)."""
    ignored: bool = False
    raw: bytes = b""
    where: str = ""
    """Where in the file: "line N" (JSONL, CSV) or "message N" (msgpack)."""


def file_format(path: Path, declared: str | None = None) -> FileFormat:
    """The format named, else guessed from the suffix (.msgpack/.mpk, .csv, else JSONL)."""
    if declared in ("jsonl", "msgpack", "csv"):
        return declared  # type: ignore[return-value]
    if path.suffix == ".csv":
        return "csv"
    return "msgpack" if path.suffix in (".msgpack", ".mpk") else "jsonl"


def read_lines(
    handle: BinaryIO, fmt: FileFormat, columns: CsvColumns | None = None
) -> Iterator[Line]:
    """Yield every message of an open binary file, decoded or with the reason it is not."""
    if fmt == "csv":
        messages = _csv(handle, columns or CsvColumns())
    else:
        messages = _jsonl(handle) if fmt == "jsonl" else _msgpack(handle)
    for index, (where, raw, obj, parse_error) in enumerate(messages):
        if parse_error is not None:
            yield Line(index, None, f"{where}: {parse_error}", raw=raw, where=where)
            continue
        try:
            yield Line(index, event_from_message(obj), raw=raw, where=where)
        except IgnoredMessage:
            yield Line(index, None, ignored=True, raw=raw, where=where)
        except DecodeError as exc:
            yield Line(index, None, f"{where}: {exc}", raw=raw, where=where)


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


def _csv(handle: BinaryIO, columns: CsvColumns) -> Iterator[Parsed]:
    """Rows of a CSV file with a header; the mapped columns become a native event."""
    text = io.TextIOWrapper(handle, encoding="utf-8", errors="replace", newline="")
    try:
        yield from _csv_rows(csv.DictReader(text), columns)
    finally:
        text.detach()  # the caller owns `handle`: the wrapper must not close it


def _csv_rows(reader: csv.DictReader[str], columns: CsvColumns) -> Iterator[Parsed]:
    header = reader.fieldnames or []
    missing = [c for c in (columns.user, columns.event, columns.time) if c not in header]
    if missing:
        shown = ", ".join(header) or "none"
        yield (
            "line 1",
            b"",
            None,
            (
                f"the CSV has no column {missing[0]!r} (columns: {shown}); "
                "map them with --user-col, --event-col and --time-col"
            ),
        )
        return
    for row in reader:
        time = (row.get(columns.time) or "").strip()
        message = {
            "user": row.get(columns.user) or None,
            "name": row.get(columns.event) or None,
            # ASCII digits only, and few enough for an int: anything else goes to the decoder
            # as text, which names the column's problem instead of raising.
            "ts": int(time)
            if time.isascii() and time.isdigit() and len(time) <= 20
            else (time or None),
        }
        yield f"line {reader.line_num}", json.dumps(row).encode(), message, None


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
    """Write one output message as a JSON line with its topic (bytes as latin-1 text).

    A dead letter's own `topic` field (where the input came from) is written as
    `source_topic`, so `topic` always names the output topic.
    """
    fields = {("source_topic" if k == "topic" else k): v for k, v in message.items()}
    handle.write(
        json.dumps(
            {"topic": topic, **fields},
            separators=(",", ":"),
            default=lambda b: b.decode("latin-1"),
        )
    )
    handle.write("\n")


class EventFileError(ValueError):
    """An events file a tool cannot use as it is: the message names the line and the problem."""


def read_sorted_events(
    path: Path, fmt: FileFormat, columns: CsvColumns | None = None
) -> list[Event]:
    """Every event of `path`, which must parse and be sorted by time within each user.

    Raises:
        EventFileError: at the first unparseable or out-of-order line, naming it.
    """
    events: list[Event] = []
    last: dict[str, tuple[int, str]] = {}
    with path.open("rb") as handle:
        for line in read_lines(handle, fmt, columns):
            if line.ignored:
                continue
            if line.event is None:
                msg = f"{path}: {line.error}"
                raise EventFileError(msg)
            event = line.event
            previous = last.get(event.user)
            if previous is not None and event.at < previous[0]:
                msg = (
                    f"{path}: {line.where}: user {event.user!r} at {event.at} comes after "
                    f"their event at {previous[0]} ({previous[1]}); sort the file by time "
                    "within each user"
                )
                raise EventFileError(msg)
            last[event.user] = (event.at, line.where)
            events.append(event)
    return events
