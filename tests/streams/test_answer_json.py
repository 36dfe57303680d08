"""`answer_json` writes the bytes `json.dumps` writes: floats, escapes, whole batch answers."""

from __future__ import annotations

import asyncio
import json
import math
import random
import struct
from typing import Any

import msgspec
import pytest
from aiokafka.partitioner import murmur2 as kafka_murmur2

from bench.batchlookup import OWNER, batch_request, handlers, lookup, replica_of
from schemas.config import load_config
from streams.lookup.serving import (
    PeerAnswerError,
    answer,
    answer_json,
    check_peer_batch,
    is_peer_batch_for,
    murmur2,
    parse_batch,
    read_user,
)
from tests.streams.test_cli_replay import CONFIG


def dumps(body: Any) -> bytes:
    """What the API wrote before `answer_json`."""
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


EDGE_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.1,
    1 / 3,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    1e-4,
    9.999999999999999e-05,
    0.00010000000000000002,
    1e-5,
    2.5e-05,
    -3.3e-07,
    1e15,
    9999999999999998.0,
    1e16,
    1.0000000000000002e16,
    123456789012345678.0,
    1e21,
    1e22,
    -1e300,
    0.5,
    0.999999999999,
]


def random_floats(n: int, seed: int) -> list[float]:
    """Random bit patterns (every exponent) and probabilities at every scale, NaN-free."""
    rng = random.Random(seed)
    out: list[float] = []
    while len(out) < n:
        bits = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(bits):
            out.append(bits)
        out.append(rng.random() * 10.0 ** rng.randint(-12, 20) * rng.choice((1, -1)))
    return out


def test_floats_are_written_as_repr_writes_them() -> None:
    for value in EDGE_FLOATS + random_floats(20_000, seed=3):
        body = {"p": value, "xs": [value, -value]}
        assert answer_json(body) == dumps(body), value
    assert answer_json({"many": EDGE_FLOATS}) == dumps({"many": EDGE_FLOATS})


TEXTS = [
    "".join(map(chr, range(128))),
    "ü@example.com",
    "é\u2028\u2029\ufeff",
    "\U0001f600 astral",
    "user,1e5",
    "a:1e-7",
    "0.0000",
    '"quoted" \\ back/slash',
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_text_is_escaped_as_json_dumps_escapes_it(text: str) -> None:
    body = {"user": text, text: [text, 1.5e-05 if "e" in text else 0.25], "n": None, "b": True}
    assert answer_json(body) == dumps(body)
    assert answer_json(body).isascii()


def test_what_msgspec_cannot_write_goes_to_json_dumps() -> None:
    for body in ({"user": "\ud800"}, {"big": 2**80, "t": (1, 2)}, {1: "int key"}):
        assert answer_json(body) == dumps(body)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # as json.dumps: no NaN
        answer_json({"p": math.inf, "s": "\ud800"})


ODD_USERS = ["ü@example.com", "a,1e5", "\U0001f600", "x\u007fy", ".", "tab\there", 'q"uote']


@pytest.mark.parametrize("explain", [False, True])
def test_batch_answers_through_the_handler_are_json_dumps_bytes(explain: bool) -> None:
    """Whole batch answers (generated users, odd ids, intent subsets, read times, with and
    without explanations) are byte for byte what json.dumps writes for the same answer."""
    config = load_config(CONFIG)
    replica, users, last = replica_of(config, 300, 6000)
    rng = random.Random(5)
    intents = sorted(config.intents)
    for at in (last - 600_000, last, last + 3_600_000, last + 90 * 24 * 3_600_000):
        owner = handlers(config, replica, OWNER, OWNER, at)
        for _ in range(8):
            odd = [u for u in ODD_USERS if rng.random() < 0.4]  # "a,1e5" makes it json.dumps
            chosen: list[Any] = [*rng.sample(users, 40), *odd]
            chosen = [
                {"user": u, "intents": rng.sample(intents, rng.randint(1, len(intents)))}
                if rng.random() < 0.3
                else u
                for u in chosen
            ]
            request = {"users": chosen, "explain": explain}
            if rng.random() < 0.5:
                request["at"] = at
            got = asyncio.run(lookup(owner, json.dumps(request).encode()))
            assert got == dumps(json.loads(got))
            assert len(json.loads(got)["results"]) == len(chosen)
    assert asyncio.run(lookup(owner, batch_request(users[:3])))


def peer_payloads(users: list[str]) -> list[bytes]:
    """A batch answer for `users`, and ways another worker could get it wrong."""
    good = {"at": 5, "counts": {"found": len(users)}, "results": [{"user": u} for u in users]}
    wrong = [
        {**good, "results": good["results"][:-1]},
        {**good, "results": [*good["results"][:-1], {"user": "mallory"}]},
        {**good, "results": [*good["results"][:-1], {"users": users[-1]}]},
        {**good, "results": [*good["results"][:-1], {"user": [users[-1]]}]},
        {**good, "results": [*good["results"][:-1], [users[-1]]]},
        {**good, "results": {"user": users[0]}},
        {"at": 5, "counts": {}},
        good["results"],
    ]
    payloads = [dumps(good), *map(dumps, wrong)]
    text = dumps(good).decode()
    last = json.dumps(users[-1])
    payloads += [
        text.replace(f'"user":{last}', f'"user":{last},"user":"mallory"').encode(),  # last wins
        text.replace(f'"user":{last}', f'"user":"mallory","user":{last}').encode(),
        text.replace(f'"user":{last}', f'"user":{last},"us\\u0065r":"mallory"').encode(),
        text.replace('"results":', '"r\\u0065sults":[],"results":').encode(),
        text.replace("}]}", '}],"r\\u0065sults":[]}').encode(),
        text.replace('"at":5', '"at":NaN').encode(),
        (text + " x").encode(),
        text.encode("utf-16"),
        text.replace("}]}", '}],"deep":' + "[" * 5000 + "]" * 5000 + "}").encode(),
        json.dumps(good, ensure_ascii=False).encode(),
        b"",
    ]
    return payloads


@pytest.mark.parametrize("users", [["a", "b", "c"], ["ü@example.com", "a,1e5", '"q"'], ["x"]])
def test_the_quick_peer_check_accepts_only_what_the_full_check_accepts(users: list[str]) -> None:
    for n, payload in enumerate(peer_payloads(users)):
        try:
            check_peer_batch(payload, users)
        except PeerAnswerError:
            accepted = False
        else:
            accepted = True
        assert not is_peer_batch_for(payload, users) or accepted, (n, payload[:200])
    assert is_peer_batch_for(peer_payloads(users)[0], users)  # a right answer: the quick path


@pytest.mark.parametrize("app_id", [None, "oracular"])
def test_a_batch_result_built_with_its_status_is_the_old_status_then_answer(app_id) -> None:
    """`answer(..., with_status=True)`: the same keys, values and order as the batch built
    before, `{"status": ..., **answer(...)}`, known users and unknown, all intents or some."""
    config = load_config(CONFIG)
    replica, _users, last = replica_of(config, 60, 1500)
    raws = [raw for values in replica.values.values() for raw in values.values()]
    reads = [read_user(raw, config, 0, full=True) for raw in raws] + [read_user(None, config, 3)]
    for read in reads:
        for intents in (None, ["churn"], sorted(config.intents)):
            for with_explain in (False, True):
                kwargs: dict[str, Any] = {
                    "intents": intents,
                    "at": last + 7_200_000,
                    "with_explain": with_explain,
                    "served_by": {"worker": "w", "role": "active"},
                    "config_id": "c",
                    "app_id": app_id,
                }
                body = answer(read, "u", **kwargs)
                old = {"status": "found" if body["known"] else "unknown", **body}
                new = answer(read, "u", with_status=True, **kwargs)
                assert list(new.items()) == list(old.items())
                assert dumps(new) == dumps(old)


def test_a_forwarded_batch_body_is_read_by_the_owner_as_before() -> None:
    """The forward's body, now msgspec's bytes, is the same batch to the owner's parse."""
    config = load_config(CONFIG)
    users = [*ODD_USERS, "\u2028", "a" * 512, "plain"]
    body = {"users": [{"user": u, "intents": ["churn"]} for u in users] + users, "at": 5}
    for explain, stale in ((False, False), (True, True)):
        request = parse_batch(
            json.dumps({**body, "explain": explain, "stale": stale}).encode(), config
        )
        sent = request.to_json(request.items, 7)
        assert parse_batch(msgspec.json.encode(sent), config) == parse_batch(
            json.dumps(sent).encode(), config
        )


def test_murmur2_is_kafkas() -> None:
    rng = random.Random(9)
    keys = [rng.randbytes(rng.randrange(40 if n % 10 else 1100)) for n in range(30_000)]
    keys += [u.encode() for u in ODD_USERS] + [b"", b"a", b"ab", b"abc", b"abcd"]
    for key in keys:
        assert murmur2(key) == kafka_murmur2(key), key
