"""`python -m bench.loadgen`: a bounded-rate producer of live events, for the latency benchmark.

Sends the synthetic clickstream's events (bench/synthetic.py: their users, kinds and names) at a
steady `--rate` for `--seconds` (so at most rate x seconds events), each stamped with the
current time as its event time and a unique id `<id prefix><n>`, keyed by user (murmur2) in
msgpack, as `oracular produce` sends them. The wall-clock time just before each send is its
produce time; all of them are written to `--out` as a msgpack map `"<user>:<id>" -> seconds`
(the id a prediction for that event carries), for the bench process to match with arrivals.

Its own process, so the bench process that timestamps the arrivals does not share its loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import msgpack
from aiokafka import AIOKafkaProducer

from bench.synthetic import clickstream
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
) -> tuple[dict[str, float], float]:
    """Send at `rate` events/s for `seconds`; return produce times by prediction id, and the
    achieved rate."""
    config = load_config(config_path)
    total = int(rate * seconds)
    stream = clickstream(config, total, users, seed=seed)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    sent: dict[str, float] = {}
    try:
        started = time.monotonic()
        n = 0
        while n < total:
            due = min(total, int((time.monotonic() - started) * rate) + 1)
            while n < due:
                event = stream[n]
                event_id = f"{id_prefix}{n}"
                now = time.time()
                message: dict[str, object] = {
                    "user": event.user,
                    "ts": int(now * 1000),
                    "type": event.type,
                    "id": event_id,
                }
                if event.name is not None:
                    message["name"] = event.name
                if event.intent is not None:
                    message["intent"] = event.intent
                sent[f"{event.user}:{event_id}"] = now
                await producer.send(topic, msgpack.packb(message), key=event.user.encode())
                n += 1
            await asyncio.sleep(TICK_S)
        elapsed = time.monotonic() - started
        await producer.flush()
    finally:
        await producer.stop()
    return sent, total / elapsed if elapsed else 0.0


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
        )
    )
    args.out.write_bytes(msgpack.packb(sent))
    print(json.dumps({"sent": len(sent), "achieved_rate": achieved}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
