"""The lookup API of `oracular worker` against the real broker, with two workers.

Every answer is held to `engine.predict` on the offline replay's state of the same user at the
same `at`, whichever worker is asked (one of them forwards to the owner). Workers serve on
free ports (ORACULAR_API_PORT=0); the tests read each worker's URL from its log. Every wait
is bounded by a named timeout and polls a condition.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp import ClientSession, ClientTimeout

from engine import EngineConfig, EngineState, Event, Replayer, predict, timeout_deadline
from infra.broker import REPO_ROOT
from infra.processes import thread_cpus
from streams.lookup.serving import partition_for
from tests.cli import run_oracular
from tests.contract import contract_session

from .conftest import WorkerFactory
from .support import POLL_INTERVAL_S, FaustWorker
from .worker_support import (
    PARTITIONS,
    Deployment,
    TopicReader,
    deployment,
    generate_stream,
    produce_events,
    relocate,
    wait_committed,
    wait_group_stable,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAY_MS = 24 * 3600 * 1000
TOKEN = "integration-token"
EVENT_TIME_ONLY = {"ORACULAR_IDLE_MS": str(10 * 365 * DAY_MS)}  # the wall clock closes nothing

API_URL_TIMEOUT_S = 30.0  # a started worker has logged its API URL
ROUTING_TIMEOUT_S = 60.0  # both workers' routing shows the same two-worker assignment
ANSWER_TIMEOUT_S = 60.0  # a lookup gives the expected answer (after a rebalance, a reveal)
HTTP_TIMEOUT_S = 15.0  # one HTTP request to a worker on a busy 2-core box

API_LINE = re.compile(r"oracular lookup API on \S+, advertised to other workers as (\S+)")
API_PROCESS_LINE = re.compile(r"lookup API process: (\d+)")


def worker_for(faust_worker: WorkerFactory, dep: Deployment, **env: str) -> FaustWorker:
    return faust_worker("streams.worker", app_id=dep.app_id, env=dep.env(**env), argv=dep.argv())


def api_url(worker: FaustWorker) -> str:
    """The worker's API URL, from its log line (it serves on a free port)."""
    deadline = time.monotonic() + API_URL_TIMEOUT_S
    while not (found := API_LINE.findall(worker.log_text(current_run_only=True))):
        if time.monotonic() > deadline:
            msg = f"no API URL in the worker's log within {API_URL_TIMEOUT_S} s:\n"
            raise AssertionError(msg + worker.log_tail())
        time.sleep(POLL_INTERVAL_S)
    return str(found[-1])


def api_pid(worker: FaustWorker) -> int:
    """The pid of the worker's lookup API process, from its log line."""
    api_url(worker)  # logged just before it
    found = API_PROCESS_LINE.findall(worker.log_text(current_run_only=True))
    assert found, worker.log_tail()
    return int(found[-1])


RESERVED_CPU = max(os.sched_getaffinity(0))


def assert_reserved_cpu(worker: FaustWorker) -> None:
    """ORACULAR_API_CPUS=RESERVED_CPU: the API process runs on it alone, and no thread of the
    worker does."""
    assert worker.process is not None
    assert thread_cpus(api_pid(worker)) == {RESERVED_CPU}
    assert thread_cpus(worker.process.pid) == os.sched_getaffinity(0) - {RESERVED_CPU}
    assert "this worker on CPUs" in worker.log_text(current_run_only=True)


def replayed(config: EngineConfig, events: list[Event]) -> dict[str, EngineState]:
    """User -> state after the user's events, as the offline replay applies them."""
    replayer = Replayer(config)
    for event in events:
        replayer.feed(event)
    return replayer.states


def replayed_closes(config: EngineConfig, events: list[Event]) -> list[Any]:
    """The episodes the events close (not the timer's), as the offline replay applies them."""
    replayer = Replayer(config)
    return [step.closed for step in map(replayer.feed, events) if step.closed is not None]


def served_stream(
    kafka: str, request: pytest.FixtureRequest, settings: dict[str, str], **stream: int
) -> tuple[Any, list[Event], dict[str, EngineState], int]:
    """A deployment whose workers serve the API on free ports and close by event time only
    (plus `settings`), a generated stream (`events`, `users`, `seed`), its replayed states,
    and a lookup time two days after its last event."""
    env = {**EVENT_TIME_ONLY, "ORACULAR_API_PORT": "0", **settings}
    dep = deployment(kafka, request.node.name, settings=env)
    events = generate_stream(dep.config, **stream)
    return dep, events, replayed(dep.config, events), events[-1].at + 2 * DAY_MS


def answer_problems(body: dict[str, Any], state: EngineState, at: int) -> list[str]:
    """How a lookup answer differs from engine.predict on the replayed state at `at`."""
    problems = []
    user = body["user"]
    if body["known"] is not True or body["at"] != at:
        problems.append(f"{user}: known={body['known']} at={body['at']}")
    if body["position"]["partition"] != partition_for(user, PARTITIONS):
        problems.append(f"{user}: position {body['position']}")
    # A timer close moves the state's clock to the close time; a read closes the same way.
    if body["as_of"] not in (state.clock, timeout_deadline(state)):
        problems.append(f"{user}: as_of {body['as_of']}, replay clock {state.clock}")
    for intent in state.config.intents:
        want = predict(state, intent, at)
        got = body["intents"][intent]
        expected = [want.p, want.lower, want.reveal, want.suppressed_until]
        shown = [got["p"], got["lower"], got["reveal"], got["suppressed_until"]]
        if shown != expected:
            problems.append(f"{user}.{intent}: got {shown}, predict gives {expected}")
    return problems


async def get_json(
    http: ClientSession, url: str, *, token: str | None = TOKEN
) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.get(url, headers=headers) as response:
        return response.status, await response.json(), response.headers


async def wait_until(check: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    """Poll the coroutine function `check` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = await check()
        if last and last[0]:
            return last
        if time.monotonic() > deadline:
            msg = f"{what} not within {timeout_s:.0f} s; last: {last!r}"[:3000]
            raise AssertionError(msg)
        await asyncio.sleep(POLL_INTERVAL_S)


async def wait_routing(http: ClientSession, urls: list[str]) -> dict[str, str]:
    """Both workers report the same assignment, one generation, every partition owned by one
    of `urls`, each of them owning some; returns partition -> owner URL."""

    async def check() -> tuple[bool, Any]:
        tables = []
        for url in urls:
            status, body, _ = await get_json(http, f"{url}/v1/routing")
            tables.append((status, body))
        bodies = [b for s, b in tables if s == 200]
        ok = (
            len(bodies) == len(urls)
            and all(b["partitions"] == bodies[0]["partitions"] for b in bodies)
            and len({b["generation"] for b in bodies}) == 1
            and set(bodies[0]["partitions"].values()) == set(urls)
            and not any(b["rebalancing"] or b["recovering"] for b in bodies)
        )
        return ok, tables

    _, tables = await wait_until(check, timeout_s=ROUTING_TIMEOUT_S, what="agreed routing")
    return {p: u for p, u in tables[0][1]["partitions"].items()}


def metric(text: str, name: str) -> float:
    """The value of one sample line `name value` of a /metrics text (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_sum(texts: list[str], name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`, over /metrics texts."""
    total = 0.0
    for text in texts:
        for line in text.splitlines():
            found = SAMPLE.match(line)
            if found is None or found[1] != name:
                continue
            have = dict(LABEL.findall(found[2] or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(found[3])
    return total


async def scrape(http: ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200
        return await r.text()


async def test_lookups_through_either_worker_equal_the_replay(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Two workers: every user of a stream, asked through each worker (so half the answers
    take one hop), and in one batch, equals engine.predict on the replayed state; the token
    is enforced; /metrics counts the applied events."""
    dep, events, states, at = served_stream(
        kafka, request, {"ORACULAR_API_TOKEN": TOKEN}, events=3_000, users=200, seed=31
    )
    await dep.create_topics()
    first = worker_for(faust_worker, dep).start()
    second = relocate(worker_for(faust_worker, dep), tmp_path / "second").start()
    urls = [api_url(first), api_url(second)]
    await wait_group_stable(dep, members=2)

    async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
        owners = await wait_routing(http, urls)
        before = [await scrape(http, url) for url in urls]
        assert metric_sum(before, "oracular_inputs_total", outcome="applied") == 0

        # The token: 401 without it or with a wrong one, /livez exempt.
        for url in urls:
            for token in (None, "wrong"):
                status, body, headers = await get_json(http, f"{url}/v1/users/u1", token=token)
                assert status == 401 and "Bearer" in headers["WWW-Authenticate"], body
            status, _, _ = await get_json(http, f"{url}/metrics", token=None)
            assert status == 401
            status, body, _ = await get_json(http, f"{url}/livez", token=None)
            assert status == 200 and body["live"] is True

        await produce_events(kafka, dep.topics.events.name, events)
        await wait_committed(dep)

        problems: list[str] = []
        hops = Counter()
        for n, (user, state) in enumerate(sorted(states.items())):
            asked = urls[n % 2]
            status, body, _ = await get_json(http, f"{asked}/v1/users/{user}?at={at}")
            assert status == 200, (user, body)
            owner = owners[str(partition_for(user, PARTITIONS))]
            assert body["served_by"] == {"worker": owner, "role": "active"}, (user, owner)
            hops[asked != owner] += 1
            problems += answer_problems(body, state, at)
        assert not problems, f"{len(problems)} differences, e.g.:\n" + "\n".join(problems[:10])
        assert hops[True] > 20 and hops[False] > 20, hops  # both direct and forwarded answers

        # One batch of every user through the first worker: one forward for the second's users.
        users = sorted(states)
        async with http.post(
            f"{urls[0]}/v1/lookup",
            json={"users": users, "at": at},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response:
            assert response.status == 200
            batch = await response.json()
        assert [r["user"] for r in batch["results"]] == users
        assert batch["counts"] == {"found": len(users)}
        for result in batch["results"]:
            problems += answer_problems(result, states[result["user"]], at)
        assert not problems, f"{len(problems)} differences, e.g.:\n" + "\n".join(problems[:10])

        # /metrics: the applied events are counted, per partition, lookups too; episodes by
        # reason (sign-outs exactly the replay's: only an input closes one so); Faust's sensor.
        after = [await scrape(http, url) for url in urls]
        applied = metric_sum(after, "oracular_inputs_total", outcome="applied")
        assert applied == len(events), applied
        per_partition = Counter(partition_for(e.user, PARTITIONS) for e in events)
        for partition, count in per_partition.items():
            got = metric_sum(after, "oracular_inputs_total", partition=str(partition))
            assert got == count, (partition, got, count)
        episodes = metric_sum(after, "oracular_outputs_total", kind="episodes")
        assert metric_sum(after, "oracular_episodes_closed_total") == episodes > 0
        assert metric_sum(after, "oracular_episodes_closed_total", reason="end") == sum(
            1 for closed in replayed_closes(dep.config, events) if closed.reason == "end"
        )
        received = metric_sum(after, "faust_messages_received_total", topic=dep.topics.events.name)
        assert received >= len(events), received
        assert metric_sum(after, "oracular_restore_remaining_records", role="active") == 0
        assert all(metric(t, "oracular_batch_seconds_count") > 0 for t in after)
        found = metric(after[0], 'oracular_lookups_total{endpoint="batch",status="found"}')
        assert found == len(users)
        assert metric(after[1], "oracular_ready") == 1

    assert second.stop() == 0
    assert first.stop() == 0


async def test_a_lookup_during_a_rebalance_is_503_or_right_then_right(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Lookups keep coming through the first worker while a second joins and takes partitions:
    each answer is right or a 503 with Retry-After (a 504 if the new owner is still starting),
    and once the group settles every answer is right, served by the new owner."""
    dep, events, states, at = served_stream(
        kafka, request, {"ORACULAR_API_TOKEN": TOKEN}, events=2_000, users=120, seed=32
    )
    # Two users per partition: lookups for partitions that move and ones that stay.
    watched: dict[int, list[str]] = {}
    for user in sorted(states):
        watched.setdefault(partition_for(user, PARTITIONS), []).append(user)
    users = [u for p in range(PARTITIONS) for u in watched[p][:2]]
    await dep.create_topics()
    first = worker_for(faust_worker, dep).start()
    url = api_url(first)
    await produce_events(kafka, dep.topics.events.name, events)
    await wait_committed(dep)

    seen: list[tuple[str, int, Any, Any]] = []
    stop = asyncio.Event()

    async def poll(http: ClientSession) -> None:
        while not stop.is_set():
            for user in users:
                try:
                    status, body, headers = await get_json(http, f"{url}/v1/users/{user}?at={at}")
                except TimeoutError:
                    status, body, headers = 0, {"error": "client timeout"}, {}
                seen.append((user, status, body, headers))
            await asyncio.sleep(0.05)

    async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
        assert all(o == url for o in (await wait_routing(http, [url])).values())
        poller = asyncio.create_task(poll(http))
        second = relocate(worker_for(faust_worker, dep), tmp_path / "second")
        await asyncio.to_thread(second.start)
        second_url = api_url(second)
        await wait_group_stable(dep, members=2)
        owners = await wait_routing(http, [url, second_url])
        moved = {int(p) for p, owner in owners.items() if owner == second_url}
        assert moved, owners

        async def all_right_now() -> tuple[bool, Any]:
            wrong = []
            for user in users:
                status, body, _ = await get_json(http, f"{url}/v1/users/{user}?at={at}")
                owner = owners[str(partition_for(user, PARTITIONS))]
                if status != 200 or body["served_by"]["worker"] != owner:
                    wrong.append((user, status, body))
                else:
                    wrong += answer_problems(body, states[user], at)
            return not wrong, wrong

        await wait_until(all_right_now, timeout_s=ANSWER_TIMEOUT_S, what="every answer right")
        stop.set()
        await poller

    statuses = Counter(status for _, status, _, _ in seen)
    print(f"lookups through the first worker during the rebalance: {dict(statuses)}")
    problems = []
    for user, status, body, headers in seen:
        if status == 200:
            problems += answer_problems(body, states[user], at)
        elif status == 503:
            if headers.get("Retry-After") != "1":
                problems.append(f"{user}: 503 without Retry-After: {body}")
        elif status != 504:
            problems.append(f"{user}: status {status}: {body}")
    assert not problems, "\n".join(problems[:10])
    assert statuses[200] > 0
    assert second.stop() == 0
    assert first.stop() == 0


REVEAL_EVENTS = ["pricing.viewed", "limit.hit", "billing.opened", "seats.viewed"] * 3


async def test_a_reveal_posted_through_the_api_suppresses_and_is_replayed(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """A user the model would prompt now; the app posts the reveal through the API: the next
    lookups show the cooldown (reveal false, suppressed_until = ts + cooldown), and the
    command is on the input topic, so the replay of the topic gives the same answer."""
    dep = deployment(kafka, request.node.name, settings={"ORACULAR_API_PORT": "0"})
    now = int(time.time() * 1000)
    user = "reveal-user"
    events = [
        Event(user, now - 10 * 60_000 + n * 1000, name=name, id=f"r{n}")
        for n, name in enumerate(REVEAL_EVENTS)
    ]
    state = replayed(dep.config, events)[user]
    assert predict(state, "upgrade", now).reveal, "the stream should make upgrade reveal"
    await dep.create_topics()
    worker = worker_for(faust_worker, dep).start()
    url = api_url(worker)
    await produce_events(kafka, dep.topics.events.name, events)

    async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:

        async def applied() -> tuple[bool, Any]:
            status, body, _ = await get_json(http, f"{url}/v1/users/{user}/intents/upgrade")
            return status == 200 and body["as_of"] == state.clock, body

        _, body = await wait_until(applied, timeout_s=ANSWER_TIMEOUT_S, what="the events")
        assert body["intents"]["upgrade"]["reveal"] is True, body
        async with http.post(
            f"{url}/v1/users/{user}/revealed", json={"intent": "teleport"}
        ) as response:
            assert response.status == 400
        async with http.post(f"{url}/v1/users/{user}/revealed", json={"intent": "upgrade"}) as r:
            assert r.status == 202
            posted = await r.json()
        ts = posted["command"]["ts"]
        cooldown = dep.config.intents["upgrade"].cooldown_ms

        async def suppressed() -> tuple[bool, Any]:
            status, body, _ = await get_json(http, f"{url}/v1/users/{user}/intents/upgrade")
            got = body["intents"]["upgrade"] if status == 200 else None
            return bool(got and got["suppressed_until"] is not None), body

        _, body = await wait_until(suppressed, timeout_s=ANSWER_TIMEOUT_S, what="the cooldown")
        got = body["intents"]["upgrade"]
        assert got["reveal"] is False and got["suppressed_until"] == ts + cooldown, body
        assert body["position"]["offset"] == posted["offset"]

    async with TopicReader(kafka, [dep.topics.events.name]) as reader:
        records = await reader.read_to_end()
    commands = [r for r in records if r.key == user.encode()]
    last = msgpack.unpackb(commands[-1].value)
    assert (commands[-1].partition, commands[-1].offset) == (posted["partition"], posted["offset"])
    assert last == posted["command"] and last["type"] == "revealed"
    replay = replayed(
        dep.config, [*events, Event(user, ts, type="revealed", intent="upgrade", id=last["id"])]
    )[user]
    want = predict(replay, "upgrade", body["at"])
    assert (got["p"], got["reveal"], got["suppressed_until"]) == (
        want.p,
        want.reveal,
        want.suppressed_until,
    )
    # `oracular query` without --url finds the worker's free port in its datadir.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORACULAR_")}
    env.update(ORACULAR_APP_ID=dep.app_id, ORACULAR_DATADIR=str(worker.datadir))
    env["PYTHONPATH"] = str(REPO_ROOT)
    found, _ = await asyncio.to_thread(
        run_oracular, "query", user, "--json", env=env, timeout=HTTP_TIMEOUT_S * 3
    )
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["user"] == user
    assert (worker.datadir / "api-url").read_text().strip() == url
    assert worker.stop() == 0
    assert not (worker.datadir / "api-url").exists()  # a clean stop takes it away


async def test_stale_reads_come_from_the_standby_copy(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """With a standby replica, `?stale=true` through the worker that does not own a user is
    answered from its standby copy, without a hop, and (once the changelog is replicated)
    equals the replay."""
    dep, events, states, at = served_stream(
        kafka, request, {"ORACULAR_STANDBY_REPLICAS": "1"}, events=1_500, users=100, seed=33
    )
    await dep.create_topics()
    first = worker_for(faust_worker, dep).start()
    second = relocate(worker_for(faust_worker, dep), tmp_path / "second").start()
    urls = [api_url(first), api_url(second)]
    await wait_group_stable(dep, members=2)

    async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
        owners = await wait_routing(http, urls)
        await produce_events(kafka, dep.topics.events.name, events)
        await wait_committed(dep)

        async def standby_answers() -> tuple[bool, Any]:
            wrong = []
            for user, state in sorted(states.items()):
                owner = owners[str(partition_for(user, PARTITIONS))]
                asked = urls[1] if owner == urls[0] else urls[0]
                status, body, _ = await get_json(
                    http, f"{asked}/v1/users/{user}?at={at}&stale=true", token=None
                )
                if status != 200:
                    wrong.append((user, status, body))
                elif body["served_by"] != {"worker": asked, "role": "standby"}:
                    wrong.append((user, body["served_by"]))
                else:
                    wrong += answer_problems(body, state, at)
            return not wrong, wrong[:5]

        await wait_until(standby_answers, timeout_s=ANSWER_TIMEOUT_S, what="standby answers")
    assert second.stop() == 0
    assert first.stop() == 0


async def test_a_frozen_owner_gives_504_within_the_forward_timeout(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """The owner of a user's partition stops answering (SIGSTOP, its worker and its API
    process): a lookup through the other worker fails with 504 after
    ORACULAR_API_FORWARD_TIMEOUT_S instead of hanging, and is right again once the owner runs
    again."""
    dep, events, states, at = served_stream(
        kafka, request, {"ORACULAR_API_FORWARD_TIMEOUT_S": "1"}, events=600, users=60, seed=34
    )
    await dep.create_topics()
    first = worker_for(faust_worker, dep).start()
    second = relocate(worker_for(faust_worker, dep), tmp_path / "second").start()
    urls = [api_url(first), api_url(second)]
    await wait_group_stable(dep, members=2)

    async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
        owners = await wait_routing(http, urls)
        await produce_events(kafka, dep.topics.events.name, events)
        await wait_committed(dep)
        user = next(
            u for u in sorted(states) if owners[str(partition_for(u, PARTITIONS))] == urls[1]
        )
        assert second.process is not None
        frozen = [second.process.pid, api_pid(second)]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, body, _ = await get_json(http, f"{urls[0]}/v1/users/{user}", token=None)
            elapsed = time.monotonic() - started
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        assert status == 504 and urls[1] in body["error"], body
        assert elapsed < HTTP_TIMEOUT_S / 2, elapsed  # the forward timeout, not the client's

        async def right_again() -> tuple[bool, Any]:
            status, body, _ = await get_json(http, f"{urls[0]}/v1/users/{user}?at={at}", token=None)
            return status == 200 and not answer_problems(body, states[user], at), (status, body)

        await wait_until(right_again, timeout_s=ANSWER_TIMEOUT_S, what="the answer after SIGCONT")
    assert second.stop() == 0
    assert first.stop() == 0


async def test_a_frozen_worker_s_api_process_stops_answering_as_the_owner(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """The API runs in a process of its own: when its worker freezes (SIGSTOP, the worker
    only), the API process goes on answering, but once the worker's status is older than
    STALE_STATUS_S it answers no lookup as the owner (a 503 that says so) and /readyz says
    why; once the worker runs again, the answers are right again."""
    dep, events, states, at = served_stream(kafka, request, {}, events=300, users=30, seed=35)
    await dep.create_topics()
    worker = worker_for(faust_worker, dep).start()
    url = api_url(worker)
    async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
        await produce_events(kafka, dep.topics.events.name, events)
        await wait_committed(dep)
        user = sorted(states)[0]

        async def right() -> tuple[bool, Any]:
            status, body, _ = await get_json(http, f"{url}/v1/users/{user}?at={at}", token=None)
            return status == 200 and not answer_problems(body, states[user], at), (status, body)

        await wait_until(right, timeout_s=ANSWER_TIMEOUT_S, what="the answer before the freeze")
        assert worker.process is not None
        worker.process.send_signal(signal.SIGSTOP)
        try:

            async def refused() -> tuple[bool, Any]:
                status, body, _ = await get_json(http, f"{url}/v1/users/{user}", token=None)
                return status == 503 and "rebalanced or restored" in body["error"], body

            await wait_until(refused, timeout_s=ANSWER_TIMEOUT_S, what="a 503 while frozen")
            status, body, _ = await get_json(http, f"{url}/readyz", token=None)
            assert status == 503 and "no status" in " ".join(body["reasons"]), body
        finally:
            worker.process.send_signal(signal.SIGCONT)
        await wait_until(right, timeout_s=ANSWER_TIMEOUT_S, what="the answer after SIGCONT")
    assert worker.stop() == 0


async def test_lookups_from_the_decoded_cache_equal_lookups_from_the_table(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """The API process decodes a user from its copy of the table on the first lookup and
    answers the next ones from the decoded state, equal to the replay; restarted (and with
    the worker's own cache of decoded users off, and a CPU reserved for its API process) it
    gives the same answers."""
    dep, events, states, at = served_stream(
        kafka, request, {"ORACULAR_API_TOKEN": TOKEN}, events=1_000, users=60, seed=37
    )
    await dep.create_topics()
    worker = worker_for(faust_worker, dep)
    answers: list[dict[str, Any]] = []
    for run in ("cache", "table"):
        if run == "table":
            worker.env["ORACULAR_STATE_CACHE_USERS"] = "0"  # restarted without a cache
            if len(os.sched_getaffinity(0)) > 1:  # a CPU to reserve, one left for the worker
                worker.env["ORACULAR_API_CPUS"] = str(RESERVED_CPU)
        url = api_url(worker.start())
        if "ORACULAR_API_CPUS" in worker.env:
            assert_reserved_cpu(worker)
        async with contract_session(timeout=ClientTimeout(total=HTTP_TIMEOUT_S)) as http:
            await wait_routing(http, [url])
            if run == "cache":
                await produce_events(kafka, dep.topics.events.name, events)
            await wait_committed(dep)
            problems: list[str] = []
            bodies = {}
            for user, state in [*sorted(states.items()), *sorted(states.items())]:
                status, body, _ = await get_json(http, f"{url}/v1/users/{user}?at={at}")
                assert status == 200, (user, body)
                problems += answer_problems(body, state, at)
                del body["served_by"]  # the restarted worker serves on another port
                # The timer may close an idle episode between the runs, which moves the
                # user's clock (`as_of`) to the close; the answer at `at` is the same.
                del body["as_of"]
                bodies[user] = body
            assert not problems, f"{len(problems)} differences, e.g.:\n" + "\n".join(problems[:10])
            answers.append(bodies)
            text = await scrape(http, url)
        reads = {
            source: metric(text, f'oracular_lookup_reads_total{{source="{source}"}}')
            for source in ("cache", "table")
        }
        # Each user decoded on its first read; a second read answers from the decoded state
        # unless the worker wrote the user in between (a tick's write): never neither.
        assert reads["table"] >= len(states) and reads["cache"] > 0, reads
        assert reads["table"] + reads["cache"] == 2 * len(states), reads
        assert worker.stop() == 0
    assert answers[0] == answers[1]
