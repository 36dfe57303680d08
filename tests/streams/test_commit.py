"""The batch commit protocol (`streams.runtime.commit.BatchCommit`) through its public
interface, with batches the real `Processor` applied and fakes for the producer, the state table
and the app: outputs delivered, then states stored, then the changelog handed over; a batch's
inputs are acked only once its changelog is acknowledged, and the next batch applies and sends
its outputs meanwhile but writes no state before that."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from faust.types import TP

from schemas.config import load_config
from schemas.stored import decode_stored, encode_stored
from streams.faust import patches as faust_patches
from streams.runtime.commit import BatchCommit
from streams.runtime.fencing import Fence
from streams.runtime.processor import DLQ, EPISODES, PREDICTIONS, InMessage, Processor, Table
from streams.settings import settings_from_env

from .test_sending import FakeProducer

CONFIG = "examples/oracular.yaml"
WAIT_S = 10.0  # generous: only a broken ordering waits this long


class _Message(SimpleNamespace):
    __hash__ = object.__hash__  # in the consumer's unacked set, as Faust's messages are


class FakeEvent:
    """A Faust event as the agent takes it: its message, and `ack` (True the first time)."""

    def __init__(self, topic: str, partition: int, offset: int, value: dict[str, Any]) -> None:
        self.message = _Message(
            topic=topic,
            partition=partition,
            offset=offset,
            key=value["user"].encode(),
            value=msgpack.packb(value),
            timestamp=value["ts"] / 1000,
            tp=TP(topic, partition),
        )
        self.acked = False

    def ack(self) -> bool:
        first, self.acked = not self.acked, True
        return first

    def in_message(self) -> InMessage:
        m = self.message
        return InMessage(m.topic, m.partition, m.offset, m.key, m.value, round(m.timestamp * 1000))


class GatedTable(Table):
    """The state table: values in a dict; each batch's changelog is acknowledged when the
    test opens its gate (or fails, when the test says so)."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.handed: list[list[bytes]] = []
        self.gates: list[asyncio.Future[None]] = []

    def get(self, key: bytes, context: Any) -> bytes | None:
        return self.values.get(key)

    def set(self, key: bytes, value: bytes | None, context: Any) -> None:
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value

    def set_all(self, writes: list[tuple[bytes, bytes | None, int]]) -> None:
        for key, value, context in writes:
            self.set(key, value, context)

    async def send_changelog(self, producer: Any, writes: Any, before_sending: Any) -> int:
        await before_sending()
        self.handed.append([key for key, _, _ in writes])
        self.gates.append(asyncio.get_running_loop().create_future())
        return len(self.gates) - 1

    async def changelog_acknowledged(self, sent: int, before_persisting: Any) -> None:
        await self.gates[sent]
        await before_persisting()


@pytest.fixture
def runtime(monkeypatch):
    return _runtime(monkeypatch, cache_users=0)  # every batch writes its states (no cache)


@pytest.fixture
def holding(monkeypatch):
    """A runtime with the cache of decoded users on, so states may be held (the default)."""
    return _runtime(monkeypatch, cache_users=1000)


class FakeHost:
    """The app as the commit sees it: the producer, acks, crashes."""

    def __init__(self, producer: FakeProducer) -> None:
        self._producer = producer
        self.crashes: list[BaseException] = []
        self.abandoned: list[Any] = []

    def producer(self) -> Any:
        return self._producer

    def generation(self) -> int:
        return GENERATION

    def ack(self, events: list[Any]) -> None:
        for event in events:
            event.ack()

    def abandon(self, events: list[Any]) -> None:
        self.abandoned.extend(events)

    def crashed(self) -> bool:
        return bool(self.crashes)

    async def crash(self, exc: BaseException) -> None:
        self.crashes.append(exc)


GENERATION = 1


class Worker:
    """A `BatchCommit` with what feeds it: the processor applies each batch, as the runtime
    does, and hands it to the commit (`run_batch`)."""

    def __init__(self, monkeypatch: Any, cache_users: int, write_interval_s: float | None) -> None:
        settings = settings_from_env({})
        self.settings = settings
        topics = settings.topics
        self.producer = FakeProducer(room=1000)
        self.host = FakeHost(self.producer)

        async def partitioner(_: Any, topic: str) -> Any:
            return lambda key: 0

        monkeypatch.setattr(faust_patches, "key_partitioner", partitioner)
        self.processor = Processor(
            load_config(CONFIG),
            events_topic=topics.events.name,
            ticks_topic=topics.ticks.name,
            cache_users=cache_users,
        )
        self.table = GatedTable()
        app = SimpleNamespace(consumer=SimpleNamespace(_unacked_messages=set()))
        self.fence = Fence(
            app, session_timeout_s=settings.session_timeout_s, ticks_topic=topics.ticks.name
        )
        self.now = 1000.0
        self.commit = BatchCommit(
            self.host,
            self.processor,
            self.table,
            self.fence,
            {
                PREDICTIONS: topics.predictions.name,
                EPISODES: topics.episodes.name,
                DLQ: topics.dlq.name,
            },
            write_interval_s=(
                settings.state_write_interval_s if write_interval_s is None else write_interval_s
            ),
            batch_max=settings.batch_max,
            clock=lambda: self.now,
        )

    async def run_batch(self, events: list[FakeEvent]) -> None:
        commit = self.commit
        if not events:
            await commit.write_held()
            return
        if not await commit.admit(GENERATION, events):
            return
        batch = self.processor.batch(self.table)
        messages = [event.in_message() for event in events]
        self.processor.run_batch(batch, messages, lambda partition: False, lambda: WALL_MS)
        await commit.commit(batch, events, messages, GENERATION)


WALL_MS = 1_700_000_100_000


def _runtime(monkeypatch: Any, cache_users: int, write_interval_s: float | None = None) -> Worker:
    return Worker(monkeypatch, cache_users, write_interval_s)


def _events(runtime: Any, users: list[str], first_offset: int) -> list[FakeEvent]:
    topic = runtime.settings.topics.events.name
    return [
        FakeEvent(
            topic,
            0,
            first_offset + i,
            {
                "user": user,
                "ts": 1_700_000_000_000 + i,
                "id": f"e{first_offset + i}",
                "name": "limit.hit",
            },
        )
        for i, user in enumerate(users)
    ]


async def _until(condition: Any) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.001)


async def test_states_wait_for_their_outputs_and_inputs_for_their_changelog(runtime):
    """A batch hands its outputs over and returns; its states are written once the broker has
    the outputs, after the next batch applied; its inputs are acked once its changelog is
    acknowledged, and the batch after it writes nothing before that."""
    table, producer = runtime.table, runtime.producer
    first = _events(runtime, ["u1", "u2"], 0)
    await _bounded(runtime.run_batch(first))
    outputs_of_first = len(producer.batches)
    assert outputs_of_first > 0  # handed over at once
    assert table.handed == [] and table.values == {}  # the states wait for the outputs

    second = _events(runtime, ["u1", "u3"], 2)
    await _bounded(runtime.run_batch(second))
    assert table.handed == [[b"u1", b"u2"]]  # the first's, its outputs acknowledged
    assert len(producer.batches) > outputs_of_first
    assert not any(event.acked for event in first)  # its changelog is not acknowledged
    # The second batch read u1 as the first left it, before anything of it was written.
    assert runtime.processor.cache.peek(b"u1").inputs == 2

    third = _events(runtime, ["u4"], 4)
    outputs_before = len(producer.batches)
    running = asyncio.ensure_future(runtime.run_batch(third))
    # Its outputs go out (a prediction waits for nothing of an earlier batch); its states,
    # and the second's, wait for the first's changelog.
    await _until(lambda: len(producer.batches) > outputs_before)
    await asyncio.sleep(0.05)  # plenty of loop turns: it applies, then waits for the first
    assert not running.done()
    assert len(table.handed) == 1

    table.gates[0].set_result(None)
    await _until(running.done)
    await running
    assert all(event.acked for event in first)
    assert table.handed[1] == [b"u1", b"u3"]
    assert not any(event.acked for event in second)

    table.gates[1].set_result(None)
    await _bounded(runtime.run_batch([]))  # the buffer ran dry: the third's states
    assert table.handed[2] == [b"u4"]
    table.gates[2].set_result(None)
    await runtime.commit.finished()
    assert all(event.acked for event in second + third)
    assert _stored_inputs(runtime, b"u1") == 2
    assert runtime.processor.counts["applied"] == 5
    assert not runtime.host.crashes


async def test_an_undelivered_changelog_stops_the_worker_and_acks_nothing(runtime):
    table = runtime.table
    first = _events(runtime, ["u1"], 0)
    await _bounded(runtime.run_batch(first))
    second = _events(runtime, ["u2"], 1)
    await _bounded(runtime.run_batch(second))  # writes the first's states
    table.gates[0].set_exception(RuntimeError("not delivered"))
    third = _events(runtime, ["u3"], 2)
    with pytest.raises(RuntimeError, match="not delivered"):
        await _bounded(runtime.run_batch(third))  # it raises before writing anything
    assert [type(exc) for exc in runtime.host.crashes] == [RuntimeError]
    assert not any(event.acked for event in first + second + third)
    assert len(table.handed) == 1
    await runtime.commit.finished()  # nothing is left waiting


async def test_an_undelivered_output_stops_the_worker_and_writes_nothing(runtime):
    """The batch after it finds the failed delivery before writing: the held states are
    dropped unwritten, and nothing is acked (a restart reads the inputs again)."""
    runtime.producer.fail = True
    first = _events(runtime, ["u1"], 0)
    await _bounded(runtime.run_batch(first))
    second = _events(runtime, ["u2"], 1)
    with pytest.raises(RuntimeError, match="not delivered"):
        await _bounded(runtime.run_batch(second))
    assert [type(exc) for exc in runtime.host.crashes] == [RuntimeError]
    assert runtime.table.handed == [] and runtime.table.values == {}
    assert not runtime.commit.held and not runtime.processor.cache.unwritten
    assert not any(event.acked for event in first + second)
    await _bounded(runtime.commit.stopping())  # at shutdown too, nothing is written
    assert runtime.table.handed == []


async def test_the_last_batch_is_acked_without_another_one(runtime):
    """A quiet stream: the last batch's inputs are acked as soon as its changelog is, not when
    the next batch comes (the agent gets an empty batch when its buffer is empty and it holds
    events)."""
    first = _events(runtime, ["u1"], 0)
    await _bounded(runtime.run_batch(first))
    await _bounded(runtime.run_batch([]))
    runtime.table.gates[0].set_result(None)
    await _until(lambda: first[0].acked)


async def _bounded(step: Any) -> None:
    """Await a batch step, failing (not hanging) when it waits for a gate that no test opens:
    a batch that wrote when it should have held its states waits for the changelog gate."""
    await asyncio.wait_for(step, WAIT_S)


def _stored_inputs(runtime: Any, user: bytes) -> int:
    return decode_stored(runtime.table.values[user], runtime.processor.config).inputs


async def test_while_a_backlog_waits_several_batches_write_each_user_once(holding):
    """Input waiting in the buffer: the batches' outputs go out batch by batch, their states
    are held and written together, one changelog record per user, and their inputs are acked
    once that changelog is acknowledged."""
    runtime, table, producer = holding, holding.table, holding.producer
    runtime.commit.buffered = lambda: 1000  # a backlog: more than a batch waits
    first = _events(runtime, ["u1", "u2"], 0)
    await _bounded(runtime.run_batch(first))
    outputs_of_first = len(producer.batches)
    assert outputs_of_first > 0  # the outputs did not wait
    second = _events(runtime, ["u1", "u3"], 2)
    await _bounded(runtime.run_batch(second))
    assert len(producer.batches) > outputs_of_first
    assert table.handed == [] and table.values == {}  # held: nothing written yet
    # A lookup (the cache's `peek`) already answers with the newest state.
    held_u1 = runtime.processor.cache.peek(b"u1")
    assert held_u1 is not None and held_u1.inputs == 2

    runtime.commit.buffered = lambda: 0  # caught up: this batch writes all that is held
    third = _events(runtime, ["u4"], 4)
    await _bounded(runtime.run_batch(third))
    assert table.handed == [[b"u1", b"u2", b"u3"]]  # each user once
    assert _stored_inputs(runtime, b"u1") == 2
    table.gates[0].set_result(None)
    await _bounded(runtime.run_batch([]))  # the buffer ran dry: the third's, after its outputs
    assert table.handed[1] == [b"u4"]
    assert all(event.acked for event in first + second)
    assert not any(event.acked for event in third)
    table.gates[1].set_result(None)
    await runtime.commit.finished()
    assert all(event.acked for event in third)
    assert not runtime.processor.cache.unwritten and not runtime.commit.held
    assert runtime.processor.cache.peek(b"u1") is held_u1  # cached as written


async def test_held_states_are_written_when_the_buffer_runs_dry(holding):
    """`take_batches` gives an empty batch when the buffer is empty and events are held."""
    runtime = holding
    runtime.commit.buffered = lambda: 1000
    first = _events(runtime, ["u1"], 0)
    await _bounded(runtime.run_batch(first))
    assert runtime.table.handed == []
    await _bounded(runtime.run_batch([]))
    assert runtime.table.handed == [[b"u1"]]
    runtime.table.gates[0].set_result(None)
    await runtime.commit.finished()
    assert first[0].acked


async def test_states_are_held_at_most_the_write_interval(holding):
    runtime = holding
    runtime.commit.buffered = lambda: 1000
    await _bounded(runtime.run_batch(_events(runtime, ["u1"], 0)))
    await _bounded(runtime.run_batch(_events(runtime, ["u2"], 1)))
    assert runtime.table.handed == []
    runtime.now += runtime.commit.write_interval_s  # the interval is over
    await _bounded(runtime.run_batch(_events(runtime, ["u3"], 2)))
    assert runtime.table.handed == [[b"u1", b"u2"]]


async def test_a_few_events_waiting_do_not_hold_the_states(holding):
    """Live traffic: events that arrived while a batch's outputs were on their way are no
    backlog; holding states then made seconds' worth of them one write (a 100 ms pause)."""
    runtime = holding
    runtime.commit.buffered = lambda: runtime.settings.batch_max - 1
    await _bounded(runtime.run_batch(_events(runtime, ["u1"], 0)))
    await _bounded(runtime.run_batch(_events(runtime, ["u2"], 1)))
    assert runtime.table.handed == [[b"u1"]]  # the next batch wrote the first's at once


async def test_a_zero_write_interval_writes_every_batch(monkeypatch):
    runtime = _runtime(monkeypatch, cache_users=1000, write_interval_s=0.0)
    runtime.commit.buffered = lambda: 1000
    await _bounded(runtime.run_batch(_events(runtime, ["u1"], 0)))
    await _bounded(runtime.run_batch(_events(runtime, ["u2"], 1)))
    assert runtime.table.handed == [[b"u1"]]


async def test_held_inputs_are_dropped_unacked_when_the_partitions_are_revoked(holding):
    """Fenced or cut short by a rebalance, held states are never written late: the inputs
    are taken off the unacked set for the partitions' owners to read again, and the next
    batch reads the user from the table."""
    runtime = holding
    runtime.commit.buffered = lambda: 1000
    first = _events(runtime, ["u1"], 0)
    await _bounded(runtime.run_batch(first))
    runtime.processor.forget([0])
    runtime.commit.drop_held("the partitions were revoked")
    assert not runtime.commit.held and not runtime.processor.cache.unwritten
    assert runtime.host.abandoned == first and not first[0].acked
    assert runtime.processor.cache.peek(b"u1") is None
    await _bounded(runtime.run_batch([]))  # nothing held: nothing to write
    assert runtime.table.handed == []


async def test_the_agent_writes_what_it_holds_when_it_stops(holding):
    runtime = holding
    runtime.commit.buffered = lambda: 1000
    first = _events(runtime, ["u1"], 0)
    await _bounded(runtime.run_batch(first))
    stopping = asyncio.ensure_future(runtime.commit.stopping())
    await _until(lambda: runtime.table.handed)
    assert runtime.table.handed == [[b"u1"]]
    runtime.table.gates[0].set_result(None)
    await stopping
    assert first[0].acked


def _acked_a_turn_later(runtime: Any, order: list[str]) -> None:
    """The producer's acknowledgements come a loop turn after the hand-off (recorded), the
    processor's pre-encoding is recorded too."""
    producer, processor = runtime.producer, runtime.processor
    send, stage = producer.send_batch, processor.stage

    async def send_batch(*args: Any, **kwargs: Any) -> Any:
        delivered = await send(*args, **kwargs)
        later = asyncio.get_running_loop().create_future()

        def ack() -> None:
            order.append("outputs acked")
            later.set_result(delivered.result())

        asyncio.get_running_loop().call_soon(ack)
        return later

    def staging(batch: Any, encode: Any) -> None:
        def asked() -> bool:
            now = encode()
            if now:
                order.append("encoded")
            return now

        stage(batch, encode=asked)

    producer.send_batch, processor.stage = send_batch, staging


@pytest.mark.parametrize("backlog", [False, True])
async def test_a_live_batch_encodes_its_states_while_its_outputs_travel(holding, backlog):
    """Live, the states a batch will write are encoded before its outputs are acknowledged,
    and written as encoded; a batch whose states will be held encodes nothing then."""
    runtime, order = holding, []
    _acked_a_turn_later(runtime, order)
    runtime.commit.buffered = lambda: 1000 if backlog else 0
    await _bounded(runtime.run_batch(_events(runtime, ["u1", "u2"], 0)))
    await _until(lambda: "outputs acked" in order)
    if backlog:
        assert order == ["outputs acked"] and runtime.table.handed == []
        return
    assert order == ["encoded", "outputs acked"]
    await _bounded(runtime.run_batch([]))
    assert runtime.table.handed == [[b"u1", b"u2"]]
    for key in (b"u1", b"u2"):
        user = runtime.processor.cache.peek(key)
        assert runtime.table.values[key] == encode_stored(user)
