"""The PromQL of the operator's dashboard (infra/grafana/oracular.json) and alert rules
(infra/prometheus/alerts.yml), and the metric names it reads; for their tests."""

from __future__ import annotations

import json
from pathlib import Path

import promql_parser
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "infra" / "grafana" / "oracular.json"
ALERTS = ROOT / "infra" / "prometheus" / "alerts.yml"

GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$job": ".*", "$instance": ".*"}
"""The dashboard's variables, as Grafana substitutes them before a query reaches Prometheus."""
PROMETHEUS_OWN = frozenset({"up"})
"""Series Prometheus makes itself for every target (not in a worker's /metrics)."""


def dashboard_queries() -> dict[str, str]:
    """`panel title / legend` -> its PromQL, Grafana's variables substituted."""
    board = json.loads(DASHBOARD.read_text())
    queries = {}
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries[f"{panel['title']} / {target['legendFormat']}"] = expr
    return queries


def alert_queries() -> dict[str, str]:
    """Alert name -> its expression."""
    rules = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r["expr"] for group in rules["groups"] for r in group["rules"]}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (promql-parser's AST).

    Raises:
        ValueError: the expression does not parse (the parser's message).
    """
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name is None:
                msg = f"a selector without a metric name: {expr}"
                raise ValueError(msg)
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names
