"""`python -m bench.batchlookup` times all three cases and its answers are reproducible."""

from __future__ import annotations

import argparse
import asyncio

from bench.batchlookup import measure
from tests.streams.test_cli_replay import CONFIG


def small(**overrides: object) -> argparse.Namespace:
    args = {"config": str(CONFIG), "users": 50, "events": 1000, "batches": 3, "size": 10}
    return argparse.Namespace(
        **{"seed": 1, "profile": 0, "profile_case": "owner, cold", **args, **overrides}
    )


def test_the_bench_times_each_case_and_hashes_the_same_answers_every_run() -> None:
    figures, digest = asyncio.run(measure(small()))
    assert set(figures) == {"owner, cold", "owner, warm", "forwarding"}
    for median, p90, worst in figures.values():
        assert 0 < median <= p90 <= worst
    assert asyncio.run(measure(small()))[1] == digest
    assert asyncio.run(measure(small(seed=2)))[1] != digest
