"""The failover scenario: workers on a three-node cluster while the broker that leads the input
and changelog partitions is killed with SIGKILL and later restarted.

It is the chaos scenario (tests/chaos/scenario.py: a paced stream with malformed messages, the
same checks against the offline replay) on `infra.cluster`, with:

- every topic created with replication factor 3 (`ORACULAR_REPLICATION_FACTOR=3` for the
  worker's own: the changelog and Faust's assignor topic); the cluster's `min.insync.replicas`
  is 2. A row checks both on every topic of the run, and on `__consumer_offsets`;
- the broker fault replaced by a failover (`FailoverChaos`): when the plan's broker restart is
  due, the node leading the most input and changelog partitions is SIGKILLed (the metadata
  must show new leaders for them), kept down for `Failover.down_s`, started again on its data
  dir, and waited for until it is back in every in-sync replica set;
- the output topics stamped with the broker's append time (`LogAppendTime`), so the input
  stall can be measured: the longest any prediction came out after its event's time (each
  event is produced when the wall clock reaches its time), and the longest gap between
  outputs, both around the kill.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from infra.cluster import Cluster, Partition, start_cluster, topic_replication
from infra.processes import tail
from schemas.outputs import decode_output
from streams.settings.topics import TopicSpec
from streams.tools.admin import BrokerError, ensure_topics_async
from tests.integration.conftest import _unavailable
from tests.integration.support import Record
from tests.integration.worker_support import Deployment, TopicReader

from . import scenario
from .checks import Row, table
from .faults import Chaos
from .scenario import Plan

REPLICATION = 3
MIN_INSYNC = "2"
LEADERS_MOVED_TIMEOUT_S = 60.0  # a dead leader's partitions get new leaders (session: 9 s)
BACK_TIMEOUT_S = 120.0  # the restarted node answers, is listed, and is back in sync
STALL_BOUND_S = 60.0
"""The input stall a failover may cause before the run fails: Kafka's defaults fence a dead
broker after 9 s (broker.session.timeout.ms); the rest is the clients' retries, on a busy box."""
AROUND_KILL_S = 5.0  # the stall is measured from this long before the kill


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A three-node cluster of this module's own (stopped and wiped at the end). A cluster
    that cannot start fails the test under CI=true or REQUIRE_BROKER=1, else skips it."""
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("cluster"), None, stop_with_parent=True)
    except BrokerError as exc:
        _unavailable(str(exc))
    print(f"Kafka cluster: {cluster.bootstrap}, logs {cluster.workdir}/node*/logs/server.log")
    yield cluster
    cluster.stop(wipe=True, timeout=10.0)


@dataclass
class Failover:
    """The broker fault of a failover run and what it measured (seconds on the run's clock)."""

    cluster: Cluster
    down_s: float
    """How long the killed node stays down (from its SIGKILL to its start)."""
    dep: Deployment | None = None
    node: int | None = None
    led: list[Partition] = field(default_factory=list)
    controller: bool = False
    killed_at: float | None = None
    """time.time() of the SIGKILL."""
    moved_s: float | None = None
    back_s: float | None = None
    in_sync_s: float | None = None
    error: str | None = None
    """Why the failover did not complete (a bounded wait that ran out)."""

    def restart(self) -> None:  # the Restartable protocol; FailoverChaos calls `fail_over`
        raise NotImplementedError

    async def prepare(self, dep: Deployment) -> None:
        """Create the deployment's topics with replication factor 3, outputs stamped with the
        broker's append time (for the stall measure)."""
        self.dep = dep
        stamped = {dep.topics.predictions.name, dep.topics.episodes.name}
        specs = [
            TopicSpec(s.name, s.partitions, {**s.config, "message.timestamp.type": "LogAppendTime"})
            if s.name in stamped
            else s
            for s in dep.topics
        ]
        await ensure_topics_async(dep.bootstrap, specs, replication=REPLICATION)

    def topics(self) -> list[str]:
        assert self.dep is not None
        return [self.dep.topics.events.name, self.dep.changelog]

    async def fail_over(self, chaos: Chaos) -> None:
        """SIGKILL the node leading the most input and changelog partitions; keep it down
        `down_s`; start it again; wait until it is back in every in-sync replica set."""
        note, cluster = chaos.fleet.note, self.cluster
        partitions = await asyncio.to_thread(cluster.partitions, self.topics())
        self.node = _busiest(partitions)
        self.led = [p for p in partitions if p.leader == self.node]
        self.controller = await _controller(cluster.live_bootstrap()) == self.node
        note(
            f"SIGKILL broker {self.node}: leader of {_names(self.led)}"
            + (", the active controller" if self.controller else "")
        )
        self.killed_at = time.time()
        cluster.kill(self.node)
        start = time.monotonic()
        await asyncio.to_thread(self._wait_moved)
        self.moved_s = time.monotonic() - start
        now = await asyncio.to_thread(cluster.partitions, self.topics())
        note(f"new leaders after {self.moved_s:.1f} s: {_names(now)}")
        await asyncio.sleep(max(self.down_s - (time.monotonic() - start), 0.0))  # the outage
        note(f"restart broker {self.node} (down {time.monotonic() - start:.1f} s)")
        relaunched = time.monotonic()
        cluster.relaunch(self.node)  # on this thread: see Cluster.relaunch
        await asyncio.to_thread(cluster.wait_back, self.node, BACK_TIMEOUT_S)
        self.back_s = time.monotonic() - relaunched
        await asyncio.to_thread(cluster.wait_in_sync, self.node, self.topics(), BACK_TIMEOUT_S)
        self.in_sync_s = time.monotonic() - relaunched
        note(
            f"broker {self.node} answering after {self.back_s:.1f} s, in sync after "
            f"{self.in_sync_s:.1f} s"
        )

    def _wait_moved(self) -> None:
        deadline = time.monotonic() + LEADERS_MOVED_TIMEOUT_S
        while True:
            now = self.cluster.partitions(self.topics())
            if all(p.leader not in (-1, self.node) for p in now):
                return
            if time.monotonic() > deadline:
                msg = f"no new leaders within {LEADERS_MOVED_TIMEOUT_S:.0f} s: {_names(now)}"
                raise AssertionError(msg)
            time.sleep(0.2)


class FailoverChaos(Chaos):
    """The chaos of scenario.py, whose one broker fault is `Failover.fail_over`."""

    async def _restart_broker(self) -> None:
        failover = self.broker
        assert isinstance(failover, Failover)
        self.restarted = True
        self._count("leader broker SIGKILL")
        try:
            await failover.fail_over(self)
        except (AssertionError, BrokerError) as exc:  # reported by failover_row
            failover.error = str(exc).splitlines()[0]
            self.fleet.note(f"FAILED failover: {failover.error}")


class BrokerOnlyChaos(FailoverChaos):
    """No worker faults: the failover alone (the integration test)."""

    async def _one_fault(self) -> None:
        return


async def run(
    plan: Plan, cluster: Cluster, workdir: Path, *, down_s: float, worker_faults: bool
) -> list[Row]:
    """The chaos scenario with a failover; the rows with the failover's own ones added."""
    failover = Failover(cluster, down_s)
    rows = await scenario.run(
        plan,
        cluster.bootstrap,
        workdir,
        broker=failover,
        settings={"ORACULAR_REPLICATION_FACTOR": str(REPLICATION)},
        prepare=failover.prepare,
        chaos_type=FailoverChaos if worker_faults else BrokerOnlyChaos,
    )
    rows += [
        await asyncio.to_thread(replication_row, failover),
        failover_row(failover),
        await stall_row(failover),
    ]
    report = "[failover] " + f"seed {plan.seed}, workdir {workdir}\n" + table(rows)
    print("\n" + report, flush=True)
    with (workdir / "chaos-report.txt").open("a") as out:
        out.write("\n\n" + report + "\n")
    if not all(r.ok for r in rows):
        for node in cluster.nodes:
            print(
                f"\n[failover] node {node.node_id} log:\n" + tail(node.workdir / "logs/server.log")
            )
    return rows


# --- the failover's rows ----------------------------------------------------------------------


def replication_row(failover: Failover) -> Row:
    """Every topic of the run (and the group offsets) has 3 replicas and min.insync 2."""
    dep = failover.dep
    assert dep is not None
    names = [s.name for s in dep.topics] + [dep.changelog, "__consumer_offsets"]
    names += asyncio.run(_app_topics(failover.cluster.live_bootstrap(), dep.app_id, names))
    found = topic_replication(failover.cluster.live_bootstrap(), names)
    problems = [
        f"{name}: replication factor {factor}, min.insync.replicas {isr}"
        for name, (factor, isr) in sorted(found.items())
        if factor != REPLICATION or isr != MIN_INSYNC
    ]
    detail = f"{len(found)} topics (product, changelog, Faust's, __consumer_offsets)"
    return Row(
        f"every topic RF {REPLICATION}, min.insync {MIN_INSYNC}", not problems, detail, problems
    )


def failover_row(failover: Failover) -> Row:
    if failover.killed_at is None or failover.in_sync_s is None:
        why = failover.error or "the failover did not happen"
        return Row("leader broker killed and back", False, f"did not complete: {why}", [why])
    kinds = sorted({p.topic.rsplit("-", 1)[-1].rsplit(".", 1)[-1] for p in failover.led})
    detail = (
        f"broker {failover.node} (led {len(failover.led)} partitions: {', '.join(kinds)}"
        + ("; active controller" if failover.controller else "")
        + f"): new leaders {failover.moved_s:.1f} s after the SIGKILL, restarted after "
        f"{failover.down_s:.0f} s, answering in {failover.back_s:.1f} s, in sync in "
        f"{failover.in_sync_s:.1f} s"
    )
    led_both = {p.topic for p in failover.led} == set(failover.topics())
    problems = [] if led_both else [f"the killed broker led only {_names(failover.led)}"]
    return Row("leader broker killed and back", led_both, detail, problems)


async def stall_row(failover: Failover) -> Row:
    """The input stall: the longest any prediction came out after its event's time, for the
    events due from `AROUND_KILL_S` before the kill on (and the longest gap between outputs)."""
    dep = failover.dep
    assert dep is not None
    if failover.killed_at is None:
        return Row("input stall (time to recover)", False, "no broker was killed")
    async with TopicReader(failover.cluster.live_bootstrap(), dep.outputs) as reader:
        records = await reader.read_to_end()
    stall = input_stall(records, failover.killed_at)
    ok = stall.delay_s is not None and stall.delay_s < STALL_BOUND_S
    return Row(
        "input stall (time to recover)", ok, stall.describe(), [] if ok else [stall.describe()]
    )


@dataclass(frozen=True)
class Stall:
    delay_s: float | None
    """The longest produce-to-output delay of an event due from shortly before the kill on."""
    due_after_kill_s: float | None
    """When that event was due, seconds after the kill."""
    gap_s: float
    """The longest gap between consecutive outputs appended around the kill."""
    normal_ms: float | None
    """The median delay of the events due before the kill."""

    def describe(self) -> str:
        if self.delay_s is None:
            return "no predictions around the kill"
        return (
            f"{self.delay_s:.1f} s: an event due {self.due_after_kill_s:+.1f} s from the kill "
            f"came out {self.delay_s:.1f} s late (median before the kill "
            f"{self.normal_ms:.0f} ms); longest gap between outputs {self.gap_s:.1f} s"
        )


def input_stall(records: list[Record], killed_at: float) -> Stall:
    """See `stall_row`: from the output records' append times (first copy of each id)."""
    kill_ms = killed_at * 1000
    first: dict[str, tuple[int, int | None]] = {}  # id -> (append time, its event's time)
    for r in records:
        message = decode_output(r.value or b"")
        at = message.get("at") if "intents" in message and "closed_at" not in message else None
        if message["id"] not in first or r.timestamp < first[message["id"]][0]:
            first[message["id"]] = (r.timestamp, at)
    delays = [(out - at, at) for out, at in first.values() if at is not None]
    before = [d for d, at in delays if at < kill_ms - AROUND_KILL_S * 1000]
    around = [(d, at) for d, at in delays if at >= kill_ms - AROUND_KILL_S * 1000]
    appended = sorted(out for out, _ in first.values() if out >= kill_ms - AROUND_KILL_S * 1000)
    gap = max((b - a for a, b in itertools.pairwise(appended)), default=0)
    normal = statistics.median(before) if before else None
    if not around:
        return Stall(None, None, gap / 1000, normal)
    worst, at = max(around)
    return Stall(worst / 1000, (at - kill_ms) / 1000, gap / 1000, normal)


# --- helpers ----------------------------------------------------------------------------------


def _busiest(partitions: list[Partition]) -> int:
    """The node leading the most of `partitions`, preferring one leading some of each topic."""
    topics = {p.topic for p in partitions}

    def score(node: int) -> tuple[bool, int]:
        led = [p for p in partitions if p.leader == node]
        return ({p.topic for p in led} == topics, len(led))

    return max({p.leader for p in partitions if p.leader >= 0}, key=score)


async def _controller(bootstrap: str) -> int | None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        return int(cluster["controller_id"])
    except Exception:  # only a detail of the report
        return None
    finally:
        await admin.close()


async def _app_topics(bootstrap: str, app_id: str, known: list[str]) -> list[str]:
    """The topics Faust created for the app id that `known` does not name."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        names = await admin.list_topics()
    finally:
        await admin.close()
    return sorted(n for n in names if n.startswith(app_id) and n not in known)


def _names(partitions: list[Partition]) -> str:
    by_topic: dict[str, list[str]] = {}
    for p in sorted(partitions, key=lambda p: (p.topic, p.partition)):
        by_topic.setdefault(p.topic, []).append(f"{p.partition}:{p.leader}")
    return "; ".join(f"{t} (partition:leader) {' '.join(v)}" for t, v in by_topic.items())
