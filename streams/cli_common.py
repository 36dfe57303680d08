"""What the `oracular` subcommands share: exit codes, flags, settings, input options."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from typing import Any

from schemas.files import CsvColumns

Command = Callable[[argparse.Namespace], int]

EXIT_USAGE = 2
"""Bad flags, settings, config or input file (docs/tools.md "Exit codes")."""
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: the broker is not there or refused
"""The broker (or a worker's API) is not there, refused, or a topic is missing."""

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
"""The settings `oracular worker` and `backfill` take as flags (streams/settings.py has each
flag's name, help and variable); --config comes first, on its own."""


def load_settings(
    args: argparse.Namespace, sources: dict[str, str] | None = None, **overrides: str | None
) -> Any:
    """The settings of a command: defaults <- ORACULAR_* <- the setting flags in `args` <-
    `overrides` (setting name -> text; `sources` names the flag each came from, for
    messages). Nothing is written to the environment.

    Raises:
        SettingsError: the settings' problems, one per line (`streams.cli.main` prints them
            and exits EXIT_USAGE).
    """
    from streams import settings

    flags = {**settings.flag_values(args), **overrides}
    return settings.load_settings(flags=flags, sources=sources)


def kafka_settings(args: argparse.Namespace) -> Any:
    """Settings from the environment, with --broker (produce, tail, reset) and --topic-prefix
    (tail) applied; a command's other flags are its own, not settings."""
    flags = {name: getattr(args, name, None) for name in ("broker", "topic_prefix")}
    return load_settings(argparse.Namespace(**flags))


def unavailable(command: str, exc: BaseException) -> int:
    """Report a broker problem (a `streams.admin.BrokerError`) in one line; the exit code.

    Every Kafka-facing command ends this way: `oracular COMMAND: <what is wrong and how to fix
    it>` on stderr, exit EXIT_UNAVAILABLE, no traceback.
    """
    print(f"oracular {command}: {exc}", file=sys.stderr)
    return EXIT_UNAVAILABLE


def kafka_command(name: str) -> Callable[[Command], Command]:
    """Decorate a Kafka-facing subcommand: a `streams.admin.BrokerError` ends it in one line.

    The command's own checks (`streams.admin.require_broker`: the broker answers, its topics
    exist) raise BrokerError with what to do; so do `streams.kafkatools.run` when a client
    loses the broker, and the topic checks of `worker` and `backfill`.
    """

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def run(args: argparse.Namespace) -> int:
            from streams.admin import BrokerError  # loads aiokafka: only when a command runs

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
