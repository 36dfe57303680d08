"""User ids with characters that URLs reserve, through the owner and through a forward."""

from __future__ import annotations

from urllib.parse import quote

import msgpack
import pytest

from engine import predict
from streams.lookup.serving import partition_for
from tests.streams.test_serving import PARTITIONS, TS, config, get, http, pair, some_events, store

__all__ = ["config", "http", "pair"]  # fixtures

ODD_IDS = ["team/alice", "a b", "ü@example.com", "50%off", "what?now", "#hash", "a+b", "x;y=1"]
AT = TS + 3_600_000


@pytest.mark.parametrize("user", ODD_IDS)
async def test_an_id_with_reserved_characters_is_answered_directly_and_through_a_forward(
    pair, http, config, user
) -> None:
    """The app percent-encodes the id in the path; both workers answer for it, the one that
    does not own it passing the id on unchanged (no double encoding, no path confusion), and
    a reveal posted for it appends a command for exactly that id."""
    a, b = pair
    owner, other = (a, b) if partition_for(user, PARTITIONS) in a.node.local else (b, a)
    want = predict(store(owner, config, user, some_events(user)), "upgrade", AT)
    for worker in (owner, other):
        path = f"/v1/users/{quote(user, safe='')}/intents/upgrade?at={AT}"
        status, body, _ = await get(http, f"{worker.url}{path}")
        assert status == 200, (worker is owner, body)
        assert body["user"] == user and body["known"] is True, body
        assert body["intents"]["upgrade"]["p"] == want.p
    revealed = f"{other.url}/v1/users/{quote(user, safe='')}/revealed"
    async with http.post(revealed, json={"intent": "upgrade"}) as response:
        assert response.status == 202
    [(key, value, partition)] = other.node.appended
    assert key == user.encode() and msgpack.unpackb(value)["user"] == user
    assert partition == partition_for(user, PARTITIONS)


@pytest.mark.parametrize("user", [".", ".."])
async def test_a_dot_segment_id_is_answered_in_a_batch(pair, http, config, user) -> None:
    """HTTP clients and servers drop `.` and `..` path segments, so such an id cannot be
    named in a path; `POST /v1/lookup` takes any id (docs/serving.md says so)."""
    a, b = pair
    owner = a if partition_for(user, PARTITIONS) in a.node.local else b
    want = predict(store(owner, config, user, some_events(user)), "upgrade", AT)
    for worker in (a, b):
        async with http.post(f"{worker.url}/v1/lookup", json={"users": [user], "at": AT}) as r:
            assert r.status == 200
            [result] = (await r.json())["results"]
        assert result["status"] == "found" and result["user"] == user
        assert result["intents"]["upgrade"]["p"] == want.p
