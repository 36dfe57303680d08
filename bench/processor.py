"""`python -m bench.processor`: the worker's per-event CPU without Kafka, Faust or RocksDB.

The throughput case's input (100,000 `clickstream` events of 10,000 users, encoded as the bench
produces them) goes through `Processor.run_batch` in batches of 500 over an in-memory table,
with the state cache on and every changed state encoded, as the worker does per batch, and
under the worker's memory policy (`GcPolicy`: its collector threshold, a freeze per second;
without it the collector's walks over the cached states land on whatever allocates). Prints
microseconds per event (median of `--runs`). Use it to compare engine or processor variants
without the noise of a broker on the same two cores; `--profile` prints cProfile's top
functions instead.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import zlib
from pathlib import Path
from typing import Any

from schemas.config import load_config
from schemas.events import encode_event
from streams.runtime.memory import GcPolicy
from streams.runtime.processor import InMessage, Processor, Table

from .synthetic import clickstream

CONFIG = Path("examples/oracular.yaml")
PARTITIONS = 8
BATCH = 500


class _DictTable(Table):
    def __init__(self) -> None:
        self.values: dict[Any, bytes] = {}

    def get(self, key: bytes, partition: int) -> bytes | None:
        return self.values.get((partition, key))

    def set(self, key: bytes, value: bytes | None, partition: int) -> None:
        if value is None:
            self.values.pop((partition, key), None)
        else:
            self.values[partition, key] = value

    def set_all(self, writes: list[tuple[bytes, bytes | None, int]]) -> None:
        for key, value, partition in writes:
            self.set(key, value, partition)


def messages(events: int, users: int) -> list[InMessage]:
    """The input as the worker's partitions would hold it, in produce order."""
    config = load_config(CONFIG)
    now = int(time.time() * 1000)
    offsets = [0] * PARTITIONS
    out = []
    for event in clickstream(config, events, users):
        key = event.user.encode()
        partition = zlib.crc32(key) % PARTITIONS
        offset, offsets[partition] = offsets[partition], offsets[partition] + 1
        out.append(InMessage("events", partition, offset, key, encode_event(event), now))
    return out


def run(inputs: list[InMessage]) -> float:
    """Seconds to apply `inputs` batch by batch, states encoded and cached as in the worker."""
    processor = Processor(
        load_config(CONFIG), events_topic="events", ticks_topic="ticks", cache_users=50_000
    )
    table = _DictTable()
    wall = int(time.time() * 1000)
    GcPolicy.tune()
    memory = GcPolicy()
    started = time.perf_counter()
    for start in range(0, len(inputs), BATCH):
        batch = processor.batch(table)
        processor.run_batch(batch, inputs[start : start + BATCH], lambda _: True, lambda: wall)
        processor.stage(batch)  # as the worker does once its outputs are out
        processor.commit(table.set_all)
        memory.tick()  # the worker's is per second; this one checks per batch
    took = time.perf_counter() - started
    if processor.counts["applied"] != len(inputs):  # measuring dead letters would be no use
        msg = f"only {processor.counts['applied']} of {len(inputs)} inputs applied"
        raise SystemExit(msg)
    return took


def main() -> None:
    """Print µs per event (median of the runs), or a profile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one run instead")
    args = parser.parse_args()
    inputs = messages(args.events, args.users)
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(run, inputs)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    runs = [run(inputs) * 1e6 / len(inputs) for _ in range(args.runs)]
    print(
        f"processor: {statistics.median(runs):.1f} µs per event "
        f"(runs {', '.join(f'{r:.1f}' for r in runs)}; {len(inputs):,} events, "
        f"{args.users:,} users, batches of {BATCH})"
    )


if __name__ == "__main__":
    main()
