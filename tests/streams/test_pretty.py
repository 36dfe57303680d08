"""`oracular tail --pretty` lines, its tally, and which topics `tail` follows (no broker)."""

from __future__ import annotations

import json

import pytest

from schemas.outputs import dlq_message
from streams.cli.kafka import tail_topic_names
from streams.settings import product_topics
from streams.tools.kafkatools import _decode, _json_line
from streams.tools.pretty import Tally, duration, format_message, iso, kind

AT = 1_767_777_677_000  # 2026-01-07T09:21:17Z

PREDICTION = {
    "id": "user-00116:e7",
    "user": "user-00116",
    "at": AT,
    "type": "event",
    "event": "limit.hit",
    "intents": {
        "upgrade": {"p": 0.60412, "lower": 0.5011, "reveal": True, "suppressed_until": None},
        "churn": {"p": 0.05, "lower": 0.01, "reveal": False, "suppressed_until": None},
    },
}
OUTCOME = {
    "id": "user-00116:e9",
    "user": "user-00116",
    "at": AT + 60_000,
    "type": "event",
    "event": "upgrade.completed",
    "intents": {
        "upgrade": {
            "p": 0.15,
            "lower": 0.05,
            "reveal": False,
            "suppressed_until": AT + 60_000 + 86_400_000,
            "before_outcome": {"p": 0.6751, "lower": 0.58},
        }
    },
}
EPISODE = {
    "id": "user-00116:1767775215000/2",
    "user": "user-00116",
    "started_at": AT - 2_462_000,
    "closed_at": AT + 1_800_000,
    "reason": "timeout",
    "intents": {
        "upgrade": {"verdict": "held", "signals": ["limit.hit", "pricing.viewed"]},
        "churn": {"verdict": "miss", "signals": []},
    },
}


def test_a_prediction_shows_time_user_event_and_p_and_reveal_per_intent():
    assert format_message(PREDICTION) == (
        "2026-01-07T09:21:17Z  user-00116  limit.hit               "
        "upgrade p=0.604 REVEAL  churn p=0.050"
    )


def test_an_outcome_shows_the_p_it_wiped_and_the_cooldown():
    assert format_message(OUTCOME) == (
        "2026-01-07T09:22:17Z  user-00116  upgrade.completed       upgrade p=0.150 "
        "OUTCOME (p was 0.675 before it) (cooldown until 2026-01-08T09:22:17Z)"
    )


def test_commands_are_named():
    revealed = {**PREDICTION, "type": "revealed", "event": "upgrade"}
    end = {**PREDICTION, "type": "end", "event": None}
    assert "  revealed upgrade  " in format_message(revealed)
    assert "  sign-out  " in format_message(end)
    erased = {**PREDICTION, "type": "erased", "event": "erase-1", "intents": {}}
    assert format_message(erased).endswith("  ERASED by erase-1")


def test_an_episode_close_shows_when_why_how_long_and_the_verdicts():
    assert format_message(EPISODE) == (
        "2026-01-07T09:51:17Z  user-00116  episode closed (timeout) after 1h11m: "
        "upgrade held [limit.hit, pricing.viewed]; churn miss"
    )


def test_a_dead_letter_names_its_origin_and_reason_and_does_not_look_like_an_input():
    record = dlq_message(
        "invalid JSON: Expecting value",
        topic="oracular.events",
        partition=3,
        offset=17,
        key=b"u1",
        value=b"{oops",
    )
    line = format_message(record, "oracular.events.dlq")
    assert line == (
        "dead letter from oracular.events partition 3 offset 17, key 'u1': "
        "invalid JSON: Expecting value"
    )
    # The JSON form names the dead-letter topic; the input's topic is `source_topic`.
    shown = json.loads(_json_line("oracular.events.dlq", record))
    assert shown["topic"] == "oracular.events.dlq"
    assert shown["source_topic"] == "oracular.events"
    assert shown["error"] == "invalid JSON: Expecting value"


def test_a_prediction_in_json_keeps_its_fields_and_gets_its_topic():
    shown = json.loads(_json_line("demo.predictions", PREDICTION))
    assert shown == {"topic": "demo.predictions", **PREDICTION}


def test_other_messages_are_shown_with_their_topic():
    assert kind({"undecodable": "x"}) == "unknown"
    assert format_message({"undecodable": "\x93x"}, "t") == "undecodable message on t: '\\x93x'"
    assert format_message({"a": 1}, "t") == "unknown message on t: {'a': 1}"


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (59_999, "59s"), (61_000, "1m01s"), (3_725_000, "1h02m"), (90_000_000, "1d01h")],
)
def test_durations(ms, text):
    assert duration(ms) == text


def test_iso_times_and_odd_values():
    assert iso(0) == "1970-01-01T00:00:00Z"
    assert iso(AT + 999) == "2026-01-07T09:21:17Z"
    assert iso(None) == "None"
    assert iso(True) == "True"


def test_the_tally_counts_kinds_reveals_and_close_reasons():
    tally = Tally()
    assert tally.summary() == ("0 predictions (no reveals), 0 episodes closed, 0 dead letters")
    for message in (PREDICTION, PREDICTION, OUTCOME, EPISODE, {**EPISODE, "reason": "end"}):
        tally.add(message)
    tally.add(dlq_message("bad", topic="t", partition=0, offset=1, key=None, value=b"x"))
    tally.add({"undecodable": "x"})
    assert tally.summary() == (
        "3 predictions (2 reveals: upgrade 2), 2 episodes closed (1 ended by sign-out, "
        "1 timed out), 1 dead letter, 1 other message"
    )


def test_tail_follows_roles_with_a_prefix_or_a_suffix_and_full_names():
    topics = product_topics({"ORACULAR_TOPIC_PREFIX": "demo-1"})
    assert tail_topic_names("predictions,episodes,dlq", topics) == [
        "demo-1.predictions",
        "demo-1.episodes",
        "demo-1.events.dlq",
    ]
    plain = product_topics({})
    assert tail_topic_names("predictions, dlq", plain, ".bf") == [
        "oracular.predictions.bf",
        "oracular.events.dlq.bf",
    ]
    # What `tail --topics oracular.predictions.bf` used to refuse ("unknown output").
    assert tail_topic_names("oracular.predictions.bf,episodes,episodes", plain) == [
        "oracular.predictions.bf",
        "oracular.episodes",
    ]


@pytest.mark.parametrize("wanted", ["", " , ", "predictions,bad name!"])
def test_tail_refuses_what_cannot_be_a_topic(wanted):
    with pytest.raises(ValueError, match=r"output|topic"):
        tail_topic_names(wanted, product_topics({}))


@pytest.mark.parametrize("raw", [b"\xc1", b"\x05", b"[1]", b""])
def test_what_is_not_an_output_map_is_shown_as_undecodable(raw):
    message = _decode(raw)
    assert message == {"undecodable": raw.decode("latin-1")}
    assert format_message(message, "t").startswith("undecodable message on t: ")


def test_tail_prints_what_it_holds_in_event_time_order_after_the_window():
    """Partition 1's later outputs fetched before partition 0's earlier ones come out merged
    by event time (a prediction's `at`, an episode's `closed_at`, else the record time)."""
    from streams.tools.kafkatools import EventTimeOrder

    order = EventTimeOrder(window_s=2.0)
    late = {**PREDICTION, "at": AT + 10_000}
    closed = {**EPISODE, "closed_at": AT + 5_000}
    dead = dlq_message("bad", topic="t", partition=0, offset=1, key=None, value=b"x")
    order.push("p", late, timestamp=0, arrived=100.0)
    order.push("e", closed, timestamp=0, arrived=100.5)
    order.push("p", PREDICTION, timestamp=0, arrived=101.0)
    order.push("d", dead, timestamp=AT + 7_000, arrived=101.0)
    assert order.ready(101.5) == []  # the earliest held arrived 0.5 s ago
    assert order.ready(110.0, catching_up=True) == []  # still reading the topics' history
    assert order.ready(110.0) == [("p", PREDICTION), ("e", closed), ("d", dead), ("p", late)]
    assert len(order) == 0

    at_once = EventTimeOrder(window_s=0)
    at_once.push("p", late, timestamp=0, arrived=1.0)
    assert at_once.ready(1.0) == [("p", late)]
    at_once.push("p", late, timestamp=0, arrived=2.0)
    at_once.push("p", PREDICTION, timestamp=0, arrived=2.0)
    assert at_once.drain() == [("p", PREDICTION), ("p", late)]


def test_tail_filters_by_user_intent_and_reveal():
    from streams.tools.pretty import Filter

    dead = dlq_message("bad", topic="t", partition=0, offset=1, key=b"user-00116", value=b"x")
    other = {**PREDICTION, "user": "u2"}
    messages = [PREDICTION, OUTCOME, EPISODE, dead, other]
    assert [Filter()(m) for m in messages] == [True] * 5
    by_user = Filter(users=frozenset({"user-00116"}))
    assert [by_user(m) for m in messages] == [True, True, True, True, False]
    churn = Filter(intents=frozenset({"churn"}))
    assert [churn(m) for m in messages] == [
        True,
        False,
        "churn" in EPISODE["intents"],
        False,
        True,
    ]
    reveals = Filter(reveals=True)
    assert [reveals(m) for m in messages] == [True, False, False, False, True]
    churn_reveals = Filter(intents=frozenset({"churn"}), reveals=True)
    assert [churn_reveals(m) for m in messages] == [False] * 5


def test_topics_list_groups_internal_topics_with_their_app_id():
    from streams.settings.topics import STATE_TABLE
    from streams.tools.runs import belongs, owner

    assert owner("demo-1.events") == owner("demo-1.predictions.bf") == "demo-1"
    assert owner(f"demo-1-{STATE_TABLE}-changelog") == "demo-1"
    assert owner("demo-1-__assignor-__leader") == "demo-1"
    assert belongs("demo-1.events", "demo-1") and belongs(
        f"demo-1-{STATE_TABLE}-changelog", "demo-1"
    )
    assert not belongs("demo-10.events", "demo-1")


def test_topics_list_counts_in_words_that_agree_with_the_number():
    from streams.tools.runs import TopicInfo, describe

    text = describe([TopicInfo("r1.events", 1, 1), TopicInfo("r1.predictions", 8, 2_817)])
    lines = text.splitlines()
    assert lines[0] == "r1: 2 topics, 2,818 messages"
    assert lines[1].split()[1:] == ["1", "partition", "1", "message"]
    assert lines[2].split()[1:] == ["8", "partitions", "2,817", "messages"]
    assert describe([TopicInfo("r2.events", 2, 0)]).splitlines()[0] == "r2: 1 topic, 0 messages"
