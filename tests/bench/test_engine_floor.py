"""The floor peer does the engine's whole work: its states are the replay's."""

from __future__ import annotations

import msgpack

from bench.offline import events_of
from bench.peers.engine_floor import IGNORED, apply
from bench.realistic import CONFIG, realistic_stream
from engine import EngineState, Replayer
from schemas.config import load_config


def test_the_floor_leaves_the_engines_states_and_one_output_per_record() -> None:
    config = load_config(CONFIG)
    stream = realistic_stream(config, 3_000, 60, seed=7)
    replayer = Replayer(config)
    for event in events_of(stream.messages):
        replayer.feed(event)

    states: dict[str, EngineState] = {}
    outputs = [apply(config, states, raw, None) for raw in stream.messages]

    assert len(states) == 60
    assert states == replayer.states
    assert len(outputs) == len(stream.messages)
    changed = [msgpack.unpackb(out) for out in outputs if out != IGNORED]
    assert changed and any(n > 0 for _, n in changed)
