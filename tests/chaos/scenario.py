"""One chaos run: workers, a paced stream with malformed messages, faults, then the checks.

`Plan.from_env` reads the overrides (CHAOS_SECONDS, CHAOS_SEED, CHAOS_WORKERS, CHAOS_EVENTS,
CHAOS_INJECT); `run` prints the seed first, then every fault as it happens, and returns the
result table's rows. Waits after the stream are bounded by the plan's time budget and end as
soon as everything is settled, never after a fixed sleep.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiokafka import AIOKafkaProducer

from bench.synthetic import FILLER
from schemas.config import load_config
from tests.integration.support import FaustWorker
from tests.integration.worker_support import (
    PARTITIONS,
    Deployment,
    TopicReader,
    deployment,
    partition_of,
)

from . import checks
from .checks import Row
from .faults import Chaos, Fleet, Restartable
from .stream import Message, generate, place, sentinels

CONFIG = Path(__file__).resolve().parent / "chaos.yaml"
TIMEOUT_MS = 4_000  # chaos.yaml's episodeTimeout
LATENESS_MS = 1_000
"""ORACULAR_LATENESS_MS: each partition is in time order, so any lateness is inside the contract."""
IDLE_MS = 10 * 365 * 24 * 3600 * 1000
"""ORACULAR_IDLE_MS: ten years, so the wall clock never moves a watermark; only event time
does. (A stream paced at real time is inside the contract either way, except where the broker
restart holds input back for longer than the idle time; this keeps the run deterministic.)"""
SESSION_TIMEOUT_S = 6  # the broker's minimum group.min.session.timeout.ms
CHECK_RESERVE_S = 5.0  # the budget kept for the last reads and the table
MIN_SETTLE_S = 30.0  # the settle wait gets at least this, even past the budget (a busy box)
LEAD_MS = 1_000  # the stream starts this long after it is placed


@dataclass(frozen=True)
class Plan:
    """What one run does. `from_env` applies the CHAOS_* overrides."""

    seconds: float
    """The time budget of the run (worker start-up to the table), not counting the broker's."""
    seed: int
    """The stream's and the fault schedule's; 0: a new random seed for every run."""
    workers: int
    events: int
    bad_share: float
    fault_gap_s: tuple[float, float]
    restart_broker: bool
    produce_share: float
    """Of `seconds`, the time the stream takes; the rest: start-up, settling, the checks."""
    inject: str | None = None
    """"drop": one good event is not produced but stays in the replay (a deliberate loss)."""

    @classmethod
    def from_env(cls, default: Plan) -> Plan:
        env = os.environ
        seed = env.get("CHAOS_SEED")
        return replace(
            default,
            seconds=float(env.get("CHAOS_SECONDS", default.seconds)),
            seed=int(seed) if seed else default.seed or random.SystemRandom().randrange(1, 10**6),
            workers=int(env.get("CHAOS_WORKERS", default.workers)),
            events=int(env.get("CHAOS_EVENTS", default.events)),
            inject=env.get("CHAOS_INJECT") or None,
        )

    @property
    def produce_s(self) -> float:
        return self.seconds * self.produce_share


FULL = Plan(280, 0, 3, 50_000, 0.01, (4.0, 9.0), restart_broker=True, produce_share=0.5)
SHORT = Plan(60, 1, 3, 5_000, 0.01, (3.0, 6.0), restart_broker=False, produce_share=0.4)


def make_fleet(dep: Deployment, workdir: Path, size: int) -> Fleet:
    env = dep.env(
        ORACULAR_IDLE_MS=str(IDLE_MS),
        ORACULAR_LATENESS_MS=str(LATENESS_MS),
        ORACULAR_TICK_INTERVAL_S="0.5",
        ORACULAR_SUMMARY_INTERVAL_S="2",
        ORACULAR_SESSION_TIMEOUT_S=str(SESSION_TIMEOUT_S),
    )
    workers = []
    for n in range(size):
        workers.append(
            FaustWorker(
                "streams.worker",
                env={"ORACULAR_BROKER": dep.bootstrap, "ORACULAR_APP_ID": dep.app_id, **env},
                datadir=workdir / f"w{n}" / "data",
                log_path=workdir / f"w{n}" / "worker.log",
                argv=dep.argv(),
            )
        )
    return Fleet(workers)


async def produce_paced(
    bootstrap: str, topic: str, messages: list[Message], fleet: Fleet
) -> list[str]:
    """Send each message when the wall clock reaches its time, record timestamp = its time.

    Idempotent, so retries across the broker restart neither duplicate nor reorder. Returns
    the send failures (the read-back of the topic is what the checks trust).
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        # Outlives the broker restart, also on a machine so busy that the restarted broker
        # took over 80 s to start (load average 14 on 2 cores: a send timed out at 90 s).
        request_timeout_ms=300_000,
        max_request_size=2**20,
    )
    await producer.start()
    futures = []
    late_ms = 0.0
    try:
        for m in messages:
            delay = m.at / 1000 - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late_ms = max(late_ms, -delay * 1000)
            futures.append(await producer.send(topic, m.value, key=m.key, timestamp_ms=m.at))
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await producer.stop()
    fleet.note(
        f"produced {len(messages)} messages (sent at most {late_ms:.0f} ms after their time)"
    )
    return [
        f"{m.label}: {r!r}"
        for m, r in zip(messages, results, strict=True)
        if isinstance(r, BaseException)
    ]


async def run(
    plan: Plan,
    bootstrap: str,
    workdir: Path,
    broker: Restartable | None = None,
    *,
    settings: Mapping[str, str] | None = None,
    prepare: Callable[[Deployment], Awaitable[None]] = Deployment.create_topics,
    chaos_type: type[Chaos] = Chaos,
) -> list[Row]:
    """The whole scenario; returns the result rows (printed as a table too).

    `settings` are extra worker settings, `prepare` creates the deployment's topics, and
    `chaos_type` injects the faults (tests/chaos/cluster.py's failover sets all three).
    """
    began = time.monotonic()
    print(
        f"\n[chaos] CHAOS_SEED={plan.seed} (replay this run: CHAOS_SEED={plan.seed} "
        f"CHAOS_SECONDS={plan.seconds:.0f} CHAOS_WORKERS={plan.workers} "
        f"CHAOS_EVENTS={plan.events}); broker {bootstrap}, workdir {workdir}, "
        f"code {_revision()}",
        flush=True,
    )
    rng = random.Random(plan.seed)
    config = load_config(CONFIG)
    dep = deployment(bootstrap, "chaos", config_path=CONFIG, settings=settings)
    await prepare(dep)
    generated = generate(
        config,
        events=plan.events,
        duration_ms=int(plan.produce_s * 1000),
        bad_share=plan.bad_share,
        seed=plan.seed,
    )
    fleet = make_fleet(dep, workdir, plan.workers)
    fleet.started = began
    chaos = chaos_type(fleet, rng, SESSION_TIMEOUT_S, plan.fault_gap_s)
    try:
        await asyncio.gather(*(fleet.start(n) for n in range(plan.workers)))
        run = Run(plan, dep, fleet, chaos, workdir, began, generated)
        return await run.stream_and_check(broker)
    finally:
        fleet.shutdown()
        for n, w in enumerate(fleet.workers):
            print(f"[chaos] w{n}: {w.starts} starts, log {w.log_path}")


@dataclass
class Run:
    """One run's stream, placed on the wall clock when production starts."""

    plan: Plan
    dep: Deployment
    fleet: Fleet
    chaos: Chaos
    workdir: Path
    began: float
    generated: list[Message]
    start_ms: int = 0
    stream_began: float = 0.0
    """Seconds after `began` at which the stream's time 0 was."""
    stream: list[Message] = field(default_factory=list)
    marks: list[Message] = field(default_factory=list)
    withheld: list[Message] = field(default_factory=list)

    def since_began(self, at_ms: int) -> float:
        """Seconds since the run began at which the message of time `at_ms` was due."""
        return (at_ms - self.start_ms) / 1000 + self.stream_began

    async def stream_and_check(self, broker: Restartable | None) -> list[Row]:
        plan, fleet, chaos = self.plan, self.fleet, self.chaos
        self.start_ms = int(time.time() * 1000) + LEAD_MS
        self.stream_began = time.monotonic() - self.began + LEAD_MS / 1000
        self.stream = place(self.generated, self.start_ms)
        # Every partition's watermark passes every deadline of the stream (replay --until it).
        until = self.stream[-1].at + TIMEOUT_MS + LATENESS_MS + 1_000
        self.marks = sentinels(PARTITIONS, until, partition_of)
        self.withheld = _withheld(plan, self.stream, chaos.rng)
        to_send = [m for m in self.stream if m not in self.withheld] + self.marks
        if plan.restart_broker and broker is not None:
            chaos.broker = broker
            chaos.restart_at_s = self.stream_began + plan.produce_s * chaos.rng.uniform(0.3, 0.6)
        fleet.note(
            f"stream: {len(to_send)} messages, {sum(m.bad is not None for m in self.stream)} "
            f"malformed, {sum(m.retry is not None for m in self.stream)} retried, "
            f"{len({m.event.user for m in self.stream if m.event})} users, over "
            f"{(until - self.start_ms) / 1000:.0f} s"
            + (f"; broker restart at {chaos.restart_at_s:.0f} s" if chaos.restart_at_s else "")
        )
        # The replay needs only the generated stream: it runs while the stream is produced.
        good = [m for m in self.stream + self.marks if m.event is not None]  # in time order
        replay = asyncio.create_task(
            asyncio.to_thread(checks.run_replay, CONFIG, good, until, self.workdir / "replay")
        )
        stop = asyncio.Event()
        faults = asyncio.create_task(chaos.run(stop))
        failures = await produce_paced(
            self.dep.bootstrap, self.dep.topics.events.name, to_send, fleet
        )
        stop.set()
        await faults
        await chaos.finish()
        fleet.note("faults: " + ", ".join(f"{k} {v}" for k, v in sorted(chaos.counts.items())))
        deadline = max(self.began + plan.seconds - CHECK_RESERVE_S, time.monotonic() + MIN_SETTLE_S)
        rows = await self.settle_and_check(await replay, deadline)
        if failures:
            rows.insert(0, Row("producer sends", False, f"{len(failures)} failed", failures))
        rows.append(Row("faults injected", bool(chaos.counts), _faults(chaos, fleet)))
        report = (
            f"[chaos] seed {plan.seed}, {time.monotonic() - self.began:.0f} s, "
            f"workdir {self.workdir}\n" + checks.table(rows)
        )
        print("\n" + "\n".join(f"[chaos log] {line}" for line in fleet.events))
        print("\n" + report, flush=True)
        (self.workdir / "chaos-report.txt").write_text(
            report + "\n\n" + "\n".join(fleet.events) + "\n\n" + checks.all_problems(rows)
        )
        return rows

    async def settle_and_check(self, replay: checks.Replay, deadline: float) -> list[Row]:
        """Wait (bounded) until every check passes or the budget is spent; the last rows."""
        dep, fleet = self.dep, self.fleet
        config = load_config(CONFIG)
        topic = dep.topics.events.name
        ends = await checks.end_offsets(dep.bootstrap, topic, PARTITIONS)
        async with TopicReader(dep.bootstrap, [topic]) as reader:
            records = await reader.read_to_end()
        inp = checks.label_input(records, self.stream + self.marks, ends)
        fleet.note(f"replay: {len(replay.messages)} messages, {len(replay.states)} users")
        since = {n: len(w.log_text()) for n, w in enumerate(fleet.workers)}
        async with (
            TopicReader(dep.bootstrap, dep.outputs) as outputs,
            TopicReader(dep.bootstrap, [dep.topics.dlq.name]) as dlq,
            TopicReader(dep.bootstrap, [dep.changelog]) as changelog,
        ):
            while True:
                await fleet.restart_fenced()
                fleet.check_exits()
                out_records = await outputs.read_to_end()
                letters = await dlq.read_to_end()
                log = await changelog.read_to_end()
                stored = checks.changelog_users(log, config)
                out_row, seen = checks.check_outputs(out_records, replay)
                dlq_offsets = checks.dead_lettered(letters)
                rows = [
                    checks.check_produced(inp, self.stream + self.marks, self.withheld),
                    checks.check_accounting(
                        inp, stored, replay, seen, dlq_offsets, self.since_began
                    ),
                    checks.check_dead_letters(inp, letters, topic),
                    checks.check_retries(inp, stored, dlq_offsets),
                    checks.check_states(stored, replay),
                    checks.check_changelog_order(log, config),
                    out_row,
                    checks.check_committed(await checks.committed_vs_end(dep, PARTITIONS)),
                    checks.check_workers(
                        checks.worker_lags(fleet.workers, since),
                        await checks.group_state(dep),
                        len(fleet.workers),
                        fleet.unexpected_exits,
                    ),
                ]
                settled = all(r.ok for r in rows)
                if settled or not await checks.poll(1.0, deadline):
                    fleet.note("settled" if settled else "time budget spent")
                    if not settled:
                        checks.dump(self.workdir, out_records, stored, log, config)
                    return rows


def _withheld(plan: Plan, stream: list[Message], rng: random.Random) -> list[Message]:
    """For CHAOS_INJECT=drop: one signal event from the middle of the stream."""
    if plan.inject is None:
        return []
    assert plan.inject == "drop", f"CHAOS_INJECT={plan.inject}: only 'drop' is known"
    middle = stream[len(stream) // 3 : 2 * len(stream) // 3]
    signals = [
        m
        for m in middle
        if m.event is not None and m.retry is None and m.event.name not in (None, *FILLER)
    ]
    return [rng.choice(signals)]


def _faults(chaos: Chaos, fleet: Fleet) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(chaos.counts.items()))
    extra = f"; failed steps: {fleet.failed_steps}" if fleet.failed_steps else ""
    return counts + extra


def _revision() -> str:
    """The checkout's commit (and "+changes" when the tree differs from it), for the report.

    CHAOS_REVISION names it instead for a copy of the tree that is not a git checkout.
    """
    if os.environ.get("CHAOS_REVISION"):
        return os.environ["CHAOS_REVISION"]
    git = ["git", "-C", str(CONFIG.parents[2])]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "not a git checkout"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
