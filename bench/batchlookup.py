"""`python -m bench.batchlookup`: the CPU of one batch lookup of 100 users, in-process.

No broker, no HTTP, no other process: the lookup API's own batch handler
(`streams.lookup.api`) over an in-memory node whose replica (`streams.lookup.replica`) holds
`--users` users replayed from the synthetic clickstream (bench/synthetic.py) and encoded as
the worker stores them. Each batch is `POST /v1/lookup {"users": [100 ids]}` handed to the
handler as a request object, and timed in CPU time (`time.process_time`), so other jobs on
the machine's cores do not count. Three cases:

- owner, cold: every user of the batch owned here and not decoded yet (users not read before,
  while the users earlier batches decoded stay in the decoded-user cache, as they stay in the
  API process until their next write): decode, answers, the body's JSON;
- owner, warm: the same users again, decoded;
- forwarding: every user owned by another worker; the hop itself is replaced by the owner's
  answer to that batch computed beforehand, so this is the forwarding worker's own CPU: its
  request's parse and routing, the forward's body, and the parse and check of the answer.

The read time is an hour after the stream's last event (most users in a timed-out episode,
as in `bench.lookup`). The process runs the API process's collector policy
(`streams.runtime.memory.GcPolicy`: the young generation's threshold, the replica frozen once
built, a freeze a second), so the collections a batch meets are the ones it meets there. It
prints the median, the 90th percentile and the worst CPU milliseconds per batch of each case,
and with `--profile`, a cProfile of the owner's cold batches.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import json
import pstats
import random
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.synthetic import clickstream
from bench.workers import CONFIG
from engine import Replayer
from schemas.config import load_config
from schemas.stored import StoredUser, encode_stored
from streams.lookup.api import Api, _Handlers
from streams.lookup.replica import Replica, ReplicaCache
from streams.lookup.serving import PartitionView, Role, partition_for
from streams.runtime.memory import GcPolicy

PARTITIONS = 8
OWNER = "http://127.0.0.1:1"
OTHER = "http://127.0.0.1:2"
HOUR_MS = 3_600_000


@dataclass
class MemoryNode:
    """The `streams.lookup.api.Node` a batch needs: the replica's values, and who owns what."""

    config: Any
    replica: Replica
    me: str
    owner: str
    partitions: int = PARTITIONS
    events_topic: str = "oracular.events"
    counters: dict[str, int] = field(default_factory=dict)

    def view(self, partition: int) -> PartitionView:
        local: Role | None = "active" if self.owner == self.me else None
        return PartitionView(local, False, self.owner, self.me)

    def get(self, partition: int, key: bytes) -> bytes | None:
        return self.replica.values.get(partition, {}).get(key)

    def counts(self) -> Mapping[str, int]:
        return self.counters


@dataclass
class Request:
    """What the batch handler reads of an aiohttp request: its body and headers."""

    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    async def read(self) -> bytes:
        return self.body


def replica_of(
    config: Any, users: int, events: int, seed: int = 7
) -> tuple[Replica, list[str], int]:
    """A replica holding `users` users' stored values; their ids; the last event's time."""
    stream = clickstream(config, events, users, seed=seed)
    replayer = Replayer(config)
    for event in stream:
        replayer.feed(event)
    replica = Replica()
    for offset, (user, state) in enumerate(replayer.states.items()):
        partition = partition_for(user, PARTITIONS)
        raw = encode_stored(StoredUser(state, partition, offset))
        replica.values.setdefault(partition, {})[user.encode()] = raw
    replica.synced.update(range(PARTITIONS))
    return replica, sorted(replayer.states), max(event.at for event in stream)


def handlers(config: Any, replica: Replica, me: str, owner: str, at: int) -> _Handlers:
    node = MemoryNode(config, replica, me, owner)  # what a batch uses of a `Node`, no more
    api = Api(node, cache=ReplicaCache(replica))  # type: ignore[arg-type]
    api.clock = lambda: at
    return _Handlers(api)


async def lookup(
    handler: _Handlers, body: bytes, headers: Mapping[str, str] | None = None
) -> bytes:
    """One `POST /v1/lookup` through the handler; the response's body."""
    response = await handler.batch(Request(body, headers or {}))  # type: ignore[arg-type]
    assert response.status == 200, response.body
    return bytes(response.body)  # type: ignore[arg-type]


def batch_request(users: list[str]) -> bytes:
    return json.dumps({"users": users}).encode()


async def measure(
    args: argparse.Namespace,
) -> tuple[dict[str, tuple[float, float, float]], str]:
    config = load_config(args.config)
    replica, users, last = replica_of(config, args.users, args.events)
    at = last + HOUR_MS
    owner = handlers(config, replica, OWNER, OWNER, at)
    forwarder = handlers(config, replica, OTHER, OWNER, at)
    memory = GcPolicy()  # the API process's (streams.lookup.process.collect_garbage)
    GcPolicy.tune()
    memory.freeze()
    rng = random.Random(args.seed)
    cpu: dict[str, list[float]] = {"owner, cold": [], "owner, warm": [], "forwarding": []}
    profile = cProfile.Profile()
    answers = hashlib.sha256()  # of every answer: the same on two versions, the same bytes

    async def timed(case: str, handler: _Handlers, body: bytes) -> bytes:
        started = time.process_time()
        if args.profile and case.startswith(args.profile_case):
            profile.enable()
        answer = await lookup(handler, body)
        profile.disable()
        cpu[case].append(time.process_time() - started)
        return answer

    unread: list[str] = []
    for _ in range(args.batches):
        if len(unread) < args.size:  # every user read: start again with none decoded
            unread = rng.sample(users, len(users))
            replica.decoded.clear()
        body = batch_request(unread[-args.size :])
        del unread[-args.size :]
        answer = await timed("owner, cold", owner, body)
        answers.update(answer)
        assert await timed("owner, warm", owner, body) == answer

        async def hop(*_: Any, payload: bytes = answer) -> tuple[int, bytes, dict[str, str]]:
            return 200, payload, {}

        forwarder._forward = hop  # type: ignore[method-assign,assignment]
        assert await timed("forwarding", forwarder, body) == answer
        memory.tick()  # its freeze a second (the API process's timer), here between batches
    if args.profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile)
    figures = {case: _figures(times) for case, times in cpu.items()}
    return figures, answers.hexdigest()


def _figures(times: list[float]) -> tuple[float, float, float]:
    """(median, 90th percentile, worst) of CPU seconds, in ms."""
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return statistics.median(ordered) * 1000, p90 * 1000, ordered[-1] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="print the top N of a cProfile")
    parser.add_argument(
        "--profile-case",
        default="owner, cold",
        choices=["owner, cold", "owner, warm", "forwarding"],
    )
    args = parser.parse_args()
    figures, digest = asyncio.run(measure(args))
    for case, (median, p90, worst) in figures.items():
        print(
            f"{case}: {median:.3f} ms CPU per batch of {args.size} (median of {args.batches};"
            f" p90 {p90:.3f}, worst {worst:.3f})"
        )
    print(f"answers: sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
