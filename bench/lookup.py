"""`python -m bench.lookup`: the lookup API's latency and its cost to processing.

Two `oracular worker` processes (8 partitions, every setting default but ORACULAR_API_PORT=0)
against a broker this bench starts on free ports (or --broker), on one machine.

1. Throughput with and without lookup load. The stream (`--stream`: the synthetic clickstream
   of bench/synthetic.py on examples/oracular.yaml, the default; or the realistic Segment
   stream of bench/realistic.py on bench/realistic.yaml, identify calls included) is
   produced to the input topic first; then two fresh workers (a new app id: a new group
   reading the topic from the start) are started together. Once both own partitions (routing
   agreed, no rebalance), the backlog drains in alternating windows (WINDOW_S, `--window`)
   without and with lookup load (A B B A A B B A ..., so a drifting background load weighs on
   both alike), after one window that is not counted (the workers' first seconds drain their
   prefetched records faster); each window's rate is the slope of the applied-input counters
   of both workers' /metrics. In "with" windows, single-user lookups are sent from this
   process, each through the worker that does NOT own the user (one forward): by default
   CLIENTS closed-loop clients (as many lookups as the API answers: a faster API does more of
   them, so the ratio compares unequal work across versions); with `--lookup-rate N`, N
   lookups a second on a fixed schedule (open loop: each sent on time whether or not the
   previous ones were answered), the same work in every run. The ratio is the pooled rate
   with lookups over the pooled rate without.
2. Latency idle, then under processing load. Once the backlog is drained (every user's state
   in place), the lookups below are measured once without input; then bench/loadgen.py (its
   own process) offers live events at half the rate the two workers drained the backlog at
   without lookups (`--live-rate` to choose another) while this process measures them again,
   one request at a time: single-user lookups at the owner, single-user lookups through the
   non-owner (one forward), and batches of 100 users all owned by the other worker, through
   the non-owner (one forward per batch), and 100 mixed users.
   Latency is request sent to response read, in this process; beside it, the answering
   worker's own time (its `Server-Timing` header), which leaves out the network and the waits
   for a CPU on both sides. The owners' metrics say how
   many of the users they read came from their decoded-user cache and how many from the table.

The table is printed as markdown for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout

from bench.inputs import Record, build
from bench.machine import machine
from bench.session import say
from bench.synthetic import clickstream
from bench.topics import create_topics, preload_records
from bench.workers import CONFIG, PARTITIONS, Worker, add_worker_env_option, helper
from infra.broker import start_broker
from infra.processes import cmdline, cpu_seconds, process_tree, thread_cpus
from schemas.config import load_config
from schemas.events import encode_event
from streams.lookup.serving import partition_for
from streams.settings import product_topics
from streams.settings.cpus import pin_process

WINDOW_S = 8.0
CLIENTS = 4
LIVE_RATE = 1000.0
"""The latency phase's live load when no rate without lookups was measured."""
LIVE_SECONDS = 120
"""Most seconds of live load (stopped once the lookups are measured)."""
SINGLE_REQUESTS = 1000
BATCH_REQUESTS = 200
BATCH_SIZE = 100
API_LINE = re.compile(r"advertised to other workers as (\S+)")
APPLIED = re.compile(
    r'^oracular_inputs_total\{outcome="applied",partition="\d+"\} (\S+)$', re.MULTILINE
)
"""One partition's applied inputs: the workers' sum over all their samples is the total."""
READS = re.compile(r'^oracular_lookup_reads_total\{source="(\w+)"\} (\S+)$', re.MULTILINE)


async def api_urls(workers: list[Worker], timeout_s: float = 120.0) -> list[str]:
    urls = []
    for worker in workers:
        await worker.wait_line_async("advertised to other workers as", timeout_s)
        urls.append(API_LINE.findall(worker.log_text())[-1])
    return urls


async def routing(http: ClientSession, urls: list[str], timeout_s: float = 180.0) -> dict[int, str]:
    """Wait until both workers agree on an assignment that gives each of them partitions."""
    deadline = time.monotonic() + timeout_s
    while True:
        bodies = []
        for url in urls:
            try:
                async with http.get(f"{url}/v1/routing") as response:
                    bodies.append(await response.json())
            except Exception:  # starting up
                bodies.append(None)
        if (
            all(bodies)
            and all(b["partitions"] == bodies[0]["partitions"] for b in bodies)
            and set(bodies[0]["partitions"].values()) == set(urls)
            and not any(b["rebalancing"] or b["recovering"] for b in bodies)
        ):
            return {int(p): u for p, u in bodies[0]["partitions"].items()}
        if time.monotonic() > deadline:
            msg = f"no agreed two-worker routing within {timeout_s} s: {bodies}"
            raise RuntimeError(msg)
        await asyncio.sleep(0.2)


async def applied(http: ClientSession, urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        async with http.get(f"{url}/metrics") as response:
            text = await response.text()
        total += sum(float(value) for value in APPLIED.findall(text))
    return total


async def reads(http: ClientSession, urls: list[str]) -> dict[str, float]:
    """Users read by the workers' lookups so far, by source (decoded-user cache, table)."""
    total: dict[str, float] = {}
    for url in urls:
        async with http.get(f"{url}/metrics") as response:
            text = await response.text()
        for source, value in READS.findall(text):
            total[source] = total.get(source, 0.0) + float(value)
    return total


async def lookup_schedule(
    http: ClientSession,
    urls: list[str],
    owners: dict[int, str],
    users: list[str],
    stop: Any,
    *,
    rate: float,
) -> tuple[int, list[float]]:
    """Open loop: single lookups through the non-owning worker, `rate` a second on a fixed
    schedule until `stop` (each its own task, so a slow answer delays none of the next);
    (answered, latencies in s)."""
    rng = random.Random()
    latencies: list[float] = []
    answered = 0

    async def one(user: str) -> None:
        nonlocal answered
        via = other(owners[partition_for(user, PARTITIONS)], urls)
        started = time.perf_counter()
        async with http.get(f"{via}/v1/users/{user}") as response:
            await response.read()
            if response.status == 200:
                answered += 1
                latencies.append(time.perf_counter() - started)

    tasks = []
    t0 = time.monotonic()
    sent = 0
    while not stop.is_set():
        due = t0 + sent / rate
        wait = due - time.monotonic()
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            continue
        tasks.append(asyncio.create_task(one(rng.choice(users))))
        sent += 1
    await asyncio.gather(*tasks, return_exceptions=True)
    return answered, latencies


def other(url: str, urls: list[str]) -> str:
    return urls[1] if url == urls[0] else urls[0]


async def lookup_load(
    http: ClientSession, urls: list[str], owners: dict[int, str], users: list[str], stop: Any
) -> int:
    """One closed-loop client: single lookups through the non-owning worker until `stop`."""
    rng = random.Random()
    done = 0
    while not stop.is_set():
        user = rng.choice(users)
        via = other(owners[partition_for(user, PARTITIONS)], urls)
        async with http.get(f"{via}/v1/users/{user}") as response:
            await response.read()
            if response.status == 200:
                done += 1
    return done


def worker_processes(workers: list[Worker]) -> Iterator[tuple[int, bool]]:
    """(pid, is it an API process) of every process of the workers."""
    for worker in workers:
        for pid in process_tree(worker.pid):
            yield pid, "streams.lookup.process" in cmdline(pid)


def cpu_by_part(workers: list[Worker], broker_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of each part of the bench, from /proc: the two workers' own
    processes, their API processes, this process (the lookup client), the broker, and the
    whole machine (every process, other jobs included)."""
    parts = {"workers": 0.0, "api": 0.0, "client": cpu_seconds(os.getpid()) or 0.0}
    for pid, api in worker_processes(workers):
        parts["api" if api else "workers"] += cpu_seconds(pid) or 0.0
    parts["broker"] = (cpu_seconds(broker_pid) or 0.0) if broker_pid else 0.0
    with open("/proc/stat") as stat:  # the first line: every CPU's ticks by state
        ticks = [int(x) for x in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    parts["machine"] = (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    return parts


def reserve_core(core: int, workers: list[Worker], broker_pid: int | None) -> None:
    """`--api-core`: the workers run with ORACULAR_API_CPUS=core (their API processes on it,
    their own threads off it); here this process (the lookup client, as if on a machine of
    its own) joins the API processes, and the broker (the load generator too, when started)
    goes to the other cores: no lookup waits for a core behind processing, and no lookup's
    CPU is taken from processing."""
    rest = os.sched_getaffinity(0) - {core}
    for pid, api in worker_processes(workers):
        if thread_cpus(pid) not in ({core} if api else rest, set()):  # set(): it is gone
            msg = f"--api-core {core}: process {pid} ({cmdline(pid)[:80]}) is not pinned"
            raise RuntimeError(msg)
    if broker_pid:
        pin_process(broker_pid, rest)
    pin_process(os.getpid(), {core})
    say(f"API processes and this client on core {core}; workers and broker on {sorted(rest)}")


@dataclass(frozen=True)
class LookupInput:
    """What a run preloads, and what it then looks up."""

    config: Path
    """The workers' (and the load generator's) engine config."""
    records: list[Record]
    users: list[str]
    """Every user of the stream: the lookups pick among them."""
    applied: int
    """The inputs the workers apply once the backlog is drained (identify calls are read and
    ignored: not counted)."""
    topic_config: dict[str, str]
    describe: str


def lookup_input(stream: str, events: int, users: int) -> LookupInput:
    """`--stream`'s input: the synthetic clickstream (seed 9, as every earlier figure), or the
    realistic Segment stream (bench/inputs.py `build`) without its closing marks, so the
    partitions' watermarks stay at the stream's last events, as for the synthetic one."""
    if stream == "synthetic":
        stream_events = clickstream(load_config(CONFIG), events, users, seed=9)
        ids = sorted({e.user for e in stream_events})
        return LookupInput(
            CONFIG,
            [Record(e.user.encode(), encode_event(e)) for e in stream_events],
            ids,
            len(stream_events),
            {},
            f"{len(stream_events):,} synthetic events of {len(ids):,} users",
        )
    source = build("realistic", events, users, PARTITIONS)
    real = source.events[:-PARTITIONS]  # `build` ends with a closing mark per partition
    return LookupInput(
        source.config_path,
        source.records[:-PARTITIONS],
        sorted({e.user for e in real}),
        len(real),
        dict(source.topic_config),
        source.describe,
    )


async def start_workers(
    bootstrap: str,
    prefix: str,
    base: Path,
    extra: dict[str, str] | None = None,
    config: Path = CONFIG,
) -> list[Worker]:
    """Two fresh workers (a new app id: the group reads the input from the start)."""
    app_id = f"{prefix}-app-{uuid.uuid4().hex[:6]}"
    workers = [
        Worker(
            f"w{n}",
            bootstrap=bootstrap,
            app_id=app_id,
            prefix=prefix,
            datadir=base / app_id / f"w{n}",
            log_path=base / app_id / f"w{n}.log",
            config=config,
            settings={
                "ORACULAR_API_PORT": "0",
                "ORACULAR_SUMMARY_INTERVAL_S": "3600",
                **(extra or {}),
            },
        )
        for n in range(2)
    ]
    workers_holder.append(workers)  # stopped at the end
    for worker in workers:
        worker.start()
    return workers


async def window(
    http: ClientSession,
    urls: list[str],
    owners: dict[int, str],
    users: list[str],
    *,
    lookups: bool,
    total: int,
    rate: float | None = None,
    seconds: float = WINDOW_S,
    cpu: Callable[[], dict[str, float]] = dict,
) -> dict[str, Any]:
    """One window of `seconds` draining, with or without lookups (closed-loop clients, or
    `rate` lookups a second on a fixed schedule); `cpu` gives each part's CPU seconds so far
    (`cpu_by_part`), taken at both ends of the window."""
    stop = asyncio.Event()
    clients: list[asyncio.Task[Any]] = []
    if lookups and rate:
        clients.append(
            asyncio.create_task(lookup_schedule(http, urls, owners, users, stop, rate=rate))
        )
    elif lookups:
        clients = [
            asyncio.create_task(lookup_load(http, urls, owners, users, stop))
            for _ in range(CLIENTS)
        ]
    t0, a0 = time.monotonic(), await applied(http, urls)
    c0 = cpu()
    t1, a1 = t0, a0
    while time.monotonic() - t0 < seconds and a1 < total:
        await asyncio.sleep(0.5)
        t1, a1 = time.monotonic(), await applied(http, urls)
    c1 = cpu()  # once, at the last sample's time: each call walks /proc
    stop.set()
    latencies: list[float] = []
    done = 0
    for result in await asyncio.gather(*clients):
        if isinstance(result, tuple):
            done += result[0]
            latencies += result[1]
        else:
            done += result
    row: dict[str, Any] = {
        "lookups": lookups,
        "events": a1 - a0,
        "seconds": t1 - t0,
        # A window that starts with the backlog already drained measured nothing.
        "rate": (a1 - a0) / (t1 - t0) if t1 > t0 else 0.0,
        "lookups_per_s": done / (t1 - t0) if t1 > t0 else 0.0,
        "drained": a1 >= total,
        "cpu": {part: c1[part] - c0[part] for part in c1},
    }
    say(f"window {'with' if lookups else 'without'} lookups: {row}")
    row["latencies"] = latencies
    return row


workers_holder: list[list[Worker]] = []


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return q[49] * 1000, q[98] * 1000, ordered[-1] * 1000


LatencyRow = tuple[str, tuple[float, float, float], int, tuple[float, float, float]]
"""A kind of lookup: (what, client p50/p99/max ms, requests, the worker's own p50/p99/max ms)."""


async def latency(
    http: ClientSession, urls: list[str], owners: dict[int, str], users: list[str]
) -> list[LatencyRow]:
    """(what, (p50, p99, max) in ms, requests, the workers' own (p50, p99, max) in ms) for each
    kind of lookup, one at a time."""
    rng = random.Random(3)
    by_owner: dict[str, list[str]] = {u: [] for u in urls}
    for user in users:
        by_owner[owners[partition_for(user, PARTITIONS)]].append(user)
    rows = []

    server: list[float] = []  # the answering worker's own time (Server-Timing), this kind's

    async def timed(method: str, url: str, **kw: Any) -> float:
        started = time.perf_counter()
        async with http.request(method, url, **kw) as response:
            await response.read()
            assert response.status == 200, (url, response.status)
        elapsed = time.perf_counter() - started
        server.append(float(response.headers["Server-Timing"].partition(";dur=")[2]) / 1000)
        return elapsed

    def row(label: str, samples: list[float]) -> LatencyRow:
        measured = (label, percentiles(samples), len(samples), percentiles(server))
        server.clear()
        return measured

    for label, forward in (("single user at the owner", False), ("single user, 1 forward", True)):
        samples = []
        for _ in range(SINGLE_REQUESTS):
            user = rng.choice(users)
            owner = owners[partition_for(user, PARTITIONS)]
            via = other(owner, urls) if forward else owner
            samples.append(await timed("GET", f"{via}/v1/users/{user}"))
        rows.append(row(label, samples))
    samples = []
    for n in range(BATCH_REQUESTS):
        owner = urls[n % 2]
        batch = rng.sample(by_owner[owner], BATCH_SIZE)
        url = f"{other(owner, urls)}/v1/lookup"
        samples.append(await timed("POST", url, json={"users": batch}))
    rows.append(row(f"batch of {BATCH_SIZE}, all on the other worker (1 forward)", samples))
    samples = []
    for n in range(BATCH_REQUESTS):
        batch = rng.sample(users, BATCH_SIZE)
        samples.append(await timed("POST", f"{urls[n % 2]}/v1/lookup", json={"users": batch}))
    rows.append(row(f"batch of {BATCH_SIZE}, mixed owners (half local, 1 forward)", samples))
    return rows


async def main_async(args: argparse.Namespace) -> int:  # noqa: PLR0912, PLR0915 - one script
    base = Path(tempfile.mkdtemp(prefix="oracular-lookup-bench-"))
    broker = None
    bootstrap = args.broker
    if bootstrap is None:
        broker = await asyncio.to_thread(
            start_broker, base / "kafka", port=None, stop_with_parent=True
        )
        bootstrap = broker.bootstrap
    try:
        topics_prefix = prefix = f"lookupbench-{uuid.uuid4().hex[:6]}"
        topics = product_topics(
            {"ORACULAR_TOPIC_PREFIX": prefix, "ORACULAR_PARTITIONS": str(PARTITIONS)}
        )
        source = lookup_input(args.stream, args.events, args.users)
        users, total = source.users, source.applied
        await create_topics(bootstrap, [topics.events.name], source.topic_config)
        await create_topics(bootstrap, [spec.name for spec in topics])
        say(f"preloading {source.describe}")
        await preload_records(bootstrap, topics.events.name, source.records)
        extra = dict(args.worker_env)
        if args.api_core is not None:
            extra["ORACULAR_API_CPUS"] = str(args.api_core)
        workers = await start_workers(bootstrap, topics_prefix, base, extra, source.config)
        urls = await api_urls(workers)
        broker_pid = broker.pid if broker is not None else None
        if args.api_core is not None:
            reserve_core(args.api_core, workers, broker_pid)

        def cpu() -> dict[str, float]:
            return cpu_by_part(workers, broker_pid)

        async with ClientSession(timeout=ClientTimeout(total=30)) as http:
            owners = await routing(http, urls)
            rows: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
            # One window first, not counted: the workers' first seconds drain what their
            # consumers fetched while they joined, up to twice the steady rate, and that
            # window would always be a "without" one.
            await window(
                http,
                urls,
                owners,
                users,
                lookups=False,
                total=total,
                seconds=args.window,
                cpu=cpu,
            )
            # A B B A A B B A ...: a drifting background load weighs on both alike.
            for n in range(args.runs * 2):
                lookups = (n % 4) in (1, 2)
                row = await window(
                    http,
                    urls,
                    owners,
                    users,
                    lookups=lookups,
                    total=total,
                    rate=args.lookup_rate,
                    seconds=args.window,
                    cpu=cpu,
                )
                if row["drained"]:
                    say(
                        f"the backlog of {total:,} events drained in window {n + 1} of "
                        f"{args.runs * 2}: the throughput ratio has fewer windows (none: n/a); "
                        "more --events fill them all"
                    )
                    break
                rows["with" if lookups else "without"].append(row)
            deadline = time.monotonic() + 900
            while await applied(http, urls) < total and time.monotonic() < deadline:
                await asyncio.sleep(1.0)  # the latency phase starts with the backlog drained
            say("latency idle (no input)")
            idle = await latency(http, urls, owners, users)
        live_rate = args.live_rate or half_rate(rows)
        say(f"latency with live load {live_rate:.0f} events/s")
        out = base / "loadgen.msgpack"
        loadgen = helper(
            "bench.loadgen",
            "loadgen",
            bootstrap,
            base,
            topic=topics.events.name,
            rate=live_rate,
            seconds=LIVE_SECONDS,
            users=args.users,
            config=source.config,
            stream=args.stream,
            out=out,
        ).start()
        if args.api_core is not None:  # started from this process: on its core
            pin_process(loadgen.pid, set(range(os.cpu_count() or 1)) - {args.api_core})
        try:
            async with ClientSession(timeout=ClientTimeout(total=30)) as http:
                await flowing(http, urls, live_rate)
                a0, t0 = await applied(http, urls), time.monotonic()
                r0 = await reads(http, urls)
                table = await latency(http, urls, owners, users)
                live = (await applied(http, urls) - a0) / (time.monotonic() - t0)
                sources = {s: n - r0.get(s, 0.0) for s, n in (await reads(http, urls)).items()}
        finally:
            loadgen.stop()
    finally:
        for workers in workers_holder:
            for worker in workers:
                worker.stop()
        if broker is not None:
            broker.stop(wipe=True)
        if args.keep:
            say(f"kept {base} (the workers' logs and datadirs)")
        else:  # each run's datadirs and logs: hundreds of MB
            shutil.rmtree(base, ignore_errors=True)
    report(args, rows, table, idle, offered=live_rate, live=live, sources=sources)
    return 0


async def flowing(http: ClientSession, urls: list[str], rate: float) -> None:
    """Wait until the live load is being applied (the load generator first generates its
    events, which takes seconds at a high rate), then a little longer for it to settle."""
    start, deadline = await applied(http, urls), time.monotonic() + 120
    while await applied(http, urls) < start + rate and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    if time.monotonic() >= deadline:
        msg = f"the live load of {rate:,.0f} events/s was not applied within 120 s"
        raise RuntimeError(msg)
    await asyncio.sleep(2)


def half_rate(rows: dict[str, list[dict[str, Any]]]) -> float:
    """Half the two workers' pooled rate without lookups: the load the latency is measured
    under ("processing at half their maximum throughput"); LIVE_RATE if none was measured."""
    windows = rows["without"]
    if not windows:
        return LIVE_RATE
    return sum(r["events"] for r in windows) / sum(r["seconds"] for r in windows) / 2


def report(
    args: argparse.Namespace,
    rows: dict[str, list[dict[str, Any]]],
    table: list[LatencyRow],
    idle: list[LatencyRow],
    *,
    offered: float,
    live: float,
    sources: dict[str, float],
) -> None:
    """Print the markdown tables for BENCHMARKS.md."""

    def pooled(mode: str, what: Callable[[dict[str, Any]], float]) -> float | None:
        """`what` of the windows per second, pooled (None: no window of that kind finished)."""
        seconds = sum(r["seconds"] for r in rows[mode])
        return sum(what(r) for r in rows[mode]) / seconds if seconds else None

    def events(row: dict[str, Any]) -> float:
        return float(row["events"])

    def shown(rate: float | None) -> str:
        return "n/a" if rate is None else f"{rate:,.0f}"

    without, with_ = pooled("without", events), pooled("with", events)
    lookup_rate = pooled("with", lambda row: row["lookups_per_s"] * row["seconds"])
    runs_without = ", ".join(f"{r['rate']:,.0f}" for r in rows["without"])
    runs_with = ", ".join(f"{r['rate']:,.0f}" for r in rows["with"])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nmachine: {machine()}; load average at the end {load} (other jobs included)")
    print(
        f"command: python -m bench.lookup --events {args.events} --users {args.users} "
        f"--runs {args.runs}"
        + (f" --live-rate {args.live_rate:g}" if args.live_rate else "")
        + (f" --lookup-rate {args.lookup_rate:g}" if args.lookup_rate else "")
        + (f" --window {args.window:g}" if args.window != WINDOW_S else "")
        + "".join(f" --worker-env {name}={value}" for name, value in args.worker_env)
        + (f" --api-core {args.api_core}" if args.api_core is not None else "")
        + (f" --stream {args.stream}" if args.stream != "synthetic" else "")
        + "\n"
    )
    print(
        f"| lookup (2 workers; live input offered at {offered:,.0f} events/s, applied "
        f"{live:,.0f}/s) | p50 ms | p99 ms | max ms | requests | idle p50 / p99 ms "
        "| p99 under load / idle | the worker's own p50 / p99 ms, under load (idle) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (label, (p50, p99, top), count, own), (_, (i50, i99, _), _, idle_own) in zip(
        table, idle, strict=True
    ):
        print(
            f"| {label} | {p50:.2f} | {p99:.2f} | {top:.1f} | {count} | {i50:.2f} / {i99:.2f} "
            f"| {p99 / i99:.1f} | {own[0]:.2f} / {own[1]:.2f} ({idle_own[0]:.2f} / "
            f"{idle_own[1]:.2f}) |"
        )
    print(
        "\n(the worker's own: the `Server-Timing` of the worker asked, from its read of the "
        "request's headers to its answer, forwards included; the rest of a lookup's time is "
        "the network and the wait for a CPU, of the client's process too)"
    )
    read = ", ".join(f"{n:,.0f} from the {s}" for s, n in sorted(sources.items()))
    print(f"\nusers read by the owners during the latency phase: {read or 'not reported'}\n")
    print(
        f"| processing (2 workers draining a backlog, alternating {args.window:g} s windows) "
        "| events/s per window | pooled |"
    )
    print("|---|---|---:|")
    print(f"| without lookups | {runs_without or 'none'} | {shown(without)} |")
    how = (
        f"{args.lookup_rate:g} lookups/s on a fixed schedule (open loop)"
        if args.lookup_rate
        else f"{CLIENTS} closed-loop lookup clients"
    )
    print(
        f"| with {how} ({shown(lookup_rate)} lookups/s answered, each one "
        f"forward) | {runs_with or 'none'} | {shown(with_)} |"
    )
    ratio = "n/a" if with_ is None or not without else f"{with_ / without:.2f}"
    print(f"\nthroughput ratio with/without lookups: {ratio}")
    print_cpu(rows, lookup_rate)
    latencies = [x for r in rows["with"] for x in r.get("latencies", [])]
    if len(latencies) >= 100:
        p50, p99, top = percentiles(latencies)
        print(
            f"lookups during the draining windows (1 forward, {len(latencies):,}): "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {top:.1f} ms"
        )


CPU_PARTS = (
    ("workers", "the two workers"),
    ("api", "their two API processes"),
    ("client", "the lookup client (this process)"),
    ("broker", "the broker"),
    ("rest", "everything else on the machine"),
    ("machine", "the whole machine"),
)


def print_cpu(rows: dict[str, list[dict[str, Any]]], lookup_rate: float | None) -> None:
    """Where the cores went in the windows without and with lookups: each part's CPU seconds
    per second (1.00 = one core), and the workers' CPU per event. A lookup's own cost is the
    difference of API and client CPU between the two kinds, per lookup answered."""
    pooled: dict[str, dict[str, float]] = {}
    for mode in ("without", "with"):
        seconds = sum(r["seconds"] for r in rows[mode])
        if not seconds:
            return
        parts = {p: sum(r["cpu"].get(p, 0.0) for r in rows[mode]) / seconds for p, _ in CPU_PARTS}
        parts["rest"] = parts["machine"] - sum(
            parts[p] for p in ("workers", "api", "client", "broker")
        )
        parts["per_event_us"] = (
            parts["workers"] * seconds / max(sum(r["events"] for r in rows[mode]), 1) * 1e6
        )
        pooled[mode] = parts
    cores = os.cpu_count() or 1
    print(f"\n| CPU, cores busy ({cores} on the machine) | without lookups | with lookups |")
    print("|---|---:|---:|")
    for part, label in CPU_PARTS:
        print(f"| {label} | {pooled['without'][part]:.2f} | {pooled['with'][part]:.2f} |")
    print(
        f"| the workers' CPU per event applied, µs | {pooled['without']['per_event_us']:.1f} "
        f"| {pooled['with']['per_event_us']:.1f} |"
    )
    if lookup_rate:
        spent = {
            part: (pooled["with"][part] - pooled["without"][part]) / lookup_rate * 1000
            for part in ("api", "client")
        }
        print(
            f"\na lookup's CPU (the difference with/without, per lookup answered): API "
            f"processes {spent['api']:.2f} ms, client {spent['client']:.2f} ms"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lookup", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--broker", help="use this broker instead of starting one")
    parser.add_argument(
        "--stream",
        choices=("synthetic", "realistic"),
        default="synthetic",
        help="the input: the synthetic clickstream, or the realistic Segment stream "
        "(bench/realistic.py, on bench/realistic.yaml)",
    )
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--users", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=4, help="windows each without/with lookups")
    parser.add_argument(
        "--window",
        type=float,
        default=WINDOW_S,
        help="seconds per throughput window (shorter windows alternate faster, so a "
        "background load that drifts weighs on both kinds more alike)",
    )
    parser.add_argument(
        "--lookup-rate",
        type=float,
        help="lookups/s in the throughput phase's windows with lookups, on a fixed schedule "
        f"(default: {CLIENTS} closed-loop clients, as many as the API answers)",
    )
    parser.add_argument(
        "--live-rate",
        type=float,
        help="live input during the latency phase, events/s (default: half the two workers' "
        "rate without lookups, measured first)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the working directory (workers' logs, datadirs)"
    )
    parser.add_argument(
        "--api-core",
        type=int,
        help="a core reserved for the two API processes (the workers' ORACULAR_API_CPUS), "
        "shared with this client (as if on a machine of its own), while the workers, the "
        "broker and the load generator run on the other cores",
    )
    add_worker_env_option(
        parser, "a setting for both workers (repeatable), e.g. ORACULAR_STATE_CACHE_USERS=0"
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
