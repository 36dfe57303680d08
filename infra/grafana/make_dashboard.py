"""Writes infra/grafana/oracular.json, the operator's Grafana dashboard (docs/operations.md).

`python -m infra.grafana.make_dashboard` after editing PANELS; tests/infra/test_dashboard.py
checks that the JSON is what this writes, that every query parses, and (against a running
worker) that every metric it names is scraped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("oracular.json")
RATE = "$__rate_interval"
SEL = 'job=~"$job", instance=~"$instance"'

# (title, unit, description, [(legend, PromQL)])
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    (
        "Throughput: inputs by outcome, outputs by kind",
        "ops",
        "Input messages handled per second, by outcome (applied, redelivered, duplicate_id, "
        "dead_lettered, ignored: each input is one), and outputs published per second.",
        [
            ("in {{outcome}}", f"sum by (outcome) (rate(oracular_inputs_total{{{SEL}}}[{RATE}]))"),
            ("out {{kind}}", f"sum by (kind) (rate(oracular_outputs_total{{{SEL}}}[{RATE}]))"),
        ],
    ),
    (
        "Consumer lag per input partition",
        "short",
        "Input messages waiting, per partition (the owner's view). Growing for minutes: the "
        "workers do not keep up (alert OracularLagGrowing).",
        [("partition {{partition}}", f"max by (partition) (oracular_partition_lag{{{SEL}}})")],
    ),
    (
        "Batch latency",
        "s",
        "Time to apply one agent batch (outputs delivered, states written), p50 and p99.",
        [
            (
                f"p{int(q * 100)}",
                f"histogram_quantile({q}, sum by (le) "
                f"(rate(oracular_batch_seconds_bucket{{{SEL}}}[{RATE}])))",
            )
            for q in (0.5, 0.99)
        ],
    ),
    (
        "Lookups by status",
        "reqps",
        "Lookup API answers per second by status (found, unknown, unavailable, timeout, "
        "invalid, error, forwarded) and forwards to the owner by outcome.",
        [
            ("{{status}}", f"sum by (status) (rate(oracular_lookups_total{{{SEL}}}[{RATE}]))"),
            (
                "forward {{outcome}}",
                f"sum by (outcome) (rate(oracular_lookup_forwards_total{{{SEL}}}[{RATE}]))",
            ),
        ],
    ),
    (
        "Lookup latency",
        "s",
        "Lookup latency on the worker asked (forwards included), p50 and p99 per endpoint.",
        [
            (
                f"{{{{endpoint}}}} p{int(q * 100)}",
                f"histogram_quantile({q}, sum by (endpoint, le) "
                f"(rate(oracular_lookup_seconds_bucket{{{SEL}}}[{RATE}])))",
            )
            for q in (0.5, 0.99)
        ],
    ),
    (
        "Dead letters by reason",
        "short",
        "Inputs dead-lettered in the interval: all of them, and those with a counted reason: "
        "an event time too far ahead of the record (clock_ahead), a quarantined user, an "
        "internal error. The rest could not be decoded (the dead-letter topic has each "
        "reason).",
        [
            (
                "all",
                f'sum(increase(oracular_inputs_total{{outcome="dead_lettered", {SEL}}}[{RATE}]))',
            ),
            ("clock ahead", f"sum(increase(oracular_clock_ahead_total{{{SEL}}}[{RATE}]))"),
            ("quarantined", f"sum(increase(oracular_quarantined_total{{{SEL}}}[{RATE}]))"),
            ("internal error", f"sum(increase(oracular_internal_errors_total{{{SEL}}}[{RATE}]))"),
        ],
    ),
    (
        "Episode closes by reason",
        "short",
        "Episodes closed in the interval by reason (end: a sign-out; timeout: idle past the "
        "episode timeout), how many of the timeouts the timer found, and inputs outside the "
        "live = replay contract (closed_early, behind_watermark; docs/time.md).",
        [
            (
                "{{reason}}",
                f"sum by (reason) (increase(oracular_episodes_closed_total{{{SEL}}}[{RATE}]))",
            ),
            ("by the timer", f"sum(increase(oracular_closed_by_timer_total{{{SEL}}}[{RATE}]))"),
            ("closed early", f"sum(increase(oracular_closed_early_total{{{SEL}}}[{RATE}]))"),
            (
                "behind watermark",
                f"sum(increase(oracular_behind_watermark_total{{{SEL}}}[{RATE}]))",
            ),
        ],
    ),
    (
        "Restore progress",
        "short",
        "Changelog records still to restore into each worker's active and standby table "
        "copies (0 when up to date); 1 on the recovering line while a restore runs.",
        [
            (
                "{{instance}} {{role}}",
                f"sum by (instance, role) (oracular_restore_remaining_records{{{SEL}}})",
            ),
            ("{{instance}} recovering", f"max by (instance) (oracular_recovering{{{SEL}}})"),
        ],
    ),
    (
        "Rebalances",
        "short",
        "Rebalances seen in the interval, workers rebalancing now, and the assignment "
        "generation (a step is a new assignment).",
        [
            ("rebalances", f"sum(increase(faust_rebalances_total{{{SEL}}}[{RATE}]))"),
            ("rebalancing now", f"sum(oracular_rebalancing{{{SEL}}})"),
            ("generation", f"max(oracular_assignment_generation{{{SEL}}})"),
        ],
    ),
    (
        "Workers ready, partitions held",
        "short",
        "1 per worker whose /readyz answers 200, and the state partitions each holds.",
        [
            ("{{instance}} ready", f"max by (instance) (oracular_ready{{{SEL}}})"),
            (
                "{{instance}} {{role}}",
                f"sum by (instance, role) (oracular_assigned_partitions{{{SEL}}})",
            ),
        ],
    ),
    (
        "Process: open files, memory, CPU",
        "short",
        "Each worker's process and its lookup API's (the `process` label) open file "
        "descriptors (a connection flood shows in the API's first), resident memory (MiB) and "
        "CPU (cores).",
        [
            ("{{instance}} {{process}} open fds", f"process_open_fds{{{SEL}}}"),
            ("{{instance}} {{process}} RSS MiB", f"process_resident_memory_bytes{{{SEL}}} / 2^20"),
            ("{{instance}} {{process}} cores", f"rate(process_cpu_seconds_total{{{SEL}}}[{RATE}])"),
        ],
    ),
]


def _panel(n: int, title: str, unit: str, description: str, queries: list[Any]) -> dict[str, Any]:
    return {
        "id": n + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (n % 2), "y": 8 * (n // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        # The legend under the graph, as a table: never over the data.
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "expr": expr,
                "legendFormat": legend,
            }
            for i, (legend, expr) in enumerate(queries)
        ],
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }


def dashboard() -> dict[str, Any]:
    """The dashboard, as Grafana imports it (Dashboards > New > Import, or provisioning)."""
    return {
        "__inputs": [
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "uid": "oracular-streams",
        "title": "oracular-streams workers",
        "description": "Throughput, lag, latency, lookups, dead letters, closes, restores and "
        "rebalances of the oracular workers (docs/operations.md, Dashboard and alerts).",
        "tags": ["oracular", "kafka", "faust"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("job", "job", "label_values(oracular_ready, job)"),
                _variable(
                    "instance", "worker", 'label_values(oracular_ready{job=~"$job"}, instance)'
                ),
            ]
        },
        "panels": [_panel(n, *panel) for n, panel in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
