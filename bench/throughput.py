"""Phase 1, throughput: workers, the passthrough and the peers drain one preloaded topic.

See bench/e2e.py (module docstring, item 1) for what is measured and how.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bench.collect import FIRST_OUTPUT_TIMEOUT_S, Outputs, collect, outputs_of
from bench.inputs import build
from bench.session import Session, say
from bench.topics import create_topics, preload_records
from bench.workers import PARTITIONS, STOP_TIMEOUT_S
from engine import EngineConfig, Event, replay
from infra.processes import cpu_seconds, tree_cpu_seconds, tree_peak_rss_bytes, tree_rss_bytes

DAY_MS = 24 * 3600 * 1000
DEFAULT_LATENESS_MS = 120_000  # the worker's default ORACULAR_LATENESS_MS


PEERS = {
    "faust": ("bench.peers.faust_agent", "Faust agent", "faust-streaming"),
    "quix": ("bench.peers.quix_app", "Quix Streams", "quixstreams"),
    "floor": ("bench.peers.engine_floor", "aiokafka + decoder + engine (a floor)", "aiokafka"),
}
"""Peer name -> (module, label, distribution)."""


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


async def measure(bench: Session) -> None:
    """Alternate passthrough and pipeline runs over one preloaded input topic."""
    p, r = bench.params, bench.results
    source = bench.name("input")
    prepared = build(bench.stream, p.events, p.users, PARTITIONS, bench.config)
    r.input_describe = prepared.describe
    say(
        f"{bench.stream} stream: expected outputs of {len(prepared.events):,} events over "
        f"{p.users:,} users (engine.replay)"
    )
    r.expected = expected_outputs(bench.config, prepared.events)
    await create_topics(bench.bootstrap, [source], prepared.topic_config)
    r.preload_s = await preload_records(bench.bootstrap, source, prepared.records)
    r.input_count = len(prepared.records)
    say(f"preloaded {r.input_count:,} records to {source} in {r.preload_s:.1f} s; {r.expected}")
    count = len(prepared.events)
    del prepared
    peers = available_peers(bench)
    for run in range(p.runs):
        r.load(f"throughput run {run + 1}")
        r.passthrough.append(await passthrough_run(bench, source, r.input_count, count))
        say(f"passthrough {run + 1}/{p.runs}: {r.passthrough[-1]['rate']:,.0f} events/s")
        r.pipeline.append(await pipeline_run(bench, source, count, r.expected))
        row = r.pipeline[-1]
        say(
            f"pipeline {run + 1}/{p.runs}: {row['rate']:,.0f} events/s "
            f"(to the last prediction {row['rate_pred']:,.0f}/s; {row['ended_by']}; "
            f"CPU {row['cpu']:.0%} of a core; peak RSS {row['peak_rss'] / 2**20:.0f} MiB)"
        )
        if p.processes > 1:
            r.scaled.append(
                await pipeline_run(bench, source, count, r.expected, processes=p.processes)
            )
            row = r.scaled[-1]
            say(
                f"pipeline --processes {p.processes} {run + 1}/{p.runs}: "
                f"{row['rate']:,.0f} events/s ({row['ended_by']}; CPU {row['cpu']:.0%} of "
                f"a core; applied {row['applied_by_process']}; last ready "
                f"{row['ready_spread']:.1f} s after the first)"
            )
        if p.backfill:
            try:
                row = await backfill_run(bench, source, count, r.expected)
            except RuntimeError as exc:  # it exited before the expected outputs: say so, go on
                say(str(exc))
                row = failed_backfill(str(exc))
            r.backfill.append(row)
            say(
                f"oracular backfill {run + 1}/{p.runs}: "
                + (f"{row['rate']:,.0f} events/s " if "rate" in row else "")
                + f"({row['ended_by']}; its own report {row['own_rate']}; CPU {row['cpu']:.0%} "
                "of a core)"
            )
        for peer in list(peers):
            row = await peer_run(bench, peer, source, r.input_count, count)
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


def available_peers(bench: Session) -> list[str]:
    """The peers asked for that can run here (Quix Streams installed on demand)."""
    from bench.peers import ensure_quixstreams  # noqa: PLC0415

    p, r = bench.params, bench.results
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


async def peer_run(
    bench: Session, peer: str, source: str, count: int, events: int
) -> dict[str, Any]:
    """One peer drains `source` (`count` records; one output per record) to its own topic;
    its rate is in `events` (the records the worker applies: not the identify calls) per
    second, as the worker's is, so the two rates' ratio is the ratio of their drain times."""
    module, label, _ = PEERS[peer]
    name = bench.name(peer)
    dest = f"{name}.out"
    await create_topics(bench.bootstrap, [dest])
    started, first = asyncio.Event(), asyncio.Event()
    collector = asyncio.create_task(
        collect(
            bench.bootstrap,
            {"out": dest},
            expected={"out": count},
            started=started,
            first_output=first,
        )
    )
    await started.wait()
    flags: dict[str, object] = {
        "source": source,
        "dest": dest,
        "app_id": name,
        "datadir": bench.workdir / "state" / name,
    }
    if peer == "floor":  # it runs the engine: the worker's config
        flags["config"] = bench.config_path
    proc = bench.helper(module, name, **flags).start()
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
    elif not error and outputs.first_ts is not None and outputs.first_ts < proc.started_wall * 1000:
        # The rate is timed on the output records' timestamps: they must be produce times.
        error = "its output timestamps predate its start (copied from the input?)"
    if error:
        return {"error": error, "log": str(proc.log_path)}
    span = outputs.span_s()
    return {
        "rate": events / span if outputs.counts["out"] >= count else outputs.counts["out"] / span,
        "seconds": span,
        "count": outputs.counts["out"],
        "complete": outputs.complete,
        "ended_by": outputs.ended_by,
        "cpu": (cpu1 - cpu0.result()) / span if finished(cpu0) else float("nan"),
        "peak_rss": peak,
    }


async def backfill_run(
    bench: Session, source: str, count: int, expected: Mapping[str, int]
) -> dict[str, Any]:
    """`oracular backfill` (a fresh app id) drains `source` to its end and exits; timed on its
    outputs as a worker is (the episodes it closes at its end, by the wall clock, come after
    the expected counts and are not in the span)."""
    name = bench.name("backfill")
    worker = bench.worker(name, command=("backfill", "--app-id", name), topic_events=source)
    topics = worker.topics
    await create_topics(bench.bootstrap, [spec.name for spec in topics if spec.name != source])
    roles = {"predictions": topics.predictions.name, "episodes": topics.episodes.name}
    started, first = asyncio.Event(), asyncio.Event()
    collector = asyncio.create_task(
        collect(bench.bootstrap, roles, expected=expected, started=started, first_output=first)
    )
    await started.wait()
    worker.start()
    cpu0 = asyncio.create_task(cpu_at(first, worker.pid))
    try:
        outputs = await outputs_of(collector, worker)
        cpu1 = tree_cpu_seconds(worker.pid)
        code = await worker.wait_exit_async(STOP_TIMEOUT_S)
    finally:
        collector.cancel()
        cpu0.cancel()
        worker.stop()
    own = BACKFILL_OWN.search(worker.log_text())
    span = outputs.span_s()
    return {
        "rate": count / span,
        "rate_pred": count / outputs.span_s("predictions"),
        "seconds": span,
        "counts": dict(outputs.counts),
        "complete": outputs.complete,
        "ended_by": outputs.ended_by,
        "exit": code,
        "own_rate": own.group(1) + " messages/s" if own else "not found",
        "cpu": (cpu1 - cpu0.result()) / span if finished(cpu0) else float("nan"),
    }


def failed_backfill(error: str) -> dict[str, Any]:
    """The row of a backfill run that exited before its outputs reached the expected counts
    (no rate; its own summary line, with its counts, in `ended_by`)."""
    summary = BACKFILL_SUMMARY.search(error)
    return {
        "ended_by": "FAILED: exited before the expected outputs"
        + (f" (its summary: {summary.group(1)})" if summary else ""),
        "own_rate": "n/a",
        "exit": "?",
        "cpu": float("nan"),
        "error": error.splitlines()[0],
    }


BACKFILL_SUMMARY = re.compile(r"complete: (applied=\S+ .*?) in [\d.]+ s", re.MULTILINE)
"""The counts in a backfill's summary line."""

BACKFILL_OWN = re.compile(r"^backfill \S+ complete: .* \(([\d,]+) messages/s\)$", re.MULTILINE)
"""The backfill's own summary line (its rate includes Faust's start and stop)."""


async def passthrough_run(bench: Session, source: str, count: int, events: int) -> dict[str, Any]:
    """The passthrough forwards `source` (`count` records); its rate in `events` per second
    (see `peer_run`)."""
    dest = bench.name("passthrough")
    await create_topics(bench.bootstrap, [dest])
    started = asyncio.Event()
    collector = asyncio.create_task(
        collect(bench.bootstrap, {"out": dest}, expected={"out": count}, started=started)
    )
    await started.wait()
    proc = bench.helper("bench.passthrough", dest, source=source, dest=dest, count=count).start()
    try:
        outputs = await collector
        await proc.wait_exit_async(STOP_TIMEOUT_S)
    finally:
        collector.cancel()
        proc.stop()
    span = outputs.span_s()
    own = json.loads(proc.log_text().strip().splitlines()[-1])  # its own summary line
    return {
        "rate": events / span if outputs.counts["out"] >= count else outputs.counts["out"] / span,
        "seconds": span,
        "count": outputs.counts["out"],
        "ended_by": outputs.ended_by,
        "cpu": own["cpu_share"],
    }


async def pipeline_run(
    bench: Session, source: str, count: int, expected: Mapping[str, int], processes: int = 1
) -> dict[str, Any]:
    """A fresh worker (`processes` processes of one new app id) drains `source`."""
    kind = "pipeline" if processes == 1 else f"pipeline-x{processes}"
    worker = bench.worker(bench.name(kind), processes=processes, topic_events=source)
    topics = worker.topics
    await create_topics(bench.bootstrap, [spec.name for spec in topics])
    roles = {"predictions": topics.predictions.name, "episodes": topics.episodes.name}
    started, first = asyncio.Event(), asyncio.Event()
    collector = asyncio.create_task(
        collect(bench.bootstrap, roles, expected=expected, started=started, first_output=first)
    )
    await started.wait()
    broker_cpu0 = asyncio.create_task(cpu_at(first, bench.broker.pid))
    worker.start()
    cpu0 = asyncio.create_task(cpu_at(first, worker.pid))
    try:
        ready_first = await worker.ready()
        ready = await worker.ready(count=processes)
        outputs = await outputs_of(collector, worker)
        cpu1 = tree_cpu_seconds(worker.pid)
        broker_cpu1 = cpu_seconds(bench.broker.pid) or 0.0
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
