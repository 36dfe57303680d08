"""Reads (and the few writes) of Faust's and aiokafka's private state: the worker's only ones.
Offsets, positions, acks, the RocksDB store by partition, the changelog's persisted offset,
the group membership heartbeat, what Faust's log formatter makes of an argument.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, NamedTuple, cast

import rocksdict
from aiokafka import errors as kafka_errors
from aiokafka.protocol.group import HeartbeatRequest
from faust.types import TP

from streams.faust.stores import faults_of, scan
from streams.faust.upstream import ISOLATION_LEVEL


class _Delivered(NamedTuple):
    position: int
    read_offset: int | None


def _aiokafka_consumer(consumer: Any) -> Any | None:
    thread = getattr(consumer, "_thread", None)
    return getattr(thread, "_consumer", None)


def _assignment(client: Any) -> Any | None:
    """The aiokafka consumer `client`'s current assignment, or None."""
    subscription = client._subscription.subscription
    return None if subscription is None else subscription.assignment


def _partition_state(consumer: Any, tp: TP) -> Any | None:
    client = _aiokafka_consumer(consumer)
    assignment = None if client is None else _assignment(client)
    return None if assignment is None else assignment.state_value(tp)


def fetch_position(consumer: Any, tp: TP) -> int | None:
    """aiokafka's position for `tp`: every record below it has been returned to Faust."""
    state = _partition_state(consumer, tp)
    if state is None or not state.has_valid_position:
        return None
    return int(state.position)


def _fetched_after_seeks(consumer: Any, tp: TP, offset: int) -> bool:
    """False when the consumer's position moved back to `offset` or before (a seek), or `tp`
    is no longer assigned: the record was fetched before that and will be returned again.

    True when the position is unknown because the consumer is not aiokafka's (no check).
    """
    # The client looked up once (this runs twice for every record delivered).
    client = _aiokafka_consumer(consumer)
    if client is None:
        return True
    assignment = _assignment(client)
    state = None if assignment is None else assignment.state_value(tp)
    return state is not None and state.has_valid_position and state.position > offset


def _keep_delivered_positions(consumer: Any) -> None:
    """After a fetched batch was delivered whole: remember each partition's position."""
    client = _aiokafka_consumer(consumer)
    if client is None:
        return
    assignment = _assignment(client)
    kept: dict[TP, _Delivered] = {}
    if assignment is not None:
        read = consumer._read_offset
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if state is not None and state.has_valid_position:
                kept[tp] = _Delivered(int(state.position), read.get(tp))
    consumer._oracular_delivered = kept


def ack_all(app: Any, events: list[Any]) -> None:
    """Ack `events` (taken with `take_batches`) as `Stream.ack` does each, without a coroutine
    per event: their offsets may be committed once every earlier one is acked too."""
    on_message_out = app.sensors.on_message_out
    for event in events:
        if event.ack():
            message = event.message
            on_message_out(message.tp, message.offset, message)


def committed_offset(consumer: Any, tp: TP) -> int | None:
    """The offset the consumer last committed for `tp` (or found committed when assigned)."""
    value = consumer._committed_offset.get(tp)
    return None if value is None else int(value)


def read_offset(consumer: Any, tp: TP) -> int | None:
    """The next offset of `tp` the fetch loop will deliver (one past the last delivered)."""
    value = consumer._read_offset.get(tp)
    return None if value is None else int(value)


def delivered_through(consumer: Any, tp: TP) -> int | None:
    """An offset below which every record of `tp` was delivered to the streams or is not
    data (transaction markers, aborted records); None when not known right now.

    Known once the fetch loop has delivered a whole fetched batch and has not delivered or
    sought `tp` since.
    """
    kept = getattr(consumer, "_oracular_delivered", {}).get(tp)
    if kept is None or kept.read_offset != consumer._read_offset.get(tp):
        return None
    return int(kept.position)


def end_offset(consumer: Any, tp: TP) -> int | None:
    """The offset `tp` is read to when caught up: the last stable offset when reading
    committed records (records past it may still be aborted), else the high-water mark.
    None until the consumer has fetched `tp`.
    """
    client = _aiokafka_consumer(consumer)
    try:
        if client is not None and client._isolation_level == ISOLATION_LEVEL:
            stable = client.last_stable_offset(tp)
            if stable is not None and stable >= 0:
                return int(stable)
        value = consumer.highwater(tp)
    except (AssertionError, KeyError, AttributeError):  # not fetched yet, or not started
        return None
    return None if value is None else int(value)


def open_partitions(table: Any) -> set[int]:
    """The partitions whose local store (RocksDB database) `table` has open on this worker."""
    return set(getattr(table.data, "_dbs", {}))


def open_databases(table: Any) -> dict[int, Any]:
    """`table`'s open local stores (RocksDB databases) by partition."""
    return dict(getattr(table.data, "_dbs", {}))


def store_items(db: Any, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
    """Up to `limit` (key, value) pairs of the RocksDB database `db`, in key order, from the
    first key after `after` (from the start when None); read now, not from a snapshot.
    Checksums are verified; a corrupt block raises StoreError instead of ending the data."""
    start = None if after is None else after + b"\0"  # the least key greater than `after`
    return list(itertools.islice(scan(db, start), limit))


def store_scan(table: Any, partition: int) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of `table`'s local store of `partition` (Faust's offset key left
    out), checksums verified: StoreError when the store is corrupt, never a short list."""
    store = table.data
    offset_key = store.offset_key
    with faults_of(partition):
        db = store._db_for_partition(partition)
        return [(k, v) for k, v in scan(db) if k != offset_key]


def store_active_items(table: Any) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of `table`'s local stores of the partitions active here, as
    `table.items()` gives them, but checksums verified and a corrupt store raising
    StoreError (Faust's iteration ends at a bad block as if the data ended there)."""
    actives = table.app.assignor.assigned_actives()
    topic = table.changelog_topic_name
    for partition in sorted(table.data._dbs):
        if TP(topic, partition) in actives:
            yield from store_scan(table, partition)


def store_path(table: Any, partition: int) -> Path:
    """Where `table`'s local store (RocksDB database) of `partition` lives."""
    return Path(table.data.partition_path(partition))


def store_get(table: Any, partition: int, key: bytes) -> bytes | None:
    """Read `key` from `table`'s local store (RocksDB) of `partition`: one RocksDB read.

    Faust's `table.get(key)` with an event of that partition as the current event reads the
    same database, but twice for a present key (`in`, then the value) and through its sensors,
    its key index (a lock) and a KeyError for a missing key: several times the cost of this
    read, per read of a user the cache does not hold."""
    with faults_of(partition):
        value: bytes | None = table.data._db_for_partition(partition).get(key)
    return value


def store_put_all(table: Any, partition: int, items: list[tuple[bytes, bytes | None]]) -> None:
    """Write `items` (key, value; None deletes the key) to `table`'s local store of
    `partition` only (no changelog record), in one RocksDB write batch: atomic, and one call
    into RocksDB instead of one per key (Faust's `Store._set`, which also keeps a key ->
    partition index that reads with a current event, the worker's only reads, never use)."""
    batch = rocksdict.WriteBatch(raw_mode=True)  # raw bytes, as Faust opens the databases
    for key, value in items:
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    with faults_of(partition):
        table.data._db_for_partition(partition).write(batch)


def set_persisted_offset(table: Any, tp: TP, offset: int) -> None:
    """Record that `table`'s local store holds its changelog partition `tp` up to `offset`
    (a restart with the datadir kept reads the changelog from there)."""
    with faults_of(tp.partition):
        table.data.set_persisted_offset(tp, offset)


def wrap_changelog_apply(
    table: Any, wrap: Callable[[Callable[[Any], None]], Callable[[Any], None]]
) -> None:
    """Replace how `table` applies a batch of changelog records (restores and standbys) by
    `wrap(the current way)`."""
    table.apply_changelog_batch = wrap(table.apply_changelog_batch)


MEMBER: Final = "member"


LOST: Final = "lost"


REBALANCING: Final = "rebalancing"


UNKNOWN: Final = "unknown"


_HEARTBEAT_ANSWERS: Final = {
    kafka_errors.NoError: MEMBER,
    kafka_errors.IllegalGenerationError: LOST,
    kafka_errors.UnknownMemberIdError: LOST,
    kafka_errors.RebalanceInProgressError: REBALANCING,
}


async def membership(consumer: Any) -> str:
    """Ask the group coordinator, now, whether this consumer is a member of the current
    generation: one heartbeat with the consumer's generation and member id.

    `MEMBER`: the broker accepted it and the group is stable, so nobody else owns this
    consumer's partitions. `LOST`: the broker no longer knows this member or generation (it
    was evicted; aiokafka rejoins). `REBALANCING`: a rebalance is under way (aiokafka rejoins).
    `UNKNOWN`: no answer (coordinator moving, broker down, no aiokafka consumer). The
    heartbeat runs where aiokafka's coordinator lives: the consumer's thread, or the worker's
    loop (`ConsumerOnWorkerLoop`), through Faust's `call_thread` either way.
    """
    thread = getattr(consumer, "_thread", None)
    client = _aiokafka_consumer(consumer)
    coordinator = getattr(client, "_coordinator", None)
    if thread is None or coordinator is None:
        return UNKNOWN

    async def heartbeat() -> str:
        if coordinator.generation < 0 or coordinator.member_id == "":
            return LOST  # aiokafka already learned it was evicted and reset its generation
        if coordinator.coordinator_id is None:
            return UNKNOWN
        request = HeartbeatRequest(
            coordinator.group_id, coordinator.generation, coordinator.member_id
        )
        try:
            response = await coordinator._send_req(request)
        except kafka_errors.KafkaError:
            return UNKNOWN
        answer = _HEARTBEAT_ANSWERS.get(kafka_errors.for_code(response.error_code), UNKNOWN)
        if answer in (LOST, REBALANCING):
            coordinator.request_rejoin()  # as aiokafka's own heartbeat does on these answers
        return answer

    return cast(str, await thread.call_thread(heartbeat))


def abandon(consumer: Any, events: Any) -> None:
    """Forget `events` as in flight without acknowledging them.

    For a batch the worker must not apply (it lost its partitions while frozen): Faust's
    rebalance waits until every delivered message is acknowledged (`wait_empty`), and an
    acknowledgement could let a commit pass input nobody applied. Taken off the unacked set
    instead, the messages hold up nothing and commit nothing; the partitions' owners re-read
    them from the committed offsets.
    """
    unacked = consumer._unacked_messages
    for event in events:
        unacked.discard(event.message)


def faust_log_argument(arg: Any, record: logging.LogRecord) -> Any:
    """What Faust's own log formatter makes of a log record's argument: a boxed table for a
    set of topics or partitions, else None (`faust.worker.format_log_arguments`, which Faust
    registers with mode's logging; mode applies its formatters in no fixed order, so a
    formatter that rewrites Faust's tables calls it first: `streams.runtime.quiet_logs`)."""
    from faust.worker import format_log_arguments  # noqa: PLC0415 (the worker module is big)

    return format_log_arguments(arg, record)
