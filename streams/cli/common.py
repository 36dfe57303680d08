"""What the `oracular` subcommands share: exit codes, flags, settings, input options."""

from __future__ import annotations

import argparse
import difflib
import functools
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from schemas.files import CsvColumns
from streams.settings import Settings, flag_values, load_settings
from streams.settings.exits import EXIT_UNAVAILABLE, EXIT_USAGE

Command = Callable[[argparse.Namespace], int]


def fail(command: str, what: str, todo: str, code: int = EXIT_USAGE) -> int:
    """Report an error in the one style of every command, on one line of stderr:
    `oracular COMMAND: WHAT — TODO`; returns `code` (docs/tools.md "Exit codes")."""
    print(f"oracular {command}: {what} — {todo}", file=sys.stderr)
    return code


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean X?)` for the closest of `choices` (difflib), or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class Parser(argparse.ArgumentParser):
    """argparse with the product's error style: one line, `oracular COMMAND: WHAT — see
    `oracular COMMAND --help``, exit 2; an unknown flag or command gets a "did you mean"."""

    def error(self, message: str) -> NoReturn:
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)'", message)
        if choice:
            options = re.findall(r"'([^']*)'", message.split("choose from", 1)[-1])
            message += did_you_mean(choice.group(2), options)
        print(f"{self.prog}: {message} — see `{self.prog} --help`", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)

    def unrecognized(self, extra: Sequence[str]) -> NoReturn:
        """Refuse arguments this (sub)command does not take, suggesting its closest flag."""
        flags = [o for a in self._actions for o in a.option_strings]
        hints = [
            f"{word}{did_you_mean(word.split('=', 1)[0], flags)}"
            for word in extra
            if word.startswith("-")
        ]
        words = ", ".join(hints) or " ".join(extra)
        self.error(f"unknown argument(s) {words}")


INPUT_TODO = (
    "fix the file, or map its columns with --user-col/--event-col/--time-col (docs/tools.md)"
)
"""What to do about a CSV events file that cannot be read as events."""


def input_todo(fmt: str) -> str:
    """What to do about an events file of format `fmt` that cannot be read as events: the
    column flags only for a CSV."""
    if fmt == "csv":
        return INPUT_TODO
    return "fix the file: docs/messages.md lists the fields of an event (user, name, ts)"


def unreadable_input(path: Path) -> str | None:
    """Why the events file `path` cannot be read (`no such file X`, `X is a directory`, ...),
    or None when it is a readable file: the one wording every command uses."""
    if path.is_dir():
        return f"{path} is a directory, not an events file"
    if not path.exists():
        return f"no such file {path}"
    if not path.is_file():
        return f"{path} is not a regular file"
    try:
        with path.open("rb"):
            return None
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"


def writable_output(path: Path, flag: str) -> str | None:
    """Why the output file `path` of `flag` cannot be written (its directory is missing, it is
    a directory), or None."""
    if path.is_dir():
        return f"{flag} {path} is a directory; name a file"
    parent = path.parent
    if not parent.is_dir():
        return f"{flag} {path}: the directory {parent} does not exist"
    return None


def usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """`parser.error(message)` for a command that was given too little (exit 2)."""
    parser.error(message)


WORKER_SETTINGS = (
    "broker",
    "app_id",
    "datadir",
    "partitions",
    "topic_prefix",
    "tick_interval_s",
    "lateness_ms",
    "idle_ms",
    "max_skew_ms",
    "output_format",
    "web_port",
    "api_host",
    "api_port",
    "api_url",
    "ready_max_lag",
)
"""The settings `oracular worker` and `backfill` take as flags (streams/settings/ has each
flag's name, help and variable); --config comes first, on its own."""


def command_settings(
    args: argparse.Namespace, sources: dict[str, str] | None = None, **overrides: str | None
) -> Settings:
    """The settings of a command: defaults <- ORACULAR_* <- the setting flags in `args` <-
    `overrides` (setting name -> text; `sources` names the flag each came from, for
    messages). Nothing is written to the environment.

    Raises:
        SettingsError: the settings' problems, one per line (`streams.cli.main` prints them
            and exits EXIT_USAGE).
    """
    flags = {**flag_values(args), **overrides}
    return load_settings(flags=flags, sources=sources)


def kafka_settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with --broker (produce, tail, reset) and --topic-prefix
    (tail) applied; a command's other flags are its own, not settings."""
    flags = {name: getattr(args, name, None) for name in ("broker", "topic_prefix")}
    return command_settings(argparse.Namespace(**flags))


def unavailable(command: str, exc: BaseException) -> int:
    """Report a broker problem (a `streams.tools.admin.BrokerError`) in one line; the exit code.

    Every Kafka-facing command ends this way: `oracular COMMAND: <what is wrong and how to fix
    it>` on stderr, exit EXIT_UNAVAILABLE, no traceback.
    """
    print(f"oracular {command}: {exc}", file=sys.stderr)
    return EXIT_UNAVAILABLE


def kafka_command(name: str) -> Callable[[Command], Command]:
    """Decorate a Kafka-facing subcommand: a `streams.tools.admin.BrokerError` ends it in one line.

    The command's own checks (`streams.tools.admin.require_broker`: the broker answers, its topics
    exist) raise BrokerError with what to do; so do `streams.tools.kafkatools.run` when a client
    loses the broker, and the topic checks of `worker` and `backfill`.
    """

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def run(args: argparse.Namespace) -> int:
            from streams.tools.admin import BrokerError  # loads aiokafka: only when a command runs

            try:
                return command(args)
            except BrokerError as exc:
                return unavailable(name, exc)

        return run

    return decorate


def input_arguments(parser: argparse.ArgumentParser) -> None:
    """--format and the CSV column flags, for every command that reads an events file."""
    parser.add_argument(
        "--format",
        choices=["jsonl", "msgpack", "csv"],
        help="input format (default: from the suffix: .msgpack/.mpk, .csv, else JSONL)",
    )
    csv_arguments(parser)


def csv_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user-col", default="user", help="CSV: the user id column (user)")
    parser.add_argument("--event-col", default="event", help="CSV: the event name column (event)")
    parser.add_argument(
        "--time-col", default="time", help="CSV: the time column, epoch ms or ISO-8601 (time)"
    )


def columns(args: argparse.Namespace) -> CsvColumns:
    """The CSV column mapping of --user-col/--event-col/--time-col."""
    return CsvColumns(user=args.user_col, event=args.event_col, time=args.time_col)


def _number(text: str, kind: type[int] | type[float], least: float, strict: bool) -> Any:
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        msg = f"{text!r} is not {noun}"
        raise argparse.ArgumentTypeError(msg) from None
    if value < least or (strict and value == least):
        bound = f"more than {least:g}" if strict else f"at least {least:g}"
        msg = f"must be {bound} (got {text})"
        raise argparse.ArgumentTypeError(msg)
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return int(_number(text, int, 1, strict=False))


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    return float(_number(text, float, 0, strict=True))


def non_negative_float(text: str) -> float:
    """An argparse type: a number >= 0."""
    return float(_number(text, float, 0, strict=False))


def time_flag(value: str | None, flag: str) -> int | None:
    """A time flag's value (`--until`, `--since`, `--at`) as epoch ms, from epoch ms (digits)
    or ISO-8601; None when not given.

    Raises:
        ValueError: neither, or out of range; the text names the flag.
    """
    from schemas.events import DecodeError, parse_time

    if value is None:
        return None
    try:
        return parse_time(int(value) if value.isdigit() else value, flag)
    except DecodeError as exc:
        raise ValueError(str(exc).replace(f"field {flag!r}", flag)) from exc


def time_argument(flag: str) -> Callable[[str], int]:
    """An argparse type for a time flag (epoch ms or ISO-8601; `time_flag`)."""

    def read(text: str) -> int:
        try:
            value = time_flag(text, flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag} ")) from exc
        assert value is not None
        return value

    return read
