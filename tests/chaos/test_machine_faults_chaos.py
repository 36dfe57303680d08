"""The faults of the worker's own machine at full size (`make chaos`; the short versions are in
`make test`, tests/integration/test_machine_faults.py): a full disk, corrupt local copies and a
broker frozen for longer than the group's session timeout, each on a stream ten times the
short one's, every output compared with the replay.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from infra.broker import start_broker
from tests.integration.conftest import WorkerFactory
from tests.integration.test_machine_faults import (
    FAULT_TIMEOUT_S,
    corrupt_copy,
    finish_and_compare,
    full_disk,
    needs_root,
    small_disk,
    the_stream,
)
from tests.integration.test_worker import FAST_TICK_S, worker_for
from tests.integration.worker_support import deployment, produce_events, wait_committed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.chaos_full,
    pytest.mark.skipif(os.environ.get("CHAOS_FULL") != "1", reason="the full runs: make chaos"),
]

EVENTS = 24_000
USERS = 3_000
SESSION_TIMEOUT_S = 6
FROZEN_S = SESSION_TIMEOUT_S + 14  # the group's session timeout passes while it is frozen


@needs_root
async def test_full_a_full_disk(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_BATCH_MAX": "200"})
    with small_disk(tmp_path / "disk", "64m") as disk:
        await full_disk(dep, faust_worker, disk, the_stream(dep, EVENTS, USERS))


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
async def test_full_a_corrupt_local_copy(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, damage: str
) -> None:
    dep = deployment(
        kafka,
        request.node.name,
        settings={"ORACULAR_BATCH_MAX": "200", "ORACULAR_API_PORT": "0"},
    )
    await corrupt_copy(dep, faust_worker, damage, the_stream(dep, EVENTS, USERS))


async def test_full_a_broker_frozen_past_the_session_timeout(
    request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """SIGSTOP on the broker mid-stream for longer than the group's session timeout, then
    SIGCONT: the worker carries on (or stops and is restarted, as a supervisor would), and
    every output equals the replay."""
    broker = await asyncio.to_thread(
        start_broker, tmp_path / "own-broker", port=None, stop_with_parent=True
    )
    try:
        dep = deployment(broker.bootstrap, request.node.name)
        events, until = the_stream(dep, EVENTS, USERS)
        await dep.create_topics()
        worker = worker_for(
            faust_worker,
            dep,
            ORACULAR_TICK_INTERVAL_S=FAST_TICK_S,
            ORACULAR_SESSION_TIMEOUT_S=str(SESSION_TIMEOUT_S),
        )
        worker.env["ORACULAR_BROKER"] = broker.bootstrap
        worker.start()
        third = len(events) // 3
        await produce_events(broker.bootstrap, dep.topics.events.name, events[:third])
        await wait_committed(dep, timeout_s=FAULT_TIMEOUT_S)
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            frozen_until = time.monotonic() + FROZEN_S
            while time.monotonic() < frozen_until:  # the freeze itself is what is tested
                await asyncio.sleep(0.5)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        resumed = time.monotonic()
        await produce_events(broker.bootstrap, dep.topics.events.name, events[third:])
        if not worker.running:  # it stopped on the fault: a supervisor starts it again
            print(f"\nthe worker stopped on the frozen broker: {worker.log_tail(3)}")
            worker.start()
        await finish_and_compare(dep, worker, events, until, since=resumed)
    finally:
        await asyncio.to_thread(broker.stop, wipe=True)
