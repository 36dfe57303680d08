"""The `oracular` command line.

Subcommands import what they need when they run, so `oracular replay` never loads Faust.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from engine import END_OF_TIME, ConfigError, EngineConfig, EngineError, Event, Replayer, serialize
from schemas.config import load_config
from schemas.events import DecodeError
from schemas.events import _time as parse_time
from schemas.files import (
    CsvColumns,
    EventFileError,
    FileFormat,
    file_format,
    read_lines,
    read_sorted_events,
    write_jsonl,
)
from schemas.outputs import DLQ, EPISODES, PREDICTIONS, episode_message, prediction_message
from streams.progress import Progress

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: the broker is not there or refused


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"oracular: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `oracular replay ... | head` is fine
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oracular",
        description="Real-time intent prediction on Kafka: the oracular engine per user.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    replay = commands.add_parser(
        "replay",
        help="replay an events file offline (no Kafka) and write the outputs as JSON lines",
        description="Replay events through one engine state per user, exactly as the stream "
        "processor would, and write predictions, closed episodes and dead letters "
        "as JSON lines with a 'topic' field.",
        epilog="examples:\n"
        "  oracular replay events.jsonl --config examples/oracular.yaml --out out.jsonl\n"
        "  oracular replay events.msgpack --config cfg.yaml --until 2026-02-01T00:00:00Z\n"
        "  cat events.jsonl | oracular replay - --config cfg.yaml | head",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument(
        "events", help="events file: JSON lines, a msgpack stream or CSV ('-': stdin)"
    )
    replay.add_argument("--config", required=True, help="the engine config (YAML or JSON)")
    replay.add_argument("--out", default="-", help="output JSONL file (default: stdout)")
    replay.add_argument(
        "--format",
        choices=["jsonl", "msgpack", "csv"],
        help="input format (default: from the suffix: .msgpack/.mpk, .csv, else JSONL)",
    )
    replay.add_argument(
        "--until",
        help="final watermark, epoch ms or ISO-8601: episodes due "
        "by then are closed (default: the end of time)",
    )
    replay.add_argument("--states", help="also write each user's final state to this JSONL file")
    replay.add_argument("--quiet", action="store_true", help="no progress line or summary")
    _csv_arguments(replay)
    replay.set_defaults(run=run_replay)

    worker = commands.add_parser(
        "worker",
        help="run the stream processor (a Faust worker) against Kafka",
        description="Consume oracular.events, keep each user's engine state in RocksDB, close "
        "idle episodes on a timer, and publish predictions and closed episodes. "
        "Every flag has an ORACULAR_* environment variable (docs/operations.md).",
        epilog="examples:\n"
        "  oracular worker --config examples/oracular.yaml\n"
        "  oracular worker --config cfg.yaml --broker kafka-1:9092 --app-id oracular-prod\n"
        "  ORACULAR_PARTITIONS=16 oracular worker --config cfg.yaml --datadir /data/w1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("--config", help="the engine config (ORACULAR_CONFIG)")
    for flag, var, what in WORKER_FLAGS:
        worker.add_argument(flag, dest=var, metavar=var.removeprefix("ORACULAR_"), help=what)
    worker.add_argument("--loglevel", default="info", help="Faust log level (default info)")
    worker.add_argument(
        "--no-create-topics",
        action="store_true",
        help="fail instead of creating missing product topics",
    )
    worker.set_defaults(run=run_worker)

    produce = commands.add_parser(
        "produce",
        help="send an events file to the input topic (msgpack, keyed by user)",
        epilog="example:\n  oracular produce examples/clickstream.jsonl --now",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    produce.add_argument("events", help="JSON lines or a msgpack stream of native/Segment events")
    produce.add_argument("--broker", help="bootstrap servers (ORACULAR_BROKER)")
    produce.add_argument(
        "--now",
        action="store_true",
        help="shift times so the last event happens now (live timeouts)",
    )
    produce.add_argument("--quiet", action="store_true")
    produce.set_defaults(run=run_produce)

    tail = commands.add_parser(
        "tail",
        help="print predictions, closed episodes and dead letters as they arrive",
        epilog="examples:\n  oracular tail\n  oracular tail --from-beginning --max 20",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tail.add_argument("--broker", help="bootstrap servers (ORACULAR_BROKER)")
    tail.add_argument("--from-beginning", action="store_true")
    tail.add_argument("--max", type=int, help="stop after this many messages")
    tail.add_argument("--idle", type=float, help="stop after this many seconds without messages")
    tail.add_argument(
        "--topics",
        default="predictions,episodes,dlq",
        help="which outputs (default predictions,episodes,dlq)",
    )
    tail.set_defaults(run=run_tail)

    tune = commands.add_parser(
        "tune",
        help="suggest signal weights from history (declared and candidate signals)",
        description="Cut the events into episodes with the config's rules and report, per "
        "intent, each declared signal and each other event name seen in at least "
        "--min-episodes episodes: episodes with/without it, raw lift, evidence "
        "score, a 95%% Wilson interval and a suggested weight "
        "(priorStrength × score).",
        epilog="examples:\n  oracular tune events.jsonl --config examples/oracular.yaml\n"
        "  oracular tune export.csv --config cfg.yaml --user-col user_id "
        "--event-col event --time-col timestamp --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _analysis_arguments(tune)
    tune.add_argument(
        "--min-episodes",
        type=int,
        default=5,
        help="candidates must be seen in at least this many episodes (5)",
    )
    tune.add_argument(
        "--prior-strength",
        type=float,
        help="scale of suggested weights (default: the intent's largest |w0|)",
    )
    tune.set_defaults(run=run_tune)

    evaluate = commands.add_parser(
        "evaluate",
        help="score the predictions a replay makes against what happened",
        description="Replay the events; after each event, each intent's p is scored against "
        "whether its outcome followed in the same episode (or within the "
        "attribution window). Brier, log loss, ROC AUC, calibration (10 bins), "
        "reveal precision/recall.",
        epilog="examples:\n  oracular evaluate events.jsonl --config examples/oracular.yaml\n"
        "  oracular evaluate events.jsonl --config cfg.yaml --plot calibration.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _analysis_arguments(evaluate)
    evaluate.add_argument(
        "--plot",
        help="draw calibration and effective weights to a PNG "
        "(needs matplotlib: pip install 'oracular-streams[plot]')",
    )
    evaluate.set_defaults(run=run_evaluate)

    check = commands.add_parser("check-config", help="validate a config file and summarise it")
    check.add_argument("config")
    check.set_defaults(run=run_check_config)
    return parser


WORKER_FLAGS = [
    ("--broker", "ORACULAR_BROKER", "bootstrap servers host:port[,host:port]"),
    ("--app-id", "ORACULAR_APP_ID", "Faust app id: consumer group and internal topic prefix"),
    ("--datadir", "ORACULAR_DATADIR", "RocksDB state directory (default var/faust/APP_ID)"),
    ("--partitions", "ORACULAR_PARTITIONS", "partitions of every product topic (default 8)"),
    ("--topic-prefix", "ORACULAR_TOPIC_PREFIX", "topic names <prefix>.events etc."),
    ("--tick-interval", "ORACULAR_TICK_INTERVAL_S", "seconds between timer ticks (default 1)"),
    ("--grace-ms", "ORACULAR_GRACE_MS", "wall-clock grace for in-flight events (10000)"),
    ("--output-format", "ORACULAR_OUTPUT_FORMAT", "msgpack (default) or json"),
    ("--web-port", "ORACULAR_WEB_PORT", "serve Faust's web views on this port"),
]


def run_worker(args: argparse.Namespace) -> int:
    """`oracular worker`: check the broker and topics, then run the Faust worker."""
    import asyncio
    import os

    from streams.admin import BrokerError, ensure_topics_async, no_broker_message, probe_async
    from streams.settings import SettingsError, settings_from_env

    if args.config:
        os.environ["ORACULAR_CONFIG"] = args.config
    for _, var, _ in WORKER_FLAGS:
        if getattr(args, var) is not None:
            os.environ[var] = getattr(args, var)
    try:
        settings = settings_from_env()
    except SettingsError as exc:
        print(f"oracular worker: bad settings:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    config = load_config(settings.config_path)
    client = settings.client_kwargs()
    if not asyncio.run(probe_async(settings.broker, client=client)):
        print(f"oracular worker: {no_broker_message(settings.broker)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    specs = list(settings.topics)
    try:
        if args.no_create_topics:
            from streams.admin import check_topics_async

            asyncio.run(check_topics_async(settings.broker, specs, client=client))
        else:
            asyncio.run(
                ensure_topics_async(
                    settings.broker, specs, replication=settings.replication_factor, client=client
                )
            )
    except BrokerError as exc:
        print(f"oracular worker: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    import faust

    from streams.app import create_app

    app = create_app(settings, config)
    worker = faust.Worker(app, loglevel=args.loglevel)
    worker.execute_from_commandline()
    return 0


def _kafka_settings(args: argparse.Namespace) -> Any:
    import os

    from streams.settings import SettingsError, settings_from_env

    if getattr(args, "broker", None):
        os.environ["ORACULAR_BROKER"] = args.broker
    try:
        return settings_from_env()
    except SettingsError as exc:
        raise ConfigError([("settings", str(exc))]) from exc


def run_produce(args: argparse.Namespace) -> int:
    """`oracular produce`: an events file onto the input topic."""
    import time

    from streams.kafkatools import produce_file, run

    settings = _kafka_settings(args)
    path = Path(args.events)
    if not path.is_file():
        print(f"oracular produce: no such file {path}", file=sys.stderr)
        return EXIT_USAGE
    progress = Progress("produce", enabled=not args.quiet)
    now = int(time.time() * 1000) if args.now else None
    result = run(
        produce_file(
            settings.broker,
            settings.topics.events.name,
            path,
            now_ms=now,
            client=settings.client_kwargs(),
            progress=progress,
        )
    )
    progress.close()
    if result is not None and not args.quiet:
        sent, skipped = result
        print(
            f"produce: {sent:,} events to {settings.topics.events.name} on {settings.broker}"
            f" ({skipped} skipped)",
            file=sys.stderr,
        )
    return 0


def run_tail(args: argparse.Namespace) -> int:
    """`oracular tail`: print output messages as JSON lines."""
    from streams.kafkatools import run, tail_topics

    settings = _kafka_settings(args)
    names = {
        "predictions": settings.topics.predictions.name,
        "episodes": settings.topics.episodes.name,
        "dlq": settings.topics.dlq.name,
    }
    wanted = [w.strip() for w in args.topics.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(
            f"oracular tail: unknown output {unknown[0]!r}; use predictions, episodes, dlq",
            file=sys.stderr,
        )
        return EXIT_USAGE
    run(
        tail_topics(
            settings.broker,
            [names[w] for w in wanted],
            from_beginning=args.from_beginning,
            limit=args.max,
            idle_s=args.idle,
            out=sys.stdout,
            client=settings.client_kwargs(),
        )
    )
    return 0


def _csv_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user-col", default="user", help="CSV: the user id column (user)")
    parser.add_argument("--event-col", default="event", help="CSV: the event name column (event)")
    parser.add_argument(
        "--time-col", default="time", help="CSV: the time column, epoch ms or ISO-8601 (time)"
    )


def _analysis_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("events", help="events file: JSONL, msgpack, or CSV (sorted per user)")
    parser.add_argument("--config", required=True, help="the engine config (YAML or JSON)")
    parser.add_argument(
        "--format",
        choices=["jsonl", "msgpack", "csv"],
        help="input format (default: from the suffix)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _csv_arguments(parser)


def _columns(args: argparse.Namespace) -> CsvColumns:
    return CsvColumns(user=args.user_col, event=args.event_col, time=args.time_col)


def _sorted_events(args: argparse.Namespace) -> list[Event] | None:
    path = Path(args.events)
    if not path.is_file():
        print(f"oracular: no such events file {path}", file=sys.stderr)
        return None
    try:
        return read_sorted_events(path, file_format(path, args.format), _columns(args))
    except EventFileError as exc:
        print(f"oracular: {exc}", file=sys.stderr)
        return None


def run_tune(args: argparse.Namespace) -> int:
    """`oracular tune`: suggested weights from history."""
    from engine.tune import format_report, report_to_dict, tune

    config = load_config(args.config)
    events = _sorted_events(args)
    if events is None:
        return EXIT_USAGE
    reports = tune(
        config, events, min_episodes=args.min_episodes, prior_strength=args.prior_strength
    )
    if args.json:
        print(json.dumps([report_to_dict(r) for r in reports], indent=2))
    else:
        print("\n\n".join(format_report(r) for r in reports))
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """`oracular evaluate`: score a replay's predictions."""
    import dataclasses

    from engine.evaluate import evaluate, format_scores

    config = load_config(args.config)
    events = _sorted_events(args)
    if events is None:
        return EXIT_USAGE
    result = evaluate(config, events)
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in result.scores], indent=2))
    else:
        print(format_scores(result))
    if args.plot:
        from streams.plots import plot_evaluation

        try:
            plot_evaluation(result, args.plot)
        except ImportError:
            print(
                "oracular evaluate: --plot needs matplotlib: pip install 'oracular-streams[plot]'",
                file=sys.stderr,
            )
            return EXIT_USAGE
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def run_check_config(args: argparse.Namespace) -> int:
    """Validate a config; print its intents or every problem."""
    config = load_config(args.config)
    for name, intent in config.intents.items():
        outcome = intent.outcome or "(none: never learns)"
        print(f"{name}: {len(intent.signals)} signals, outcome {outcome}")
    print(f"{args.config}: OK")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """`oracular replay`: events file -> outputs, no Kafka."""
    config = load_config(args.config)
    until = END_OF_TIME
    if args.until is not None:
        try:
            until = parse_time(
                int(args.until) if args.until.isdigit() else args.until, "--until", None
            )
        except DecodeError as exc:
            print(f"oracular replay: {exc}", file=sys.stderr)
            return EXIT_USAGE
    source = Path(args.events)
    try:
        handle = sys.stdin.buffer if args.events == "-" else source.open("rb")
    except OSError as exc:
        print(f"oracular replay: cannot read {source}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    total = None if args.events == "-" else source.stat().st_size
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
    run = ReplayRun(config, out, str(source), Progress("replay", total, enabled=not args.quiet))
    try:
        run.feed(handle, file_format(source, args.format), _columns(args))
        run.finish(until)
    finally:
        if out is not sys.stdout:
            out.close()
        if handle is not sys.stdin.buffer:
            handle.close()
    run.progress.close()
    if args.states:
        _write_states(run.replayer, args.states)
    if not args.quiet:
        summary = ", ".join(f"{k} {v:,}" for k, v in run.counts.items())
        print(f"replay: {summary}, users {len(run.replayer.states):,}", file=sys.stderr)
    return 0


class ReplayRun:
    """One replay: feeds file lines to a Replayer and writes every output as a JSON line."""

    def __init__(self, config: EngineConfig, out: TextIO, source: str, progress: Progress) -> None:
        """Write to `out`; `source` names the input in dead-letter records."""
        self.replayer = Replayer(config)
        self.out, self.source, self.progress = out, source, progress
        self.counts = dict.fromkeys(
            ("applied", "late", "ignored", "dead-lettered", "predictions", "episodes"), 0
        )

    def feed(self, handle: BinaryIO, fmt: FileFormat, columns: CsvColumns) -> None:
        """Apply every message of the file; bad ones are dead-lettered with the reason."""
        for line in read_lines(handle, fmt, columns):
            self.progress.advance(handle.tell() if handle.seekable() else 0)
            if line.ignored:
                self.counts["ignored"] += 1
            elif line.event is None:
                self.dead_letter(line.error or "undecodable", line.index, line.raw)
            else:
                self.apply(line.event, line.index, line.raw)

    def apply(self, event: Event, index: int, raw: bytes) -> None:
        """Apply one event and write its closed episode and changed predictions."""
        try:
            step = self.replayer.feed(event)
        except (EngineError, ValueError) as exc:
            self.dead_letter(str(exc), index, raw)
            return
        self.counts["applied"] += 1
        self.counts["late"] += step.late
        if step.closed is not None:
            self.write(episode_message(event.user, step.closed), EPISODES, "episodes")
        message = prediction_message(event.user, step, index)
        if message is not None:
            self.write(message, PREDICTIONS, "predictions")

    def finish(self, until: int) -> None:
        """Close the episodes due by the final watermark."""
        for user, closed in self.replayer.close_due(until):
            self.write(episode_message(user, closed), EPISODES, "episodes")

    def dead_letter(self, error: str, index: int, raw: bytes) -> None:
        """Write a DLQ record: the reason, the file and message index, the original bytes."""
        record = {"error": error, "source": self.source, "offset": index, "value": raw}
        self.write(record, DLQ, "dead-lettered")

    def write(self, message: dict[str, Any], topic: str, counter: str) -> None:
        """Write one output line and count it."""
        write_jsonl(self.out, message, topic)
        self.counts[counter] += 1


def _write_states(replayer: Replayer, path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for user, state in replayer.states.items():
            blob = base64.b64encode(serialize(state, include_config=False)).decode()
            write_jsonl(handle, {"user": user, "state": blob}, "states")


if __name__ == "__main__":
    raise SystemExit(main())
