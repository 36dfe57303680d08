"""Real producers on the processor alone: a retried event counts once, a clock far ahead
moves nobody, and the deduplication survives a restore and equals the replay."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import END_OF_TIME, EngineConfig, Event
from engine.dedupe import ENTRY_BYTES, NO_IDS, forget_before, remember
from schemas.files import read_sorted_events
from schemas.outputs import decode_output
from schemas.stored import decode_stored, id_digest
from streams.runtime.processor import Processor, TimePolicy
from streams.tools.replay import replay_outputs

from .test_processor import EVENTS, MIN, TICKS, TS, DictTable, _message, _run
from .test_time import CONFIG, NAMES

HOUR = 60 * MIN
DAY = 24 * HOUR


def _config(**extra) -> EngineConfig:
    return EngineConfig.from_dict({**CONFIG.to_dict(), **extra})


def _processor(config: EngineConfig) -> Processor:
    policy = TimePolicy(lateness_ms=MIN, idle_ms=0, max_skew_ms=MIN)
    return Processor(config, events_topic=EVENTS, ticks_topic=TICKS, time=policy)


def _value(event: Event) -> dict:
    value = {"user": event.user, "name": event.name, "ts": event.at}
    if event.id is not None:
        value["id"] = event.id
    return value


def _feed(processor, table, events, *, first_offset=0, record=lambda e: e.at):
    """Each event in its own batch at its offset, its record stamped `record(event)`, the
    worker's clock at the record's time. Returns the outputs."""
    outputs = []
    for n, event in enumerate(events):
        stamp = record(event)
        message = _message(first_offset + n, _value(event), ts=stamp)
        outputs += _run(processor, table, [message], wall=stamp)
    return outputs


def _finish(processor, table):
    """The end of time: close every open episode, as the replay's default `--until` does."""
    batch = processor.batch(table)
    processor.close_due(batch, _message(0, b"", key=None, topic=TICKS), END_OF_TIME)
    for key, value, context in batch.writes():
        table.set(key, value, context)
    return [(o.role, o.key, decode_output(o.value)) for o in batch.outputs]


def _by_id(outputs):
    return {message["id"]: message for role, _, message in outputs if role != "dlq"}


def _replayed(config, events, clock=END_OF_TIME // 2):
    outputs, run = replay_outputs(config, events, clock_ms=clock)
    by_id = {o.message["id"]: o.message for o in outputs if o.role != "dlq"}
    return by_id, run


def _stream(seed: int, users: int = 6, events: int = 120) -> list[Event]:
    rng = random.Random(seed)
    at = TS
    out = []
    for n in range(events):
        at += rng.choice((5_000, 40_000, 3 * MIN, 45 * MIN))
        user = f"u{rng.randrange(users)}"
        out.append(Event(user, at, name=rng.choice(NAMES), id=f"e{n}"))
    return out


def _with_retries(events: list[Event], seed: int) -> list[Event]:
    """Every fifth event sent again with its id: half right after it, half 30 events later."""
    rng = random.Random(seed)
    out = list(events)
    for n in range(len(events) - 1, -1, -5):
        later = n + 1 if rng.random() < 0.5 else min(n + 30, len(events))
        out.insert(later, events[n])
    return out


def test_a_retried_event_counts_once_at_once_and_later():
    """5 copies in 6 inputs changed nothing: same outputs and states as the stream without
    them, counted `duplicate_id`, and no output published for a copy."""
    config = _config()
    events = _stream(seed=1)
    retried = _with_retries(events, seed=2)
    copies = len(retried) - len(events)
    table, processor = DictTable(), _processor(config)
    outputs = _feed(processor, table, retried)
    outputs += _finish(processor, table)
    expected, run = _replayed(config, events)
    assert processor.counts["duplicate_id"] == copies > 20
    assert processor.counts["applied"] == len(events)
    assert processor.counts["late"] == 0  # a later copy is not applied at the user's last time
    assert _by_id(outputs) == expected
    assert len([o for o in outputs if o[0] != "dlq"]) == len(expected)  # nothing sent twice
    stored = {k.decode(): decode_stored(v, config).state for k, v in table.partitions[0].items()}
    assert stored == run.states()
    # The replay of the stream with its copies decides exactly the same.
    replayed_with_copies, with_copies = _replayed(config, retried)
    assert replayed_with_copies == expected and with_copies.counts["duplicate_id"] == copies


def test_without_ids_or_with_the_window_off_every_copy_counts_again():
    """The documented limits: an event without an id cannot be recognised, and
    `dedupeWindow: 0` switches deduplication off."""
    events = [
        Event("u1", TS, name="pricing.viewed", id="a"),
        Event("u1", TS + MIN, name="limit.hit"),
    ]
    for config, copy in ((_config(), events[1]), (_config(dedupeWindow=0), events[0])):
        table, processor = DictTable(), _processor(config)
        _feed(processor, table, [*events, copy])
        assert processor.counts["duplicate_id"] == 0 and processor.counts["applied"] == 3


def test_a_copy_after_the_window_is_applied_again_as_late():
    """The window is event time of the user: a copy arriving after the user's clock moved
    more than `dedupeWindow` past the original is a new input (applied at the user's last
    time, counted late)."""
    config = _config(dedupeWindow="1h")
    first = Event("u1", TS, name="pricing.viewed", id="a")
    events = [
        first,
        Event("u1", TS + HOUR, name="page.viewed", id="b"),  # exactly the window: remembered
        first,
        Event("u1", TS + HOUR + 1, name="page.viewed", id="c"),  # now `a` is forgotten
        first,
    ]
    table, processor = DictTable(), _processor(config)
    _feed(processor, table, events, record=lambda e: TS + 2 * HOUR)
    assert processor.counts["duplicate_id"] == 1
    assert processor.counts["applied"] == 4 and processor.counts["late"] == 1
    user = decode_stored(table.partitions[0][b"u1"], config)
    assert len(user.recent) == 3  # b, c and the late copy of a


def test_more_ids_than_the_bound_forget_the_oldest_early_and_count_them():
    """A user sending more distinct ids inside the window than `dedupeMaxIds` keeps the
    newest; a retry of a forgotten one is applied again, and each forgetting is counted."""
    config = _config(dedupeMaxIds=3)
    events = [Event("u1", TS + n * 1000, name="page.viewed", id=f"e{n}") for n in range(5)]
    table, processor = DictTable(), _processor(config)
    _feed(processor, table, [*events, events[4], events[1]], record=lambda e: TS + 10_000)
    assert processor.counts["ids_forgotten_early"] == 3  # e0, e1, then e2 (for e1's copy)
    assert processor.counts["duplicate_id"] == 1  # e4's copy; e1's was forgotten early
    assert processor.counts["applied"] == 6
    user = decode_stored(table.partitions[0][b"u1"], config)
    assert len(user.recent) == 3 and len(user.recent.hashes) == 3 * ENTRY_BYTES


def test_deduplication_survives_a_restart():
    """The ids live in the stored state: a new processor (a restart, a rebalance, a restore)
    on the same table recognises a retry of an id applied before it started."""
    config = _config()
    events = _stream(seed=3, events=40)
    table = DictTable()
    _feed(_processor(config), table, events)
    restarted = _processor(config)
    copies = events[::7]
    outputs = _feed(restarted, table, copies, first_offset=len(events))
    assert outputs == [] and restarted.counts["duplicate_id"] == len(copies)


def test_an_event_dated_2036_changes_nothing_for_its_user():
    """The issue's case: one event from a device clock ten years ahead, then normal events.
    The user ends with the same episodes and p as without it; the event is dead-lettered
    with its skew, live (by its record's timestamp) and in the replay (by the run's clock)."""
    config = _config()
    now = TS + 2 * HOUR
    future = Event("u1", 2_082_758_400_000, name="pricing.viewed", id="wrong-clock")  # 2036
    normal = [Event("u1", TS + n * 10 * MIN, name=NAMES[n % 3], id=f"n{n}") for n in range(1, 12)]
    events = [normal[0], future, *normal[1:]]
    table, processor = DictTable(), _processor(config)
    outputs = _feed(processor, table, events, record=lambda e: min(e.at, now))
    outputs += _finish(processor, table)
    letters = [message for role, _, message in outputs if role == "dlq"]
    assert len(letters) == 1 and "2036-01-01T00:00:00.000Z runs" in letters[0]["error"]
    assert processor.counts["clock_ahead"] == 1 and processor.counts["late"] == 0
    expected, run = _replayed(config, normal)
    assert _by_id(outputs) == expected
    live_state = decode_stored(table.partitions[0][b"u1"], config).state
    assert live_state == run.states()["u1"]
    assert live_state.clock == normal[-1].at + 30 * MIN  # its last episode timed out; not 2036
    replay_with_it, with_it = _replayed(config, events, clock=now)
    assert replay_with_it == expected and with_it.counts["clock_ahead"] == 1


@pytest.mark.parametrize(
    ("record", "clock", "dead"),
    [
        (TS, TS, False),  # on time
        (TS - MIN, TS, False),  # exactly the skew ahead of its record: still applied
        (TS - MIN - 1, TS, True),  # 1 ms more
        (TS, TS - MIN - 1, True),  # the record is stamped ahead, the worker's clock is not
        (None, TS - MIN - 1, True),  # no record timestamp: the clock decides
        (0, None, False),  # neither known: nothing to bound by
    ],
)
def test_the_bound_is_the_earlier_of_the_record_and_the_clock(record, clock, dead):
    config = _config()
    processor = _processor(config)
    message = _message(0, {"user": "u1", "name": "page.viewed", "ts": TS}, ts=record)
    batch = processor.batch(DictTable())
    processor.apply(batch, message, Event("u1", TS, name="page.viewed"), clock)
    assert processor.counts["dead_lettered"] == dead and processor.counts["applied"] == (not dead)


# --- the record of recent ids -------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5_000)), min_size=1, max_size=60),
    window=st.integers(0, 20_000),
    max_ids=st.integers(1, 12),
)
def test_remembered_ids_are_the_newest_inside_the_window(steps, window, max_ids):
    """Against a plain list model: after each step the record holds exactly the newest ids
    applied within `window` of the latest time, at most `max_ids` of them, in order, and
    counts as early every id it dropped while still inside the window."""
    recent, model, at = NO_IDS, [], 0
    for key, gap in steps:
        at += gap
        digest = id_digest(f"id-{key}")
        recent, early = remember(recent, digest, at, window_ms=window, max_ids=max_ids)
        inside = [(d, t) for d, t in model if t >= at - window]
        model = [*inside, (digest, at)]
        assert early == max(len(model) - max_ids, 0)
        model = model[len(model) - min(len(model), max_ids) :]
        assert [recent.time_at(i) for i in range(len(recent))] == [t for _, t in model]
        assert recent.hashes == b"".join(d for d, _ in model)
        assert all(d in recent for d, _ in model)
    assert forget_before(recent, at + 1) == NO_IDS or len(forget_before(recent, at + 1)) == 0


def test_a_hash_found_across_two_entries_is_not_a_match():
    """Membership looks at whole 8-byte entries only."""
    a, b = b"\x00" * 4 + b"ABCD", b"EFGH" + b"\x00" * 4
    recent, _ = remember(NO_IDS, a, 1, window_ms=10, max_ids=5)
    recent, _ = remember(recent, b, 2, window_ms=10, max_ids=5)
    assert a in recent and b in recent and b"ABCDEFGH" not in recent


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"dedupeWindow": "soon"}, "dedupeWindow"),
        ({"dedupeMaxIds": 0}, "dedupeMaxIds: must be >= 1"),
        ({"dedupeMaxIds": 2.5}, "dedupeMaxIds: must be a whole number"),
        ({"dedupeMaxIds": 100_001}, "dedupeMaxIds: must be <= 100000"),
        ({"dedupeMaxIds": "10"}, "dedupeMaxIds: must be a finite number"),
    ],
)
def test_dedupe_settings_are_validated_with_their_path(value, problem):
    with pytest.raises(Exception, match=problem):
        _config(**value)


def test_dedupe_settings_round_trip_and_stay_out_of_a_default_config():
    assert "dedupeWindow" not in _config().to_dict()
    config = _config(dedupeWindow="2h", dedupeMaxIds=50)
    assert (config.dedupe_window_ms, config.dedupe_max_ids) == (2 * HOUR, 50)
    assert EngineConfig.from_dict(config.to_dict()) == config


def test_tune_and_evaluate_read_a_file_without_its_retries(tmp_path):
    """The analysis tools see the events the worker applies: a retry, even one sent after
    the user's later events (which would otherwise break the per-user time order), is left
    out by the config's window; without a config every line counts."""
    config = _config()
    events = [
        Event("u1", TS, name="pricing.viewed", id="a"),
        Event("u1", TS + MIN, name="limit.hit", id="b"),
    ]
    lines = [_value(e) for e in (events[0], events[0], events[1], events[0])]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_sorted_events(path, "jsonl", config=config) == events
    with pytest.raises(Exception, match="sort the file by time"):
        read_sorted_events(path, "jsonl")
