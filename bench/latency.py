"""Phase 2, latency: produce → prediction at a steady offered load, against the passthrough.

See bench/e2e.py (module docstring, item 2) for what is measured and how.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Mapping
from typing import Any

import msgpack

from bench.collect import collect
from bench.session import Session, say
from bench.topics import create_topics
from bench.workers import STOP_TIMEOUT_S, Worker
from infra.processes import LoggedProcess, peak_rss_bytes


async def measure(bench: Session) -> None:
    """Pipeline and passthrough latency at half the measured pipeline throughput."""
    p, r = bench.params, bench.results
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
        r.latency_base.append(await latency_run(bench, "passthrough", rate, run))
        say(f"latency passthrough {run + 1}: {fmt_latency(r.latency_base[-1])}")
        r.latency.append(await latency_run(bench, "pipeline", rate, run))
        say(f"latency pipeline {run + 1}: {fmt_latency(r.latency[-1])}")


async def latency_run(bench: Session, kind: str, rate: float, run: int) -> dict[str, Any]:
    p = bench.params
    name = bench.name(f"latency-{kind}")
    worker: Worker | None = None
    passthrough: LoggedProcess | None = None
    if kind == "pipeline":
        worker = bench.worker(name)
        topics = worker.topics
        source, dest = topics.events.name, topics.predictions.name
        await create_topics(bench.bootstrap, [spec.name for spec in topics])
        worker.start()
        await worker.ready()
    else:
        source, dest = f"{name}.in", f"{name}.out"
        await create_topics(bench.bootstrap, [source, dest])
        passthrough = bench.helper(
            "bench.passthrough",
            name,
            source=source,
            dest=dest,
            count=int(rate * p.latency_seconds),
            idle_exit=10,
        ).start()
        await asyncio.sleep(2.0)  # its consumer has its assignment before the first send
    sent_path = bench.workdir / f"{name}.sent"
    loadgen = bench.helper(
        "bench.loadgen",
        f"{name}-loadgen",
        topic=source,
        rate=f"{rate:.1f}",
        seconds=p.latency_seconds,
        users=p.users,
        seed=100 + run,
        id_prefix=f"L{run}-",
        config=bench.config_path,
        out=sent_path,
        stream=bench.stream,
    )
    started = asyncio.Event()
    collector = asyncio.create_task(
        collect(
            bench.bootstrap,
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
        await loadgen.wait_exit_async(STOP_TIMEOUT_S)
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
    series = []  # (produce time, latency, the output's send time) per event, for inspection
    legs: list[float] = []  # produce -> the output's send by the worker (its record timestamp)
    for arrival, value, output_sent in outputs.values:
        key = _output_key(value) if kind == "pipeline" else _forwarded_key(value)
        at = sent.get(key)
        if at is not None:
            series.append((at, arrival - at, output_sent))
            if at >= warm_from:
                latencies.append(arrival - at)
                legs.append(output_sent - at)
    sent_path.with_suffix(".latency").write_bytes(msgpack.packb(sorted(series)))
    measured = sum(1 for t in sent.values() if t >= warm_from)
    leg = _percentiles(legs) if legs else None  # where the time goes: the worker's own part
    return {
        **_percentiles(latencies),
        "to_output_p50": leg["p50"] if leg else None,
        "to_output_p99": leg["p99"] if leg else None,
        "sent": len(sent),
        "measured_events": measured,
        "with_output": len(latencies),
        "peak_rss": peak,
    }


def _output_key(value: bytes) -> str:
    """A prediction's id."""
    return str(msgpack.unpackb(value, raw=False)["id"])


def _forwarded_key(value: bytes) -> str:
    """`<user>:<id>` of an input the passthrough forwarded (msgpack, or Segment JSON)."""
    if value[:1] == b"{":
        message = json.loads(value)
        return f"{message.get('userId') or message.get('anonymousId')}:{message['messageId']}"
    message = msgpack.unpackb(value, raw=False)
    return f"{message['user']}:{message['id']}"


# --- 3. recovery ------------------------------------------------------------------------


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    return {
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
    }


def fmt_latency(row: Mapping[str, Any]) -> str:
    return (
        f"p50 {row['p50'] * 1000:.1f} ms, p99 {row['p99'] * 1000:.1f} ms, "
        f"max {row['max'] * 1000:.1f} ms over {row['with_output']:,} events"
        + (
            f" (p50 produce -> output sent {row['to_output_p50'] * 1000:.1f} ms)"
            if row.get("to_output_p50") is not None
            else ""
        )
    )
