"""The product's Kafka topics, declared once.

Pure data (no faust import): the Faust app, ``python -m infra.broker topics`` and the tests all
read these declarations. Names and the partition count are settings (`streams/settings/`):

- ``ORACULAR_TOPIC_PREFIX`` (default ``oracular``): names become ``<prefix>.events`` etc.
- ``ORACULAR_TOPIC_EVENTS``, ``..._TICKS``, ``..._PREDICTIONS``, ``..._EPISODES``, ``..._DLQ``:
  a full name for one topic, winning over the prefix.
- ``ORACULAR_PARTITIONS`` (default 8): partitions of every topic. The input, the ticks and the
  state table must have the same count (Faust co-partitions them by partition number); the
  outputs use it too so one number describes the deployment.

``infra/docker-compose.yml`` repeats the default names (a container cannot import this);
``tests/infra/test_compose.py`` checks that the two agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

DEFAULT_PREFIX = "oracular"
DEFAULT_PARTITIONS = 8
# Kafka's rule for topic names (kafka.common.internals.Topic).
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


STATE_TABLE: Final = "oracular-state"
"""The worker's state table; its changelog topic is `<app id>-oracular-state-changelog`."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic: its name, partition count and topic-level configs (strings, as Kafka takes)."""

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _LEGAL_NAME.fullmatch(self.name) or self.name in {".", ".."}:
            msg = (
                f"Topic name {self.name!r} is not legal in Kafka: use 1-249 characters from "
                "a-z A-Z 0-9 . _ - (check ORACULAR_TOPIC_PREFIX / ORACULAR_TOPIC_*)."
            )
            raise ValueError(msg)
        if self.partitions < 1:
            msg = f"Topic {self.name!r}: partitions must be >= 1, got {self.partitions}."
            raise ValueError(msg)
        # Read-only, so a spec shared between modules cannot be changed by one of them.
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))


@dataclass(frozen=True, slots=True)
class ProductTopics:
    """The topics of the product: events in, ticks for the timer, predictions, episodes and
    dead letters out. Iterates in declaration order."""

    events: TopicSpec
    """Input: product-analytics events and commands, keyed by user id (murmur2)."""
    ticks: TopicSpec
    """Timer ticks, one per owned partition; co-partitioned with `events`."""
    predictions: TopicSpec
    """Output: prediction changes after each applied event."""
    episodes: TopicSpec
    """Output: one message per closed episode."""
    dlq: TopicSpec
    """Dead letters: input the worker could not apply, with the reason and original bytes."""

    def __iter__(self) -> Iterator[TopicSpec]:
        return iter((self.events, self.ticks, self.predictions, self.episodes, self.dlq))


def declare_topics(
    prefix: str = DEFAULT_PREFIX,
    partitions: int = DEFAULT_PARTITIONS,
    names: Mapping[str, str | None] | None = None,
) -> ProductTopics:
    """The product's topics: `<prefix>.events` etc., or the full name `names[role]` given for a
    role (events, ticks, predictions, episodes, dlq), all with `partitions` partitions."""
    names = names or {}

    def spec(role: str, suffix: str, config: Mapping[str, str] | None = None) -> TopicSpec:
        return TopicSpec(names.get(role) or f"{prefix}.{suffix}", partitions, config or {})

    return ProductTopics(
        # The input is the event log replays and backfills read from the start, and its
        # records carry their event times (`oracular produce` stamps them), so time-based
        # retention (the broker's default 7 days) would delete any older history at once.
        events=spec("events", "events", {"retention.ms": "-1"}),
        # A tick only matters while fresh: the timer sends new ones, so keep an hour at most.
        ticks=spec("ticks", "ticks", {"retention.ms": str(60 * 60 * 1000)}),
        predictions=spec("predictions", "predictions"),
        episodes=spec("episodes", "episodes"),
        dlq=spec("dlq", "events.dlq"),
    )


def changelog_topic(app_id: str) -> str:
    """The state table's changelog topic of `app_id` (Faust names it <app id>-<table>-changelog)."""
    return f"{app_id}-{STATE_TABLE}-changelog"
