"""`python -m bench.backfill`: `oracular backfill` and `oracular replay` of the same events.

Command (the figures in BENCHMARKS.md): `python -m bench.backfill` (1,000,000 events);
`--events 20000` for a quick look. There is no make target: the Makefile has only `make bench`.

1. A broker on free ports in a temp dir (`infra.broker.start_broker`, as bench/lookup.py), or
   `--broker`; the product topics under a new prefix, 8 partitions (bench/topics.py), the
   input with `retention.ms=-1`: `oracular produce` stamps records with their event times
   (2026-01-01 here), and under the default 7-day retention the broker deleted the whole input
   at its first retention check, 5 minutes after it started, in the middle of the backfill.
2. EVENTS synthetic events over USERS users (bench/synthetic.py `clickstream`, seed 11),
   written as a msgpack stream (one `schemas.events.encode_event` map per event), the format
   `oracular produce` and `oracular replay` both read. `engine.Replayer` fed the same events
   in this process gives the expected counts: events with a changed prediction (one
   prediction message each) and closed episodes (by the events, then by the backfill's final
   watermark).
3. `oracular produce FILE` puts them on the input topic, keyed by user (murmur2), record
   timestamps the event times. The product's producer, not bench/topics.py `preload`: for
   100,000 events (measured once, 2026-12-01) `oracular produce` took 4.9 s from process start
   to exit, `preload` 3.2 s, not enough to leave the product's path. Not in the table.
4. `oracular replay FILE --config examples/oracular.yaml --out OUT.jsonl`: its own rate
   (handled events over read + engine + writing the JSON lines) and the wall time. First, so
   its figures come even if the backfill fails.
5. `oracular backfill --config examples/oracular.yaml` over that topic, a fresh app id and
   datadir: its own rate (handled input messages over the time from after it captured the
   topic's range to the end of the Faust worker, so Faust's start and stop are inside) and the
   bench's wall time (process start to exit). Then the same with `--processes N` (`--processes`,
   default 2; 1 skips it) under another app id, datadir and output suffix: its own rate is the
   parent's (messages over its time from starting the processes to their end), its counts the
   sum of the processes' summaries. A watchdog reads the backfill's
   committed input offsets every POLL_S; when they stay put for `--stall-s` (120 s) it stops
   the backfill with SIGTERM (it then prints its summary, "INTERRUPTED") and reports STALLED.
6. The counts are checked against each other: applied events (backfill summary, replay
   summary, EVENTS), predictions and episodes (backfill summary, records on its output
   topics, replay summary, lines of its output file, `engine.Replayer`). Any mismatch is
   printed as MISMATCH and the exit code is 1.

The table and a markdown section for BENCHMARKS.md are printed (stdout); `--notes PATH` also
writes the section there. Progress goes to stderr; the commands' logs are under the temp dir,
deleted at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.machine import code_version, kafka_version, machine, pytest_processes
from bench.synthetic import clickstream
from bench.topics import create_topics, end_offsets
from bench.workers import CONFIG, PARTITIONS, ROOT, clean_env
from engine import END_OF_TIME, Replayer
from infra.broker import PRODUCTION_GROUP_SETTINGS, start_broker
from infra.processes import LoggedProcess
from schemas.config import load_config
from schemas.events import encode_event
from schemas.outputs import DLQ, EPISODES, PREDICTIONS
from streams.settings import product_topics
from streams.settings.topics import TopicSpec
from streams.tools.admin import ensure_topics_async
from streams.tools.backfill import committed_offsets

SEED = 11
PRODUCE_TIMEOUT_S = 1800.0
RUN_TIMEOUT_S = 3600.0  # backfill or replay of a million events: minutes on 2 busy cores
KEEP_INPUT = {"retention.ms": "-1"}
"""The input topic's configs on top of the product's (see `measure`)."""
POLL_S = 10.0
"""How often the backfill's committed input offsets are read (the stall watchdog)."""

BACKFILL_LINE = re.compile(
    r"^backfill (\S+) (complete|INTERRUPTED before the end): (.*) in ([\d.]+) s "
    r"\(([\d,]+) messages/s\)$",
    re.MULTILINE,
)
PART_LINE = re.compile(
    r"^backfill (\S+) complete \(one process of several\): (.*) in ([\d.]+) s "
    r"\(([\d,]+) messages/s\)$",
    re.MULTILINE,
)
PARALLEL_LINE = re.compile(
    r"^backfill (\S+) (complete|FAILED[^:]*): ([\d,]+) messages in (\d+) processes in "
    r"([\d.]+) s \(([\d,]+) messages/s\)$",
    re.MULTILINE,
)
WATERMARK_LINE = re.compile(r"^backfill final watermark: (\d+) \.\. (\d+)", re.MULTILINE)
REPLAY_LINE = re.compile(
    r"^replay: (.*), users ([\d,]+) in ([\d.]+) s \(([\d,]+) events/s\)$", re.MULTILINE
)
OUT_OF_RANGE = re.compile(r"Fetch offset \d+ is out of range for partition")
PRODUCE_LINE = re.compile(r"^produce: ([\d,]+) events to", re.MULTILINE)


def say(message: str) -> None:
    """Progress on stderr."""
    print(f"[backfill-bench] {message}", file=sys.stderr, flush=True)


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Run:
    """One command's figures."""

    label: str
    command: str
    wall_s: float = 0.0
    own_s: float = 0.0
    own_rate: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    """What the command reports: applied, predictions, episodes, ..."""
    outputs: dict[str, int] = field(default_factory=dict)
    """Output messages counted by the bench: predictions, episodes, dlq."""
    load_before: str = ""
    load_after: str = ""
    note: str = ""
    stalled: str = ""
    """Why the bench stopped the command (it made no progress), or ""."""


def write_events(path: Path, config: Any, events: int, users: int) -> Replayer:
    """Generate the clickstream into `path` (msgpack stream) and feed it to an engine
    `Replayer`, which then holds the expected states; returns it with its counts in
    `replayer.bench_counts`."""
    stream = clickstream(config, events, users, seed=SEED)
    replayer = Replayer(config)
    predictions = closed = 0
    with path.open("wb") as out:
        for event in stream:
            out.write(encode_event(event))
            step = replayer.feed(event)
            predictions += bool(step.predictions)
            closed += step.closed is not None
    replayer.bench_counts = {  # type: ignore[attr-defined]
        "applied": len(stream),
        "predictions": predictions,
        "episodes by events": closed,
        "users": len({e.user for e in stream}),
    }
    return replayer


def cli(name: str, args: list[str], env: dict[str, str], logs: Path) -> LoggedProcess:
    """`python -m streams.cli ARGS` (`oracular ARGS`) from this checkout, not yet started."""
    argv = [sys.executable, "-m", "streams.cli", *args]
    return LoggedProcess(name, argv, env=clean_env(env), log_path=logs / f"{name}.log", cwd=ROOT)


async def timed(process: LoggedProcess, timeout_s: float) -> tuple[int, float, str]:
    """Start `process`, wait for its exit: (exit code, wall seconds, its log)."""
    started = time.monotonic()
    process.start()
    code = await process.wait_exit_async(timeout_s)
    return code, time.monotonic() - started, process.log_text(current_run_only=True)


def pairs(text: str, separator: str) -> dict[str, int]:
    """A summary's counts: "applied=5, late=0" or "applied 5, late 0" -> {"applied": 5, ...}."""
    found = {}
    for part in text.split(", "):
        name, _, value = part.strip().partition(separator)
        found[name.replace("-", "_")] = int(value.replace(",", ""))
    return found


async def produce(path: Path, env: dict[str, str], logs: Path, topic: str, events: int) -> float:
    """`oracular produce` the file; seconds. Fails unless the topic then holds `events`."""
    process = cli("produce", ["produce", str(path)], env, logs)
    code, wall, log = await timed(process, PRODUCE_TIMEOUT_S)
    sent = PRODUCE_LINE.search(log)
    on_topic = await end_offsets(env["ORACULAR_BROKER"], topic)
    if code != 0 or sent is None or on_topic != events:
        process.fail(f"exited {code}; {on_topic:,} records on {topic}, {events:,} expected")
    return wall


async def watch(
    process: LoggedProcess, bootstrap: str, group: str, topic: str, stall_s: float
) -> str:
    """While `process` runs, read its group's committed input offsets every POLL_S; when
    they have not moved for `stall_s`, stop it (SIGTERM: the backfill prints its summary)
    and say where each partition stood."""
    last: dict[int, int] = {}
    moved = time.monotonic()
    while process.running:
        await asyncio.sleep(POLL_S)
        try:
            now = await committed_offsets(bootstrap, group, topic)
        except Exception as exc:  # the group may not exist yet; the broker is busy
            say(f"could not read {group}'s offsets: {exc!r}")
            continue
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_s and process.running:
            total = await end_offsets(bootstrap, topic)
            if sum(last.values()) >= total:
                continue  # all input committed: the backfill waits for its last ticks
            where = (
                f"{sum(last.values()):,} of {total:,} committed ("
                + ", ".join(f"p{p} {last[p]:,}" for p in sorted(last))
                + ")"
            )
            say(f"STALLED: no input offset committed for {stall_s:.0f} s, {where}; stopping it")
            await asyncio.to_thread(process.stop)
            return f"no input committed for {stall_s:.0f} s, stopped by the bench at {where}"
    return ""


async def backfill(
    env: dict[str, str], logs: Path, topics: Any, args: argparse.Namespace, processes: int = 1
) -> tuple[Run, int | None]:
    """`oracular backfill [--processes N]`: its figures and its final watermark (the minimum
    over partitions). Stopped, and marked `stalled`, when its committed input offsets stop
    moving."""
    app_id = f"{env['ORACULAR_TOPIC_PREFIX']}-backfill"
    suffix = ""
    args_ = ["backfill", "--config", str(CONFIG)]
    if processes > 1:
        app_id, suffix = f"{app_id}-p{processes}", f".p{processes}"
        env = {**env, "ORACULAR_DATADIR": env["ORACULAR_DATADIR"] + suffix}
        args_ += ["--processes", str(processes), "--output-suffix", suffix]
    args_ += ["--app-id", app_id]
    if args.backfill_loglevel:
        args_ += ["--loglevel", args.backfill_loglevel]
    label = "oracular backfill" + (f" --processes {processes}" if processes > 1 else "")
    run = Run(label, "oracular " + " ".join(args_).replace(str(ROOT) + "/", ""))
    run.load_before = load()
    process = cli(f"backfill{suffix}", args_, env, logs)
    watchdog = None
    try:
        started = time.monotonic()
        process.start()
        bootstrap = env["ORACULAR_BROKER"]
        watchdog = asyncio.create_task(
            watch(process, bootstrap, app_id, topics.events.name, args.stall_s)
        )
        code = await process.wait_exit_async(RUN_TIMEOUT_S)
        run.wall_s = time.monotonic() - started
        run.stalled = await watchdog
    finally:
        if watchdog is not None and not watchdog.done():
            watchdog.cancel()
    log = process.log_text(current_run_only=True)
    run.load_after = load()
    if processes > 1:
        _parallel_figures(run, log, code, logs / f"backfill{suffix}.log")
    else:
        found = BACKFILL_LINE.search(log)
        if found is None or (code != 0 and not run.stalled):
            msg = f"oracular backfill exited {code}; log {logs / 'backfill.log'}:\n{log[-3000:]}"
            raise RuntimeError(msg)
        run.counts = pairs(found.group(3), "=")
        run.own_s, run.own_rate = float(found.group(4)), float(found.group(5).replace(",", ""))
    for role in ("predictions", "episodes", "dlq"):
        run.outputs[role] = await end_offsets(bootstrap, getattr(topics, role).name + suffix)
    if OUT_OF_RANGE.search(log):  # aiokafka logs it at info: seen with --backfill-loglevel info
        run.note = "its fetch offsets went out of range: input deleted under it; "
    marks = WATERMARK_LINE.findall(log)  # one per process
    watermark = None
    if marks:
        low, high = min(int(m[0]) for m in marks), max(int(m[1]) for m in marks)
        watermark = low
        run.note += f"final watermark {low}..{high} epoch ms"
        if low != high:
            run.note += " (per partition: each one's last tick)"
    return run, watermark


def _parallel_figures(run: Run, log: str, code: int, log_path: Path) -> None:
    """A parallel backfill's figures: the parent's rate and time, the processes' counts."""
    found = PARALLEL_LINE.search(log)
    parts = PART_LINE.findall(log)
    if found is None or not parts or (code != 0 and not run.stalled):
        msg = f"oracular backfill exited {code}; log {log_path}:\n{log[-3000:]}"
        raise RuntimeError(msg)
    run.own_s, run.own_rate = float(found.group(5)), float(found.group(6).replace(",", ""))
    counts: dict[str, int] = {}
    for part in parts:
        for name, value in pairs(part[1], "=").items():
            counts[name] = counts.get(name, 0) + value
    run.counts = counts


async def replay(path: Path, env: dict[str, str], logs: Path, out: Path) -> Run:
    """`oracular replay` of the file into a JSONL file: its figures and its output counts."""
    args = ["replay", str(path), "--config", str(CONFIG), "--out", str(out)]
    shown = ["replay", path.name, "--config", "examples/oracular.yaml", "--out", out.name]
    run = Run("oracular replay", "oracular " + " ".join(shown))
    run.load_before = load()
    code, run.wall_s, log = await timed(cli("replay", args, env, logs), RUN_TIMEOUT_S)
    run.load_after = load()
    found = REPLAY_LINE.search(log)
    if code != 0 or found is None:
        msg = f"oracular replay exited {code}; log {logs / 'replay.log'}:\n{log[-3000:]}"
        raise RuntimeError(msg)
    run.counts = pairs(found.group(1), " ")
    run.counts["users"] = int(found.group(2).replace(",", ""))
    run.own_s, run.own_rate = float(found.group(3)), float(found.group(4).replace(",", ""))
    roles = {PREDICTIONS: "predictions", EPISODES: "episodes", DLQ: "dlq"}
    run.outputs = dict.fromkeys(roles.values(), 0)
    with out.open(encoding="utf-8") as lines:
        for line in lines:
            run.outputs[roles[json.loads(line)["topic"]]] += 1
    return run


def compare(expected: dict[str, int], runs: list[Run]) -> list[str]:
    """The mismatches between the expected counts and what each run reported and wrote."""
    problems = []
    for run in runs:
        checks = {
            "applied (reported)": (run.counts.get("applied"), expected["applied"]),
            "dead-lettered (reported)": (run.counts.get("dead_lettered"), 0),
            "predictions (reported)": (run.counts.get("predictions"), expected["predictions"]),
            "predictions (output messages)": (
                run.outputs.get("predictions"),
                expected["predictions"],
            ),
            "episodes (reported)": (run.counts.get("episodes"), expected["episodes"]),
            "episodes (output messages)": (run.outputs.get("episodes"), expected["episodes"]),
            "dead letters (output messages)": (run.outputs.get("dlq"), 0),
        }
        for what, (got, want) in checks.items():
            if got != want:
                problems.append(f"{run.label}: {what} {got}, expected {want}")
    return problems


def section(args: argparse.Namespace, facts: dict[str, Any], runs: list[Run]) -> str:
    """The markdown section for BENCHMARKS.md."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    expected = facts["expected"]
    lines = [
        f"### Backfill and replay of {args.events:,} events (`python -m bench.backfill`, {when})",
        "",
        f"Machine: {machine()}. The broker, the backfill and the bench share these cores; "
        "other engineers' jobs ran on the machine too.",
        f"Load average (1, 5, 15 min): at the start {facts['load_start']}; "
        + "; ".join(f"{r.label} before {r.load_before}, after {r.load_after}" for r in runs)
        + f". Other test runs (pytest) seen at the start: {facts['pytest']}.",
        f"Broker: Kafka {kafka_version()} single node started by the bench "
        "(`infra.broker.start_broker`, free ports, temp dir; Kafka's default 3 s "
        "`group.initial.rebalance.delay.ms`). Code: "
        f"{code_version(ROOT)}.",
        f"Command: `python -m bench.backfill --events {args.events} --users {args.users}`.",
        "",
        "| command | events | wall time, s | own time, s | events/s (own report) "
        "| events/s (wall) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        lines.append(
            f"| `{run.command}`{' (STALLED, stopped)' if run.stalled else ''} "
            f"| {run.counts.get('applied', 0):,} | {run.wall_s:.1f} "
            f"| {run.own_s:.1f} | {run.own_rate:,.0f} | {args.events / run.wall_s:,.0f} |"
        )
    lines += [
        "",
        f"Input: {args.events:,} msgpack events over {expected['users']:,} users "
        f"(`bench/synthetic.py` `clickstream`, seed {SEED}), {facts['file_mb']:.0f} MB, put on "
        f"the input topic ({PARTITIONS} partitions, keyed by user) by `oracular produce` in "
        f"{facts['produce_s']:.1f} s before the backfill started. The `--processes` row has "
        "its own app id, datadir and output topics (suffix); its counts are the sum of its "
        "processes' summaries.",
        f"Outputs: {expected['predictions']:,} predictions and {expected['episodes']:,} "
        "episodes (`engine.Replayer` in the bench, closing by the backfill's final watermark: "
        "the later of a partition's newest event time and the wall clock, minus the lateness; "
        "the synthetic events start on 2026-01-01, so here the wall clock); "
        + "; ".join(
            f"{r.label} reported {r.counts.get('predictions', 0):,} / "
            f"{r.counts.get('episodes', 0):,} and wrote {r.outputs.get('predictions', 0):,} / "
            f"{r.outputs.get('episodes', 0):,}" + (f" ({r.note})" if r.note else "")
            for r in runs
        )
        + ". "
        + (
            "All counts agree."
            if not facts["problems"]
            else "MISMATCH: " + "; ".join(facts["problems"]) + "."
        ),
        "",
        "How it is measured: `bench/backfill.py` (module docstring). Events/s (own report) is "
        "the rate each command prints when it finishes: backfill, handled input messages over "
        "the time from after it captured the topic's range to the end of the Faust worker "
        "(Faust's start, the consumer group join and the shutdown included; with "
        "`--processes`, all messages over the time from starting the processes to their end); "
        "replay, handled "
        "events over reading the file, the engine and writing the JSON lines. Wall time is the "
        "bench's, from starting the process to its exit (the interpreter's start and imports "
        "included); events/s (wall) is events over it. One run each.",
    ]
    return "\n".join(lines) + "\n"


def table(runs: list[Run]) -> str:
    rows = [f"{'command':<20} {'events':>10} {'wall s':>8} {'own s':>8} {'events/s':>10}"]
    rows += [
        f"{r.label:<20} {r.counts.get('applied', 0):>10,} {r.wall_s:>8.1f} {r.own_s:>8.1f} "
        f"{r.own_rate:>10,.0f}" + ("  STALLED, stopped by the bench" if r.stalled else "")
        for r in runs
    ]
    return "\n".join(rows)


async def measure(
    args: argparse.Namespace, bootstrap: str, base: Path, facts: dict[str, Any]
) -> list[Run]:
    """Generate, produce, backfill, replay; the runs (`facts` gets the rest)."""
    logs = base / "logs"
    config = load_config(CONFIG)
    prefix = f"backfillbench-{uuid.uuid4().hex[:6]}"
    env = {
        "ORACULAR_BROKER": bootstrap,
        "ORACULAR_TOPIC_PREFIX": prefix,
        "ORACULAR_PARTITIONS": str(PARTITIONS),
        "ORACULAR_DATADIR": str(base / "state"),
    }
    topics = product_topics(env)
    # The input keeps its records: their timestamps are the event times, months old, and the
    # broker's default retention (7 days) deleted them at its first retention check, 5 min
    # after it started, under a running backfill (which then waited forever).
    kept = TopicSpec(topics.events.name, PARTITIONS, {**topics.events.config, **KEEP_INPUT})
    await ensure_topics_async(bootstrap, [kept])
    await create_topics(bootstrap, [spec.name for spec in topics if spec is not topics.events])

    path = base / "events.msgpack"
    say(f"generating {args.events:,} events of {args.users:,} users into {path}")
    replayer = await asyncio.to_thread(write_events, path, config, args.events, args.users)
    expected = dict(replayer.bench_counts)  # type: ignore[attr-defined]
    facts["file_mb"] = path.stat().st_size / 1e6
    say(f"expected by the engine so far: {expected}")

    say(f"oracular produce to {topics.events.name}")
    facts["produce_s"] = await produce(path, env, logs, topics.events.name, args.events)
    say(f"produced in {facts['produce_s']:.1f} s; load {load()}")

    # Replay first: its figures come even if the backfill then stalls.
    say("oracular replay")
    run_replay = await replay(path, env, logs, base / "replay.jsonl")
    say(f"replay: {run_replay}")

    backfills = []
    for processes in sorted({1, args.processes}):
        say(f"oracular backfill --processes {processes}")
        run_backfill, watermark = await backfill(env, logs, topics, args, processes)
        say(f"backfill: {run_backfill}")
        backfills.append((run_backfill, watermark))
    # Episodes closed by each backfill's final watermark (the later run's is later: the wall
    # clock); the replayer closes them in order, so each run's count is the one before plus.
    problems = []
    closed = 0
    for run_backfill, watermark in backfills:
        until = watermark if watermark is not None else END_OF_TIME
        closed += sum(1 for _ in replayer.close_due(until))
        expected["episodes"] = expected["episodes by events"] + closed
        problems += compare(expected, [run_backfill])
        if run_backfill.stalled:
            problems.insert(0, f"{run_backfill.label} STALLED: {run_backfill.stalled}")
        if run_backfill.note.startswith("its fetch offsets went out of range"):
            problems.insert(0, f"{run_backfill.label}: " + run_backfill.note.rstrip("; "))
    problems += compare(expected, [run_replay])
    # What `oracular replay` without --until closes on top (its default: the end of time).
    later = sum(1 for _ in replayer.close_due(END_OF_TIME))
    del replayer
    runs = [*(run for run, _ in backfills), run_replay]

    if later:
        problems.append(
            f"{later:,} episodes are due only after the backfill's final watermark "
            f"{watermark}: replay (to the end of time) closes them, the backfill does not"
        )
    facts["expected"], facts["problems"] = expected, problems
    return runs


async def main_async(args: argparse.Namespace) -> int:
    base = Path(tempfile.mkdtemp(prefix="oracular-backfill-bench-"))
    facts: dict[str, Any] = {"load_start": load(), "pytest": len(pytest_processes())}
    broker = None
    bootstrap = args.broker
    try:
        if bootstrap is None:
            broker = await asyncio.to_thread(
                functools.partial(
                    start_broker,
                    base / "kafka",
                    port=None,
                    stop_with_parent=True,
                    overrides=PRODUCTION_GROUP_SETTINGS,
                )
            )
            bootstrap = broker.bootstrap
        runs = await measure(args, bootstrap, base, facts)
    finally:
        if broker is not None:
            broker.stop(wipe=True)
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    expected, problems = facts["expected"], facts["problems"]
    print(table(runs))
    for problem in problems:
        print(f"MISMATCH: {problem}")
    if not problems:
        print(
            f"counts agree: {expected['applied']:,} applied, {expected['predictions']:,} "
            f"predictions, {expected['episodes']:,} episodes (engine.Replayer, backfill, replay)"
        )
    text = section(args, facts, runs)
    print("\n" + text)
    if args.notes:
        Path(args.notes).parent.mkdir(parents=True, exist_ok=True)
        Path(args.notes).write_text(text)
        say(f"wrote {args.notes}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.backfill", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--broker", help="use this broker instead of starting one")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--notes", help="also write the markdown section to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    parser.add_argument(
        "--stall-s",
        type=float,
        default=120.0,
        help="stop the backfill when its committed input offsets stay put this long",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="also backfill with --processes N (1: only the one-process backfill)",
    )
    parser.add_argument(
        "--backfill-loglevel", help="pass --loglevel to the backfill (diagnosis; default its own)"
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
