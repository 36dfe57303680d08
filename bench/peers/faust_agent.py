"""`python -m bench.peers.faust_agent`: the per-user counter as an idiomatic Faust agent.

Written as Faust's documentation teaches (an `app.Table` with the RocksDB store, an
`@app.agent` iterating `async for value in stream`, the table updated by key, one
`await topic.send(...)` per output), on the same faust-streaming and aiokafka as the product,
with none of the product's patches or batching. The input values are raw bytes decoded with
msgpack (the product's input format); the table keeps `[count, last event time]` per user with
Faust's default (JSON) codecs and its changelog topic. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import faust

from bench.peers import count_event, decode

PARTITIONS = 8


def build(bootstrap: str, source: str, dest: str, app_id: str, datadir: Path) -> faust.App:
    """The Faust app: source -> agent (table update, one send per event) -> dest."""
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        datadir=str(datadir),
        store="rocksdb://",
        topic_partitions=PARTITIONS,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
    )
    events = app.topic(source, key_type=bytes, value_type=bytes, value_serializer="raw")
    outputs = app.topic(dest, key_type=bytes, value_type=bytes, value_serializer="raw")
    users = app.Table("users", default=None, partitions=PARTITIONS)

    @app.agent(events)
    async def count(stream: faust.StreamT[bytes]) -> None:
        async for value in stream:
            event = decode(value)
            user = event["user"]
            users[user], output = count_event(event, users.get(user))
            await outputs.send(key=user.encode(), value=output)

    return app


def main() -> int:
    """Parse the flags and run the worker until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.faust_agent", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--datadir", type=Path, required=True)
    args = parser.parse_args()
    app = build(args.bootstrap, args.source, args.dest, args.app_id, args.datadir)
    sys.argv = [sys.argv[0]]  # the worker parses the command line itself
    faust.Worker(app, loglevel="info").execute_from_commandline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
