"""`oracular replay` in bounded memory: users beyond `memory_users` are written to disk, and
nothing the run gives changes: its outputs in their order, its final states in theirs, its
counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.synthetic import clickstream
from engine import EngineConfig, Event
from schemas.config import load_config
from streams.tools.replay import OfflineRun

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_config(ROOT / "examples" / "oracular.yaml")


def run(config: EngineConfig, events: list[Event], memory_users: int | None, tmp_path: Path):
    tmp_path.mkdir()
    offline = OfflineRun(
        config, clock_ms=10**13, memory_users=memory_users, spill_dir=str(tmp_path)
    )
    outputs = []
    for index, event in enumerate(events):
        outputs += [o.message for o in offline.feed_event(index, event)]
    outputs += [o.message for o in offline.finish()]
    return offline, outputs, list(offline.encoded())


@pytest.mark.parametrize("memory_users", [1, 7, 60])
@pytest.mark.parametrize("ttl", [None, "15d"])
def test_a_run_over_the_disk_gives_what_a_run_in_memory_gives(tmp_path, memory_users, ttl):
    config = CONFIG
    if ttl is not None:
        config = EngineConfig.from_dict({**CONFIG.to_dict(), "stateTtl": ttl})
    events = list(clickstream(config, 3_000, 120, 5))
    whole, expected, expected_states = run(config, events, None, tmp_path / "whole")
    part, outputs, states = run(config, events, memory_users, tmp_path / "part")
    assert part.written_to_disk > 0 and whole.written_to_disk == 0
    assert outputs == expected  # the same messages, in the same order
    assert states == expected_states  # the same users, values and order
    assert part.user_count() == whole.user_count() == len(expected_states)
    assert part.counts == whole.counts
    part.close()
    assert not any((tmp_path / "part").iterdir())  # nothing left on disk


def test_a_user_who_expires_and_comes_back_is_listed_once_where_it_came_back(tmp_path):
    config = EngineConfig.from_dict({**CONFIG.to_dict(), "stateTtl": "15d"})
    day = 24 * 3600 * 1000
    at = 1_767_261_600_000
    events = [
        Event("a", at, name="pricing.viewed", id="a1"),
        Event("b", at + 1, name="pricing.viewed", id="b1"),
        Event("c", at + 2, name="pricing.viewed", id="c1"),
        Event("a", at + 20 * day, name="pricing.viewed", id="a2"),  # a expired: back last
        Event("c", at + 20 * day + 1, name="pricing.viewed", id="c2"),
    ]
    for memory_users in (None, 1):
        offline = OfflineRun(
            config, clock_ms=10**13, memory_users=memory_users, spill_dir=str(tmp_path)
        )
        for index, event in enumerate(events):
            offline.feed_event(index, event)
        offline.finish(until=at + 20 * day + 2)
        assert [key for key, _ in offline.encoded()] == [b"a", b"c"]  # b expired at the end
        offline.close()
