"""The operator's dashboard and alert rules, without a broker: the JSON is what its generator
writes, every query and alert expression parses as PromQL (promql-parser), the panels cover
what docs/operations.md promises, and the alerts say what to do. Their metric names are checked
against a running worker's /metrics in tests/integration/test_dashboard.py."""

from __future__ import annotations

import json

import pytest
import yaml

from infra.grafana import make_dashboard
from infra.grafana.queries import ALERTS, DASHBOARD, alert_queries, dashboard_queries, metric_names


def test_the_dashboard_json_is_what_its_generator_writes():
    assert DASHBOARD.read_text() == make_dashboard.render(), (
        "run `python -m infra.grafana.make_dashboard`"
    )


@pytest.mark.parametrize("where", sorted({**dashboard_queries(), **alert_queries()}))
def test_every_query_parses_and_names_its_metrics(where):
    expr = {**dashboard_queries(), **alert_queries()}[where]
    names = metric_names(expr)
    assert names, where
    assert all(n.startswith(("oracular_", "faust_", "process_")) or n == "up" for n in names)


def test_a_broken_query_is_caught():
    with pytest.raises(ValueError, match="parenthesis"):
        metric_names("sum(rate(oracular_inputs_total[5m])")


def test_the_panels_cover_what_an_operator_watches():
    titles = " | ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]).lower()
    for subject in (
        "throughput",
        "lag per input partition",
        "batch latency",
        "lookups by status",
        "lookup latency",
        "dead letters by reason",
        "closes by reason",
        "restore progress",
        "rebalances",
    ):
        assert subject in titles, subject
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        assert panel["options"]["legend"]["placement"] == "bottom"  # never over the data


def test_the_alerts_cover_lag_dead_letters_closed_early_readiness_and_restores():
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert {
        "OracularLagGrowing",
        "OracularDeadLetters",
        "OracularClosedEarly",
        "OracularWorkerNotReady",
        "OracularRestoreStuck",
    } <= names
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
