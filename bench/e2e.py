"""End-to-end benchmarks: the real `oracular worker` against a real local broker.

`python -m bench` runs these after the engine benchmarks (`--e2e-only`: only these). A broker
is started on free ports in a temporary directory (infra.broker.start_broker, as the tests
do) and stopped and wiped at the end; every worker is `python -m streams.cli worker --config
examples/oracular.yaml` in a subprocess with its own ORACULAR_APP_ID, ORACULAR_TOPIC_PREFIX
and ORACULAR_DATADIR (8 partitions, at-least-once, RocksDB, every other setting default).

Every stream `--stream` selects (bench/inputs.py: `synthetic`, msgpack events of
bench/synthetic.py on examples/oracular.yaml; `realistic`, the Segment JSON stream of
bench/realistic.py on bench/realistic.yaml; default both) goes through phases 1 and 2 on the
one broker, each with the workers on its own config; phase 3 runs once, in the first stream's
session. Each stream's figures are recorded in a section of their own.

1. Throughput. The stream is produced once, keyed by user, to one input topic before any
   worker starts. Each pipeline run is a fresh
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
   same way as the passthrough), and with `oracular backfill` (a fresh app id per run: it
   captures the topic's range, drains it and exits; timed on its outputs as the worker is).
   A process's CPU is sampled from its first output to the last
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

The code, by what it holds: bench/session.py (a session: broker, temp dir, names, workers),
bench/workers.py (the worker and helper processes; infra/processes.py runs them, as it runs
the integration tests' workers), bench/topics.py (topics, preloading), bench/collect.py (the
output collector), bench/throughput.py, bench/latency.py and bench/recovery.py (the phases),
bench/results.py (what was measured), bench/report.py (the table, the BENCHMARKS.md section),
bench/machine.py (the machine, the code version, other test runs). This module runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from pathlib import Path

from bench import latency, recovery, throughput
from bench.results import Results
from bench.session import Params, Session, say
from infra.broker import PRODUCTION_GROUP_SETTINGS, Broker, start_broker

PHASES = (
    ("throughput", throughput.measure),
    ("latency", latency.measure),
    ("recovery", recovery.measure),
)
"""The phases in the order they run; each fills in the session's results."""


async def run_phases(bench: Session, phases: tuple[str, ...]) -> Results:
    """Run `phases` (those selected), sampling the machine's load meanwhile."""
    results = bench.results
    monitor = asyncio.create_task(results.monitor())
    try:
        for phase, measure in PHASES:
            if phase in bench.params.phases and phase in phases:
                began = time.monotonic()
                await measure(bench)
                results.durations[phase] = time.monotonic() - began
    finally:
        monitor.cancel()
    results.broker_rss = bench.broker.rss_bytes()
    results.load("end")
    return results


async def run_streams(broker: Broker, workdir: Path, params: Params) -> list[Results]:
    """Each selected stream through throughput and latency, one session each on one broker;
    recovery once, in the first stream's session (its synthetic users and the example config
    when the synthetic stream is selected)."""
    out = []
    for n, stream in enumerate(params.streams):
        say(f"=== {stream} stream")
        phases = ("throughput", "latency") + (("recovery",) if n == 0 else ())
        out.append(await run_phases(Session(broker, workdir, params, stream), phases))
    return out


def run(params: Params) -> list[Results]:
    """Start a broker in a temp dir, run the benchmarks, stop and wipe the broker: one
    `Results` per stream."""
    # aiokafka logs the retries of a consumer that starts while new topics elect leaders
    # ("NotLeaderForPartitionError") as errors; they resolve themselves. Real failures
    # surface as the bench's own timeouts.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    workdir = Path(tempfile.mkdtemp(prefix="oracular-bench-"))
    say(f"working directory {workdir}")
    broker = start_broker(
        workdir / "kafka", port=None, stop_with_parent=True, overrides=PRODUCTION_GROUP_SETTINGS
    )
    try:
        return asyncio.run(run_streams(broker, workdir, params))
    finally:
        broker.stop(wipe=not params.keep)
        if params.keep:
            say(f"kept {workdir}")
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)
