"""Smoke-test Faust app: a running total per user, kept in a RocksDB-backed table.

It proves the stack end to end (aiokafka ↔ broker, Faust agent, rocksdict store, changelog,
restart) before the real processor exists, and it is what ``make run`` starts for now.

Input messages are msgpack maps ``{"user": "u1", "n": 3}`` keyed by the user id; for each one
the agent adds ``n`` to the user's total and publishes ``{"user": "u1", "total": 7}`` (msgpack,
same key) to the output topic. Run it with::

    python -m faust -A streams.smoke_app worker -l info --without-web

Settings come from the environment (defaults point at ``make broker-up``):

=========================  =====================================  ==============================
variable                   meaning                                default
=========================  =====================================  ==============================
ORACULAR_BROKER            bootstrap ``host:port`` (or kafka://)  ``127.0.0.1:9092``
ORACULAR_APP_ID            Faust app id (consumer group, prefix)  ``oracular-smoke``
ORACULAR_DATADIR           RocksDB and Faust state dir            ``var/faust/<app id>``
ORACULAR_SMOKE_INPUT       input topic                            ``oracular.smoke.in``
ORACULAR_SMOKE_OUTPUT      output topic                           ``oracular.smoke.out``
ORACULAR_PARTITIONS        partitions of both topics and table    ``8``
=========================  =====================================  ==============================
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import faust
import msgpack

from streams.app import raw_topic
from streams.topics import partitions_from_env


def broker_url(value: str) -> str:
    """Faust wants a URL; accept the plain ``host:port`` that infra/broker.py prints."""
    return value if "://" in value else f"kafka://{value}"


log = logging.getLogger(__name__)

APP_ID = os.environ.get("ORACULAR_APP_ID", "oracular-smoke")
PARTITIONS = partitions_from_env(os.environ)
DATADIR = Path(os.environ.get("ORACULAR_DATADIR", Path("var") / "faust" / APP_ID))
# Faust creates the datadir itself but not its parents (var/faust on a fresh checkout).
DATADIR.parent.mkdir(parents=True, exist_ok=True)

app = faust.App(
    APP_ID,
    broker=broker_url(os.environ.get("ORACULAR_BROKER", "127.0.0.1:9092")),
    datadir=str(DATADIR),
    store="rocksdb://",
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    # One worker per app in tests and `make run`: a standby would have nowhere to live.
    table_standby_replicas=0,
    # A stopped or killed worker leaves the group within 10 s instead of the default 60 s.
    broker_session_timeout=10,
    broker_heartbeat_interval=2,
    # Commit often, so a restart replays at most about a second of input.
    broker_commit_interval=1.0,
    web_enabled=False,
)

# internal=True lets Faust create the topics (with PARTITIONS partitions) when they are missing,
# so `make run` needs no extra step; the tests create them beforehand anyway. Existing topics
# are left as they are.
source = raw_topic(
    app,
    os.environ.get("ORACULAR_SMOKE_INPUT", "oracular.smoke.in"),
    partitions=PARTITIONS,
    internal=True,
)
sink = raw_topic(
    app,
    os.environ.get("ORACULAR_SMOKE_OUTPUT", "oracular.smoke.out"),
    partitions=PARTITIONS,
    internal=True,
)

# Keys and values are raw bytes (value = msgpack int): no json round trip in the changelog.
# RocksDB's defaults (64 MiB write buffers x 3, 2 GiB block cache) are per partition DB; a
# smoke app needs a few MiB.
totals = app.Table(
    "totals",
    key_type=bytes,
    value_type=bytes,
    partitions=PARTITIONS,
    options={
        "write_buffer_size": 4 << 20,
        "max_write_buffer_number": 2,
        "block_cache_size": 16 << 20,
    },
)


def add(stored: bytes | None, n: int) -> int:
    """The stored msgpack total (0 if none) plus ``n``."""
    return (int(msgpack.unpackb(stored)) if stored is not None else 0) + n


def decode(value: bytes) -> tuple[str, int]:
    """(user, n) from a msgpack ``{"user": str, "n": int}``; ValueError if it is not one."""
    try:
        message = msgpack.unpackb(value)
        return str(message["user"]), int(message["n"])
    except (ValueError, KeyError, TypeError) as exc:  # msgpack's errors are ValueErrors
        msg = f"not a msgpack {{'user', 'n'}} map: {exc!r}"
        raise ValueError(msg) from exc


@app.agent(source, concurrency=1)
async def count(stream: faust.StreamT[bytes]) -> None:
    """Add each message's ``n`` to its user's total and publish the new total.

    Concurrency 1: keeps per-user order and avoids Faust bug #606 (commits past in-flight
    messages). The key is the user id, so the table write lands on the event's partition.
    A message that cannot be decoded is logged and skipped: an exception escaping this loop
    would stop the agent. (The real processor sends such input to the dead-letter topic.)
    """
    # Faust creates the internal *source* topic when it subscribes, but not a topic it only
    # sends to: without this the first send waits forever for the topic's metadata.
    await sink.maybe_declare()
    async for event in stream.events():
        message = event.message
        try:
            user, n = decode(event.value)
        except ValueError as exc:
            log.warning(
                "skipping %s[%s]@%s: %s", message.topic, message.partition, message.offset, exc
            )
            continue
        key = event.key if event.key is not None else user.encode()
        total = add(totals.get(key), n)
        totals[key] = msgpack.packb(total)
        await sink.send(key=key, value=msgpack.packb({"user": user, "total": total}))
