"""streams.settings.topics: the product's topics and their environment overrides."""

from __future__ import annotations

import pytest

from streams.settings import product_topics
from streams.settings.topics import TopicSpec


def test_defaults() -> None:
    topics = product_topics({})

    assert [(t.name, t.partitions) for t in topics] == [
        ("oracular.events", 8),
        ("oracular.ticks", 8),
        ("oracular.predictions", 8),
        ("oracular.episodes", 8),
        ("oracular.events.dlq", 8),
    ]
    assert dict(topics.ticks.config) == {"retention.ms": "3600000"}
    assert dict(topics.events.config) == {"retention.ms": "-1"}  # the event log is kept


def test_prefix_per_topic_names_and_partitions_come_from_the_environment() -> None:
    topics = product_topics(
        {
            "ORACULAR_TOPIC_PREFIX": "staging",
            "ORACULAR_TOPIC_DLQ": "dead.letters",
            "ORACULAR_PARTITIONS": "3",
        }
    )

    assert [t.name for t in topics] == [
        "staging.events",
        "staging.ticks",
        "staging.predictions",
        "staging.episodes",
        "dead.letters",
    ]
    assert {t.partitions for t in topics} == {3}


@pytest.mark.parametrize("value", ["0", "-2", "eight"])
def test_bad_partition_counts_name_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=r"ORACULAR_PARTITIONS\b.*must be a whole number") as bad:
        product_topics({"ORACULAR_PARTITIONS": value})
    assert value in str(bad.value)


def test_an_empty_partition_count_is_unset_like_every_other_variable() -> None:
    assert product_topics({"ORACULAR_PARTITIONS": ""}).events.partitions == 8


@pytest.mark.parametrize("name", ["", "has space", "a/b", "..", "x" * 250])
def test_illegal_topic_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not legal in Kafka"):
        TopicSpec(name, 1)


def test_a_spec_cannot_be_changed() -> None:
    spec = TopicSpec("t", 1, {"retention.ms": "1"})

    with pytest.raises(TypeError):
        spec.config["retention.ms"] = "2"  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.partitions = 2  # type: ignore[misc]
