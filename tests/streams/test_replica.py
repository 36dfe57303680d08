"""The lookup API's own process and its replica of the worker's table (streams/lookup/replica.py,
streams/lookup/process.py), without a broker.

The replica's rules through its messages; the full copy of a RocksDB database interleaved
with writes; the status round trip; and a real API process started by a `Feed` over a fake
worker: lookups answered from the replica, a reveal appended through the worker, a dead
process restarted with its replica rebuilt. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from subprocess import PIPE
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
import rocksdict
from aiohttp import ClientSession, ClientTimeout

from engine import create_state, observe, predict_many
from engine.episodes import clamp_time
from infra.processes import thread_cpus
from schemas.config import load_config
from schemas.stored import StoredUser, decode_stored, encode_stored
from streams.lookup.api import bind
from streams.lookup.front import Limits
from streams.lookup.metrics import Family, Metrics
from streams.lookup.process import follow
from streams.lookup.replica import (
    BEGIN,
    DROP,
    FREEZE_DECODED,
    SLICE_VALUES,
    STALE_STATUS_S,
    STATES,
    STATUS,
    SYNCED,
    ChildArgs,
    Feed,
    Replica,
    ReplicaCache,
    ReplicaNode,
    apply_yielding,
    chunks,
    pack,
    unpacker,
)
from streams.lookup.serving import UserRead, answer, partition_for, read_user
from streams.settings import DEFAULT_API_NICE, SettingsError, load_settings
from streams.settings.peers import Peers
from tests.contract import contract_session
from tests.streams.test_cli_replay import CONFIG

WAIT_S = 30.0  # a condition on a busy 2-core box
PARTITIONS = 4
T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def config() -> Any:
    return load_config(CONFIG)


def args(config: Any, url: str = "http://127.0.0.1:1") -> ChildArgs:
    return ChildArgs(
        url=url,
        app_id="replica-test",
        config=config,
        partitions=PARTITIONS,
        events_topic="events",
        token=None,
        forward_timeout_s=2.0,
        max_skew_ms=60_000,
        peers=Peers(),
        limits=Limits(),
        tls=(None, None, None),
        log_level=30,
    )


def stored(config: Any, signal_name: str, partition: int, offset: int) -> bytes:
    state = observe(create_state(config), signal_name, T0)
    return encode_stored(StoredUser(state, partition, offset))


# --- the replica's rules -------------------------------------------------------------------


def test_a_partition_is_read_only_once_its_full_copy_arrived(config: Any) -> None:
    replica = Replica()
    node = ReplicaNode(args(config), replica, append=None)  # type: ignore[arg-type]
    node.take_status(status_body({0: ["active", False, node.me]}), Metrics())
    replica.apply([BEGIN, 0])
    replica.apply([STATES, 0, [[b"u1", b"v1"], [b"u2", b"v2"]]])
    assert node.view(0).settling  # copy still on its way: settling (a 503, retry)
    with pytest.raises(Exception, match="not open"):
        node.get(0, b"u1")
    replica.apply([SYNCED, 0])
    assert not node.view(0).settling and node.get(0, b"u1") == b"v1"
    replica.apply([STATES, 0, [[b"u1", None], [b"u3", b"v3"]]])  # a tombstone, a new user
    assert node.get(0, b"u1") is None and node.get(0, b"u3") == b"v3"
    replica.apply([DROP, 0])
    assert node.view(0).settling and 0 not in replica.values


def test_a_write_drops_the_decoded_state(config: Any) -> None:
    replica = Replica()
    cache = ReplicaCache(replica)
    replica.apply([BEGIN, 1])
    replica.apply([SYNCED, 1])
    user = read_user(encode_stored(StoredUser(create_state(config), 1, 5)), config, 1)
    cache.keep(b"u", user)
    assert cache.peek(b"u") is user
    replica.apply([STATES, 1, [[b"u", b"newer"]]])
    assert cache.peek(b"u") is None
    cache.keep(b"u", user)
    replica.apply([BEGIN, 1])  # a new full copy of its partition
    assert cache.peek(b"u") is None


def test_a_kept_user_answers_as_predict_many_at_every_read_time(config: Any) -> None:
    """A user read (what predictions read of its stored value) that the cache keeps answers
    later lookups exactly as `predict_many` (the view at the read's time) predicts, before
    its episode times out, at the deadline and after it (the answer predicts from the state
    as it is: `engine.predict.predict_read`), and a write drops it."""
    replica = Replica()
    cache = ReplicaCache(replica)
    replica.apply([BEGIN, 1])
    replica.apply([SYNCED, 1])
    state = observe(create_state(config), "pricing.viewed", T0)
    cache.keep(b"u", read_user(encode_stored(StoredUser(state, 1, 5)), config, 1))
    timeout = config.episode_timeout_ms
    for read in (T0 - 1, T0, T0 + timeout, T0 + timeout + 1, T0 + 3 * timeout, T0 + timeout + 2):
        kept = cache.peek(b"u")
        assert kept is not None
        body = answer(
            kept,
            "u",
            intents=None,
            at=read,
            with_explain=False,
            served_by={},
            config_id="c",
        )
        at = clamp_time(state, read)
        expected = {
            name: [p.p, p.lower, p.reveal, p.suppressed_until]
            for name, p in predict_many(state, at).items()
        }
        got = {name: list(item.values()) for name, item in body["intents"].items()}
        assert repr(got) == repr(expected), read  # repr: floats bit for bit
    replica.apply([STATES, 1, [[b"u", b"newer"]]])
    assert b"u" not in replica.decoded


@pytest.fixture
def unfreeze() -> Any:
    """Gives the collector back what a test froze (no other test freezes or expects frozen)."""
    yield
    gc.unfreeze()


def tracked_in_generations() -> set[int]:
    return {id(o) for generation in range(3) for o in gc.get_objects(generation)}


def test_kept_users_leave_the_collectors_generations_and_are_still_freed_when_written(
    config: Any, unfreeze: Any
) -> None:
    """Every FREEZE_DECODED users kept, the generations are frozen: the decoded users are no
    longer walked by young collections (fails without the freeze), and a user written later
    is still freed by reference counting, frozen or not."""
    replica = Replica()
    cache = ReplicaCache(replica)
    replica.apply([BEGIN, 1])
    replica.apply([SYNCED, 1])
    gc.collect()
    users = [
        read_user(
            encode_stored(
                StoredUser(observe(create_state(config), "pricing.viewed", T0 + n), 1, n)
            ),
            config,
            1,
        )
        for n in range(FREEZE_DECODED)
    ]
    before = [sys.getrefcount(user) for user in users]
    intents = [next(iter(user.state.intents.values())) for user in users]
    for n in range(FREEZE_DECODED):
        cache.keep(b"u%d" % n, users[n])
    assert not {id(i) for i in intents} & tracked_in_generations()
    assert cache.unfrozen == 0
    cache.keep(b"one more", UserRead(create_state(config), True, 1, 99))
    assert cache.unfrozen == 1  # the next freeze waits for FREEZE_DECODED more
    assert [sys.getrefcount(user) for user in users] == [n + 1 for n in before]  # the cache's
    replica.apply([STATES, 1, [[b"u%d" % n, b"newer"] for n in range(FREEZE_DECODED)]])
    # The write let go of the cache's reference, frozen or not: the test's are the last ones.
    assert [sys.getrefcount(user) for user in users] == before


def test_a_stale_status_makes_every_local_partition_settling(config: Any) -> None:
    replica = Replica()
    node = ReplicaNode(args(config), replica, append=None)  # type: ignore[arg-type]
    node.take_status(
        status_body({0: ["active", False, node.me], 1: ["standby", False, "x"]}), Metrics()
    )
    for message in ([BEGIN, 0], [SYNCED, 0]):
        replica.apply(message)
    assert not node.view(0).settling and node.health() == []
    assert node.view(1).local is None  # a standby not yet copied cannot answer stale reads
    node.status.received = time.monotonic() - STALE_STATUS_S - 1  # the worker froze
    assert node.view(0).settling
    assert "no status" in node.health()[0]


def status_body(views: dict[int, list[Any]]) -> dict[str, Any]:
    gauge = Family("oracular_ready", "gauge", "1 when ready.").add(1, (("role", "active"),))
    metrics = Metrics()
    metrics.batch(0.004, 17)
    feed = Feed.__new__(Feed)
    feed.metrics = metrics
    feed.node = FakeNode(views, [gauge])
    body: dict[str, Any] = feed.status()
    return msgpack.unpackb(pack(body), raw=False, strict_map_key=False)  # type: ignore[no-any-return]


def test_the_status_crosses_the_channel_whole(config: Any) -> None:
    node = ReplicaNode(args(config), Replica(), append=None)  # type: ignore[arg-type]
    metrics = Metrics()
    node.take_status(status_body({2: ["active", True, "http://w:1"]}), metrics)
    assert node.status.views == {2: ("active", True, "http://w:1")}
    assert node.lag() == {2: 7} and node.counts() == {"applied": 3}
    assert node.inputs_by_partition() == {("events", 2): 3}
    assert node.episodes_by_reason() == {"timeout": 1}
    [gauge] = node.gauges()
    assert gauge.samples == [("", (("role", "active"),), 1)]
    assert metrics.batch_messages == 17 and sum(metrics.batch_seconds.sums.values()) == 0.004


def test_messages_stream_through_the_unpacker_in_any_pieces() -> None:
    data = b"".join(pack([STATES, p, [[b"k%d" % p, b"v"]]]) for p in range(50))
    feed = unpacker()
    got = []
    for start in range(0, len(data), 7):
        feed.feed(data[start : start + 7])
        got.extend(feed)
    assert [m[1] for m in got] == list(range(50)) and got[3][2] == [[b"k3", b"v"]]


def test_a_full_copy_with_writes_between_its_chunks_equals_the_database(tmp_path: Path) -> None:
    """The copy reads each chunk when it is sent, so writes sent between chunks (before,
    inside and after the part already copied) leave the replica equal to the database."""
    options = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(str(tmp_path / "db"), options=options)
    try:
        for n in range(5000):
            db[b"user%05d" % n] = b"v0"
        replica = Replica()
        replica.apply([BEGIN, 0])
        for step, chunk in enumerate(chunks(db, 1000)):
            replica.apply([STATES, 0, chunk])
            writes = [
                (b"user%05d" % (step * 1000 + 10), b"w%d" % step),  # already copied
                (b"user%05d" % ((step + 2) * 1000 + 10), b"w%d" % step),  # not yet
                (b"new%d" % step, b"n"),
            ]
            gone = b"user%05d" % (step * 1000 + 500 + 2000)
            for key, value in writes:
                db[key] = value
            db.delete(gone)
            replica.apply([STATES, 0, [*writes, (gone, None)]])  # as the tap sends them
        replica.apply([SYNCED, 0])
        assert replica.values[0] == dict(db.items())
    finally:
        db.close()


# --- the feed applied a slice at a time ---------------------------------------------------


def snapshot(replica: Replica) -> tuple[Any, ...]:
    """What a lookup can see of `replica`: its values per partition and the synced ones."""
    values = tuple(sorted((p, tuple(sorted(v.items()))) for p, v in replica.values.items()))
    return values, tuple(sorted(replica.synced))


def feed_messages() -> list[list[Any]]:
    """Messages at the edges of a slice (0, 1, 64, 65 and 200 values), tombstones, a key
    written twice in one message, two partitions, and every control message."""
    keys = [b"k%03d" % n for n in range(200)]
    return [
        [BEGIN, 0],
        [STATES, 0, [[k, b"a" + k] for k in keys]],
        [SYNCED, 0],
        [STATES, 0, []],
        [STATES, 1, [[keys[0], b"p1"]]],
        [STATES, 0, [[k, None] for k in keys[:SLICE_VALUES]]],
        [STATES, 0, [[k, b"b" + k] for k in keys[: SLICE_VALUES + 1]] + [[keys[3], b"twice"]]],
        [DROP, 1],
        [BEGIN, 1],
        [STATES, 1, [[k, b"c" + k] for k in keys[50:150]]],
    ]


def test_slices_leave_the_replica_that_apply_leaves() -> None:
    """`Replica.steps`, run to its end, is `apply`: the same values, synced partitions and
    decoded users dropped, a STATES message in one step per SLICE_VALUES values."""
    whole, sliced = Replica(), Replica()
    for message in feed_messages():
        for replica in (whole, sliced):  # a decoded user of every key, dropped when written
            kept = {b"k%03d" % n: ("kept", None) for n in range(0, 200, 7)}
            replica.decoded.update(kept)  # type: ignore[arg-type]
        whole.apply(message)
        steps = sum(1 for _ in sliced.steps(message))
        assert snapshot(sliced) == snapshot(whole) and sliced.decoded == whole.decoded
        size = len(message[2]) if message[0] == STATES else None
        assert steps == (1 if size is None else -(-size // SLICE_VALUES)), message[:2]


def test_a_lookup_between_slices_reads_each_user_before_or_after_the_message(
    config: Any,
) -> None:
    """A lookup between two steps reads each user's value as before the message or as after
    it, with that value's own position (never one the replica does not hold), and the
    decoded states it keeps are dropped when a later step writes their users: once the
    message is applied, no lookup answers from a state older than it."""
    replica = Replica()
    cache = ReplicaCache(replica)
    node = ReplicaNode(args(config), replica, append=None)  # type: ignore[arg-type]
    keys = [b"u%03d" % n for n in range(3 * SLICE_VALUES + 5)]
    replica.apply([BEGIN, 2])
    old = [[k, stored(config, "pricing.viewed", 2, n)] for n, k in enumerate(keys)]
    replica.apply([STATES, 2, old])
    replica.apply([SYNCED, 2])
    new = [[k, stored(config, "limit.hit", 2, 1000 + n)] for n, k in enumerate(keys)]

    def lookup(key: bytes) -> int | None:
        """The offset a lookup reports, read as `streams.lookup.api` reads (cache first)."""
        kept = cache.peek(key)
        if kept is None:
            raw = node.get(2, key)
            assert raw is not None
            kept = decode_stored(raw, config)
            cache.keep(key, kept)
        return kept.last_offset

    written = 0
    for _ in replica.steps([STATES, 2, new]):
        written = min(written + SLICE_VALUES, len(keys))
        offsets = [lookup(k) for k in keys]
        assert offsets == [1000 + n if n < written else n for n in range(len(keys))]
    assert written == len(keys)
    assert [lookup(k) for k in keys] == [1000 + n for n in range(len(keys))]


async def test_the_loop_runs_between_the_slices_of_a_message() -> None:
    """While `apply_yielding` applies a message, other tasks (lookups) run after every
    SLICE_VALUES values: the probe sees the message part-applied (applied in one go, it would
    see nothing or all of it)."""
    replica = Replica()
    replica.apply([BEGIN, 0])
    total = 4 * SLICE_VALUES + 3
    message = [STATES, 0, [[b"k%04d" % n, b"v"] for n in range(total)]]
    seen: list[int] = []
    applying = asyncio.create_task(apply_yielding(replica, message))
    while not applying.done():
        seen.append(len(replica.values[0]))
        await asyncio.sleep(0)
    await applying
    assert seen == [0, SLICE_VALUES, 2 * SLICE_VALUES, 3 * SLICE_VALUES, 4 * SLICE_VALUES, total]


async def test_messages_are_applied_one_after_the_other_while_lookups_run() -> None:
    """Fed as the API process feeds its replica (`follow`, the messages delivered at once as
    from one read), what a lookup between two steps sees is always the replica after some
    first writes of the channel, in the order sent, never a later message's write before an
    earlier one's; and a status is taken only once every message before it is applied."""
    messages = feed_messages()
    messages.insert(7, [STATUS, "after the first seven"])
    model = Replica()  # the replica after each single write, in the order sent
    states = [snapshot(model)]
    status_at = 0
    for message in messages:
        if message[0] == STATUS:
            status_at = len(states) - 1
        elif message[0] == STATES:
            model.apply([STATES, message[1], []])
            for item in message[2]:
                model.apply([STATES, message[1], [item]])
                states.append(snapshot(model))
        else:
            model.apply(message)
            states.append(snapshot(model))
    index = {state: n for n, state in reversed(list(enumerate(states)))}

    async def delivered() -> AsyncIterator[list[Any]]:
        for message in messages:  # no turn of the loop between them, as from one read
            yield message

    replica = Replica()
    taken = []
    feeding = asyncio.create_task(
        follow(delivered(), replica, lambda m: taken.append(index[snapshot(replica)]))
    )
    seen = []
    while not feeding.done():
        seen.append(index[snapshot(replica)])  # a KeyError: a state no order of writes makes
        await asyncio.sleep(0)
    await feeding
    assert seen == sorted(seen) and len(set(seen)) > len(messages)  # mid-message states too
    assert snapshot(replica) == states[-1]
    assert taken == [status_at]


# --- a real API process ------------------------------------------------------------------


class FakeNode:
    """The worker's side of a `Feed`: one open database per partition, a status, reveals."""

    def __init__(self, views: dict[int, list[Any]], gauges: list[Family], dbs: Any = None) -> None:
        self._views = views
        self._gauges = gauges
        self.dbs: dict[int, Any] = dbs or {}
        self.appended: list[tuple[bytes, bytes, int]] = []
        self.worker_loop = None

    def views(self) -> dict[int, tuple[str | None, bool, str | None]]:
        return {p: (v[0], v[1], v[2]) for p, v in self._views.items()}

    def routing(self) -> dict[str, Any]:
        return {"here": {"active": sorted(self._views)}}

    def health(self) -> list[str]:
        return []

    def lag(self) -> dict[int, int]:
        return {2: 7}

    def counts(self) -> dict[str, int]:
        return {"applied": 3}

    def inputs_by_partition(self) -> dict[tuple[str, int], int]:
        return {("events", 2): 3}

    def episodes_by_reason(self) -> dict[str, int]:
        return {"timeout": 1}

    def gauges(self) -> list[Family]:
        return self._gauges

    def databases(self) -> dict[int, Any]:
        return dict(self.dbs)

    async def append(self, key: bytes, value: bytes, partition: int) -> tuple[int, int]:
        self.appended.append((key, value, partition))
        return partition, len(self.appended) - 1


async def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def serving(
    config: Any, tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[str, Feed, FakeNode, Any]]:
    """A started `Feed` (its `ChildArgs` with `overrides`) serving a fake worker that owns
    every partition, each with a database."""
    dbs = {
        p: rocksdict.Rdict(str(tmp_path / f"p{p}"), options=rocksdict.Options(raw_mode=True))
        for p in range(PARTITIONS)
    }
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    views = {p: ["active", False, url] for p in range(PARTITIONS)}
    node = FakeNode(views, [], dbs)
    feed = Feed(dataclasses.replace(args(config, url), **overrides), sock, node, Metrics())
    await feed.start()
    try:
        yield url, feed, node, dbs
    finally:
        await feed.stop()
        sock.close()
        for db in dbs.values():
            db.close()


@pytest.fixture
async def served(config: Any, tmp_path: Path) -> AsyncIterator[tuple[str, Feed, FakeNode, Any]]:
    async with serving(config, tmp_path) as started:
        yield started


def write(feed: Feed, dbs: Any, config: Any, user: str, signal_name: str, offset: int) -> None:
    """What the worker does: write the user's state to its partition's database and tell
    the tap."""
    partition = partition_for(user, PARTITIONS)
    value = stored(config, signal_name, partition, offset)
    dbs[partition][user.encode()] = value
    feed.written(partition, [(user.encode(), value)])


async def get(http: ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as response:
        return response.status, json.loads(await response.read())


async def test_the_api_process_answers_from_the_replica_and_appends_reveals_through_the_worker(
    served: Any, config: Any
) -> None:
    url, feed, node, dbs = served
    before = "u-before"
    write(feed, dbs, config, before, "pricing.viewed", 1)  # in the database before the copy
    async with contract_session(timeout=ClientTimeout(total=10)) as http:

        async def known(user: str, offset: int) -> bool:
            status, body = await get(http, f"{url}/v1/users/{user}")
            return status == 200 and body["known"] and body["position"]["offset"] == offset

        await wait_for(lambda: known(before, 1), "the user written before the copy")
        write(feed, dbs, config, "u-after", "pricing.viewed", 2)  # written after: pushed
        await wait_for(lambda: known("u-after", 2), "the user written after the copy")
        write(feed, dbs, config, before, "limit.hit", 3)  # a newer state of a decoded user
        await wait_for(lambda: known(before, 3), "the newer state")
        async with http.post(
            f"{url}/v1/users/u-after/revealed", json={"intent": "upgrade"}
        ) as response:
            assert response.status == 202, await response.text()
        [(key, _, partition)] = node.appended
        assert key == b"u-after" and partition == partition_for("u-after", PARTITIONS)
        status, body = await get(http, f"{url}/readyz")
        assert status == 200 and body["ready"], body


async def test_a_dead_api_process_is_restarted_with_its_replica_rebuilt(
    served: Any, config: Any
) -> None:
    url, feed, _, dbs = served
    write(feed, dbs, config, "u1", "pricing.viewed", 4)
    assert feed.process is not None
    os.kill(feed.process.pid, signal.SIGKILL)
    async with contract_session(timeout=ClientTimeout(total=10)) as http:

        async def answers() -> bool:
            try:
                status, body = await get(http, f"{url}/v1/users/u1")
            except (TimeoutError, OSError, json.JSONDecodeError):
                return False
            return status == 200 and body["position"]["offset"] == 4

        await wait_for(answers, "an answer from the restarted API process")
    assert feed.restarts == 1


def test_the_api_process_refuses_to_be_started_by_hand() -> None:
    from streams.lookup.process import main

    assert main([]) == 2
    assert socket  # the module's sockets come from the worker only


# --- the API process's priority (ORACULAR_API_NICE) -----------------------------------------


def feed_with(config: Any, nice: int, nice_set: bool = True) -> Feed:
    """A `Feed` that is never started: only its priority rule is used."""
    chosen = dataclasses.replace(args(config), nice=nice, nice_set=nice_set)
    return Feed(chosen, None, None, Metrics())  # type: ignore[arg-type]


@contextlib.contextmanager
def waiting_child() -> Iterator[int]:
    """A Python process that waits (for its stdin), as the API process stands in: its pid."""
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=PIPE
    ) as child:
        try:
            yield child.pid
        finally:
            child.kill()


def test_the_api_process_gets_its_priority_relative_to_the_worker(config: Any) -> None:
    """Set on the started process, relative to the worker's own nice value; where raising a
    priority is not permitted, the process keeps the worker's and the test checks that."""
    with waiting_child() as pid:
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        feed = feed_with(config, -5)
        feed._prioritise(pid)
        expected = mine if feed.priority_refused else max(-20, mine - 5)
        assert os.getpriority(os.PRIO_PROCESS, pid) == expected
        feed_with(config, 3)._prioritise(pid)  # lowering is always permitted
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, mine + 3)


def refuse(*_: Any) -> None:
    raise PermissionError(1, "Operation not permitted")


def warnings_of_two_starts(
    feed: Feed, caplog: pytest.LogCaptureFixture, setting: str
) -> list[logging.LogRecord]:
    """The warnings naming `setting` when the API process is given its priority twice (a
    restarted process must not warn again)."""
    with caplog.at_level("WARNING", logger="oracular.api"):
        feed._prioritise(os.getpid())
        feed._prioritise(os.getpid())
    return [r for r in caplog.records if setting in r.getMessage()]


def test_a_refused_priority_is_warned_once_and_the_process_still_starts(
    config: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "setpriority", refuse)
    feed = feed_with(config, -5)
    warnings = warnings_of_two_starts(feed, caplog, "ORACULAR_API_NICE")
    assert len(warnings) == 1 and feed.priority_refused
    assert "not permitted" in warnings[0].getMessage()
    unset = feed_with(config, 0)  # 0: nothing to set, nothing refused
    unset._prioritise(os.getpid())
    assert not unset.priority_refused


def test_a_refused_default_priority_is_an_info_line_not_a_warning(
    config: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ORACULAR_API_NICE unset: a worker that may not raise priorities (most containers) is
    a normal deployment, told once at INFO; set, the same refusal is a warning."""

    monkeypatch.setattr(os, "setpriority", refuse)
    with caplog.at_level("INFO", logger="oracular.api"):
        feed_with(config, DEFAULT_API_NICE, nice_set=False)._prioritise(os.getpid())
    [record] = [r for r in caplog.records if "ORACULAR_API_NICE" in r.getMessage()]
    assert record.levelname == "INFO" and "-5, the default" in record.getMessage()


def test_the_api_nice_setting_is_unset_unless_given() -> None:
    assert load_settings(env={}).api_nice is None  # DEFAULT_API_NICE, quietly
    assert load_settings(env={"ORACULAR_API_NICE": "-3"}).api_nice == -3
    with pytest.raises(SettingsError, match="ORACULAR_API_NICE"):
        load_settings(env={"ORACULAR_API_NICE": "-21"})


# --- the API process under SCHED_RR (ORACULAR_API_REALTIME) ---------------------------------


def test_the_api_process_runs_under_sched_rr_when_asked(config: Any) -> None:
    """ORACULAR_API_REALTIME=N: the started process's policy is SCHED_RR at N; where that is
    not permitted, it keeps the normal policy, the refusal is recorded, and nice applies."""
    with waiting_child() as pid:
        feed = Feed(dataclasses.replace(args(config), realtime=7), None, None, Metrics())  # type: ignore[arg-type]
        feed._prioritise(pid)
        if feed.realtime_refused:
            assert os.sched_getscheduler(pid) == os.SCHED_OTHER
        else:
            assert os.sched_getscheduler(pid) == os.SCHED_RR
            assert os.sched_getparam(pid).sched_priority == 7


def test_a_refused_realtime_policy_is_one_warning_and_nice_still_applies(
    config: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    niced: list[int] = []
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    monkeypatch.setattr(os, "setpriority", lambda _which, _pid, value: niced.append(value))
    chosen = dataclasses.replace(args(config), realtime=10, nice=-5, nice_set=True)
    feed = Feed(chosen, None, None, Metrics())  # type: ignore[arg-type]
    warnings = warnings_of_two_starts(feed, caplog, "ORACULAR_API_REALTIME")
    assert len(warnings) == 1 and feed.realtime_refused
    assert "RLIMIT_RTPRIO of at least 10" in warnings[0].getMessage()
    assert len(niced) == 2  # the nice value was set on each start instead


def test_the_api_realtime_setting_is_off_unless_given_and_checked() -> None:
    assert load_settings(env={}).api_realtime == 0
    assert load_settings(env={"ORACULAR_API_REALTIME": "10"}).api_realtime == 10
    with pytest.raises(SettingsError, match="ORACULAR_API_REALTIME"):
        load_settings(env={"ORACULAR_API_REALTIME": "100"})


# --- the API process's CPUs (ORACULAR_API_CPUS) ---------------------------------------------


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to reserve one")
async def test_the_api_process_runs_on_its_reserved_cpus_and_so_does_a_restarted_one(
    config: Any, tmp_path: Path
) -> None:
    reserved = frozenset({max(os.sched_getaffinity(0))})
    async with serving(config, tmp_path, cpus=reserved) as (_url, feed, _, _):
        assert feed.process is not None
        first = feed.process.pid
        assert thread_cpus(first) == reserved  # its threads too (started after the pin)
        feed.process.kill()

        async def restarted() -> bool:
            return feed.process is not None and feed.process.pid != first and feed.ready.is_set()

        await wait_for(restarted, "the API process restarted")
        assert thread_cpus(feed.process.pid) == reserved
    async with serving(config, tmp_path / "unset") as (_, unpinned, _, _):
        assert unpinned.process is not None
        assert thread_cpus(unpinned.process.pid) == os.sched_getaffinity(0)


# --- a corrupt database is never copied short -------------------------------------------------


def _corrupt_db(path: Path) -> Any:
    """A RocksDB database with a flipped block in its one .sst, opened (it opens fine)."""
    options = rocksdict.Options(raw_mode=True)
    db = rocksdict.Rdict(str(path), options=options)
    for n in range(20_000):
        db[b"user%05d" % n] = bytes(range(200))
    db.flush()
    db.compact_range(None, None)
    db.close()
    (sst,) = path.glob("*.sst")
    with sst.open("r+b") as f:
        f.seek(sst.stat().st_size // 3)
        f.write(b"\xff" * 200)
    return rocksdict.Rdict(str(path), options=options)


async def test_a_full_copy_of_a_corrupt_database_stops_the_worker(
    config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream's iteration ended at the bad block as if the data ended there, and the API
    answered the users past it as unknown; the copy raises, and the feed stops the worker."""
    from streams.faust.patches import StoreError
    from streams.lookup import replica as replica_module

    db = _corrupt_db(tmp_path / "db")
    try:
        with pytest.raises(StoreError):
            list(chunks(db, 1000))
        stopped: list[tuple[str, BaseException]] = []

        def stop(where: str, exc: BaseException) -> None:
            stopped.append((where, exc))
            raise SystemExit(75)

        monkeypatch.setattr(replica_module.FAIL_STOP, "stop", stop)
        sent: list[Any] = []
        node = SimpleNamespace(databases=lambda: {3: db})
        feed = Feed(args(config), None, node, Metrics())  # type: ignore[arg-type]
        with pytest.raises(SystemExit):
            await feed._copy_new_partitions(SimpleNamespace(send=sent.append))  # type: ignore[arg-type]
        ((where, exc),) = stopped
        assert where == "the lookup API's feed" and isinstance(exc, StoreError)
        assert exc.partition == 3 and exc.corrupt
        assert [m[0] for m in sent if m[0] in (SYNCED, DROP)] == []  # never "synced" short
    finally:
        db.close()
