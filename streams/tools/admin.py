"""Broker checks and topic creation, for `oracular worker`, `infra/broker.py` and the tests."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from streams.settings.topics import changelog_topic

TOPIC_ALREADY_EXISTS: Final = 36  # Kafka error code
PROBE_TIMEOUT_S: Final = 5.0


class BrokerError(Exception):
    """The broker is unreachable or refused what we asked; the message says what to do."""


class TopicLike(Protocol):
    """What ensure_topics needs from a topic declaration (streams.settings.topics.TopicSpec
    fits)."""

    @property
    def name(self) -> str: ...
    @property
    def partitions(self) -> int: ...
    @property
    def config(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class TopicResult:
    """One topic after ensure_topics: wanted and actual partitions, created now or before."""

    name: str
    wanted: int
    actual: int
    created: bool

    @property
    def matches(self) -> bool:
        """The partition count is the declared one."""
        return self.wanted == self.actual


@contextlib.contextmanager
def quiet_aiokafka() -> Iterator[None]:
    """Silence aiokafka's connection errors while we poll a broker that may not be there."""
    logger = logging.getLogger("aiokafka")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)


def _admin(bootstrap: str, timeout_s: float, client: Mapping[str, Any] | None) -> Any:
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), **(client or {})
    )


async def probe_async(
    bootstrap: str, timeout_s: float = PROBE_TIMEOUT_S, client: Mapping[str, Any] | None = None
) -> bool:
    """One real client round trip: connect, fetch metadata. True if the broker answered."""
    admin = _admin(bootstrap, timeout_s, client)
    try:
        with quiet_aiokafka():
            await asyncio.wait_for(admin.start(), timeout_s)
            await asyncio.wait_for(admin.list_topics(), timeout_s)
    except Exception:  # any failure means "not there / not ready"; the caller reports
        return False
    finally:
        await admin.close()
    return True


async def _create(admin: Any, specs: Sequence[TopicLike], replication: int) -> set[str]:
    """Create the topics; return the names created now (existing ones are fine)."""
    new = [NewTopic(s.name, s.partitions, replication, topic_configs=dict(s.config)) for s in specs]
    response = await admin.create_topics(new)
    created = set()
    for name, code, message in response.topic_errors:
        if code == 0:
            created.add(name)
        elif code != TOPIC_ALREADY_EXISTS:
            msg = f"Kafka refused to create topic {name!r}: error {code}: {message}"
            raise BrokerError(msg)
    return created


async def _partition_counts(admin: Any, names: list[str], timeout_s: float) -> dict[str, int]:
    """Partition count per topic, retrying while new topics' metadata propagates."""
    deadline = time.monotonic() + timeout_s
    while True:
        described = await admin.describe_topics(names)
        counts = {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}
        if len(counts) == len(names) or time.monotonic() > deadline:
            missing = sorted(set(names) - set(counts))
            if missing:
                msg = f"Topics {missing} do not show up in the broker's metadata."
                raise BrokerError(msg)
            return counts
        await asyncio.sleep(0.2)


async def ensure_topics_async(
    bootstrap: str,
    specs: Iterable[TopicLike],
    timeout_s: float = 30.0,
    *,
    replication: int = 1,
    client: Mapping[str, Any] | None = None,
    exact: Iterable[str] | None = None,
) -> list[TopicResult]:
    """Create missing topics and report every topic's partitions.

    `exact` names the topics whose partition count must be the declared one (default: all).
    The worker passes its input and ticks topics: outputs may have any count.

    Raises:
        BrokerError: the broker did not answer, refused, or an existing topic has a different
            partition count (Faust needs input and table partitions equal: fix it, not ignore).
    """
    specs = list(specs)
    admin = _admin(bootstrap, timeout_s, client)
    try:
        with quiet_aiokafka():
            await admin.start()
        created = await _create(admin, specs, replication)
        counts = await _partition_counts(admin, [s.name for s in specs], timeout_s)
    except BrokerError:
        raise
    except Exception as exc:
        msg = f"Could not create topics on {bootstrap}: {exc!r}. Is the broker up?"
        raise BrokerError(msg) from exc
    finally:
        await admin.close()
    results = [TopicResult(s.name, s.partitions, counts[s.name], s.name in created) for s in specs]
    must_match = None if exact is None else set(exact)
    mismatched = [
        r for r in results if not r.matches and (must_match is None or r.name in must_match)
    ]
    if mismatched:
        lines = "; ".join(f"{r.name} has {r.actual}, wanted {r.wanted}" for r in mismatched)
        msg = (
            f"Partition count mismatch: {lines}. Faust needs the configured count (input and "
            "table partitions must be equal). Delete and recreate the topic (its data is lost), "
            "or set ORACULAR_PARTITIONS to the existing count."
        )
        raise BrokerError(msg)
    return results


def ensure_topics(
    bootstrap: str, specs: Iterable[TopicLike], timeout_s: float = 30.0, **kwargs: Any
) -> list[TopicResult]:
    """Synchronous ensure_topics_async, for CLIs and session fixtures (no running loop)."""
    return asyncio.run(ensure_topics_async(bootstrap, specs, timeout_s, **kwargs))


def no_broker_message(bootstrap: str, waited_s: float | None = None) -> str:
    """What to say when nothing answers at `bootstrap` (`waited_s`: how long the probe took;
    a refused connection is answered at once, a silent address at the probe's timeout)."""
    if waited_s is not None and waited_s < PROBE_TIMEOUT_S * 0.9:
        how = f"(the connection was refused after {waited_s:.1f} s)"
    else:
        how = f"within {PROBE_TIMEOUT_S:.0f} s"
    return (
        f"no Kafka broker answered at {bootstrap} {how} — start the local one with "
        "`make broker-up` (it prints its address), or point ORACULAR_BROKER / --broker at "
        "yours (TLS/SASL: ORACULAR_SECURITY_PROTOCOL and friends, docs/operations.md)"
    )


def missing_topics_message(
    missing: Sequence[str], bootstrap: str, existing: Iterable[str] = ()
) -> str:
    """What to say when topics a command needs do not exist (with the closest existing name
    of each, if one is close)."""
    names = sorted(t for t in existing if not t.startswith("__"))
    shown = []
    for topic in missing:
        close = difflib.get_close_matches(topic, names, n=1, cutoff=0.8)
        shown.append(f"{topic} (did you mean {close[0]}?)" if close else topic)
    what = f"topic {shown[0]} does" if len(shown) == 1 else f"topics {', '.join(shown)} do"
    return (
        f"{what} not exist on {bootstrap} — create the product topics with `make topics` "
        "(or start `oracular worker`, which creates them); check ORACULAR_TOPIC_PREFIX; "
        "`oracular topics list` shows the topics there are"
    )


async def require_broker(
    bootstrap: str,
    *,
    topics: Sequence[str] = (),
    client: Mapping[str, Any] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> None:
    """The check every Kafka-facing command makes first: a broker answers, `topics` exist.

    Bounded by `timeout_s` per step, silent (no aiokafka connection logs), creates nothing.

    Raises:
        BrokerError: one line saying what is wrong and how to fix it (`no_broker_message`,
            `missing_topics_message`).
    """
    started = time.monotonic()
    if not await probe_async(bootstrap, timeout_s, client):
        raise BrokerError(no_broker_message(bootstrap, time.monotonic() - started))
    if not topics:
        return
    admin = _admin(bootstrap, timeout_s, client)
    try:
        with quiet_aiokafka():
            await asyncio.wait_for(admin.start(), timeout_s)
            existing = set(await asyncio.wait_for(admin.list_topics(), timeout_s))
    except Exception as exc:  # it answered the probe a moment ago: gone, or refusing
        raise BrokerError(no_broker_message(bootstrap)) from exc
    finally:
        await admin.close()
    missing = [t for t in topics if t not in existing]
    if missing:
        raise BrokerError(missing_topics_message(missing, bootstrap, existing))


@contextlib.asynccontextmanager
async def _describing(
    bootstrap: str, timeout_s: float, client: Mapping[str, Any] | None, what: str
) -> AsyncIterator[Any]:
    """An admin client for the block; a failure in it is a BrokerError asking for the broker."""
    admin = _admin(bootstrap, timeout_s, client)
    try:
        with quiet_aiokafka():
            await admin.start()
        yield admin
    except Exception as exc:
        msg = f"Could not describe {what} on {bootstrap}: {exc!r}. Is the broker up?"
        raise BrokerError(msg) from exc
    finally:
        await admin.close()


def _counts(described: Any) -> dict[str, int]:
    """Topic -> partitions, of the topics a describe found."""
    return {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}


async def check_topics_async(
    bootstrap: str,
    specs: Iterable[TopicLike],
    timeout_s: float = 10.0,
    *,
    client: Mapping[str, Any] | None = None,
) -> None:
    """Check that every topic exists with its declared partitions; create nothing.

    Raises:
        BrokerError: naming each missing or mis-partitioned topic and how to fix it.
    """
    specs = list(specs)
    async with _describing(bootstrap, timeout_s, client, "topics") as admin:
        counts = _counts(await admin.describe_topics([s.name for s in specs]))
    problems = [
        f"{s.name} is missing"
        if s.name not in counts
        else f"{s.name} has {counts[s.name]} partitions, wanted {s.partitions}"
        for s in specs
        if counts.get(s.name) != s.partitions
    ]
    if problems:
        msg = (
            "; ".join(problems) + ". Create the topics with `make topics` (or run the "
            "worker without --no-create-topics); fix a partition count by recreating the "
            "topic or setting ORACULAR_PARTITIONS to the existing count."
        )
        raise BrokerError(msg)


async def prepare_deployment(settings: Any, *, create: bool = True) -> None:
    """What every worker run checks first: a broker answers, and the product topics exist.

    Missing topics are created (`create=False`: only checked). The input and ticks topics must
    have the configured partition count (Faust co-partitions them with the state table);
    output topics may have any.

    Raises:
        BrokerError: saying what is wrong and how to fix it.
    """
    client = settings.client_kwargs()
    await require_broker(settings.broker, client=client)
    specs = list(settings.topics)
    if not create:
        await check_topics_async(settings.broker, specs, client=client)
        return
    topics = settings.topics
    await ensure_topics_async(
        settings.broker,
        specs,
        replication=settings.replication_factor,
        client=client,
        exact=(topics.events.name, topics.ticks.name),
    )
    await check_changelog_async(settings)


COORDINATOR_WAIT_S: Final = 20.0
"""A fresh broker creates its offsets topic on the first group request: wait for it."""


async def _group_offsets(admin: Any, group: str, timeout_s: float) -> dict[Any, Any]:
    """The group's committed offsets, retrying while the broker has no coordinator yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return dict(await admin.list_consumer_group_offsets(group))
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def check_changelog_async(settings: Any, timeout_s: float = 10.0) -> None:
    """The state table's changelog topic fits the app: one partition per input partition, and
    not missing while the app id has committed input offsets.

    A changelog deleted while the workers were down was created again empty by Faust, and the
    workers went on from the committed offsets with every user forgotten (then a
    `ConsistencyError` traceback); one pre-created with fewer partitions stopped the worker on
    the first input of a partition it lacks. Both are refused before the worker starts.

    Raises:
        BrokerError: saying what is wrong and how to fix it.
    """
    name = changelog_topic(settings.app_id)
    wanted = settings.topics.events.partitions
    async with _describing(settings.broker, timeout_s, settings.client_kwargs(), name) as admin:
        found = _counts(await admin.describe_topics([name]))
        offsets = await _group_offsets(admin, settings.app_id, COORDINATOR_WAIT_S)
    if name in found and found[name] != wanted:
        msg = (
            f"the changelog topic {name} has {found[name]} partitions, but the input has "
            f"{wanted}: the state table needs one per input partition. Delete it with "
            f"`oracular reset {settings.app_id}` (its state is lost) or set "
            f"ORACULAR_PARTITIONS={found[name]}"
        )
        raise BrokerError(msg)
    committed = [
        tp
        for tp, meta in offsets.items()
        if tp.topic == settings.topics.events.name and meta.offset >= 0
    ]
    if name not in found and committed:
        msg = (
            f"the changelog topic {name} is missing, but app id {settings.app_id!r} has "
            f"committed input offsets: its state is gone, and the worker would go on from "
            f"those offsets with every user forgotten. Restore the topic, or start over with "
            f"`oracular reset {settings.app_id}` (the input is then read again from the start)"
        )
        raise BrokerError(msg)
