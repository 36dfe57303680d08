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
    )


def window(lookups: bool, events: float, seconds: float) -> dict[str, object]:
    return {
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
