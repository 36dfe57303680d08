"""The end-to-end benchmark's report: the summary table on stdout, the Markdown section, and
writing sections into BENCHMARKS.md between their markers."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bench.collect import IDLE_S
from bench.inputs import ratio_rows
from bench.machine import code_version, kafka_version, machine
from bench.results import Results
from bench.throughput import PEERS
from bench.workers import PARTITIONS, ROOT

BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- bench:e2e:begin -->", "<!-- bench:e2e:end -->"


def markers(stream: str) -> tuple[str, str]:
    """The BEGIN/END markers of a stream's section (the synthetic stream keeps the old ones)."""
    if stream == "synthetic":
        return BEGIN, END
    return f"<!-- bench:e2e-{stream}:begin -->", f"<!-- bench:e2e-{stream}:end -->"


TARGET_RATE = 15_000  # the throughput issue's targets: one process, and p99 at half load
TARGET_RATIO = 0.5
TARGET_P99_S = 0.030


def _median(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def _mib(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value / 2**20:,.0f} MiB"


def _ms(value: float) -> str:
    return f"{value * 1000:,.1f} ms"


def _list(rows: Sequence[Mapping[str, Any]], key: str, fmt: str = "{:,.0f}") -> str:
    return " / ".join("n/a" if row.get(key) is None else fmt.format(row[key]) for row in rows)


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


def _cpu_rate(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """Median over `runs` of events per CPU-second (None when no run has its CPU)."""
    values = [
        row["rate"] / row["cpu"]
        for row in runs
        if row.get("rate") and row.get("cpu") and not math.isnan(row["cpu"])
    ]
    return statistics.median(values) if values else None


def drain_rates(r: Results) -> list[tuple[str, float | None, float | None]]:
    """(label, median events/s, median events per CPU-second) of everything that drained the
    throughput phase's input."""
    rates: list[tuple[str, float | None, float | None]] = [
        (
            "passthrough",
            _median(r.passthrough, "rate") if r.passthrough else None,
            _cpu_rate(r.passthrough),
        ),
        (
            "oracular worker",
            _median(r.pipeline, "rate") if r.pipeline else None,
            _cpu_rate(r.pipeline),
        ),
    ]
    if r.scaled:
        rates.append(
            (
                f"oracular worker --processes {r.params.processes}",
                _median(r.scaled, "rate"),
                _cpu_rate(r.scaled),
            )
        )
    done = [row for row in r.backfill if "rate" in row]
    if done:
        rates.append(("oracular backfill", _median(done, "rate"), _cpu_rate(done)))
    for peer in r.params.peers:
        ok = _peer_ok(r, peer)
        label = PEERS[peer][1] if peer in PEERS else peer
        rates.append((label, _median(ok, "rate") if ok else None, _cpu_rate(ok)))
    return rates


def ratio_table(r: Results) -> list[str]:
    """The same-run comparison: every drainer's events/s, over the passthrough's and Quix's."""
    found = ratio_rows(drain_rates(r))
    if not found:
        return []

    def show(value: float | None, fmt: str = "{:.2f}") -> str:
        return "n/a" if value is None else fmt.format(value)

    return [
        "| drains the input (median of the runs) | events/s | ÷ passthrough | ÷ Quix Streams "
        "| events per CPU-second | ÷ passthrough's |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {row.label} | {row.rate:,.0f} | {show(row.to_passthrough)} | "
            f"{show(row.to_quix)} | {show(row.per_cpu, '{:,.0f}')} | "
            f"{show(row.per_cpu_to_passthrough)} |"
            for row in found
        ),
    ]


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
        if any("rate" in row for row in r.backfill):
            rate = _median(r.backfill, "rate")
            out.append(
                (
                    "throughput, events/s (`oracular backfill`, one process)",
                    f"{rate:,.0f}",
                    f"passthrough {_median(r.passthrough, 'rate'):,.0f}",
                    f"{rate / _median(r.passthrough, 'rate'):.2f}",
                    "",
                )
            )
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
        markers(r.stream)[0],
        f"### End to end, {r.stream} stream (`{command}`, {now:%Y-%m-%d %H:%M %Z})",
        "",
        f"Machine: {machine()}. The broker, the worker, the load generator and the bench's "
        "consumer all share these cores.",
        f"Load average (1 min) at each phase: {loads}. Time taken: {took}.",
        *r.notes,
        r.machine_load(),
        f"Broker: Kafka {kafka_version()} single node started by the bench "
        "(`infra.broker.start_broker`, free ports, temp dir; heap 512 MiB; a new group's first "
        "rebalance waits 3 s for more members, Kafka's default `group.initial.rebalance.delay.ms`, "
        "where the tests' broker waits 0).",
        f"Worker: `python -m streams.cli worker --config {_config_shown(r)}`, one process, "
        f"ORACULAR_PARTITIONS={PARTITIONS}, at-least-once, RocksDB, a new app id, topic prefix "
        "and datadir per run, other settings default (batches: `streams/settings/`)"
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
        *(
            [
                "Same run, every drainer of the throughput input against the passthrough and "
                "Quix Streams (issue 34's ratios):",
                "",
                *ratio_table(r),
                "",
            ]
            if r.pipeline
            else []
        ),
    ]
    if r.pipeline:
        e = r.expected
        lines += [
            f"**Throughput** ({p.runs} runs each, alternating; medians above). Input: "
            f"{r.input_describe}, and a closing mark per partition a day later "
            f"({r.input_count:,} records), keyed by user, produced before any worker starts "
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
    lines += scale_out_text(r) + backfill_text(r) + peers_text(r)
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
        "when the load generator builds the event's record batch, just before it sends it) "
        "to the prediction's arrival at the bench's consumer, matched by "
        "prediction id `<user>:<event id>`, only events that produce a prediction.",
        markers(r.stream)[1],
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
        "(`streams/tools/processes.py`; datadirs `<datadir>/p<i>`). Events/s: "
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


def _outputs_per_event(r: Results) -> float:
    return sum(r.expected.values()) / max(r.input_count, 1)


def _config_shown(r: Results) -> str:
    return "bench/realistic.yaml" if r.stream == "realistic" else "examples/oracular.yaml"


def backfill_text(r: Results) -> list[str]:
    """The backfill paragraph."""
    if not r.backfill:
        return []
    return [
        f"**Backfill** (in the same alternation, {len(r.backfill)} runs; median above). "
        f"`oracular backfill --config {_config_shown(r)} --app-id <new>` over the same input "
        "topic: it captures the topic's range, drains it and exits; timed on its output "
        "records as the worker is (the episodes it closes at its end by the wall clock come "
        f"after the expected counts, outside the span). Events/s: {_list(r.backfill, 'rate')}; "
        f"to the last prediction: {_list(r.backfill, 'rate_pred')}; its own report (input "
        "messages over its time, Faust's start and stop included): "
        f"{', '.join(str(row['own_rate']) for row in r.backfill)}; runs ended by: "
        f"{', '.join(row['ended_by'] for row in r.backfill)}; exit codes "
        f"{', '.join(str(row['exit']) for row in r.backfill)}; CPU "
        f"{_median(r.backfill, 'cpu'):.0%} of a core.",
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
        "the value (msgpack, or the Segment JSON message: `userId`, `timestamp`, `messageId`), "
        "reads the user's `[count, last event time]` from its RocksDB "
        "state, writes it back (the framework's changelog topic records it), and sends one "
        f"msgpack output keyed by the user: {r.input_count:,} outputs per run, timed like the "
        "passthrough (first to last output record timestamp). The worker does far more per "
        "event: it decodes and checks the event, runs the engine on the user's decoded state "
        "(`apply_event`: the episode's signals, the predictions that change), publishes "
        "predictions and closed episodes (the timer's closes included; "
        f"{_outputs_per_event(r):.2f} outputs per event here), keeps the deadline index, "
        "and sends a changelog record per user per "
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
            "floor": f"{label} (`bench/peers/engine_floor.py`: the passthrough's aiokafka loop "
            "doing, per record, the product's decoder and `apply_event` on a dict of states with "
            "the worker's collector policy, and sending one small output; no Faust, store, "
            "changelog or commits: what any worker must at least do, so its ratio to the "
            "passthrough bounds the worker's)",
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


def record(section: str, begin: str = BEGIN, end: str = END) -> None:
    """Put `section` into BENCHMARKS.md between `begin` and `end` (appended if they are not
    there yet)."""
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    BENCHMARKS.write_text(text)
