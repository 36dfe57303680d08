"""Event files for offline tools: JSON lines or a msgpack stream of native/Segment messages."""

from __future__ import annotations

import codecs
import csv
import io
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from json.encoder import (  # type: ignore[attr-defined]
    c_make_encoder,
    encode_basestring_ascii,
)
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal

import msgpack

from engine import EngineConfig, Event
from engine.dedupe import NO_IDS, RecentIds, remember
from schemas.events import (
    MAX_MESSAGE_BYTES,
    DecodeError,
    IgnoredMessage,
    decode_message,
    event_from_message,
)
from schemas.plausible import HINT, implausible
from schemas.stored import id_digest

FileFormat = Literal["jsonl", "msgpack", "csv"]


@dataclass(frozen=True, slots=True)
class CsvColumns:
    """Which CSV columns hold the user, the event name and the time (epoch ms or ISO-8601)."""

    user: str = "user"
    event: str = "event"
    time: str = "time"


@dataclass(slots=True)  # not frozen: one per line, and a frozen __init__ costs twice as much
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


class EventFileError(ValueError):
    """An events file a tool cannot use as it is: the message names the line and the problem."""


def read_lines(
    handle: BinaryIO, fmt: FileFormat, columns: CsvColumns | None = None
) -> Iterator[Line]:
    """Yield every message of an open binary file, decoded or with the reason it is not.

    Raises:
        EventFileError: before any line, when the file cannot be read at all (a CSV whose
            header lacks a mapped column, or that has no header).
    """
    if fmt == "csv":
        messages = _csv(handle, columns or CsvColumns())
    else:
        messages = _jsonl(handle) if fmt == "jsonl" else _msgpack(handle)
    # Every `Line` by position (keywords cost about twice the call, once per line).
    for index, (where, raw, obj, parse_error, names) in enumerate(messages):
        if parse_error is not None:
            yield Line(index, None, f"{where}: {parse_error}", False, raw, where)
            continue
        try:
            event = event_from_message(obj)
        except IgnoredMessage:
            yield Line(index, None, None, True, raw, where)
        except DecodeError as exc:
            yield Line(index, None, f"{where}: {_rename(str(exc), names)}", False, raw, where)
        else:
            yield Line(index, event, None, False, raw, where)


def plausible_times(lines: Iterator[Line], now_ms: int) -> Iterator[Line]:
    """`lines`, stopped at the first time that cannot be a real event's (`schemas.plausible`:
    before 2000, more than a year after `now_ms`, or refused with a unit guess): epoch seconds
    or microseconds would otherwise replay without an error, as 1970 or as dead letters.

    Raises:
        EventFileError: naming the line, the time, the likely unit and what to fix.
    """
    for line in lines:
        event = line.event
        problem = None
        if event is not None:
            problem = implausible(event.at, now_ms)
            if problem is not None:
                problem = f"{line.where}: the time {problem}"
        elif line.error is not None and HINT in line.error:
            problem = line.error
        if problem is not None:
            msg = (
                f"{problem}; every time must be epoch milliseconds or ISO-8601 (fix the time "
                "field `ts`, or the column --time-col names); stopped there"
            )
            raise EventFileError(msg)
        yield line


Parsed = tuple[str, bytes, Any, str | None, Mapping[str, str] | None]
"""(where in the file, the message's bytes, the parsed mapping or None, the error or None,
the user's name of each message field when it differs: a CSV's columns)"""


def _rename(error: str, names: Mapping[str, str] | None) -> str:
    """A decoder error about `field 'ts'` as one about the user's `column 'timestamp'`."""
    for field, column in (names or {}).items():
        error = error.replace(f"field {field!r}", f"column {column!r}")
    return error


def _jsonl(handle: BinaryIO) -> Iterator[Parsed]:
    for line_no, raw in enumerate(handle, start=1):
        stripped = raw.strip()
        if not stripped:
            continue
        where = f"line {line_no}"
        # A line behind a UTF-8 byte order mark goes to the worker's decoder, which refuses it
        # as it refuses such a Kafka message: the file's bytes give what the worker gives.
        if stripped[:1] != b"{" and not stripped.startswith(codecs.BOM_UTF8):
            yield where, stripped, None, _not_an_object(stripped), None
            continue
        try:
            yield where, stripped, decode_message(stripped), None, None
        except DecodeError as exc:
            yield where, stripped, None, str(exc), None


_JSON_KINDS: Final = {
    list: "a JSON array",
    str: "a JSON string",
    int: "a JSON number",
    float: "a JSON number",
    bool: "a JSON boolean",
    type(None): "JSON null",
}


def _not_an_object(line: bytes) -> str:
    """What a JSON lines line that does not start with '{' is, for its error."""
    rule = "each line must be one JSON object, {...}"
    if len(line) <= MAX_MESSAGE_BYTES:
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            pass
        else:
            return f"{_JSON_KINDS.get(type(value), 'a JSON value')}, not an object: {rule}"
    if line[0] >= 0x80:
        return f"not JSON text: {rule} (a msgpack file needs --format msgpack or a .msgpack name)"
    return f"not a JSON object: {rule}"


_CSV_ROLES: Final = (
    ("user", "the user id", "--user-col"),
    ("name", "the event name", "--event-col"),
    ("ts", "the time", "--time-col"),
)
"""Each message field a CSV column maps to: what it holds, the flag that names its column."""


def _csv(handle: BinaryIO, columns: CsvColumns) -> Iterator[Parsed]:
    """Rows of a CSV file with a header; the mapped columns become a native event."""
    # utf-8-sig: spreadsheet exports often start with a byte order mark, which is no column name.
    text = io.TextIOWrapper(handle, encoding="utf-8-sig", errors="replace", newline="")
    try:
        yield from _csv_rows(_PhysicalLines(text), columns)
    finally:
        text.detach()  # the caller owns `handle`: the wrapper must not close it


class _PhysicalLines:
    """A text's lines for csv.reader, numbered; the lines of a bad row can be read again.

    An unterminated quote makes csv.reader read on to the end of the file (or to the next
    quote) as one field. Such a row is reported at the line where it starts, and reading
    resumes at the line after it, so no other row is lost.
    """

    def __init__(self, text: Iterator[str]) -> None:
        self._text = text
        self._again: list[str] = []  # lines to hand out again, last first
        self.row: list[str] = []
        """The lines the current row took."""
        self.number = 0
        """Lines handed out so far: the current row's last line number."""

    def __iter__(self) -> _PhysicalLines:
        return self

    def __next__(self) -> str:
        line = self._again.pop() if self._again else next(self._text)
        self.number += 1
        self.row.append(line)
        return line

    def next_row(self) -> int:
        """Start a row; its first line's number."""
        self.row = []
        return self.number + 1

    def again(self) -> None:
        """Hand out the current row's lines after its first one again."""
        rest = self.row[1:]
        self._again.extend(reversed(rest))
        self.number -= len(rest)
        self.row = self.row[:1]


def _reader(lines: _PhysicalLines) -> Any:
    # strict: text after a closing quote (`"a"b`) is an error instead of being joined to the
    # field, and so is a quoted field that the end of the file cuts.
    return csv.reader(lines, strict=True)


def _csv_header(lines: _PhysicalLines, columns: CsvColumns) -> tuple[list[str], list[int]]:
    """The header's column names and the index of the user, event and time columns.

    Raises:
        EventFileError: no header, or one that lacks a mapped column.
    """
    reader = _reader(lines)
    header: list[str] = []
    while not header:
        start = lines.next_row()
        try:
            header = next(reader)
        except StopIteration:
            msg = "the CSV file is empty: it needs a header line naming its columns"
            raise EventFileError(msg) from None
        except csv.Error as exc:
            msg = f"line {start}: the CSV header is not valid CSV: {exc}"
            raise EventFileError(msg) from None
    wanted = {"user": columns.user, "name": columns.event, "ts": columns.time}
    missing = [
        f"{wanted[field]!r} ({what}, {flag})"
        for field, what, flag in _CSV_ROLES
        if wanted[field] not in header
    ]
    if missing:
        listed = ", ".join(missing[:-1]) + " or " + missing[-1] if len(missing) > 1 else missing[0]
        shown = ", ".join(repr(h) for h in header)
        msg = f"line {start}: the CSV header has no column {listed}; its columns are {shown}"
        raise EventFileError(msg)
    return header, [header.index(wanted[field]) for field, _, _ in _CSV_ROLES]


def _csv_rows(lines: _PhysicalLines, columns: CsvColumns) -> Iterator[Parsed]:
    header, mapped = _csv_header(lines, columns)
    names = {field: header[i] for (field, _, _), i in zip(_CSV_ROLES, mapped, strict=True)}
    reader = _reader(lines)
    while True:
        start = lines.next_row()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield _bad_row(lines, start, str(exc))
            reader = _reader(lines)
            continue
        if not row:
            continue  # a blank line
        cells = [row[i] if i < len(row) else "" for i in mapped]
        if len(lines.row) > 1 and (
            len(row) > len(header) or any("\n" in c or "\r" in c for c in cells)
        ):
            # A quote opened in this row runs on over the following lines: those were rows.
            yield _bad_row(lines, start, "")
            reader = _reader(lines)
            continue
        where = f"line {start}"
        raw = json.dumps(dict(zip(header, row, strict=False))).encode()
        empty = [
            names[f] for (f, _, _), cell in zip(_CSV_ROLES, cells, strict=True) if not cell.strip()
        ]
        if empty:
            yield where, raw, None, f"column {empty[0]!r} is empty", None
            continue
        user, name, time = cells[0], cells[1], cells[2].strip()
        message = {
            "user": user,
            "name": name,
            # ASCII digits only, and few enough for an int: anything else goes to the decoder
            # as text, which names the column's problem instead of raising.
            "ts": int(time) if time.isascii() and time.isdigit() and len(time) <= 20 else time,
        }
        yield where, raw, message, None, names


def _bad_row(lines: _PhysicalLines, start: int, problem: str) -> Parsed:
    """The error of a row that is not valid CSV, at its first line; reading resumes after it."""
    end = lines.number
    first = lines.row[0] if lines.row else ""
    lines.again()
    if "end of data" in problem:
        error = "unterminated quote: a '\"' on this line opens a field that the file never closes"
    elif not problem:
        error = f"unterminated quote: a '\"' on this line opens a field that runs on to line {end}"
    else:
        error = f"not valid CSV: {problem}"
        if end > start:
            error += f", in a quoted field that runs on from here to line {end}"
    if end > start:
        error += f" (lines {start + 1}-{end} are read again as rows)"
    return f"line {start}", first.rstrip("\r\n").encode(), None, error, None


_SPLIT_CHUNK: Final = 64 * 1024
"""Bytes read from a msgpack file at a time."""
_SPLIT_LIMIT: Final = 256 * MAX_MESSAGE_BYTES
"""Longest msgpack file message that can be split off (16 MiB; the worker refuses more than
MAX_MESSAGE_BYTES, and Kafka's default cap is 1 MB): a longer one stops the file."""


def _msgpack(handle: BinaryIO) -> Iterator[Parsed]:
    """Each message of a msgpack stream, decoded from its own bytes as the worker decodes it.

    The file is only split here: msgpack's unpacker skips over one message at a time (checking
    its structure, building nothing), and `tell()` gives where it ends. Each message's exact
    bytes then go to the worker's `decode_message`, so a message the worker refuses is
    dead-lettered with the worker's reason and costs only itself. Only bytes that cannot be
    split into messages stop the file, with one error that says where.
    """
    splitter = msgpack.Unpacker(max_buffer_size=_SPLIT_LIMIT)
    buffer = bytearray()  # the file's bytes from offset `base` on
    base = start = 0  # `start`: where the next message begins
    number = 1
    ended = False
    while True:
        try:
            splitter.skip()
        except msgpack.OutOfData:
            if ended:
                break
            chunk = handle.read(_SPLIT_CHUNK)
            ended = not chunk
            del buffer[: start - base]
            base = start
            buffer += chunk
            try:
                splitter.feed(chunk)
            except msgpack.BufferFull:
                yield _unsplittable(number, start, bytes(buffer), msgpack.BufferFull())
                return
            continue
        except (ValueError, msgpack.UnpackException) as exc:  # FormatError, StackError
            yield _unsplittable(number, start, bytes(buffer[start - base :]), exc)
            return
        end = splitter.tell()
        raw = bytes(buffer[start - base : end - base])
        if number == 1 and raw in (b"{", b"["):
            # A one-byte integer that is JSON's opening bracket: a JSON file read as msgpack
            # would give one "message" per byte.
            problem = (
                f"the file starts with {raw.decode()!r}: it is JSON text, not msgpack "
                "(read it with --format jsonl or a .jsonl name)"
            )
            yield "message 1", raw, None, problem, None
            return
        yield _msgpack_message(f"message {number}", raw)
        number += 1
        start = end
    if start < base + len(buffer):
        rest = bytes(buffer[start - base :])
        problem = (
            f"the file ends inside message {number} (byte offset {start}; {len(rest)} bytes "
            "of it): the file is cut short"
        )
        yield f"message {number}", rest, None, problem, None


def _msgpack_message(where: str, raw: bytes) -> Parsed:
    """One message of a msgpack file, decoded by the worker's `decode_message`."""
    first = raw[0]
    kind = "map" if 0x80 <= first <= 0x8F else _msgpack_kind(first)  # a fixmap: the usual
    if kind != "map" and len(raw) <= MAX_MESSAGE_BYTES:
        # The worker refuses every message that is not a map; this says so in msgpack's terms.
        return where, raw, None, f"a msgpack {kind}, not a map: each message must be a map", None
    try:
        return where, raw, decode_message(raw), None, None
    except DecodeError as exc:
        return where, raw, None, str(exc), None


def _msgpack_kind(first: int) -> str:
    """What a msgpack value is, from its first byte."""
    for kind, ranges in _MSGPACK_FIRST_BYTES:
        if any(low <= first <= high for low, high in ranges):
            return kind
    return "extension"  # 0xc7-0xc9, 0xd4-0xd8 (0xc1 never splits off)


_MSGPACK_FIRST_BYTES: Final = (
    ("map", ((0x80, 0x8F), (0xDE, 0xDF))),
    ("array", ((0x90, 0x9F), (0xDC, 0xDD))),
    ("string", ((0xA0, 0xBF), (0xD9, 0xDB))),
    ("integer", ((0x00, 0x7F), (0xE0, 0xFF), (0xCC, 0xD3))),
    ("binary", ((0xC4, 0xC6),)),
    ("float", ((0xCA, 0xCB),)),
    ("boolean", ((0xC2, 0xC3),)),
    ("nil", ((0xC0, 0xC0),)),
)


def _unsplittable(number: int, start: int, rest: bytes, exc: Exception) -> Parsed:
    """The one error of a msgpack file whose bytes from `start` on cannot be split."""
    if isinstance(exc, msgpack.FormatError):
        reason = "a type byte 0xc1, which msgpack does not use"
    elif isinstance(exc, msgpack.StackError):
        reason = "it nests too deep to find where it ends"
    elif isinstance(exc, msgpack.BufferFull):
        reason = f"it is longer than {_SPLIT_LIMIT} bytes, too long to find where it ends"
    else:
        reason = str(exc) or type(exc).__name__
    problem = (
        f"the msgpack stream is corrupt at message {number} (byte offset {start}): {reason}; "
        "the rest of the file cannot be split into messages"
    )
    return f"message {number}", rest[:MAX_MESSAGE_BYTES], None, problem, None


def write_jsonl(handle: Any, message: dict[str, Any], topic: str) -> None:
    """Write one output message as a JSON line with its topic (see `jsonl_line`)."""
    handle.write(jsonl_line(message, topic) + "\n")


def jsonl_line(message: dict[str, Any], topic: str) -> str:
    """One output message as a JSON line's text (no newline) with its topic, bytes as
    latin-1 text.

    A dead letter's own `topic` field (where the input came from) is written as
    `source_topic`, so `topic` always names the output topic. Predictions and episodes have
    no `topic` field: they are written without the renaming copy.
    """
    if "topic" in message:
        message = {("source_topic" if k == "topic" else k): v for k, v in message.items()}
    return _encode_line({"topic": topic, **message})


def _latin1(value: bytes) -> str:
    return value.decode("latin-1")


_JSONL: Final = json.JSONEncoder(separators=(",", ":"), default=_latin1)
"""What `write_jsonl` wrote with `json.dumps(..., separators=(",", ":"), default=...)`."""
_C_ENCODER: Final = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _latin1, encode_basestring_ascii, None, ":", ",", False, False, True)
)
"""The C encoder `_JSONL.encode` builds on every call (`json.encoder.iterencode`), with its
arguments, built once: the same bytes without the per-call setup (about 1 µs of an output's
5 in `oracular replay`). `None` for markers: no circular-reference check, since an output
message is a tree `schemas.outputs` builds; `encode_basestring_ascii` is `ensure_ascii`."""


def _encode_line(message: dict[str, Any]) -> str:
    if _C_ENCODER is None:  # a Python without the `_json` accelerator
        return _JSONL.encode(message)
    return "".join(_C_ENCODER(message, 0))


def read_sorted_events(
    path: Path,
    fmt: FileFormat,
    columns: CsvColumns | None = None,
    *,
    config: EngineConfig | None = None,
) -> list[Event]:
    """Every event of `path`, which must parse and be sorted by time within each user.

    With `config`, a producer's retry (an id the user had within the config's `dedupeWindow`)
    is left out, as the worker and `oracular replay` skip it, wherever it stands in the file.
    So are the erase commands and, wherever they stand, the erased users' events at or before
    their erase time (`erased_users`): as `oracular replay` leaves them out.

    Raises:
        EventFileError: at the first unparseable or out-of-order line, naming it.
    """
    read: list[tuple[Event, str]] = []
    with path.open("rb") as handle:
        now_ms = int(time.time() * 1000)
        for line in _named(path, plausible_times(read_lines(handle, fmt, columns), now_ms)):
            if line.ignored:
                continue
            if line.event is None:
                msg = f"{path}: {line.error}"
                raise EventFileError(msg)
            read.append((line.event, line.where))
    erased = erased_users(event for event, _ in read)
    events: list[Event] = []
    last: dict[str, tuple[int, str]] = {}
    recent: dict[str, RecentIds] = {}
    window = 0 if config is None else config.dedupe_window_ms
    for event, where in read:
        if erased and (event.type == "erase" or event.at <= erased.get(event.user, event.at - 1)):
            continue
        if window > 0 and event.id is not None and config is not None:
            digest = id_digest(event.id)
            ids = recent.get(event.user, NO_IDS)
            if digest in ids:
                continue
            at = max(event.at, last[event.user][0]) if event.user in last else event.at
            ids, _ = remember(ids, digest, at, window_ms=window, max_ids=config.dedupe_max_ids)
            recent[event.user] = ids
        previous = last.get(event.user)
        if previous is not None and event.at < previous[0]:
            msg = (
                f"{path}: {where}: user {event.user!r} at {event.at} comes after "
                f"their event at {previous[0]} ({previous[1]}); sort the file by time "
                "within each user"
            )
            raise EventFileError(msg)
        last[event.user] = (event.at, where)
        events.append(event)
    return events


def erased_users(events: Iterable[Event]) -> dict[str, int]:
    """User -> the latest erase time among the erase commands of `events`."""
    erased: dict[str, int] = {}
    for event in events:
        if event.type == "erase" and event.at > erased.get(event.user, event.at - 1):
            erased[event.user] = event.at
    return erased


def scan_erasures(path: Path, fmt: FileFormat, columns: CsvColumns | None = None) -> dict[str, int]:
    """The erased users of an events file (`erased_users`), read ahead of a replay. A file
    without the bytes `erase` anywhere (nearly every file: a search at memory speed) holds no
    erase command and is not decoded.
    """
    with path.open("rb") as handle:
        if not _contains(handle, b"erase"):
            return {}
        handle.seek(0)
        return erased_users(line.event for line in read_lines(handle, fmt, columns) if line.event)


def _contains(handle: BinaryIO, needle: bytes, chunk: int = 1 << 20) -> bool:
    """Whether the open file holds `needle` (read in chunks that overlap by its length)."""
    tail = b""
    while block := handle.read(chunk):
        if needle in tail + block[: len(needle)] or needle in block:
            return True
        tail = block[-len(needle) :]
    return False


def _named(path: Path, lines: Iterator[Line]) -> Iterator[Line]:
    """`lines`, with the file's name in front of an EventFileError that reading raises."""
    try:
        yield from lines
    except EventFileError as exc:
        msg = f"{path}: {exc}"
        raise EventFileError(msg) from None
