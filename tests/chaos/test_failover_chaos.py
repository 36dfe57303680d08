"""The full chaos run on a three-node cluster (`make chaos`, CHAOS_FULL=1): the workers are
started, stopped, killed and frozen as in test_chaos.py, and instead of a clean broker restart
the broker leading the input and changelog partitions is killed with SIGKILL mid-stream and
restarted 20 s later. The checks are the chaos suite's, plus the failover's rows
(tests/chaos/cluster.py): every topic RF 3 / min.insync.replicas 2, the failover's timings, and
the input stall. The short variant, without worker faults, is tests/integration/test_failover.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.cluster import Cluster

from .checks import table
from .cluster import kafka_cluster, run
from .scenario import FULL, Plan

__all__ = ["kafka_cluster"]  # the fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DOWN_S = 20.0


@pytest.mark.chaos_full
@pytest.mark.skipif(os.environ.get("CHAOS_FULL") != "1", reason="the full chaos run: make chaos")
async def test_full_chaos_failover(kafka_cluster: Cluster, tmp_path: Path) -> None:
    """About five minutes: 50,000 events, worker faults every few seconds, the leader broker
    killed and down for 20 s."""
    rows = await run(
        Plan.from_env(FULL), kafka_cluster, tmp_path, down_s=DOWN_S, worker_faults=True
    )
    assert all(r.ok for r in rows), "\n" + table(rows)
