"""The load generator's records, encoded ahead of the run, are the ones a send per event
would have sent: the same msgpack bytes with the send time as "ts", the same partition."""

from __future__ import annotations

from pathlib import Path

import msgpack
from aiokafka.partitioner import DefaultPartitioner

from bench.loadgen import _UINT64, _prepared
from bench.synthetic import clickstream
from engine import Event
from schemas.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "oracular.yaml"
PARTITIONS = list(range(8))


def test_a_prepared_record_stamped_at_send_is_the_event_packed_then():
    config = load_config(CONFIG)
    events = clickstream(config, 2_000, 100, seed=3)
    events.append(Event("user-00001", 0, type="revealed", intent="upgrade", id="r"))  # an intent
    for n, event in enumerate(events):
        event_id = f"L{n}"
        ts = 1_796_000_000_000 + n  # a send time in ms, as the generator stamps it
        message: dict[str, object] = {"user": event.user, "ts": ts, "type": event.type}
        message["id"] = event_id
        if event.name is not None:
            message["name"] = event.name
        if event.intent is not None:
            message["intent"] = event.intent
        prepared = _prepared(event, event_id, PARTITIONS)
        assert _UINT64.pack(0xCF, ts).join(prepared.parts) == msgpack.packb(message)
        key = event.user.encode()
        assert prepared.partition == DefaultPartitioner()(key, PARTITIONS, PARTITIONS)
        assert prepared.sent_key == f"{event.user}:{event_id}"
