"""`python -m bench.peers.quix_app`: the per-user counter in Quix Streams.

As Quix Streams' documentation teaches: an `Application` (consumer group = the app id, at-least-
once, its RocksDB state store under `--datadir` with changelog topics), a `StreamingDataFrame`
over the input topic that decodes the msgpack value, `update(..., stateful=True)` keeping
`[count, last event time]` per message key (the user) in the state, and `to_topic(...)` sending
one msgpack output per event. The output's timestamp is set to the wall clock when the record is
produced (Quix otherwise carries the input's timestamp over), because the bench times outputs by
their timestamps. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench.peers import count_event, decode


def build(bootstrap: str, source: str, dest: str, app_id: str, datadir: Path) -> Any:
    """The Quix application: source -> decode -> stateful update -> encode -> dest."""
    from quixstreams import Application, State  # noqa: PLC0415 - a bench-only dependency

    app = Application(
        broker_address=bootstrap,
        consumer_group=app_id,
        auto_offset_reset="earliest",
        state_dir=str(datadir),
        processing_guarantee="at-least-once",
        loglevel="INFO",
    )
    events = app.topic(source, key_deserializer="bytes", value_deserializer="bytes")
    outputs = app.topic(dest, key_serializer="bytes", value_serializer="bytes")

    def count(event: dict[str, Any], state: State) -> None:
        new, event["_out"] = count_event(event, state.get("user"))
        state.set("user", new)

    sdf = app.dataframe(events)
    sdf = sdf.apply(decode)
    sdf = sdf.update(count, stateful=True)
    sdf = sdf.apply(lambda event: event["_out"])
    sdf = sdf.set_timestamp(lambda _value, _key, _ts, _headers: time.time_ns() // 1_000_000)
    sdf.to_topic(outputs)
    return app


def main() -> int:
    """Parse the flags and run the application until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.quix_app", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--app-id", required=True)
    parser.add_argument("--datadir", type=Path, required=True)
    args = parser.parse_args()
    build(args.bootstrap, args.source, args.dest, args.app_id, args.datadir).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
