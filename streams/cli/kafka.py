"""Subcommands that talk to Kafka: worker, backfill, produce, tail, reset.

Each imports Faust and aiokafka only when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

from schemas.config import load_config
from streams.cli.common import (
    WORKER_SETTINGS,
    columns,
    command_settings,
    did_you_mean,
    fail,
    input_arguments,
    input_todo,
    kafka_command,
    kafka_settings,
    non_negative_float,
    positive_float,
    positive_int,
    time_argument,
    time_flag,
    unreadable_input,
    usage_error,
)
from streams.runtime.progress import Progress
from streams.settings import add_flag
from streams.settings.exits import EXIT_NOTHING, EXIT_REFUSED
from streams.tools.pretty import ORDER_WINDOW_S

T = TypeVar("T")


def register(commands: Any) -> None:
    """Add the Kafka subcommands."""
    for add in (
        _add_worker,
        _add_backfill,
        _add_produce,
        _add_forget,
        _add_tail,
        _add_reset,
        _add_topics,
        _add_query,
    ):
        add(commands)


def _add_worker(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="run the stream processor (a Faust worker) against Kafka",
        description="Consume oracular.events, keep each user's engine state in RocksDB, close "
        "idle episodes on a timer, and publish predictions and closed episodes. "
        "Each setting flag names its ORACULAR_* environment variable (docs/operations.md); "
        "--loglevel, --no-create-topics and --processes have none.",
        epilog="examples:\n"
        "  oracular worker --config examples/oracular.yaml\n"
        "  oracular worker --config cfg.yaml --broker kafka-1:9092 --app-id oracular-prod\n"
        "  ORACULAR_PARTITIONS=16 oracular worker --config cfg.yaml --datadir /data/w1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flag(
        worker,
        "config_path",
        text="the engine config, YAML or JSON (docs/configuration.md); required unless "
        "ORACULAR_CONFIG is set (env ORACULAR_CONFIG; the demo's, examples/oracular.yaml, is "
        "what `make run` runs)",
    )
    for name in WORKER_SETTINGS:
        add_flag(worker, name)
    worker.add_argument(
        "--loglevel", default="info", help="Faust log level (default info; no env variable)"
    )
    worker.add_argument(
        "--no-create-topics",
        action="store_true",
        help="fail instead of creating missing product topics (no env variable)",
    )
    worker.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        metavar="N",
        help="run N worker processes of this app id (one core each; datadir DATADIR/p<i>, "
        "ports +i; at most the partition count is useful; no env variable)",
    )
    worker.set_defaults(run=run_worker)


def _add_backfill(commands: Any) -> None:
    backfill = commands.add_parser(
        "backfill",
        help="run the processor over the input topic's history under a fresh app id, then exit",
        description="Run the stream processor over the input topic from the beginning (or "
        "--since) up to the end offsets captured at start, under a fresh app id, "
        "then exit with a summary. It closes no episode by the timer until a partition "
        "reached its end, so it equals `oracular replay --until` its final watermark "
        "whatever the order of the topic (docs/time.md).",
        epilog="examples:\n"
        "  oracular backfill --config examples/oracular.yaml\n"
        "  oracular backfill --config cfg.yaml --since 2026-01-01T00:00:00Z "
        "--output-suffix .backfill",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flag(
        backfill,
        "config_path",
        required=not os.environ.get("ORACULAR_CONFIG"),
        text="the engine config (required unless ORACULAR_CONFIG is set)",
    )
    for name in WORKER_SETTINGS:
        if name != "app_id":
            add_flag(backfill, name)
    add_flag(
        backfill,
        "app_id",
        text="a fresh app id (default: <app id>-backfill-<UTC time>, <app id> from "
        "ORACULAR_APP_ID)",
    )
    backfill.add_argument(
        "--since",
        help="start at the first record whose Kafka timestamp is at or after this time "
        "(epoch ms or ISO-8601) instead of the beginning (no env variable)",
    )
    backfill.add_argument(
        "--output-suffix",
        default="",
        help="publish to <output topic><suffix> instead of the normal outputs (no env variable)",
    )
    backfill.add_argument(
        "--loglevel", default="warning", help="Faust log level (warning; no env variable)"
    )
    backfill.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="run N processes of the backfill's app id (one core each; datadir DATADIR/p<i>; "
        "at most the partition count; no env variable)",
    )
    # One process of a parallel backfill: the range its parent captured (JSON). Internal.
    backfill.add_argument("--part-of", help=argparse.SUPPRESS)
    backfill.set_defaults(run=run_backfill)


def _add_produce(commands: Any) -> None:
    produce = commands.add_parser(
        "produce",
        help="send an events file to the input topic (msgpack, keyed by user)",
        description="Send every event of a file (JSON lines, msgpack or CSV, as `replay` reads "
        "them) to the input topic as msgpack, keyed by user, with the event time as the "
        "record timestamp. Unusable lines are reported with their line number and skipped; "
        "a file with no event to send is an error (exit 2). Needs a broker and the input "
        "topic (`make broker-up`, `make topics`; exit 69 otherwise).",
        epilog="examples:\n  oracular produce examples/clickstream.jsonl --now\n"
        "  oracular produce export.csv --user-col user_id --time-col timestamp",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    produce.add_argument(
        "events", help="events file: JSON lines, a msgpack stream or CSV (native/Segment events)"
    )
    add_flag(produce, "broker")
    add_flag(
        produce,
        "topic_prefix",
        metavar="PREFIX",
        text="send to the input topic of a run with this topic prefix, PREFIX.events "
        "(ORACULAR_TOPIC_PREFIX)",
    )
    produce.add_argument(
        "--now",
        action="store_true",
        help="shift times so the last event happens now (live timeouts)",
    )
    produce.add_argument("--quiet", action="store_true", help="no progress line or summary")
    produce.add_argument(
        "--force",
        action="store_true",
        help="send even when the input topic already holds messages (refused without it: a "
        "worker that applied those would take these as late input)",
    )
    input_arguments(produce)
    produce.set_defaults(run=run_produce)


def _add_tail(commands: Any) -> None:
    tail = commands.add_parser(
        "tail",
        help="print predictions, closed episodes and dead letters as they arrive",
        description="Print the output topics' messages as JSON lines (each with its `topic`;\n"
        "a dead letter's origin is `source_topic`), or with --pretty as readable lines\n"
        "and a tally at the end, in event-time order (merged across partitions within\n"
        "--order-window seconds), as they arrive or, with --from-beginning, from each\n"
        "topic's first message (a run that already finished), until --max\n"
        "messages or --idle seconds without one. --topic-prefix and --output-suffix follow\n"
        "a run with its own topic names (a worker's --topic-prefix, a backfill's\n"
        "--output-suffix); --topics also takes full topic names. Needs a broker and the\n"
        "topics (`make broker-up`, `make topics`; exit 69 otherwise).",
        epilog="examples:\n  oracular tail\n  oracular tail --from-beginning --max 20\n"
        "  oracular tail --pretty --from-beginning --idle 10 --intent upgrade --reveals\n"
        "  oracular tail --pretty --from-beginning --user user-00126\n"
        "  oracular tail --pretty --from-beginning --topic-prefix demo-20261130T2210\n"
        "  oracular tail --pretty --output-suffix .bf --topics predictions,episodes\n"
        "  oracular tail --topics oracular.predictions.bf,oracular.events.dlq.bf",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flag(tail, "broker")
    tail.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at each topic's first message, so a run that already finished shows all "
        "its outputs (default: only what arrives from now on)",
    )
    tail.add_argument(
        "--max", type=positive_int, metavar="N", help="stop after N messages shown (N >= 1)"
    )
    tail.add_argument(
        "--idle",
        type=positive_float,
        metavar="S",
        help="stop after S seconds without messages (S > 0)",
    )
    tail.add_argument(
        "--user",
        action="append",
        metavar="USER",
        help="only this user's outputs (and dead letters keyed by it); repeat for more",
    )
    tail.add_argument(
        "--intent",
        action="append",
        metavar="INTENT",
        help="only predictions and episodes of this intent; repeat for more",
    )
    tail.add_argument(
        "--reveals",
        action="store_true",
        help="only predictions that reveal (of --intent, if given)",
    )
    tail.add_argument(
        "--order-window",
        type=non_negative_float,
        default=ORDER_WINDOW_S,
        metavar="S",
        help="hold outputs S seconds (and while catching up) and print them in event-time "
        f"order, merged across partitions and topics (default {ORDER_WINDOW_S:g}; 0: as they "
        "arrive)",
    )
    tail.add_argument(
        "--topics",
        default="predictions,episodes,dlq",
        help="outputs (predictions, episodes, dlq) or full topic names (default "
        "predictions,episodes,dlq)",
    )
    add_flag(
        tail,
        "topic_prefix",
        metavar="PREFIX",
        text="the outputs of a run with this topic prefix (ORACULAR_TOPIC_PREFIX)",
    )
    tail.add_argument(
        "--output-suffix",
        default="",
        help="the outputs <output topic><suffix>, as `backfill --output-suffix` writes them",
    )
    tail.add_argument(
        "--pretty",
        action="store_true",
        help="readable lines (ISO times, user, event, p and reveal per intent, episode closes, "
        "dead letters) and a tally on stderr when quiet and at the end",
    )
    tail.set_defaults(run=run_tail)


def _add_forget(commands: Any) -> None:
    forget = commands.add_parser(
        "forget",
        help="erase users for good (an erase command per user on the input topic)",
        description="Append an erase command for each USER to the input topic, keyed by the "
        "user, so it is ordered with the user's events. The worker that owns the user deletes "
        "its state (local store, changelog tombstone, lookup replica), remembers the erasure by "
        "a keyed digest of the id (ORACULAR_ERASURE_KEY), and publishes `erased` on the "
        "predictions topic; a later backfill or replay skips the user's inputs up to the erase "
        "time (docs/lifecycle.md). Prints each command's id, the proof to keep. Needs a broker "
        "and the input topic (exit 69 otherwise).",
        epilog='examples:\n  oracular forget user-42 --reason "GDPR request 2026-118"\n'
        "  oracular forget u1 u2 u3 --topic-prefix shop",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    forget.add_argument("users", nargs="+", metavar="USER", help="the user ids to erase")
    forget.add_argument("--reason", help="why (kept in each command on the input topic)")
    forget.add_argument(
        "--at",
        help="the erase time (epoch ms or ISO-8601; default now): the user's inputs up to it "
        "are erased, later ones start a new user",
    )
    add_flag(forget, "broker")
    add_flag(
        forget,
        "topic_prefix",
        metavar="PREFIX",
        text="erase in the run with this topic prefix, PREFIX.events (ORACULAR_TOPIC_PREFIX)",
    )
    forget.set_defaults(run=run_forget)


@kafka_command("forget")
def run_forget(args: argparse.Namespace) -> int:
    """`oracular forget`: erase commands onto the input topic."""
    import time

    from schemas.events import DecodeError, erase_command, show_time
    from streams.tools.kafkatools import run, send_commands

    try:
        at = time_flag(args.at, "--at")
    except ValueError as exc:
        return fail("forget", str(exc), "give epoch milliseconds or an ISO-8601 time")
    at = int(time.time() * 1000) if at is None else at
    commands = []
    for user in dict.fromkeys(args.users):  # each user once, in the order given
        try:
            commands.append(erase_command(user, at, args.reason))
        except DecodeError as exc:
            return fail(
                "forget", f"user {user[:64]!r}: {exc}", "give user ids as the events name them"
            )
    settings = kafka_settings(args)
    topic = settings.topics.events.name
    _require_broker(settings, [topic])
    written = run(send_commands(settings.broker, topic, commands, settings.client_kwargs()))
    if written is None:  # interrupted
        what = "interrupted: the commands may or may not have been written"
        return fail("forget", what, "run it again (a second erasure changes nothing)", EXIT_REFUSED)
    predictions = settings.topics.predictions.name
    for command, (partition, offset) in zip(commands, written, strict=True):
        print(
            f"forget: {command['user']}: command {command['id']} at {show_time(at)} written to "
            f"{topic} partition {partition} offset {offset}; the worker's `erased` message on "
            f"{predictions} confirms it"
        )
    return 0


def _add_reset(commands: Any) -> None:
    reset = commands.add_parser(
        "reset",
        help="delete an app id's internal topics, consumer offsets and local state",
        description="Like Kafka Streams' application reset tool: delete the app id's changelog "
        "and internal topics (<app id>-...), its consumer group (committed "
        "offsets) and its local state directory. Input and output topics are kept. "
        "Refuses while the group has active members.",
        epilog="examples:\n  oracular reset oracular --dry-run\n"
        "  oracular reset oracular-backfill-20260101 --datadir /data/w1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reset.add_argument("app_id")
    add_flag(reset, "broker")
    reset.add_argument("--datadir", help="the app's local state (default var/faust/APP_ID)")
    reset.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    reset.set_defaults(run=run_reset)


def _add_topics(commands: Any) -> None:
    topics = commands.add_parser(
        "topics",
        help="list the topics of every run, or delete one run's topics",
        description="`list`: every topic on the broker (but its own), grouped by run (topic "
        "prefix or app id), with partitions and messages. `delete RUN_OR_PREFIX`: delete the "
        "topics named RUN_OR_PREFIX, RUN_OR_PREFIX.* (a run's product topics) and "
        "RUN_OR_PREFIX-* (its app id's internal topics); `oracular reset` forgets its "
        "consumer group and local state. The default prefix (oracular) needs --yes.",
        epilog="examples:\n  oracular topics list\n"
        "  oracular topics delete demo-20261203T140000 --dry-run\n"
        "  oracular topics delete demo-20261203T140000\n"
        "  oracular topics delete oracular --yes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flag(topics, "broker")
    actions = topics.add_subparsers(title="actions", metavar="ACTION", dest="action")
    listing = actions.add_parser(
        "list",
        help="every topic, grouped by run, with partitions and messages",
        description="List every topic on the broker (but its own), grouped by run.",
    )
    add_flag(listing, "broker")
    listing.set_defaults(run=run_topics_list)
    delete = actions.add_parser(
        "delete",
        help="delete one run's topics (product and internal)",
        description="Delete the topics named RUN_OR_PREFIX, RUN_OR_PREFIX.* and "
        "RUN_OR_PREFIX-*. Refuses while a worker of that app id runs; the default prefix "
        "(oracular) needs --yes.",
    )
    delete.add_argument("run_or_prefix", metavar="RUN_OR_PREFIX")
    add_flag(delete, "broker")
    delete.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    delete.add_argument("--yes", action="store_true", help="needed for the default prefix")
    delete.set_defaults(run=run_topics_delete)
    topics.set_defaults(run=lambda args: usage_error(topics, "name an action: list or delete"))


@kafka_command("topics")
def run_topics_list(args: argparse.Namespace) -> int:
    """`oracular topics list`."""
    from streams.tools.kafkatools import run
    from streams.tools.runs import describe, list_topics

    settings = kafka_settings(args)
    _require_broker(settings)
    print(describe(run(list_topics(settings.broker, settings.client_kwargs())) or []))
    return 0


@kafka_command("topics")
def run_topics_delete(args: argparse.Namespace) -> int:
    """`oracular topics delete RUN_OR_PREFIX`."""
    from streams.settings import BY_NAME
    from streams.tools.kafkatools import run
    from streams.tools.reset import plan_reset
    from streams.tools.runs import belongs, delete_topics, list_topics

    settings = kafka_settings(args)
    client = settings.client_kwargs()
    wanted = args.run_or_prefix
    if wanted == BY_NAME["topic_prefix"].default and not args.yes and not args.dry_run:
        return fail(
            "topics",
            f"{wanted!r} is the default prefix (the topics `oracular worker` uses unless told "
            "otherwise)",
            "add --yes to delete them, or --dry-run to see them",
            EXIT_REFUSED,
        )
    _require_broker(settings)
    topics = run(list_topics(settings.broker, client)) or []
    doomed = [t.name for t in topics if belongs(t.name, wanted)]
    if not doomed:
        runs = sorted({t.run for t in topics})
        return fail(
            "topics",
            f"no topic belongs to {wanted!r}{did_you_mean(wanted, runs)}",
            "`oracular topics list` shows the runs",
            EXIT_NOTHING,
        )
    plan = run(plan_reset(settings.broker, wanted, Path("/nonexistent"), client))
    for name in doomed:
        print(f"  topic {name}")
    if plan.members:
        return fail(
            "topics",
            f"the consumer group {wanted!r} has {plan.members} active member(s), which would "
            "create the topics again",
            "stop its workers first",
            EXIT_REFUSED,
        )
    if args.dry_run:
        print(f"dry run: {len(doomed)} topic(s) would be deleted")
        return 0
    run(delete_topics(settings.broker, doomed, client))
    print(
        f"deleted {len(doomed)} topic(s)"
        + (
            f"; `oracular reset {wanted}` forgets its consumer group and local state"
            if plan.group
            else ""
        )
    )
    return 0


@kafka_command("worker")
def run_worker(args: argparse.Namespace) -> int:
    """`oracular worker`: check the broker and topics, then run the Faust worker."""
    import asyncio

    from streams.tools.admin import prepare_deployment

    settings = command_settings(args)
    if args.config_path is None and not os.environ.get("ORACULAR_CONFIG"):
        # Never the demo's config by accident: a production worker would learn and publish
        # with the example's intents and weights.
        return fail(
            "worker",
            "no engine config given",
            "pass --config FILE or set ORACULAR_CONFIG (examples/oracular.yaml is the demo's; "
            "`make run` runs it)",
        )
    config = load_config(settings.config_path)
    asyncio.run(prepare_deployment(settings, create=not args.no_create_topics))
    if args.processes > 1:
        from streams.settings import as_environment, flag_values
        from streams.tools.processes import child_environments, main_env, run_processes

        partitions = settings.topics.events.partitions
        if args.processes > partitions:
            print(
                f"oracular worker: {args.processes} processes for {partitions} partitions: "
                f"{args.processes - partitions} would stay idle (raise ORACULAR_PARTITIONS "
                "on new topics, or add partitions to the topics, to use more)",
                file=sys.stderr,
            )
        # Each child is a worker reading its settings as this one did: the flags given here
        # reach it as their variables, in its own environment (never this process's).
        env = {**main_env(), **as_environment(flag_values(args))}
        environments = child_environments(args.processes, env, settings.state_dir)
        return run_processes(["--loglevel", args.loglevel, "--no-create-topics"], environments)
    from streams.worker import create_worker

    use_fast_event_loop()
    app = create_worker(settings, config)
    faust_worker(app, args.loglevel).execute_from_commandline()
    return 0


@kafka_command("backfill")
def run_backfill(args: argparse.Namespace) -> int:
    """`oracular backfill`: a bounded worker run under a fresh app id."""
    import time

    from schemas.events import show_time
    from streams.runtime.app import create_runtime
    from streams.runtime.backfill import Backfill, Range

    try:
        settings, since = _backfill_settings(args)
    except ValueError as exc:
        return fail("backfill", str(exc), "give an epoch ms or ISO-8601 time")
    config = load_config(settings.config_path)
    partitions = settings.topics.events.partitions
    if not 1 <= args.processes <= partitions:
        what = (
            f"--processes must be between 1 and the {partitions} input partitions "
            f"(got {args.processes})"
        )
        return fail("backfill", what, "one process per partition at most")
    if args.part_of is None:
        span = _prepare_backfill(settings, since)
        if args.processes > 1:
            return _backfill_processes(args, settings, span)
    else:
        try:
            part_of = args.part_of
            if part_of.startswith("@"):  # a range too long for a command line: its file
                part_of = Path(part_of[1:]).read_text(encoding="utf-8")
            span = Range.from_json(part_of)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            msg = f"--part-of is not a range from a parallel backfill ({type(exc).__name__})"
            return fail("backfill", msg, "leave --part-of to `backfill --processes`")
    started = time.monotonic()
    one_of_many = args.part_of is not None
    events_topic = settings.topics.events.name
    plan = Backfill(
        dict(span.start),
        dict(span.stop),
        # SIGTERM: the worker's graceful shutdown. One of several processes only says it is
        # done and goes on until its parent stops them all: one that left early would make
        # the others restore its partitions (all of their state) before they could go on.
        done=(lambda: finished_marker(settings.state_dir).touch())
        if one_of_many
        else (lambda: os.kill(os.getpid(), signal.SIGTERM)),
        # One of several processes: the parent prints the progress of them all.
        progress=None if one_of_many else Progress("backfill", total=span.total, unit="messages"),
        erased=span.erased,
        owned=(lambda: _owned(app, events_topic)) if one_of_many else None,
    )
    use_fast_event_loop()
    runtime = create_runtime(settings, config, backfill=plan)
    app = runtime.app
    with contextlib.suppress(SystemExit):  # the worker exits through SystemExit
        faust_worker(app, args.loglevel).execute_from_commandline()
    processor = runtime.processor
    elapsed = time.monotonic() - started
    rate = processor.handled() / max(elapsed, 1e-9)
    summary = processor.summary(", ")
    status = "complete" if plan.reached else "INTERRUPTED before the end"
    if one_of_many:
        status += " (one process of several)"
    print(
        f"backfill {settings.app_id} {status}: {summary} in {elapsed:.1f} s "
        f"({rate:,.0f} messages/s)",
        file=sys.stderr,
    )
    marks = [c.watermark for c in processor.clocks.values() if c.watermark is not None]
    if marks:
        # The timer closed what was due by these (docs/time.md): `oracular replay --until`
        # the same value gives the same outputs.
        print(
            f"backfill final watermark: {show_time(min(marks))} .. {show_time(max(marks))} "
            f"({min(marks)} .. {max(marks)} epoch ms, per partition)",
            file=sys.stderr,
        )
    return 0 if plan.reached else 1


def _owned(app: Any, topic: str) -> set[int]:
    """The input partitions `app` owns now; none while a rebalance is under way."""
    if app.rebalancing:
        return set()
    return {tp.partition for tp in app.consumer.assignment() if tp.topic == topic}


def _backfill_processes(args: argparse.Namespace, settings: Any, span: Any) -> int:
    """`oracular backfill --processes N`: N processes of the backfill's app id over the range
    captured here, each with its own datadir; progress from the group's committed offsets."""
    import time

    from streams.settings import as_environment, flag_values
    from streams.tools.backfill import committed_offsets
    from streams.tools.kafkatools import run
    from streams.tools.processes import child_environments, main_env, run_processes

    env = {**main_env(), **as_environment(flag_values(args))}
    environments = child_environments(args.processes, env, settings.state_dir)
    argv = ["--loglevel", args.loglevel, "--app-id", settings.app_id]
    part_of = span.to_json()
    if len(part_of) > MAX_ARGUMENT_CHARS:  # many erasures: the range goes in a file
        ranged = settings.state_dir / "backfill-range.json"
        ranged.parent.mkdir(parents=True, exist_ok=True)
        ranged.write_text(part_of, encoding="utf-8")
        part_of = f"@{ranged}"
    argv += ["--output-suffix", args.output_suffix, "--part-of", part_of]
    progress = Progress("backfill", total=span.total, unit="messages")
    client = settings.client_kwargs()
    events_topic = settings.topics.events.name
    started = time.monotonic()
    polled = [started]

    def show_progress() -> None:
        now = time.monotonic()
        if now - polled[0] < PARALLEL_PROGRESS_S:
            return
        polled[0] = now
        try:
            offsets = run(committed_offsets(settings.broker, settings.app_id, events_topic, client))
        except Exception:  # progress only: the processes report real failures themselves
            return
        if offsets is None:  # interrupted
            return
        handled = span.handled(offsets)
        progress.advance(handled, count=handled - progress.done)

    markers = [finished_marker(Path(e["ORACULAR_DATADIR"])) for e in environments]
    for marker in markers:
        marker.unlink(missing_ok=True)

    def watch(running: set[int]) -> bool:
        show_progress()
        return all(markers[i].exists() for i in running)

    code = run_processes(argv, environments, command="backfill", watch=watch)
    elapsed = time.monotonic() - started
    status = "complete" if code == 0 else f"FAILED (exit {code})"
    print(
        f"backfill {settings.app_id} {status}: {span.total:,} messages in {args.processes} "
        f"processes in {elapsed:.1f} s ({span.total / max(elapsed, 1e-9):,.0f} messages/s)",
        file=sys.stderr,
    )
    return code


def finished_marker(state_dir: Path) -> Path:
    """The file one process of a parallel backfill creates in its datadir once the partitions
    it owns are done; the parent stops them all when every running one has."""
    return state_dir / "backfill-finished"


PARALLEL_PROGRESS_S = 5.0
MAX_ARGUMENT_CHARS = 64_000
"""Longest `--part-of` range handed on a command line (Linux allows 128 KiB an argument)."""
"""How often a parallel backfill's parent reads the group's committed offsets for progress."""


def _backfill_settings(args: argparse.Namespace) -> tuple[Any, int | None]:
    """Settings with a fresh app id and suffixed outputs, and the --since time."""
    import time

    # A SettingsError goes to streams.cli.main, which reports every problem.
    settings = command_settings(args)
    overrides: dict[str, str | None] = {}
    if args.app_id is None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        overrides["app_id"] = f"{settings.app_id}-backfill-{stamp}"
    if args.output_suffix:
        topics = settings.topics
        for role, spec in (
            ("predictions", topics.predictions),
            ("episodes", topics.episodes),
            ("dlq", topics.dlq),
        ):
            overrides[f"topic_{role}"] = spec.name + args.output_suffix
    sources = {name: "--output-suffix" for name in overrides if name.startswith("topic_")}
    settings = command_settings(args, sources, **overrides)
    if args.since is None:
        return settings, None
    return settings, time_flag(args.since, "--since")


def _prepare_backfill(settings: Any, since: int | None) -> Any:
    """Check the broker, the input topic and the app id, capture the range, create outputs,
    commit --since."""
    from streams.runtime.erasure import erasure_key
    from streams.tools.admin import prepare_deployment
    from streams.tools.backfill import capture_range, check_fresh, commit_start, scan_erasures
    from streams.tools.kafkatools import run

    client = settings.client_kwargs()
    events = settings.topics.events.name
    _require_broker(settings, [events])  # else nothing to backfill: `make topics` first
    run(prepare_deployment(settings))
    run(check_fresh(settings.broker, settings.app_id, client))
    span = run(capture_range(settings.broker, events, since, client))
    if span.total:
        secret, skew = erasure_key(settings), settings.max_skew_ms
        markers = run(
            scan_erasures(settings.broker, events, span, secret, max_skew_ms=skew, client=client)
        )
        if markers is None:  # Ctrl-C: a backfill without its erasures would bring users back
            raise SystemExit(fail("backfill", "interrupted", "run it again", EXIT_REFUSED))
        span = dataclasses.replace(span, erased=markers)
    if since is not None:
        run(commit_start(settings.broker, settings.app_id, events, span.start, client))
    erased = f"; the inputs of {len(span.erased):,} erased user(s) skipped" if span.erased else ""
    print(
        f"backfill {settings.app_id}: {span.total:,} messages of {events} "
        f"(start {span.start}, end {span.stop}); outputs to "
        f"{settings.topics.predictions.name} and {settings.topics.episodes.name}{erased}",
        file=sys.stderr,
    )
    return span


@kafka_command("produce")
def run_produce(args: argparse.Namespace) -> int:
    """`oracular produce`: an events file onto the input topic."""
    import time

    from schemas.files import EventFileError, file_format
    from streams.settings import BY_NAME
    from streams.tools.backfill import capture_range
    from streams.tools.kafkatools import Acked, produce_events, read_events, run
    from streams.tools.pretty import plural

    settings = kafka_settings(args)
    path = Path(args.events)
    problem = unreadable_input(path)
    if problem:
        return fail("produce", problem, "check the path")
    try:  # the file first: a bad one needs no broker to be told so
        events, skipped = read_events(path, file_format(path, args.format), columns(args))
    except EventFileError as exc:
        return fail("produce", f"{path}: {exc}", input_todo(file_format(path, args.format)))
    if not events:
        what = f"{path}: no event to send ({skipped} line(s) skipped); nothing sent"
        return fail("produce", what, "give produce a file with events")
    topic = settings.topics.events.name
    client = settings.client_kwargs()
    _require_broker(settings, [topic])
    held = run(capture_range(settings.broker, topic, None, client)).total
    if held and not args.force:
        # A second `produce --now` of the same file: its events are older than the first
        # one's, so a worker that applied those counts them late and behind its watermark.
        prefix = topic.removesuffix(".events")
        if prefix == BY_NAME["topic_prefix"].default:
            prefix += " --yes"
        what = (
            f"{topic} already holds {held:,} messages: a worker that applied them would take "
            "these as late input (a second `--now` copy of a file lands behind the first in "
            "event time); nothing sent"
        )
        todo = (
            "to add them anyway, pass --force; to start over, use a new --topic-prefix and app "
            "id (`make run` does), or stop the worker and run `oracular reset APP_ID` (the "
            f"worker's app id) and `oracular topics delete {prefix}`"
        )
        return fail("produce", what, todo, EXIT_REFUSED)
    progress = Progress("produce", enabled=not args.quiet)
    now = int(time.time() * 1000) if args.now else None
    acked = Acked()
    sent = run(
        produce_events(
            settings.broker,
            topic,
            events,
            now_ms=now,
            client=client,
            progress=progress,
            acked=acked,
        )
    )
    progress.close()
    if sent is None:  # Ctrl-C: say how far it got, so a rerun can start there
        what = (
            f"interrupted: {acked.count:,} of {len(events):,} events were acknowledged by "
            f"{topic} (the rest may or may not have been written)"
        )
        todo = "`oracular topics list` shows what the topic holds; --force sends to it again"
        return fail("produce", what, todo, EXIT_REFUSED)
    if sent is not None and not args.quiet:
        print(
            f"produce: {plural(sent, 'event')} to {topic} on {settings.broker} ({skipped} skipped)",
            file=sys.stderr,
        )
    return 0


@kafka_command("tail")
def run_tail(args: argparse.Namespace) -> int:
    """`oracular tail`: print output messages as JSON lines, or readably with --pretty."""
    from streams.tools.kafkatools import tail_topics
    from streams.tools.pretty import Filter, Tally

    settings = kafka_settings(args)  # --broker and --topic-prefix
    try:
        topics = tail_topic_names(args.topics, settings.topics, args.output_suffix)
    except ValueError as exc:
        return fail("tail", f"--topics: {exc}", "or give full topic names")
    _require_broker(settings, topics)
    # SIGTERM, and SIGINT even when started ignoring it (a background job of a script, as in
    # `make run`), stop it as Ctrl-C does: what it holds is printed, then the tally. Once:
    # `make run` sends SIGTERM after the terminal's SIGINT, and the tally must still come out.
    stop = StopOnce()
    stop.install()
    tally = Tally() if args.pretty else None
    keep = Filter(frozenset(args.user or ()), frozenset(args.intent or ()), args.reveals)
    stop.run(
        tail_topics(
            settings.broker,
            topics,
            from_beginning=args.from_beginning,
            limit=args.max,
            idle_s=args.idle,
            out=sys.stdout,
            client=settings.client_kwargs(),
            tally=tally,
            keep=keep,
            window_s=args.order_window,
            stopping=lambda: stop.stopped,
        )
    )
    if tally is not None:
        print(f"tail: {tally.summary()}", file=sys.stderr)
    return 0


class StopOnce:
    """The first SIGINT or SIGTERM ends a command's run quietly; the rest are ignored.

    Inside the run (`run`), a signal cancels the run's main task, as asyncio's own Ctrl-C
    handling does, so the coroutine's `finally` blocks run in order (`oracular tail` prints
    what it holds, then stops its consumer). A handler that raised KeyboardInterrupt instead
    landed in whatever code was running, aiokafka's own tasks included, and such a task's
    exception was then logged with a traceback ("Task exception was never retrieved") as
    `make run` stopped on a busy machine.

    Outside the run (before the loop starts, after it ends) a signal is only recorded: the
    summary a command prints after its run must still come out when `make run` sends SIGTERM
    after the terminal's SIGINT. The handler stays installed rather than switching to
    SIG_IGN: a second signal that arrived before Python ran the first one's handler would find
    SIG_IGN when its turn came, and CPython raises `OSError: Signal 15 ignored due to race
    condition` then."""

    SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.stopped = False
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    def install(self) -> None:
        """Handle SIGINT and SIGTERM from now on (for the rest of the process)."""
        for signum in self.SIGNALS:
            signal.signal(signum, self)

    def __call__(self, signum: int, frame: Any) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self._running is not None:
            loop, task = self._running
            task.cancel()
            loop.call_soon_threadsafe(_nothing)  # wakes the loop if it waits in select

    def run(self, coro: Coroutine[Any, Any, T]) -> T | None:
        """`streams.tools.kafkatools.run(coro)`, which a signal ends quietly (None)."""
        from streams.tools.kafkatools import run

        result: T | None = run(self._main(coro))
        return result

    async def _main(self, coro: Coroutine[Any, Any, T]) -> T | None:
        task = asyncio.current_task()
        assert task is not None
        self._running = (asyncio.get_running_loop(), task)
        try:
            if self.stopped:  # a signal before the loop started
                coro.close()
                return None
            return await coro
        except asyncio.CancelledError:
            if self.stopped:
                return None
            raise
        finally:
            self._running = None


def _nothing() -> None:
    pass


def tail_topic_names(wanted: str, topics: Any, suffix: str = "") -> list[str]:
    """The topic names `oracular tail --topics WANTED` follows: each output role (predictions,
    episodes, dlq) becomes its topic name (with the configured prefix) plus `suffix`; any other
    item is taken as a full topic name.

    Raises:
        ValueError: nothing is wanted, or an item is not a legal topic name.
    """
    from streams.settings.topics import TopicSpec

    names = {
        "predictions": topics.predictions.name,
        "episodes": topics.episodes.name,
        "dlq": topics.dlq.name,
    }
    items = [w.strip() for w in wanted.split(",") if w.strip()]
    if not items:
        raise ValueError("--topics names no output; use predictions, episodes, dlq or topic names")
    chosen = []
    for item in items:
        hint = did_you_mean(item, names)
        if item not in names and "." not in item and hint:
            msg = f"{item!r} is not an output{hint}; the outputs are predictions, episodes, dlq"
            raise ValueError(msg)
        name = names[item] + suffix if item in names else item
        try:
            TopicSpec(name, 1)
        except ValueError as exc:
            msg = f"{item!r} is not an output (predictions, episodes, dlq) or a topic name: {exc}"
            raise ValueError(msg) from exc
        if name not in chosen:
            chosen.append(name)
    return chosen


@kafka_command("reset")
def run_reset(args: argparse.Namespace) -> int:
    """`oracular reset APP_ID`."""
    from streams.tools.kafkatools import run
    from streams.tools.reset import execute_reset, plan_reset

    settings = kafka_settings(args)
    # --datadir, else ORACULAR_DATADIR, else the worker's default: var/faust/APP_ID under the
    # directory the worker ran in (said in full, so a reset from elsewhere says where it looked)
    datadir = Path(args.datadir) if args.datadir else settings.datadir
    datadir = (datadir or Path("var") / "faust" / args.app_id).absolute()
    client = settings.client_kwargs()
    _require_broker(settings)
    plan = run(plan_reset(settings.broker, args.app_id, datadir, client))
    if plan.group is None and not plan.topics and plan.datadir is None:
        from streams.tools.runs import list_topics

        runs = sorted({t.run for t in run(list_topics(settings.broker, client)) or []})
        return fail(
            "reset",
            f"nothing belongs to app id {args.app_id!r} (no consumer group, no internal topic, "
            f"no {datadir}){did_you_mean(args.app_id, runs)}",
            "check the id; `oracular topics list` shows the runs",
            EXIT_NOTHING,
        )
    print(plan.describe())
    if plan.members:
        return fail(
            "reset",
            f"refused: the consumer group {args.app_id!r} has {plan.members} active member(s)",
            "stop its workers first",
            EXIT_REFUSED,
        )
    if plan.datadir_in_use:
        return fail(
            "reset",
            f"refused: the datadir {plan.datadir} is in use by a running worker",
            "stop it first",
            EXIT_REFUSED,
        )
    if args.dry_run:
        print("dry run: nothing deleted")
        return 0
    run(execute_reset(settings.broker, plan, client))
    print("deleted")
    return 0


def _add_query(commands: Any) -> None:
    query = commands.add_parser(
        "query",
        help="look a user up through a worker's API (predictions, reveal decisions, cooldowns), "
        "or post that the app revealed a prompt",
        description="Ask any worker's lookup API (docs/serving.md) for a user's predictions, "
        "computed at request time; a worker that does not own the user forwards to the "
        "owner. The bearer token is read from ORACULAR_API_TOKEN or ORACULAR_API_TOKEN_FILE.",
        epilog="examples:\n  oracular query user-00016\n"
        "  oracular query user-00016 --intent upgrade --explain\n"
        "  oracular query u1 --url http://worker-2:6067 --stale --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    query.add_argument("user", help="the user id (the input messages' key)")
    query.add_argument("--intent", help="one declared intent (default: all)")
    query.add_argument("--explain", action="store_true", help="add weights, hits and misses")
    query.add_argument(
        "--at",
        type=time_argument("--at"),
        help="read as of this time, epoch ms or ISO-8601 (default: now)",
    )
    query.add_argument("--stale", action="store_true", help="accept a standby replica's copy")
    query.add_argument(
        "--url",
        help="a worker's API (ORACULAR_API_URL; default: the URL the app's local worker wrote "
        "in its datadir, DATADIR/api-url, which has the free port it took when 6067 was "
        "taken; else http://127.0.0.1:ORACULAR_API_PORT)",
    )
    query.add_argument("--json", action="store_true", help="print the raw JSON answer")
    query.add_argument(
        "--revealed",
        metavar="INTENT",
        help="instead of a lookup, say the app showed INTENT's prompt to the user now (or at "
        "--at): POST /v1/users/USER/revealed, which starts the intent's cooldown",
    )
    add_flag(
        query,
        "app_id",
        text="the app the worker must belong to: its answers must say it (default oracular; "
        "env ORACULAR_APP_ID)",
    )
    query.set_defaults(run=run_query)


def run_query(args: argparse.Namespace) -> int:
    """`oracular query USER`: one lookup, printed readably (or as JSON)."""
    import json

    from streams.lookup.query import QueryError, default_url, lookup, render, reveal

    # ORACULAR_API_URL/_HOST/_PORT/_TOKEN, and --app-id over ORACULAR_APP_ID
    settings = command_settings(argparse.Namespace(app_id=args.app_id))
    url = args.url or default_url(settings)
    try:
        if args.revealed is not None:
            body = reveal(
                url,
                args.user,
                args.revealed,
                ts=args.at,
                token=settings.api_token,
                cafile=settings.api_tls_cafile,
                app_id=settings.app_id,
            )
            command = body["command"]
            where = f"{body['topic']} partition {body['partition']} offset {body['offset']}"
            print(
                json.dumps(body, indent=2)
                if args.json
                else (
                    f"reveal of {command['intent']} for {command['user']} at {command['ts']} "
                    f"accepted: command {command['id']} appended to {where}"
                )
            )
            return 0
        body = lookup(
            url,
            args.user,
            intent=args.intent,
            explain=args.explain,
            stale=args.stale,
            at=args.at,
            token=settings.api_token,
            cafile=settings.api_tls_cafile,
            app_id=settings.app_id,
        )
    except QueryError as exc:
        return fail("query", exc.what, exc.todo, exc.code)
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        render(body, sys.stdout)
    return 0


def _require_broker(settings: Any, topics: list[str] | None = None) -> None:
    """streams.tools.admin.require_broker for a command's settings (BrokerError: kafka_command)."""
    from streams.tools.admin import require_broker
    from streams.tools.kafkatools import run

    run(require_broker(settings.broker, topics=topics or (), client=settings.client_kwargs()))


def faust_worker(app: Any, loglevel: str) -> Any:
    """A Faust worker for `app`; its startup spinner only on a terminal.

    Faust's spinner writes cursor hide/show codes and backspaces to stdout even when stdout is
    a file or pipe; without it the worker logs "Ready" instead.
    """
    import faust

    worker = faust.Worker(app, loglevel=loglevel)
    if not worker.stdout.isatty():
        worker.spinner = None
    return worker


def use_fast_event_loop() -> None:
    """Run the worker on uvloop when it is installed (a dependency except on Windows)."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
