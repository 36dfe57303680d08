"""`python -m bench.passthrough`: the limit the worker is compared with.

A raw aiokafka consumer reads the source topic from the beginning (no consumer group, every
partition), decodes each value in its format (JSON if it starts with `{`, as a Segment message
of the realistic stream does, else msgpack: the worker's own rule), encodes it again in that
format (`reencode`), and sends it keyed as it came to
the destination topic with an aiokafka producer (acks=all, like the worker's). Nothing else: no
Faust, no state, no engine. It exits after `--count` messages (flushed), or after `--idle-exit`
seconds without input, and prints one JSON line with what it did (messages, seconds from the
first input to the flush, and its CPU time over that as a share of one core).

It runs as its own process, like the worker, so the bench process that times the outputs does
not share its event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


def reencode(value: bytes) -> bytes:
    """The value decoded and encoded again in its own format (JSON or msgpack)."""
    if value[:1] == b"{":
        return json.dumps(json.loads(value), separators=(",", ":")).encode()
    packed: bytes = msgpack.packb(msgpack.unpackb(value, raw=False))
    return packed


BATCH_MAX = 500  # the worker's ORACULAR_BATCH_MAX default, as getmany's max_records
START_WAIT_S = 120.0  # longest wait for the first input message


@contextlib.asynccontextmanager
async def clients(
    bootstrap: str, source: str
) -> AsyncIterator[tuple[AIOKafkaConsumer, AIOKafkaProducer]]:
    """A consumer of every partition of `source` from the start (no group, no commits) and
    an acks=all producer, started, and stopped on the way out."""
    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    try:
        yield consumer, producer
    finally:
        await producer.stop()
        await consumer.stop()


async def passthrough(
    bootstrap: str, source: str, dest: str, count: int | None, idle_exit_s: float
) -> dict[str, float | int]:
    """Forward `source` to `dest` through msgpack decode/encode; return counts and timings."""
    forwarded = 0
    started = time.monotonic()
    first: float | None = None
    cpu_first = 0.0
    last_input: float | None = None
    async with clients(bootstrap, source) as (consumer, producer):
        while count is None or forwarded < count:
            batches = await consumer.getmany(timeout_ms=200, max_records=BATCH_MAX)
            now = time.monotonic()
            if not batches:
                if now - (last_input or started) > (idle_exit_s if last_input else START_WAIT_S):
                    break
                continue
            if first is None:
                first, cpu_first = now, time.process_time()
            last_input = now
            for records in batches.values():
                for record in records:
                    await producer.send(dest, reencode(record.value), key=record.key)
                    forwarded += 1
        await producer.flush()
        done, cpu_done = time.monotonic(), time.process_time()
    elapsed = done - first if first is not None else 0.0
    cpu = cpu_done - cpu_first if first is not None else 0.0
    return {
        "forwarded": forwarded,
        "seconds": elapsed,
        "cpu_share": cpu / elapsed if elapsed else 0,
    }


def main() -> int:
    """Parse the flags, forward, print the result as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.passthrough", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--count", type=int, help="stop after this many messages")
    parser.add_argument("--idle-exit", type=float, default=10.0, help="seconds without input")
    args = parser.parse_args()
    result = asyncio.run(
        passthrough(args.bootstrap, args.source, args.dest, args.count, args.idle_exit)
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
