"""`python -m bench`: measure, print a table, and record it in BENCHMARKS.md.

Every figure is the median of several runs; each throughput also gets its ratio to a trivial
baseline loop over the same events measured in the same run, because these machines are shared
and noisy: the ratio moves less than the absolute number.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import msgpack

from bench.synthetic import clickstream, sessions_for
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
BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- bench:engine:begin -->", "<!-- bench:engine:end -->"


def _baseline(config: EngineConfig, events: list[Event]) -> None:
    states: dict[str, tuple[str | None, int]] = {}
    for event in events:
        states.get(event.user)
        states[event.user] = (event.name, event.at)


def _observe(config: EngineConfig, events: list[Event]) -> None:
    fresh = create_state(config)
    states = {}
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


def _record(section: str) -> None:
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    BENCHMARKS.write_text(text)


def main() -> int:
    """Parse flags, run, print and record."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--engine-only", action="store_true", help="only the engine benchmarks (no broker needed)"
    )
    parser.add_argument("--no-record", action="store_true", help="print only; leave BENCHMARKS.md")
    args = parser.parse_args()
    section = run(args.events, args.users, args.runs)
    print(section)
    if not args.no_record:
        _record(section)
        print(f"recorded in {BENCHMARKS.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
