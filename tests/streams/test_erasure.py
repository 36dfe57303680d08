"""Erasure on the processor alone (docs/lifecycle.md): an erase command deletes its user's
state, leaves a keyed marker, publishes `erased`, and no later input at or before the erase
time brings the user back: not after a restore, not in a replay or a backfill that reads the
erase commands ahead. Every other user's outputs are those of the live run."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import END_OF_TIME, Event, InvalidEventError, apply_event, create_state
from schemas.events import DecodeError, decode_event, erase_command
from schemas.files import read_sorted_events, scan_erasures
from streams.runtime.erasure import (
    MARKER_PREFIX,
    Erasures,
    MarkerError,
    decode_marker,
    encode_marker,
    is_marker,
    marker_key,
)
from streams.runtime.processor import Batch, InMessage, TimePolicy

from .test_time import CONFIG, EVENTS, MIN, NAMES, TS, Live, replayed

ALICE = "alice@example.com"


def live() -> Live:
    return Live(TimePolicy(lateness_ms=2 * MIN, idle_ms=END_OF_TIME))


def erase(user: str, at: int, command: str = "erase-1") -> Event:
    return Event(user, at, type="erase", id=command)


def users_in(run: Live) -> dict[bytes, bytes]:
    return dict(run.table.partitions.get(0, {}))


def markers_in(run: Live) -> dict[bytes, bytes]:
    return {k: v for k, v in users_in(run).items() if is_marker(k)}


def history() -> list[Event]:
    return [
        Event(ALICE, TS, name="pricing.viewed", id="a1"),
        Event("bob", TS + MIN, name="pricing.viewed", id="b1"),
        Event(ALICE, TS + 2 * MIN, name="limit.hit", id="a2"),
    ]


# --- the command ---------------------------------------------------------------------------


def test_an_erase_command_decodes_and_the_engine_refuses_it():
    command = erase_command(ALICE, TS, "GDPR request 118")
    assert command["id"].startswith("erase-") and command["reason"] == "GDPR request 118"
    event = decode_event(msgpack.packb(command))
    assert (event.type, event.user, event.at, event.id) == ("erase", ALICE, TS, command["id"])
    with pytest.raises(DecodeError, match="reason"):
        decode_event(msgpack.packb({**command, "reason": ["x"]}))
    with pytest.raises(DecodeError, match="user"):
        erase_command("", TS)
    with pytest.raises(InvalidEventError, match="stream processor"):
        apply_event(create_state(CONFIG), event)


def test_markers_never_take_a_user_key_and_hide_the_id():
    key = marker_key(b"secret", ALICE.encode())
    assert key[:1] == MARKER_PREFIX and is_marker(key) and len(key) == 17
    assert key != marker_key(b"other secret", ALICE.encode())  # keyed: a guess needs the key
    assert not is_marker("ÿ".encode())  # any user id, encoded, starts with another byte
    value = encode_marker(3, TS, "erase-1")
    assert decode_marker(value) == (3, TS) and ALICE.encode() not in key + value
    for bad in (b"\xc1", msgpack.packb(["other", 3, TS, None]), msgpack.packb([1, 2])):
        with pytest.raises(MarkerError):
            decode_marker(bad)


# --- live ----------------------------------------------------------------------------------


def test_an_erase_deletes_the_user_publishes_erased_and_leaves_only_a_marker():
    run = live()
    for event in history():
        run.send(event)
    assert ALICE.encode() in users_in(run)
    run.send(erase(ALICE, TS + 3 * MIN))
    assert ALICE.encode() not in users_in(run)
    assert b"bob" in users_in(run)  # nobody else
    [(key, value)] = markers_in(run).items()
    assert ALICE.encode() not in key + value
    erased = run.outputs[-1]
    assert erased == {
        "id": f"{ALICE}:#erased@{TS + 3 * MIN}",
        "user": ALICE,
        "at": TS + 3 * MIN,
        "type": "erased",
        "event": "erase-1",
        "intents": {},
    }
    counts = run.processor.counts
    assert counts["erasures"] == 1 and counts["predictions"] == 3 + 1


def test_inputs_up_to_the_erase_time_are_skipped_and_later_ones_start_a_new_user():
    run = live()
    for event in history():
        run.send(event)
    run.send(erase(ALICE, TS + 3 * MIN))
    before = len(run.outputs)
    run.send(Event(ALICE, TS + 2 * MIN + 30_000, name="pricing.viewed"))  # late, erased time
    run.send(Event(ALICE, TS + 3 * MIN, name="pricing.viewed"))  # at the erase time
    assert len(run.outputs) == before and ALICE.encode() not in users_in(run)
    assert run.processor.counts["erased"] == 2
    run.send(Event(ALICE, TS + 4 * MIN, name="pricing.viewed"))
    assert run.outputs[-1]["id"] == f"{ALICE}:#1"  # counted from 1 again: a new user
    assert run.processor.counts["applied"] == 4


def test_the_marker_outlives_a_restore_and_a_second_erase_keeps_the_latest_time():
    run = live()
    for event in history():
        run.send(event)
    run.send(erase(ALICE, TS + 3 * MIN))
    run.send(erase(ALICE, TS + 2 * MIN, "erase-2"))  # an older erase time never shortens it
    [value] = markers_in(run).values()
    assert decode_marker(value) == (0, TS + 3 * MIN)
    restored = live()
    restored.table = run.table
    restored.offset = run.offset
    restored.processor.rebuild(list(run.table.partitions[0].items()))
    assert restored.processor.erasures.count() == 1
    restored.send(Event(ALICE, TS + 3 * MIN, name="pricing.viewed"))
    assert restored.processor.counts["erased"] == 1 and not restored.outputs
    assert ALICE.encode() not in users_in(restored)


def test_an_unreadable_state_is_erased_too():
    run = live()
    run.send(Event(ALICE, TS, name="pricing.viewed"))
    run.table.partitions[0][ALICE.encode()] = b"\xc1 not a state"
    run.send(Event(ALICE, TS + MIN, name="pricing.viewed"))
    assert ALICE.encode() in run.processor.quarantined
    run.send(erase(ALICE, TS + 2 * MIN))
    assert ALICE.encode() not in users_in(run) and not run.processor.quarantined
    run.send(Event(ALICE, TS + 3 * MIN, name="pricing.viewed"))
    assert run.outputs[-1]["id"] == f"{ALICE}:#1"


def test_an_erase_with_a_wrong_key_or_a_clock_far_ahead_is_dead_lettered():
    run = live()
    run.send(Event(ALICE, TS, name="pricing.viewed"))
    processor, table = run.processor, run.table
    batch = Batch(table, CONFIG)
    wrong = InMessage(EVENTS, 0, 5, b"bob", msgpack.packb(erase_command(ALICE, TS)), None)
    ahead = InMessage(EVENTS, 0, 6, ALICE.encode(), msgpack.packb(erase_command(ALICE, TS)), 1)
    processor.run_batch(batch, [wrong, ahead], lambda p: False, lambda: TS)
    reasons = [o.message["error"] for o in batch.outputs]
    assert "is not its user" in reasons[0] and "ahead" in reasons[1]
    assert processor.counts["dead_lettered"] == 2 and processor.counts["erasures"] == 0


def test_a_discarded_batch_takes_its_erasures_with_it():
    run = live()
    run.send(Event(ALICE, TS, name="pricing.viewed"))
    processor = run.processor
    batch = processor.batch(run.table)
    message = InMessage(EVENTS, 0, 9, ALICE.encode(), msgpack.packb(erase_command(ALICE, TS)), None)
    processor.run_batch(batch, [message], lambda p: False, lambda: TS)
    processor.stage(batch)
    assert processor.erasures.erased_at(ALICE.encode(), 0) == TS
    processor.discard()
    assert processor.erasures.erased_at(ALICE.encode(), 0) is None
    processor.run_batch(batch := processor.batch(run.table), [message], lambda p: False, lambda: TS)
    processor.stage(batch)
    writes = processor.commit(lambda w: None)
    assert {(k, v is None) for k, v, _ in writes if not is_marker(k)} == {(ALICE.encode(), True)}
    assert sum(is_marker(k) for k, _, _ in writes) == 1
    processor.discard()  # nothing staged: the written marker stays
    assert processor.erasures.erased_at(ALICE.encode(), 0) == TS


def test_erasures_know_read_ahead_users_on_every_partition():
    erasures = Erasures(b"k")
    assert erasures.erased_at(b"u", 0) is None
    erasures.learn({"u": TS})
    assert erasures.erased_at(b"u", 7) == TS and erasures.erased_at(b"v", 7) is None
    erasures.learn_markers({marker_key(b"k", b"v").hex(): TS + 1})
    assert erasures.erased_at(b"v", 2) == TS + 1


# --- replay = live, but for the erased user ------------------------------------------------

schedules = st.lists(
    st.tuples(st.sampled_from(["e", "f", "g"]), st.integers(1, 8), st.sampled_from(NAMES)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=schedules, cut=st.integers(0, 30), tick_every=st.integers(1, 6))
def test_replay_reading_ahead_equals_live_for_everyone_else(steps, cut, tick_every):
    """Live, with ticks: `e` is erased once the stream reaches `cut`. The replay reads the
    erasure ahead: the other users' outputs are the live run's exactly, and `e` gets no
    output of an input at or before the erase time but the `erased` message."""
    now, events = TS, []
    for n, (user, gap, name) in enumerate(steps):
        if n == cut:
            events.append(erase("e", now))
        now += gap * MIN
        events.append(Event(user, now, name=name, id=f"{user}{n}"))
    if cut >= len(steps):
        events.append(erase("e", now))
    erased_at = next(e.at for e in events if e.type == "erase")
    run = live()
    for n, event in enumerate(events):
        run.send(event)
        if n % tick_every == 0:
            run.tick(event.at, caught_up=True)
    run.finish()
    got, _ = replayed(events, erased={"e": erased_at})
    others = {i: m for i, m in run.by_id().items() if m["user"] != "e"}
    assert {i: m for i, m in got.items() if m["user"] != "e"} == others
    mine = {i: m for i, m in got.items() if m["user"] == "e"}
    assert f"e:#erased@{erased_at}" in mine
    for message in mine.values():
        if message.get("type") != "erased":
            assert message.get("at", message.get("started_at")) > erased_at
            assert run.by_id()[message["id"]] == message  # as live gave it after the erasure


# --- files ---------------------------------------------------------------------------------


def test_a_file_s_erasures_are_read_ahead_and_left_out_of_tune_and_evaluate(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [
        json.dumps({"user": "a", "name": "pricing.viewed", "ts": TS}),
        json.dumps({"user": "b", "name": "pricing.viewed", "ts": TS + 1}),
        json.dumps({"user": "a", "type": "erase", "ts": TS + 2, "reason": "asked"}),
        json.dumps({"user": "a", "name": "limit.hit", "ts": TS + 3}),
    ]
    path.write_text("\n".join(lines) + "\n")
    assert scan_erasures(path, "jsonl") == {"a": TS + 2}
    events = read_sorted_events(path, "jsonl", config=CONFIG)
    assert [(e.user, e.at) for e in events] == [("b", TS + 1), ("a", TS + 3)]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(lines[:2]) + "\n")
    assert scan_erasures(plain, "jsonl") == {}
