"""What the commands say when the input file, the broker or a topic is not right.

The broker-down tests run each Kafka-facing command as a process against a closed port: one line
on stderr, exit 69 (docs/tools.md "Exit codes"), no traceback, and quickly (a refused
connection is answered at once; the bound below is only a guard against a hang).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from streams.cli import _parser, main
from streams.settings.exits import EXIT_UNAVAILABLE, EXIT_USAGE
from tests.cli import run_oracular

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "oracular.yaml"
TS = 1_767_261_600_000
COMMAND_TIMEOUT_S = 60.0
SHOP_FLAGS = ["--user-col", "user_id", "--event-col", "event", "--time-col", "timestamp"]


@pytest.fixture
def closed_port() -> str:
    """host:port where nothing listens: a port the OS handed out, closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def shop_csv(tmp_path: Path) -> Path:
    path = tmp_path / "shop.csv"
    rows = [f"u{n % 3},page.viewed,{TS + n * 1000}" for n in range(6)]
    path.write_text("user_id,event,timestamp\n" + "\n".join(rows) + "\n")
    return path


def _oracular(*args: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORACULAR_")}
    env.update(PYTHONPATH=str(ROOT), ORACULAR_DATADIR=str(tmp_path / "state"))
    return run_oracular(*args, env=env, timeout=COMMAND_TIMEOUT_S, cwd=tmp_path)


def _events_file(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"user": "u1", "name": "a", "ts": TS}) + "\n")
    return path


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("worker", ["--config", str(CONFIG)]),
        ("backfill", ["--config", str(CONFIG)]),
        ("produce", ["EVENTS"]),
        ("produce", ["SHOP", *SHOP_FLAGS]),  # the column flags are produce's too
        ("tail", ["--max", "1"]),
        ("reset", ["some-app", "--dry-run"]),
        ("topics", ["list"]),
        ("topics", ["delete", "some-run", "--dry-run"]),
    ],
)
def test_broker_down_is_one_line_and_exit_69(command, args, closed_port, tmp_path, shop_csv):
    paths = {"EVENTS": str(_events_file(tmp_path)), "SHOP": str(shop_csv)}
    argv = [command, *(paths.get(a, a) for a in args), "--broker", closed_port]
    done, elapsed = _oracular(*argv, tmp_path=tmp_path)
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith(f"oracular {command}: no Kafka broker answered at {closed_port}")
    assert "(the connection was refused after " in line  # not "within 5 s": it was at once
    assert " — start the local one with `make broker-up`" in line
    assert elapsed < COMMAND_TIMEOUT_S


def test_query_with_no_worker_api_is_one_line_and_exit_69(closed_port, tmp_path):
    done, _ = _oracular("query", "u1", "--url", f"http://{closed_port}", tmp_path=tmp_path)
    assert done.returncode == EXIT_UNAVAILABLE
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"oracular query: http://{closed_port}/v1/users/u1: cannot reach")
    assert " — is `oracular worker` running? Pass --url" in line


def test_produce_checks_the_file_before_the_broker(closed_port, tmp_path, capsys):
    """A CSV whose header maps no column is exit 2 naming the columns, broker or not."""
    path = tmp_path / "shop.csv"
    path.write_text("user_id,event,timestamp\nu1,a,1\n")
    assert main(["produce", str(path), "--broker", closed_port]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"oracular produce: {path}: line 1: the CSV header has no column 'user' (the user id, "
        "--user-col) or 'time' (the time, --time-col); its columns are 'user_id', 'event', "
        "'timestamp' — fix the file, or map its columns with --user-col/--event-col/--time-col "
        "(docs/tools.md)"
    ]


def test_produce_with_no_event_to_send_exits_2_and_says_so(closed_port, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("[1,2,3]\n{}\n")
    assert main(["produce", str(path), "--broker", closed_port]) == EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("oracular produce: skipped line 1: a JSON array, not an object")
    assert (
        err[-1] == f"oracular produce: {path}: no event to send (2 line(s) skipped); nothing sent "
        "— give produce a file with events"
    )


def test_replay_of_a_csv_with_the_wrong_columns_is_an_error_before_any_row(tmp_path, capsys):
    path = tmp_path / "shop.csv"
    path.write_text("a,b,c\n1,2,3\n4,5,6\n")
    out = tmp_path / "out.jsonl"
    code = main(["replay", str(path), "--config", str(CONFIG), "--out", str(out), "--quiet"])
    assert code == EXIT_USAGE
    assert out.read_text() == ""  # no dead letter, no output: nothing was read as a row
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"oracular replay: {path}: line 1: the CSV header has no column 'user'")


def test_replay_dead_letters_an_unterminated_quote_at_its_line_and_keeps_the_rest(
    tmp_path, shop_csv
):
    lines = shop_csv.read_text().splitlines()
    lines.insert(3, f'u9,"pricing.viewed,{TS}')  # line 4 of the file
    shop_csv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["replay", str(shop_csv), "--config", str(CONFIG), "--out", str(out), "--quiet"]
    code = main([*argv, *SHOP_FLAGS])
    assert code == 0
    messages = [json.loads(line) for line in out.read_text().splitlines()]
    dead = [m for m in messages if m["topic"] == "oracular.events.dlq"]
    assert [m["error"] for m in dead] == [
        "line 4: unterminated quote: a '\"' on this line opens a field that the file never "
        "closes (lines 5-8 are read again as rows)"
    ]
    episodes = [m for m in messages if m["topic"] == "oracular.episodes"]
    assert sorted(m["user"] for m in episodes) == ["u0", "u1", "u2"]  # all six rows applied


def test_replay_names_the_users_time_column(tmp_path, capsys):
    path = tmp_path / "shop.csv"
    path.write_text("user_id,event,timestamp\nu1,a,yesterday\n")
    out = tmp_path / "out.jsonl"
    main(["replay", str(path), "--config", str(CONFIG), "--out", str(out), "--quiet", *SHOP_FLAGS])
    [dead] = [json.loads(line) for line in out.read_text().splitlines()]
    assert dead["error"] == (
        "line 2: column 'timestamp' must be epoch milliseconds or an ISO-8601 time "
        "(got 'yesterday')"
    )


def test_every_command_has_a_description():
    commands = _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    missing = [name for name, parser in commands.items() if not parser.description]
    assert missing == []


def test_tune_help_shows_a_plain_percent(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = capsys.readouterr().out
    assert "95% Wilson" in out and "%%" not in out


def test_backfill_config_is_required_unless_the_environment_names_one(monkeypatch, capsys):
    monkeypatch.delenv("ORACULAR_CONFIG", raising=False)
    usage = _parser()._subparsers._group_actions[0].choices["backfill"].format_usage()
    assert " --config CONFIG" in usage and "[--config CONFIG]" not in usage
    with pytest.raises(SystemExit) as exited:
        main(["backfill"])
    assert exited.value.code == EXIT_USAGE
    assert "the following arguments are required: --config" in capsys.readouterr().err
    monkeypatch.setenv("ORACULAR_CONFIG", str(CONFIG))
    usage = _parser()._subparsers._group_actions[0].choices["backfill"].format_usage()
    assert "[--config CONFIG]" in usage


def test_produce_takes_the_same_input_flags_as_replay():
    commands = _parser()._subparsers._group_actions[0].choices
    flags = {
        name: {
            (a.option_strings[0], a.default, a.help)
            for a in commands[name]._actions
            if a.option_strings and a.option_strings[0] in ("--format", *SHOP_FLAGS[::2])
        }
        for name in ("replay", "produce", "tune")
    }
    assert len(flags["replay"]) == 4
    assert flags["produce"] == flags["replay"] == flags["tune"]


def test_the_faust_worker_has_no_spinner_when_stdout_is_not_a_terminal(monkeypatch, tmp_path):
    """Faust's spinner writes cursor codes and backspaces to a file or pipe: none there."""
    import faust

    from streams.cli.kafka import faust_worker

    app = faust.App("spinner-test", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert faust_worker(app, "warning").spinner is None


def test_operations_doc_lists_every_worker_flag():
    doc = (ROOT / "docs" / "operations.md").read_text()
    commands = _parser()._subparsers._group_actions[0].choices
    flags = {a.option_strings[0] for a in commands["worker"]._actions if a.option_strings}
    missing = sorted(f for f in flags - {"-h"} if not re.search(re.escape(f) + r"(?![\w-])", doc))
    assert missing == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_uses_carriage_returns_only_on_a_terminal():
    from streams.runtime.progress import Progress

    for stream, control in ((io.StringIO(), False), (_Terminal(), True)):
        progress = Progress("backfill", total=10, unit="messages", stream=stream)
        progress.advance(10, 10)
        progress.close()
        text = stream.getvalue()
        assert text.rstrip("\n").endswith("100.0% eta 0s")
        assert ("\r" in text) is control
        assert "\x1b" not in text and "\b" not in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--processes", "0"], "--processes must be between 1 and the 8 input partitions (got 0)"),
        (["--processes", "9"], "--processes must be between 1 and the 8 input partitions (got 9)"),
        (["--part-of", "not json"], "--part-of is not a range from a parallel backfill"),
        (["--part-of", '{"start": {}}'], "--part-of is not a range from a parallel backfill"),
        (["--part-of", "[1, 2]"], "--part-of is not a range from a parallel backfill"),
    ],
)
def test_backfill_refuses_bad_process_flags_in_one_line_before_any_broker(
    flags, message, closed_port, tmp_path
):
    done, _ = _oracular(
        "backfill",
        "--config",
        str(CONFIG),
        "--broker",
        f"127.0.0.1:{closed_port}",
        *flags,
        tmp_path=tmp_path,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def _mistakes(tmp: Path) -> list[tuple[list[str], str]]:
    """The usual mistakes with every command, and what the one line must say."""
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    empty_config = tmp / "empty.yaml"
    empty_config.write_text("")
    typo_config = tmp / "typo.yaml"
    typo_config.write_text(CONFIG.read_text().replace("halfLife", "halfLive", 1))
    broken = tmp / "broken.yaml"
    broken.write_text("a: [\n")
    events = _events_file(tmp)
    cfg = ["--config", str(CONFIG)]
    missing = str(tmp / "nope.jsonl")
    return [
        (["tial"], "invalid choice: 'tial'"),
        (["tial"], "(did you mean tail?)"),
        (
            ["replay", str(events), "--confg", "x"],
            "unknown argument(s) --confg (did you mean --config?)",
        ),
        (["tune", str(events), *cfg, "--min-episode", "3"], "(did you mean --min-episodes?)"),
        (["tail", "--max", "-1"], "argument --max: must be at least 1 (got -1)"),
        (["tail", "--idle", "0"], "argument --idle: must be more than 0 (got 0)"),
        (["tail", "--topics", "predicitons"], "(did you mean predictions?)"),
        (["topics", "delete", "x", "--dryrun"], "(did you mean --dry-run?)"),
        (
            ["query", "u1", "--at", "soon"],
            "argument --at: must be epoch milliseconds or an ISO-8601",
        ),
        (["replay", missing, *cfg], f"no such file {missing}"),
        (["tune", missing, *cfg], f"no such file {missing}"),
        (["evaluate", missing, *cfg], f"no such file {missing}"),
        (["produce", missing], f"no such file {missing}"),
        (["evaluate", str(tmp), *cfg], f"{tmp} is a directory, not an events file"),
        (["evaluate", str(empty), *cfg], f"{empty} holds no event"),
        (["tune", str(empty), *cfg], f"{empty} holds no event"),
        (
            ["evaluate", str(events), *cfg, "--plot", "/nonexistent/d/e.png"],
            "the directory /nonexistent/d does not exist",
        ),
        (["evaluate", str(events), *cfg, "--plot", str(tmp / "e.txt")], "cannot draw a txt file"),
        (
            ["replay", str(events), *cfg, "--out", "/nonexistent/x.jsonl"],
            "--out /nonexistent/x.jsonl: the directory",
        ),
        (
            ["replay", str(events), *cfg, "--states", "/nonexistent/s.txt"],
            "--states /nonexistent/s.txt: the directory",
        ),
        (["replay", str(events), *cfg, "--until", "soon"], "--until must be epoch milliseconds"),
        (
            ["check-config", str(empty_config)],
            "the file is empty: a config is a mapping with `intents:`",
        ),
        (
            ["check-config", str(broken)],
            f"{broken}: not valid YAML: while parsing a flow node, expected the node content, "
            "but found '<stream end>' at line 2, column 1 — fix the config",
        ),
        (
            ["check-config", str(tmp / "nope.yaml")],
            "nope.yaml: no such config file — check the path",
        ),
        (["replay", str(events), "--config", str(tmp)], "a directory, not a config file — check"),
        (
            ["worker", "--config", str(CONFIG), "--processes", "0"],
            "argument --processes: must be at least 1",
        ),
        (
            ["backfill", "--config", str(CONFIG), "--since", "soon"],
            "--since must be epoch milliseconds",
        ),
    ]


def test_every_command_answers_the_usual_mistakes_in_one_line_with_what_to_do(tmp_path, capsys):
    """docs/tools.md "Errors": `oracular COMMAND: WHAT — WHAT TO DO`, one line, exit 2."""
    for argv, expected in _mistakes(tmp_path):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        err = capsys.readouterr().err
        assert code == EXIT_USAGE, (argv, err)
        assert "Traceback" not in err
        [line] = err.splitlines()
        command = "" if argv[0] == "tial" else f" {argv[0]}"
        prefix = f"oracular{command}"
        if argv[:2] == ["topics", "delete"]:
            prefix += " delete"
        assert line.startswith(f"{prefix}: "), (argv, line)
        assert " — " in line, (argv, line)
        assert expected in line, (argv, line)


def test_a_config_with_several_problems_names_each_with_a_hint(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text(CONFIG.read_text().replace("halfLife", "halfLive"))
    assert main(["check-config", str(typo)]) == EXIT_USAGE
    head, *problems = capsys.readouterr().err.splitlines()
    assert head.startswith("oracular check-config: the config: ")
    assert head.endswith(" problems — fix the config (docs/configuration.md):")
    assert problems and all("unknown key (did you mean halfLife?)" in p for p in problems)


def test_query_of_a_user_with_no_input_yet_prints_no_offset_none():
    from streams.lookup.query import render

    body = {
        "user": "u9",
        "known": False,
        "at": TS,
        "as_of": TS,
        "position": {"partition": 3, "offset": None},
        "served_by": {"worker": "http://w1", "role": "active"},
        "config": "abc",
        "intents": {},
    }
    out = io.StringIO()
    render(body, out)
    assert "partition 3 (no input yet)" in out.getvalue() and "None" not in out.getvalue()


@pytest.mark.parametrize("command", ["worker", "backfill"])
def test_every_flag_of_the_long_running_commands_names_its_variable_or_says_it_has_none(command):
    """`worker --help` said every flag had an ORACULAR_* variable; three had none."""
    from streams.cli import _parser

    parser = _parser()
    sub = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    ).choices[command]
    missing = [
        action.option_strings[-1]
        for action in sub._actions
        if action.option_strings
        and action.help != argparse.SUPPRESS
        and "-h" not in action.option_strings
        and "ORACULAR_" not in (action.help or "")
        and "no env variable" not in (action.help or "")
    ]
    assert missing == []


def test_the_worker_refuses_to_start_without_a_config(monkeypatch, capsys):
    """It ran the demo's config silently, even in production; `make run` passes it."""
    from streams.cli import main

    monkeypatch.delenv("ORACULAR_CONFIG", raising=False)
    assert main(["worker", "--broker", "127.0.0.1:1"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("oracular worker: no engine config given — pass --config FILE")
    assert "run.sh" not in line and "ORACULAR_CONFIG" in line
