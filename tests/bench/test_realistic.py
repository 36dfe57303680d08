"""The realistic stream (bench/realistic.py) has the density issue 34 asks of it, measured
through the public decoder and engine: about half the events change a prediction, sessions of
5-30 events, Segment JSON the worker accepts, and the same bytes for the same seed."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

import pytest

from bench.realistic import CONFIG, SESSION_EVENTS, realistic_stream
from engine import Replayer
from schemas.config import load_config
from schemas.events import IgnoredMessage, decode_event

EVENTS, USERS = 6_000, 120


@pytest.fixture(scope="module")
def config():
    return load_config(CONFIG)


@pytest.fixture(scope="module")
def stream(config):
    return realistic_stream(config, EVENTS, USERS, seed=5)


def _decoded(messages):
    events, ignored = [], 0
    for raw in messages:
        try:
            events.append(decode_event(raw))
        except IgnoredMessage:
            ignored += 1
    return events, ignored


def test_the_config_has_1_to_3_intents_of_5_to_15_signals(config):
    assert 1 <= len(config.intents) <= 3
    assert all(5 <= len(intent.signals) <= 15 for intent in config.intents.values())


def test_about_half_the_events_change_a_prediction(config, stream):
    events, _ = _decoded(stream.messages)
    replayer = Replayer(config)
    changed = sum(bool(replayer.feed(event).predictions) for event in events)
    assert 0.4 <= changed / len(events) <= 0.6


def test_every_message_is_segment_json_the_worker_decodes(stream):
    events, ignored = _decoded(stream.messages)  # a DecodeError would fail the test
    assert len(events) == sum(stream.sessions) >= EVENTS
    assert 0 < ignored < 0.1 * len(stream.messages)  # identify calls
    kinds = {json.loads(raw)["type"] for raw in stream.messages}
    assert kinds == {"track", "page", "identify"}
    first = json.loads(stream.messages[0])
    assert {"userId", "anonymousId", "messageId", "timestamp", "context"} <= first.keys()


def test_sessions_have_5_to_30_events_and_close_by_the_idle_timeout(config, stream):
    low, high = SESSION_EVENTS
    assert (low, high) == (5, 30)
    assert min(stream.sessions) == low
    assert max(stream.sessions) == high
    # Measured from the events: a gap longer than the timeout starts a new session.
    events, _ = _decoded(stream.messages)
    times = defaultdict(list)
    for event in events:
        times[event.user].append(event.at)
    timeout = config.episode_timeout_ms
    lengths = []
    for user_times in times.values():
        assert user_times == sorted(user_times)
        count = 1
        for before, after in itertools.pairwise(user_times):
            if after - before > timeout:
                lengths.append(count)
                count = 0
            count += 1
        lengths.append(count)
    assert sorted(lengths) == sorted(stream.sessions)


def test_the_stream_is_in_time_order(stream):
    events, _ = _decoded(stream.messages)
    assert [e.at for e in events] == sorted(e.at for e in events)


def test_a_seed_gives_the_same_bytes_and_another_seed_others(config, stream):
    again = realistic_stream(config, EVENTS, USERS, seed=5)
    assert again.messages == stream.messages
    assert again.sessions == stream.sessions
    other = realistic_stream(config, EVENTS, USERS, seed=6)
    assert other.messages != stream.messages


def test_users_come_back_for_several_sessions(stream):
    assert len(stream.sessions) >= 2 * USERS  # 6,000 events of 120 users: about 3 each


def test_the_endless_stream_is_in_time_order_the_same_per_seed_and_like_the_whole_one(config):
    """`realistic_messages` (the soak's input): time order, an identify before each user's
    first event, the same bytes for a seed, sessions of 5-30 events, and about half its events
    changing a prediction, as the whole stream's."""
    from bench.realistic import realistic_messages

    first = list(itertools.islice(realistic_messages(config, USERS, seed=5), EVENTS))
    again = list(itertools.islice(realistic_messages(config, USERS, seed=5), EVENTS))
    assert first == again
    assert first != list(itertools.islice(realistic_messages(config, USERS, seed=6), EVENTS))
    parsed = [json.loads(raw) for raw in first]
    times = [m["timestamp"] for m in parsed]
    assert times == sorted(times)
    met: set[str] = set()
    for message in parsed:
        if message["type"] == "identify":
            met.add(message["userId"])
        assert message["userId"] in met, message
    assert len(met) == USERS  # every user has had a session within the first 6,000 messages

    events, ignored = _decoded(first)
    assert 0 < ignored < 0.1 * len(first)
    replayer = Replayer(config)
    changed = sum(bool(replayer.feed(event).predictions) for event in events)
    assert 0.4 <= changed / len(events) <= 0.6
    times: dict[str, list[int]] = defaultdict(list)
    for event in events:
        times[event.user].append(event.at)
    lengths = []  # of the sessions a later one follows (the stream is cut in the middle)
    for user_times in times.values():
        count = 1
        for before, after in itertools.pairwise(user_times):
            if after - before > config.episode_timeout_ms:
                lengths.append(count)
                count = 0
            count += 1
    assert lengths and min(lengths) >= SESSION_EVENTS[0] and max(lengths) <= SESSION_EVENTS[1]
