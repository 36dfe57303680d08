"""Hostile clients against a real worker's lookup API (issue 32, docs/serving.md "Limits").

One worker, limited to 1,024 open files as many hosts limit a service, consumes a steady
stream of inputs while the test attacks its API from 127.0.0.1: a flood of silent
(half-open) connections larger than its file limit, slowloris headers, a 1 GB declared body
with no body, 2,000 concurrent clients. After each attack: an authorized lookup answers within
a second, `/readyz` answers, the worker and its lookup API process (which serves the
connections) each held less than three quarters of the file limit during it (sampled from
/proc: the old code reached the limit, 1,024, in the flood and the storm), and the worker
applied inputs during the attack (counted from `/metrics`). The table of attacks is printed.

Every loop is bounded in count and time; every wait polls a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from streams.lookup.front import EVICT_IDLE_S

from .conftest import WorkerFactory
from .support import POLL_INTERVAL_S
from .test_serving import EVENT_TIME_ONLY, api_pid, api_url, metric_sum
from .worker_support import deployment, encode_event, generate_stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "hostile-token"
WORKER_FILES = 1024  # the worker's open-file limit (ulimit -n), as on many hosts
HEADER_TIMEOUT_S = 2.0
LIMITS = {
    "ORACULAR_API_TOKEN": TOKEN,
    "ORACULAR_API_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    "ORACULAR_API_BODY_TIMEOUT_S": "2",
    "ORACULAR_API_KEEPALIVE_S": "2",
    "ORACULAR_API_PORT": "0",
}
FLOOD = 1_500  # silent connections: more than the worker's file limit
SLOW = 300  # slowloris connections
HUGE = 50  # 1 GB declared bodies
CLIENTS = 2_000  # concurrent clients
INPUT_RATE = 200  # inputs a second produced during the test
LOOKUP_S = 1.0  # an authorized lookup answers within this once the offenders are gone
CONNECT_TIMEOUT_S = 5.0  # one connect of an attack (old code: the accept queue is full)
OFFENDERS_GONE_S = HEADER_TIMEOUT_S + 15.0  # the worker closed every offender by then
ATTACK_TIMEOUT_S = 60.0  # one attack, start to end, on a busy 2-core box
READY_TIMEOUT_S = 90.0
INPUT_WAIT_S = 15.0  # after a short attack, the worker applies the inputs still arriving


def raise_own_file_limit(needed: int) -> None:
    """The test process holds the attack's sockets: raise its soft limit (or skip)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 512
    if soft >= want:
        return
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the attacks need {want} open files; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Api:
    """The worker's API from 127.0.0.1: raw HTTP/1.1, one connection per request."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), CONNECT_TIMEOUT_S
        )

    async def ask(self, path: str, *, timeout_s: float) -> tuple[int, bytes]:
        """GET `path` with the token: (status, body); status 0 when the connection failed."""
        raw = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                try:
                    writer.write(raw)
                    answer = await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return 0, b""
        head, _, body = answer.partition(b"\r\n\r\n")
        try:
            return int(head.split(b" ", 2)[1]), body
        except (IndexError, ValueError):
            return 0, answer

    async def metrics(self) -> str:
        status, body = await self.ask("/metrics", timeout_s=10.0)
        assert status == 200, status
        return body.decode()

    async def applied(self) -> float:
        return metric_sum([await self.metrics()], "oracular_inputs_total", outcome="applied")


async def closed_by_server(
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], timeout_s: float
) -> int:
    """Wait until the server has closed each connection (EOF or reset); how many it had not
    closed by `timeout_s`."""

    async def gone(reader: asyncio.StreamReader) -> bool:
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass
        return True

    results = await asyncio.gather(
        *(asyncio.wait_for(gone(r), timeout_s) for r, _ in conns), return_exceptions=True
    )
    for _, writer in conns:
        writer.close()
    return sum(1 for r in results if r is not True)


async def open_many(api: Api, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """Up to `n` connections, 100 at a time (those that cannot connect are left out)."""
    conns: list[Any] = []
    deadline = time.monotonic() + ATTACK_TIMEOUT_S
    while len(conns) < n and time.monotonic() < deadline:
        chunk = await asyncio.gather(
            *(api.connect() for _ in range(min(100, n - len(conns)))), return_exceptions=True
        )
        conns += [c for c in chunk if not isinstance(c, BaseException)]
        if all(isinstance(c, BaseException) for c in chunk):
            break
    return conns


async def half_open_flood(api: Api) -> dict[str, Any]:
    conns = await open_many(api, FLOOD)
    # Still during the flood (before the header deadline), once its connections have been
    # silent long enough to be closed for a newcomer.
    await asyncio.sleep(EVICT_IDLE_S)
    status, _ = await api.ask("/v1/users/u1", timeout_s=LOOKUP_S)
    left = await closed_by_server(conns, OFFENDERS_GONE_S)
    return {"opened": len(conns), "lookup during": status, "not closed by server": left}


async def slowloris(api: Api) -> dict[str, Any]:
    conns = await open_many(api, SLOW)
    started = time.monotonic()

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"GET /v1/users/u1 HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for n in range(int(OFFENDERS_GONE_S / 0.5)):  # bounded: the server closes first
            await asyncio.sleep(0.5)
            if writer.is_closing():
                return
            writer.write(b"X-Slow-%d: y\r\n" % n)
            with contextlib.suppress(OSError):
                await writer.drain()

    trickles = [asyncio.create_task(trickle(w)) for _, w in conns]
    left = await closed_by_server(conns, OFFENDERS_GONE_S)
    for task in trickles:
        task.cancel()
    await asyncio.gather(*trickles, return_exceptions=True)
    return {
        "opened": len(conns),
        "not closed by server": left,
        "seconds": time.monotonic() - started,
    }


async def huge_declared_body(api: Api) -> dict[str, Any]:
    raw = (
        f"POST /v1/lookup HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n"
    ).encode()
    conns = await open_many(api, HUGE)
    answers: Counter[bytes] = Counter()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(OFFENDERS_GONE_S):
                answers[(await reader.readline())[9:12]] += 1
                return
        answers[b"none"] += 1

    await asyncio.gather(*(one(r, w) for r, w in conns))
    for _, writer in conns:
        writer.close()
    return {"sent": len(conns), "answers": dict(answers)}


async def many_clients(api: Api) -> dict[str, Any]:
    outcomes = await asyncio.gather(
        *(api.ask("/v1/users/u1", timeout_s=ATTACK_TIMEOUT_S) for _ in range(CLIENTS))
    )
    return {"clients": CLIENTS, "answers": dict(Counter(status for status, _ in outcomes))}


Attack = tuple[str, Callable[[Api], Awaitable[dict[str, Any]]]]
ATTACKS: list[Attack] = [
    ("half-open flood", half_open_flood),
    ("slowloris", slowloris),
    ("1 GB declared body", huge_declared_body),
]
STORM: list[Attack] = [("2,000 concurrent clients", many_clients)]
FUZZ_S = float(os.environ.get("ORACULAR_FUZZ_SECONDS", "40"))
"""The schemathesis run's time budget (`make chaos` runs a longer one)."""
FUZZ_EXAMPLES = 25  # test cases per operation and phase, at most
CONFORMANCE = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_headers_conformance,response_schema_conformance"
)
"""The stateless checks: no 5xx, and every status, content type, header and body as the
OpenAPI document says."""


def fuzz(seconds: float, workdir: Path) -> Callable[[Api], Awaitable[dict[str, Any]]]:
    """An attack: schemathesis generates requests from the worker's own /openapi.json for
    `seconds` (its examples, coverage and fuzzing phases) and checks every answer."""

    async def schemathesis(api: Api) -> dict[str, Any]:
        reports = workdir / "schemathesis"
        command = [
            str(Path(sys.executable).with_name("schemathesis")),
            "run",
            f"{api.url}/openapi.json",
            f"--checks={CONFORMANCE}",
            "--phases=examples,coverage,fuzzing",
            f"--max-examples={FUZZ_EXAMPLES}",
            f"--max-time={max(1, int(seconds))}",
            "--request-timeout=10",
            "--generation-database=none",
            "--no-color",
            "--report=json",
            f"--report-dir={reports}",
            "-H",
            f"Authorization: Bearer {TOKEN}",
        ]
        process = await asyncio.create_subprocess_exec(
            *command, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            async with asyncio.timeout(seconds + FUZZ_MARGIN_S):
                output, _ = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        text = output.decode(errors="replace")
        [report] = list(reports.glob("*.json")) or [None]
        assert report is not None, (
            f"schemathesis wrote no report (exit {process.returncode}):\n{text}"
        )
        found = json.loads(report.read_text())
        return {
            "exit": process.returncode,
            "operations tested": found["operations"]["tested"],
            "test cases": found["test_cases"]["generated"],
            "failures": len(found["failures"]) + found["test_cases"]["with_failures"],
            "errors": len(found["errors"]),
            "output": text[-4000:] if process.returncode else "",
        }

    return schemathesis


FUZZ_MARGIN_S = 60.0
"""Beyond its budget, what schemathesis may take to start and to finish its last cases."""
"""Before the API accepted connections itself (streams.lookup.front.Acceptor), the storm took the
worker to its open-file limit in 2 of 3 runs on a busy 2-core CI machine: asyncio's server
accepted sockets on every turn of a starved loop faster than they were admitted or closed."""


@contextlib.asynccontextmanager
async def open_files(pid: int) -> AsyncIterator[list[int]]:
    """The most file descriptors process `pid` held while the block ran ([most]), sampled
    every 20 ms from /proc."""
    most = [0]

    async def sample() -> None:
        while True:  # until cancelled at the block's end (bounded by the attack's timeout)
            with contextlib.suppress(OSError):
                most[0] = max(most[0], len(os.listdir(f"/proc/{pid}/fd")))
            await asyncio.sleep(0.02)

    task = asyncio.create_task(sample())
    try:
        yield most
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def steady_input(kafka: str, topic: str, events: list[Any]) -> AsyncIterator[None]:
    """Produce `events` at INPUT_RATE a second in the background (bounded by their count)."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka, linger_ms=5)
    await producer.start()

    async def feed() -> None:
        for n, event in enumerate(events):
            key, value = encode_event(event)
            await producer.send(topic, value, key=key)
            if n % 20 == 19:
                await asyncio.sleep(20 / INPUT_RATE)

    task = asyncio.create_task(feed())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await producer.stop()


async def test_hostile_clients_cannot_stop_the_api_or_the_worker(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """The half-open flood, slowloris and huge declared bodies."""
    table = await attack_a_worker(kafka, request, faust_worker, ATTACKS)
    flood = table[0][1]
    assert flood["opened"] >= FLOOD * 0.9 and flood["lookup during"] == 200, table
    assert table[2][1]["answers"] == {b"413": HUGE}, table


async def test_a_storm_of_clients_cannot_stop_the_api_or_the_worker(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """2,000 concurrent clients."""
    table = await attack_a_worker(kafka, request, faust_worker, STORM)
    answers = table[0][1]["answers"]
    # 503: refused at the cap with a JSON answer; 0: a reset, beyond the lingering refusals,
    # or a connection whose request had not come 0.5 s after it was accepted when room was
    # needed (on a starved box, this process's 2,000 clients are that slow to send: then none
    # is answered 200); never another status, never a worker down.
    assert set(answers) <= {0, 200, 503}, table


async def test_a_schemathesis_run_finds_no_5xx_and_no_answer_outside_the_document(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Requests generated from the worker's OpenAPI document, while input flows."""
    await fuzz_a_worker(kafka, request, faust_worker, tmp_path, FUZZ_S)


async def fuzz_a_worker(
    kafka: str,
    request: pytest.FixtureRequest,
    faust_worker: WorkerFactory,
    workdir: Path,
    seconds: float,
) -> dict[str, Any]:
    """A schemathesis run of `seconds` on a worker (`attack_a_worker`): every operation
    tested, no failure (a 5xx, or an answer the document does not allow), no error."""
    attack = ("schemathesis", fuzz(seconds, workdir))
    table = await attack_a_worker(
        kafka, request, faust_worker, [attack], timeout_s=seconds + FUZZ_MARGIN_S * 2
    )
    seen = table[0][1]
    assert seen["operations tested"] == OPERATIONS and seen["test cases"] > 0, seen
    assert seen["failures"] == 0 and seen["errors"] == 0 and seen["exit"] == 0, seen["output"]
    return seen


OPERATIONS = 9
"""The document's operations but /openapi.json itself (schemathesis leaves the schema's own
URL out)."""


async def attack_a_worker(
    kafka: str,
    request: pytest.FixtureRequest,
    faust_worker: WorkerFactory,
    attacks: list[Attack],
    *,
    timeout_s: float = ATTACK_TIMEOUT_S * 2,
) -> list[tuple[Any, ...]]:
    """Run `attacks` one after another on a worker limited to WORKER_FILES open files while
    input flows; check after each that lookups, /readyz and input went on, that the server
    closed every connection it should, and that the worker stayed well below its file limit.
    Returns the table (name, what the attack saw, lookup, its time, ready, applied, took)."""
    raise_own_file_limit(max(FLOOD, CLIENTS))
    dep = deployment(kafka, request.node.name, settings={**EVENT_TIME_ONLY, **LIMITS})
    await dep.create_topics()
    argv = ["prlimit", f"--nofile={WORKER_FILES}:{WORKER_FILES}", "--", *dep.argv()]
    worker = faust_worker("streams.worker", app_id=dep.app_id, env=dep.env(), argv=argv).start()
    assert worker.process is not None  # prlimit runs the worker in its own process (exec)
    api = Api(api_url(worker))
    api_process = api_pid(worker)  # the lookup API's own process (the same file limit)
    # Input for the whole run (a long fuzz included), at INPUT_RATE.
    count = max(40_000, int(INPUT_RATE * timeout_s))
    events = generate_stream(dep.config, events=count, users=400, seed=41)
    table = []
    async with steady_input(kafka, dep.topics.events.name, events):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while (await api.ask("/readyz", timeout_s=10.0))[0] != 200 or await api.applied() == 0:
            assert time.monotonic() < deadline, "the worker never became ready and applied input"
            await asyncio.sleep(POLL_INTERVAL_S)
        for name, attack in attacks:
            before = await api.applied()
            started = time.monotonic()
            async with open_files(worker.process.pid) as most, open_files(api_process) as api_most:
                seen = await asyncio.wait_for(attack(api), timeout_s)
            seen["most open files"] = most[0]
            seen["API process's most open files"] = api_most[0]
            asked = time.monotonic()
            lookup, _ = await api.ask("/v1/users/u1", timeout_s=LOOKUP_S)
            lookup_s = time.monotonic() - asked
            ready, _ = await api.ask("/readyz", timeout_s=LOOKUP_S)
            # Inputs applied since the attack began (a short attack: until some are, bounded).
            deadline = time.monotonic() + INPUT_WAIT_S
            while (applied := await api.applied() - before) == 0 and time.monotonic() < deadline:
                await asyncio.sleep(POLL_INTERVAL_S)
            table.append((name, seen, lookup, lookup_s, ready, applied, time.monotonic() - started))
    text = "\n".join(
        f"{name}: {seen}; then lookup {lookup} in {lookup_s * 1000:.0f} ms, /readyz {ready}; "
        f"{applied:.0f} inputs applied during the {took:.1f} s"
        for name, seen, lookup, lookup_s, ready, applied, took in table
    )
    print(f"\nattacks on {api.url} (worker limited to {WORKER_FILES} open files):\n{text}")
    log = worker.log_text()
    worker.stop()
    # The settings are logged at start (docs/operations.md), the token never.
    assert "oracular worker settings:" in log and "api_host = 127.0.0.1" in log
    assert TOKEN not in log
    for name, seen, lookup, _, ready, applied, _ in table:
        assert lookup == 200 and ready == 200, f"{name}: {text}"
        assert applied > 0, f"{name}: no input applied during the attack:\n{text}"
        assert seen.get("not closed by server", 0) == 0, f"{name}: {text}"
    for name, seen, *_ in table:  # the API's budget: 1.5 times its cap (a quarter of the
        # limit), the rest the worker's own files (RocksDB, Kafka, logs): room left
        assert seen["most open files"] < WORKER_FILES * 3 // 4, f"{name}: {text}"
        assert seen["API process's most open files"] < WORKER_FILES * 3 // 4, f"{name}: {text}"
    assert "out of system resource" not in log and "Too many open files" not in log, log[-3000:]
    return table
