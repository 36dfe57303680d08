"""`python -m bench.loadgen`: a bounded-rate producer of live events, for the latency benchmark.

Sends the synthetic clickstream's events (bench/synthetic.py: their users, kinds and names) at a
steady `--rate` for `--seconds` (so at most rate x seconds events), each stamped with the
current time as its event time and a unique id `<id prefix><n>`, keyed by user (murmur2) in
msgpack, as `oracular produce` sends them. Every `TICK_S` it sends what is due, one record
batch per partition; the wall-clock time taken just before those batches are built is their
events' produce time (and event time). All produce times are written to `--out` as a msgpack
map `"<user>:<id>" -> seconds` (the id a prediction for that event carries), for the bench
process to match with arrivals.

The records are encoded before the clock starts, but for their time, which is written into
them as they are sent: the generator shares the two cores with the broker and the worker it
measures, and a send per event (aiokafka's `send`: a pure-Python murmur2 and a future per
record) cost it a quarter of a core at 8,000 events/s.

With `--stream realistic` it sends the realistic stream's Segment JSON messages instead
(bench/realistic.py, in their order, `identify` calls included), each message's `timestamp`
and `sentAt` written as the ISO time of sending and its `messageId` replaced by the unique id
(the worker then takes the event time as sent: Segment's skew correction moves it by the
record time minus `sentAt`, a few milliseconds).

Its own process, so the bench process that timestamps the arrivals does not share its loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from bench.realistic import iso_time, realistic_stream
from bench.synthetic import clickstream
from engine import Event
from schemas.config import load_config

TICK_S = 0.002  # the sending loop wakes this often and sends what is due


async def generate(
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    seconds: float,
    users: int,
    seed: int,
    id_prefix: str,
    config_path: Path,
    stream: str = "synthetic",
) -> tuple[dict[str, float], float]:
    """Send at `rate` events/s for `seconds`; return produce times by prediction id, and the
    achieved rate."""
    config = load_config(config_path)
    total = int(rate * seconds)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    sent: dict[str, float] = {}
    try:
        partitions = sorted(await producer.partitions_for(topic))
        if stream == "realistic":
            generated = realistic_stream(config, total, users, seed=seed).messages[:total]
            messages = [
                _prepared_segment(raw, f"{id_prefix}{n}", partitions)
                for n, raw in enumerate(generated)
            ]
            total = len(messages)
        else:
            messages = [
                _prepared(event, f"{id_prefix}{n}", partitions)
                for n, event in enumerate(clickstream(config, total, users, seed=seed))
            ]
        started = time.monotonic()
        n = 0
        while n < total:
            due = min(total, int((time.monotonic() - started) * rate) + 1)
            now = time.time()
            if stream == "realistic":
                stamp = iso_time(int(now * 1000)).encode()
            else:
                stamp = _UINT64.pack(0xCF, int(now * 1000))  # the event time, as msgpack writes
            batches: dict[int, Any] = {}
            while n < due:
                message = messages[n]
                value = stamp.join(message.parts)
                batch = batches.get(message.partition)
                if (
                    batch is None
                    or batch.append(key=message.key, value=value, timestamp=None) is None
                ):
                    if batch is not None:  # full: off it goes, and a new one for the rest
                        await producer.send_batch(batch, topic, partition=message.partition)
                    batch = batches[message.partition] = producer.create_batch()
                    batch.append(key=message.key, value=value, timestamp=None)
                sent[message.sent_key] = now
                n += 1
            for partition, batch in batches.items():
                await producer.send_batch(batch, topic, partition=partition)
            await asyncio.sleep(TICK_S)
        elapsed = time.monotonic() - started
        await producer.flush()
    finally:
        await producer.stop()
    return sent, total / elapsed if elapsed else 0.0


class _Prepared(NamedTuple):
    """One event, encoded ahead of the run but for its event time."""

    partition: int
    key: bytes
    parts: tuple[bytes, ...]
    """The encoded message cut where its time goes (msgpack: around the "ts" value; Segment
    JSON: around the `timestamp` and `sentAt` strings' contents)."""
    sent_key: str
    """`<user>:<id>`: the produce time's key in `--out`."""


_UINT64 = struct.Struct(">BQ")
_STAMP_MARK = 0x7FFF_FFFF_FFFF_FFFF  # a "ts" that msgpack writes as a uint64, as it does real ones


def _prepared(event: Event, event_id: str, partitions: list[int]) -> _Prepared:
    """The event's record, but for its time, which is stamped when it is sent; partitioned by
    its user as a keyed send is (murmur2)."""
    message: dict[str, object] = {
        "user": event.user,
        "ts": _STAMP_MARK,
        "type": event.type,
        "id": event_id,
    }
    if event.name is not None:
        message["name"] = event.name
    if event.intent is not None:
        message["intent"] = event.intent
    head, tail = msgpack.packb(message).split(_UINT64.pack(0xCF, _STAMP_MARK))
    key = event.user.encode()
    partition = DefaultPartitioner()(key, partitions, partitions)
    return _Prepared(partition, key, (head, tail), f"{event.user}:{event_id}")


_ISO_MARK = "\u0000stamp\u0000"  # JSON escapes it: no message text can contain it


def _prepared_segment(raw: bytes, event_id: str, partitions: list[int]) -> _Prepared:
    """A Segment message's record, but for its `timestamp` and `sentAt` (stamped when it is
    sent), its `messageId` the given id; keyed by its user."""
    message = json.loads(raw)
    message["timestamp"] = message["sentAt"] = _ISO_MARK
    message["messageId"] = event_id
    text = json.dumps(message, separators=(",", ":")).encode()
    parts = tuple(text.split(json.dumps(_ISO_MARK).encode()[1:-1]))
    user = message.get("userId") or message.get("anonymousId")
    key = user.encode()
    partition = DefaultPartitioner()(key, partitions, partitions)
    return _Prepared(partition, key, parts, f"{user}:{event_id}")


def main() -> int:
    """Parse the flags, send, write the produce times, print a JSON summary."""
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, required=True, help="events per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--id-prefix", default="L")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="produce times (msgpack)")
    parser.add_argument("--stream", choices=("synthetic", "realistic"), default="synthetic")
    args = parser.parse_args()
    sent, achieved = asyncio.run(
        generate(
            args.bootstrap,
            args.topic,
            rate=args.rate,
            seconds=args.seconds,
            users=args.users,
            seed=args.seed,
            id_prefix=args.id_prefix,
            config_path=args.config,
            stream=args.stream,
        )
    )
    args.out.write_bytes(msgpack.packb(sent))
    print(json.dumps({"sent": len(sent), "achieved_rate": achieved}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
