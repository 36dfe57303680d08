"""The worker's garbage-collector policy: survivors frozen every second, all thawed hourly."""

from __future__ import annotations

import gc
import logging

from streams.runtime.memory import GcPolicy


def test_survivors_are_frozen_each_second_and_thawed_each_hour():
    gc.unfreeze()
    policy = GcPolicy()
    try:
        kept = [{"state": i} for i in range(10_000)]  # long-lived, like decoded states
        policy.tick()
        assert gc.get_freeze_count() == 0  # not a second yet
        policy.frozen_at -= GcPolicy.FREEZE_S
        policy.tick()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)  # the states are out of the collector's generations
        policy.thawed_at -= GcPolicy.THAW_S
        policy.tick()  # thawed, fully collected, frozen again
        assert gc.get_freeze_count() >= len(kept)
        assert policy.thawed_at > 0
    finally:
        gc.unfreeze()


def test_the_per_second_freeze_collects_nothing():
    """Collecting a second's survivors before freezing them cost 20-40 ms a second and found
    nothing to free: the tick freezes them as they are (the hourly collection takes any
    cyclic garbage)."""
    gc.unfreeze()
    policy = GcPolicy()
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        kept = [{"state": i} for i in range(10_000)]
        policy.frozen_at -= GcPolicy.FREEZE_S
        collections.clear()  # the young collections that building `kept` made
        policy.tick()
        assert collections == []
        assert gc.get_freeze_count() >= len(kept)
        policy.freeze()  # after a recovery: collected first
        assert collections == [1]
    finally:
        gc.callbacks.remove(count)
        gc.unfreeze()


def test_a_slow_collection_is_logged(caplog):
    policy = GcPolicy(logging.getLogger("test.gc"))
    policy.SLOW_PAUSE_S = 0.0  # every collection counts as slow here
    try:
        with caplog.at_level(logging.INFO, logger="test.gc"):
            gc.collect()
        assert policy.slow_pauses >= 1
        assert "garbage collection paused the worker" in caplog.text
    finally:
        gc.callbacks[:] = [
            c for c in gc.callbacks if getattr(c, "__qualname__", "").find("GcPolicy") < 0
        ]


def test_tune_raises_only_the_young_generations_threshold():
    """The worker's young collections run every YOUNG_THRESHOLD allocations, not Python's
    700; the older generations keep their thresholds."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)  # Python's young default (an offline command may have run)
        GcPolicy.tune()
        assert gc.get_threshold() == (GcPolicy.YOUNG_THRESHOLD, 11, 12)
    finally:
        gc.set_threshold(*before)
