"""The lookup API without a broker: routing, the forward-loop guard, validation, auth, metrics.

Workers are `streams.lookup.api` applications over fake nodes (a dict per partition stands in for
the RocksDB copies, a dict partition -> URL for Faust's assignment), served by aiohttp's test server
on 127.0.0.1, so forwarding between two of them is real HTTP.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from aiokafka.partitioner import DefaultPartitioner
from faust.sensors import Monitor
from faust.types import TP

from engine import Event, Replayer, create_state, explain, predict
from schemas.config import load_config
from schemas.events import decode_event
from schemas.stored import StoredUser, decode_stored, encode_stored
from streams.lookup import api as api_module
from streams.lookup.api import Api, bind, build_web_app
from streams.lookup.front import Guard, Limits, serve
from streams.lookup.metrics import Family, monitor_families, render
from streams.lookup.replica import Replica, ReplicaCache
from streams.lookup.serving import (
    FORWARDED_HEADER,
    MAX_BATCH,
    ApiError,
    PartitionView,
    UserRead,
    batch_body,
    batch_counts,
    config_identity,
    parse_at,
    parse_batch,
    parse_reveal,
    partition_for,
    route,
)
from streams.lookup.serving import (
    batch_body as serving_batch_body,
)
from streams.runtime.processor import StateCache
from streams.settings import APP_HEADER
from tests.contract import contract_session
from tests.streams.test_cli_replay import CONFIG

PARTITIONS = 4
TS = 1_767_261_600_000
MIN = 60_000


@pytest.fixture(scope="module")
def config():
    return load_config(CONFIG)


# --- pure parts ---------------------------------------------------------------------------


def test_partition_for_is_kafkas_default_partitioner() -> None:
    """murmur2 as aiokafka's (and Java's) default partitioner places keyed records."""
    rng = random.Random(7)
    every = list(range(PARTITIONS))
    partitioner = DefaultPartitioner()
    for n in range(2000):
        user = f"user-{n}-{rng.random()}" if n % 2 else "ü" * (n % 9 + 1)
        assert partition_for(user, PARTITIONS) == partitioner(user.encode(), every, every)


ME, OTHER = "http://a:1", "http://b:2"


@pytest.mark.parametrize(
    ("local", "settling", "owner", "stale", "forwarded", "action", "role"),
    [
        ("active", False, ME, False, False, "local", "active"),  # the owner answers
        ("active", False, ME, False, True, "local", "active"),  # also a forwarded request
        (None, False, OTHER, False, False, "forward", None),  # one hop to the owner
        (None, False, OTHER, False, True, "unavailable", None),  # the loop guard: no 2nd hop
        ("standby", False, OTHER, True, False, "local", "standby"),  # stale: standby answers
        ("standby", False, OTHER, False, False, "forward", None),  # not stale: the owner
        ("active", True, ME, False, False, "unavailable", None),  # restoring here: 503
        ("active", True, ME, True, False, "local", "active"),  # stale accepts a restoring copy
        (None, True, None, False, False, "unavailable", None),  # no owner while rebalancing
        (None, True, ME, False, False, "unavailable", None),  # assigned here, not open yet
        (None, True, OTHER, False, False, "forward", None),  # the owner decides for itself
    ],
)
def test_route(local, settling, owner, stale, forwarded, action, role) -> None:
    view = PartitionView(local, settling, owner, ME)
    decision = route(3, view, stale=stale, forwarded=forwarded)
    assert (decision.action, decision.role) == (action, role)
    if action == "forward":
        assert decision.url == owner
    if action == "unavailable":
        assert "partition 3" in decision.reason


def test_parse_batch_limits_and_errors(config) -> None:
    ok = parse_batch(
        json.dumps({"users": ["u1", {"user": "u2", "intents": ["upgrade"]}], "at": 5}).encode(),
        config,
    )
    assert [(i.user, i.intents) for i in ok.items] == [("u1", None), ("u2", ["upgrade"])]
    assert ok.at == 5 and not ok.explain and not ok.stale

    def error(body: object) -> ApiError:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        with pytest.raises(ApiError) as caught:
            parse_batch(raw, config)
        return caught.value

    too_many = error({"users": [f"u{n}" for n in range(MAX_BATCH + 1)]})
    assert too_many.status == 413 and str(MAX_BATCH) in too_many.message
    assert error(b"{not json").status == 400
    assert error({"users": []}).status == 400
    assert error({"users": ["u"], "limit": 3}).message.startswith("unknown field 'limit'")
    unknown = error({"users": ["u", {"user": "v", "intents": ["teleport"]}]})
    assert unknown.status == 400 and unknown.message.startswith("users[1]: unknown intent")
    assert unknown.extra["declared"] == sorted(config.intents)
    assert error({"users": [""]}).status == 400
    assert error({"users": ["x" * 600]}).status == 400
    assert error({"users": ["u"], "at": "soon"}).status == 400
    assert error({"users": ["u"], "stale": "yes"}).status == 400
    assert error(b"x" * (600 * 1024)).status == 413


def test_parse_at_and_reveal(config) -> None:
    assert parse_at(None, 42) == 42
    assert parse_at("1767261600000", 0) == 1767261600000
    for bad in ("-5", "1e3", "now", True, 2.5):
        with pytest.raises(ApiError):
            parse_at(bad, 0)
    assert parse_reveal(b'{"intent": "upgrade"}', config, 7) == ("upgrade", 7)
    assert parse_reveal(b'{"intent": "churn", "ts": 9}', config, 7) == ("churn", 9)
    for bad in (b"", b"[]", b'{"intent": "teleport"}', b'{"intent": ["upgrade"]}', b'{"x": 1}'):
        with pytest.raises(ApiError) as caught:
            parse_reveal(bad, config, 7)
        assert caught.value.status == 400


# --- workers over fake nodes --------------------------------------------------------------


@dataclass
class FakeNode:
    """A worker's view: which partitions it holds (and how), the owners, the table copies."""

    config: Any
    me: str = ""
    partitions: int = PARTITIONS
    events_topic: str = "oracular.events"
    local: dict[int, str] = field(default_factory=dict)
    """Partition -> "active" | "standby"."""
    owners: dict[int, str] = field(default_factory=dict)
    settling: bool = False
    tables: dict[int, dict[bytes, bytes]] = field(default_factory=dict)
    appended: list[tuple[bytes, bytes, int]] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    partition_counters: Counter[tuple[str, int]] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    gets: int = 0

    def view(self, partition: int) -> PartitionView:
        return PartitionView(
            self.local.get(partition),  # type: ignore[arg-type]
            self.settling,
            self.owners.get(partition),
            self.me,
        )

    def get(self, partition: int, key: bytes) -> bytes | None:
        self.gets += 1
        return self.tables.get(partition, {}).get(key)

    def routing(self) -> dict[str, Any]:
        here = {
            role: sorted(p for p, r in self.local.items() if r == role)
            for role in ("active", "standby")
        }
        return {
            "generation": 7,
            "rebalancing": self.settling,
            "recovering": False,
            "worker": self.me,
            "partitions": {str(p): self.owners.get(p) for p in range(PARTITIONS)},
            "here": here,
        }

    def health(self) -> list[str]:
        return ["rebalancing"] if self.settling else []

    def lag(self) -> dict[int, int]:
        return {p: 0 for p, role in self.local.items() if role == "active"}

    def counts(self) -> Mapping[str, int]:
        return self.counters

    def inputs_by_partition(self) -> Mapping[tuple[str, int], int]:
        return self.partition_counters

    def episodes_by_reason(self) -> Mapping[str, int]:
        return self.reasons

    def gauges(self) -> list[Family]:
        return []

    async def append(self, key: bytes, value: bytes, partition: int) -> tuple[int, int]:
        self.appended.append((key, value, partition))
        return partition, len(self.appended) - 1


@dataclass
class Served:
    """An API served as the worker serves it (`streams.lookup.front.serve`: guarded connections)."""

    runner: web.AppRunner
    guard: Guard
    url: str

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve_api(api: Api, *, ssl_context: Any = None) -> Served:
    sock = bind("127.0.0.1", 0)
    runner, guard = await serve(
        build_web_app(api), sock, api.limits, ssl_context=ssl_context, app_id=api.app_id
    )
    api.guard = guard
    scheme = "https" if ssl_context is not None else "http"
    return Served(runner, guard, f"{scheme}://127.0.0.1:{sock.getsockname()[1]}")


@dataclass
class Worker:
    node: FakeNode
    api: Api
    server: Served

    @property
    def url(self) -> str:
        return self.node.me


async def start_worker(
    config: Any,
    *,
    token: str | None = None,
    timeout_s: float = 2.0,
    limits: Limits | None = None,
    **options: Any,
) -> Worker:
    node = FakeNode(config)
    api = Api(node, token=token, forward_timeout_s=timeout_s, limits=limits or Limits(), **options)
    server = await serve_api(api)
    node.me = server.url
    return Worker(node, api, server)


@pytest.fixture
async def pair(config) -> AsyncIterator[tuple[Worker, Worker]]:
    """Two workers: A owns partitions 0 and 1, B owns 2 and 3; both know the assignment."""
    a, b = await start_worker(config), await start_worker(config)
    owners = {0: a.url, 1: a.url, 2: b.url, 3: b.url}
    for worker, mine in ((a, (0, 1)), (b, (2, 3))):
        worker.node.owners = dict(owners)
        worker.node.local = dict.fromkeys(mine, "active")
    yield a, b
    await a.server.close()
    await b.server.close()


@pytest.fixture
async def http() -> AsyncIterator[ClientSession]:
    async with contract_session() as session:  # every answer checked against the document
        yield session


def user_on(partition: int, prefix: str = "user") -> str:
    n = 0
    while partition_for(f"{prefix}-{n}", PARTITIONS) != partition:
        n += 1
    return f"{prefix}-{n}"


def store(worker: Worker, config: Any, user: str, events: list[Event]) -> Any:
    """Put `user`'s replayed state into `worker`'s copy of its partition; returns the state."""
    replayer = Replayer(config)
    for event in events:
        replayer.feed(event)
    state = replayer.states[user]
    partition = partition_for(user, PARTITIONS)
    raw = encode_stored(StoredUser(state, partition, 41))
    worker.node.tables.setdefault(partition, {})[user.encode()] = raw
    return state


def some_events(user: str) -> list[Event]:
    names = ["pricing.viewed", "limit.hit", "cancel.viewed", "team.viewed", "pricing.viewed"]
    return [Event(user, TS + n * MIN, name=name, id=f"{user}-{n}") for n, name in enumerate(names)]


async def get(http: ClientSession, url: str, **kwargs: Any) -> tuple[int, Any, Any]:
    async with http.get(url, **kwargs) as response:
        return response.status, await response.json(), response.headers


async def test_any_worker_answers_with_one_hop(pair, http, config) -> None:
    """A user owned by B, asked through A: B's answer, computed by engine.predict at `at`."""
    a, b = pair
    user = user_on(2)
    state = store(b, config, user, some_events(user))
    at = TS + 90 * MIN
    status, body, _ = await get(http, f"{a.url}/v1/users/{user}?at={at}&explain=true")
    assert status == 200, body
    assert body["served_by"] == {"worker": b.url, "role": "active"}
    assert body["known"] and body["at"] == at and body["as_of"] == state.clock
    assert body["position"] == {"partition": 2, "offset": 41}
    assert body["config"] == config_identity(config)
    assert set(body["intents"]) == set(config.intents)
    for intent, got in body["intents"].items():
        want = predict(state, intent, at)
        assert (got["p"], got["lower"], got["reveal"], got["suppressed_until"]) == (
            want.p,
            want.lower,
            want.reveal,
            want.suppressed_until,
        )
        why = explain(state, intent, at)
        assert got["explain"]["signals"].keys() == why.signals.keys()
        for name, signal in why.signals.items():
            shown = got["explain"]["signals"][name]
            assert (shown["initial"], shown["learned"], shown["effective"]) == (
                signal.initial,
                signal.learned,
                signal.effective,
            )
            assert (shown["hits"], shown["misses"]) == (signal.hits, signal.misses)
    assert a.node.gets == 0 and b.node.gets == 1  # one user decoded, by the owner only
    forwards = dict(a.api.metrics.forwards)
    assert forwards == {(("outcome", "200"),): 1}


async def test_unknown_user_gets_the_prior_and_unknown_intent_a_400(pair, http, config) -> None:
    a, _ = pair
    user = user_on(0, "newcomer")
    status, body, _ = await get(http, f"{a.url}/v1/users/{user}/intents/upgrade?at={TS}")
    assert status == 200 and body["known"] is False and body["as_of"] is None
    want = predict(create_state(config), "upgrade", TS)
    assert list(body["intents"]) == ["upgrade"]
    assert body["intents"]["upgrade"]["p"] == want.p
    status, body, _ = await get(http, f"{a.url}/v1/users/{user}/intents/teleport")
    assert status == 400
    assert body["declared"] == sorted(config.intents)
    assert "teleport" in body["error"] and "upgrade" in body["error"]
    for bad in ("at=yesterday", "explain=maybe", "stale=2"):
        status, body, _ = await get(http, f"{a.url}/v1/users/{user}?{bad}")
        assert status == 400, (bad, body)


async def test_the_forward_loop_guard_stops_after_one_hop(pair, http) -> None:
    """A and B each believe the other owns partition 2 (a rebalance in flight): one hop,
    then 503 with Retry-After, never a loop."""
    a, b = pair
    b.node.local.pop(2)
    b.node.owners[2] = a.url
    user = user_on(2)
    status, body, headers = await get(http, f"{a.url}/v1/users/{user}")
    assert status == 503 and headers["Retry-After"] == "1", body
    assert "not owned here" in body["error"]
    assert dict(a.api.metrics.forwards) == {(("outcome", "503"),): 1}
    assert not b.api.metrics.forwards  # B did not forward it back
    # A request that claims to be forwarded already is answered locally or refused, never sent on.
    status, body, _ = await get(
        http, f"{a.url}/v1/users/{user}", headers={FORWARDED_HEADER: "http://elsewhere"}
    )
    assert status == 503 and dict(a.api.metrics.forwards) == {(("outcome", "503"),): 1}


async def test_rebalancing_partition_is_503_and_stale_reads_a_standby(pair, http, config) -> None:
    a, b = pair
    user = user_on(1)
    store(a, config, user, some_events(user))
    a.node.settling = True
    status, body, headers = await get(http, f"{b.url}/v1/users/{user}")
    assert status == 503 and headers["Retry-After"] == "1"
    assert "rebalanced" in body["error"]
    status, body, _ = await get(http, f"{b.url}/readyz")
    assert status == 200 and body["ready"]
    status, body, _ = await get(http, f"{a.url}/readyz")
    assert status == 503 and body["reasons"] == ["rebalancing"]
    # B holds a standby copy: ?stale=true reads it without a hop.
    b.node.local[1] = "standby"
    b.node.tables[1] = dict(a.node.tables[1])
    status, body, _ = await get(http, f"{b.url}/v1/users/{user}?stale=true")
    assert status == 200 and body["served_by"] == {"worker": b.url, "role": "standby"}
    a.node.settling = False
    status, body, _ = await get(http, f"{b.url}/v1/users/{user}")
    assert status == 200 and body["served_by"]["worker"] == a.url


async def test_forward_timeout_is_504(config, http) -> None:
    """The owner does not answer in time: 504 naming it."""
    slow = web.Application()

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    slow.router.add_get("/v1/users/{user}", hang)
    slow_server = TestServer(slow, host="127.0.0.1")
    await slow_server.start_server()
    worker = await start_worker(config, timeout_s=0.2)
    try:
        worker.node.owners = dict.fromkeys(range(PARTITIONS), str(slow_server.make_url("")))
        status, body, _ = await get(http, f"{worker.url}/v1/users/anyone")
        assert status == 504 and "did not answer within 0.2 s" in body["error"]
        key = (("endpoint", "user"), ("status", "timeout"))
        assert worker.api.metrics.lookups[key] == 1
    finally:
        await worker.server.close()
        await slow_server.close()


async def test_batch_groups_users_by_owner(pair, http, config) -> None:
    """300 users on all partitions through A: one forward to B for all of B's users, answers in
    request order, unknown users found as the prior, unavailable ones said so."""
    a, b = pair
    users = [f"batch-{n}" for n in range(300)]
    states = {}
    for user in users[::3]:
        owner = a if partition_for(user, PARTITIONS) < 2 else b
        states[user] = store(owner, config, user, some_events(user))
    body = {"users": [*users[:-1], {"user": users[-1], "intents": ["churn"]}], "at": TS + 60 * MIN}
    async with http.post(f"{a.url}/v1/lookup", json=body) as response:
        assert response.status == 200
        answer = await response.json()
    results = answer["results"]
    assert [r["user"] for r in results] == users
    assert dict(a.api.metrics.forwards) == {(("outcome", "200"),): 1}
    for result in results:
        user = result["user"]
        assert result["status"] == ("found" if user in states else "unknown")
        state = states.get(user, create_state(config))
        for intent, got in result["intents"].items():
            assert got["p"] == predict(state, intent, TS + 60 * MIN).p
    assert list(results[-1]["intents"]) == ["churn"]
    assert answer["counts"] == {"found": len(states), "unknown": len(users) - len(states)}
    # B rebalancing: B's users are unavailable, A's still answer.
    b.node.settling = True
    async with http.post(f"{a.url}/v1/lookup", json={"users": users[:40]}) as response:
        answer = await response.json()
    for result in answer["results"]:
        mine = partition_for(result["user"], PARTITIONS) < 2
        assert result["status"] in (("found", "unknown") if mine else ("unavailable",))
    async with http.post(
        f"{a.url}/v1/lookup", json={"users": [f"u{n}" for n in range(MAX_BATCH + 1)]}
    ) as response:
        assert response.status == 413
        assert str(MAX_BATCH) in (await response.json())["error"]
    async with http.post(f"{a.url}/v1/lookup", data=b"x" * (1 << 20)) as response:
        assert response.status == 413


async def test_lookups_and_their_forwards_make_no_cyclic_garbage(pair, http, config) -> None:
    """The API process freezes its decoded users with whatever else is alive
    (`ReplicaCache.keep`), so garbage in reference cycles would wait for the hourly full
    collection: a lookup's request, answer and forward must make none (the server's side and
    this client's both; the collector finds nothing after them)."""
    a, b = pair
    users = [f"cyclic-{n}" for n in range(60)]
    for user in users[::2]:
        store(a if partition_for(user, PARTITIONS) < 2 else b, config, user, some_events(user))

    async def lookups() -> None:
        async with http.post(f"{a.url}/v1/lookup", json={"users": users}) as response:
            assert response.status == 200
            await response.read()
        for user in users[:8]:  # at the owner and with one forward
            async with http.get(f"{a.url}/v1/users/{user}") as response:
                assert response.status == 200
                await response.read()

    await lookups()  # connections opened, everything first-time allocated
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            await lookups()
        assert gc.collect() == 0
    finally:
        gc.enable()


async def test_token_is_required_except_for_livez(config, http) -> None:
    a, b = await start_worker(config, token="s3cret"), await start_worker(config, token="s3cret")
    try:
        a.node.owners = dict.fromkeys(range(PARTITIONS), b.url)
        b.node.owners = dict.fromkeys(range(PARTITIONS), b.url)
        b.node.local = dict.fromkeys(range(PARTITIONS), "active")
        for path in ("/readyz", "/metrics", "/v1/routing", "/v1/users/u1"):
            status, body, headers = await get(http, a.url + path)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
            status, _, _ = await get(http, a.url + path, headers={"Authorization": "Bearer nope"})
            assert status == 401, path
        async with http.post(f"{a.url}/v1/users/u1/revealed", json={"intent": "upgrade"}) as r:
            assert r.status == 401
        async with http.delete(f"{a.url}/v1/users/u1") as r:
            assert r.status == 401  # nobody erases a user without the token
        assert not a.node.appended
        status, body, _ = await get(http, f"{a.url}/livez")
        assert status == 200 and body["live"]
        auth = {"Authorization": "Bearer s3cret"}
        status, body, _ = await get(http, f"{a.url}/v1/users/u1", headers=auth)
        assert status == 200 and body["served_by"]["worker"] == b.url  # the hop kept the token
    finally:
        await a.server.close()
        await b.server.close()


async def test_reveal_appends_a_command_keyed_by_user(pair, http, config) -> None:
    a, _ = pair
    user = user_on(3)
    async with http.post(f"{a.url}/v1/users/{user}/revealed", json={"intent": "upgrade"}) as r:
        assert r.status == 202
        body = await r.json()
    [(key, value, partition)] = a.node.appended
    assert key == user.encode() and partition == 3 == body["partition"]
    command = msgpack.unpackb(value)
    assert command == body["command"]
    assert {k: command[k] for k in ("user", "type", "intent")} == {
        "user": user,
        "type": "revealed",
        "intent": "upgrade",
    }
    assert isinstance(command["ts"], int) and command["id"].startswith("api-")
    async with http.post(f"{a.url}/v1/users/{user}/revealed", json={"intent": "x"}) as r:
        assert r.status == 400
        assert (await r.json())["declared"] == sorted(config.intents)
    assert len(a.node.appended) == 1


async def test_delete_appends_an_erase_command_keyed_by_user(pair, http) -> None:
    """DELETE /v1/users/{user}: 202 with the command (the id the `erased` output names),
    written keyed by the user to its partition; the worker applies it like any input."""
    a, _ = pair
    user = user_on(2)
    async with http.delete(f"{a.url}/v1/users/{user}", json={"reason": "GDPR 118"}) as r:
        assert r.status == 202
        body = await r.json()
    async with http.delete(f"{a.url}/v1/users/{user}") as r:  # no body: no reason
        assert r.status == 202
        bare = (await r.json())["command"]
    [(key, value, partition), (_, second, _)] = a.node.appended
    assert key == user.encode() and partition == 2 == body["partition"]
    command = msgpack.unpackb(value)
    assert command == body["command"]
    assert {k: command[k] for k in ("user", "type", "reason")} == {
        "user": user,
        "type": "erase",
        "reason": "GDPR 118",
    }
    assert command["id"].startswith("erase-") and command["id"] != bare["id"]
    assert "reason" not in msgpack.unpackb(second)
    event = decode_event(value)
    assert (event.type, event.user, event.at, event.id) == (
        "erase",
        user,
        command["ts"],
        command["id"],
    )
    for bad in ({"reason": 5}, {"why": "x"}, ["x"]):
        async with http.delete(f"{a.url}/v1/users/{user}", json=bad) as r:
            assert r.status == 400, bad
            assert "error" in await r.json()
    async with http.delete(f"{a.url}/v1/users/{user}", data=b"{not json") as r:
        assert r.status == 400
    assert len(a.node.appended) == 2


async def test_metrics_answer_openmetrics_when_the_scraper_asks(pair, http) -> None:
    """Prometheus sends `Accept: application/openmetrics-text;...`: it gets OpenMetrics (with
    its `# EOF`), and everyone else the plain text format."""
    a, _ = pair
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    async with http.get(f"{a.url}/metrics", headers={"Accept": accept}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await response.text()
    assert text.rstrip().endswith("# EOF")
    assert "# TYPE oracular_inputs counter" in text  # OpenMetrics names the family sans _total
    async with http.get(f"{a.url}/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "# EOF" not in await response.text()


async def test_metrics_are_prometheus_text(pair, http, config) -> None:
    a, _ = pair
    a.node.counters.update(
        {"applied": 12, "redelivered": 1, "late": 2, "closed_by_timer": 3, "weird-name": 2}
    )
    a.node.partition_counters.update(
        {("applied", 0): 5, ("applied", 5): 7, ("redelivered", 5): 1, ("late", 5): 2}
    )
    a.node.reasons.update({"timeout": 3})
    a.api.metrics.batch(0.004, 10)
    await get(http, f"{a.url}/v1/users/{user_on(0)}")
    async with http.get(f"{a.url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    # Per partition: those counted (5 is no longer owned) and those owned (0 and 1), zeros
    # included; late inputs per partition too, and no unlabelled copy of either.
    assert samples['oracular_inputs_total{outcome="applied",partition="0"}'] == 5
    assert samples['oracular_inputs_total{outcome="applied",partition="5"}'] == 7
    assert samples['oracular_inputs_total{outcome="redelivered",partition="5"}'] == 1
    assert samples['oracular_inputs_total{outcome="dead_lettered",partition="1"}'] == 0
    assert samples['oracular_inputs_total{outcome="ignored",partition="0"}'] == 0
    assert samples['oracular_late_total{partition="5"}'] == 2
    assert samples['oracular_late_total{partition="1"}'] == 0
    assert 'oracular_inputs_total{outcome="applied"}' not in samples
    assert "oracular_late_total" not in samples
    assert samples['oracular_episodes_closed_total{reason="timeout"}'] == 3
    assert samples['oracular_episodes_closed_total{reason="end"}'] == 0
    assert samples["oracular_closed_by_timer_total"] == 3
    assert samples["oracular_weird_name_total"] == 2
    assert samples['oracular_lookups_total{endpoint="user",status="unknown"}'] == 1
    assert samples['oracular_batch_seconds_bucket{le="0.005"}'] == 1
    assert samples['oracular_batch_seconds_bucket{le="0.0025"}'] == 0
    assert samples["oracular_batch_seconds_count"] == 1
    assert samples['oracular_partition_lag{partition="0"}'] == 0
    assert text.count("# TYPE oracular_inputs_total counter") == 1


def test_fausts_own_sensor_is_exported_as_faust_families() -> None:
    """Faust's Monitor (the sensor every app has) as `faust_*` samples, fed through its own
    sensor calls: a Faust upgrade that renames what the worker reads shows here."""
    monitor = Monitor()
    for offset in range(3):
        monitor.on_message_in(TP("oracular.events", 1), offset, SimpleNamespace())
    monitor.on_topic_buffer_full(TP("oracular.events", 1))
    sent = monitor.on_send_initiated(None, "oracular.predictions", SimpleNamespace(), 1, 1)
    monitor.on_send_completed(None, sent, None)
    monitor.on_send_error(None, RuntimeError("broker gone"), sent)
    text = render(monitor_families(monitor))
    samples = {
        name: float(value)
        for name, value in (
            line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("faust_")
        )
    }
    assert samples['faust_messages_received_total{topic="oracular.events"}'] == 3
    assert samples['faust_messages_sent_total{topic="oracular.predictions"}'] == 1
    assert samples["faust_messages_active"] == 3
    assert samples["faust_send_errors_total"] == 1
    assert samples['faust_topic_buffer_full_total{partition="1",topic="oracular.events"}'] == 1
    assert samples["faust_send_latency_avg_seconds"] > 0
    assert samples["faust_rebalances_total"] == 0
    assert text.count("# TYPE faust_") == len(samples)  # each family once, one sample each


def test_metrics_come_with_the_process_metrics_and_speak_openmetrics_too() -> None:
    """prometheus-client writes the exposition: this process's own metrics (open file
    descriptors for the connection-flood alert, memory, CPU) come with the families, and the
    same families read back through its OpenMetrics parser."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from streams.lookup.metrics import Metrics

    metrics = Metrics()
    metrics.lookup("user", "found", 0.002)
    families = [*metrics.families(), Family("oracular_odd", "counter", "No _total.").add(1)]
    text = render(families)
    for name in ("process_open_fds", "process_resident_memory_bytes", "process_cpu_seconds_total"):
        assert any(line.startswith(f'{name}{{process="worker"}} ') for line in text.splitlines())
    assert 'oracular_lookups_total{endpoint="user",status="found"} 1.0' in text
    assert "# TYPE oracular_lookups_total counter" in text
    assert "# TYPE oracular_odd untyped" in text  # not claimed a counter without _total
    parsed = {f.name: f for f in text_string_to_metric_families(render(families, openmetrics=True))}
    assert parsed["oracular_lookups"].type == "counter"
    assert parsed["oracular_lookup_seconds"].type == "histogram"
    assert parsed["process_open_fds"].type == "gauge"


async def test_oracular_query_prints_the_answer(pair, config, capsys) -> None:
    """`oracular query` against a worker: a readable table; errors say what to do."""
    from streams.cli import main

    a, b = pair
    user = user_on(2)
    store(b, config, user, some_events(user))
    code = await asyncio.to_thread(main, ["query", user, "--url", a.url, "--explain"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"user {user}: known" in out and f"served by {b.url} (active)" in out
    assert "upgrade" in out and "pricing.viewed" in out and "suppressed until" in out
    code = await asyncio.to_thread(main, ["query", user, "--url", a.url, "--intent", "nope"])
    assert code == 2 and "unknown intent 'nope'" in capsys.readouterr().err
    code = await asyncio.to_thread(main, ["query", user, "--url", "http://127.0.0.1:9"])
    assert code == 69 and "cannot reach" in capsys.readouterr().err
    code = await asyncio.to_thread(main, ["query", "..", "--url", a.url])
    assert code == 2 and "POST /v1/lookup" in capsys.readouterr().err


def test_api_settings_are_validated_and_the_token_never_shown() -> None:
    from streams.settings import SettingsError, describe, settings_from_env

    with pytest.raises(SettingsError) as caught:
        settings_from_env(
            {
                "ORACULAR_API_PORT": "70000",
                "ORACULAR_API_URL": "worker-1:6067",
                "ORACULAR_READY_MAX_LAG": "-1",
                "ORACULAR_API_FORWARD_TIMEOUT_S": "0",
            }
        )
    message = str(caught.value)
    for var in ("API_PORT", "API_URL", "READY_MAX_LAG", "API_FORWARD_TIMEOUT_S"):
        assert f"ORACULAR_{var}" in message
    settings = settings_from_env({"ORACULAR_API_TOKEN": "s3cret", "ORACULAR_API_PORT": "0"})
    assert settings.api_token == "s3cret" and settings.api_port == 0
    assert "s3cret" not in describe(settings) and "s3cret" not in repr(settings)


def test_fausts_web_server_serves_no_table_or_router_views(tmp_path, config) -> None:
    """With Faust's own web server on (ORACULAR_WEB_PORT), its raw table views (stored state,
    no token) and its router (the workers' URLs) are not served, and it binds to the API's
    host, not every interface."""
    from streams.settings import settings_from_env
    from streams.worker import create_worker

    settings = settings_from_env(
        {"ORACULAR_WEB_PORT": "0", "ORACULAR_DATADIR": str(tmp_path / "state")}
    )
    app = create_worker(settings, config)
    assert app.conf.web_enabled and app.conf.web_bind == "127.0.0.1"
    prefixes = {prefix for prefix, _ in app.web.blueprints._enabled}
    assert "/table" not in prefixes and "/router" not in prefixes, prefixes
    assert prefixes, "Faust's other views stay (a check that the list was read at all)"


def test_advertised_url_is_spelled_as_fausts_assignor_spells_it() -> None:
    from streams.lookup.api import advertised_url, bind
    from streams.settings import Settings

    sock = bind("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert advertised_url(Settings(), sock) == f"http://127.0.0.1:{port}"
        url = advertised_url(Settings(api_url="http://Worker-1:6067/"), sock)
        assert url == "http://worker-1:6067"
        with pytest.raises(OSError):
            bind("127.0.0.1", port).close()  # listening already: a second worker cannot take it
    finally:
        sock.close()


async def test_an_unreadable_stored_state_is_a_500_for_that_user_only(pair, http, config) -> None:
    a, _ = pair
    broken, fine = user_on(0, "broken"), user_on(0, "fine")
    a.node.tables.setdefault(0, {})[broken.encode()] = b"\xc1 not msgpack"
    status, body, _ = await get(http, f"{a.url}/v1/users/{broken}")
    assert status == 500 and body == {"error": "internal error", "status": 500, "id": body["id"]}
    async with http.post(f"{a.url}/v1/lookup", json={"users": [broken, fine]}) as response:
        assert response.status == 200
        results = (await response.json())["results"]
    assert [r["status"] for r in results] == ["error", "unknown"]
    assert "cannot be read" in results[0]["error"]


def test_answer_equals_predict_and_explain_on_the_stored_state(config) -> None:
    """`answer` reads the state as of `at` once for all intents: the same numbers as
    engine.predict and engine.explain on the stored state, at times before, at and long
    after the user's last event (idle episodes closed, attribution windows settled)."""
    from bench.synthetic import clickstream
    from streams.lookup.serving import UserRead, answer

    events = clickstream(config, 6000, 60, seed=4)
    replayer = Replayer(config)
    rng = random.Random(1)
    for n, event in enumerate(events):
        replayer.feed(event)
        if n % 29:
            continue
        state = replayer.states[event.user]
        for at in (event.at - 5000, event.at, event.at + rng.randrange(40 * 24 * 3600 * 1000)):
            body = answer(
                UserRead(state, True, 0, 1),
                event.user,
                intents=None,
                at=at,
                with_explain=True,
                served_by={},
                config_id="x",
            )
            assert body["at"] == max(at, state.clock)
            for intent in config.intents:
                want, why = predict(state, intent, at), explain(state, intent, at)
                got = body["intents"][intent]
                assert [got["p"], got["lower"], got["reveal"], got["suppressed_until"]] == [
                    want.p,
                    want.lower,
                    want.reveal,
                    want.suppressed_until,
                ]
                assert got["explain"]["p"] == why.p
                assert got["explain"]["episodes"] == {
                    "hits": why.episodes.hits,
                    "misses": why.episodes.misses,
                }
                for name, signal in why.signals.items():
                    shown = got["explain"]["signals"][name]
                    assert [shown[k] for k in ("learned", "effective", "contribution")] == [
                        signal.learned,
                        signal.effective,
                        signal.contribution,
                    ]
                    assert [shown[k] for k in ("hits", "misses", "seen", "impact")] == [
                        signal.hits,
                        signal.misses,
                        signal.seen,
                        signal.impact,
                    ]


# --- answers from the worker's cache of decoded users -------------------------------------


def stored_user(config: Any, user: str, partition: int, offset: int = 41) -> StoredUser:
    replayer = Replayer(config)
    for event in some_events(user):
        replayer.feed(event)
    return StoredUser(replayer.states[user], partition, offset)


def test_state_cache_peek_keeps_lru_order_and_counters(config) -> None:
    """peek (the API thread's read) neither counts nor moves a user: the worker's LRU
    eviction and hit rate are what they would be without lookups."""
    cache = StateCache(3)
    users = {key: stored_user(config, key.decode(), 0) for key in (b"a", b"b", b"c", b"d")}
    for key in (b"a", b"b", b"c"):
        cache.put(key, users[key])
    assert cache.peek(b"a") is users[b"a"]
    assert cache.peek(b"zz") is None
    assert (cache.hits, cache.misses) == (0, 0)
    assert list(cache.users) == [b"a", b"b", b"c"]
    cache.put(b"d", users[b"d"])  # evicts the least recently used: a, though a was peeked
    assert list(cache.users) == [b"b", b"c", b"d"]
    assert cache.peek(b"a") is None
    assert cache.get(b"b") is users[b"b"] and (cache.hits, cache.misses) == (1, 0)


def test_state_cache_peek_from_another_thread_while_the_worker_churns(config) -> None:
    """The API thread peeks while the worker's thread puts, evicts, drops and clears: every
    peek gives None or the user's own entry, and nothing raises."""
    cache = StateCache(64)
    users = [stored_user(config, "u", n % PARTITIONS) for n in range(8)]
    keys = [f"user-{n}".encode() for n in range(256)]
    owner = {key: users[n % len(users)] for n, key in enumerate(keys)}
    stop = threading.Event()
    failures: list[BaseException] = []

    def worker() -> None:
        rng = random.Random(5)
        try:
            while not stop.is_set():
                for key in rng.sample(keys, 32):
                    cache.put(key, owner[key])
                    cache.get(rng.choice(keys))
                cache.drop([rng.randrange(PARTITIONS)])
                if rng.random() < 0.05:
                    cache.clear()
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    thread = threading.Thread(target=worker)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over as often as possible
    thread.start()
    try:
        seen = 0
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            for key in keys:
                found = cache.peek(key)
                assert found is None or found is owner[key]
                seen += found is not None
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
    assert not failures, failures
    assert seen > 0


class Decoded(ReplicaCache):
    """The API process's users read, filled by hand (with whole states: they predict what a
    reading of them predicts)."""

    def put(self, key: bytes, stored: StoredUser) -> None:
        self.keep(key, UserRead(stored.state, True, stored.partition, stored.last_offset))


def cached_pair(a: Worker, b: Worker) -> tuple[Decoded, Decoded]:
    caches = Decoded(Replica()), Decoded(Replica())
    a.api.cache, b.api.cache = caches
    return caches


async def lookups(http: ClientSession, url: str, user: str, at: int) -> list[Any]:
    """The single-user, single-intent, explained and batch answers for `user` through `url`."""
    bodies = []
    for path in (
        f"/v1/users/{user}?at={at}",
        f"/v1/users/{user}/intents/churn?at={at}",
        f"/v1/users/{user}?at={at}&explain=true",
    ):
        status, body, _ = await get(http, url + path)
        assert status == 200, body
        bodies.append(body)
    batch = {"users": [user, {"user": user, "intents": ["upgrade"]}], "at": at}
    async with http.post(f"{url}/v1/lookup", json=batch) as response:
        assert response.status == 200
        bodies.append(await response.json())
    return bodies


async def test_a_lookup_from_the_cache_equals_one_from_the_store(pair, http, config) -> None:
    """The owner answers from its cache of users read without reading its table, and the
    answers (single, one intent, explained, batch; direct and forwarded) are the store's. An
    explained lookup reads the whole state from the table: the cache holds readings."""
    a, b = pair
    user = user_on(2)
    store(b, config, user, some_events(user))
    at = TS + 90 * MIN
    from_store = [await lookups(http, w.url, user, at) for w in (a, b)]
    assert b.node.gets == 10 and a.node.gets == 0
    _, cache_b = cached_pair(a, b)
    raw = b.node.tables[2][user.encode()]
    cache_b.put(user.encode(), decode_stored(raw, config))
    from_cache = [await lookups(http, w.url, user, at) for w in (a, b)]
    assert from_cache == from_store
    assert b.node.gets == 12 and a.node.gets == 0  # only the 2 explained read the table
    assert b.api.reads == {"cache": 8, "table": 12}
    assert from_cache[0][0]["intents"]["upgrade"]["p"] == (
        predict(decode_stored(raw, config).state, "upgrade", at).p
    )


async def test_a_cache_miss_reads_the_store(pair, http, config) -> None:
    """A user the cache does not hold (evicted, or unknown) is read from the table."""
    a, b = pair
    _, cache_b = cached_pair(a, b)
    known, unknown, other = user_on(2, "known"), user_on(2, "unknown"), user_on(3, "other")
    state = store(b, config, known, some_events(known))
    cache_b.put(other.encode(), stored_user(config, other, 3))
    at = TS + 90 * MIN
    status, body, _ = await get(http, f"{a.url}/v1/users/{known}?at={at}")
    assert status == 200 and body["known"] and body["as_of"] == state.clock
    assert body["intents"]["upgrade"]["p"] == predict(state, "upgrade", at).p
    status, body, _ = await get(http, f"{b.url}/v1/users/{unknown}?at={at}")
    assert status == 200 and body["known"] is False
    assert b.node.gets == 2 and b.api.reads == {"table": 2}
    async with http.get(f"{b.url}/metrics") as response:
        text = await response.text()
    assert 'oracular_lookup_reads_total{source="table"} 2' in text
    assert 'oracular_lookup_reads_total{source="cache"} 0' in text


async def test_standby_and_settling_reads_never_use_the_cache(pair, http, config) -> None:
    """The cache holds the partitions this worker applies: a standby copy, or an active one
    being rebalanced or restored (read with ?stale=true), is read from the table. (Here the
    cache holds another state than the table, to tell which one answered.)"""
    a, b = pair
    _, cache_b = cached_pair(a, b)
    user = user_on(2)
    state = store(b, config, user, some_events(user))
    cache_b.put(user.encode(), StoredUser(create_state(config), 2, 7))
    b.node.local[2] = "standby"
    b.node.owners[2] = a.url  # a rebalance moved partition 2; B keeps a standby copy
    status, body, _ = await get(http, f"{b.url}/v1/users/{user}?stale=true")
    assert status == 200 and body["served_by"]["role"] == "standby"
    assert body["as_of"] == state.clock and body["position"]["offset"] == 41
    b.node.local[2], b.node.owners[2], b.node.settling = "active", b.url, True
    status, body, _ = await get(http, f"{b.url}/v1/users/{user}?stale=true")
    assert status == 200 and body["served_by"]["role"] == "active"
    assert body["as_of"] == state.clock and body["position"]["offset"] == 41
    async with http.post(f"{b.url}/v1/lookup", json={"users": [user], "stale": True}) as r:
        assert (await r.json())["results"][0]["position"]["offset"] == 41
    assert b.node.gets == 3 and b.api.reads == {"table": 3}
    b.node.settling = False  # settled: the cache answers
    status, body, _ = await get(http, f"{b.url}/v1/users/{user}")
    assert status == 200 and body["position"]["offset"] == 7
    assert b.node.gets == 3 and b.api.reads == {"table": 3, "cache": 1}


# --- a batch all owned by one other worker is passed on as the owner encoded it ------------


async def test_a_batch_all_on_the_other_worker_is_its_answer_passed_on(
    pair, http, config, monkeypatch
) -> None:
    """Through A, a batch of B's users gets B's answer byte for byte (A checks it is an answer
    for those users, and does not encode it again), with the same counts in A's metrics as
    when A merged it."""
    a, b = pair
    encoded_by_api = []

    def batch_body(*args: Any) -> Any:
        encoded_by_api.append(args)
        return serving_batch_body(*args)

    monkeypatch.setattr(api_module, "batch_body", batch_body)
    users = [user_on(2 + n % 2, f"whole-{n}") for n in range(40)]
    for user in users[::2]:
        store(b, config, user, some_events(user))
    body = {"users": [*users[:-1], {"user": users[-1], "intents": ["churn"]}], "at": TS + MIN}
    answers = []
    for worker in (b, a):
        async with http.post(f"{worker.url}/v1/lookup", json=body) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json; charset=utf-8"
            answers.append(await response.read())
    assert answers[0] == answers[1]
    decoded = json.loads(answers[1])
    assert [r["user"] for r in decoded["results"]] == users
    assert decoded["counts"] == {"unknown": 20, "found": 20}
    assert a.api.metrics.lookups[(("endpoint", "batch"), ("status", "found"))] == 20
    assert a.api.metrics.lookups[(("endpoint", "batch"), ("status", "unknown"))] == 20
    assert dict(a.api.metrics.forwards) == {(("outcome", "200"),): 1}
    assert len(encoded_by_api) == 2  # B's answers (asked, forwarded); A passed it on as it is
    mixed = {"users": [users[0], user_on(0, "mine")], "at": TS + MIN}
    async with http.post(f"{a.url}/v1/lookup", json=mixed) as response:
        assert response.status == 200
        assert [r["user"] for r in (await response.json())["results"]] == mixed["users"]
    assert len(encoded_by_api) == 4  # not all on B: B's part, merged by A and encoded


def test_batch_counts_reads_only_a_head_that_adds_up() -> None:
    results = [{"user": "u", "status": "found"}, {"user": "v", "status": "unknown"}]
    counts = {"found": 1, "unknown": 1}
    encoded = json.dumps(batch_body(77, counts, results), separators=(",", ":")).encode()
    assert batch_counts(encoded, 77, 2) == counts
    assert batch_counts(encoded, 78, 2) is None  # another time
    assert batch_counts(encoded, 77, 3) is None  # not every user answered
    reordered = {"counts": counts, "at": 77, "results": results}
    assert batch_counts(json.dumps(reordered, separators=(",", ":")).encode(), 77, 2) is None
    spaced = json.dumps(batch_body(77, counts, results)).encode()  # `"at": 77`
    assert batch_counts(spaced, 77, 2) is None
    assert (
        batch_counts(b'{"at":77,"counts":{"found":1,"unknown":true},"results":[]}', 77, 2) is None
    )
    assert batch_counts(b'{"at":77,"counts":{"found":2}, "results":[]}', 77, 2) is None
    assert batch_counts(b'{"at":77,"counts":{"found":2,', 77, 2) is None
    assert batch_counts(b"<html>", 77, 2) is None


async def test_an_owner_answer_of_another_shape_is_decoded(config) -> None:
    """An owner whose batch answer has another key order (another version, say): A decodes
    it and answers in its own shape. (The owner here is a stand-in whose results are not real
    answers, so this client does not check them against the document.)"""
    owner = web.Application()
    seen = []

    async def lookup(request: web.Request) -> web.Response:
        asked = await request.json()
        seen.append(asked)
        results = [{"user": u["user"], "status": "found", "p": 0.5} for u in asked["users"]]
        return web.json_response(
            {"results": results, "counts": {"found": len(results)}, "at": asked["at"]},
            headers={APP_HEADER: "oracular"},
        )

    owner.router.add_post("/v1/lookup", lookup)
    owner_server = TestServer(owner, host="127.0.0.1")
    await owner_server.start_server()
    worker = await start_worker(config)
    try:
        worker.node.owners = dict.fromkeys(range(PARTITIONS), str(owner_server.make_url("")))
        async with (
            ClientSession() as http,
            http.post(f"{worker.url}/v1/lookup", json={"users": ["x", "y"], "at": 5}) as r,
        ):
            assert r.status == 200
            body = await r.json()
        assert list(body) == ["at", "counts", "results"]
        assert body["counts"] == {"found": 2} and [x["user"] for x in body["results"]] == ["x", "y"]
        assert len(seen) == 1  # one forward, never a second one
    finally:
        await worker.server.close()
        await owner_server.close()


def test_a_single_intent_lookup_predicts_only_that_intent(config, monkeypatch) -> None:
    """The state is predicted once for all intents asked; only those are predicted."""
    from streams.lookup import serving
    from streams.lookup.serving import UserRead, answer

    user = "one-intent"
    state = stored_user(config, user, 0).state
    predicted: list[str] = []
    real = serving.predict_read

    def spy(state: Any, at: int, intents: Any) -> Any:
        found = real(state, at, intents)
        predicted.extend(found)
        return found

    monkeypatch.setattr(serving, "predict_read", spy)
    kwargs: dict[str, Any] = {"at": TS + 90 * MIN, "with_explain": False, "served_by": {}}
    one = answer(UserRead(state, True, 0, 1), user, intents=["churn"], config_id="x", **kwargs)
    assert predicted == ["churn"] and list(one["intents"]) == ["churn"]
    every = answer(UserRead(state, True, 0, 1), user, intents=None, config_id="x", **kwargs)
    assert predicted == ["churn", *config.intents]
    assert one["intents"]["churn"] == every["intents"]["churn"]
    assert one["intents"]["churn"]["p"] == predict(state, "churn", TS + 90 * MIN).p


async def test_a_batch_yields_the_loop_by_time_not_by_count(
    pair, http, config, monkeypatch
) -> None:
    """A batch gives the API's loop back after YIELD_AFTER_S of answering: never within a
    short batch, after every user when that time is 0."""
    a, _ = pair
    yields = []

    async def counted() -> None:
        yields.append(1)
        await asyncio.sleep(0)

    monkeypatch.setattr(api_module, "_yield", counted)
    users = [user_on(n % 2, f"mine-{n}") for n in range(50)]  # all on A
    for limit, expected in ((60.0, 0), (0.0, len(users))):
        yields.clear()
        monkeypatch.setattr(api_module, "YIELD_AFTER_S", limit)
        async with http.post(f"{a.url}/v1/lookup", json={"users": users}) as response:
            assert response.status == 200
            assert (await response.json())["counts"] == {"unknown": len(users)}
        assert len(yields) == expected


async def test_every_answer_says_how_long_the_worker_spent_on_it(pair, http, config) -> None:
    """`Server-Timing: app;dur=MS` on answers and errors alike, never more than the client's
    own round trip: a client (and `python -m bench.lookup`) tells the worker's time from the
    network's and the CPU wait's. A forwarded answer carries the forwarding worker's time."""
    a, b = pair
    user = user_on(2)
    store(b, config, user, some_events(user))
    for url in (f"{a.url}/v1/users/{user}", f"{b.url}/v1/users/{user}", f"{a.url}/v1/users/%ff"):
        started = time.perf_counter()
        status, _, headers = await get(http, url)
        elapsed_ms = (time.perf_counter() - started) * 1000
        name, _, dur = headers["Server-Timing"].partition(";dur=")
        assert name == "app" and 0 < float(dur) <= elapsed_ms, (url, status, headers)
