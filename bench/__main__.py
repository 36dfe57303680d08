"""`python -m bench`: measure, print a table, and record it in BENCHMARKS.md.

Three parts, each recorded in its own section between its own markers:
1. the engine alone (no broker): `--engine-only`;
2. offline on the realistic stream (bench/offline.py, no broker): `oracular replay` against
   the engine alone on the same Segment JSON events (`bench/realistic.py`), and the stored
   state's decode and encode per user; run with the engine part (`--engine-only` included);
3. end to end (bench/e2e.py): the real worker against a local broker the bench starts and
   stops itself: throughput against a raw aiokafka passthrough, with two worker processes
   (`--processes`) and against peers (an idiomatic Faust agent and Quix Streams, bench/peers,
   `--peers`) and `oracular backfill`, latency at half that load, restore from the changelog,
   state size and memory; on the synthetic and the realistic stream (`--stream`), each
   stream's figures also as ratios to the passthrough and to Quix Streams of the same run.
   `--e2e-only`.

Every figure is the median of several runs; each also gets a baseline measured in the same
run (a trivial loop, the passthrough, an empty changelog), because these machines are shared
and noisy: the ratio moves less than the absolute number.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack

from bench.inputs import STREAMS, selected
from bench.report import BENCHMARKS, record
from bench.synthetic import clickstream, sessions_for
from bench.workers import add_worker_env_option
from engine import (
    EngineConfig,
    Event,
    Replayer,
    apply_event,
    create_state,
    end_episode,
    mark_revealed,
    observe,
    serialize,
    state_from_record,
    state_to_record,
)
from schemas.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "oracular.yaml"
BEGIN, END = "<!-- bench:engine:begin -->", "<!-- bench:engine:end -->"


def _baseline(config: EngineConfig, events: list[Event]) -> None:
    states: dict[str, tuple[str | None, int]] = {}
    for event in events:
        states.get(event.user)
        states[event.user] = (event.name, event.at)


def _observe(config: EngineConfig, events: list[Event]) -> None:
    fresh = create_state(config)
    states: dict[str, Any] = {}
    for event in events:
        state = states.get(event.user, fresh)
        if event.type == "end":
            state = end_episode(state, event.at)
        elif event.type == "revealed":
            state = mark_revealed(state, event.intent or "", event.at)
        else:
            state = observe(state, event.name or "", event.at)
        states[event.user] = state


def _apply(config: EngineConfig, events: list[Event]) -> None:
    replayer = Replayer(config)
    for event in events:
        replayer.feed(event)


def _apply_with_store(config: EngineConfig, events: list[Event]) -> None:
    """What a worker does per event: load the stored bytes, apply, store the bytes again."""
    fresh = msgpack.packb(state_to_record(create_state(config), include_config=False))
    store: dict[str, bytes] = {}
    for event in events:
        state = state_from_record(msgpack.unpackb(store.get(event.user, fresh)), config=config)
        step = apply_event(state, event)
        store[event.user] = msgpack.packb(state_to_record(step.state, include_config=False))


CASES: list[tuple[str, str, Callable[[EngineConfig, list[Event]], None]]] = [
    ("baseline", "dict update per event (machine speed)", _baseline),
    ("observe", "observe / end_episode per event", _observe),
    ("apply", "apply_event: observe + changed predictions", _apply),
    ("apply+store", "apply_event + state msgpack load/store", _apply_with_store),
]


def _time(
    fn: Callable[[EngineConfig, list[Event]], None],
    config: EngineConfig,
    events: list[Event],
    runs: int,
) -> float:
    """Median events/s over `runs` runs."""
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        fn(config, events)
        rates.append(len(events) / (time.perf_counter() - started))
    return statistics.median(rates)


def _state_sizes(config: EngineConfig, users: int, episodes: int) -> tuple[int, int, int]:
    """(median compact bytes, max compact bytes, median bytes with the config embedded)."""
    compact, full = [], []
    for n in range(users):
        replayer = Replayer(config)
        for event in sessions_for(config, f"user-{n:05d}", episodes, seed=n):
            replayer.feed(event)
        state = replayer.states[f"user-{n:05d}"]
        compact.append(len(serialize(state, include_config=False)))
        full.append(len(serialize(state)))
    return int(statistics.median(compact)), max(compact), int(statistics.median(full))


def run(events: int, users: int, runs: int) -> str:
    """Run the engine benchmarks and return the Markdown section."""
    config = load_config(CONFIG)
    stream = clickstream(config, events, users)
    rows = []
    base = 0.0
    for name, what, fn in CASES:
        rate = _time(fn, config, stream, runs)
        base = base or rate
        rows.append(f"| {name} | {what} | {rate:,.0f} | {rate / base:.3f} |")
        print(rows[-1], flush=True)
    median, largest, with_config = _state_sizes(config, users=50, episodes=100)
    signals = sum(len(i.signals) for i in config.intents.values())
    lines = [
        BEGIN,
        f"### Engine (`make bench`, {datetime.now(tz=UTC):%Y-%m-%d})",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {_cpu_model()}, "
        f"Python {platform.python_version()}, one core (single-threaded loop).",
        f"Data: {events:,} synthetic events over {users:,} users (`bench/synthetic.py`, seed 7), "
        f"config `examples/oracular.yaml` ({len(config.intents)} intents, {signals} signals); "
        f"median of {runs} runs. Command: `python -m bench --engine-only`.",
        "",
        "| case | what | events/s | ratio to baseline |",
        "|---|---|---:|---:|",
        *rows,
        "",
        f"Serialized state after 100 episodes (50 users): median {median:,} bytes, max "
        f"{largest:,} bytes without the config (what the stream processor stores); median "
        f"{with_config:,} bytes with the config embedded (`serialize(state)`'s default).",
        END,
    ]
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _wait_quiet(limit_s: float) -> str:
    """Wait (polling, at most `limit_s`) until no pytest runs; say what the load was."""
    from bench.machine import pytest_processes  # noqa: PLC0415

    deadline = time.monotonic() + limit_s
    waited = time.monotonic()
    running = pytest_processes()
    while running and time.monotonic() < deadline:
        print(f"[bench] waiting for {len(running)} pytest process(es) to finish", file=sys.stderr)
        time.sleep(10)
        running = pytest_processes()
    waited = time.monotonic() - waited
    state = (
        f"{len(running)} pytest processes still running (waited {waited:.0f} s)"
        if running
        else "no test runs (pytest) on the machine"
        + (f" after waiting {waited:.0f} s for them" if waited >= 1 else "")
    )
    return f"At the start: {state}; load average {os.getloadavg()[0]:.2f}."


def _e2e(args: argparse.Namespace, command: str) -> None:
    from bench import e2e, report  # noqa: PLC0415 - Faust-side modules; not for --engine-only

    params = e2e.Params(
        events=args.e2e_events,
        users=args.e2e_users,
        runs=args.e2e_runs,
        latency_runs=args.latency_runs,
        latency_seconds=args.latency_seconds,
        latency_rate=args.latency_rate,
        recovery_users=args.recovery_users,
        recovery_runs=args.recovery_runs,
        phases=tuple(args.phases.split(",")),
        peers=tuple(peer for peer in args.peers.split(",") if peer and peer != "none"),
        processes=args.processes,
        keep=args.keep,
        worker_env=dict(args.worker_env),
        worker_root=(args.worker_root or ROOT).resolve(),
        streams=args.stream,
        backfill=not args.no_backfill,
    )
    quiet = _wait_quiet(args.wait_quiet)
    print(f"[bench] {quiet}", file=sys.stderr)
    began = time.monotonic()
    every = e2e.run(params)
    took = time.monotonic() - began
    for results in every:
        results.notes.insert(0, quiet)
        results.notes.append(
            f"The whole end-to-end part ({', '.join(params.streams)}) took {took / 60:.1f} min."
        )
        section = report.section(results, command)
        print(f"== {results.stream} stream")
        report.print_table(results)
        print(section)
        if not args.no_record:
            record(section, *report.markers(results.stream))
            print(f"recorded in {BENCHMARKS.relative_to(ROOT)}", file=sys.stderr)


def _offline(args: argparse.Namespace, command: str) -> None:
    from bench import offline  # noqa: PLC0415 - imports the Faust-side shell

    figures = offline.measure(args.realistic_events, args.realistic_users, args.realistic_runs)
    when = f"{datetime.now(tz=UTC):%Y-%m-%d %H:%M} UTC"
    section = offline.section(figures, args.realistic_runs, when, command)
    print(section)
    if not args.no_record:
        record(section, offline.BEGIN, offline.END)
        print(f"recorded in {BENCHMARKS.relative_to(ROOT)}", file=sys.stderr)


def _streams(text: str) -> tuple[str, ...]:
    try:
        return selected(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main() -> int:
    """Parse flags, run, print and record."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=100_000, help="engine: events")
    parser.add_argument("--users", type=int, default=1_000, help="engine: users")
    parser.add_argument("--runs", type=int, default=5, help="engine: runs per case")
    parser.add_argument(
        "--realistic-events", type=int, default=50_000, help="offline: realistic stream events"
    )
    parser.add_argument("--realistic-users", type=int, default=1_000, help="offline: its users")
    parser.add_argument(
        "--realistic-runs", type=int, default=5, help="offline: runs of replay and engine"
    )
    part = parser.add_mutually_exclusive_group()
    part.add_argument(
        "--engine-only", action="store_true", help="only the engine benchmarks (no broker needed)"
    )
    part.add_argument("--e2e-only", action="store_true", help="only the end-to-end benchmarks")
    e2e = parser.add_argument_group("end to end")
    e2e.add_argument(
        "--stream",
        type=_streams,
        default=STREAMS,
        metavar="NAME",
        help="the input streams of the throughput and latency phases (bench/inputs.py): "
        "synthetic, realistic, or both (default; recovery runs once, on the first)",
    )
    e2e.add_argument(
        "--no-backfill",
        action="store_true",
        help="leave `oracular backfill` out of the throughput phase",
    )
    e2e.add_argument(
        "--e2e-events", type=int, default=100_000, help="preloaded input events (throughput)"
    )
    e2e.add_argument("--e2e-users", type=int, default=10_000, help="their users")
    e2e.add_argument("--e2e-runs", type=int, default=3, help="throughput runs of each kind")
    e2e.add_argument("--latency-runs", type=int, default=3)
    e2e.add_argument("--latency-seconds", type=float, default=20.0, help="offered load per run")
    e2e.add_argument("--latency-rate", type=float, help="events/s (default: half the throughput)")
    e2e.add_argument("--recovery-users", type=int, default=100_000)
    e2e.add_argument("--recovery-runs", type=int, default=3)
    e2e.add_argument(
        "--phases", default="throughput,latency,recovery", help="comma-separated subset"
    )
    e2e.add_argument(
        "--peers",
        default="faust,quix,floor",
        help="peers drained beside the worker in the throughput phase (bench/peers; "
        "comma-separated subset of faust,quix,floor; 'none' for none; Quix Streams is "
        "pip-installed on demand; floor: the passthrough's loop with the product's decoder "
        "and engine)",
    )
    e2e.add_argument(
        "--processes",
        type=int,
        default=2,
        metavar="N",
        help="the throughput phase also runs `oracular worker --processes N` (1: not)",
    )
    add_worker_env_option(
        e2e, "an extra setting for the measured workers (repeatable; noted in the output)"
    )
    e2e.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long until no pytest runs on the machine",
    )
    e2e.add_argument(
        "--worker-root",
        type=Path,
        metavar="DIR",
        help="run the workers from this checkout instead (A/B a change; noted in the output)",
    )
    e2e.add_argument("--keep", action="store_true", help="keep the temp dir (logs, state)")
    parser.add_argument("--no-record", action="store_true", help="print only; leave BENCHMARKS.md")
    args = parser.parse_args()
    command = "python -m bench " + " ".join(sys.argv[1:]) if sys.argv[1:] else "make bench"
    if not args.e2e_only:
        section = run(args.events, args.users, args.runs)
        print(section)
        if not args.no_record:
            record(section, BEGIN, END)
            print(f"recorded in {BENCHMARKS.relative_to(ROOT)}", file=sys.stderr)
        _offline(args, command.strip())
    if not args.engine_only:
        _e2e(args, command.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
