"""A batch lookup decides each partition's route once (`streams.lookup.api._Handlers.batch`):
every user still gets what `serving.route` decides for that user alone."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bench.batchlookup import OTHER, OWNER, PARTITIONS, MemoryNode, lookup, replica_of
from schemas.config import load_config
from streams.lookup import api as api_module
from streams.lookup.api import Api, _Handlers
from streams.lookup.replica import ReplicaCache
from streams.lookup.serving import FORWARDED_HEADER, PartitionView, partition_for, route
from tests.streams.test_cli_replay import CONFIG

VIEWS = [
    PartitionView("active", False, OWNER, OWNER),
    PartitionView("active", True, OWNER, OWNER),  # rebalanced or restored here
    PartitionView("standby", False, OTHER, OWNER),
    PartitionView(None, False, OTHER, OWNER),
    PartitionView(None, False, None, OWNER),  # no owner right now
]


class MixedNode(MemoryNode):
    """A node whose partitions are in every state a route tells apart."""

    def view(self, partition: int) -> PartitionView:
        return VIEWS[partition % len(VIEWS)]


@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("forwarded", [False, True])
def test_each_user_of_a_batch_is_routed_as_route_routes_it_alone(
    stale: bool, forwarded: bool, monkeypatch: Any
) -> None:
    config = load_config(CONFIG)
    replica, users, last = replica_of(config, 120, 2000)
    handler = _Handlers(Api(MixedNode(config, replica, OWNER, OWNER), cache=ReplicaCache(replica)))  # type: ignore[arg-type]
    handler.api.clock = lambda: last

    async def forward_batch(
        request: Any, url: str, batch: Any, indexes: list[int], *, at: int, results: Any
    ) -> None:
        for n in indexes:
            results[n] = {"user": batch.items[n].user, "status": "found", "forwarded_to": url}

    handler._forward_batch = forward_batch  # type: ignore[method-assign,assignment]
    calls: list[int] = []

    def counted(partition: int, *args: Any, **kwargs: Any) -> Any:
        calls.append(partition)
        return route(partition, *args, **kwargs)

    monkeypatch.setattr(api_module, "route", counted)
    headers = {FORWARDED_HEADER: OTHER} if forwarded else {}
    body = json.dumps({"users": users, "stale": stale}).encode()
    results = json.loads(asyncio.run(lookup(handler, body, headers)))["results"]
    assert len(calls) == len(set(calls)) <= PARTITIONS  # once a partition
    kinds = set()
    for user, result in zip(users, results, strict=True):
        partition = partition_for(user, PARTITIONS)
        alone = route(partition, VIEWS[partition % len(VIEWS)], stale=stale, forwarded=forwarded)
        kinds.add(alone.action)
        assert result["user"] == user
        if alone.action == "local":
            assert result["served_by"] == {"worker": OWNER, "role": alone.role}
        elif alone.action == "forward":
            assert result["forwarded_to"] == alone.url
        else:
            assert (result["status"], result["error"]) == ("unavailable", alone.reason)
    assert kinds == {"local", "forward", "unavailable"} - ({"forward"} if forwarded else set())
