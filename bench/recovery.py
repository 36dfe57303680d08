"""Phase 3, recovery: restore a changelog of many users into fresh workers; state on disk.

See bench/e2e.py (module docstring, item 3) for what is measured and how.
"""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.collect import collect
from bench.session import Session, say
from bench.synthetic import FILLER, START, event_names
from bench.throughput import expected_outputs
from bench.topics import create_topics, preload, settled_end_offsets
from bench.workers import Worker
from engine import EngineConfig, Event
from infra.broker import Broker
from infra.processes import peak_rss_bytes, rss_bytes
from streams.settings.topics import STATE_TABLE

HUGE_LATENESS_MS = 10 * 365 * 24 * 3600 * 1000
"""Ten years of lateness: no watermark reaches a deadline, so every episode stays open."""
REBUILT_LINE = "deadline index rebuilt"


def every_user(config: EngineConfig, users: int, per_user: int, seed: int = 5) -> list[Event]:
    """`per_user` consecutive events for each of `users` users (signals 70%, filler 30%).

    A user's events are adjacent in the stream, so one batch usually holds them all and the
    worker writes one changelog record per user. All events fall within 20 minutes (under the
    example config's 30-minute episode timeout), so no event time closes an episode either.
    """
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


async def measure(bench: Session) -> None:
    """Build a changelog of `recovery_users` users, then time restores against a baseline."""
    p, r = bench.params, bench.results
    r.load("recovery")
    events = every_user(bench.config, p.recovery_users, p.recovery_events_per_user)
    expected = expected_outputs(bench.config, events)
    writer = bench.worker(bench.name("recovery"), lateness_ms=str(HUGE_LATENESS_MS))
    topics = writer.topics
    empty_input = f"{writer.prefix}.events-empty"
    await create_topics(bench.bootstrap, [spec.name for spec in topics] + [empty_input])
    preload_s = await preload(bench.bootstrap, topics.events.name, events)
    say(f"recovery: preloaded {len(events):,} events of {p.recovery_users:,} users")
    del events
    # Every episode stays open (ten years of lateness), so nothing closes: only predictions.
    roles = {"predictions": topics.predictions.name}
    started = asyncio.Event()
    collector = asyncio.create_task(
        collect(
            bench.bootstrap,
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
        records = await settled_end_offsets(bench.bootstrap, changelog, p.recovery_users)
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
        "changelog_bytes": broker_topic_bytes(bench.broker, changelog),
        "writer_table_bytes": table_bytes(writer.datadir),
    }
    say(f"recovery: changelog {records:,} records; restoring {p.recovery_runs} times")
    for run in range(p.recovery_runs):
        empty = bench.worker(
            bench.name("empty"),
            prefix=writer.prefix,
            topic_events=empty_input,
            lateness_ms=str(HUGE_LATENESS_MS),
        )
        r.empties.append(await time_ready(empty))
        restore = bench.worker(
            bench.name("restore"),
            app_id=writer.app_id,
            prefix=writer.prefix,
            lateness_ms=str(HUGE_LATENESS_MS),
        )
        r.restores.append(await time_ready(restore))
        say(
            f"recovery {run + 1}/{p.recovery_runs}: ready after "
            f"{r.restores[-1]['ready_s']:.1f} s; empty changelog "
            f"{r.empties[-1]['ready_s']:.1f} s"
        )


async def time_ready(worker: Worker) -> dict[str, Any]:
    """Start `worker`, wait for "Worker ready", stop it; its times, memory, table size."""
    worker.start()
    try:
        ready = await worker.ready()
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


def du_bytes(paths: Sequence[Path]) -> int:
    """Bytes on disk of `paths` together (du)."""
    if not paths:
        return 0
    out = subprocess.run(
        ["du", "-s", "-B1", "-c", *map(str, paths)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1].split()[0])


def table_bytes(datadir: Path) -> int:
    """Bytes on disk (du) of the state table's RocksDB directories under `datadir`."""
    return du_bytes([p for p in datadir.rglob(f"{STATE_TABLE}*.db") if p.is_dir()])


def broker_topic_bytes(broker: Broker, topic: str) -> int:
    """Bytes on `broker`'s disk for `topic` (all partitions; du)."""
    return du_bytes(sorted((broker.workdir / "data").glob(f"{topic}-*")))
