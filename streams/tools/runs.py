"""`oracular topics list` and `oracular topics delete RUN_OR_PREFIX`: the topics of each run.

A run (`make run` gives each its own, `demo-<UTC time>`) owns its product topics,
`<prefix>.events`, `<prefix>.predictions`, ... and, under its app id, Faust's internal topics
`<app id>-...` (the state changelog, the leader topic). `oracular reset` deletes the internal
ones with the consumer group and the local state; `topics delete` deletes the product topics too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.settings.topics import STATE_TABLE
from streams.tools.admin import BrokerError, quiet_aiokafka
from streams.tools.pretty import plural


@dataclass(frozen=True)
class TopicInfo:
    """One topic: its name, partitions and the messages it holds (end - start offsets)."""

    name: str
    partitions: int
    messages: int

    @property
    def run(self) -> str:
        """The run (topic prefix or app id) it belongs to: the name up to its first `.`, or
        for an internal topic up to its first `-__`/`-<table>-changelog`."""
        return owner(self.name)


INTERNAL_MARKERS = ("-__", f"-{STATE_TABLE}-changelog")
"""What follows the app id in its internal topics' names: Faust's own (`-__assignor-__leader`)
and the state table's changelog."""


def owner(name: str) -> str:
    """The prefix or app id a topic name belongs to (`demo-1.events` -> `demo-1`,
    `demo-1-__assignor-__leader` -> `demo-1`, `demo-1-oracular-state-changelog` -> `demo-1`)."""
    if "." in name:
        return name.split(".", 1)[0]
    for marker in INTERNAL_MARKERS:
        if marker in name:
            return name.split(marker, 1)[0]
    return name


def belongs(name: str, run: str) -> bool:
    """True if topic `name` is `run`'s: `run` itself, `run.<anything>` or `run-<anything>`."""
    return name == run or name.startswith((f"{run}.", f"{run}-"))


async def list_topics(bootstrap: str, client: Mapping[str, Any] | None = None) -> list[TopicInfo]:
    """Every topic but the broker's own (`__consumer_offsets`, ...), with partitions and
    message counts.

    Raises:
        BrokerError: the broker stopped answering.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, **(client or {})
    )
    try:
        with quiet_aiokafka():
            await consumer.start()
        names = sorted(t for t in await consumer.topics() if not t.startswith("__"))
        # The consumer tracks the partitions of the topics it is told about only.
        for name in names:
            consumer._client.add_topic(name)
        await consumer._client.force_metadata_update()
        tps = [
            TopicPartition(name, p)
            for name in names
            for p in sorted(consumer.partitions_for_topic(name) or ())
        ]
        ends = await consumer.end_offsets(tps) if tps else {}
        starts = await consumer.beginning_offsets(tps) if tps else {}
    except BrokerError:
        raise
    except Exception as exc:
        msg = f"could not list the topics on {bootstrap} ({exc!r}) — is the broker up?"
        raise BrokerError(msg) from exc
    finally:
        await consumer.stop()
    infos = []
    for name in names:
        mine = [tp for tp in tps if tp.topic == name]
        held = sum(ends[tp] - starts[tp] for tp in mine)
        infos.append(TopicInfo(name, len(mine), held))
    return infos


def describe(topics: Sequence[TopicInfo]) -> str:
    """`topics list`: one block per run, one line per topic."""
    if not topics:
        return "no topics (besides the broker's own)"
    width = max(len(t.name) for t in topics)
    lines = []
    for run in sorted({t.run for t in topics}):
        mine = [t for t in topics if t.run == run]
        total = sum(t.messages for t in mine)
        lines.append(f"{run}: {plural(len(mine), 'topic')}, {plural(total, 'message')}")
        lines += [
            f"  {t.name:<{width}}  {plural(t.partitions, 'partition'):>14}  "
            f"{plural(t.messages, 'message'):>18}"
            for t in mine
        ]
    return "\n".join(lines)


async def delete_topics(
    bootstrap: str, names: Sequence[str], client: Mapping[str, Any] | None = None
) -> None:
    """Delete `names`.

    Raises:
        BrokerError: the broker refused or stopped answering.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
    try:
        with quiet_aiokafka():
            await admin.start()
        await admin.delete_topics(list(names))
    except Exception as exc:
        msg = f"deleting {len(names)} topic(s) on {bootstrap} failed ({exc!r}) — try again"
        raise BrokerError(msg) from exc
    finally:
        await admin.close()
