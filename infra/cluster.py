"""A local three-node Apache Kafka cluster (KRaft) from the same Maven jars as infra/broker.py.

Each node is a combined broker+controller with its own runtime dir (``node<id>/``: config,
data, log, pid), its own client and controller ports, and the cluster's one id; the three
controllers form a static quorum (``controller.quorum.voters``). Replication is what a
production cluster has: replication factor 3 for every topic created without one and for the
internal topics (``__consumer_offsets``, the transaction log), ``min.insync.replicas=2``.

Used three ways:

- CLI: ``python -m infra.cluster up|down|status`` (``make cluster-up``, ``make cluster-down``).
  ``up`` prints the bootstrap list and writes it to ``<dir>/bootstrap.txt``.
- Test fixtures: ``start_cluster(workdir)`` returns a :class:`Cluster` (``.bootstrap``,
  ``.kill(node)`` with SIGKILL, ``.restart(node)`` on the same data dir and ports,
  ``.partitions(topics)`` for the leaders and in-sync replicas, ``.stop()``).
- Readiness is a real client request: every node answers a metadata request and the metadata
  lists all three brokers (never a sleep).

Everything that starts, formats and stops one node is infra/broker.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from infra.broker import (
    DEFAULT_CACHE_DIR,
    HOST,
    REPO_ROOT,
    Broker,
    BrokerError,
    _format_storage,
    choose_ports,
    cluster_id,
    fetch_jars,
    find_running,
    jars_fetched,
    probe,
    require_java_17,
    require_tools,
    run_cli,
    server_properties,
    spawn,
    wait_ready,
)
from streams.tools.admin import quiet_aiokafka

NODES = 3
DEFAULT_DIR = REPO_ROOT / "var" / "cluster"
DEFAULT_PORT = 19092
"""Node n (1-based) listens on DEFAULT_PORT + 2(n-1), its controller on the port after."""
READY_TIMEOUT_S = 120.0  # three JVMs starting at once on a busy 2-core box
REJOIN_TIMEOUT_S = 120.0  # a restarted node caught up and back in every in-sync replica set
METADATA_TIMEOUT_S = 10.0

CLUSTER_SETTINGS = {
    # Every topic created without a replication factor, and the internal ones, on all three.
    "default.replication.factor": "3",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "share.coordinator.state.topic.replication.factor": "3",
    # A write with acks=all needs two copies: one node may be down, and nothing acknowledged
    # lives on one disk only.
    "min.insync.replicas": "2",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.min.isr": "2",
    # Never elect a replica that is not in sync (Kafka's default, stated): it would lose writes.
    "unclean.leader.election.enable": "false",
}
"""Written over infra/broker.py's SINGLE_NODE_SETTINGS for each node."""


def say(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


@dataclass
class Node:
    """One broker+controller of the cluster: its id, runtime dir and port pair."""

    node_id: int
    workdir: Path
    port: int
    controller_port: int
    broker: Broker | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        process = self.broker.process if self.broker else None
        if process is not None:
            return process.poll() is None
        return self.broker is not None and find_running(self.workdir) is not None


@dataclass
class Partition:
    """A partition's leader (-1: none) and in-sync replicas, as the metadata has them."""

    topic: str
    partition: int
    leader: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]


@dataclass
class Cluster:
    """Three nodes started (or found running) by this module."""

    workdir: Path
    nodes: list[Node]
    lib: Path
    tie: bool = False
    killed: dict[int, float] = field(default_factory=dict)
    """Node id -> time.monotonic() of its SIGKILL, while it is down."""

    @property
    def bootstrap(self) -> str:
        """All three addresses, comma-separated (what clients and ORACULAR_BROKER take)."""
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id - 1]

    def live_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes if n.node_id not in self.killed)

    # --- start, stop, fail ----------------------------------------------------------------

    def start(self, ready_timeout: float = READY_TIMEOUT_S) -> None:
        """Launch every node that is not running, then wait until all are ready."""
        started = time.monotonic()
        for node in self.nodes:
            if not node.running:
                node.broker = spawn(self.lib, node.workdir, node.port, tie=self.tie)
        try:
            self.wait_ready(ready_timeout)
        except BaseException:  # including Ctrl-C: leave no half-started cluster behind
            self.stop(timeout=5.0)
            raise
        say(f"ready on {self.bootstrap} in {time.monotonic() - started:.1f} s")

    def wait_ready(self, timeout_s: float) -> None:
        """Every node answers a metadata request, and the metadata lists all of them."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            broker = node.broker
            assert broker is not None
            wait_ready(
                node.bootstrap,
                lambda n=node: n.running,  # type: ignore[misc]
                broker.log_path,
                max(deadline - time.monotonic(), 1.0),
            )
        while (live := self.broker_ids()) != {n.node_id for n in self.nodes}:
            if time.monotonic() > deadline:
                msg = f"The cluster's metadata lists brokers {sorted(live)} after {timeout_s} s."
                raise BrokerError(msg)
            time.sleep(0.25)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (no clean shutdown: no leadership handed over, nothing flushed)."""
        node = self.node(node_id)
        assert node.broker is not None and node.broker.process is not None, "not started here"
        node.broker.process.send_signal(signal.SIGKILL)
        node.broker.process.wait(30)
        self.killed[node_id] = time.monotonic()
        say(f"SIGKILL node {node_id} (pid {node.broker.pid})")

    def restart(self, node_id: int, ready_timeout: float = READY_TIMEOUT_S) -> float:
        """Start a stopped or killed node again on its data dir and ports; wait until it
        answers and the metadata lists it. Returns the seconds that took."""
        started = time.monotonic()
        self.relaunch(node_id)
        self.wait_back(node_id, ready_timeout)
        return time.monotonic() - started

    def relaunch(self, node_id: int) -> None:
        """Launch a stopped or killed node again (same data dir and ports); do not wait.

        Call it from the thread that started the cluster: with `stop_with_parent` the node
        gets SIGTERM when the thread that launched it ends (Linux's parent-death signal).
        """
        node = self.node(node_id)
        node.broker = spawn(self.lib, node.workdir, node.port, tie=self.tie)

    def wait_back(self, node_id: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until a relaunched node answers and the cluster's metadata lists it."""
        node = self.node(node_id)
        assert node.broker is not None
        deadline = time.monotonic() + timeout_s
        wait_ready(node.bootstrap, lambda: node.running, node.broker.log_path, timeout_s)
        while node_id not in self.broker_ids():
            if time.monotonic() > deadline:
                msg = f"node {node_id} answers but is not in the cluster's metadata"
                raise BrokerError(msg)
            time.sleep(0.25)
        self.killed.pop(node_id, None)

    def stop(self, *, wipe: bool = False, timeout: float = 20.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL); `wipe` also deletes their data."""
        # All at once: stopped one by one, the last nodes wait for a controller quorum that
        # has already gone, and each takes the whole timeout.
        brokers = [node.broker for node in self.nodes if node.broker is not None]
        threads = [
            threading.Thread(target=b.stop, kwargs={"wipe": wipe, "timeout": timeout})
            for b in brokers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for node in self.nodes:
            node.broker = None

    # --- what the metadata says -------------------------------------------------------------

    def broker_ids(self) -> set[int]:
        """The brokers the cluster's metadata lists now (a killed node drops out once the
        controller fences it); empty if no live node answers."""
        cluster = _metadata(self.live_bootstrap(), lambda admin: admin.describe_cluster())
        return {b["node_id"] for b in cluster["brokers"]} if cluster else set()

    def partitions(self, topics: Sequence[str]) -> list[Partition]:
        """Leader and in-sync replicas of every partition of `topics` (retried while the
        client's pick of a node is one that just died)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while (found := _metadata(self.live_bootstrap(), _describer(topics))) is None:
            if time.monotonic() > deadline:
                msg = f"no node answered a metadata request for {list(topics)}"
                raise BrokerError(msg)
            time.sleep(0.25)
        return found  # type: ignore[no-any-return]

    def wait_in_sync(self, node_id: int, topics: Sequence[str], timeout_s: float) -> float:
        """Wait until `node_id` is in every in-sync replica set of `topics`; the seconds."""
        started = time.monotonic()
        while True:
            behind = [p for p in self.partitions(topics) if node_id not in p.isr]
            if not behind:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                names = ", ".join(f"{p.topic}/{p.partition} isr {list(p.isr)}" for p in behind[:5])
                msg = f"node {node_id} not back in sync within {timeout_s:.0f} s: {names}"
                raise BrokerError(msg)
            time.sleep(0.5)


def _describer(topics: Sequence[str]) -> Any:
    async def describe(admin: Any) -> list[Partition]:
        described = await admin.describe_topics(list(topics))
        return [
            Partition(
                t["topic"], p["partition"], p["leader"], tuple(p["isr"]), tuple(p["replicas"])
            )
            for t in described
            for p in t["partitions"]
        ]

    return describe


def _metadata(bootstrap: str, request: Any) -> Any:
    """One admin request (`request(admin)`); None if no node answered."""

    async def ask() -> Any:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=int(METADATA_TIMEOUT_S * 1000)
        )
        try:
            with quiet_aiokafka():
                await asyncio.wait_for(admin.start(), METADATA_TIMEOUT_S)
                return await asyncio.wait_for(request(admin), METADATA_TIMEOUT_S)
        except Exception:  # not there / not ready: the caller retries or reports
            return None
        finally:
            await admin.close()

    return asyncio.run(ask())


def node_properties(
    cluster: Cluster, node: Node, overrides: Mapping[str, str] | None = None
) -> str:
    """infra/broker.py's server.properties with this node's id, the quorum and replication."""
    voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in cluster.nodes)
    return server_properties(
        node.workdir,
        node.port,
        node.controller_port,
        {
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            **CLUSTER_SETTINGS,
            **(overrides or {}),
        },
    )


def _ports(workdir: Path, port: int | None) -> list[tuple[int, int]]:
    """The nodes' (client, controller) ports: kept in ports.json, so a cluster restarted on
    its data keeps its quorum's addresses; else from `port` up (None or 0: free ports)."""
    saved = workdir / "ports.json"
    if saved.is_file():
        pairs = [tuple(pair) for pair in json.loads(saved.read_text())]
        if port in (None, 0) or pairs[0][0] == port:
            return pairs  # type: ignore[return-value]
    if port in (None, 0):
        pairs = []
        while len(pairs) < NODES:
            pair = choose_ports(None)
            if not set(pair) & {p for used in pairs for p in used}:
                pairs.append(pair)
    else:
        pairs = [choose_ports(port + 2 * n) for n in range(NODES)]
    saved.write_text(json.dumps(pairs) + "\n")
    return pairs  # type: ignore[return-value]


def start_cluster(
    workdir: Path = DEFAULT_DIR,
    port: int | None = None,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    ready_timeout: float = READY_TIMEOUT_S,
    stop_with_parent: bool = False,
    overrides: Mapping[str, str] | None = None,
) -> Cluster:
    """Start three nodes with their config, data and logs under `workdir`; wait until ready.

    `port=None` (or 0) picks free ports; otherwise node n listens on `port + 2(n-1)` and its
    controller on the next port. Nodes of an earlier run still running in `workdir` are
    reused. `stop_with_parent` makes the nodes exit with the calling process (test sessions).
    """
    require_tools("java", *([] if jars_fetched(cache_dir) else ["mvn"]))
    require_java_17()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    running = [find_running(workdir / f"node{n}") for n in range(1, NODES + 1)]
    if all(running) and all(probe(b.bootstrap) for b in running if b):
        pairs = _ports(workdir, None)
    else:
        for leftover in filter(None, running):
            say(f"stopping the earlier node (pid {leftover.pid}) in {leftover.workdir}")
            leftover.stop()
        running = [None] * NODES
        pairs = _ports(workdir, port)
    lib = fetch_jars(cache_dir)
    nodes = [
        Node(n, workdir / f"node{n}", client, controller, broker)
        for n, ((client, controller), broker) in enumerate(zip(pairs, running, strict=True), 1)
    ]
    cluster = Cluster(workdir, nodes, lib, tie=stop_with_parent)
    the_id = cluster_id(workdir)  # one id, copied to each node's dir before it is formatted
    for node in nodes:
        if node.broker is not None:
            continue
        (node.workdir / "logs").mkdir(parents=True, exist_ok=True)
        (node.workdir / "cluster.id").write_text(the_id + "\n")
        properties = node.workdir / "server.properties"
        properties.write_text(node_properties(cluster, node, overrides))
        _format_storage(lib, properties, node.workdir)
    if all(n.broker is not None for n in nodes):
        say(f"reusing the cluster already running on {cluster.bootstrap}")
    cluster.start(ready_timeout)
    (workdir / "bootstrap.txt").write_text(cluster.bootstrap + "\n")
    return cluster


def find_cluster(workdir: Path) -> Cluster | None:
    """The nodes recorded in `workdir` that still run (None if none does)."""
    workdir = workdir.resolve()
    saved = workdir / "ports.json"
    if not saved.is_file():
        return None
    pairs = json.loads(saved.read_text())
    nodes = [
        Node(n, workdir / f"node{n}", client, controller, find_running(workdir / f"node{n}"))
        for n, (client, controller) in enumerate(pairs, 1)
    ]
    if not any(n.broker for n in nodes):
        return None
    return Cluster(workdir, nodes, DEFAULT_CACHE_DIR / "lib")


def topic_replication(bootstrap: str, topics: Iterable[str]) -> dict[str, tuple[int, str]]:
    """Topic -> (replication factor, its effective min.insync.replicas)."""

    async def ask() -> dict[str, tuple[int, str]]:
        names = list(topics)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            with quiet_aiokafka():
                await admin.start()
            described = await admin.describe_topics(names)
            resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
            responses = await admin.describe_configs(resources)
        finally:
            await admin.close()
        factors = {  # the smallest of the topic's partitions (0: no such topic)
            t["topic"]: min((len(p["replicas"]) for p in t["partitions"]), default=0)
            for t in described
        }
        isr: dict[str, str] = {}
        for response in responses:
            for _code, _message, _type, name, entries in response.resources:
                for entry in entries:
                    if entry[0] == "min.insync.replicas":
                        isr[name] = entry[1]
        return {name: (factors.get(name, 0), isr.get(name, "?")) for name in names}

    return asyncio.run(ask())


# --- CLI --------------------------------------------------------------------------------------


def _cmd_up(args: argparse.Namespace) -> int:
    cluster = start_cluster(args.dir, args.port, ready_timeout=args.timeout)
    say(f"logs: {args.dir}/node*/logs/server.log; bootstrap list (also in bootstrap.txt):")
    print(cluster.bootstrap)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    cluster = find_cluster(args.dir)
    if cluster is not None:
        say(f"stopping the nodes on {cluster.bootstrap}")
        cluster.stop(wipe=args.wipe)
        say("stopped" + (" and wiped their data" if args.wipe else ""))
    else:
        say(f"no cluster running from {args.dir}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    cluster = find_cluster(args.dir)
    if cluster is None:
        print(f"not running (runtime dir {args.dir})")
        return 1
    listed = cluster.broker_ids()
    healthy = True
    for node in cluster.nodes:
        up = node.broker is not None and probe(node.bootstrap)
        healthy &= up and node.node_id in listed
        state = "answering" if up else "NOT running" if node.broker is None else "NOT answering"
        print(f"node {node.node_id}: {state} on {node.bootstrap}")
    print(f"brokers in the metadata: {sorted(listed)}")
    return 0 if healthy else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.cluster", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="runtime dir (default %(default)s)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the three nodes (or reuse them) and wait until ready")
    up.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="first client port; 0 = free ports"
    )
    up.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="readiness, seconds")
    up.set_defaults(run=_cmd_up)
    down = sub.add_parser("down", help="stop the nodes (SIGTERM, then SIGKILL after 20 s)")
    down.add_argument("--wipe", action="store_true", help="also delete topics and offsets")
    down.set_defaults(run=_cmd_down)
    sub.add_parser("status", help="is every node running, answering, listed?").set_defaults(
        run=_cmd_status
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
