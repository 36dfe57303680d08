"""Restores and standbys skip changelog records older than the value they hold (zombies)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from faust.types import TP

from engine import EngineConfig, create_state
from schemas.stored import StoredUser, encode_stored, stored_version
from streams.runtime.state_table import fence_stale_changelog_records

CONFIG = EngineConfig.from_dict({"intents": {"upgrade": {"signals": {"pricing.viewed": 1}}}})


@dataclass(frozen=True)
class Message:
    tp: TP
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

    def _db_for_partition(self, partition: int) -> Store:
        assert partition == 0  # the tests' one partition
        return self


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
    return [Event(Message(TP("cl", 0), 0, n, b"u", v)) for n, v in enumerate(values)]


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


class _Coordinator:
    """aiokafka's group coordinator as `faust_patches.membership` sees it: the heartbeat's
    answer is scripted (an error code per call; 0 = accepted)."""

    group_id, member_id, coordinator_id = "g", "m-1", 1

    def __init__(self, answers: list[int]) -> None:
        self.answers, self.generation, self.asked, self.rejoin = answers, 7, [], False

    async def _send_req(self, request: Any) -> Any:
        from types import SimpleNamespace

        self.asked.append((request._generation_id, request._member_id))
        return SimpleNamespace(error_code=self.answers.pop(0))

    def request_rejoin(self) -> None:
        self.rejoin = True


class _App:
    def __init__(self, answers: list[int] | None = None) -> None:
        from types import SimpleNamespace

        self.rebalancing = False
        self.consumer_generation_id = 7
        self.coordinator = _Coordinator([0] if answers is None else answers)

        async def call_thread(fun: Any) -> Any:
            return await fun()

        client = SimpleNamespace(_coordinator=self.coordinator)
        self.consumer = SimpleNamespace(
            _thread=SimpleNamespace(_consumer=client, call_thread=call_thread)
        )


def _fence(app: _App) -> Any:
    """A `Fence` whose lease doubts membership after 0.1 s; `fence.counts` counts the batches
    it dropped."""
    from collections import Counter

    from streams.runtime.fencing import Fence

    counts: Counter[str] = Counter()

    def fenced() -> None:
        counts["fenced_batches"] += 1

    fence = Fence(app, session_timeout_s=0.2, ticks_topic="t", on_fenced=fenced)
    fence.counts = counts  # type: ignore[attr-defined]  # for the tests
    return fence


async def test_a_running_worker_writes_at_once_without_asking():
    app = _App()
    fence = _fence(app)
    assert await fence.may_write(7)
    assert app.coordinator.asked == []


async def test_a_stalled_worker_the_coordinator_still_counts_writes():
    app = _App([0])
    fence = _fence(app)
    fence.lease.renewed -= 5  # the loop did not run for 5 s
    assert await fence.may_write(7)
    assert app.coordinator.asked == [(7, "m-1")]  # asked with its own generation and id
    assert fence.lease.stalled_s() is None


@pytest.mark.parametrize(
    ("code", "answer"), [(22, "lost"), (25, "lost"), (27, "rebalancing")]
)  # IllegalGeneration, UnknownMemberId, RebalanceInProgress
async def test_a_stalled_worker_the_coordinator_does_not_count_drops_the_batch(code, answer):
    app = _App([code])
    fence = _fence(app)
    fence.lease.renewed -= 5
    assert not await fence.may_write(7)
    assert fence.counts["fenced_batches"] == 1
    assert app.coordinator.rejoin


async def test_no_answer_is_not_taken_for_membership():
    # The coordinator is moving (NotCoordinator, then CoordinatorNotAvailable), then evicts.
    app = _App([16, 15, 25])
    fence = _fence(app)
    fence.lease.renewed -= 5
    assert not await fence.may_write(7)
    assert len(app.coordinator.asked) == 3


async def test_a_worker_aiokafka_already_reset_is_lost_without_asking():
    app = _App([])
    app.coordinator.generation, app.coordinator.member_id = -1, ""
    fence = _fence(app)
    fence.lease.renewed -= 5
    assert not await fence.may_write(7)
    assert app.coordinator.asked == []


async def test_a_stalled_worker_that_saw_the_rebalance_drops_the_batch():
    app = _App([0])
    fence = _fence(app)
    fence.lease.renewed -= 5
    app.consumer_generation_id = 8  # the heartbeat task rejoined: a new generation
    assert not await fence.may_write(7)
    assert fence.counts["fenced_batches"] == 1


async def test_a_stall_while_asking_asks_again():
    app = _App([0, 25])
    fence = _fence(app)
    fence.lease.renewed -= 5
    send = app.coordinator._send_req

    async def frozen_once(request: Any) -> Any:
        if not app.coordinator.asked:
            fence.lease.renewed -= 5  # frozen while the first question was out
        return await send(request)

    app.coordinator._send_req = frozen_once
    assert not await fence.may_write(7)  # the first "yes" is not trusted; the second: evicted
    assert len(app.coordinator.asked) == 2


# --- a worker frozen while writing its changelog leaves repairs behind --------------------


async def test_a_freeze_while_writing_is_noticed_even_after_the_loop_ran_again():
    from streams.runtime.fencing import FrozenWhileWriting

    app = _App([25])  # evicted meanwhile (UnknownMemberId)
    fence = _fence(app)
    await fence.confirm(7)  # no stall: goes on without asking
    assert app.coordinator.asked == []
    fence.lease.renewed -= 5
    fence.lease.stalled_s()  # the lease task saw the stall ...
    fence.lease.renew()  # ... and the loop ran again since
    with pytest.raises(FrozenWhileWriting):
        await fence.confirm(7)
    assert app.coordinator.asked == [(7, "m-1")]


async def test_a_long_step_while_writing_is_no_freeze_when_the_worker_is_still_a_member():
    """A stall is a freeze or a step that ran that long (a backfill's mass close): the
    coordinator decides, and a member of the same generation writes on."""
    app = _App([0])
    fence = _fence(app)
    fence.lease.renewed -= 5
    await fence.confirm(7)
    assert app.coordinator.asked == [(7, "m-1")]
    await fence.confirm(7)  # confirmed: not asked again
    assert len(app.coordinator.asked) == 1


async def test_a_freeze_noticed_at_the_acknowledgement_stores_no_changelog_offset():
    """The local copy's stored changelog offset means "every record up to here is in this
    copy". A frozen worker's records land after its successor's, which it never read: their
    offsets must not be stored, or a restart here would skip the successor's records."""
    from types import SimpleNamespace

    from faust.types import TP

    from streams.runtime.fencing import FrozenWhileWriting
    from streams.runtime.state_table import FaustTable

    table = Table()
    table.changelog_topic = SimpleNamespace(get_topic_name=lambda: "cl")  # type: ignore[attr-defined]
    store = FaustTable(table)
    loop = asyncio.get_running_loop()

    def sent(base: int, count: int) -> list[Any]:
        future = loop.create_future()
        future.set_result(SimpleNamespace(offset=base))
        return [("cl", 0, count, future)]

    fence = _fence(_App([25]))  # evicted while frozen (UnknownMemberId)
    await store.changelog_acknowledged(sent(10, 3), lambda: fence.confirm(7))
    assert table.data.persisted == {TP("cl", 0): 12}
    fence.lease.renewed -= 60  # frozen while the next batch's records were on their way
    with pytest.raises(FrozenWhileWriting):
        await store.changelog_acknowledged(sent(20, 2), lambda: fence.confirm(7))
    assert table.data.persisted == {TP("cl", 0): 12}


async def test_repairs_name_every_written_user_on_its_partition_after_the_queued_records():

    from schemas.ticks import decode_tick

    log: list[tuple[str, Any, Any]] = []

    class Producer:
        async def send(self, topic, key, value, partition, *_):
            log.append((topic, partition, value))
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

        async def flush(self):
            log.append(("flush", None, None))

    app = _App()
    app.producer = Producer()
    fence = _fence(app)

    users = [(f"u{i}".encode(), b"v", i % 2) for i in range(450)]
    await fence.send_repairs(users)
    assert log[0] == ("flush", None, None)  # the queued changelog records go out first
    named: dict[int, list[bytes]] = {}
    for topic, partition, value in log[1:-1]:
        assert topic == "t"
        keys = decode_tick(value).rewrite
        assert 0 < len(keys) <= 200
        named.setdefault(partition, []).extend(keys)
    assert named == {p: [k for k, _, q in users if q == p] for p in (0, 1)}


async def test_after_a_dropped_batch_nothing_is_applied_until_a_new_assignment():
    """Batches read before the rebalance the worker was told about are dropped unread too:
    their partitions may be another worker's already (a chaos run caught a zombie applying
    the next buffered batch right after dropping the first)."""
    from types import SimpleNamespace

    app = _App([25])
    app.consumer._unacked_messages = set()
    fence = _fence(app)
    fence.fenced_in = None
    fence.lease.renewed -= 5
    dropped = [SimpleNamespace(message=f"m{i}") for i in range(3)]
    app.consumer._unacked_messages.update(e.message for e in dropped)
    assert not await fence.may_write(7)
    assert fence.drop(7, dropped[:1]) == []
    # The next batch, same generation: dropped before the processor sees it.
    assert fence.dropping(7, dropped[1:])
    assert app.consumer._unacked_messages == set()
    assert fence.fenced_in == 7
    # Assigned anew (a newer generation): batches apply again.
    assert not fence.dropping(8, dropped[1:])
    assert fence.fenced_in is None


async def test_a_stall_the_lease_task_noticed_first_still_needs_the_coordinators_word():
    """After SIGCONT the lease task may run before the batch does and renew the lease: the
    stall count still shows the freeze (a chaos run caught a zombie writing this way)."""
    app = _App([25])
    fence = _fence(app)
    fence.stalls_seen = fence.lease.stalls
    fence.lease.renewed -= 5
    fence.lease.stalled_s()  # what `Lease.keep` does first ...
    fence.lease.renew()  # ... then renews
    assert not await fence.may_write(7)
    assert app.coordinator.asked == [(7, "m-1")]
