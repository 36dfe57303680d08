"""The worker's decisions without Faust: a dict stands in for the state table."""

from __future__ import annotations

import dataclasses
import json

import msgpack
import pytest

from engine import Event, Replayer
from schemas.config import load_config
from schemas.outputs import decode_output
from schemas.stored import StoredUser, decode_stored
from schemas.ticks import encode_tick
from streams.runtime.backfill import Backfill
from streams.runtime.processor import EPISODES, Batch, InMessage, Processor, Table, TimePolicy
from tests.streams.test_cli_replay import CONFIG

EVENTS, TICKS = "oracular.events", "oracular.ticks"
TS = 1_767_261_600_000
MIN = 60_000


class DictTable(Table):
    """A fake of the Faust table: one dict per partition, so a wrong partition shows."""

    def __init__(self):
        self.partitions: dict[int, dict[bytes, bytes]] = {}
        self.writes = 0

    def get(self, key, context):
        return self.partitions.get(context, {}).get(key)

    def set(self, key, value, context):
        self.writes += 1
        if value is None:
            self.partitions.get(context, {}).pop(key, None)
        else:
            self.partitions.setdefault(context, {})[key] = value


@pytest.fixture
def config():
    return load_config(CONFIG)


def _message(offset, value, *, key=None, partition=0, topic=EVENTS, ts=None):
    if isinstance(value, dict):
        key = key if key is not None else value.get("user", "").encode()
        value = msgpack.packb(value)
    return InMessage(topic, partition, offset, key, value, ts)


WALL = 4_102_444_800_000  # 2100-01-01: the worker's clock, unless a test sets it


def _run(processor, table, messages, *, caught_up=False, wall=WALL):
    batch = Batch(table, processor.config)
    processor.run_batch(batch, messages, lambda p: caught_up, lambda: wall)
    for key, value, context in batch.writes():
        table.set(key, value, context)
    return [(o.role, o.key, decode_output(o.value)) for o in batch.outputs]


def _processor(config, lateness_ms=10_000, idle_ms=0, max_skew_ms=60_000):
    policy = TimePolicy(lateness_ms=lateness_ms, idle_ms=idle_ms, max_skew_ms=max_skew_ms)
    return Processor(config, events_topic=EVENTS, ticks_topic=TICKS, time=policy)


def test_batch_applies_events_and_stores_each_user_once(config):
    """One read and one write per user per batch; outputs match the offline replay."""
    table, processor = DictTable(), _processor(config)
    events = [
        {"id": "a", "user": "u1", "name": "pricing.viewed", "ts": TS},
        {"id": "b", "user": "u1", "name": "limit.hit", "ts": TS + MIN},
        {"id": "c", "user": "u2", "name": "cancel.viewed", "ts": TS},
    ]
    outputs = _run(processor, table, [_message(i, e) for i, e in enumerate(events)])
    assert table.writes == 2
    replayer = Replayer(config)
    expected = [
        replayer.feed(Event(e["user"], e["ts"], name=e["name"], id=e["id"])) for e in events
    ]
    assert [o[2]["id"] for o in outputs] == ["u1:a", "u1:b", "u2:c"]
    assert [o[2]["intents"] for o in outputs][1]["upgrade"]["p"] == expected[1].predictions[
        "upgrade"
    ].p
    stored = decode_stored(table.partitions[0][b"u1"], config)
    assert stored.state == replayer.states["u1"] and stored.last_offset == 1
    assert processor.counts["applied"] == 3


def test_redelivered_messages_are_skipped_as_redelivered(config):
    """An offset at or below the user's last applied offset is not applied again."""
    table, processor = DictTable(), _processor(config)
    messages = [
        _message(i, {"user": "u1", "name": "pricing.viewed", "ts": TS + i}) for i in range(3)
    ]
    _run(processor, table, messages)
    before, writes = table.partitions[0][b"u1"], table.writes
    outputs = _run(processor, table, messages[1:])  # a redelivery after a crash
    assert outputs == [] and table.partitions[0][b"u1"] == before
    assert processor.counts["redelivered"] == 2 and processor.counts["applied"] == 3
    # The unchanged state is written again, so the changelog catches up with the local store.
    assert table.writes == writes + 1


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (InMessage(EVENTS, 0, 0, b"u1", b"\xc1garbage", None), "not valid msgpack or JSON"),
        (
            InMessage(
                EVENTS, 0, 0, b"u1", msgpack.packb({"user": "u1", "name": 3, "ts": TS}), None
            ),
            "field 'name' must be a non-empty string",
        ),
        (
            InMessage(EVENTS, 0, 0, b"u1", msgpack.packb({"name": "x", "ts": TS}), None),
            "field 'user' is missing",
        ),
        (
            InMessage(
                EVENTS, 0, 0, b"u1", msgpack.packb({"user": "u1", "type": "logout", "ts": TS}), None
            ),
            "field 'type' must be one of",
        ),
        (InMessage(EVENTS, 0, 0, b"u1", b"{" + b" " * 70_000 + b"}", None), "the limit is 65536"),
        (
            InMessage(
                EVENTS,
                0,
                0,
                b"\xff\xfe",
                msgpack.packb({"user": "u1", "name": "x", "ts": TS}),
                None,
            ),
            "the message key is not UTF-8",
        ),
        (
            InMessage(
                EVENTS, 0, 0, None, msgpack.packb({"user": "u1", "name": "x", "ts": TS}), None
            ),
            "the message has no key",
        ),
        (
            InMessage(
                EVENTS, 0, 0, b"u2", msgpack.packb({"user": "u1", "name": "x", "ts": TS}), None
            ),
            "is not its user 'u1'",
        ),
        (
            InMessage(
                EVENTS,
                0,
                0,
                b"u1",
                msgpack.packb({"user": "u1", "type": "revealed", "intent": "nope", "ts": TS}),
                None,
            ),
            "unknown intent 'nope'",
        ),
    ],
)
def test_bad_input_is_dead_lettered_with_the_reason_and_the_original_bytes(config, message, reason):
    """Every bad message lands in the DLQ with its reason, origin and bytes; nothing raises."""
    table, processor = DictTable(), _processor(config)
    outputs = _run(processor, table, [message])
    [(role, key, record)] = outputs
    assert role == "dlq" and key == message.key
    assert reason in record["error"]
    assert (record["topic"], record["partition"], record["offset"]) == (EVENTS, 0, 0)
    assert record["value"] == message.value and record["key"] == message.key
    assert processor.counts["dead_lettered"] == 1 and processor.counts["applied"] == 0


def test_segment_identify_is_counted_as_ignored(config):
    """Messages that carry no event are ignored, not dead-lettered."""
    table, processor = DictTable(), _processor(config)
    raw = json.dumps({"type": "identify", "userId": "u1"}).encode()
    assert _run(processor, table, [InMessage(EVENTS, 0, 0, b"u1", raw, None)]) == []
    assert processor.counts["ignored"] == 1


def test_missing_ts_uses_the_record_timestamp(config):
    """The Kafka record timestamp stands in for a missing ts."""
    table, processor = DictTable(), _processor(config)
    _run(processor, table, [_message(0, {"user": "u1", "name": "pricing.viewed"}, ts=TS)])
    assert decode_stored(table.partitions[0][b"u1"], config).state.clock == TS


def _tick(partition=0, sent_at=0, offset=0):
    return InMessage(TICKS, partition, offset, None, encode_tick(sent_at), None)


def test_tick_closes_due_episodes_at_last_event_plus_timeout(config):
    """A caught-up tick closes a silent user's episode at exactly last event + 30m."""
    table, processor = DictTable(), _processor(config, lateness_ms=10_000)
    _run(
        processor,
        table,
        [_message(0, {"user": "u1", "name": "pricing.viewed", "ts": TS})],
        wall=TS,
    )
    deadline = TS + 30 * MIN
    # Not caught up (a backfill): event time alone is the watermark; nothing closes early.
    assert _run(processor, table, [_tick(sent_at=deadline + 10 * MIN)]) == []
    # Caught up and idle, but the clock run on from TS minus the lateness is not past it yet.
    assert _run(processor, table, [_tick(sent_at=deadline + 10_000)], caught_up=True) == []
    outputs = _run(processor, table, [_tick(sent_at=deadline + 10_001)], caught_up=True)
    [(role, key, episode)] = outputs
    assert (role, key) == ("episodes", b"u1")
    assert (episode["id"], episode["closed_at"], episode["reason"]) == (
        f"u1:{TS}/1",
        deadline,
        "timeout",
    )
    assert decode_stored(table.partitions[0][b"u1"], config).state.episode.started_at is None
    assert _run(processor, table, [_tick(sent_at=deadline + 60 * MIN)], caught_up=True) == []
    assert processor.counts["closed_by_timer"] == 1


def _run_capped(processor, table, messages, *, caught_up=True, wall=WALL):
    """`_run` through `processor.batch`, which carries the processor's timer-close limit."""
    batch = processor.batch(table)
    processor.run_batch(batch, messages, lambda p: caught_up, lambda: wall)
    for key, value, context in batch.writes():
        table.set(key, value, context)
    return [(o.role, o.key, o.value) for o in batch.outputs]


def test_a_mass_of_due_closes_spreads_over_ticks_with_the_same_outputs(config):
    """Limited to 2 timer closes a batch, 5 due episodes close over three ticks, each at its
    own deadline: the same records, byte for byte, as one unlimited tick publishes."""
    events = [
        _message(i, {"id": f"e{i}", "user": f"u{i}", "name": "pricing.viewed", "ts": TS + i})
        for i in range(5)
    ]
    late = TS + 30 * MIN + 10 * MIN
    policy = TimePolicy(lateness_ms=10_000, idle_ms=0)
    capped = Processor(
        config, events_topic=EVENTS, ticks_topic=TICKS, time=policy, timer_closes_per_batch=2
    )
    whole = Processor(config, events_topic=EVENTS, ticks_topic=TICKS, time=policy)
    capped_table, whole_table = DictTable(), DictTable()
    _run_capped(capped, capped_table, events, caught_up=False, wall=TS)
    _run_capped(whole, whole_table, events, caught_up=False, wall=TS)
    per_tick, wanted_more = [], []
    for n in range(4):
        per_tick.append(_run_capped(capped, capped_table, [_tick(sent_at=late + n, offset=n)]))
        wanted_more.append(set(capped.more_due))
    assert wanted_more == [{0}, {0}, set(), set()]  # the worker ticks partition 0 again at once
    # A backfill is finished by the third tick, not by the two that left closes due.
    assert capped.ticks_left_due == {(0, 0), (0, 1)}
    assert [len(outputs) for outputs in per_tick] == [2, 2, 1, 0]
    assert capped.more_due == set()  # the last ticks closed everything due: no tick again
    [once] = [_run_capped(whole, whole_table, [_tick(sent_at=late)])]
    assert sorted(o for outputs in per_tick for o in outputs) == sorted(once)
    assert capped.counts["closed_by_timer"] == whole.counts["closed_by_timer"] == 5


def test_timer_close_then_event_equals_the_lazy_close(config):
    """Closing by tick, then the next event, stores what observe's lazy close stores."""
    events = [
        {"id": "a", "user": "u1", "name": "pricing.viewed", "ts": TS},
        {"id": "b", "user": "u1", "name": "limit.hit", "ts": TS + 45 * MIN},
    ]
    live, lazy = DictTable(), DictTable()
    processor = _processor(config, lateness_ms=0)
    out_live = _run(processor, live, [_message(0, events[0])], wall=TS)
    out_live += _run(processor, live, [_tick(sent_at=TS + 40 * MIN)], caught_up=True)
    out_live += _run(processor, live, [_message(1, events[1])])
    out_lazy = _run(_processor(config), lazy, [_message(i, e) for i, e in enumerate(events)])
    assert sorted(o[2]["id"] for o in out_live) == sorted(o[2]["id"] for o in out_lazy)
    assert {o[2]["id"]: o[2] for o in out_live} == {o[2]["id"]: o[2] for o in out_lazy}
    assert {k: _state(v, config) for k, v in live.partitions[0].items()} == {
        k: _state(v, config) for k, v in lazy.partitions[0].items()
    }


def test_a_moved_deadline_is_filed_again_once_its_old_entry_is_due(config):
    """Later events of a user push no heap entry (the heap stays one entry per episode); a
    tick past the first deadline but before the moved one closes nothing, files the entry
    at the new deadline, and a tick past that closes the episode there, once."""
    table, processor = DictTable(), _processor(config, lateness_ms=0)
    events = [
        _message(i, {"id": f"e{i}", "user": "u1", "name": "pricing.viewed", "ts": TS + i * MIN})
        for i in range(5)
    ]
    _run(processor, table, events, wall=TS + 4 * MIN)
    moved = TS + 4 * MIN + 30 * MIN
    assert processor.open == {0: {b"u1": moved}}
    assert processor.deadlines[0] == [(TS + 30 * MIN, b"u1")]
    assert _run(processor, table, [_tick(sent_at=moved)], caught_up=True) == []
    assert processor.deadlines[0] == [(moved, b"u1")]
    [(role, _, episode)] = _run(processor, table, [_tick(sent_at=moved + 1)], caught_up=True)
    assert (role, episode["closed_at"], episode["reason"]) == ("episodes", moved, "timeout")
    assert processor.open == {0: {}} and processor.deadlines[0] == []
    assert _run(processor, table, [_tick(sent_at=moved + 60 * MIN)], caught_up=True) == []


def _state(raw, config):
    stored = decode_stored(raw, config)
    return stored.state, stored.inputs, stored.episodes, stored.last_offset


def test_deadline_index_is_rebuilt_from_the_table(config):
    """After recovery, a fresh processor finds the open episodes in the stored values."""
    table, first = DictTable(), _processor(config)
    _run(
        first,
        table,
        [
            _message(0, {"user": "u1", "name": "x", "ts": TS}),
            _message(0, {"user": "u2", "name": "x", "ts": TS}, partition=1),
        ],
    )
    second = _processor(config)
    items = [(k, v) for part in table.partitions.values() for k, v in part.items()]
    second.rebuild(items, wall_ms=TS)
    assert second.open == {0: {b"u1": TS + 30 * MIN}, 1: {b"u2": TS + 30 * MIN}}
    assert second.clocks[1].event_time == TS
    outputs = _run(second, table, [_tick(1, sent_at=TS + 31 * MIN)], caught_up=True)
    assert [o[2]["id"] for o in outputs] == [f"u2:{TS}/1"]


def test_a_real_gap_in_offsets_is_counted_and_the_input_applied(config):
    """Offsets missing from the log (transactions, compaction, retention) lose nothing."""
    table, processor = DictTable(), _processor(config)
    events = [
        {"id": f"e{i}", "user": "u1", "name": "pricing.viewed", "ts": TS + i * MIN}
        for i in range(5)
    ]
    outputs = _run(processor, table, [_message(i, events[i]) for i in (0, 1, 3, 4)])
    assert [o[2]["id"] for o in outputs] == ["u1:e0", "u1:e1", "u1:e3", "u1:e4"]
    assert processor.counts["gaps"] == 1 and processor.counts["applied"] == 4
    assert decode_stored(table.partitions[0][b"u1"], config).last_offset == 4


def test_an_older_offset_leaves_the_next_offset_where_it_is(config):
    """A redelivered input (below the next offset) neither counts a gap nor moves it back."""
    table, processor = DictTable(), _processor(config)
    event = {"id": "e0", "user": "u1", "name": "pricing.viewed", "ts": TS}
    _run(processor, table, [_message(i, {**event, "id": f"e{i}"}) for i in (0, 1, 2)])
    _run(processor, table, [_message(1, {**event, "id": "e1"})])
    assert processor.next_offset[0] == 3
    assert processor.counts["gaps"] == 0 and processor.counts["redelivered"] == 1


def test_stored_user_fields_are_in_the_order_the_processor_builds_them():
    """`Processor._commit` and `close_due` build `StoredUser` by position (keywords cost
    twice the call, once per input): a field added or moved must be placed there too."""
    assert [f.name for f in dataclasses.fields(StoredUser)] == [
        "state",
        "partition",
        "last_offset",
        "inputs",
        "episodes",
        "clock",
        "timer_close",
        "tick_offset",
        "recent",
        "packed",
    ]


def test_expect_keeps_the_first_known_offset(config):
    """After assignment the committed offset is expected; a known partition keeps its own."""
    processor = _processor(config)
    processor.expect(0, 10)
    processor.expect(0, 3)
    assert processor.next_offset[0] == 10


def test_a_repair_tick_writes_the_named_users_again_unchanged(config):
    """A worker frozen while writing its changelog names the users it wrote in a tick: the
    partition's owner writes the ones it holds again, unchanged (so their newest state is
    the last changelog record), and leaves users it does not hold alone."""
    table, processor = DictTable(), _processor(config)
    _run(
        processor,
        table,
        [_message(0, {"id": "a", "user": "u1", "name": "pricing.viewed", "ts": TS})],
    )
    before, writes = table.partitions[0][b"u1"], table.writes
    repair = InMessage(TICKS, 0, 5, None, encode_tick(TS, [b"u1", b"stranger"]), None)
    assert _run(processor, table, [repair]) == []
    assert table.writes == writes + 1  # u1 again; nothing for the user it does not hold
    assert b"stranger" not in table.partitions[0]
    again = decode_stored(table.partitions[0][b"u1"], config)
    assert again.state == decode_stored(before, config).state
    assert processor.counts["rewritten"] == 1 and processor.counts["ticks"] == 1


def test_ticks_decode_with_or_without_repairs():
    from schemas.ticks import Tick, decode_tick

    assert encode_tick(7) == msgpack.packb([7])  # the format of ticks already in topics
    assert decode_tick(encode_tick(7, [b"k", b"l"])) == Tick(7, [b"k", b"l"])
    assert decode_tick(encode_tick(7)) == Tick(7, [])
    for junk in (b"", None, b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([])):
        assert decode_tick(junk) == Tick()
    assert decode_tick(msgpack.packb([1, "x"])) == Tick(1, [])
    assert decode_tick(msgpack.packb(["x", [b"k", 3]])) == Tick(None, [b"k"])


def test_inputs_are_counted_per_partition_and_closed_episodes_per_reason(config):
    """Each input's outcome is counted in total and on its partition; each closed episode by
    its reason, the timer's closes included (the worker's /metrics labels them so)."""
    table, processor = DictTable(), _processor(config, lateness_ms=10_000)
    identify = json.dumps({"type": "identify", "userId": "u3"}).encode()
    messages = [
        _message(0, {"id": "a", "user": "u1", "name": "pricing.viewed", "ts": TS}),
        _message(1, {"id": "b", "user": "u1", "type": "end", "ts": TS + MIN}),
        _message(0, {"id": "c", "user": "u2", "name": "limit.hit", "ts": TS}, partition=3),
        _message(1, {"id": "d", "user": "u2", "name": "limit.hit", "ts": TS - MIN}, partition=3),
        _message(2, b"\xc1garbage", key=b"u2", partition=3),
        InMessage(EVENTS, 3, 3, b"u3", identify, None),
    ]
    _run(processor, table, messages, wall=TS)
    _run(processor, table, messages[2:3], wall=TS)  # a redelivery on partition 3
    deadline = TS + 30 * MIN
    _run(processor, table, [_tick(partition=3, sent_at=deadline + 10_001)], caught_up=True)
    assert processor.by_partition == {
        ("applied", 0): 2,
        ("applied", 3): 2,
        ("late", 3): 1,
        ("dead_lettered", 3): 1,
        ("ignored", 3): 1,
        ("redelivered", 3): 1,
    }
    for outcome in ("applied", "late", "dead_lettered", "ignored", "redelivered"):
        total = sum(n for (name, _), n in processor.by_partition.items() if name == outcome)
        assert processor.counts[outcome] == total, outcome
    assert processor.closed_by_reason == {"end": 1, "timeout": 1}
    assert processor.counts["episodes"] == 2 and processor.counts["closed_by_timer"] == 1


def test_held_users_are_read_by_later_batches_never_evicted_and_written_once(config):
    """The worker's held states (`Processor.hold`): the next batch reads a held user's newest
    state, the cache never evicts one, and the write takes each user once, newest state."""
    processor = Processor(config, events_topic=EVENTS, ticks_topic=TICKS, cache_users=4)
    table = DictTable()

    def apply(users, first_offset):
        batch = processor.batch(table)
        messages = [
            _message(first_offset + i, {"user": u, "ts": TS + i, "name": "limit.hit"})
            for i, u in enumerate(users)
        ]
        processor.run_batch(batch, messages, lambda p: False, lambda: WALL)
        processor.stage(batch)

    apply(["u1", "u2"], 0)
    apply(["u1", "u3"], 2)
    cache = processor.cache
    assert set(cache.unwritten) == {b"u1", b"u2", b"u3"} and table.writes == 0
    for n in range(10):  # others pass through the cache: only written users are evicted
        cache.put(f"x{n}".encode(), cache.peek(b"u2"))
    assert set(cache.unwritten) == {b"u1", b"u2", b"u3"}
    assert len(cache.users) + len(cache.unwritten) == 4
    stored: list[tuple[bytes, bytes, int]] = []
    writes = processor.commit(stored.extend)
    assert stored == writes and [key for key, _, _ in writes] == [b"u1", b"u2", b"u3"]
    assert decode_stored(writes[0][1], config).inputs == 2  # both batches' inputs
    assert not cache.unwritten
    assert cache.peek(b"u1") is not None and cache.peek(b"u1").inputs == 2
    apply(["u4"], 4)
    processor.forget([0])  # the partition revoked: held users go too
    assert not cache.unwritten and cache.peek(b"u4") is None


def test_a_backfill_partition_is_finished_only_by_a_tick_at_its_end_that_closed_everything(
    config,
):
    """A bounded run, as the runtime wires it (`Backfill.advance` after each written batch,
    told `Processor.took_tick_at_end`): partition 0 stops at offset 3. A tick that comes in
    the same batch before the partition's last input closes nothing (the partition is not at
    its end yet), though the partition is caught up once the batch is written: it must not
    finish the partition, or the backfill ends with its episodes never closed. Then, capped
    at 2 closes a batch, the ticks at the end close the 3 users' episodes over two batches:
    only the second finishes the backfill."""
    ended: list[str] = []
    run = Backfill(start={0: 0}, stop={0: 3}, done=lambda: ended.append("done"))
    policy = TimePolicy(lateness_ms=10_000, idle_ms=0, hold_until_end=True)
    processor = Processor(
        config,
        events_topic=EVENTS,
        ticks_topic=TICKS,
        time=policy,
        stop_offsets=run.stop,
        timer_closes_per_batch=2,
    )
    table, closes = DictTable(), []
    late = TS + 60 * MIN

    def batch(messages):
        b = processor.batch(table)
        processor.run_batch(
            b, messages, lambda p: run.caught_up(p, processor.next_offset), lambda: late
        )
        for key, value, context in b.writes():
            table.set(key, value, context)
        closes.extend(o for o in b.outputs if o.role == EPISODES)
        run.advance(messages, dict(processor.next_offset), TICKS, processor.took_tick_at_end)

    events = [
        _message(i, {"id": f"e{i}", "user": f"u{i}", "name": "pricing.viewed", "ts": TS + i})
        for i in range(3)
    ]
    batch([events[0], events[1], _tick(sent_at=late, offset=0), events[2]])
    assert (closes, ended) == ([], []), "a tick before the end finished the partition"
    batch([_tick(sent_at=late, offset=1)])
    assert (len(closes), ended) == (2, []), "a tick that left closes due finished it"
    batch([_tick(sent_at=late, offset=2)])
    assert (len(closes), ended) == (3, ["done"])
    assert processor.ticks_at_end == set() and processor.ticks_left_due == set()
