"""A failover under load: two workers process a paced stream on a three-node cluster while the
broker leading the input and changelog partitions is killed with SIGKILL and restarted.

Afterwards every input offset is accounted for once, the outputs and final states equal the
offline replay byte for byte, no worker is stuck, every topic has three replicas and
min.insync.replicas=2, and the input stall (time to recover) is measured. The scenario and its
table: tests/chaos/cluster.py (the full variant, with worker faults too, is in `make chaos`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cluster import Cluster
from tests.chaos.checks import table
from tests.chaos.cluster import kafka_cluster, run
from tests.chaos.scenario import Plan

__all__ = ["kafka_cluster"]  # the fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAILOVER = Plan(
    seconds=75,
    seed=7,
    workers=2,
    events=3_000,
    bad_share=0.01,
    fault_gap_s=(1.0, 1.0),  # how often the broker kill is checked for being due
    restart_broker=True,
    produce_share=0.45,  # a 34 s stream; the kill 30-60 % into it
)
DOWN_S = 10.0


async def test_leader_failover_loses_nothing(kafka_cluster: Cluster, tmp_path: Path) -> None:
    """About 75 s: 3,000 events from 2 workers, the leader broker down for 10 s."""
    rows = await run(
        Plan.from_env(FAILOVER), kafka_cluster, tmp_path, down_s=DOWN_S, worker_faults=False
    )
    assert all(r.ok for r in rows), "\n" + table(rows)
