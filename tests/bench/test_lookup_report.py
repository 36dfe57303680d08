"""`python -m bench.lookup`'s report when the backlog drained before every window ran."""

from __future__ import annotations

import argparse

import pytest

from bench.lookup import WINDOW_S, report


def args() -> argparse.Namespace:
    return argparse.Namespace(
        events=1000,
        users=10,
        runs=2,
        live_rate=None,
        lookup_rate=200.0,
        window=WINDOW_S,
        worker_env=[],
        api_core=None,
        stream="synthetic",
    )


def window(
    lookups: bool, events: float, seconds: float, cpu: dict[str, float] | None = None
) -> dict[str, object]:
    return {
        "cpu": cpu or {},
        "lookups": lookups,
        "events": events,
        "seconds": seconds,
        "rate": events / seconds,
        "lookups_per_s": 200.0 if lookups else 0.0,
        "drained": False,
        "latencies": [],
    }


LATENCY = [("single user at the owner", (1.0, 2.0, 3.0), 100, (0.5, 0.75, 1.0))]


@pytest.mark.parametrize("with_windows", [0, 1])
def test_the_report_prints_what_was_measured(capsys, with_windows: int) -> None:
    """A quiet machine drains a small backlog before the first window with lookups: the
    latency tables are still printed and the ratio is n/a (a ZeroDivisionError lost them)."""
    rows = {
        "without": [window(False, 8000.0, 4.0)],
        "with": [window(True, 6000.0, 4.0)] * with_windows,
    }
    report(args(), rows, LATENCY, LATENCY, offered=500.0, live=480.0, sources={})
    out = capsys.readouterr().out
    assert "| single user at the owner | 1.00 | 2.00 |" in out
    assert "| 0.50 / 0.75 (0.50 / 0.75) |" in out
    if with_windows:
        assert "throughput ratio with/without lookups: 0.75" in out
        assert "(200 lookups/s answered" in out
    else:
        assert "throughput ratio with/without lookups: n/a" in out
        assert "| none | n/a |" in out


def test_the_report_says_where_the_cores_went(capsys) -> None:
    """Each part's CPU per second of the windows, pooled, and a lookup's own CPU: the API and
    client CPU the windows with lookups spent beyond those without, per lookup answered."""
    without = {"workers": 3.0, "api": 0.2, "client": 0.1, "broker": 0.4, "machine": 7.0}
    with_ = {"workers": 2.4, "api": 1.0, "client": 0.5, "broker": 0.4, "machine": 7.6}
    rows = {
        "without": [window(False, 8000.0, 4.0, without)],
        "with": [window(True, 6000.0, 4.0, with_)],
    }
    report(args(), rows, LATENCY, LATENCY, offered=500.0, live=480.0, sources={})
    out = capsys.readouterr().out
    assert "| the two workers | 0.75 | 0.60 |" in out
    assert "| their two API processes | 0.05 | 0.25 |" in out
    assert "| everything else on the machine | 0.82 | 0.82 |" in out
    assert "| the workers' CPU per event applied, µs | 375.0 | 400.0 |" in out
    # (1.0 - 0.2) / 4 s / 200 lookups/s = 1 ms a lookup; the client (0.5 - 0.1) / 4 / 200
    assert "API processes 1.00 ms, client 0.50 ms" in out
