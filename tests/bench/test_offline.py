"""`bench.offline`'s rungs between the engine and the replay do the engine's whole work."""

from __future__ import annotations

from pathlib import Path

from bench.offline import decoded_apply, events_of, skeleton
from bench.realistic import CONFIG, realistic_stream
from engine import Replayer
from schemas.config import load_config


def test_the_leanest_replay_and_the_decoder_rung_leave_the_engines_states(tmp_path: Path) -> None:
    config = load_config(CONFIG)
    stream = realistic_stream(config, 3_000, 60, seed=5)
    replayer = Replayer(config)
    for event in events_of(stream.messages):
        replayer.feed(event)
    path = tmp_path / "realistic.jsonl"
    path.write_bytes(b"".join(raw + b"\n" for raw in stream.messages))

    lean = skeleton(config, stream.messages)
    decoded = decoded_apply(config, path)

    assert len(replayer.states) == 60
    assert lean == replayer.states
    assert decoded == replayer.states
