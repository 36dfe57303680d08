"""The API process's `Warmer` (on with ORACULAR_API_CPUS): users decoded as the worker writes
them, so that their next read finds them decoded, never a stale state."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, ClientTimeout

from schemas.config import load_config
from schemas.stored import decode_stored
from streams.lookup import replica as replica_module
from streams.lookup.replica import STATES, Replica, ReplicaCache, Warmer
from streams.lookup.serving import PartitionView
from tests.streams.test_cli_replay import CONFIG
from tests.streams.test_replica import get, serving, stored, wait_for, write


@pytest.fixture(scope="module")
def config() -> Any:
    return load_config(CONFIG)


READS = re.compile(r'^oracular_lookup_reads_total\{source="(\w+)"\} (\S+)$', re.MULTILINE)


class Node:
    """The node's partition roles, as the worker's last status gives them."""

    def __init__(self, roles: dict[int, str]) -> None:
        self.roles = roles

    def view(self, partition: int) -> PartitionView:
        return PartitionView(self.roles.get(partition), False, None, "me")  # type: ignore[arg-type]


def warmer_over(config: Any, roles: dict[int, str]) -> tuple[Replica, Warmer]:
    replica = Replica()
    return replica, Warmer(replica, ReplicaCache(replica), config, Node(roles))  # type: ignore[arg-type]


async def settle(replica: Replica, warmer: Warmer) -> None:
    """Run the warmer until it has looked at every user written."""
    task = asyncio.create_task(warmer.run())
    try:
        while replica.written:
            await asyncio.sleep(0)
    finally:
        task.cancel()


async def test_written_users_of_an_active_partition_are_decoded_as_their_latest_value(
    config: Any,
) -> None:
    replica, warmer = warmer_over(config, {0: "active", 1: "standby"})
    first = stored(config, "pricing.viewed", 0, 1)
    replica.apply([STATES, 0, [(b"a", first), (b"b", stored(config, "limit.hit", 0, 2))]])
    replica.apply([STATES, 1, [(b"s", stored(config, "pricing.viewed", 1, 3))]])
    await settle(replica, warmer)
    assert set(replica.decoded) == {b"a", b"b"}  # a standby's users are read from the copy
    assert replica.decoded[b"a"] == decode_stored(first, config)
    newer = stored(config, "limit.hit", 0, 4)
    replica.apply([STATES, 0, [(b"a", newer), (b"b", None)]])  # a newer value, a tombstone
    assert b"a" not in replica.decoded and b"b" not in replica.decoded  # dropped at once
    await settle(replica, warmer)
    assert set(replica.decoded) == {b"a"}
    assert replica.decoded[b"a"] == decode_stored(newer, config)


async def test_it_stops_at_its_bound_and_skips_what_it_cannot_read(
    config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_module, "MAX_WARM", 3)
    replica, warmer = warmer_over(config, {0: "active"})
    users = [(f"u{n}".encode(), stored(config, "pricing.viewed", 0, n)) for n in range(5)]
    replica.apply([STATES, 0, [(b"bad", b"\xc1 not a state"), *users]])
    await settle(replica, warmer)
    assert list(replica.decoded) == [b"u0", b"u1", b"u2"]


async def reads(http: ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as response:
        return {s: float(n) for s, n in READS.findall(await response.text())}


async def first_read_source(
    http: ClientSession, url: str, feed: Any, dbs: Any, config: Any, n: int
) -> str:
    """Write a new user, look it up once: where the API process read it from."""
    user = f"fresh-{n}"
    write(feed, dbs, config, user, "pricing.viewed", n)
    await asyncio.sleep(0.05)  # not a condition: a chance for the warmer to be first
    before = await reads(http, url)
    status, body = await get(http, f"{url}/v1/users/{user}")
    if status != 200 or not body["known"]:
        return "not yet"  # the write has not reached the API process yet
    after = await reads(http, url)
    return "cache" if after.get("cache", 0) > before.get("cache", 0) else "table"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to reserve one")
async def test_with_a_core_of_its_own_the_api_process_reads_written_users_decoded(
    config: Any, tmp_path: Path
) -> None:
    """With ORACULAR_API_CPUS, a user written and then looked up once is, sooner or later
    (the warmer runs beside the feed), read from the decoded users; without, a first read is
    always a decode from the table."""
    reserved = frozenset({max(os.sched_getaffinity(0))})
    async with ClientSession(timeout=ClientTimeout(total=10)) as http:
        async with serving(config, tmp_path / "on", cpus=reserved) as (url, feed, _, dbs):
            sources: list[str] = []

            async def one_from_the_cache() -> bool:
                sources.append(await first_read_source(http, url, feed, dbs, config, len(sources)))
                return sources[-1] == "cache"

            await wait_for(one_from_the_cache, f"a first read from the cache (got {sources})")
        async with serving(config, tmp_path / "off") as (url, feed, _, dbs):
            found = [await first_read_source(http, url, feed, dbs, config, n) for n in range(5)]
            assert "cache" not in found and "table" in found, found
