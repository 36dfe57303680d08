"""Times in the wrong unit stop the offline tools with one line that names the unit
(schemas/plausible.py): epoch seconds replayed as January 1970 merged episodes, turned a
signal's weight around and made no reveals, with exit 0."""

from __future__ import annotations

import json
import time

import pytest

from schemas.events import DecodeError, decode_event
from schemas.plausible import implausible, unit_hint
from streams.cli import main
from tests.streams.test_cli_replay import CONFIG

SECONDS = 1_762_336_900  # 2025-11-05T10:01:40Z
MS = SECONDS * 1000
NOW = int(time.time() * 1000)


def _file(tmp_path, times, name="events.jsonl"):
    path = tmp_path / name
    rows = [{"user": f"u{i % 2}", "name": "pricing.viewed", "ts": ts} for i, ts in enumerate(times)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize(
    ("times", "unit", "line"),
    [
        ([SECONDS, SECONDS + 60], "epoch seconds", "line 1"),
        ([MS, MS * 1000 + 5], "epoch microseconds", "line 2"),  # refused by the decoder
        ([MS, MS + 1, MS * 1_000_000], "epoch nanoseconds", "line 3"),
    ],
)
@pytest.mark.parametrize("command", ["replay", "evaluate", "tune", "produce"])
def test_a_wrong_unit_stops_every_tool_with_the_line_and_the_unit(
    tmp_path, capsys, command, times, unit, line
):
    events = _file(tmp_path, times)
    args = [command, events] + (["--config", str(CONFIG)] if command != "produce" else [])
    if command == "replay":
        args += ["--out", str(tmp_path / "out.jsonl")]
    if command == "produce":
        args += ["--broker", "127.0.0.1:1"]  # the file is checked before the broker
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    [message] = [text for text in err.splitlines() if text.startswith(f"oracular {command}:")]
    assert f"{line}:" in message and f"it looks like {unit}" in message, message
    assert "2025-11-05T10:01:40Z" in message  # what the value would be in milliseconds
    assert "epoch milliseconds or ISO-8601" in message


def test_milliseconds_and_iso_times_replay_as_before(tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    rows = [
        {"user": "u1", "name": "pricing.viewed", "ts": MS},
        {"user": "u1", "name": "pricing.viewed", "ts": "2025-11-05T10:02:40Z"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out.jsonl"
    assert main(["replay", str(path), "--config", str(CONFIG), "--out", str(out)]) == 0
    assert out.read_text().count('"user": "u1"') + out.read_text().count('"user":"u1"') >= 2


def test_the_rule_and_its_bounds():
    assert implausible(MS, NOW) is None
    assert implausible(946_684_800_000, NOW) is None  # 2000-01-01 exactly
    assert "before 2000" in implausible(946_684_799_999, NOW)
    assert implausible(NOW + 365 * 86_400_000, NOW) is None
    ahead = implausible(NOW + 400 * 86_400_000, NOW)
    assert "more than a year after now" in ahead
    assert unit_hint(5) is None
    assert unit_hint(10**400) is None  # an int beyond any float
    assert "seconds" in implausible(SECONDS, NOW)


def test_the_decoder_names_the_unit_of_a_time_beyond_9999():
    """The worker's dead letters say it too."""
    with pytest.raises(DecodeError, match="it looks like epoch microseconds"):
        decode_event(json.dumps({"user": "u", "name": "x", "ts": MS * 1000}).encode())


def test_a_replay_that_applied_nothing_exits_2_after_writing_its_dead_letters(tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    path.write_text('{"usr": "u1", "name": "x", "ts": 1762336900000}\n[1]\n')
    out = tmp_path / "out.jsonl"
    assert main(["replay", str(path), "--config", str(CONFIG), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err[-1].startswith("oracular replay: ")
        and "no event was applied (2 dead-lettered" in err[-1]
    )
    assert len(out.read_text().splitlines()) == 2  # the dead letters, with why


def test_jsonl_errors_name_the_file_once_give_jsonl_advice_and_the_missing_field(tmp_path, capsys):
    """`badtime.jsonl: badtime.jsonl: line 2` and the CSV column hint for a JSONL file, and
    `got None` for a line that says `event` instead of `name`, were what a new user saw."""
    path = tmp_path / "noname.jsonl"
    path.write_text('{"user": "u1", "event": "a", "ts": 1767261600000}\n')
    assert main(["evaluate", str(path), "--config", str(CONFIG)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.count(str(path)) == 1, line
    assert "line 1: field 'name' is missing (the message has 'user', 'event', 'ts')" in line
    assert "--user-col" not in line and "docs/messages.md" in line
    csv = tmp_path / "e.csv"
    csv.write_text("user,event,time\nu1,a,soon\n")
    assert main(["evaluate", str(csv), "--config", str(CONFIG)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.count(str(csv)) == 1 and "--user-col" in line, line
