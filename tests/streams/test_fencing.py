"""Restores and standbys skip changelog records older than the value they hold (zombies)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from engine import EngineConfig, create_state
from schemas.stored import StoredUser, encode_stored, stored_version
from streams.app import fence_stale_changelog_records

CONFIG = EngineConfig.from_dict({"intents": {"upgrade": {"signals": {"pricing.viewed": 1}}}})


@dataclass(frozen=True)
class Message:
    tp: tuple[str, int]
    partition: int
    offset: int
    key: bytes
    value: bytes | None


@dataclass(frozen=True)
class Event:
    message: Message


class Store(dict):
    def __init__(self) -> None:
        super().__init__()
        self.persisted: dict[Any, int] = {}

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        self.persisted[tp] = offset


class Table:
    """What `fence_stale_changelog_records` uses of a Faust table."""

    def __init__(self) -> None:
        self.data = Store()
        self.applied: list[int] = []

    def apply_changelog_batch(self, batch: Any) -> None:
        for event in batch:
            self.applied.append(event.message.offset)
            self.data[event.message.key] = event.message.value
            self.data.set_persisted_offset(event.message.tp, event.message.offset)


def value(last_offset: int, episodes: int) -> bytes:
    user = StoredUser(create_state(CONFIG), 0, last_offset, last_offset + 1, episodes)
    return encode_stored(user)


def events(*values: bytes | None) -> list[Event]:
    return [Event(Message(("cl", 0), 0, n, b"u", v)) for n, v in enumerate(values)]


def test_versions_order_inputs_then_timer_closes():
    assert stored_version(value(5, 0)) < stored_version(value(5, 1)) < stored_version(value(6, 0))
    assert stored_version(b"garbage") is None


def test_a_late_older_record_is_skipped_within_a_batch_and_against_the_store():
    table = Table()
    fence_stale_changelog_records(table)
    newer, older = value(9, 2), value(7, 1)
    table.apply_changelog_batch(events(older, newer, older))  # the zombie's write came last
    assert table.applied == [0, 1] and table.data[b"u"] == newer
    assert table.data.persisted[("cl", 0)] == 2  # the offset still moves past the skipped one
    table.apply_changelog_batch(events(older))  # a later batch: compared with the store
    assert table.data[b"u"] == newer


def test_a_stale_record_left_last_in_the_log_is_repaired_by_the_owner():
    """Compaction keeps a key's last record: a stale last one must be written over."""
    repaired = []
    table = Table()
    fence_stale_changelog_records(table, lambda p, k: repaired.append((p, k)))
    table.apply_changelog_batch(events(value(9, 2), value(7, 1)))
    assert repaired == [(0, b"u")]
    repaired.clear()
    table.apply_changelog_batch(events(value(7, 1), value(10, 0)))  # a newer one follows
    assert repaired == []


def test_equal_versions_and_deletes_apply():
    table = Table()
    fence_stale_changelog_records(table)
    same = value(3, 0)
    table.apply_changelog_batch(events(same, same, None, value(1, 0)))
    assert table.applied == [0, 1, 2, 3] and table.data[b"u"] == value(1, 0)


# --- a worker that was frozen fences itself before writing --------------------------------


class _App:
    def __init__(self) -> None:
        self.rebalancing = False
        self.consumer_generation_id = 7


class _Settings:
    session_timeout_s = 0.5


def _runtime(app: _App) -> Any:
    from collections import Counter
    from types import SimpleNamespace

    from streams.app import Lease, _Runtime

    runtime = _Runtime.__new__(_Runtime)
    runtime.app, runtime.settings = app, _Settings()
    runtime.lease = Lease(0.1)
    runtime.processor = SimpleNamespace(counts=Counter())
    return runtime


async def test_a_running_worker_writes_at_once():
    runtime = _runtime(_App())
    assert await runtime._may_write()


async def test_a_stalled_worker_that_lost_its_group_drops_the_batch():
    app = _App()
    runtime = _runtime(app)
    runtime.lease.renewed -= 5  # the loop did not run for 5 s
    # While the worker waits, its heartbeat finds out that the group moved on without it.
    asyncio.get_running_loop().call_soon(setattr, app, "consumer_generation_id", 8)
    assert not await runtime._may_write()
    assert runtime.processor.counts["fenced_batches"] == 1


async def test_a_stalled_worker_still_in_its_group_writes_after_one_session_timeout():
    runtime = _runtime(_App())
    runtime.lease.renewed -= 5
    assert await runtime._may_write()
    assert runtime.lease.stalled_s() is None
