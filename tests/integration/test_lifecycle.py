"""A user's lifecycle end to end (issue 46): with `stateTtl`, users who went quiet leave the
local store, the changelog (its compacted view: the last record per key, a tombstone
deleting) and the lookup API's replica, while the outputs equal the offline replay's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rocksdict import Options, Rdict

from engine import END_OF_TIME, Event
from infra.broker import REPO_ROOT
from schemas.events import decode_event
from schemas.outputs import decode_output
from streams.runtime.erasure import is_marker
from streams.settings.topics import STATE_TABLE
from streams.tools.replay import replay_outputs
from tests.contract import contract_session

from .conftest import WorkerFactory
from .test_serving import api_url
from .test_worker import FAST_TICK_S, assert_equals_replay, worker_for
from .worker_support import (
    EXAMPLE_CONFIG,
    NO_WALL_CLOCK,
    Deployment,
    changelog_states,
    compacted,
    deployment,
    expected_outputs,
    generate_stream,
    last_summary,
    output_problems,
    produce_events,
    read_all,
    run_backfill,
    sentinels,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAY_MS = 24 * 3600 * 1000
TTL = "15d"  # the example config's longest attribution is 14d and its timeout 30m
COMEBACK_DAYS = 20
CLI_TIMEOUT_S = 60.0


def ttl_config(tmp_path: Path) -> Path:
    """The example config with `stateTtl`."""
    document = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    document.pop("$schema", None)
    document["stateTtl"] = TTL
    path = tmp_path / "ttl.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def stored_keys(datadir: Path) -> set[bytes]:
    """Every key of users and markers in a stopped worker's local state databases."""
    found: set[bytes] = set()
    for db_path in datadir.rglob(f"{STATE_TABLE}-*.db"):
        db = Rdict(str(db_path), Options(raw_mode=True))
        try:
            keys = db.keys()  # (iterating an Rdict gives its items)
            found |= {key for key in keys if not key.startswith(b"__")}
        finally:
            db.close()
    return found


def stored_users(datadir: Path) -> set[str]:
    """Every user key in a stopped worker's local state databases."""
    return {key.decode() for key in stored_keys(datadir) if not is_marker(key)}


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


def forget_by_cli(dep: Deployment, user: str, reason: str) -> str:
    """`oracular forget USER --reason`; the command id it prints."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        **dep.env(),
        "ORACULAR_BROKER": dep.bootstrap,
    }
    argv = [sys.executable, "-m", "streams.cli", "forget", user, "--reason", reason]
    done = subprocess.run(
        argv,
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"command (erase-[0-9a-f]+) at .* partition (\d+) offset (\d+)", done.stdout)
    assert found, done.stdout
    return found.group(1)


async def erase_commands(dep: Deployment) -> list[Event]:
    """The erase commands on the input topic, decoded."""
    records = await read_all(dep.bootstrap, dep.topics.events.name)
    found = [decode_event(r.value) for r in records if r.value and b"erase" in r.value]
    return [e for e in found if e.type == "erase"]


async def test_an_erased_user_leaves_store_changelog_and_replica_and_no_backfill_brings_it_back(
    kafka: str,
    request: pytest.FixtureRequest,
    faust_worker: WorkerFactory,
    tmp_path: Path,
) -> None:
    """The erasure's proof: one user erased by `oracular forget`, one by `DELETE`. Then no key
    of either is in the local store, the changelog's compacted view or the replica (lookups
    answer unknown), each has an `erased` message naming its command, the live outputs equal
    the replay of the same input; and a backfill of the topic from its start gives the replay
    that reads the erasures ahead: nothing of theirs but the `erased` messages."""
    dep = deployment(kafka, request.node.name, settings=NO_WALL_CLOCK)
    events = generate_stream(dep.config, events=2_000, users=100, seed=47)
    # Users with no episode open at the end: no timer close of theirs races the erasure.
    _, run = replay_outputs(dep.config, events, until=0)
    victims = sorted(u for u, s in run.states().items() if s.episode.started_at is None)[:2]
    assert len(victims) == 2
    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    await produce_events(kafka, dep.topics.events.name, events)
    await wait_committed(dep)
    url = api_url(worker)
    assert (await lookup(url, victims[0]))["known"] is True

    by_cli = forget_by_cli(dep, victims[0], "GDPR request 1")
    async with (
        contract_session() as http,
        http.delete(f"{url}/v1/users/{victims[1]}", json={"reason": "asked"}) as response,
    ):
        assert response.status == 202, await response.text()
        by_api = (await response.json())["command"]["id"]
    erases = await erase_commands(dep)
    assert {(e.user, e.id) for e in erases} == {(victims[0], by_cli), (victims[1], by_api)}
    marks = sentinels(events[-1].at + COMEBACK_DAYS * DAY_MS)
    await produce_events(kafka, dep.topics.events.name, marks)
    stream = events + erases + marks
    expected = expected_outputs(dep.config, stream, until=marks[0].at - 120_000)
    assert not set(victims) & set(expected.states)
    for erase in erases:
        erased = expected.predictions[f"{erase.user}:#erased@{erase.at}"]
        assert erased["event"] == erase.id and erased["type"] == "erased"
    await assert_equals_replay(dep, expected)  # outputs, erased messages, states, no DLQ

    changelog = compacted(await read_all(kafka, dep.changelog))
    markers = {k: v for k, v in changelog.items() if is_marker(k)}
    assert len(markers) == 2 and not {v.encode() for v in victims} & set(changelog)
    assert not [v for v in victims for k, m in markers.items() if v.encode() in k + m]
    for victim in victims:
        assert (await lookup(url, victim))["known"] is False
    async with contract_session() as http, http.get(f"{url}/metrics") as response:
        metrics = await response.text()
    assert 'oracular_erase_commands_total{outcome="accepted"} 1' in metrics
    assert worker.stop() == 0
    keys = stored_keys(worker.datadir)
    assert not {v.encode() for v in victims} & keys and sum(map(is_marker, keys)) == 2
    summary = last_summary(worker.log_text())
    assert summary["erasures"] == 2 and summary["dead_lettered"] == 0

    # A backfill of the whole topic, under a fresh app id: the erasures are read ahead.
    app_id = dep.app_id + "-bf"
    done = await run_backfill(dep, app_id, tmp_path / "backfill")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the inputs of 2 erased user(s) skipped" in done.stderr
    ahead = expected_outputs(
        dep.config, stream, until=END_OF_TIME, erased={e.user: e.at for e in erases}
    )
    outputs = [dep.topics.predictions.name + ".bf", dep.topics.episodes.name + ".bf"]
    records = [r for topic in outputs for r in await read_all(kafka, topic)]
    problems = output_problems(records, ahead)
    assert not problems, "\n".join(problems[:10])
    theirs = [decode_output(r.value) for r in records]
    theirs = [m for m in theirs if m["user"] in victims]
    assert sorted(m["type"] for m in theirs) == ["erased", "erased"], theirs[:5]
    changelog = await read_all(kafka, f"{app_id}-{STATE_TABLE}-changelog")
    assert changelog_states(changelog, dep.config) == ahead.states
    assert not set(victims) & set(ahead.states)
