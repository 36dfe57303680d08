"""Offline subcommands: replay, tune, evaluate, check-config (no Kafka, no Faust)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, Final, TextIO

from engine import END_OF_TIME, EngineConfig, Event
from schemas.config import load_config
from schemas.files import (
    EventFileError,
    Line,
    file_format,
    jsonl_line,
    plausible_times,
    read_lines,
    read_sorted_events,
    scan_erasures,
    write_jsonl,
)
from schemas.outputs import DLQ, EPISODES, PREDICTIONS
from streams.cli.common import (
    columns,
    fail,
    input_arguments,
    input_todo,
    time_flag,
    unreadable_input,
    writable_output,
)
from streams.runtime.memory import GcPolicy
from streams.runtime.processor import DLQ as DLQ_ROLE
from streams.runtime.processor import EPISODES as EPISODES_ROLE
from streams.runtime.processor import PREDICTIONS as PREDICTIONS_ROLE
from streams.runtime.processor import Output
from streams.runtime.progress import Progress
from streams.settings.exits import EXIT_USAGE
from streams.tools.held import DEFAULT_MEMORY_MIB, USER_BYTES
from streams.tools.replay import OfflineRun, encoded_state


def register(commands: Any) -> None:
    """Add the offline subcommands."""
    for add in (_add_replay, _add_tune, _add_evaluate, _add_check):
        add(commands)


def _add_replay(commands: Any) -> None:
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
        "--until",
        help="final watermark, epoch ms or ISO-8601: episodes due "
        "by then are closed (default: the end of time)",
    )
    replay.add_argument(
        "--clock",
        help="the run's clock, epoch ms or ISO-8601 (default: now): an event time more than "
        "the allowed clock skew ahead of it is dead-lettered, as a live worker does with its "
        "record's timestamp (a file has none)",
    )
    replay.add_argument("--states", help="also write each user's final state to this JSONL file")
    replay.add_argument(
        "--memory",
        type=int,
        default=DEFAULT_MEMORY_MIB,
        metavar="MIB",
        help="memory for users' states, in MiB (default %(default)s: about "
        f"{DEFAULT_MEMORY_MIB * 2**20 // USER_BYTES:,} users). Users beyond it are written to "
        "disk, under --spill-dir, and read back when they come again: the outputs are the "
        "same, a history of millions of users fits any machine, and it costs disk space (about "
        "the stored state of each user, removed at the end) and some speed when users come "
        "back in no order",
    )
    replay.add_argument(
        "--spill-dir",
        help="where users beyond --memory are written (default: the system's temporary "
        "directory, $TMPDIR)",
    )
    replay.add_argument("--quiet", action="store_true", help="no progress line or summary")
    input_arguments(replay)
    replay.set_defaults(run=run_replay)


def _add_tune(commands: Any) -> None:
    tune = commands.add_parser(
        "tune",
        help="suggest signal weights from history (declared and candidate signals)",
        description="Cut the events into episodes with the config's rules and report, per "
        "intent, each declared signal and each other event name seen in at least "
        "--min-episodes episodes: episodes with/without it, raw lift, evidence "
        "score, a 95% Wilson interval and a suggested weight "
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
    tune.add_argument(
        "--evaluate",
        action="store_true",
        help="also replay the events with the suggested weights, as suggested and times the "
        "factor (0.5, 0.75, ..., 3) with the lowest Brier score (`fitted xF`), and compare "
        "AUC, Brier, reveals, precision and recall with the config's (docs/tools.md)",
    )
    tune.set_defaults(run=run_tune)


def _add_evaluate(commands: Any) -> None:
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


def _add_check(commands: Any) -> None:
    check = commands.add_parser(
        "check-config",
        help="validate a config file and summarise it",
        description="Validate an engine config (YAML or JSON) against its schema and rules; "
        "print each intent's signal count and outcome, or every problem with its path "
        "(exit 2).",
        epilog="example:\n  oracular check-config examples/oracular.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("config")
    check.set_defaults(run=run_check_config)


def _analysis_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("events", help="events file: JSONL, msgpack, or CSV (sorted per user)")
    parser.add_argument("--config", required=True, help="the engine config (YAML or JSON)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    input_arguments(parser)


def _sorted_events(args: argparse.Namespace, config: EngineConfig) -> list[Event] | None:
    """The events of `args.events` for tune and evaluate, without producers' retries (the
    config's `dedupeWindow`); None (said on stderr) when the file cannot be used, is unsorted,
    or holds no event."""
    path = Path(args.events)
    problem = unreadable_input(path)
    if problem:
        fail(args.command, problem, "check the path")
        return None
    fmt = file_format(path, args.format)
    try:
        events = read_sorted_events(path, fmt, columns(args), config=config)
    except EventFileError as exc:  # its message names the file
        fail(args.command, str(exc), input_todo(fmt))
        return None
    if not events:
        fail(args.command, f"{path} holds no event", f"give {args.command} a file with events")
        return None
    return events


def run_replay(args: argparse.Namespace) -> int:
    """`oracular replay`: events file -> outputs, no Kafka."""
    GcPolicy.tune()  # the engine allocates as in the worker: the same collector schedule
    config = load_config(args.config)
    try:
        until = time_flag(args.until, "--until")
        clock = time_flag(args.clock, "--clock")
    except ValueError as exc:
        return fail("replay", str(exc), "give epoch milliseconds or an ISO-8601 time")
    source = Path(args.events)
    problem = _replay_files_problem(args)
    if problem:
        return fail("replay", *problem)
    handle = sys.stdin.buffer if args.events == "-" else source.open("rb")
    total = None if args.events == "-" else source.stat().st_size
    try:
        out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        return fail("replay", f"cannot write --out {args.out}: {exc.strerror}", "write elsewhere")
    try:  # a pipe cannot be read ahead: its erasures apply from their commands on
        erased = (
            {}
            if args.events == "-"
            else scan_erasures(source, file_format(source, args.format), columns(args))
        )
    except EventFileError as exc:
        return fail("replay", f"{source}: {exc}", input_todo(file_format(source, args.format)))
    config_run = OfflineRun(
        config,
        str(source),
        clock,
        memory_users=max(args.memory * 2**20 // USER_BYTES, 1),
        spill_dir=args.spill_dir,
        erased=erased,
    )
    try:
        return _replay(args, config_run, handle, out, (source, total, until))
    finally:
        config_run.close()  # what went to disk beyond --memory


def _replay(
    args: argparse.Namespace,
    config_run: OfflineRun,
    handle: BinaryIO,
    out: TextIO,
    source_total_until: tuple[Path, int | None, int | None],
) -> int:
    source, total, until = source_total_until
    started = time.monotonic()
    progress = Progress("replay", total, enabled=not args.quiet)
    try:
        lines = plausible_times(
            read_lines(handle, file_format(source, args.format), columns(args)),
            config_run.clock_ms,
        )
        _feed(config_run, lines, out, _ProgressOf(handle, progress))
        for outputs in config_run.finish_chunks(END_OF_TIME if until is None else until):
            _write(out, outputs)
    except EventFileError as exc:  # raised before any line: the file cannot be read at all
        return fail("replay", f"{source}: {exc}", input_todo(file_format(source, args.format)))
    finally:
        if out is not sys.stdout:
            out.close()
        if handle is not sys.stdin.buffer:
            handle.close()
    progress.close()
    if args.states:
        try:
            with open(args.states, "w", encoding="utf-8") as states:
                for user, state in config_run.final_states():  # one at a time: any number
                    write_jsonl(states, {"user": user, "state": encoded_state(state)}, "states")
        except OSError as exc:
            what = f"cannot write --states {args.states}: {exc.strerror}"
            return fail("replay", what, "write elsewhere")
    if not args.quiet:
        _summary(config_run, time.monotonic() - started)
    counts = config_run.counts
    if counts["applied"] == 0:  # every line a dead letter (or ignored): not a history at all
        what = (
            f"{source}: no event was applied ({counts['dead_lettered']:,} dead-lettered, "
            f"{counts['ignored']:,} ignored)"
        )
        todo = "check the file's format (docs/messages.md); the dead letters say why"
        return fail("replay", what, todo)
    return 0


def _summary(config_run: OfflineRun, elapsed: float) -> None:
    counts = config_run.counts
    shown = (
        "applied",
        "late",
        "duplicate_id",
        "ignored",
        "dead_lettered",
        "predictions",
        "episodes",
        *(("expired",) if config_run.config.state_ttl_ms is not None else ()),
        *(("erasures", "erased") if counts["erasures"] or counts["erased"] else ()),
    )
    summary = ", ".join(f"{name.replace('_', '-')} {counts[name]:,}" for name in shown)
    rate = config_run.processor.handled() / max(elapsed, 1e-9)
    spilled = config_run.written_to_disk
    disk = f" (beyond --memory: {spilled:,} written to disk)" if spilled else ""
    print(
        f"replay: {summary}, users {config_run.user_count():,}{disk} "
        f"in {elapsed:.1f} s ({rate:,.0f} events/s)",
        file=sys.stderr,
    )


def _replay_files_problem(args: argparse.Namespace) -> tuple[str, str] | None:
    """Why replay's input or outputs cannot be used, checked before the replay: (what, to
    do), or None."""
    problem = None if args.events == "-" else unreadable_input(Path(args.events))
    if problem:
        return problem, "check the path"
    for flag, value in (("--out", args.out), ("--states", args.states)):
        problem = None if value in (None, "-") else writable_output(Path(value), flag)
        if problem:
            return problem, "create it first, or write elsewhere"
    if args.memory < 1:
        return f"--memory {args.memory}: give at least 1 MiB", "give a larger --memory"
    if args.spill_dir is not None and not Path(args.spill_dir).is_dir():
        return f"--spill-dir {args.spill_dir} is not a directory", "create it first"
    return None


_TOPICS: Final = {PREDICTIONS_ROLE: PREDICTIONS, EPISODES_ROLE: EPISODES, DLQ_ROLE: DLQ}


_CHUNK_LINES: Final = 256
"""Lines of a file read and decoded before they are applied, as one chunk."""


class _ProgressOf:
    """`progress` advanced by how far into `handle` the reading is, once per chunk: `tell`
    (a system call) and the clock read for every line were work no line needs."""

    def __init__(self, handle: BinaryIO, progress: Progress) -> None:
        self.handle, self.progress = handle, progress
        self.seekable = handle.seekable()

    def advance(self, lines: int) -> None:
        self.progress.advance(self.handle.tell() if self.seekable else 0, lines)


def _feed(run: OfflineRun, lines: Iterable[Line], out: TextIO, progress: _ProgressOf) -> None:
    """Apply every line and write the outputs, a chunk of lines at a time from a file.

    Decoding a chunk of lines and then applying them takes about 3 µs a line less CPU than
    decoding and applying each line in turn (measured on the realistic stream: each loop
    keeps its own code and data warm in the CPU's caches). Decoding a line depends on its
    bytes alone, so the outputs are the same, in the same order. A pipe (`-`) is read a line
    at a time: its lines may come slowly, and each line's outputs are due as it comes.
    """
    chunk = _CHUNK_LINES if progress.seekable else 1
    lines = iter(lines)
    while read := list(islice(lines, chunk)):
        _write(out, run.feed_lines(read))
        progress.advance(len(read))


def _write(out: TextIO, outputs: list[Output]) -> None:
    """Each output as a JSON line with its topic (as `oracular tail` shows live outputs)."""
    if outputs:
        out.write("".join([jsonl_line(o.message, _TOPICS[o.role]) + "\n" for o in outputs]))


def run_tune(args: argparse.Namespace) -> int:
    """`oracular tune`: suggested weights from history."""
    GcPolicy.tune()  # the engine allocates as in the worker: the same collector schedule
    from engine.tune import format_report, report_to_dict, tune

    config = load_config(args.config)
    events = _sorted_events(args, config)
    if events is None:
        return EXIT_USAGE
    reports = tune(
        config, events, min_episodes=args.min_episodes, prior_strength=args.prior_strength
    )
    if args.json:
        print(json.dumps([report_to_dict(r) for r in reports], indent=2))
    else:
        print("\n\n".join(format_report(r) for r in reports))
    if args.evaluate:
        from engine.tune import compare, format_comparison

        print()
        print(format_comparison(compare(config, events, reports)))
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """`oracular evaluate`: score a replay's predictions."""
    GcPolicy.tune()  # the engine allocates as in the worker: the same collector schedule
    import dataclasses

    from engine.evaluate import evaluate, format_scores

    config = load_config(args.config)
    if args.plot:
        plot_problem = _plot_problem(Path(args.plot))
        if plot_problem:
            return fail("evaluate", *plot_problem)
    events = _sorted_events(args, config)
    if events is None:
        return EXIT_USAGE
    result = evaluate(config, events)
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in result.scores], indent=2))
    else:
        print(format_scores(result))
    if args.plot:
        from streams.cli.plots import plot_evaluation

        plot_evaluation(result, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def _plot_problem(path: Path) -> tuple[str, str] | None:
    """Why `evaluate --plot PATH` cannot be drawn (no matplotlib, a missing directory, a
    format matplotlib does not write), checked before the evaluation runs; (what, to do)."""
    try:
        from streams.cli.plots import supported_formats

        formats = supported_formats()
    except ImportError:
        return "--plot needs matplotlib", "pip install 'oracular-streams[plot]'"
    problem = writable_output(path, "--plot")
    if problem:
        return problem, "create it first, or plot elsewhere"
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in formats:
        shown = ", ".join(f".{f}" for f in sorted(formats))
        return f"--plot {path}: cannot draw a {suffix or 'suffix-less'} file", f"use {shown}"
    return None


def run_check_config(args: argparse.Namespace) -> int:
    """Validate a config; print its intents or every problem."""
    config = load_config(args.config)
    for name, intent in config.intents.items():
        outcome = intent.outcome or "(none: never learns)"
        print(f"{name}: {len(intent.signals)} signals, outcome {outcome}")
    print(f"{args.config}: OK")
    return 0
