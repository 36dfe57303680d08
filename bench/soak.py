"""`python -m bench.soak` (`make soak`): one worker for a long while at half its drain rate on
the realistic stream, its lookup API queried all along; what grows, and whether the outputs
still equal the replay.

1. A broker of its own; the realistic stream (bench/realistic.py `realistic_messages`:
   Segment JSON keyed by `userId`, each record stamped with its `sentAt`, bench/realistic.yaml),
   made as it is produced, so an hour at any rate fits in memory. The first `--preload`
   events are produced before the worker starts, and its drain rate over them sets the soak's
   rate (half of it; `--rate` instead).
2. The rest is produced at that rate for `--minutes`, while a client asks the lookup API for
   a random known user at `--lookup-rate` requests a second (open loop: a slow answer does
   not slow the asking). Every `--sample-s` it records the worker's resident memory (all its
   processes), open files, datadir size, input lag and the window's lookup p99. A lookup that
   fails is counted by its status and the reason the API gave.
3. Closing marks a day after the last event close every episode by event time; once the
   worker has committed everything, each output is compared with the offline replay of the
   same events (the stream made again from its seed, replayed with bounded memory): every id
   the replay publishes is there, no other, every copy equal. The worker's outputs are held
   on disk as one digest per id, so the comparison's memory does not grow with the hour.

It prints each quantity's least-squares slope per hour (over the samples after the first
tenth: the start-up's growth is not a leak) and exits 1 when an output differs or the worker
stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from rocksdict import Options, Rdict

from bench.inputs import DAY_MS, KEEP_INPUT, Record, config_path, segment_record
from bench.lookup import API_LINE
from bench.realistic import realistic_messages
from bench.synthetic import closing_marks
from bench.topics import create_topics
from bench.workers import PARTITIONS, Worker
from engine import EngineConfig
from infra.broker import start_broker
from infra.processes import process_tree, tree_rss_bytes
from schemas.config import load_config
from schemas.events import IgnoredMessage, decode_event, encode_event
from schemas.outputs import decode_output
from streams.settings import default
from streams.tools.replay import OfflineRun

LAG = re.compile(r"^oracular_partition_lag\{partition=\"\d+\"\} (\S+)$", re.MULTILINE)
USERS = 40_000
READY_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 1_800.0
PROGRESS_EVERY = 1_000_000
"""Records between progress lines of the comparison."""


def say(message: str) -> None:
    print(f"[soak] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


@dataclass
class Sample:
    at_s: float
    rss_mib: float
    open_files: int
    datadir_mib: float
    lag: float
    lookup_p99_ms: float | None


@dataclass
class Lookups:
    latencies_ms: list[float] = field(default_factory=list)
    answered: int = 0
    failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def take_p99(self) -> float | None:
        window, self.latencies_ms = sorted(self.latencies_ms), []
        return window[int(0.99 * (len(window) - 1))] if window else None


def slope_per_hour(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (seconds), per hour."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return 3600 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def open_files(pid: int) -> int:
    total = 0
    for p in process_tree(pid):
        try:
            total += len(list(Path(f"/proc/{p}/fd").iterdir()))
        except OSError:
            continue
    return total


def du_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


async def produce(
    bootstrap: str, topic: str, records: Iterable[Record], rate: float | None
) -> tuple[int, Record | None]:
    """Produce `records` in order, paced at `rate` a second (None: as fast as acknowledged);
    how many, and the last."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    n, last = 0, None
    try:
        started = time.monotonic()
        pending = []
        for n, last in enumerate(records, 1):
            if rate is not None and n % 100 == 0:
                ahead = n / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            pending.append(
                await producer.send(topic, last.value, key=last.key, timestamp_ms=last.timestamp_ms)
            )
            if len(pending) >= 5_000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return n, last


def soak_records(config: EngineConfig, users: int) -> Iterator[Record]:
    """The soak's input records, without an end (the same every time)."""
    return (segment_record(raw) for raw in realistic_messages(config, users))


def marks_after(last: Record) -> list[Record]:
    """Closing marks a day after `last` (its event time is its `sentAt`'s, as the worker reads
    it: the record is stamped `sentAt`, so the clock-skew correction is nil)."""
    message = json.loads(last.value)
    at = int(datetime.fromisoformat(message["timestamp"].replace("Z", "+00:00")).timestamp() * 1000)
    return [
        Record(m.user.encode(), encode_event(m), m.at)
        for m in closing_marks(at + DAY_MS, PARTITIONS)
    ]


async def lag(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as response:
        return sum(float(v) for v in LAG.findall(await response.text()))


async def ask(
    http: aiohttp.ClientSession,
    url: str,
    users: list[str],
    *,
    rate: float,
    stop: asyncio.Event,
    out: Lookups,
) -> None:
    """Open-loop lookups at `rate` a second until `stop`."""
    rng = random.Random(5)
    tasks: set[asyncio.Task[None]] = set()

    async def one(user: str) -> None:
        started = time.perf_counter()
        try:
            async with http.get(f"{url}/v1/users/{user}") as response:
                body = await response.read()
                status = response.status
        except Exception as exc:  # counted, the soak goes on
            out.failed[type(exc).__name__] += 1
            return
        if status == 200:
            out.answered += 1
            out.latencies_ms.append((time.perf_counter() - started) * 1000)
        else:
            out.failed[f"{status} {_reason(body)}"] += 1

    started = time.monotonic()
    n = 0
    while not stop.is_set():
        n += 1
        ahead = n / rate - (time.monotonic() - started)
        if ahead > 0:
            await asyncio.sleep(ahead)
        task = asyncio.create_task(one(rng.choice(users)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)


def _reason(body: bytes) -> str:
    """A failed lookup's reason: the API's `error` (its first 80 characters)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    return str(error or body[:80])[:80]


def digest(message: dict[str, Any]) -> bytes:
    """An output message's digest: equal messages, equal digests."""
    text = json.dumps(message, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class Published:
    """The worker's outputs, held on disk as one digest per id, checked against the replay's
    one at a time: `add` every published record, then `check` every replay output, then
    `extra` lists the ids the replay did not publish."""

    def __init__(self, path: Path) -> None:
        self.db = Rdict(str(path), Options(raw_mode=True))
        self.records = 0
        self.ids = 0
        self.expected = 0
        self.problems: list[str] = []
        self.count = 0

    def add(self, message: dict[str, Any]) -> None:
        self.records += 1
        key, value = str(message["id"]).encode(), digest(message)
        held = self.db.get(key)
        if held is None:
            self.db[key] = value
            self.ids += 1
        elif held != value:
            self._problem(f"{message['id']}: two different copies published")

    def check(self, message: dict[str, Any]) -> None:
        self.expected += 1
        key = str(message["id"]).encode()
        held = self.db.get(key)
        if held is None:
            self._problem(f"{message['id']}: missing (the replay publishes {message})")
        elif held != digest(message):
            self._problem(f"{message['id']}: differs from the replay's {message}")
        if held is not None:
            del self.db[key]

    def extra(self) -> None:
        """The ids left once every replay output was checked: published, not in the replay."""
        for key in self.db.keys():  # noqa: SIM118 - an Rdict: keys() is its key iterator
            self._problem(f"{key!r}: not in the replay")

    def close(self) -> None:
        self.db.close()

    def _problem(self, text: str) -> None:
        self.count += 1
        if len(self.problems) < 20:
            self.problems.append(text)


async def read_outputs(bootstrap: str, topics: list[str], published: Published) -> None:
    """Every record of `topics`, from their beginnings to their ends now, into `published`."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for batch in (await consumer.getmany(timeout_ms=1000, max_records=10_000)).values():
                for record in batch:
                    published.add(decode_output(record.value))
                    if published.records % PROGRESS_EVERY == 0:
                        say(f"read {published.records:,} of {sum(ends.values()):,} outputs")
    finally:
        await consumer.stop()


def check_replay(
    config: EngineConfig,
    records: Iterable[Record],
    until: int,
    published: Published,
) -> None:
    """Replay the events of `records` offline and check each output against `published`."""
    run = OfflineRun(config)
    try:
        index = 0
        for n, record in enumerate(records, 1):
            try:
                event = decode_event(record.value, fallback_ts=record.timestamp_ms)
            except IgnoredMessage:
                continue
            for output in run.feed_event(index, event):
                published.check(output.message)
            index += 1
            if n % PROGRESS_EVERY == 0:
                say(f"replayed {n:,} records")
        for chunk in run.finish_chunks(until):
            for output in chunk:
                published.check(output.message)
    finally:
        run.close()
    published.extra()


async def committed_all(bootstrap: str, group: str, topic: str, timeout_s: float) -> None:
    """Wait until `group` has committed `topic` to its end: every input applied and acked."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await admin.start()
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while True:
            done = await admin.list_consumer_group_offsets(group)
            behind = {tp.partition: ends[tp] - (done[tp].offset if tp in done else 0) for tp in tps}
            if all(n <= 0 for n in behind.values()):
                return
            if time.monotonic() > deadline:
                msg = f"not committed to the end within {timeout_s:.0f} s: behind {behind}"
                raise RuntimeError(msg)
            await asyncio.sleep(1.0)
    finally:
        await consumer.stop()
        await admin.close()


async def main_async(args: argparse.Namespace) -> int:  # noqa: PLR0915 - one script
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="oracular-soak-"))
    say(f"working in {workdir}")
    broker = await asyncio.to_thread(
        start_broker, workdir / "kafka", port=None, stop_with_parent=True
    )
    worker: Worker | None = None
    try:
        config = load_config(config_path("realistic"))
        stream = soak_records(config, args.users)
        worker = Worker(
            "soak",
            bootstrap=broker.bootstrap,
            app_id="soak",
            prefix="soak",
            datadir=workdir / "state",
            log_path=workdir / "worker.log",
            config=config_path("realistic"),
            settings={"ORACULAR_API_PORT": "0"},
        )
        topics = worker.topics
        await create_topics(broker.bootstrap, [topics.events.name], KEEP_INPUT)
        await create_topics(broker.bootstrap, [t.name for t in topics if t != topics.events])
        say(f"producing {args.preload:,} records of {args.users:,} users to preload")
        preload = list(itertools.islice(stream, args.preload))
        await produce(broker.bootstrap, topics.events.name, preload, None)
        users = sorted({r.key.decode() for r in preload})
        del preload
        worker.start()
        await worker.ready(timeout_s=READY_TIMEOUT_S)
        await worker.wait_line_async("advertised to other workers as", READY_TIMEOUT_S)
        url = API_LINE.findall(worker.log_text())[-1]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            started = time.monotonic()
            await committed_all(broker.bootstrap, "soak", topics.events.name, DRAIN_TIMEOUT_S)
            drain = args.preload / (time.monotonic() - started)
            rate = args.rate or drain / 2
            wanted = int(rate * args.minutes * 60)
            say(
                f"drain rate {drain:,.0f} messages/s ({args.preload:,} preloaded, from ready "
                f"to committed); soak at {rate:,.0f}/s for {args.minutes:g} min "
                f"({wanted:,} records), lookups at {args.lookup_rate:g}/s"
            )
            stop = asyncio.Event()
            out = Lookups()
            asking = asyncio.create_task(
                ask(http, url, users, rate=args.lookup_rate, stop=stop, out=out)
            )
            producing = asyncio.create_task(
                produce(
                    broker.bootstrap, topics.events.name, itertools.islice(stream, wanted), rate
                )
            )
            samples: list[Sample] = []
            soak_start = time.monotonic()
            while not producing.done() and worker.running:
                await asyncio.wait({producing}, timeout=args.sample_s)
                if not worker.running:
                    break
                sample = Sample(
                    time.monotonic() - soak_start,
                    (tree_rss_bytes(worker.pid) or 0) / 2**20,
                    open_files(worker.pid),
                    du_mib(workdir / "state"),
                    await lag(http, url),
                    out.take_p99(),
                )
                samples.append(sample)
                say(
                    f"{sample.at_s:6.0f} s  rss {sample.rss_mib:7.1f} MiB  files "
                    f"{sample.open_files:4d}  datadir {sample.datadir_mib:7.1f} MiB  lag "
                    f"{sample.lag:8.0f}  lookup p99 {sample.lookup_p99_ms or float('nan'):6.2f} ms"
                )
            stop.set()
            if not producing.done():
                producing.cancel()
            results = await asyncio.gather(producing, asking, return_exceptions=True)
        ok = worker.running
        if not ok:
            say(f"the worker stopped during the soak: {worker.log_tail(20)}")
            return 1
        produced, asked = results
        for result in (produced, asked):
            if isinstance(result, BaseException):
                raise result
        assert not isinstance(produced, BaseException)
        sent, last = produced
        assert last is not None
        rate = sent / (time.monotonic() - soak_start)  # what it reached
        marks = marks_after(last)
        await produce(broker.bootstrap, topics.events.name, marks, None)
        say("waiting for the worker to commit everything")
        await committed_all(broker.bootstrap, "soak", topics.events.name, DRAIN_TIMEOUT_S)
        ok = worker.stop() == 0
        say("comparing every output with the replay: reading the outputs")
        published = Published(workdir / "outputs.db")
        try:
            await read_outputs(
                broker.bootstrap, [topics.predictions.name, topics.episodes.name], published
            )
            say("replaying the same records offline")
            records = itertools.chain(
                itertools.islice(soak_records(config, args.users), args.preload + sent), marks
            )
            until = marks[-1].timestamp_ms or 0
            until -= default("lateness_ms")  # the marks' watermark
            await asyncio.to_thread(check_replay, config, records, until, published)
        finally:
            published.close()
        report(samples, out, published=published, rate=rate, args=args)
        return 0 if ok and not published.count else 1
    finally:
        if worker is not None and worker.running:
            worker.kill()
        await asyncio.to_thread(broker.stop, wipe=not args.keep)
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def report(
    samples: list[Sample],
    out: Lookups,
    *,
    published: Published,
    rate: float,
    args: argparse.Namespace,
) -> None:
    """The slopes table and the verdict on stdout; the samples as JSON on stderr."""
    kept = samples[len(samples) // 10 :]
    xs = [s.at_s for s in kept]
    rows = {
        "RSS (MiB)": [s.rss_mib for s in kept],
        "open files": [float(s.open_files) for s in kept],
        "datadir (MiB)": [s.datadir_mib for s in kept],
        "lag (messages)": [s.lag for s in kept],
    }
    p99 = [(s.at_s, s.lookup_p99_ms) for s in kept if s.lookup_p99_ms is not None]
    failed = dict(out.failed) or "none"
    print(
        f"soak: {args.minutes:g} min at {rate:,.0f} events/s, lookups at {args.lookup_rate:g}/s "
        f"({out.answered:,} answered, failed {failed}); {len(samples)} samples"
    )
    print("| quantity | first | last | slope per hour |")
    print("|---|---|---|---|")
    for name, ys in rows.items():
        if ys:
            print(f"| {name} | {ys[0]:,.1f} | {ys[-1]:,.1f} | {slope_per_hour(xs, ys):+,.2f} |")
    if p99:
        slope = slope_per_hour([a for a, _ in p99], [b for _, b in p99])
        print(f"| lookup p99 (ms) | {p99[0][1]:.2f} | {p99[-1][1]:.2f} | {slope:+.3f} |")
    verdict = "equal" if not published.count else f"{published.count:,} DIFFERENCES"
    print(
        f"outputs: {published.records:,} records, {published.ids:,} ids; "
        f"{published.expected:,} in the replay: {verdict}"
    )
    for line in published.problems[:10]:
        print(f"  {line}")
    print(json.dumps({"samples": [s.__dict__ for s in samples]}), file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=(__doc__ or "").split("\n\n")[0]
    )
    add = parser.add_argument
    add("--minutes", type=float, default=60.0)
    add("--rate", type=float, default=None, help="events/s (default: half the drain rate)")
    add("--lookup-rate", type=float, default=50.0)
    add("--users", type=int, default=USERS)
    add("--preload", type=int, default=200_000, help="events to measure the drain rate on")
    add("--sample-s", type=float, default=30.0)
    add("--workdir", default=None, help="keep everything here (default: a temp dir)")
    add("--keep", action="store_true", help="keep the broker's data and the worker's log")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
