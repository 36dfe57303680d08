"""The worker's `/metrics`: its families written by prometheus-client, with the process's own.

`Metrics` keeps what only the API sees (lookups, forwards, batch timings); the processor's
counters are read when scraped (`processor_families`), whatever their names are, so counters
added to `Processor.counts` show up without a change here. `render` hands the families to
prometheus-client's exposition (the Prometheus text format, or OpenMetrics) together with its
process, platform and garbage-collector collectors: `process_cpu_seconds_total`,
`process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`,
`process_start_time_seconds` (each with `process="worker"` for the worker's process and, from
the API's own process, `process="api"` for that one), `python_gc_*`, `python_info`.

Each worker process serves its own `/metrics` on its own API port (`--processes N`: the API port
plus i for process i), so a scrape of every port sees every process (docs/operations.md).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""What `render` writes: the Prometheus text format (legacy names, as 0.0.4 has them)."""
OPENMETRICS_CONTENT_TYPE: Final = OPENMETRICS_TYPE
"""What `render(..., openmetrics=True)` writes."""
BATCH_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOOKUP_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

Labels = tuple[tuple[str, str], ...]


def metric_name(text: str) -> str:
    """`text` as a Prometheus name: [a-zA-Z_:][a-zA-Z0-9_:]*, lower case."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", text).lower().strip("_") or "unnamed"
    return name if not name[0].isdigit() else f"_{name}"


@dataclass
class Family:
    """One metric family: name, type, help and samples (labels, value)."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)
    """(name suffix, labels, value): the suffix is "" or _bucket/_sum/_count."""

    def add(self, value: float, labels: Labels = (), suffix: str = "") -> Family:
        self.samples.append((suffix, labels, value))
        return self

    def metric(self) -> Metric:
        """The family as prometheus-client's Metric (a counter's name without its `_total`,
        which the exposition adds back)."""
        kind = self.kind
        base = self.name
        if kind == "counter":
            if base.endswith("_total"):
                base = base.removesuffix("_total")
            else:
                kind = "unknown"  # a counter's samples must end in _total: not claimed as one
        metric = Metric(base, self.help, kind)
        for suffix, labels, value in self.samples:
            metric.add_sample(self.name + suffix, dict(labels), value)
        return metric


@dataclass
class Histogram:
    """Cumulative buckets of observed durations, per label set."""

    buckets: Sequence[float]
    counts: dict[Labels, list[int]] = field(default_factory=dict)
    sums: dict[Labels, float] = field(default_factory=dict)

    def observe(self, seconds: float, labels: Labels = ()) -> None:
        counts = self.counts.setdefault(labels, [0] * (len(self.buckets) + 1))
        for n, bound in enumerate(self.buckets):
            if seconds <= bound:
                counts[n] += 1
        counts[-1] += 1
        self.sums[labels] = self.sums.get(labels, 0.0) + seconds

    def family(self, name: str, help_text: str) -> Family:
        family = Family(name, "histogram", help_text)
        for labels, counts in sorted(self.counts.items()):
            for bound, count in zip(self.buckets, counts, strict=False):
                family.add(count, (*labels, ("le", _bound(bound))), "_bucket")
            family.add(counts[-1], (*labels, ("le", "+Inf")), "_bucket")
            family.add(self.sums[labels], labels, "_sum")
            family.add(counts[-1], labels, "_count")
        return family


@dataclass
class Metrics:
    """What the API records: lookups by endpoint and status, their latency, forwards, batches."""

    lookups: Counter[Labels] = field(default_factory=Counter)
    lookup_seconds: Histogram = field(default_factory=lambda: Histogram(LOOKUP_BUCKETS))
    forwards: Counter[Labels] = field(default_factory=Counter)
    reveals: Counter[Labels] = field(default_factory=Counter)
    erasures: Counter[Labels] = field(default_factory=Counter)
    batch_seconds: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    batch_messages: int = 0

    def lookup(self, endpoint: str, status: str, seconds: float) -> None:
        self.lookups[(("endpoint", endpoint), ("status", status))] += 1
        self.lookup_seconds.observe(seconds, (("endpoint", endpoint),))

    def batch(self, seconds: float, messages: int) -> None:
        self.batch_seconds.observe(seconds)
        self.batch_messages += messages

    def families(self) -> list[Family]:
        lookups = Family("oracular_lookups_total", "counter", "Lookup answers by status.")
        for labels, value in sorted(self.lookups.items()):
            lookups.add(value, labels)
        forwards = Family(
            "oracular_lookup_forwards_total", "counter", "Lookups forwarded to the owner."
        )
        for labels, value in sorted(self.forwards.items()):
            forwards.add(value, labels)
        reveals = Family("oracular_reveals_total", "counter", "Reveal commands by outcome.")
        for labels, value in sorted(self.reveals.items()):
            reveals.add(value, labels)
        erasures = Family(
            "oracular_erase_commands_total", "counter", "Erase commands (DELETE) by outcome."
        )
        for labels, value in sorted(self.erasures.items()):
            erasures.add(value, labels)
        return [
            lookups,
            self.lookup_seconds.family(
                "oracular_lookup_seconds", "Lookup latency on this worker, forwards included."
            ),
            forwards,
            reveals,
            erasures,
            self.batch_seconds.family(
                "oracular_batch_seconds", "Time to apply one agent batch (outputs, states)."
            ),
            Family(
                "oracular_batch_messages_total", "counter", "Messages in the batches timed."
            ).add(self.batch_messages),
        ]


def processor_families(
    counts: Mapping[str, int],
    handled: Iterable[str],
    outputs: Iterable[str],
    *,
    by_partition: Mapping[tuple[str, int], int],
    partitions: Iterable[int],
    closed_by_reason: Mapping[str, int],
    reasons: Iterable[str],
) -> list[Family]:
    """The processor's counters, read generically.

    Input outcomes (`handled`: applied, redelivered, ...) become
    `oracular_inputs_total{outcome=...,partition=...}` and late inputs
    `oracular_late_total{partition=...}`, from `by_partition` (every outcome of each of
    `partitions` and of the partitions counted, zeros included); output kinds (`outputs`)
    become `oracular_outputs_total{kind=...}`; closed episodes
    `oracular_episodes_closed_total{reason=...}` (each of `reasons` at least); every other
    counter `oracular_<name>_total`.
    """
    handled, outputs = sorted(set(handled)), sorted(set(outputs))
    inputs = Family("oracular_inputs_total", "counter", "Input messages handled, by outcome.")
    late = Family("oracular_late_total", "counter", "Inputs applied late, by partition.")
    for partition in sorted(set(partitions) | {partition for _, partition in by_partition}):
        for name in handled:
            labels = (("outcome", name), ("partition", str(partition)))
            inputs.add(by_partition.get((name, partition), 0), labels)
        late.add(by_partition.get(("late", partition), 0), (("partition", str(partition)),))
    published = Family("oracular_outputs_total", "counter", "Output messages, by kind.")
    for name in outputs:
        published.add(counts.get(name, 0), (("kind", name),))
    closed = Family("oracular_episodes_closed_total", "counter", "Episodes closed, by reason.")
    for reason in sorted(set(reasons) | set(closed_by_reason)):
        closed.add(closed_by_reason.get(reason, 0), (("reason", reason),))
    families = [inputs, late, published, closed]
    for name in sorted(set(counts) - {*handled, "late", *outputs}):
        metric = metric_name(name)
        metric = f"oracular_{metric.removesuffix('_total')}_total"
        families.append(Family(metric, "counter", f"Processor counter {name}.").add(counts[name]))
    return families


def _average(values: Iterable[float]) -> float:
    recent = tuple(values)  # one C-level copy: the worker's thread may append meanwhile
    return sum(recent) / len(recent) if recent else 0.0


_MONITOR_NUMBERS: Final = (
    # (family, type, help, faust.sensors.Monitor attribute)
    (
        "faust_messages_active",
        "gauge",
        "Messages received, not yet acknowledged.",
        "messages_active",
    ),
    ("faust_send_errors_total", "counter", "Produce requests that failed.", "send_errors"),
    ("faust_rebalances_total", "counter", "Rebalances seen.", "rebalances"),
    (
        "faust_assignments_completed_total",
        "counter",
        "Assignments completed.",
        "assignments_completed",
    ),
    ("faust_assignments_failed_total", "counter", "Assignments failed.", "assignments_failed"),
    (
        "faust_rebalance_end_avg_seconds",
        "gauge",
        "Recent rebalances' average time to their end.",
        "rebalance_end_avg",
    ),
)


def monitor_families(monitor: Any) -> list[Family]:
    """Faust's own sensor (`app.monitor`, a faust.sensors.Monitor) as `faust_*` families.

    The worker takes its input in batches (streams/faust/batches.py), so Faust's per-event
    stream counters do not move; its message, send, commit and rebalance figures do. The
    latencies are averages of the recent samples Faust keeps.
    """
    families = []
    for name, attribute, help_text in (
        ("faust_messages_received_total", "messages_received_by_topic", "Messages received."),
        ("faust_messages_sent_total", "messages_sent_by_topic", "Messages sent through Faust."),
    ):
        family = Family(name, "counter", help_text)
        for topic, value in sorted(dict(getattr(monitor, attribute, None) or {}).items()):
            family.add(value, (("topic", str(topic)),))
        families.append(family)
    for name, kind, help_text, attribute in _MONITOR_NUMBERS:
        families.append(Family(name, kind, help_text).add(getattr(monitor, attribute, 0) or 0))
    for name, attribute, help_text in (
        ("faust_send_latency_avg_seconds", "send_latency", "Recent sends' average latency."),
        ("faust_commit_latency_avg_seconds", "commit_latency", "Recent commits' average latency."),
    ):
        value = _average(getattr(monitor, attribute, None) or ())
        families.append(Family(name, "gauge", help_text).add(value))
    full = Family("faust_topic_buffer_full_total", "counter", "Times a stream buffer was full.")
    for tp, value in sorted(dict(getattr(monitor, "topic_buffer_full", None) or {}).items()):
        full.add(value, (("topic", str(tp.topic)), ("partition", str(tp.partition))))
    families.append(full)
    return families


def _bound(value: float) -> str:
    """A bucket bound as Prometheus writes `le` (`0.005`, `1.0`, `+Inf`)."""
    return "+Inf" if math.isinf(value) else repr(float(value))


_PROCESS: Final = CollectorRegistry(auto_describe=False)
"""This process's platform and garbage-collector metrics (prometheus-client's collectors, in
a registry of their own)."""
PlatformCollector(registry=_PROCESS)
GCCollector(registry=_PROCESS)

_PROCESSES: dict[str, int | str] = {"worker": "self"}
"""Whose `process_*` series `/metrics` shows, by the `process` label they carry: the worker's
(this process, unless `serve_for_worker` said otherwise) and, in the API's own process, the
API's too. Before the label, the API process's own series stood for the worker's: the RSS the
dashboard showed was the API's 67 MB, not the worker's."""


def serve_for_worker(worker_pid: int) -> None:
    """In the API's process: `process_*{process="worker"}` is the worker's (`worker_pid`), and
    `process_*{process="api"}` this process's."""
    _PROCESSES.clear()
    _PROCESSES.update({"worker": worker_pid, "api": "self"})


def _process_metrics() -> Iterable[Metric]:
    """prometheus-client's process metrics of each process, one family per name, which one a
    `process` label (a process that is gone has none)."""
    merged: dict[str, Metric] = {}
    for process, pid in _PROCESSES.items():
        collector = ProcessCollector(pid=lambda pid=pid: pid, registry=None)  # type: ignore[misc]
        for metric in collector.collect():
            into = merged.setdefault(
                metric.name, Metric(metric.name, metric.documentation, metric.type)
            )
            for sample in metric.samples:
                into.add_sample(sample.name, {**sample.labels, "process": process}, sample.value)
    return merged.values()


@dataclass
class _Collected:
    """`families` and prometheus-client's process collectors, as one collector to expose."""

    families: list[Family]
    process: bool

    def collect(self) -> Iterable[Metric]:
        seen: set[str] = set()
        for family in self.families:
            if family.name not in seen:
                seen.add(family.name)
                yield family.metric()
        if self.process:
            yield from _process_metrics()
            yield from _PROCESS.collect()


def render(families: Iterable[Family], *, process: bool = True, openmetrics: bool = False) -> str:
    """The exposition text of `families` (each name once) and, with `process`, this process's
    own metrics: the Prometheus text format (CONTENT_TYPE), or OpenMetrics
    (OPENMETRICS_CONTENT_TYPE)."""
    collected = _Collected(list(families), process)
    write = generate_openmetrics if openmetrics else generate_latest
    return write(collected).decode("utf-8")  # type: ignore[arg-type]
