"""`python -m bench.dedupe`: what remembering event ids costs (issue 31), offline.

1. CPU: `streams.tools.replay.replay_outputs` (the worker's own Processor over a dict table) of
   EVENTS synthetic events (`bench/synthetic.py` clickstream, seed 7, every event with a unique
   id) under `examples/oracular.yaml`, with deduplication on (the default `dedupeWindow`, 24h)
   and off (`dedupeWindow: 0`), in alternating pairs; process CPU time per run (the other
   core's load moves wall time far more than CPU time), events/s medians and their ratio.
2. Bytes: the sample clickstream (`examples/clickstream.jsonl`) replayed both ways: each user's
   stored value, with and without the remembered ids, and how many ids a user holds.

The figures go to stdout as a markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

from bench.synthetic import clickstream
from engine import EngineConfig
from schemas.config import load_config
from schemas.files import file_format, read_lines
from schemas.stored import decode_stored
from streams.tools.replay import OfflineRun, replay_outputs

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "oracular.yaml"
SAMPLE = ROOT / "examples" / "clickstream.jsonl"


def cpu_rate(config: EngineConfig, events: list) -> float:
    """Events per second of CPU time for one offline replay."""
    started = time.process_time()
    replay_outputs(config, events)
    return len(events) / (time.process_time() - started)


def stored_sizes(config: EngineConfig) -> dict[str, bytes]:
    """Each user's stored value after replaying the sample."""
    run = OfflineRun(config)
    with SAMPLE.open("rb") as handle:
        for line in read_lines(handle, file_format(SAMPLE), None):
            run.feed_line(line)
    run.finish()
    return run.stored()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    on = load_config(CONFIG)
    off = dataclasses.replace(on, dedupe_window_ms=0)
    events = list(clickstream(on, args.events, args.events // 10, 7))
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for pair in range(args.pairs):
        order = (("on", on), ("off", off)) if pair % 2 == 0 else (("off", off), ("on", on))
        for name, config in order:
            rates[name].append(cpu_rate(config, events))
    median = {name: statistics.median(values) for name, values in rates.items()}
    with_ids, without = stored_sizes(on), stored_sizes(off)
    extra = [len(with_ids[u]) - len(without[u]) for u in with_ids]
    held = [len(decode_stored(v, on).recent) for v in with_ids.values()]
    print(
        f"### Deduplication by id (`python -m bench.dedupe`, {time.strftime('%Y-%m-%d %H:%M')} UTC)"
    )
    print()
    print(f"Replay of {args.events:,} synthetic events, {args.pairs} alternating pairs, CPU time:")
    print()
    print("| dedupe | events/s per run | median |")
    print("|---|---|---:|")
    for name in ("on", "off"):
        runs = ", ".join(f"{r:,.0f}" for r in rates[name])
        print(f"| {name} | {runs} | {median[name]:,.0f} |")
    print()
    print(f"Ratio on / off: {median['on'] / median['off']:.3f}.")
    print()
    mean_with = statistics.mean(map(len, with_ids.values()))
    mean_without = statistics.mean(map(len, without.values()))
    print(
        f"The sample ({len(with_ids)} users): stored value {mean_with:.0f} bytes on average "
        f"with the ids, {mean_without:.0f} without; the ids cost {statistics.mean(extra):.1f} "
        f"bytes per user on average (max {max(extra)}), {statistics.mean(held):.1f} ids held "
        f"on average (max {max(held)}): 16 bytes an id and 4 bytes of headers."
    )


if __name__ == "__main__":
    main()
