"""The lookup API's front door without a broker: every phase of a connection bounded, every
malformed request a JSON 4xx (streams/lookup/front.py, streams/lookup/api.py).

Workers are the API over fake nodes (tests/streams/test_serving.py), served as the worker
serves it, on 127.0.0.1; clients here are raw sockets where aiohttp's client would be polite.
Every wait is bounded and polls a condition or reads until the server closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.config import load_config
from streams.lookup.front import EVICT_IDLE_S, EVICT_PARTIAL_S, Limits
from streams.lookup.serving import MAX_JSON_DEPTH, partition_for
from streams.settings import APP_HEADER
from streams.settings.peers import Peers
from tests.contract import contract_session
from tests.streams.test_cli_replay import CONFIG
from tests.streams.test_serving import Worker, start_worker, user_on

CLOSE_WAIT_S = 5.0  # a connection the server must close is closed within this (busy box)
TOKEN = "s3cret"
AUTH = f"Authorization: Bearer {TOKEN}\r\n"


@pytest.fixture(scope="module")
def config() -> Any:
    return load_config(CONFIG)


FAST = Limits(
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    keepalive_s=0.8,
    max_requests=3,
    max_connections=8,
    max_body_bytes=4096,
)


async def owning_worker(config: Any, limits: Limits) -> Worker:
    """A worker with the token and `limits` that owns every partition."""
    w = await start_worker(config, token=TOKEN, limits=limits)
    w.node.owners = dict.fromkeys(range(4), w.url)
    w.node.local = dict.fromkeys(range(4), "active")
    return w


@pytest.fixture
async def worker(config: Any) -> AsyncIterator[Worker]:
    """One worker owning every partition, with short limits and a token."""
    w = await owning_worker(config, FAST)
    yield w
    await w.server.close()


def port(worker: Worker) -> int:
    return int(worker.url.rsplit(":", 1)[1])


async def connect(worker: Worker) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port(worker))


async def read_until_closed(reader: asyncio.StreamReader, timeout_s: float = CLOSE_WAIT_S) -> bytes:
    """Everything the server sends until it closes the connection (fails if it does not)."""
    data = b""
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(65536):
            data += chunk
    return data


def parse(raw: bytes) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body) of one HTTP/1.1 answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, json.loads(body) if body else None


async def request(worker: Worker, raw: bytes) -> tuple[int, dict[str, str], Any]:
    """Send `raw` on a new connection and read the one answer (connection: close)."""
    reader, writer = await connect(worker)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(CLOSE_WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers, _ = parse(head)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, json.loads(body) if body else None
    finally:
        writer.close()


def get(path: str, *, auth: str = AUTH, extra: str = "") -> bytes:
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    return f"{head}{auth}{extra}Connection: close\r\n\r\n".encode()


# --- every phase bounded -----------------------------------------------------------------


async def test_a_silent_connection_is_closed_at_the_header_deadline(worker: Worker) -> None:
    reader, writer = await connect(worker)
    started = time.monotonic()
    assert await read_until_closed(reader) == b""
    assert FAST.header_timeout_s * 0.9 <= time.monotonic() - started < CLOSE_WAIT_S
    assert worker.server.guard.closed["header_timeout"] == 1
    writer.close()


async def test_slowloris_headers_are_closed_at_the_header_deadline(worker: Worker) -> None:
    """Headers a few bytes at a time, never complete: closed at the deadline, though bytes
    keep arriving (aiohttp alone waits while they do)."""
    reader, writer = await connect(worker)
    started = time.monotonic()
    closed = asyncio.create_task(read_until_closed(reader))
    writer.write(b"GET /v1/users/u1 HTTP/1.1\r\n")
    for n in range(100):  # bounded: the server closes long before
        if closed.done():
            break
        try:
            writer.write(f"X-Slow-{n}: y\r\n".encode())
            await writer.drain()
        except ConnectionError:
            break
        await asyncio.sleep(0.05)
    assert await closed == b""
    assert time.monotonic() - started < CLOSE_WAIT_S
    writer.close()


def post_head(length: int, path: str = "/v1/lookup") -> bytes:
    """A POST's request line and headers declaring a body of `length` bytes."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}Content-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def answer_to(worker: Worker, raw: bytes) -> tuple[int, dict[str, str], Any, float]:
    """Send `raw`, read until the server closes: (status, headers, body, seconds taken)."""
    reader, writer = await connect(worker)
    try:
        writer.write(raw)
        started = time.monotonic()
        status, headers, body = parse(await read_until_closed(reader))
        return status, headers, body, time.monotonic() - started
    finally:
        writer.close()


async def test_a_huge_declared_body_is_a_413_before_it_is_read(worker: Worker) -> None:
    status, headers, body, took = await answer_to(worker, post_head(1 << 30))
    assert status == 413 and body["status"] == 413 and str(FAST.max_body_bytes) in body["error"]
    assert headers["connection"] == "close" and took < CLOSE_WAIT_S  # then it lingers 0.5 s


async def test_a_body_that_does_not_arrive_is_a_408(worker: Worker) -> None:
    status, headers, body, _ = await answer_to(worker, post_head(100) + b'{"users": [')
    assert status == 408 and "did not arrive" in body["error"]
    assert headers["connection"] == "close"


async def test_keep_alive_is_bounded_in_time_and_requests(worker: Worker) -> None:
    reader, writer = await connect(worker)
    keep = f"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}\r\n".encode()
    closes = []
    for _ in range(FAST.max_requests):
        writer.write(keep)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WAIT_S)
        _, headers, _ = parse(head)
        await reader.readexactly(int(headers["content-length"]))
        closes.append(headers.get("connection", "keep-alive").lower())
    assert closes == ["keep-alive"] * (FAST.max_requests - 1) + ["close"]
    assert await read_until_closed(reader) == b""
    writer.close()
    reader, writer = await connect(worker)  # an idle keep-alive connection
    writer.write(keep)
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLOSE_WAIT_S)
    started = time.monotonic()
    await read_until_closed(reader)
    assert time.monotonic() - started >= FAST.keepalive_s * 0.5
    writer.close()


async def test_at_the_connection_cap_the_oldest_idle_one_makes_room(config: Any) -> None:
    """More silent connections than the cap: the guard never holds more than the cap; while
    they are new, a newcomer gets a JSON 503 (a burst of clients whose requests are on their
    way is not taken for silent ones); once they have been idle EVICT_IDLE_S, an authorized
    lookup answers at once (the oldest silent connection is closed to make room)."""
    user = user_on(1)
    limits = dataclasses.replace(FAST, header_timeout_s=30.0)  # silent: closed by eviction
    worker = await owning_worker(config, limits)
    first = time.monotonic()  # before it, no connection can have been idle EVICT_IDLE_S
    silent = [await connect(worker) for _ in range(FAST.max_connections * 3)]
    try:
        guard = worker.server.guard
        assert len(guard.connections) <= FAST.max_connections
        status, headers, body = await request(worker, get(f"/v1/users/{user}"))
        if time.monotonic() - first < EVICT_IDLE_S:  # else a slow box: already evictable
            assert status == 503 and headers["retry-after"] == "1", body
        # The guard's own clock decides (it accepts a connection when it has room, maybe
        # long after the client's connect on a busy box): wait until one is evictable.
        deadline = time.monotonic() + CLOSE_WAIT_S
        while not any(c.evictable(time.monotonic()) for c in guard.connections):
            assert time.monotonic() < deadline, "no silent connection became evictable"
            await asyncio.sleep(0.05)
        status, _, body = await request(worker, get(f"/v1/users/{user}"))
        assert status == 200 and body["user"] == user
        assert guard.closed["evicted"] >= 1 and len(guard.connections) <= FAST.max_connections
    finally:
        for _, writer in silent:
            writer.close()
        await worker.server.close()


async def fill(worker: Worker, n: int, raw: bytes, state: str) -> list[Any]:
    """`n` connections that each sent `raw`, once the guard sees them all `state` ("busy":
    a request in progress, "heard": part of one came)."""
    conns = []
    for _ in range(n):
        reader, writer = await connect(worker)
        writer.write(raw)
        conns.append((reader, writer))
    deadline = time.monotonic() + CLOSE_WAIT_S
    while sum(getattr(c, state) for c in worker.server.guard.connections) < n:
        assert time.monotonic() < deadline, f"the connections never became {state}"
        await asyncio.sleep(0.01)
    return conns


async def test_when_every_connection_is_busy_a_new_one_gets_a_json_503(worker: Worker) -> None:
    # Each waits for its body: a request in progress.
    busy = await fill(worker, FAST.max_connections, post_head(100), "busy")
    reader, writer = await connect(worker)
    status, headers, body = parse(await read_until_closed(reader))
    assert status == 503 and headers["retry-after"] == "1" and "too many" in body["error"]
    assert headers[APP_HEADER.lower()] == "oracular"
    writer.close()
    for reader, writer in busy:  # their bodies never come: 408 each, and room again
        assert parse(await read_until_closed(reader))[0] == 408
        writer.close()
    status, _, _ = await request(worker, get("/readyz"))
    assert status == 200


async def test_a_storm_of_clients_never_opens_more_sockets_than_the_budget(config: Any) -> None:
    """Far more clients at once than the cap: the API never holds more sockets than its budget
    (the rest wait in the kernel's listen queue, not in the worker's file table); each client
    gets a 200, a JSON 503 or nothing (its connect timed out), and afterwards a lookup
    answers and every socket is released."""
    user = user_on(1)
    worker = await owning_worker(config, FAST)
    guard = worker.server.guard

    async def client() -> int:
        try:
            async with asyncio.timeout(20):
                reader, writer = await connect(worker)
                writer.write(get(f"/v1/users/{user}"))
                data = await read_until_closed(reader, 20)
                writer.close()
        except (OSError, TimeoutError):
            return 0
        return parse(data)[0] if data else 0

    try:
        statuses = Counter(await asyncio.gather(*(client() for _ in range(300))))
        acceptor = guard.acceptor
        assert acceptor is not None
        assert set(statuses) <= {0, 200, 503} and statuses[200] > 0, statuses
        assert 0 < acceptor.most <= guard.budget, (acceptor.most, guard.budget)
        status, _, body = await request(worker, get(f"/v1/users/{user}"))
        assert status == 200 and body["user"] == user
        deadline = time.monotonic() + CLOSE_WAIT_S
        while acceptor.open > 0:
            assert time.monotonic() < deadline, f"{acceptor.open} sockets never released"
            await asyncio.sleep(0.01)
    finally:
        await worker.server.close()


# --- every malformed request a JSON 4xx ----------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Big: " + b"y" * 9000 + b"\r\n\r\n",
        b"GET /livez HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % n for n in range(80)) + b"\r\n",
        b"GET /livez HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
        b"G\x00T /livez HTTP/1.1\r\n\r\n",
    ],
    ids=["garbage", "long-header", "many-headers", "bad-length", "nul"],
)
async def test_aiohttps_parser_errors_are_json(worker: Worker, raw: bytes) -> None:
    reader, writer = await connect(worker)
    writer.write(raw)
    status, headers, body = parse(await read_until_closed(reader))
    assert 400 <= status < 500 and body["status"] == status, body
    assert headers["content-type"].startswith("application/json")
    assert "Traceback" not in json.dumps(body)
    writer.close()


def post(path: str, body: bytes, *, auth: str = AUTH) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


MALFORMED = {
    "deep-batch": post("/v1/lookup", b'{"users": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "deep-reveal": post("/v1/users/u1/revealed", b'{"intent": ' + b"[" * 50_000 + b"}"),
    "just-deep-enough": post(
        "/v1/lookup", b'{"users": ["u1"], "x": ' + b"[" * MAX_JSON_DEPTH + b"]" * 32 + b"}"
    ),
    "lone-surrogate": post("/v1/lookup", b'{"users": ["\\ud800"]}'),
    "lone-surrogate-item": post("/v1/lookup", b'{"users": [{"user": "a\\udfff"}]}'),
    "not-utf8-body": post("/v1/lookup", b'{"users": ["\xff\xfe"]}'),
    "superscript-at": get("/v1/users/u1?at=%C2%B2"),
    "fullwidth-at": get("/v1/users/u1?at=%EF%BC%91%EF%BC%92%EF%BC%93"),
    "arabic-at": get("/v1/users/u1?at=%D9%A1%D9%A2"),
    "padded-at": get("/v1/users/u1?at=%201767261600000"),
    "huge-at": get("/v1/users/u1?at=99999999999999999999999"),
    "year-9999-at": get("/v1/users/u1?at=253402300800000"),
    "undecodable-at": get("/v1/users/u1?at=%ff%fe"),
    "undecodable-flag": get("/v1/users/u1?explain=%ff"),
    "undecodable-user": get("/v1/users/%ff%fe"),
    "surrogate-escape-user": get("/v1/users/%ed%a0%80"),
    "undecodable-intent": get("/v1/users/u1/intents/%ff"),
    "batch-fullwidth-at": post("/v1/lookup", '{"users": ["u1"], "at": "１２"}'.encode()),
    "reveal-fullwidth-ts": post(
        "/v1/users/u1/revealed", '{"intent": "upgrade", "ts": "１"}'.encode()
    ),
    "reveal-float-ts": post("/v1/users/u1/revealed", b'{"intent": "upgrade", "ts": 1e300}'),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_a_malformed_request_is_a_json_4xx(worker: Worker, name: str) -> None:
    status, headers, body = await request(worker, MALFORMED[name])
    assert 400 <= status < 500, (status, body)
    assert headers["content-type"].startswith("application/json") and body["status"] == status
    assert worker.node.appended == []


@pytest.mark.parametrize(
    "value",
    [b"Bearer \xff\xfe", b"\xff", b"Bearer s3cret\xff", b"Bearer " + "s3cr\u00e9t".encode()],
)
async def test_an_authorization_header_that_is_not_utf8_is_a_401(
    worker: Worker, value: bytes
) -> None:
    raw = b"GET /v1/users/u1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + value
    status, _, body = await request(worker, raw + b"\r\nConnection: close\r\n\r\n")
    assert status == 401 and "token" in body["error"]


async def test_an_unexpected_failure_is_internal_error_with_a_logged_id(
    worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> dict[str, Any]:
        msg = "secret detail /etc/passwd"
        raise RuntimeError(msg)

    worker.node.routing = broken  # type: ignore[method-assign]
    status, _, body = await request(worker, get("/v1/routing"))
    assert status == 500 and body == {"error": "internal error", "status": 500, "id": body["id"]}
    logged = [r for r in caplog.records if body["id"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None


# --- the property: no request is a 5xx -------------------------------------------------------


def blocking_exchange(port_: int, raw: bytes) -> bytes:
    """Send `raw` on a new connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port_), timeout=CLOSE_WAIT_S) as sock:
        with contextlib.suppress(ConnectionError):
            sock.sendall(raw)  # no half-close: asyncio closes a connection at its EOF
        data = b""
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):
                data += chunk
        return data


_SEGMENT = st.one_of(
    st.text(max_size=12).map(lambda t: urllib.parse.quote(t, safe="")),
    st.binary(max_size=6).map(lambda b: "".join(f"%{x:02x}" for x in b)),
    st.sampled_from(["u1", ".", "..", "%", "%f", "%zz", "upgrade", "churn", "intents", ""]),
)
_PATH = st.builds(
    lambda prefix, segments: prefix + "/".join(segments),
    st.sampled_from(["/v1/users/", "/v1/lookup", "/v1/", "/livez", "/readyz", "/metrics", "/"]),
    st.lists(_SEGMENT, max_size=4),
)
_QUERY = st.lists(
    st.tuples(
        st.sampled_from(["at", "explain", "stale", "x", "at[]", ""]),
        st.one_of(
            _SEGMENT,
            st.integers(-(10**20), 10**20).map(str),
            st.sampled_from(["true", "no", "１２", "²", "1e3", "-0"]),
        ),
    ),
    max_size=3,
).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))
_HEADER_VALUE = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_HEADERS = st.lists(
    st.tuples(
        st.sampled_from(
            [b"Authorization", b"Content-Type", b"X-Oracular-Forwarded", b"Accept", b"X-Any"]
        ),
        st.one_of(_HEADER_VALUE, st.just(f"Bearer {TOKEN}".encode())),
    ),
    max_size=4,
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_BODY = st.one_of(
    st.binary(max_size=64),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda users, at: json.dumps({"users": users, "at": at}).encode(),
        st.lists(st.one_of(st.text(max_size=8), _JSON), max_size=4),
        st.one_of(st.integers(), st.text(max_size=4), st.none()),
    ),
    st.builds(
        lambda intent, ts: json.dumps({"intent": intent, "ts": ts}).encode(),
        st.sampled_from(["upgrade", "churn", "nope", ""]),
        st.one_of(st.integers(), st.text(max_size=4), st.floats()),
    ),
)


async def test_no_request_is_answered_with_a_5xx(worker: Worker) -> None:
    """Fuzzed methods, paths, query strings, headers and bodies: every answer is below 500,
    and JSON unless it is a HEAD's (no body) or the Prometheus text of /metrics."""
    port_ = port(worker)
    seen: Counter[int] = Counter()

    @settings(
        max_examples=400,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(
        method=st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS"]),
        path=_PATH,
        query=_QUERY,
        headers=_HEADERS,
        body=_BODY,
        auth=st.one_of(st.just(f"Bearer {TOKEN}".encode()), _HEADER_VALUE),
    )
    def one(
        method: bytes, path: str, query: str, headers: list[Any], body: bytes, auth: bytes
    ) -> None:
        target = path.encode() + (b"?" + query.encode() if query else b"")
        lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1"]
        lines += [b"Authorization: " + auth]
        lines += [name + b": " + value for name, value in headers]
        lines += [b"Content-Length: %d" % len(body), b"Connection: close"]
        raw = b"\r\n".join(lines) + b"\r\n\r\n" + body
        answer = blocking_exchange(port_, raw)
        assert answer[:9] in (b"HTTP/1.1 ", b"HTTP/1.0 "), (raw[:300], answer[:300])
        status, head, payload = answer[9:12], *answer.partition(b"\r\n\r\n")[::2]
        seen[int(status)] += 1
        assert int(status) < 500, (raw[:300], answer[:500])
        if method != b"HEAD" and not path.startswith("/metrics"):
            assert b"application/json" in head, (raw[:300], answer[:500])
            json.loads(payload)

    await asyncio.to_thread(one)
    assert {200, 400, 401, 404} <= set(seen), seen  # the fuzzing reached the handlers


def test_the_limits_are_settings_each_bad_value_one_line_naming_its_variable() -> None:
    from streams.settings import SettingsError, load_settings, open_file_limit

    with pytest.raises(SettingsError) as caught:
        load_settings(
            {
                "ORACULAR_API_HEADER_TIMEOUT_S": "0",
                "ORACULAR_API_BODY_TIMEOUT_S": "-1",
                "ORACULAR_API_KEEPALIVE_S": "soon",
                "ORACULAR_API_MAX_REQUESTS_PER_CONNECTION": "0",
                "ORACULAR_API_MAX_CONNECTIONS": str(open_file_limit()),
                "ORACULAR_API_MAX_BODY_BYTES": "0",
            }
        )
    lines = str(caught.value).splitlines()
    assert len(lines) == 6, lines
    for var in (
        "HEADER_TIMEOUT_S",
        "BODY_TIMEOUT_S",
        "KEEPALIVE_S",
        "MAX_REQUESTS_PER_CONNECTION",
        "MAX_CONNECTIONS",
        "MAX_BODY_BYTES",
    ):
        assert sum(f"ORACULAR_API_{var}" in line for line in lines) == 1, (var, lines)
    assert "open-file limit" in next(line for line in lines if "MAX_CONNECTIONS" in line)
    defaults = Limits.from_settings(load_settings({}))
    assert defaults.max_connections == min(1000, open_file_limit() // 4)
    timeouts = (defaults.header_timeout_s, defaults.body_timeout_s, defaults.keepalive_s)
    assert timeouts == (10, 10, 15) and defaults.max_connections <= open_file_limit() // 4
    twenty = load_settings({"ORACULAR_API_MAX_CONNECTIONS": "20"})
    assert Limits.from_settings(twenty).max_connections == 20


# --- safe exposure ---------------------------------------------------------------------------


def test_the_token_settings(tmp_path: Path) -> None:
    from streams.settings import SettingsError, describe, load_settings

    for env, problem in (
        ({"ORACULAR_API_TOKEN": ""}, "ORACULAR_API_TOKEN: set but empty"),
        ({"ORACULAR_API_TOKEN": "  "}, "ORACULAR_API_TOKEN: set but empty"),
        ({"ORACULAR_API_TOKEN": "a b"}, "ORACULAR_API_TOKEN: the token must be printable"),
        ({"ORACULAR_API_TOKEN_FILE": str(tmp_path / "none")}, "cannot read"),
        ({"ORACULAR_API_ALLOW_NO_TOKEN": "maybe"}, "must be true or false"),
        ({"ORACULAR_API_TLS_CERT": "c.pem"}, "set both or neither"),
    ):
        with pytest.raises(SettingsError) as caught:
            load_settings(env)
        lines = str(caught.value).splitlines()
        assert len(lines) == 1 and problem in lines[0], (env, lines)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SettingsError, match=r"ORACULAR_API_TOKEN_FILE: .* is empty"):
        load_settings({"ORACULAR_API_TOKEN_FILE": str(empty)})
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    with pytest.raises(SettingsError, match="set one of them"):
        load_settings({"ORACULAR_API_TOKEN_FILE": str(token_file), "ORACULAR_API_TOKEN": "x"})
    settings = load_settings({"ORACULAR_API_TOKEN_FILE": str(token_file)})
    token_file.write_text("changed later")  # read once, at start
    assert settings.api_token == "from-a-file" and "from-a-file" not in describe(settings)
    assert load_settings({"ORACULAR_API_ALLOW_NO_TOKEN": "true"}).api_allow_no_token is True
    assert load_settings({}).api_allow_no_token is False


def test_a_non_loopback_bind_without_a_token_is_refused_unless_allowed(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from streams.lookup.api import bind, check_exposure
    from streams.settings import Settings

    sock = bind("0.0.0.0", 0)
    loopback = bind("127.0.0.1", 0)
    try:
        with pytest.raises(SystemExit) as caught:
            check_exposure(Settings(api_host="0.0.0.0"), sock)
        assert caught.value.code == 2
        [line] = capsys.readouterr().err.splitlines()
        assert "without a token" in line and "ORACULAR_API_ALLOW_NO_TOKEN=true" in line
        check_exposure(Settings(api_host="0.0.0.0", api_token="t"), sock)
        check_exposure(Settings(), loopback)
        assert capsys.readouterr().err == ""
        for _ in range(2):  # allowed: warned at every start
            check_exposure(Settings(api_host="0.0.0.0", api_allow_no_token=True), sock)
            assert "WARNING" in capsys.readouterr().err
        assert sum("without a token" in r.getMessage() for r in caplog.records) == 2
    finally:
        sock.close()
        loopback.close()


async def test_livez_reveals_nothing(worker: Worker) -> None:
    status, _, body = await request(worker, get("/livez", auth=""))
    assert status == 200 and body == {"live": True}


async def test_a_reveal_dated_beyond_the_max_skew_is_a_400_naming_it(worker: Worker) -> None:
    now = worker.api.clock()
    skew = worker.api.max_skew_ms
    for ts in (253_402_300_799_000, now + skew + 60_000):
        body = json.dumps({"intent": "upgrade", "ts": ts}).encode()
        status, _, answer = await request(worker, post("/v1/users/u1/revealed", body))
        assert status == 400 and "ORACULAR_MAX_SKEW_MS" in answer["error"], answer
    assert worker.node.appended == []
    body = json.dumps({"intent": "upgrade", "ts": now + skew // 2}).encode()
    status, _, answer = await request(worker, post("/v1/users/u1/revealed", body))
    assert status == 202 and len(worker.node.appended) == 1


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made now with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


async def test_the_api_serves_tls_with_a_certificate_and_key(config: Any, tmp_path: Path) -> None:

    from streams.lookup.api import Api, tls_contexts
    from streams.settings import Settings
    from tests.streams.test_serving import FakeNode, serve_api

    cert, key = self_signed(tmp_path)
    settings = Settings(api_tls_cert=cert, api_tls_key=key, api_tls_cafile=cert)
    server_ssl, client_ssl = tls_contexts(settings)
    assert server_ssl is not None and client_ssl is not None
    served = await serve_api(Api(FakeNode(config), token=TOKEN), ssl_context=server_ssl)
    try:
        assert served.url.startswith("https://127.0.0.1:")
        async with contract_session() as http:
            async with http.get(f"{served.url}/livez", ssl=client_ssl) as response:
                assert response.status == 200 and await response.json() == {"live": True}
            plain = served.url.replace("https://", "http://")
            with pytest.raises(Exception):  # noqa: B017 - plain HTTP gets no answer
                async with http.get(f"{plain}/livez") as response:
                    await response.read()
    finally:
        await served.close()
    with pytest.raises(SystemExit):
        tls_contexts(Settings(api_tls_cert=key, api_tls_key=cert))  # swapped: cannot load


# --- forwards ---------------------------------------------------------------------------------


@dataclass
class FakeOwner:
    """An owning worker that answers as told and records what it was sent."""

    answer: Callable[[web.Request], Awaitable[web.StreamResponse]]
    seen: list[dict[str, str]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
async def owner() -> AsyncIterator[FakeOwner]:
    def one(user: str) -> dict[str, Any]:
        position = {"partition": partition_for(user, 4)}
        return {"user": user, "known": False, "position": position, "intents": {}}

    async def fine(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/lookup":
            users = [u["user"] for u in (await request.json())["users"]]
            body = {"results": [{"status": "unknown", **one(u)} for u in users]}
        else:
            body = one(urllib.parse.unquote(request.path.rsplit("/", 1)[-1]))
        return web.json_response(body, headers={APP_HEADER: "oracular"})

    fake = FakeOwner(fine)

    async def handle(request: web.Request) -> web.StreamResponse:
        fake.seen.append(dict(request.headers))
        return await fake.answer(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    yield fake
    await server.close()


async def forwarding(config: Any, owner: FakeOwner, **options: Any) -> Worker:
    """A worker that owns nothing: every lookup is forwarded to `owner`."""
    w = await start_worker(config, **options)
    w.node.owners = dict.fromkeys(range(4), owner.url)
    return w


async def test_a_forward_carries_the_workers_token_never_the_callers(
    config: Any, owner: FakeOwner
) -> None:
    open_worker = await forwarding(config, owner)
    secured = await forwarding(config, owner, token="the-workers-token")
    try:
        caller = "Authorization: Bearer the-callers-secret\r\n"
        status, _, body = await request(open_worker, get("/v1/users/u1", auth=caller))
        assert status == 200 and body["user"] == "u1"
        assert "Authorization" not in owner.seen[-1]  # the caller's token stays here
        auth = "Authorization: Bearer the-workers-token\r\n"
        status, _, _ = await request(secured, get("/v1/users/u1", auth=auth))
        assert status == 200 and owner.seen[-1]["Authorization"] == "Bearer the-workers-token"
        status, _, _ = await request(secured, post("/v1/lookup", b'{"users": ["u1"]}', auth=auth))
        assert status == 200 and owner.seen[-1]["Authorization"] == "Bearer the-workers-token"
    finally:
        await open_worker.server.close()
        await secured.server.close()


async def test_no_forward_to_a_peer_outside_the_allowed_ones(
    config: Any, owner: FakeOwner, caplog: pytest.LogCaptureFixture
) -> None:
    w = await forwarding(config, owner, peers=Peers.parse("10.0.0.0/8, workers.example"))
    try:
        for _ in range(3):
            status, _, body = await request(w, get("/v1/users/u1", auth=""))
            assert status == 502 and "ORACULAR_API_PEERS" in body["error"], body
        assert owner.seen == []
        assert sum("not an allowed peer" in r.getMessage() for r in caplog.records) == 1
    finally:
        await w.server.close()


async def test_a_redirect_from_a_peer_is_not_followed(config: Any, owner: FakeOwner) -> None:
    async def redirect(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/elsewhere"):
            return web.json_response({"user": "u1"}, headers={APP_HEADER: "oracular"})
        raise web.HTTPFound("/elsewhere" + request.path)

    owner.answer = redirect
    w = await forwarding(config, owner)
    try:
        status, _, body = await request(w, get("/v1/users/u1", auth=""))
        assert status == 502 and "HTTP 302" in body["error"]
        assert len(owner.seen) == 1  # the redirect's target was never asked
    finally:
        await w.server.close()


def _answering(status: int, payload: bytes, app: str = "oracular") -> Any:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=payload, status=status, content_type="application/json", headers={APP_HEADER: app}
        )

    return answer


@pytest.mark.parametrize(
    ("status", "payload", "app", "said"),
    [
        (401, b'{"error": "no"}', "oracular", "same ORACULAR_API_TOKEN"),
        (200, b"<html>hello</html>", "oracular", "not JSON"),
        (200, b'{"user": "someone-else", "intents": {}}', "oracular", "another user"),
        (200, b'{"user": "u1", "intents": {}, "position": {"partition": 99}}', "oracular", "part"),
        (200, b'{"user": "u1", "intents": {}, "position": {"partition": 0}}', "other", "app"),
        (500, b'{"error": "internal error"}', "oracular", "HTTP 500"),
    ],
    ids=["token", "not-json", "other-user", "other-partition", "other-app", "500"],
)
async def test_a_peer_answering_401_or_garbage_is_a_502_saying_so_logged_once(
    config: Any,
    owner: FakeOwner,
    caplog: pytest.LogCaptureFixture,
    status: int,
    payload: bytes,
    app: str,
    said: str,
) -> None:
    owner.answer = _answering(status, payload, app)
    user = next(f"u{n}" for n in range(1, 99) if partition_for(f"u{n}", 4) == 0)
    payload = payload.replace(b'"u1"', json.dumps(user).encode())
    owner.answer = _answering(status, payload, app)
    w = await forwarding(config, owner)
    try:
        for _ in range(2):
            code, _, body = await request(w, get(f"/v1/users/{user}", auth=""))
            assert code == 502 and owner.url in body["error"] and said in body["error"], body
        code, _, body = await request(w, post("/v1/lookup", f'{{"users": ["{user}"]}}'.encode()))
        assert code == 502 and owner.url in body["error"], body
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) <= 2 and any(said in m for m in warned), warned  # once per problem
    finally:
        await w.server.close()


async def test_a_batch_partly_on_a_bad_peer_answers_the_rest(config: Any, owner: FakeOwner) -> None:
    owner.answer = _answering(401, b"{}")
    w = await forwarding(config, owner)
    mine = user_on(1)
    w.node.local = {1: "active"}
    try:
        theirs = user_on(2)
        body = json.dumps({"users": [mine, theirs]}).encode()
        status, _, answer = await request(w, post("/v1/lookup", body))
        assert status == 200
        assert [r["status"] for r in answer["results"]] == ["unknown", "error"]
        assert "ORACULAR_API_TOKEN" in answer["results"][1]["error"]
    finally:
        await w.server.close()


def test_the_peers_setting() -> None:
    from streams.settings import SettingsError, load_settings

    peers = Peers.parse("10.0.0.0/8, Worker-1.example, ::1, 192.168.1.7")
    assert peers.allows("x", ["10.2.3.4"]) and peers.allows("worker-1.example", [])
    assert peers.allows("x", ["192.168.1.7"]) and not peers.allows("x", ["192.168.1.8"])
    assert not peers.allows("x", ["10.2.3.4", "8.8.8.8"])  # one address outside: refused
    assert not peers.allows("x", [])  # unresolved: refused
    assert Peers.parse("*").allows("anything", [])
    default = Peers.around(["192.168.1.5"], ["10.2.3.4"])
    assert default.allows("x", ["127.0.0.1"]) and default.allows("x", ["::1"])
    assert default.allows("x", ["192.168.1.5"]) and not default.allows("x", ["192.168.1.6"])
    assert default.allows("x", ["10.2.3.200"]) and not default.allows("x", ["10.2.4.1"])
    with pytest.raises(SettingsError) as caught:
        load_settings({"ORACULAR_API_PEERS": "10.0.0.0/8, http://x"})
    assert str(caught.value) == (
        "ORACULAR_API_PEERS: 'http://x' is not a host name, an address or a CIDR network"
    )


# --- a client knows which app answered -----------------------------------------------------


async def test_every_answer_says_the_app_and_query_checks_it(
    config: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from streams.cli import main

    w = await start_worker(config, app_id="other-app")
    w.node.owners = dict.fromkeys(range(4), w.url)
    w.node.local = dict.fromkeys(range(4), "active")
    try:
        for raw in (get("/v1/users/u1", auth=""), get("/nope", auth=""), b"BAD\r\n\r\n"):
            reader, writer = await connect(w)
            writer.write(raw)
            answer = await read_until_closed(reader)
            writer.close()
            assert f"{APP_HEADER}: other-app".encode() in answer, answer[:300]
        _, _, body = await request(w, get("/v1/users/u1", auth=""))
        assert body["app"] == "other-app"
        for var in ("ORACULAR_APP_ID", "ORACULAR_API_TOKEN", "ORACULAR_API_TOKEN_FILE"):
            monkeypatch.delenv(var, raising=False)
        code = await asyncio.to_thread(main, ["query", "u1", "--url", w.url])
        err = capsys.readouterr().err
        assert code == 69 and "answered by app 'other-app', not app 'oracular'" in err, err
        assert len(err.strip().splitlines()) == 1
        code = await asyncio.to_thread(
            main, ["query", "u1", "--url", w.url, "--app-id", "other-app"]
        )
        out = capsys.readouterr().out
        assert code == 0 and "app other-app" in out, out
        monkeypatch.setenv("ORACULAR_APP_ID", "other-app")
        code = await asyncio.to_thread(main, ["query", "u1", "--url", w.url])
        out = capsys.readouterr().out
        assert code == 0 and "app other-app" in out, out
        code = await asyncio.to_thread(main, ["query", "u1", "--url", w.url, "--app-id", "x"])
        assert code == 69 and "not app 'x'" in capsys.readouterr().err
    finally:
        await w.server.close()


def test_a_taken_default_port_is_said_in_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from streams.lookup.api import bind, bind_api
    from streams.settings import Settings

    holder = bind("127.0.0.1", 0)
    taken = holder.getsockname()[1]
    try:
        sock = bind_api(Settings(), default_port=taken)
        sock.close()
        [line] = capsys.readouterr().err.splitlines()
        assert f"port {taken} on 127.0.0.1 is taken" in line and "ORACULAR_API_PORT" in line
        with pytest.raises(SystemExit) as caught:
            bind_api(Settings(api_port=taken))
        assert caught.value.code == 69
        [line] = capsys.readouterr().err.splitlines()
        assert f"cannot serve the lookup API on 127.0.0.1:{taken}" in line
    finally:
        holder.close()


async def test_a_client_that_never_reads_its_answers_is_closed(config: Any) -> None:
    """Pipelined requests whose answers are never read: once the buffers are full, the
    answer's write waits at most the body deadline, then the connection is closed."""
    limits = dataclasses.replace(FAST, max_requests=200)
    worker = await owning_worker(config, limits)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client reads nothing
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port(worker)))
    _, writer = await asyncio.open_connection(sock=sock)
    ask = (
        f"POST /v1/lookup HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}"
        "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    )
    body = json.dumps({"users": [f"u{n}" for n in range(200)], "explain": True})
    raw = (ask % (len(body), body)).encode()
    guard = worker.server.guard
    deadline = time.monotonic() + CLOSE_WAIT_S * 4
    try:
        for _ in range(limits.max_requests):  # bounded: the connection's request limit
            if guard.closed["write_timeout"]:
                break
            with contextlib.suppress(ConnectionError, TimeoutError):
                writer.write(raw)
                await asyncio.wait_for(writer.drain(), 1.0)
        while not guard.closed["write_timeout"]:
            assert time.monotonic() < deadline, "the server kept waiting for the client"
            await asyncio.sleep(0.05)
    finally:
        writer.close()
        await worker.server.close()


def test_the_default_peers_are_loopback_this_host_and_the_brokers_networks() -> None:
    from streams.lookup.api import allowed_peers, bind
    from streams.settings import Settings

    sock = bind("127.0.0.1", 0)
    try:
        peers = allowed_peers(Settings(broker="10.1.2.3:9092,kafka://10.9.8.7:9093"), sock)
        assert peers.allows("x", ["127.0.0.1"]) and peers.allows("x", ["::1"])
        assert peers.allows("x", ["10.1.2.200"]) and peers.allows("x", ["10.9.8.1"])
        assert not peers.allows("x", ["10.1.3.1"]) and not peers.allows("x", ["8.8.8.8"])
        listed = allowed_peers(Settings(api_peers="192.168.0.0/16"), sock)
        assert listed.allows("x", ["192.168.4.4"]) and not listed.allows("x", ["127.0.0.1"])
    finally:
        sock.close()


async def test_a_connection_whose_request_is_on_its_way_is_not_evicted(config: Any) -> None:
    """At the cap, connections that sent part of a request (a busy worker reads requests
    late; a slow client) are kept for EVICT_PARTIAL_S: a newcomer gets a JSON 503 instead of
    a reset for them; the header deadline still ends the slow ones."""
    limits = dataclasses.replace(FAST, header_timeout_s=EVICT_PARTIAL_S * 3)
    worker = await owning_worker(config, limits)
    started = time.monotonic()
    partial = []
    try:
        partial += await fill(worker, limits.max_connections, b"GET /livez HTTP/1.1\r\n", "heard")
        guard = worker.server.guard
        await asyncio.sleep(max(0.0, started + EVICT_IDLE_S - time.monotonic()))
        status, _, _ = await request(worker, get("/readyz"))
        if time.monotonic() - started < EVICT_PARTIAL_S:  # else a slow box: evictable now
            assert status == 503 and guard.closed["evicted"] == 0
    finally:
        for _, writer in partial:
            writer.close()
        await worker.server.close()


async def test_a_large_answer_from_the_owner_is_read_whole(config: Any, owner: FakeOwner) -> None:
    """A batch answer of several MiB arrives in many chunks: the forward reads all of it."""

    async def big(request: web.Request) -> web.StreamResponse:
        users = [u["user"] for u in (await request.json())["users"]]
        pad = "x" * 4000
        results = [{"status": "unknown", "user": u, "pad": pad} for u in users]
        body = {"at": 5, "counts": {"unknown": len(users)}, "results": results}
        return web.json_response(body, headers={APP_HEADER: "oracular"})

    owner.answer = big
    w = await forwarding(config, owner)
    try:
        users = [f"big-{n}" for n in range(1000)]
        body = json.dumps({"users": users, "at": 5}).encode()
        status, _, answer = await request(w, post("/v1/lookup", body))
        assert status == 200 and [r["user"] for r in answer["results"]] == users
    finally:
        await w.server.close()


async def test_query_posts_a_reveal_and_reads_the_token_file(
    worker: Worker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """`oracular query USER --revealed INTENT` posts the reveal (it could only read before),
    with the token from ORACULAR_API_TOKEN_FILE; the cooldown then shows in a lookup."""
    from streams.cli import main

    for var in ("ORACULAR_APP_ID", "ORACULAR_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    monkeypatch.setenv("ORACULAR_API_TOKEN_FILE", str(token))
    argv = [
        "query",
        "u1",
        "--url",
        worker.url,
        "--revealed",
        "upgrade",
        "--at",
        "2026-01-01T10:00:00Z",
    ]
    assert await asyncio.to_thread(main, argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("reveal of upgrade for u1 at 1767261600000 accepted: command api-"), out
    [(key, value, _)] = worker.node.appended
    assert key == b"u1" and b"revealed" in value
    monkeypatch.delenv("ORACULAR_API_TOKEN_FILE")
    assert await asyncio.to_thread(main, argv) == 2  # no token: 401, said what to set
    assert "ORACULAR_API_TOKEN_FILE" in capsys.readouterr().err
    argv = ["query", "u1", "--url", worker.url, "--revealed", "teleport"]
    monkeypatch.setenv("ORACULAR_API_TOKEN", TOKEN)
    assert await asyncio.to_thread(main, argv) == 2  # an undeclared intent: 400, one line
    assert len(worker.node.appended) == 1
