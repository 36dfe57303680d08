"""A user's lifecycle end to end (issue 46): with `stateTtl`, users who went quiet leave the
local store, the changelog (its compacted view: the last record per key, a tombstone
deleting) and the lookup API's replica, while the outputs equal the offline replay's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from rocksdict import Options, Rdict

from engine import Event
from streams.settings.topics import STATE_TABLE
from tests.contract import contract_session

from .conftest import WorkerFactory
from .test_serving import api_url
from .test_worker import FAST_TICK_S, assert_equals_replay, worker_for
from .worker_support import (
    EXAMPLE_CONFIG,
    NO_WALL_CLOCK,
    deployment,
    expected_outputs,
    generate_stream,
    last_summary,
    produce_events,
    sentinels,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAY_MS = 24 * 3600 * 1000
TTL = "15d"  # the example config's longest attribution is 14d and its timeout 30m
COMEBACK_DAYS = 20


def ttl_config(tmp_path: Path) -> Path:
    """The example config with `stateTtl`."""
    document = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    document.pop("$schema", None)
    document["stateTtl"] = TTL
    path = tmp_path / "ttl.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def stored_users(datadir: Path) -> set[str]:
    """Every user key in a stopped worker's local state databases."""
    users: set[str] = set()
    for db_path in datadir.rglob(f"{STATE_TABLE}-*.db"):
        db = Rdict(str(db_path), Options(raw_mode=True))
        try:
            keys = db.keys()
            users |= {key.decode() for key in keys if not key.startswith(b"__")}
        finally:
            db.close()
    return users


async def lookup(url: str, user: str) -> dict:
    async with contract_session() as http, http.get(f"{url}/v1/users/{user}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


@pytest.mark.parametrize("arrival", ["live", "backlog"])
async def test_quiet_users_expire_from_store_changelog_and_replica(
    kafka: str,
    request: pytest.FixtureRequest,
    faust_worker: WorkerFactory,
    tmp_path: Path,
    arrival: str,
) -> None:
    """`live`: the worker runs as the events come; `backlog`: a fresh app id catches up with
    the whole topic (expiry while inputs are not committed yet)."""
    config_path = ttl_config(tmp_path)
    dep = deployment(kafka, request.node.name, config_path=config_path, settings=NO_WALL_CLOCK)
    events = generate_stream(dep.config, events=3_000, users=200, seed=46)
    users = sorted({e.user for e in events})
    # A quarter of the users come back long after the TTL (they start again); the rest go
    # quiet for good. Marks an hour later move every partition's watermark past the others'
    # expiry, by event time.
    back_at = events[-1].at + COMEBACK_DAYS * DAY_MS
    returning = users[::4]
    comeback = [
        Event(u, back_at + n, name="pricing.viewed", id=f"{u}-back")
        for n, u in enumerate(users[::4])
    ]
    marks = sentinels(back_at + 3600_000)
    stream = events + comeback + marks
    until = marks[0].at - 120_000  # the default lateness
    expected = expected_outputs(dep.config, stream, until=until)
    active = set(returning) | {m.user for m in marks}
    assert set(expected.states) == active  # the replay keeps the active users only

    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    if arrival == "live":
        worker.start()
        await produce_events(kafka, dep.topics.events.name, events)
        await wait_committed(dep)
        await produce_events(kafka, dep.topics.events.name, comeback + marks)
    else:
        await produce_events(kafka, dep.topics.events.name, stream)
        worker.start()
    await assert_equals_replay(dep, expected)  # outputs, and the changelog's compacted view

    url = api_url(worker)
    quiet = next(u for u in users if u not in active)
    assert (await lookup(url, quiet))["known"] is False
    assert (await lookup(url, returning[0]))["known"] is True
    async with contract_session() as http, http.get(f"{url}/metrics") as response:
        metrics = await response.text()
    expired = float(re.search(r"^oracular_expired_total (\S+)$", metrics, re.M).group(1))
    assert expired == len(users), metrics[:2000]  # each went quiet once

    assert worker.stop() == 0
    assert stored_users(worker.datadir) == active
    assert last_summary(worker.log_text())["expired"] == expired
