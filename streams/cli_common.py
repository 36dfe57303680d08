"""What the `oracular` subcommands share: exit codes, flags, settings, input options."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from engine import ConfigError
from schemas.files import CsvColumns

Command = Callable[[argparse.Namespace], int]

EXIT_USAGE = 2
"""Bad flags, settings, config or input file (docs/tools.md "Exit codes")."""
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: the broker is not there or refused
"""The broker (or a worker's API) is not there, refused, or a topic is missing."""

WORKER_FLAGS = [
    ("--broker", "ORACULAR_BROKER", "bootstrap servers host:port[,host:port]"),
    ("--app-id", "ORACULAR_APP_ID", "Faust app id: consumer group and internal topic prefix"),
    ("--datadir", "ORACULAR_DATADIR", "RocksDB state directory (default var/faust/APP_ID)"),
    ("--partitions", "ORACULAR_PARTITIONS", "partitions of every product topic (default 8)"),
    ("--topic-prefix", "ORACULAR_TOPIC_PREFIX", "topic names <prefix>.events etc."),
    ("--tick-interval", "ORACULAR_TICK_INTERVAL_S", "seconds between timer ticks (default 1)"),
    ("--lateness-ms", "ORACULAR_LATENESS_MS", "watermark lag behind event time (120000)"),
    ("--idle-ms", "ORACULAR_IDLE_MS", "idle time before the wall clock runs (30000)"),
    ("--max-skew-ms", "ORACULAR_MAX_SKEW_MS", "event time ahead of record time (60000)"),
    ("--output-format", "ORACULAR_OUTPUT_FORMAT", "msgpack (default) or json"),
    ("--web-port", "ORACULAR_WEB_PORT", "serve Faust's web views on this port"),
    ("--api-host", "ORACULAR_API_HOST", "lookup API bind address (default 127.0.0.1)"),
    ("--api-port", "ORACULAR_API_PORT", "lookup API port (default 6067; 0: a free port)"),
    ("--api-url", "ORACULAR_API_URL", "lookup API URL other workers use (http://host:port)"),
    ("--ready-max-lag", "ORACULAR_READY_MAX_LAG", "/readyz fails above this input lag (10000)"),
]


def apply_worker_flags(args: argparse.Namespace) -> None:
    """Put the worker flags given (and --config) into the ORACULAR_* environment."""
    if getattr(args, "config", None):
        os.environ["ORACULAR_CONFIG"] = args.config
    for _, var, _ in WORKER_FLAGS:
        if getattr(args, var, None) is not None:
            os.environ[var] = getattr(args, var)


def kafka_settings(args: argparse.Namespace) -> Any:
    """Settings from the environment, with --broker applied."""
    from streams.settings import SettingsError, settings_from_env

    if getattr(args, "broker", None):
        os.environ["ORACULAR_BROKER"] = args.broker
    try:
        return settings_from_env()
    except SettingsError as exc:
        raise ConfigError([("settings", str(exc))]) from exc


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
