"""End-to-end benchmarks: the real `oracular worker` against a real local broker.

`python -m bench` runs these after the engine benchmarks (`--e2e-only`: only these). A broker
is started on free ports in a temporary directory (infra.broker.start_broker, as the tests
do) and stopped and wiped at the end; every worker is `python -m streams.cli worker --config
examples/oracular.yaml` in a subprocess with its own ORACULAR_APP_ID, ORACULAR_TOPIC_PREFIX
and ORACULAR_DATADIR (8 partitions, at-least-once, RocksDB, every other setting default).

1. Throughput. The synthetic clickstream (bench/synthetic.py) is produced once, as msgpack
   keyed by user, to one input topic before any worker starts. Each pipeline run is a fresh
   worker (new app id: a new consumer group, so it reads the topic from the start) draining
   it; each passthrough run (bench/passthrough.py: aiokafka consume, msgpack decode + encode,
   aiokafka produce) forwards the same topic to a scratch topic. Runs alternate passthrough,
   pipeline, passthrough, ... so both see the same machine. Rates are input events divided by
   the time from the first output record to the last, timed on the records' own timestamps
   (set by the producing process when it sends them), so the bench consumer's own delays do
   not count. The last output is known when the output counts reach what `engine.replay` says
   the events produce (predictions, and episodes including those the timer closes once the
   worker has caught up: the synthetic events are months old, so every open episode is due);
   failing that, when no output arrived for IDLE_S seconds (the run is then flagged). The
   worker's rate up to its last prediction (before the final timer closes) is also kept.
   In the same alternation, each run also drains the topic with `oracular worker --processes
   2` (scale-out: one app id, two processes sharing the partitions; same app-id scheme, a new
   app id per run) and with the peers (bench/peers: an idiomatic Faust agent and Quix Streams,
   each a per-user counter with RocksDB state and a changelog, one output per event, timed the
   same way as the passthrough). A process's CPU is sampled from its first output to the last
   (all its processes: the `--processes` parent and its children).
2. Latency. A fresh worker on an empty input topic; bench/loadgen.py offers events stamped
   with the current time at half the measured pipeline rate for a bounded time. Latency is the
   arrival of an event's prediction (matched by id `<user>:<event id>`) minus the event's
   produce time, for the events that produce a prediction, after a warm-up. Baseline: the
   passthrough at the same offered load, timed the same way.
3. Recovery. A worker drains RECOVERY users' events (each user has some) and writes their
   states to the changelog; then fresh workers (new datadir, same app id) restore them. Restore
   time = process start to "Worker ready" in its log, minus the same for a worker whose app id
   has an empty changelog (same topics, an empty input topic), measured alternately. Then the
   RocksDB table directories are measured (du) and divided by the users.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.synthetic import FILLER, START, clickstream, closing_marks, event_names
from engine import EngineConfig, Event, replay
from infra.broker import Broker, rss_bytes, start_broker, tied_to_parent
from schemas.config import load_config
from schemas.events import encode_event
from streams.admin import ensure_topics_async
from streams.app import STATE_TABLE
from streams.topics import TopicSpec, product_topics

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "oracular.yaml"
PARTITIONS = 8
DAY_MS = 24 * 3600 * 1000
DEFAULT_LATENESS_MS = 120_000  # the worker's default ORACULAR_LATENESS_MS
HUGE_LATENESS_MS = 10 * 365 * 24 * 3600 * 1000
"""Ten years of lateness: no watermark reaches a deadline, so every episode stays open."""

READY_LINE = "Worker ready"
REBUILT_LINE = "deadline index rebuilt"
IDLE_S = 5.0  # no output for this long ends a run whose counts never reached the expected
FIRST_OUTPUT_TIMEOUT_S = 180.0  # worker start to its first output
RUN_TIMEOUT_S = 900.0  # any single run
READY_TIMEOUT_S = 300.0  # worker start to "Worker ready" (a restore included)
STOP_TIMEOUT_S = 60.0  # SIGTERM to exit
MONITOR_S = 5.0  # machine load sampling interval
LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


@dataclass
class Params:
    """Sizes and repetitions of the end-to-end benchmarks."""

    events: int = 100_000
    """Throughput input (was 200,000 before the peers and the scale-out run joined the phase:
    halved to keep `make bench` near 12 minutes; `--e2e-events 200000` for the old size)."""
    users: int = 10_000
    runs: int = 3
    latency_runs: int = 3
    latency_seconds: float = 20.0
    latency_warmup_s: float = 3.0
    latency_rate: float | None = None
    """Offered load; default half the measured pipeline throughput."""
    recovery_users: int = 100_000
    recovery_events_per_user: int = 2
    recovery_runs: int = 3
    phases: tuple[str, ...] = ("throughput", "latency", "recovery")
    peers: tuple[str, ...] = ("faust", "quix")
    """Peers run in the throughput phase (bench/peers): "faust", "quix"."""
    processes: int = 2
    """The throughput phase also runs `oracular worker --processes N` (1: no scale-out run)."""
    worker_env: dict[str, str] = field(default_factory=dict)
    """Extra ORACULAR_* settings for the measured workers (experiments; noted in the output)."""
    worker_root: Path = ROOT
    """The checkout the workers run from (A/B a change against the same broker and data)."""
    keep: bool = False
    """Keep the temporary directory (broker data, worker logs and state) for inspection."""


def say(message: str) -> None:
    """Progress on stderr."""
    print(f"[e2e] {message}", file=sys.stderr, flush=True)


# --- events -----------------------------------------------------------------------------------


def every_user(config: EngineConfig, users: int, per_user: int, seed: int = 5) -> list[Event]:
    """`per_user` consecutive events for each of `users` users (signals 70%, filler 30%).

    A user's events are adjacent in the stream, so one batch usually holds them all and the
    worker writes one changelog record per user. All events fall within 20 minutes (under the
    example config's 30-minute episode timeout), so no event time closes an episode either.
    """
    import random  # noqa: PLC0415 - only here

    rng = random.Random(seed)
    signals, _ = event_names(config)
    out = []
    for user in range(users):
        uid = f"user-{user:06d}"
        for k in range(per_user):
            name = rng.choice(signals) if rng.random() < 0.7 else rng.choice(FILLER)
            at = START + user * 1_200_000 // users + k
            out.append(Event(uid, at, name=name, id=f"r{user}-{k}"))
    return out


def expected_outputs(config: EngineConfig, events: Sequence[Event]) -> dict[str, int]:
    """Predictions and closed episodes the worker publishes for `events`, from `engine.replay`.

    `events` end with `closing_marks` a day after the rest: the watermark they give (that
    time minus the default lateness) closes every other episode.
    """
    result = replay(config, events, until=events[-1].at - DEFAULT_LATENESS_MS)
    return {
        "predictions": sum(1 for step in result.steps if step.predictions),
        "episodes": sum(1 for step in result.steps if step.closed is not None)
        + len(result.closed_at_end),
    }


async def preload(bootstrap: str, topic: str, events: Sequence[Event]) -> float:
    """Produce `events` (keyed by user, murmur2) and wait for the broker's acks; seconds."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=256 * 1024
    )
    await producer.start()
    started = time.monotonic()
    try:
        for event in events:
            await producer.send(topic, encode_event(event), key=event.user.encode())
        await producer.flush()
    finally:
        await producer.stop()
    return time.monotonic() - started


async def create_topics(bootstrap: str, names: Sequence[str]) -> None:
    """Topics with the benchmark's partition count (idempotent)."""
    await ensure_topics_async(bootstrap, [TopicSpec(name, PARTITIONS) for name in names])


async def end_offsets(bootstrap: str, topic: str) -> int:
    """Sum of the topic's end offsets: the records it holds (nothing is deleted here)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.force_metadata_update()  # no public metadata refresh
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in partitions]
        return sum((await consumer.end_offsets(tps)).values()) if tps else 0
    finally:
        await consumer.stop()


# --- processes --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (None if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident memory so far (VmHWM)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def process_tree(pid: int) -> list[int]:
    """`pid` and its living descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of `pid` and its living descendants."""
    return sum(cpu_seconds(p) or 0.0 for p in process_tree(pid))


def tree_peak_rss_bytes(pid: int) -> int:
    """Sum of the peak resident memories of `pid` and its living descendants."""
    return sum(peak_rss_bytes(p) or 0 for p in process_tree(pid))


def tree_rss_bytes(pid: int) -> int:
    """Sum of the resident memories of `pid` and its living descendants."""
    return sum(rss_bytes(p) or 0 for p in process_tree(pid))


def pytest_processes() -> list[str]:
    """Command lines of running pytest processes: other people's test runs on this box."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if "pytest" in cmdline and "python" in cmdline:
            found.append(f"{proc.name} {cmdline[:120]}")
    return found


def log_time(line: str) -> float | None:
    """The epoch time of a Faust log line (it logs local time, to the millisecond)."""
    match = LOG_TIME.match(line)
    if match is None:
        return None
    stamp, millis = match.group(1).split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def clean_env(extra: Mapping[str, str], root: Path = ROOT) -> dict[str, str]:
    """This process's environment without any ORACULAR_* a developer may have set, plus
    `extra`, with the checkout `root` first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORACULAR_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.getenv("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Process:
    """A subprocess tied to this one (it gets SIGTERM if we die), output to a log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: Path = ROOT,
    ) -> None:
        """Prepare; `start()` runs it."""
        self.name, self.argv, self.env, self.log_path = name, argv, dict(env), log_path
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self.started_wall = 0.0
        self.cpu_at_start = 0.0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Process:
        """Start it (its own session: a Ctrl-C on the bench reaches it only through us)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.started_wall = time.time()
            self.process = subprocess.Popen(
                tied_to_parent(self.argv),
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    async def wait_line(self, text: str, timeout_s: float, count: int = 1) -> float:
        """Wait until `count` log lines contain `text`; return the last one's log time (epoch
        s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            lines = [line for line in self.log_text().splitlines() if text in line]
            if len(lines) >= count:
                return log_time(lines[count - 1]) or time.time()
            if not self.running:
                msg = f"{self.name} exited before {text!r}; log {self.log_path}:\n"
                raise RuntimeError(msg + self.log_tail())
            if time.monotonic() > deadline:
                msg = f"{self.name}: no {text!r} within {timeout_s:.0f} s; log {self.log_path}:\n"
                raise RuntimeError(msg + self.log_tail())
            await asyncio.sleep(0.1)

    async def wait_exit(self, timeout_s: float) -> int:
        """Wait for the process to exit by itself; kill it after `timeout_s`."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.process.kill()
                self.process.wait()
                msg = f"{self.name} did not finish within {timeout_s:.0f} s (killed):\n"
                raise RuntimeError(msg + self.log_tail())
            await asyncio.sleep(0.1)
        return self.process.returncode

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a worker flushes, commits and leaves its group), SIGKILL after a while."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                say(f"{self.name} did not stop within {timeout_s:.0f} s of SIGTERM; killing it")
                process.kill()
                process.wait()
        return process.returncode


class Worker(Process):
    """`python -m streams.cli worker` with its settings in ORACULAR_* variables."""

    def __init__(
        self,
        name: str,
        *,
        bootstrap: str,
        app_id: str,
        prefix: str,
        datadir: Path,
        log_path: Path,
        settings: Mapping[str, str] | None = None,
        root: Path = ROOT,
        processes: int = 1,
    ) -> None:
        """A worker for `app_id` on topics `<prefix>.*` (overridable in `settings`), run from
        the checkout `root`; `processes` > 1 runs `oracular worker --processes N` (datadirs
        `<datadir>/p<i>`)."""
        self.app_id, self.prefix, self.datadir = app_id, prefix, datadir
        self.processes = processes
        self.settings = {
            "ORACULAR_BROKER": bootstrap,
            "ORACULAR_APP_ID": app_id,
            "ORACULAR_TOPIC_PREFIX": prefix,
            "ORACULAR_PARTITIONS": str(PARTITIONS),
            "ORACULAR_DATADIR": str(datadir),
            **(settings or {}),
        }
        argv = [sys.executable, "-m", "streams.cli", "worker", "--config", str(CONFIG)]
        if processes > 1:
            argv += ["--processes", str(processes)]
        super().__init__(name, argv, clean_env(self.settings, root), log_path, cwd=root)

    @property
    def topics(self) -> Any:
        """The product topics this worker uses."""
        return product_topics(self.settings)

    def summaries(self) -> dict[str, dict[str, str]]:
        """Per process id in the log, the fields of its last `oracular summary` line (the one
        logged at shutdown)."""
        found = {}
        for line in self.log_text().splitlines():
            if "oracular summary:" in line:
                pid = re.match(r"^\[[^]]*\] \[(\d+)\]", line)
                found[pid.group(1) if pid else "?"] = dict(
                    part.split("=", 1)
                    for part in line.split("summary:", 1)[1].split()
                    if "=" in part
                )
        return found

    def summary(self) -> dict[str, str]:
        """The fields of the last `oracular summary` line (the one logged at shutdown)."""
        found = self.summaries()
        return list(found.values())[-1] if found else {}


def table_bytes(datadir: Path) -> int:
    """Bytes on disk (du) of the state table's RocksDB directories under `datadir`."""
    dirs = [p for p in datadir.rglob(f"{STATE_TABLE}*.db") if p.is_dir()]
    if not dirs:
        return 0
    out = subprocess.run(
        ["du", "-s", "-B1", "-c", *map(str, dirs)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1].split()[0])


# --- output collection ------------------------------------------------------------------------


@dataclass
class Outputs:
    """What a collector saw on the output topics."""

    counts: Counter[str] = field(default_factory=Counter)
    first_ts: int | None = None
    """Smallest record timestamp (ms; set by the producing process when it sent the record)."""
    last_ts: dict[str, int] = field(default_factory=dict)
    """Per role, the largest record timestamp."""
    values: list[tuple[float, bytes]] = field(default_factory=list)
    """(arrival wall time, value) of every record, when kept."""
    stamps: dict[str, list[int]] = field(default_factory=dict)
    """Per role, every record's timestamp (ms), in arrival order."""
    complete: bool = False
    """The counts reached the expected counts (else the run ended on idle or timeout)."""
    ended_by: str = ""

    def span_s(self, *roles: str) -> float:
        """Seconds from the first output of any role to the last of `roles` (default: all)."""
        last = max(self.last_ts[r] for r in (roles or tuple(self.last_ts)) if r in self.last_ts)
        assert self.first_ts is not None
        return max(last - self.first_ts, 1) / 1000

    def add(self, role: str, records: Sequence[Any], arrival: float, *, keep: bool) -> None:
        """Count `records` of `role`, which arrived at wall time `arrival`."""
        self.counts[role] += len(records)
        self.stamps.setdefault(role, []).extend(record.timestamp for record in records)
        for record in records:
            ts = record.timestamp
            if self.first_ts is None or ts < self.first_ts:
                self.first_ts = ts
            if ts > self.last_ts.get(role, 0):
                self.last_ts[role] = ts
            if keep and record.value is not None:
                self.values.append((arrival, record.value))


@dataclass
class _Clock:
    """When a collector started, last saw output, and saw its input finish (monotonic)."""

    began: float
    last_output: float | None = None
    input_done: float | None = None

    def ending(self, now: float, idle_s: float, waits_for_input: bool) -> str:
        """Why the collection ends now, or "" to go on."""
        if self.last_output is not None and (self.input_done or not waits_for_input):
            quiet = now - max(self.last_output, self.input_done or 0.0)
            if quiet > idle_s:
                return f"no output for {idle_s:.0f} s"
        if self.last_output is None and now - self.began > FIRST_OUTPUT_TIMEOUT_S:
            return "no output at all"
        if now - self.began > RUN_TIMEOUT_S:
            return "run timeout"
        return ""


async def collect(
    bootstrap: str,
    topics: Mapping[str, str],
    *,
    expected: Mapping[str, int] | None = None,
    keep_values: bool = False,
    started: asyncio.Event | None = None,
    input_done: Callable[[], bool] | None = None,
    idle_s: float = IDLE_S,
    first_output: asyncio.Event | None = None,
) -> Outputs:
    """Read `topics` (role -> topic) from the beginning until the counts reach `expected`, or
    nothing arrived for `idle_s` after the first output (and after `input_done()` holds).
    `started` is set once the consumer runs, `first_output` when the first records arrive."""
    role_of = {topic: role for role, topic in topics.items()}
    consumer = AIOKafkaConsumer(
        *topics.values(),
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    out = Outputs()
    await consumer.start()
    if started is not None:
        started.set()
    clock = _Clock(time.monotonic())
    try:
        while not out.ended_by:
            batches = await consumer.getmany(timeout_ms=100)
            arrival, now = time.time(), time.monotonic()
            for tp, records in batches.items():
                out.add(role_of[tp.topic], records, arrival, keep=keep_values)
                clock.last_output = now
            if batches and first_output is not None:
                first_output.set()
            if expected is not None and all(out.counts[r] >= n for r, n in expected.items()):
                out.complete, out.ended_by = True, "expected counts"
                break
            if input_done is not None and clock.input_done is None and input_done():
                clock.input_done = now
            out.ended_by = clock.ending(now, idle_s, waits_for_input=input_done is not None)
    finally:
        await consumer.stop()
    return out


# --- the benchmark ----------------------------------------------------------------------------


@dataclass
class Results:
    """Everything measured, for the table and the Markdown section."""

    params: Params
    loads: list[tuple[str, tuple[float, float, float]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    preload_s: float = 0.0
    expected: dict[str, int] = field(default_factory=dict)
    input_count: int = 0
    """Records in the throughput phase's input topic (the events and the closing marks)."""
    pipeline: list[dict[str, Any]] = field(default_factory=list)
    passthrough: list[dict[str, Any]] = field(default_factory=list)
    scaled: list[dict[str, Any]] = field(default_factory=list)
    """The `oracular worker --processes N` runs (N = params.processes)."""
    peers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per peer (bench/peers), its throughput runs."""
    peer_versions: dict[str, str] = field(default_factory=dict)
    peer_unavailable: dict[str, str] = field(default_factory=dict)
    """Per peer that was not (or no longer) measured, why."""
    latency_rate: float = 0.0
    latency: list[dict[str, Any]] = field(default_factory=list)
    latency_base: list[dict[str, Any]] = field(default_factory=list)
    recovery: dict[str, Any] = field(default_factory=dict)
    restores: list[dict[str, Any]] = field(default_factory=list)
    empties: list[dict[str, Any]] = field(default_factory=list)
    broker_rss: int | None = None
    durations: dict[str, float] = field(default_factory=dict)
    """Seconds each phase took."""
    samples: list[tuple[float, int]] = field(default_factory=list)
    """(1-minute load average, pytest processes running) every MONITOR_S seconds."""

    def load(self, when: str) -> None:
        """Note the load average now."""
        self.loads.append((when, os.getloadavg()))

    async def monitor(self) -> None:
        """Sample the machine's load and other test runs until cancelled."""
        while True:
            self.samples.append((os.getloadavg()[0], len(pytest_processes())))
            await asyncio.sleep(MONITOR_S)

    def machine_load(self) -> str:
        """What else ran during the benchmark, from the samples."""
        if not self.samples:
            return ""
        busy = sum(1 for _, tests in self.samples if tests)
        loads = sorted(load for load, _ in self.samples)
        return (
            f"During the run, other test runs (pytest processes) were seen in {busy} of "
            f"{len(self.samples)} samples taken every {MONITOR_S:.0f} s; 1-minute load "
            f"average median {statistics.median(loads):.2f}, max {loads[-1]:.2f} (2 = both "
            "cores busy)."
        )


PEERS = {
    "faust": ("bench.peers.faust_agent", "Faust agent", "faust-streaming"),
    "quix": ("bench.peers.quix_app", "Quix Streams", "quixstreams"),
}
"""Peer name -> (module, label, distribution)."""


async def cpu_at(event: asyncio.Event, pid: int) -> float:
    """CPU seconds of `pid`'s process tree when `event` is set."""
    await event.wait()
    return tree_cpu_seconds(pid)


def settled_rate(outputs: Outputs, count: int, ready: float) -> float | None:
    """Events/s after `ready` (epoch s; the last of a worker's processes ready), estimated from
    the predictions: `count` times the share of them stamped after `ready`, over the time from
    `ready` to the last. None when no prediction came before `ready` (then the rate over the
    whole span already is that)."""
    stamps = outputs.stamps.get("predictions", [])
    at = ready * 1000
    after = [ts for ts in stamps if ts >= at]
    if not after or len(after) == len(stamps):
        return None
    return count * len(after) / len(stamps) / max((max(after) - at) / 1000, 1e-3)


def finished(task: asyncio.Task[Any]) -> bool:
    """The task has a result (not cancelled, no exception)."""
    return task.done() and not task.cancelled() and task.exception() is None


async def outputs_of(collector: asyncio.Task[Outputs], proc: Process) -> Outputs:
    """The collector's result; RuntimeError if `proc` exits before the collection ends."""
    while not collector.done():
        if not proc.running:
            await asyncio.sleep(1.0)  # outputs it flushed while stopping still arrive
            if collector.done():
                break
            code = proc.process.returncode if proc.process else None
            msg = f"{proc.name} exited ({code}) before its outputs were complete; log "
            msg += f"{proc.log_path}:\n{proc.log_tail()}"
            raise RuntimeError(msg)
        await asyncio.wait({collector}, timeout=0.2)
    return collector.result()


class Bench:
    """One end-to-end benchmark session: a broker, a temp dir, unique names."""

    def __init__(self, broker: Broker, workdir: Path, params: Params) -> None:
        """Use `broker`; everything else goes under `workdir`."""
        self.broker, self.workdir, self.params = broker, workdir, params
        self.bootstrap = broker.bootstrap
        self.config = load_config(CONFIG)
        self.session = uuid.uuid4().hex[:6]
        self.counter = 0
        self.results = Results(params)

    def name(self, what: str) -> str:
        """A name no other run (or earlier session on a reused broker) uses."""
        self.counter += 1
        return f"bench-{self.session}-{self.counter:02d}-{what}"

    def worker(
        self, name: str, *, app_id: str | None = None, processes: int = 1, **settings: str
    ) -> Worker:
        """A worker with its own app id, topic prefix, datadir and log (unless overridden);
        `processes` > 1: `oracular worker --processes N`."""
        app_id = app_id or name
        return Worker(
            name,
            bootstrap=self.bootstrap,
            app_id=app_id,
            prefix=settings.pop("prefix", name),
            datadir=self.workdir / "state" / name,
            log_path=self.workdir / "logs" / f"{name}.log",
            root=self.params.worker_root,
            processes=processes,
            settings={
                **self.params.worker_env,
                **{f"ORACULAR_{k.upper()}": v for k, v in settings.items()},
            },
        )

    def helper(self, module: str, name: str, **flags: object) -> Process:
        """`python -m <module> --bootstrap <broker> --<flag> <value> ...` (not yet started)."""
        argv = [sys.executable, "-m", module, "--bootstrap", self.bootstrap]
        for flag, value in flags.items():
            argv += [f"--{flag.replace('_', '-')}", str(value)]
        return Process(name, argv, clean_env({}), self.workdir / "logs" / f"{name}.log")

    # --- 1. throughput ----------------------------------------------------------------------

    async def throughput(self) -> None:
        """Alternate passthrough and pipeline runs over one preloaded input topic."""
        p, r = self.params, self.results
        source = self.name("input")
        events = clickstream(self.config, p.events, p.users)
        events += closing_marks(events[-1].at + DAY_MS, PARTITIONS)
        say(f"expected outputs of {p.events:,} events over {p.users:,} users (engine.replay)")
        r.expected = expected_outputs(self.config, events)
        await create_topics(self.bootstrap, [source])
        r.preload_s = await preload(self.bootstrap, source, events)
        r.input_count = len(events)
        say(f"preloaded {p.events:,} events to {source} in {r.preload_s:.1f} s; {r.expected}")
        del events
        peers = self.available_peers()
        for run in range(p.runs):
            r.load(f"throughput run {run + 1}")
            r.passthrough.append(await self.passthrough_run(source, p.events))
            say(f"passthrough {run + 1}/{p.runs}: {r.passthrough[-1]['rate']:,.0f} events/s")
            r.pipeline.append(await self.pipeline_run(source, p.events, r.expected))
            row = r.pipeline[-1]
            say(
                f"pipeline {run + 1}/{p.runs}: {row['rate']:,.0f} events/s "
                f"(to the last prediction {row['rate_pred']:,.0f}/s; {row['ended_by']}; "
                f"CPU {row['cpu']:.0%} of a core; peak RSS {row['peak_rss'] / 2**20:.0f} MiB)"
            )
            if p.processes > 1:
                r.scaled.append(
                    await self.pipeline_run(source, p.events, r.expected, processes=p.processes)
                )
                row = r.scaled[-1]
                say(
                    f"pipeline --processes {p.processes} {run + 1}/{p.runs}: "
                    f"{row['rate']:,.0f} events/s ({row['ended_by']}; CPU {row['cpu']:.0%} of "
                    f"a core; applied {row['applied_by_process']}; last ready "
                    f"{row['ready_spread']:.1f} s after the first)"
                )
            for peer in list(peers):
                row = await self.peer_run(peer, source, r.input_count)
                r.peers.setdefault(peer, []).append(row)
                label = PEERS[peer][1]
                if row.get("error"):
                    say(f"{label} {run + 1}/{p.runs}: FAILED ({row['error']}); not run again")
                    r.peer_unavailable[peer] = f"run {run + 1} failed: {row['error']}"
                    peers.remove(peer)
                else:
                    say(
                        f"{label} {run + 1}/{p.runs}: {row['rate']:,.0f} events/s "
                        f"({row['ended_by']}; CPU {row['cpu']:.0%} of a core)"
                    )

    def available_peers(self) -> list[str]:
        """The peers asked for that can run here (Quix Streams installed on demand)."""
        from bench.peers import ensure_quixstreams  # noqa: PLC0415

        p, r = self.params, self.results
        found = []
        for peer in p.peers:
            if peer not in PEERS:
                r.peer_unavailable[peer] = "unknown peer (known: " + ", ".join(PEERS) + ")"
                continue
            if peer == "quix":
                version, why = ensure_quixstreams(say)
                if version is None:
                    r.peer_unavailable[peer] = why
                    say(f"Quix Streams unavailable: {why}")
                    continue
            with contextlib.suppress(Exception):
                r.peer_versions[peer] = importlib.metadata.version(PEERS[peer][2])
            found.append(peer)
        return found

    async def peer_run(self, peer: str, source: str, count: int) -> dict[str, Any]:
        """One peer drains `source` (one output per input record) to its own topic."""
        module, label, _ = PEERS[peer]
        name = self.name(peer)
        dest = f"{name}.out"
        await create_topics(self.bootstrap, [dest])
        started, first = asyncio.Event(), asyncio.Event()
        collector = asyncio.create_task(
            collect(
                self.bootstrap,
                {"out": dest},
                expected={"out": count},
                started=started,
                first_output=first,
            )
        )
        await started.wait()
        proc = self.helper(
            module,
            name,
            source=source,
            dest=dest,
            app_id=name,
            datadir=self.workdir / "state" / name,
        ).start()
        cpu0 = asyncio.create_task(cpu_at(first, proc.pid))
        error = ""
        try:
            outputs = await outputs_of(collector, proc)
            cpu1 = tree_cpu_seconds(proc.pid)
            peak = tree_peak_rss_bytes(proc.pid)
        except RuntimeError as exc:
            say(str(exc))
            error = str(exc).splitlines()[0]
            outputs = Outputs(ended_by="process exited")
            cpu1, peak = 0.0, 0
        finally:
            collector.cancel()
            cpu0.cancel()
            proc.stop()
        if not error and outputs.first_ts is None:
            error = f"no output within {FIRST_OUTPUT_TIMEOUT_S:.0f} s of its start"
            say(f"{label}: {error}; log {proc.log_path}:\n{proc.log_tail()}")
        elif (
            not error
            and outputs.first_ts is not None
            and outputs.first_ts < proc.started_wall * 1000
        ):
            # The rate is timed on the output records' timestamps: they must be produce times.
            error = "its output timestamps predate its start (copied from the input?)"
        if error:
            return {"error": error, "log": str(proc.log_path)}
        span = outputs.span_s()
        return {
            "rate": outputs.counts["out"] / span,
            "seconds": span,
            "count": outputs.counts["out"],
            "complete": outputs.complete,
            "ended_by": outputs.ended_by,
            "cpu": (cpu1 - cpu0.result()) / span if finished(cpu0) else float("nan"),
            "peak_rss": peak,
        }

    async def passthrough_run(self, source: str, count: int) -> dict[str, Any]:
        dest = self.name("passthrough")
        await create_topics(self.bootstrap, [dest])
        started = asyncio.Event()
        collector = asyncio.create_task(
            collect(self.bootstrap, {"out": dest}, expected={"out": count}, started=started)
        )
        await started.wait()
        proc = self.helper("bench.passthrough", dest, source=source, dest=dest, count=count).start()
        try:
            outputs = await collector
            await proc.wait_exit(STOP_TIMEOUT_S)
        finally:
            collector.cancel()
            proc.stop()
        span = outputs.span_s()
        own = json.loads(proc.log_text().strip().splitlines()[-1])  # its own summary line
        return {
            "rate": outputs.counts["out"] / span,
            "seconds": span,
            "count": outputs.counts["out"],
            "ended_by": outputs.ended_by,
            "cpu": own["cpu_share"],
        }

    async def pipeline_run(
        self, source: str, count: int, expected: Mapping[str, int], processes: int = 1
    ) -> dict[str, Any]:
        """A fresh worker (`processes` processes of one new app id) drains `source`."""
        kind = "pipeline" if processes == 1 else f"pipeline-x{processes}"
        worker = self.worker(self.name(kind), processes=processes, topic_events=source)
        topics = worker.topics
        await create_topics(self.bootstrap, [spec.name for spec in topics])
        roles = {"predictions": topics.predictions.name, "episodes": topics.episodes.name}
        started, first = asyncio.Event(), asyncio.Event()
        collector = asyncio.create_task(
            collect(self.bootstrap, roles, expected=expected, started=started, first_output=first)
        )
        await started.wait()
        broker_cpu0 = asyncio.create_task(cpu_at(first, self.broker.pid))
        worker.start()
        cpu0 = asyncio.create_task(cpu_at(first, worker.pid))
        try:
            ready_first = await worker.wait_line(READY_LINE, READY_TIMEOUT_S)
            ready = await worker.wait_line(READY_LINE, READY_TIMEOUT_S, count=processes)
            outputs = await outputs_of(collector, worker)
            cpu1 = tree_cpu_seconds(worker.pid)
            broker_cpu1 = cpu_seconds(self.broker.pid) or 0.0
            peak = tree_peak_rss_bytes(worker.pid)
            rss = tree_rss_bytes(worker.pid)
        finally:
            collector.cancel()
            cpu0.cancel()
            broker_cpu0.cancel()
            worker.stop()
        summaries = worker.summaries()
        summary = worker.summary()
        span_pred = outputs.span_s("predictions")
        span_all = outputs.span_s()
        assert outputs.first_ts is not None
        return {
            "rate_settled": settled_rate(outputs, count, ready),
            "processes": processes,
            "ready_spread": ready - ready_first,
            "applied_by_process": "+".join(s.get("applied", "?") for s in summaries.values()),
            "rate": count / span_all,
            "rate_pred": count / span_pred,
            "seconds": span_pred,
            "seconds_all": span_all,
            "first_output_after_ready": outputs.first_ts / 1000 - ready,
            "startup": ready - worker.started_wall,
            "counts": dict(outputs.counts),
            "complete": outputs.complete,
            "ended_by": outputs.ended_by,
            "applied": summary.get("applied")
            if processes == 1
            else str(sum(int(s.get("applied", 0)) for s in summaries.values())),
            "closed_by_timer": summary.get("closed_by_timer"),
            "cpu": (cpu1 - cpu0.result()) / span_all if finished(cpu0) else float("nan"),
            "broker_cpu": (broker_cpu1 - broker_cpu0.result()) / span_all
            if finished(broker_cpu0)
            else float("nan"),
            "peak_rss": peak,
            "rss": rss,
        }

    # --- 2. latency -------------------------------------------------------------------------

    async def latency(self) -> None:
        """Pipeline and passthrough latency at half the measured pipeline throughput."""
        p, r = self.params, self.results
        if p.latency_rate is not None:
            rate = p.latency_rate
        elif r.pipeline:
            rate = statistics.median(row["rate"] for row in r.pipeline) / 2
        else:
            rate = 1_000.0
            r.notes.append("latency offered load: 1,000 events/s (no throughput measured)")
        r.latency_rate = rate
        for run in range(p.latency_runs):
            r.load(f"latency run {run + 1}")
            r.latency_base.append(await self.latency_run("passthrough", rate, run))
            say(f"latency passthrough {run + 1}: {_fmt_latency(r.latency_base[-1])}")
            r.latency.append(await self.latency_run("pipeline", rate, run))
            say(f"latency pipeline {run + 1}: {_fmt_latency(r.latency[-1])}")

    async def latency_run(self, kind: str, rate: float, run: int) -> dict[str, Any]:
        p = self.params
        name = self.name(f"latency-{kind}")
        worker: Worker | None = None
        passthrough: Process | None = None
        if kind == "pipeline":
            worker = self.worker(name)
            topics = worker.topics
            source, dest = topics.events.name, topics.predictions.name
            await create_topics(self.bootstrap, [spec.name for spec in topics])
            worker.start()
            await worker.wait_line(READY_LINE, READY_TIMEOUT_S)
        else:
            source, dest = f"{name}.in", f"{name}.out"
            await create_topics(self.bootstrap, [source, dest])
            passthrough = self.helper(
                "bench.passthrough",
                name,
                source=source,
                dest=dest,
                count=int(rate * p.latency_seconds),
                idle_exit=10,
            ).start()
            await asyncio.sleep(2.0)  # its consumer has its assignment before the first send
        sent_path = self.workdir / f"{name}.sent"
        loadgen = self.helper(
            "bench.loadgen",
            f"{name}-loadgen",
            topic=source,
            rate=f"{rate:.1f}",
            seconds=p.latency_seconds,
            users=p.users,
            seed=100 + run,
            id_prefix=f"L{run}-",
            config=CONFIG,
            out=sent_path,
        )
        started = asyncio.Event()
        collector = asyncio.create_task(
            collect(
                self.bootstrap,
                {"out": dest},
                keep_values=True,
                started=started,
                input_done=lambda: not loadgen.running,
                idle_s=3.0,
            )
        )
        try:
            await started.wait()
            loadgen.start()
            outputs = await collector
            await loadgen.wait_exit(STOP_TIMEOUT_S)
            peak = peak_rss_bytes(worker.pid) if worker else None
        finally:
            collector.cancel()
            if worker is not None:
                worker.stop()
            if passthrough is not None:
                passthrough.stop()
        sent: dict[str, float] = msgpack.unpackb(sent_path.read_bytes())
        warm_from = min(sent.values()) + p.latency_warmup_s
        latencies = []
        series = []  # (produce time, latency) of every matched event, kept for inspection
        for arrival, value in outputs.values:
            message = msgpack.unpackb(value, raw=False)
            key = message["id"] if kind == "pipeline" else f"{message['user']}:{message['id']}"
            at = sent.get(key)
            if at is not None:
                series.append((at, arrival - at))
                if at >= warm_from:
                    latencies.append(arrival - at)
        sent_path.with_suffix(".latency").write_bytes(msgpack.packb(sorted(series)))
        measured = sum(1 for t in sent.values() if t >= warm_from)
        return {
            **_percentiles(latencies),
            "sent": len(sent),
            "measured_events": measured,
            "with_output": len(latencies),
            "peak_rss": peak,
        }

    # --- 3. recovery ------------------------------------------------------------------------

    async def recovery(self) -> None:
        """Build a changelog of `recovery_users` users, then time restores against a baseline."""
        p, r = self.params, self.results
        r.load("recovery")
        events = every_user(self.config, p.recovery_users, p.recovery_events_per_user)
        expected = expected_outputs(self.config, events)
        writer = self.worker(self.name("recovery"), lateness_ms=str(HUGE_LATENESS_MS))
        topics = writer.topics
        empty_input = f"{writer.prefix}.events-empty"
        await create_topics(self.bootstrap, [spec.name for spec in topics] + [empty_input])
        preload_s = await preload(self.bootstrap, topics.events.name, events)
        say(f"recovery: preloaded {len(events):,} events of {p.recovery_users:,} users")
        del events
        # Every episode stays open (ten years of lateness), so nothing closes: only predictions.
        roles = {"predictions": topics.predictions.name}
        started = asyncio.Event()
        collector = asyncio.create_task(
            collect(
                self.bootstrap,
                roles,
                expected={"predictions": expected["predictions"]},
                started=started,
            )
        )
        await started.wait()
        writer.start()
        changelog = f"{writer.app_id}-{STATE_TABLE}-changelog"
        try:
            outputs = await collector
            records = await self.settled_end_offsets(changelog, p.recovery_users)
        finally:
            collector.cancel()
            writer.stop()
        drain = outputs.span_s() if outputs.first_ts is not None else float("nan")
        r.recovery = {
            "users": p.recovery_users,
            "events": p.recovery_users * p.recovery_events_per_user,
            "preload_s": preload_s,
            "writer_rate": p.recovery_users * p.recovery_events_per_user / drain,
            "writer_complete": outputs.complete,
            "changelog_records": records,
            "changelog_bytes": self.broker_topic_bytes(changelog),
            "writer_table_bytes": table_bytes(writer.datadir),
        }
        say(f"recovery: changelog {records:,} records; restoring {p.recovery_runs} times")
        for run in range(p.recovery_runs):
            empty = self.worker(
                self.name("empty"),
                prefix=writer.prefix,
                topic_events=empty_input,
                lateness_ms=str(HUGE_LATENESS_MS),
            )
            r.empties.append(await self.time_ready(empty))
            restore = self.worker(
                self.name("restore"),
                app_id=writer.app_id,
                prefix=writer.prefix,
                lateness_ms=str(HUGE_LATENESS_MS),
            )
            r.restores.append(await self.time_ready(restore))
            say(
                f"recovery {run + 1}/{p.recovery_runs}: ready after "
                f"{r.restores[-1]['ready_s']:.1f} s; empty changelog "
                f"{r.empties[-1]['ready_s']:.1f} s"
            )

    async def time_ready(self, worker: Worker) -> dict[str, Any]:
        """Start `worker`, wait for "Worker ready", stop it; its times, memory, table size."""
        worker.start()
        try:
            ready = await worker.wait_line(READY_LINE, READY_TIMEOUT_S)
            rebuilt = worker.log_text().count(REBUILT_LINE)
            rss = rss_bytes(worker.pid) or 0
            peak = peak_rss_bytes(worker.pid) or 0
        finally:
            worker.stop()
        rebuilt_line = next(
            (line for line in worker.log_text().splitlines() if REBUILT_LINE in line), ""
        )
        open_users = re.search(r"rebuilt: (\d+) users", rebuilt_line)
        return {
            "ready_s": ready - worker.started_wall,
            "rss": rss,
            "peak_rss": peak,
            "table_bytes": table_bytes(worker.datadir),
            "rebuilt_logs": rebuilt,
            "open_users": int(open_users.group(1)) if open_users else None,
        }

    async def settled_end_offsets(self, topic: str, at_least: int) -> int:
        """The topic's record count once it holds `at_least` and stopped growing (bounded)."""
        deadline = time.monotonic() + 120.0
        previous = -1
        while True:
            count = await end_offsets(self.bootstrap, topic)
            if (count >= at_least and count == previous) or time.monotonic() > deadline:
                return count
            previous = count
            await asyncio.sleep(1.0)

    def broker_topic_bytes(self, topic: str) -> int:
        """Bytes on the broker's disk for `topic` (all partitions; du)."""
        dirs = sorted((self.broker.workdir / "data").glob(f"{topic}-*"))
        if not dirs:
            return 0
        out = subprocess.run(
            ["du", "-s", "-B1", "-c", *map(str, dirs)], capture_output=True, text=True, check=True
        )
        return int(out.stdout.strip().splitlines()[-1].split()[0])

    async def run(self) -> Results:
        """Run the selected phases."""
        phases = self.params.phases
        monitor = asyncio.create_task(self.results.monitor())
        try:
            for phase, step in (
                ("throughput", self.throughput),
                ("latency", self.latency),
                ("recovery", self.recovery),
            ):
                if phase in phases:
                    began = time.monotonic()
                    await step()
                    self.results.durations[phase] = time.monotonic() - began
        finally:
            monitor.cancel()
        self.results.broker_rss = self.broker.rss_bytes()
        self.results.load("end")
        return self.results


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    return {
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
    }


def _fmt_latency(row: Mapping[str, Any]) -> str:
    return (
        f"p50 {row['p50'] * 1000:.1f} ms, p99 {row['p99'] * 1000:.1f} ms, "
        f"max {row['max'] * 1000:.1f} ms over {row['with_output']:,} events"
    )


def run(params: Params) -> Results:
    """Start a broker in a temp dir, run the benchmarks, stop and wipe the broker."""
    # aiokafka logs the retries of a consumer that starts while new topics elect leaders
    # ("NotLeaderForPartitionError") as errors; they resolve themselves. Real failures
    # surface as the bench's own timeouts.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    workdir = Path(tempfile.mkdtemp(prefix="oracular-bench-"))
    say(f"working directory {workdir}")
    broker = start_broker(workdir / "kafka", port=None, stop_with_parent=True)
    try:
        return asyncio.run(Bench(broker, workdir, params).run())
    finally:
        broker.stop(wipe=not params.keep)
        if params.keep:
            say(f"kept {workdir}")
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)


# --- the report -------------------------------------------------------------------------------

BEGIN, END = "<!-- bench:e2e:begin -->", "<!-- bench:e2e:end -->"
TARGET_RATE = 10_000
TARGET_RATIO = 0.5
TARGET_P99_S = 0.050


def _median(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def _mib(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value / 2**20:,.0f} MiB"


def _ms(value: float) -> str:
    return f"{value * 1000:,.1f} ms"


def _list(rows: Sequence[Mapping[str, Any]], key: str, fmt: str = "{:,.0f}") -> str:
    return " / ".join("n/a" if row.get(key) is None else fmt.format(row[key]) for row in rows)


def _kafka_version() -> str:
    match = re.search(r"<kafka.version>([^<]+)<", (ROOT / "infra" / "pom.xml").read_text())
    return match.group(1) if match else "?"


def code_version(root: Path) -> str:
    """The commit the workers ran, and whether their code had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "streams", "engine", "schemas"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"{root} (not a git checkout)"
    return f"commit {head}" + (" with uncommitted changes in the product" if dirty else "")


def machine() -> str:
    """One line about the machine."""
    import platform  # noqa: PLC0415

    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return (
        f"{platform.machine()}, {cpu}, {os.cpu_count()} cores, {memory / 2**30:.0f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def _cell(text: str) -> str:
    """`text` fit for a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _peer_ok(r: Results, peer: str) -> list[dict[str, Any]]:
    """The peer's runs that produced a rate."""
    return [row for row in r.peers.get(peer, []) if not row.get("error")]


def scale_out_rows(r: Results) -> list[tuple[str, str, str, str, str]]:
    """The `--processes N` rows: N processes against one, same runs."""
    if not r.scaled:
        return []
    one, many = _median(r.pipeline, "rate"), _median(r.scaled, "rate")
    n = r.params.processes
    return [
        (
            f"throughput, events/s (`oracular worker --processes {n}`)",
            f"{many:,.0f}",
            f"one process {one:,.0f}",
            f"{many / one:.2f}",
            "",
        ),
        (
            f"worker CPU while draining, {n} processes (share of one core, all processes)",
            f"{_median(r.scaled, 'cpu'):.0%}",
            f"one process {_median(r.pipeline, 'cpu'):.0%}",
            "",
            "",
        ),
    ]


def peer_rows(r: Results) -> list[tuple[str, str, str, str, str]]:
    """One row per peer: the one-process worker's rate against the peer's (ratio worker/peer)."""
    out = []
    worker = _median(r.pipeline, "rate")
    for peer in r.params.peers:
        label = PEERS[peer][1] if peer in PEERS else peer
        measure = f"throughput vs {label} (per-user count in RocksDB, one output per event)"
        ok = _peer_ok(r, peer)
        if ok:
            rate = _median(ok, "rate")
            partial = f" ({len(ok)} of {r.params.runs} runs)" if len(ok) < r.params.runs else ""
            out.append(
                (
                    measure,
                    f"{worker:,.0f}",
                    f"{label} {rate:,.0f}{partial}",
                    f"{worker / rate:.2f}",
                    "",
                )
            )
        else:
            why = r.peer_unavailable.get(peer, "not run")
            out.append((measure, f"{worker:,.0f}", _cell(f"{label}: not measured: {why}"), "", ""))
    return out


def rows(r: Results) -> list[tuple[str, str, str, str, str]]:
    """(measure, worker, same-run baseline, ratio, target) rows of the summary table."""
    out = []
    if r.pipeline:
        rate, base = _median(r.pipeline, "rate"), _median(r.passthrough, "rate")
        ratio = rate / base
        out.append(
            (
                "throughput, events/s (one worker)",
                f"{rate:,.0f}",
                f"passthrough {base:,.0f}",
                f"{ratio:.2f}",
                f"≥ {TARGET_RATE:,}: {'met' if rate >= TARGET_RATE else 'MISSED'}; "
                f"≥ {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'MISSED'}",
            )
        )
        out.append(
            (
                "worker CPU while draining (share of one core)",
                f"{_median(r.pipeline, 'cpu'):.0%}",
                f"passthrough {_median(r.passthrough, 'cpu'):.0%}",
                "",
                "",
            )
        )
        out += scale_out_rows(r) + peer_rows(r)
    if r.latency:
        for key in ("p50", "p99", "max"):
            worker, base = _median(r.latency, key), _median(r.latency_base, key)
            target = ""
            if key == "p99":
                target = f"< {_ms(TARGET_P99_S)}: " + ("met" if worker < TARGET_P99_S else "MISSED")
            out.append(
                (
                    f"latency {key}, produce → prediction, at {r.latency_rate:,.0f} events/s",
                    _ms(worker),
                    f"passthrough {_ms(base)}",
                    f"{worker / base:.0f}×" if base > 0 else "",
                    target,
                )
            )
    if r.restores:
        ready, empty = _median(r.restores, "ready_s"), _median(r.empties, "ready_s")
        users = r.recovery["users"]
        out.append(
            (
                f"restore {users:,} users from the changelog",
                f"{ready - empty:,.1f} s",
                f"start → ready {ready:,.1f} s; empty changelog {empty:,.1f} s",
                "",
                "",
            )
        )
        disk = _median(r.restores, "table_bytes")
        out.append(
            (
                "state on disk per user (RocksDB table dirs, du)",
                f"{disk / users:,.0f} B",
                f"changelog on the broker {r.recovery['changelog_bytes'] / users:,.0f} B",
                "",
                "",
            )
        )
    rss = []
    if r.pipeline:
        rss.append(f"peak {_mib(_median(r.pipeline, 'peak_rss'))} draining")
    if r.scaled:
        rss.append(
            f"peaks {_mib(_median(r.scaled, 'peak_rss'))} summed over the "
            f"`--processes {r.params.processes}` processes draining"
        )
    if r.latency:
        rss.append(f"peak {_mib(_median(r.latency, 'peak_rss'))} at the latency load")
    if r.restores:
        rss.append(
            f"{_mib(_median(r.restores, 'rss'))} after restoring {r.recovery['users']:,} users"
        )
    if rss:
        out.append(("worker RSS", "; ".join(rss), f"broker {_mib(r.broker_rss)}", "", ""))
    return out


def section(r: Results, command: str) -> str:
    """The Markdown section for BENCHMARKS.md."""
    p = r.params
    now = datetime.now().astimezone()
    loads = "; ".join(f"{when} {load[0]:.2f}" for when, load in r.loads)
    took = ", ".join(f"{phase} {seconds:,.0f} s" for phase, seconds in r.durations.items())
    table = [
        "| measure | worker | same-run baseline | ratio | target |",
        "|---|---:|---|---:|---|",
        *(f"| {' | '.join(row)} |" for row in rows(r)),
    ]
    lines = [
        BEGIN,
        f"### End to end (`{command}`, {now:%Y-%m-%d %H:%M %Z})",
        "",
        f"Machine: {machine()}. The broker, the worker, the load generator and the bench's "
        "consumer all share these cores.",
        f"Load average (1 min) at each phase: {loads}. Time taken: {took}.",
        *r.notes,
        r.machine_load(),
        f"Broker: Kafka {_kafka_version()} single node started by the bench "
        "(`infra.broker.start_broker`, free ports, temp dir; heap 512 MiB).",
        "Worker: `python -m streams.cli worker --config examples/oracular.yaml`, one process, "
        f"ORACULAR_PARTITIONS={PARTITIONS}, at-least-once, RocksDB, a new app id, topic prefix "
        "and datadir per run, other settings default (batches: `streams/settings.py`)"
        + (
            "; with " + ", ".join(f"{k}={v}" for k, v in p.worker_env.items())
            if p.worker_env
            else ""
        )
        + (f"; run from the checkout {p.worker_root}" if p.worker_root != ROOT else "")
        + (
            f"; in the throughput phase also as `oracular worker --processes {p.processes}`"
            if r.scaled
            else ""
        )
        + f". Code: {code_version(p.worker_root)}.",
        "",
        *table,
        "",
    ]
    if r.pipeline:
        e = r.expected
        lines += [
            f"**Throughput** ({p.runs} runs each, alternating; medians above). Input: "
            f"{p.events:,} msgpack events over {p.users:,} users (`bench/synthetic.py` "
            "`clickstream`, seed 7), keyed by user, produced before any worker starts "
            f"({r.preload_s:.1f} s). Expected outputs (`engine.replay`): "
            f"{e['predictions']:,} predictions and {e['episodes']:,} episodes. "
            f"Pipeline events/s: {_list(r.pipeline, 'rate')}; up to the last prediction, "
            f"before the timer's final episode closes: {_list(r.pipeline, 'rate_pred')}; "
            f"drain (first to last output) {_list(r.pipeline, 'seconds_all', '{:.1f}')} s; "
            "runs ended by: "
            f"{', '.join(row['ended_by'] for row in r.pipeline)}. "
            f"The worker's own count of applied events: "
            f"{', '.join(str(row['applied']) for row in r.pipeline)}; output counts: "
            + "; ".join(
                ", ".join(f"{n:,} {role}" for role, n in sorted(row["counts"].items()))
                for row in r.pipeline
            )
            + ". "
            f"Passthrough events/s: {_list(r.passthrough, 'rate')}. Worker start to ready: "
            f"{_list(r.pipeline, 'startup', '{:.1f}')} s. Broker CPU while the worker drains: "
            f"{_median(r.pipeline, 'broker_cpu'):.0%} of a core.",
            "",
        ]
    lines += scale_out_text(r) + peers_text(r)
    if r.latency:
        lines += [
            f"**Latency** ({p.latency_runs} runs each, alternating; medians above): "
            f"{r.latency_rate:,.0f} events/s "
            + ("(given)" if p.latency_rate is not None else "(half the pipeline throughput)")
            + f" for "
            f"{p.latency_seconds:.0f} s, live timestamps, {p.users:,} users; the first "
            f"{p.latency_warmup_s:.0f} s are warm-up. Per run p50 / p99 / max, pipeline: "
            + "; ".join(
                f"{_ms(row['p50'])} / {_ms(row['p99'])} / {_ms(row['max'])}" for row in r.latency
            )
            + " over "
            + _list(r.latency, "with_output")
            + " events with a prediction; passthrough: "
            + "; ".join(
                f"{_ms(row['p50'])} / {_ms(row['p99'])} / {_ms(row['max'])}"
                for row in r.latency_base
            )
            + ".",
            "",
        ]
    if r.restores:
        rec = r.recovery
        lines += [
            f"**Recovery** ({p.recovery_runs} runs each, alternating; medians above). A worker "
            f"drained {rec['events']:,} events of {rec['users']:,} users "
            f"({p.recovery_events_per_user} adjacent events each, at "
            f"{rec['writer_rate']:,.0f} events/s) and wrote {rec['changelog_records']:,} "
            "changelog records; lateness ten years, so every episode stays open and nothing "
            'changes the changelog between restores. Start → "Worker ready" (log time): '
            f"restore {_list(r.restores, 'ready_s', '{:.1f}')} s; empty changelog "
            f"{_list(r.empties, 'ready_s', '{:.1f}')} s. RocksDB bytes after a restore: "
            f"{_list(r.restores, 'table_bytes')} (the writer's own: "
            f"{rec['writer_table_bytes']:,}). Users in the rebuilt deadline index: "
            f"{_list(r.restores, 'open_users')}.",
            "",
        ]
    lines += [
        "How it is measured: `bench/e2e.py` (module docstring). Throughput: input events over "
        "the time from the first output record to the last (the records' own timestamps); the "
        "last is known when the output counts reach `engine.replay`'s (or after "
        f"{IDLE_S:.0f} s without output, then noted above). Latency: produce time (wall clock "
        "just before the send) to the prediction's arrival at the bench's consumer, matched by "
        "prediction id `<user>:<event id>`, only events that produce a prediction.",
        END,
    ]
    return "\n".join(lines)


def _per_cpu(runs: Sequence[Mapping[str, Any]]) -> str:
    """Median over `runs` of events per CPU-second of the measured process(es)."""
    values = [
        row["rate"] / row["cpu"]
        for row in runs
        if row.get("rate") and row.get("cpu") and not math.isnan(row["cpu"])
    ]
    return f"{statistics.median(values):,.0f}" if values else "n/a"


def scale_out_text(r: Results) -> list[str]:
    """The scale-out paragraph."""
    if not r.scaled:
        return []
    n, one, many = r.params.processes, _median(r.pipeline, "rate"), _median(r.scaled, "rate")
    return [
        f"**Scale-out** (in the same alternation, {len(r.scaled)} runs; medians above). "
        f"`oracular worker --processes {n}`: one new app id per run (the same scheme as the "
        f"one-process runs), {n} processes splitting the {PARTITIONS} input partitions "
        "(`streams/processes.py`; datadirs `<datadir>/p<i>`). Events/s: "
        f"{_list(r.scaled, 'rate')} against one process's {_list(r.pipeline, 'rate')}: "
        f"{many / one:.2f}× the one-process rate. Events applied per process: "
        f"{', '.join(row['applied_by_process'] for row in r.scaled)}. The last process was "
        f"ready {_list(r.scaled, 'ready_spread', '{:.1f}')} s after the first, and the first "
        f"output came {_list(r.scaled, 'first_output_after_ready', '{:+.1f}')} s after the "
        "last was ready (negative: the first process was already draining, so the second's "
        "join, a rebalance, is inside the timed span; events/s estimated from the share of "
        "predictions stamped after the last process was ready: "
        f"{_list(r.scaled, 'rate_settled')}). Runs ended by: "
        f"{', '.join(row['ended_by'] for row in r.scaled)}. CPU of all the worker's processes "
        f"while draining: {_median(r.scaled, 'cpu'):.0%} of a core (one process: "
        f"{_median(r.pipeline, 'cpu'):.0%}), {_per_cpu(r.scaled)} events per CPU-second (one "
        f"process: {_per_cpu(r.pipeline)}); the broker's: {_median(r.scaled, 'broker_cpu'):.0%} "
        f"(with one process: {_median(r.pipeline, 'broker_cpu'):.0%}). This machine has "
        f"{os.cpu_count()} cores, and the worker's processes share them with the broker (which "
        "receives every output and changelog record and serves every fetch), the bench's "
        "collector consuming the outputs, and the producer clients inside each process: "
        f"{n} processes cannot get {n} whole cores here, so the ratio is a floor for a machine "
        "with a core per process and the broker elsewhere.",
        "",
    ]


def peers_text(r: Results) -> list[str]:
    """The peers paragraph."""
    if not r.params.peers or not r.pipeline:
        return []
    worker = _median(r.pipeline, "rate")
    parts = [
        f"**Peers** (in the same alternation, on the same input topic; medians above). Each "
        "peer (`bench/peers/`) is a per-user counter written the way its framework's documentation "
        "teaches, in its own process, consumer group and state directory. Per event it decodes "
        "the msgpack value, reads the user's `[count, last event time]` from its RocksDB "
        "state, writes it back (the framework's changelog topic records it), and sends one "
        f"msgpack output keyed by the user: {r.input_count:,} outputs per run, timed like the "
        "passthrough (first to last output record timestamp). The worker does far more per "
        "event: it decodes and checks the event, runs the engine on the user's decoded state "
        "(`apply_event`: the episode's signals, the predictions that change), publishes "
        "predictions and closed episodes (the timer's closes included; about 0.58 outputs per "
        "event here), keeps the deadline index, and sends a changelog record per user per "
        "batch, awaited before the input offsets are committed. The worker: "
        f"{worker:,.0f} events/s, {_per_cpu(r.pipeline)} per CPU-second of its process. Events "
        "per CPU-second (each run's rate over its CPU share, median) compare the code's cost "
        "on a busy machine better than events/s, which also depend on the cores it got."
    ]
    for peer in r.params.peers:
        label = PEERS[peer][1] if peer in PEERS else peer
        version = r.peer_versions.get(peer, "version unknown")
        ok = _peer_ok(r, peer)
        what = {
            "faust": f"{label} (faust-streaming {version}, `bench/peers/faust_agent.py`: "
            '`app.Table(..., store="rocksdb://")` with JSON values, `async for value in '
            "stream`, `table[user] = [count, ts]` (a changelog record per write, so per "
            "event), one `await topic.send(...)` per event, at-least-once, none of the "
            "product's patches or batching)",
            "quix": f"{label} ({version}, `bench/peers/quix_app.py`: confluent-kafka/"
            "librdkafka client, `sdf.update(..., stateful=True)` on RocksDB state, "
            "`sdf.to_topic(...)`; at-least-once with a checkpoint every 5 s that flushes the "
            "outputs and writes one changelog record per changed user; output timestamps set "
            "to the wall clock at processing)",
        }.get(peer, label)
        if ok:
            rate = _median(ok, "rate")
            text = (
                f"{what}: events/s {_list(ok, 'rate')}; CPU {_median(ok, 'cpu'):.0%} of a "
                f"core, {_per_cpu(ok)} events per CPU-second; peak RSS "
                f"{_mib(_median(ok, 'peak_rss'))}; runs ended by "
                f"{', '.join(row['ended_by'] for row in ok)}; {rate / worker:.1f}× the "
                f"worker's rate (worker/peer {worker / rate:.2f})"
            )
            if peer in r.peer_unavailable:
                text += f"; then {r.peer_unavailable[peer]}"
        else:
            text = f"{what}: not measured: {r.peer_unavailable.get(peer, 'not run')}"
        parts.append(f"- {text}.")
    return [parts[0], "", *parts[1:], ""]


def print_table(r: Results) -> None:
    """The summary table on stdout."""
    header = ("measure", "worker", "same-run baseline", "ratio", "target")
    table = [header, *rows(r)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * width for width in widths))
