"""schemas.files: what a bad events file is told, in the user's own terms (columns, lines)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgpack
import pytest

from schemas import files
from schemas.events import DecodeError, decode_event
from schemas.files import CsvColumns, EventFileError, read_lines, read_sorted_events

TS = 1_767_261_600_000
SHOP = CsvColumns(user="user_id", event="event", time="timestamp")
HEADER = "user_id,event,timestamp"


def _csv(*rows: str, header: str = HEADER, columns: CsvColumns = SHOP):
    text = "\n".join([header, *rows]) + "\n"
    return list(read_lines(io.BytesIO(text.encode()), "csv", columns))


def _errors(lines):
    return [line.error for line in lines if line.event is None]


def _users(lines):
    return [line.event.user for line in lines if line.event is not None]


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ("u1,a,soon", "line 2: column 'timestamp' must be epoch milliseconds or an ISO-8601"),
        ("u1,a,", "line 2: column 'timestamp' is empty"),
        ("u1,a,   ", "line 2: column 'timestamp' is empty"),
        (f",a,{TS}", "line 2: column 'user_id' is empty"),
        (f"u1,,{TS}", "line 2: column 'event' is empty"),
        ("u1,a", "line 2: column 'timestamp' is empty"),  # a short row
        ("u1,a,99999999999999999", "line 2: column 'timestamp' is 99999999999999999: must be"),
        (f"{'u' * 600},a,{TS}", "line 2: column 'user_id' is longer than 512 characters"),
    ],
)
def test_csv_errors_name_the_users_column_and_line(row, error):
    """Not `field 'ts'`: the user never wrote a `ts`; they wrote `timestamp`."""
    [only] = _errors(_csv(row))
    assert only.startswith(error)
    assert "field" not in only


def test_an_unterminated_quote_is_an_error_at_its_line_and_no_row_is_lost():
    """The quote on line 3 would swallow every later row into one field: only line 3 is bad."""
    rows = [f"u{n},e,{TS + n}" for n in range(2, 25)]
    lines = _csv(f"u1,e,{TS}", f'u1,"limit.hit,{TS + 1}', *rows)
    errors = _errors(lines)
    assert errors == [
        "line 3: unterminated quote: a '\"' on this line opens a field that the file never "
        "closes (lines 4-26 are read again as rows)"
    ]
    assert _users(lines) == ["u1"] + [f"u{n}" for n in range(2, 25)]
    bad = next(line for line in lines if line.event is None)
    assert (bad.where, bad.raw) == ("line 3", f'u1,"limit.hit,{TS + 1}'.encode())


def test_a_quote_closed_lines_later_in_a_mapped_column_is_an_error_at_its_line():
    """A quoted event name that runs over three lines took two rows with it."""
    lines = _csv(f'u1,"a,{TS}', f"u2,b,{TS}", f'u3,c",{TS}', f"u4,d,{TS}")
    errors = _errors(lines)
    assert errors[0] == (
        "line 2: unterminated quote: a '\"' on this line opens a field that runs on to line 4 "
        "(lines 3-4 are read again as rows)"
    )
    assert "u2" in _users(lines) and "u4" in _users(lines)


def test_text_after_a_closing_quote_is_an_error_not_silently_joined():
    [error] = _errors(_csv(f'u1,"a"b,{TS}', f"u2,b,{TS}"))
    assert error == "line 2: not valid CSV: ',' expected after '\"'"


def test_a_quoted_multi_line_note_in_an_unmapped_column_is_fine():
    """Real CSV exports quote multi-line text: that is one row, not an error."""
    lines = _csv(f'u1,a,{TS},"two\nlines"', f"u2,b,{TS}", header=HEADER + ",note")
    assert _errors(lines) == []
    assert _users(lines) == ["u1", "u2"]
    assert lines[1].where == "line 4"  # the line numbers count physical lines


def test_quoted_fields_and_blank_lines_keep_their_line_numbers():
    lines = _csv(f'"u1","a,b",{TS}', "", f"u2,b,{TS}", "u3,c,never")
    assert [line.where for line in lines] == ["line 2", "line 4", "line 5"]
    assert lines[0].event is not None and lines[0].event.name == "a,b"
    assert _errors(lines) == [
        "line 5: column 'timestamp' must be epoch milliseconds or an ISO-8601 time (got 'never')"
    ]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            "a,b,c",
            "line 1: the CSV header has no column 'user_id' (the user id, --user-col), 'event' "
            "(the event name, --event-col) or 'timestamp' (the time, --time-col); its columns "
            "are 'a', 'b', 'c'",
        ),
        (
            "user_id,event,time",
            "line 1: the CSV header has no column 'timestamp' (the time, --time-col); its "
            "columns are 'user_id', 'event', 'time'",
        ),
    ],
)
def test_a_header_without_a_mapped_column_is_an_error_before_any_row(header, expected):
    lines = read_lines(io.BytesIO(f"{header}\n1,2,3\n".encode()), "csv", SHOP)
    with pytest.raises(EventFileError) as caught:
        next(lines)
    assert str(caught.value) == expected


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_a_csv_without_a_header_is_an_error(text):
    with pytest.raises(EventFileError, match="the CSV file is empty: it needs a header line"):
        list(read_lines(io.BytesIO(text.encode()), "csv", SHOP))


def test_read_sorted_events_names_the_file_for_a_header_error(tmp_path: Path):
    path = tmp_path / "shop.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(EventFileError) as caught:
        read_sorted_events(path, "csv", SHOP)
    assert str(caught.value).startswith(f"{path}: line 1: the CSV header has no column")


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("[1,2,3]", "line 1: a JSON array, not an object: each line must be one JSON object"),
        ('"u1"', "line 1: a JSON string, not an object"),
        ("42", "line 1: a JSON number, not an object"),
        ("true", "line 1: a JSON boolean, not an object"),
        ("null", "line 1: JSON null, not an object"),
        ("[1,2", "line 1: not a JSON object: each line must be one JSON object"),
        ("user=u1", "line 1: not a JSON object: each line must be one JSON object"),
    ],
)
def test_a_json_line_that_is_not_an_object_says_what_it_is(line, error):
    good = json.dumps({"user": "u1", "name": "a", "ts": TS})
    lines = list(read_lines(io.BytesIO(f"{line}\n{good}\n".encode()), "jsonl"))
    [only] = _errors(lines)
    assert only.startswith(error)
    assert "msgpack" not in only
    assert _users(lines) == ["u1"]


def test_a_msgpack_line_in_a_json_lines_file_points_at_the_format():
    packed = msgpack.packb([1, 2, 3])
    [only] = _errors(list(read_lines(io.BytesIO(packed + b"\n"), "jsonl")))
    assert only.startswith("line 1: not JSON text")
    assert "--format msgpack" in only


@pytest.mark.parametrize("first", ["[1,2,3]", '{"user":"u1","name":"a","ts":1}'])
def test_json_text_read_as_msgpack_is_one_error_not_one_per_byte(first):
    text = f"{first}\n" * 3
    lines = list(read_lines(io.BytesIO(text.encode()), "msgpack"))
    assert [line.error for line in lines] == [
        f"message 1: the file starts with {first[0]!r}: it is JSON text, not msgpack (read "
        "it with --format jsonl or a .jsonl name)"
    ]


def test_a_msgpack_message_that_is_not_a_map_says_what_it_is():
    good = {"user": "u1", "name": "a", "ts": TS}
    data = msgpack.packb(good) + msgpack.packb([1, 2, 3]) + msgpack.packb("x")
    lines = list(read_lines(io.BytesIO(data), "msgpack"))
    assert _errors(lines) == [
        "message 2: a msgpack array, not a map: each message must be a map",
        "message 3: a msgpack string, not a map: each message must be a map",
    ]


def test_a_byte_order_mark_is_not_part_of_the_first_column_name():
    """Spreadsheet exports start with one; `user_id` is still found."""
    data = f"\ufeff{HEADER}\nu1,a,{TS}\n".encode()
    lines = list(read_lines(io.BytesIO(data), "csv", SHOP))
    assert _users(lines) == ["u1"]


# --- msgpack files: split into messages, each decoded as the worker decodes it ---------------

GOOD = {"user": "u1", "name": "a", "ts": TS}
PACKED = msgpack.packb(GOOD)


def _msgpack_lines(data: bytes):
    return list(read_lines(io.BytesIO(data), "msgpack"))


def _worker_error(raw: bytes) -> str:
    with pytest.raises(DecodeError) as caught:
        decode_event(raw)
    return str(caught.value)


def test_a_msgpack_message_the_worker_refuses_costs_only_itself_with_the_workers_reason():
    """Each message's own bytes go to the worker's decoder: same verdict, same reason."""
    bad = [
        msgpack.packb({**GOOD, "p": float("nan")}),
        b"\x83\xa4user\xa2u1\xa4name\xa1a\xa4user\xa2u2",  # a duplicate key
        msgpack.packb({**GOOD, "p": msgpack.ExtType(5, b"abc")}),
        msgpack.packb({**GOOD, "p": {1: 2}}),
        msgpack.packb({**GOOD, "p": "a" * 9000}),
        msgpack.packb({**GOOD, "p": ["a" * 8000] * 10}),  # 80 KB
        msgpack.packb({**GOOD, "p": msgpack.Timestamp(1)}, datetime=False),
        msgpack.packb({"user": b"\xff", "name": "a", "ts": TS}, use_bin_type=False),  # not UTF-8
    ]
    messages = [PACKED]
    for raw in bad:
        messages += [raw, PACKED]
    lines = _msgpack_lines(b"".join(messages))
    assert [line.raw for line in lines] == messages  # each message's exact bytes
    assert [line.where for line in lines] == [f"message {n}" for n in range(1, len(lines) + 1)]
    assert _errors(lines) == [
        f"message {2 * n + 2}: {_worker_error(raw)}" for n, raw in enumerate(bad)
    ]
    assert _users(lines) == ["u1"] * (len(bad) + 1)


def test_messages_are_split_across_the_reads_of_a_large_file():
    """Messages that straddle the reader's 64 KiB reads keep their exact bytes."""
    big = msgpack.packb({**GOOD, "p": ["a" * 8000] * 7})  # 56 KB: accepted
    messages = [PACKED, big] * 40 + [msgpack.packb({**GOOD, "user": f"u{n}"}) for n in range(5000)]
    lines = _msgpack_lines(b"".join(messages))
    assert [line.raw for line in lines] == messages
    assert _errors(lines) == []


def test_a_msgpack_file_cut_inside_its_last_message_says_so():
    lines = _msgpack_lines(PACKED + PACKED[:-3])
    assert _users(lines) == ["u1"]
    assert _errors(lines) == [
        f"message 2: the file ends inside message 2 (byte offset {len(PACKED)}; "
        f"{len(PACKED) - 3} bytes of it): the file is cut short"
    ]
    assert lines[1].raw == PACKED[:-3]


@pytest.mark.parametrize(("before", "number"), [(b"", 1), (PACKED * 2, 3)])
def test_msgpack_bytes_that_cannot_be_split_stop_the_file_at_their_message(before, number):
    lines = _msgpack_lines(before + b"\x81\xa1k\xc1" + PACKED)
    assert _users(lines) == ["u1"] * (number - 1)
    assert _errors(lines) == [
        f"message {number}: the msgpack stream is corrupt at message {number} (byte offset "
        f"{len(before)}): a type byte 0xc1, which msgpack does not use; the rest of the file "
        "cannot be split into messages"
    ]


def test_replay_dead_letters_a_refused_msgpack_file_message_with_its_bytes():
    """The rows reach the replay's DLQ output as the worker's dead letters do."""
    from schemas.config import load_config
    from streams.tools.replay import OfflineRun

    bad = msgpack.packb({**GOOD, "p": float("nan")})
    run = OfflineRun(load_config(Path(__file__).parents[2] / "examples" / "oracular.yaml"))
    outputs = []
    for line in _msgpack_lines(PACKED + bad + PACKED):
        outputs += run.feed_line(line)
    [dead] = [out.message for out in outputs if out.role == "dlq"]
    assert dead["error"] == f"message 2: {_worker_error(bad)}"
    assert (dead["value"], dead["offset"]) == (bad, 1)
    assert run.counts["applied"] == 2


def test_a_json_line_behind_a_byte_order_mark_is_refused_as_the_worker_refuses_it():
    """The same bytes sent as a Kafka message are dead-lettered by the worker, so replay does
    the same (not `a JSON value, not an object`); the other lines are read as usual."""
    first = b"\xef\xbb\xbf" + json.dumps(GOOD).encode()
    lines = list(read_lines(io.BytesIO(first + b"\n" + json.dumps(GOOD).encode()), "jsonl"))
    assert _errors(lines) == [f"line 1: {_worker_error(first)}"]
    assert "byte order mark" in _errors(lines)[0]
    assert _users(lines) == ["u1"]


def _old_jsonl_line(message, topic):
    """What `write_jsonl` wrote before its encoder was built once: `json.dumps` per line."""
    fields = {("source_topic" if k == "topic" else k): v for k, v in message.items()}
    return json.dumps(
        {"topic": topic, **fields}, separators=(",", ":"), default=lambda b: b.decode("latin-1")
    )


@pytest.mark.parametrize(
    "message",
    [
        {"user": "u1", "intent": "upgrade", "p": 0.1 + 0.2, "n": 3, "big": 10**30, "ok": True},
        {"user": "ü\u2028\ud800", "floats": [1e16, 1e-7, -0.0, 5e-324], "none": None},
        {"error": "line 3: bad", "topic": "events", "key": b"\xff\x00k", "value": b'{"a":"\xe9"}'},
        {"nested": {"a": [{"b": [1, 2, {"c": "d"}]}], "e": {}}, "list": []},
        {"topic": "only the source topic"},
        {},
    ],
)
def test_jsonl_line_writes_what_json_dumps_wrote(message):
    """The encoder built once (`_C_ENCODER`) and the per-line `json.dumps` give equal text,
    dead letters' `topic` renamed, bytes as latin-1, non-ASCII escaped, floats as repr."""
    expected = _old_jsonl_line(message, "oracular.x")
    assert files.jsonl_line(message, "oracular.x") == expected
    buffer = io.StringIO()
    files.write_jsonl(buffer, message, "oracular.x")
    assert buffer.getvalue() == expected + "\n"
    assert message.get("topic", "") != "oracular.x"  # the message itself is not changed


def test_jsonl_line_without_the_c_encoder_writes_the_same(monkeypatch):
    message = {"user": "u", "topic": "t", "value": b"\x80", "p": 0.3}
    monkeypatch.setattr(files, "_C_ENCODER", None)
    assert files.jsonl_line(message, "o") == _old_jsonl_line(message, "o")


def test_jsonl_line_is_the_c_encoder_here():
    """CPython has the `_json` accelerator: the fast path is the one the replay takes."""
    assert files._C_ENCODER is not None
