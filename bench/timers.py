"""`python -m bench.timers`: the timer's deadline index after many events over many users.

Feeds a generated clickstream (default 1,000,000 events over 100,000 users) through the
worker's `Processor` with a dict as the table, in batches of 500 with a tick after each batch
(event-time watermark, default lateness), and prints the index's size against the users with
an open episode, the processor's counters and the process's RSS. No broker: the figure is the
index's, which does not depend on Kafka.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
from pathlib import Path

import msgpack

from bench.synthetic import clickstream
from infra.processes import rss_bytes
from schemas.config import load_config
from schemas.ticks import encode_tick
from streams.runtime.processor import Batch, InMessage, Processor
from streams.tools.replay import DictTable

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "oracular.yaml"
EVENTS, TICKS = "oracular.events", "oracular.ticks"
BATCH = 500


def _rss_mib() -> float:
    """This process's resident memory (its peak if /proc does not say)."""
    rss = rss_bytes(os.getpid())
    if rss is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return rss / 2**20


def main(argv: list[str] | None = None) -> int:
    """Run and print the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.timers", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    args = parser.parse_args(argv)
    config = load_config(CONFIG)
    events = clickstream(config, args.events, args.users, seed=11)
    messages = []
    for offset, e in enumerate(events):
        value = {"id": e.id, "user": e.user, "ts": e.at, "type": e.type}
        if e.name is not None:
            value["name"] = e.name
        if e.intent is not None:
            value["intent"] = e.intent
        messages.append(InMessage(EVENTS, 0, offset, e.user.encode(), msgpack.packb(value), None))
    del events
    gc.collect()
    before = _rss_mib()
    table = DictTable()
    processor = Processor(config, events_topic=EVENTS, ticks_topic=TICKS)
    largest = 0
    started = time.perf_counter()
    for start in range(0, len(messages), BATCH):
        batch = Batch(table, config)
        chunk = messages[start : start + BATCH]
        wall = lambda: 4_102_444_800_000  # noqa: E731 - the worker's clock, far past the data
        processor.run_batch(batch, chunk, lambda p: False, wall)
        tick = InMessage(TICKS, 0, 0, None, encode_tick(0), None)
        processor.run_batch(batch, [tick], lambda p: False, wall)
        for key, stored, context in batch.writes():
            table.set(key, stored, context)
        largest = max(largest, processor.index_entries())
    elapsed = time.perf_counter() - started
    del messages
    gc.collect()
    counts = processor.counts
    print(f"events {args.events:,} over {args.users:,} users in {elapsed:.1f} s")
    print(f"users with an open episode (live index entries): {processor.open_episodes():,}")
    print(f"heap entries now / largest seen: {processor.index_entries():,} / {largest:,}")
    print(
        f"episodes closed by the timer: {counts['closed_by_timer']:,}; "
        f"applied {counts['applied']:,}"
    )
    print(
        f"RSS: {_rss_mib():,.0f} MiB (before the run {before:,.0f} MiB, with the input in memory)"
    )
    print(
        f"table: {len(table.values):,} users, "
        f"{sum(map(len, table.values.values())) / 2**20:,.0f} MiB of values"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
