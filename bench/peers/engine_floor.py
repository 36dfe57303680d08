"""`python -m bench.peers.engine_floor`: the engine behind aiokafka, a floor for any worker.

The passthrough's loop (`bench.passthrough`: a raw aiokafka consumer of every partition, one
output per record sent keyed as it came, acks=all), doing per record what any design of the
worker must also do: the product's decoder (`schemas.events.decode_event`, every check of an
input) and the engine (`apply_event` on the user's state, the states in a dict, the worker's
collector policy). Its one output per record is small (the user and how many predictions the
event changed), where the passthrough re-encodes the whole value. Nothing else: no Faust, no
state store, no changelog, no commits.

A worker cannot do less per event and still be this product, so its rate over the
passthrough's in the same run bounds the worker's ratio to the passthrough from above (up to
the outputs: the worker sends 0.5-0.7 per event, each larger): a ratio target above this one
is out of reach of any worker written in Python on this engine, whatever it does with Faust.
Runs until SIGTERM, like the other peers.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import msgpack

from bench.passthrough import BATCH_MAX, clients
from engine import EngineConfig, EngineState, apply_event, create_state
from schemas.config import load_config
from schemas.events import IgnoredMessage, decode_event
from streams.runtime.memory import GcPolicy

IGNORED = msgpack.packb(None)


def apply(
    config: EngineConfig, states: dict[str, EngineState], value: bytes, ts: int | None
) -> bytes:
    """Decode one record as the worker does, apply it, and say what it changed (the output).

    A message the decoder refuses stops the peer: the bench makes no bad input, so a refusal
    means the floor would be timing less work than the worker does."""
    try:
        event = decode_event(value, fallback_ts=ts)
    except IgnoredMessage:  # an identify call
        return IGNORED
    state = states.get(event.user)
    step = apply_event(create_state(config) if state is None else state, event)
    states[event.user] = step.state
    out: bytes = msgpack.packb([event.user, len(step.predictions)])
    return out


async def run(bootstrap: str, source: str, dest: str, config: EngineConfig) -> None:
    """Forward `source` to `dest`, applying every event, until SIGTERM."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    states: dict[str, EngineState] = {}
    GcPolicy.tune()  # as the worker does: the states stay out of the collector's walks
    memory = GcPolicy()
    async with clients(bootstrap, source) as (consumer, producer):
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=BATCH_MAX)
            for records in batches.values():
                for record in records:
                    out = apply(config, states, record.value, record.timestamp)
                    await producer.send(dest, out, key=record.key)
            memory.tick()
        await producer.flush()


def main() -> int:
    """Parse the flags (the peers' own, and the engine's config) and run until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.engine_floor", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--app-id", required=True, help="unused: it joins no group")
    parser.add_argument("--datadir", type=Path, required=True, help="unused: it keeps no store")
    parser.add_argument("--config", type=Path, required=True, help="the worker's config")
    args = parser.parse_args()
    asyncio.run(run(args.bootstrap, args.source, args.dest, load_config(args.config)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
