"""The lookup API against a web page that uses its reader's browser (streams/lookup/crosssite.py),
attacked as such a page would: raw requests on loopback, the headers a browser sends.

Without a token (a loopback API, the default), a page could post a "simple" reveal, read
through DNS rebinding, or send from its own origin; each is refused, and the same request
from a client that is not a browser still works. Also: HTTP/1.0 with a Transfer-Encoding is
answered and closed (RFC 9112 6.1), and JSON bodies naming a key twice are refused.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from schemas.config import load_config
from streams.settings import SettingsError, load_settings
from streams.settings.hosts import Hosts, problems
from tests.streams.test_cli_replay import CONFIG
from tests.streams.test_front import CLOSE_WAIT_S, connect, parse, port, read_until_closed
from tests.streams.test_serving import Worker, start_worker

EVIL = "http://attacker.example"


@pytest.fixture(scope="module")
def config() -> Any:
    return load_config(CONFIG)


@pytest.fixture
async def open_worker(config: Any) -> AsyncIterator[Worker]:
    """A worker without a token (as a loopback API is by default) owning every partition."""
    w = await start_worker(config, hosts=Hosts.of("api.internal", ["box-1"]))
    w.node.owners = dict.fromkeys(range(4), w.url)
    w.node.local = dict.fromkeys(range(4), "active")
    yield w
    await w.server.close()


async def raw_answer(worker: Worker, raw: bytes) -> bytes:
    """`raw` on a new connection; what the server sends until it closes."""
    reader, writer = await connect(worker)
    try:
        writer.write(raw)
        await writer.drain()
        return await read_until_closed(reader)
    finally:
        writer.close()


async def send(worker: Worker, raw: bytes) -> tuple[int, dict[str, str], Any]:
    """`raw` on a new connection; the (JSON) answer."""
    return parse(await raw_answer(worker, raw))


def req(
    worker: Worker,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    host: str | None = None,
    headers: dict[str, str] | None = None,
    version: str = "1.1",
) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", f"Host: {host or f'127.0.0.1:{port(worker)}'}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


REVEAL = json.dumps({"intent": "upgrade"}).encode()


async def test_a_simple_cross_site_reveal_is_refused_and_nothing_is_written(open_worker):
    """What a page's `fetch(url, {method: "POST", body})` sends without a preflight: a
    text/plain body and its own Origin. Refused (415), nothing appended; without the Origin,
    still 415: a POST must be JSON."""
    w = open_worker
    for headers in (
        {"Content-Type": "text/plain;charset=UTF-8", "Origin": EVIL},
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {},
    ):
        status, _, body = await send(
            w, req(w, "POST", "/v1/users/u1/revealed", REVEAL, headers=headers)
        )
        assert status == 415, (headers, body)
        assert "application/json" in body["error"]
    assert w.node.appended == []


async def test_a_foreign_origin_is_refused_even_with_json_and_the_own_origin_is_served(open_worker):
    w = open_worker
    own = f"http://127.0.0.1:{port(w)}"
    for origin in (EVIL, "null", f"http://127.0.0.1:{port(w) + 1}", f"https://127.0.0.1:{port(w)}"):
        headers = {"Content-Type": "application/json", "Origin": origin}
        status, _, body = await send(
            w, req(w, "POST", "/v1/users/u1/revealed", REVEAL, headers=headers)
        )
        assert status == 403, (origin, body)
        status, _, _ = await send(w, req(w, "GET", "/v1/users/u1", headers={"Origin": origin}))
        assert status == 403, origin
    assert w.node.appended == []
    headers = {"Content-Type": "application/json; charset=utf-8", "Origin": own}
    status, _, _ = await send(w, req(w, "POST", "/v1/users/u1/revealed", REVEAL, headers=headers))
    assert status == 202
    assert len(w.node.appended) == 1


async def test_dns_rebinding_gets_no_user_data_but_probes_and_own_names_do(open_worker):
    """A rebound name in Host: 421 on /v1/; addresses, localhost, the configured and own
    names are served; health and metrics answer any name."""
    w = open_worker
    p = port(w)
    for host in (f"attacker.example:{p}", "attacker.example", f"127.0.0.1.attacker.example:{p}"):
        status, _, body = await send(w, req(w, "GET", "/v1/users/u1", host=host))
        assert status == 421, (host, body)
        assert "ORACULAR_API_HOSTS" in body["error"]
        status, _, _ = await send(w, req(w, "GET", "/v1/routing", host=host))
        assert status == 421
        for probe in ("/livez", "/readyz", "/metrics"):
            raw = await raw_answer(w, req(w, "GET", probe, host=host))
            assert int(raw.split()[1]) != 421, probe
    for host in (
        f"127.0.0.1:{p}",
        f"localhost:{p}",
        "LOCALHOST.",
        f"[::1]:{p}",
        f"10.1.2.3:{p}",
        f"api.internal:{p}",
        "Box-1",
        f"app.localhost:{p}",
    ):
        status, _, body = await send(w, req(w, "GET", "/v1/users/u1", host=host))
        assert status == 200, (host, body)
    status, _, _ = await send(w, req(w, "GET", "/v1/users/u1", host="127.0.0.1:http"))
    assert status == 400


async def test_any_name_with_a_star(config):
    w = await start_worker(config, hosts=Hosts.of("*"))
    w.node.owners = dict.fromkeys(range(4), w.url)
    w.node.local = dict.fromkeys(range(4), "active")
    try:
        status, _, _ = await send(w, req(w, "GET", "/v1/users/u1", host="attacker.example"))
        assert status == 200
    finally:
        await w.server.close()


async def test_http_1_0_with_a_transfer_encoding_is_answered_and_closed(open_worker):
    """RFC 9112 6.1: the framing is faulty; the connection must close, not be kept alive."""
    w = open_worker
    reader, writer = await connect(w)
    try:
        writer.write(
            (
                f"POST /v1/lookup HTTP/1.0\r\nHost: 127.0.0.1:{port(w)}\r\n"
                "Connection: keep-alive\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n"
                '11\r\n{"users": ["u1"]}\r\n0\r\n\r\n'
                f"GET /v1/users/u1 HTTP/1.1\r\nHost: 127.0.0.1:{port(w)}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        raw = await read_until_closed(reader, CLOSE_WAIT_S)
    finally:
        writer.close()
    # one answer, then closed: the GET after it is not served
    assert len(re.findall(rb"^HTTP/1\.\d \d{3} ", raw, re.MULTILINE)) == 1, raw
    assert parse(raw)[0] == 400


@pytest.mark.parametrize(
    "body",
    [
        '{"users": ["u1"], "users": ["u2"]}',
        '{"users": [{"user": "u1", "user": "u2"}]}',
        '{"users": [{"user": "u1", "intents": ["upgrade"], "intents": []}, {"user": "u2"}]}',
        '{"users": ["u1"], "at": 5, "at": 6}',
        '{"users": ["u1"], "explain": true, "explain": false}',
        '{"users": ["u1"], "\\u0075sers": ["u2"]}',
        '{"users": [{"user": "u1", "\\u0075ser": "u2"}]}',
    ],
)
async def test_a_json_body_naming_a_key_twice_is_refused(open_worker, body):
    """Which copy counts differs between parsers (msgspec and json keep the last); the input
    path refuses such bodies, and so does the API, on its fast path too."""
    w = open_worker
    headers = {"Content-Type": "application/json"}
    status, _, answer = await send(w, req(w, "POST", "/v1/lookup", body.encode(), headers=headers))
    assert status == 400, answer
    assert "appears more than once" in answer["error"]


async def test_a_reveal_naming_a_key_twice_is_refused(open_worker):
    w = open_worker
    body = b'{"intent": "upgrade", "intent": "churn"}'
    headers = {"Content-Type": "application/json"}
    status, _, answer = await send(
        w, req(w, "POST", "/v1/users/u1/revealed", body, headers=headers)
    )
    assert status == 400 and "appears more than once" in answer["error"]
    assert w.node.appended == []


async def test_well_formed_bodies_still_take_the_fast_path_and_answer(open_worker):
    """A user named like a key, and escapes, go the full path and are answered alike."""
    w = open_worker
    headers = {"Content-Type": "application/json"}
    for users in (["u1", "u2"], ["users", "at"], [{"user": "user"}], ["caf\u00e9"]):
        body = json.dumps({"users": users}).encode()
        status, _, answer = await send(w, req(w, "POST", "/v1/lookup", body, headers=headers))
        assert status == 200, (users, answer)
        assert len(answer["results"]) == len(users)


def test_the_hosts_setting_is_checked_one_message_per_problem(monkeypatch):
    assert problems("api.internal, *, box-1") == []
    assert len(problems("http://x, a:80,, /p")) == 4
    monkeypatch.setenv("ORACULAR_API_HOSTS", "http://api.internal")
    with pytest.raises(SettingsError, match="ORACULAR_API_HOSTS"):
        load_settings()


async def test_processing_goes_on_while_pages_attack(open_worker):
    """Refusals are cheap and bounded: a burst of each attack, then a client is answered."""
    w = open_worker
    attacks = [
        req(w, "POST", "/v1/users/u1/revealed", REVEAL, headers={"Origin": EVIL}),
        req(w, "GET", "/v1/users/u1", host="attacker.example"),
        req(w, "GET", "/v1/users/u1", headers={"Origin": "null"}),
    ]
    answers = await asyncio.gather(*(send(w, attacks[n % 3]) for n in range(60)))
    assert {status for status, _, _ in answers} <= {415, 421, 403}
    status, _, _ = await send(w, req(w, "GET", "/v1/users/u1"))
    assert status == 200
    assert w.node.appended == []


async def test_at_takes_iso_8601_as_oracular_query_does(open_worker):
    """`query --at` took ISO-8601 and the API digits only; both take both now."""
    w = open_worker
    for at in ("1767261600000", "2026-01-01T10:00:00Z"):
        status, _, body = await send(w, req(w, "GET", f"/v1/users/u1?at={at}"))
        assert status == 200 and body["at"] == 1_767_261_600_000, body
        batch = json.dumps({"users": ["u1"], "at": at}).encode()
        headers = {"Content-Type": "application/json"}
        status, _, body = await send(w, req(w, "POST", "/v1/lookup", batch, headers=headers))
        assert status == 200 and body["at"] == 1_767_261_600_000, body
    for bad in ("soon", "2026-13-01T00:00:00Z", "-5", "1e3"):
        status, _, body = await send(w, req(w, "GET", f"/v1/users/u1?at={bad}"))
        assert status == 400 and "at must be" in body["error"], body
