"""The time contract (docs/time.md) end to end: live `oracular worker` and `oracular backfill`.

Each test produces events to a real broker and holds every output message (id and content;
duplicates allowed, every copy equal) and every final changelog state to the offline replay of
the same events (`worker_support.expected_outputs`, what `oracular replay` runs), for the users
the contract covers: every user none of whose inputs arrives behind its partition's
watermark. Where a test steps outside that, it asserts what the contract says instead: the
divergent inputs are exactly the ones counted `closed_early`, and nobody else differs.

Nothing here sleeps for correctness: producers are paced (that is the scenario), and every
wait is for a condition, bounded by a named timeout.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from engine import END_OF_TIME, EngineConfig, Event
from schemas.config import load_config
from schemas.outputs import decode_output, episode_id
from streams.tools.replay import replay_outputs

from .conftest import WorkerFactory
from .support import POLL_INTERVAL_S, FaustWorker, Record
from .worker_support import (
    COMPLETION_TIMEOUT_S,
    NO_WALL_CLOCK,
    PARTITIONS,
    STATES_TIMEOUT_S,
    Deployment,
    Expected,
    TopicReader,
    changelog_states,
    deployment,
    encode_event,
    expected_outputs,
    generate_stream,
    last_summary,
    output_problems,
    partition_of,
    read_all,
    run_backfill,
    sentinels,
    stream_shape,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
DAY_MS = 24 * 3600 * SECOND_MS
YEAR_MS = 365 * DAY_MS
FAST_TICK_S = "0.25"
DEFAULT_LATENESS_MS = 120_000  # streams.settings.Settings.lateness_ms
DEFAULT_MAX_SKEW_MS = 60_000  # streams.settings.Settings.max_skew_ms
CLOSE_TIMEOUT_S = 30.0  # a close the watermark made due has been published


# --- helpers ------------------------------------------------------------------------------


def worker_for(faust_worker: WorkerFactory, dep: Deployment, **env: str) -> FaustWorker:
    """A worker for `dep` (not yet started) running `oracular worker`."""
    return faust_worker("streams.worker", app_id=dep.app_id, env=dep.env(**env), argv=dep.argv())


Timed = tuple[bytes, bytes, int | None]
"""(key, value, record timestamp ms or None for the producer's clock) of one input record."""


def timed(event: Event, record_ms: int | None = None) -> Timed:
    """The input record of `event`, with an explicit record timestamp (None: producer's)."""
    key, value = encode_event(event)
    return key, value, record_ms


async def produce_paced(
    bootstrap: str, topic: str, records: Sequence[Timed], *, rate: float | None = None
) -> list[RecordMetadata]:
    """Send `records` in order at `rate` per second (None: as fast as possible), each with its
    own record timestamp, and wait until the broker has all of them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        started = time.monotonic()
        futures = []
        for n, (key, value, record_ms) in enumerate(records):
            if rate is not None:
                ahead = started + n / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)  # pacing is the scenario, not a wait
            futures.append(await producer.send(topic, value, key=key, timestamp_ms=record_ms))
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


def user_on(partition: int, prefix: str) -> str:
    """A user id starting with `prefix` whose key hashes to `partition`."""
    n = 0
    while partition_of(f"{prefix}-{n}".encode()) != partition:
        n += 1
    return f"{prefix}-{n}"


def by_user(records: Iterable[Record]) -> dict[str, list[dict[str, Any]]]:
    """The decoded output messages per user."""
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        message = decode_output(record.value)
        found.setdefault(message["user"], []).append(message)
    return found


def restrict(expected: Expected, users: Callable[[str], bool]) -> Expected:
    """The replay's messages and states of the users `users` accepts."""
    return Expected(
        {i: m for i, m in expected.predictions.items() if users(m["user"])},
        {i: m for i, m in expected.episodes.items() if users(m["user"])},
        {u: s for u, s in expected.states.items() if users(u)},
        0,
    )


def diverging_users(
    records: Iterable[Record], states: Mapping[str, bytes], expected: Expected
) -> set[str]:
    """Users whose outputs (any message or copy) or final state differ from the replay's."""
    want: dict[str, dict[str, dict[str, Any]]] = {}
    for ident, message in expected.messages.items():
        want.setdefault(message["user"], {})[ident] = message
    got = by_user(records)
    differ = set()
    for user in set(want) | set(got) | set(states) | set(expected.states):
        mine = want.get(user, {})
        messages = got.get(user, [])
        if (
            any(mine.get(m["id"]) != m for m in messages)
            or {m["id"] for m in messages} != set(mine)
            or states.get(user) != expected.states.get(user)
        ):
            differ.add(user)
    return differ


async def collect_outputs(
    dep: Deployment, ids: Iterable[str], *, timeout_s: float = COMPLETION_TIMEOUT_S
) -> list[Record]:
    """Read predictions and episodes until every one of `ids` arrived, then to their end."""
    want = set(ids)
    seen: set[str] = set()
    count = 0

    def done(records: list[Record]) -> bool:
        nonlocal count
        seen.update(decode_output(r.value)["id"] for r in records[count:])
        count = len(records)
        return want <= seen

    def describe(records: list[Record]) -> str:
        missing = sorted(want - seen)
        return f"{len(want) - len(missing)} of {len(want)} ids; missing e.g. {missing[:5]}"

    async with TopicReader(dep.bootstrap, dep.outputs) as reader:
        await reader.wait_for(done, timeout_s=timeout_s, what="the output ids", describe=describe)
        return await reader.read_to_end()


async def settled_states(
    dep: Deployment,
    expected: Expected,
    *,
    covered: Callable[[str], bool] = lambda user: True,
    timeout_s: float = STATES_TIMEOUT_S,
) -> dict[str, bytes]:
    """The changelog's final states, once those of the `covered` users equal the replay's
    (polled: a batch writes its states just after its outputs are delivered); fails with the
    differences after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    async with TopicReader(dep.bootstrap, [dep.changelog]) as reader:
        while True:
            states = changelog_states(await reader.read_to_end(), dep.config)
            problems = [
                f"user {u}: {'missing' if u not in states else 'differs from the replay'}"
                for u, s in expected.states.items()
                if covered(u) and states.get(u) != s
            ] + [f"extra user {u}" for u in states if covered(u) and u not in expected.states]
            if not problems:
                return states
            if time.monotonic() > deadline:
                msg = (
                    f"changelog {dep.changelog}: {len(problems)} users differ from the replay "
                    f"after {timeout_s:.0f} s, e.g.:\n" + "\n".join(problems[:10])
                )
                raise AssertionError(msg)
            await asyncio.sleep(POLL_INTERVAL_S)


async def assert_equals_replay(
    dep: Deployment,
    expected: Expected,
    *,
    covered: Callable[[str], bool] = lambda user: True,
    dead_letters: Sequence[str] = (),
) -> tuple[list[Record], dict[str, bytes]]:
    """Every output and final state of the `covered` users is the replay's; dead letters
    only those expected (one per text in `dead_letters`, its error containing the text).
    Returns all output records and final states (of every user)."""
    mine = restrict(expected, covered)
    records = await collect_outputs(dep, mine.messages)
    problems = output_problems(
        (r for r in records if covered(decode_output(r.value)["user"])), mine
    )
    assert not problems, f"{len(problems)} differences from the replay, e.g.:\n" + "\n".join(
        problems[:10]
    )
    states = await settled_states(dep, expected, covered=covered)
    letters = await read_all(dep.bootstrap, dep.topics.dlq.name)
    errors = sorted(decode_output(r.value)["error"] for r in letters)
    assert len(errors) == len(dead_letters), f"dead letters for good input: {errors[:5]}"
    for error, text in zip(errors, sorted(dead_letters), strict=True):
        assert text in error, error
    return records, states


def historical_stream(config: EngineConfig, *, events: int, seed: int) -> list[Event]:
    """A time-sorted generated stream, months before now, that exercises the engine."""
    stream = generate_stream(config, events=events, users=events // 10, seed=seed)
    shape = stream_shape(config, stream)
    assert shape["ends"] > 10 and shape["revealed"] > 10 and shape["long_gaps"] > 20, shape
    assert stream[-1].at + 60 * DAY_MS < time.time() * 1000, "the stream is months old"
    return stream


CLOSED_EARLY_LINE = re.compile(r"user '([^']*)': input at (\S+) arrived after the timer closed")


def closed_early_users(log: str) -> list[str]:
    """The users of the `closed_early` inputs the worker logged one by one (the first 20)."""
    return [user for user, _ in CLOSED_EARLY_LINE.findall(log)]


# --- (a) history at a steady rate ---------------------------------------------------------


@pytest.mark.parametrize("rate", [200, 1_000, None], ids=["200-per-s", "1000-per-s", "unpaced"])
async def test_history_at_a_steady_rate_equals_the_replay(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, rate: int | None
) -> None:
    """Months-old, time-sorted events produced at a steady rate into a running, caught-up
    worker with the default lateness and idle time: every output and state is the replay's."""
    dep = deployment(kafka, request.node.name)
    events = historical_stream(dep.config, events=2_000, seed=21)
    # Far after every deadline: each partition's watermark then passes all of the stream's.
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    expected = expected_outputs(dep.config, events + marks, until=marks[0].at - DEFAULT_LATENESS_MS)

    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    topic = dep.topics.events.name
    await produce_paced(kafka, topic, [timed(e) for e in events], rate=rate)
    await produce_paced(kafka, topic, [timed(e) for e in marks])

    await assert_equals_replay(dep, expected)
    assert worker.stop() == 0
    counts = last_summary(worker.log_text())
    assert counts["applied"] == len(events) + len(marks), counts
    assert counts["closed_early"] == 0 and counts["behind_watermark"] == 0, counts
    assert counts["clock_ahead"] == 0, counts
    if rate == 200:
        # The timer closed idle episodes while the stream ran, not only the sentinels' closes.
        # (Faster, a worker lagging on a busy box may apply the stream before its next tick.)
        assert counts["closed_by_timer"] > expected.closed_at_end, counts


# --- (b) one client's clock years off ------------------------------------------------------


@pytest.mark.parametrize("stamping", ["stamped-by-stream", "stamped-now"])
async def test_a_clock_years_off_affects_only_what_the_contract_says(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, stamping: str
) -> None:
    """A history at 1,000/s with one user's event dated years ahead and one years behind.

    The far-ahead event runs more than max_skew ahead of its record's timestamp: it is
    dead-lettered with its skew (counted `clock_ahead`), moves neither its partition's
    watermark nor its own user into the future, and the replay dead-letters it too (a file
    has no records: by the run's clock). That holds whether records are stamped in the
    stream's own time ("stamped-by-stream", as `oracular produce` stamps them) or with today's
    wall clock while the history is months old ("stamped-now", an upstream catching up):
    nobody at all differs from the replay. Not the far-behind user either (its episode is long
    due, so the timer closes it at the deadline the replay's end closes it at).
    """
    dep = deployment(kafka, request.node.name)
    config = dep.config
    events = historical_stream(config, events=2_000, seed=22)
    now = int(time.time() * 1000)
    ahead_user = user_on(1, "clock-ahead")
    ahead = Event(ahead_user, now + 3 * YEAR_MS, "pricing.viewed", id="far-ahead")
    behind_user = user_on(2, "clock-behind")
    behind = Event(behind_user, events[0].at - 3 * YEAR_MS, "pricing.viewed", id="far-behind")
    stamped_now = stamping == "stamped-now"
    at = len(events) // 2
    before, after = events[:at], events[at:]
    middle = len(after) // 3
    stream_time = before[-1].at
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    order = [*before, ahead, *after[:middle], behind, *after[middle:], *marks]
    kept = [e for e in order if e is not ahead]
    expected = expected_outputs(config, kept, until=marks[0].at - DEFAULT_LATENESS_MS)
    # The replay of everything sent dead-letters the far-ahead event and gives the same.
    replayed, run = replay_outputs(config, order, until=marks[0].at - DEFAULT_LATENESS_MS)
    assert run.counts["clock_ahead"] == 1 and run.counts["dead_lettered"] == 1
    assert {o.message["id"] for o in replayed if o.role != "dlq"} == {
        *expected.predictions,
        *expected.episodes,
    }

    def stamp(event: Event) -> int | None:
        if stamped_now:
            return None  # the producer's clock: now, months after the stream's own time
        return stream_time if event in (ahead, behind) else event.at

    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    await produce_paced(
        kafka, dep.topics.events.name, [timed(e, stamp(e)) for e in order], rate=1_000
    )
    await assert_equals_replay(dep, expected, dead_letters=["ms ahead of its record's timestamp"])
    assert worker.stop() == 0
    counts = last_summary(worker.log_text())
    assert counts["clock_ahead"] == 1 and counts["dead_lettered"] == 1, counts
    assert counts["behind_watermark"] == 1, counts  # the far-behind event
    assert counts["closed_early"] == 0, counts


# --- (c) disorder within the lateness, two producers --------------------------------------

DISORDER_MS = 60_000
"""Each event is delivered at its time plus up to this much (a shuffle in event time)."""
WINDOW_MS = 30_000
"""The two producers meet after each window of delivery time: neither runs further ahead."""


async def test_two_producers_with_disorder_within_the_lateness_equal_the_replay(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """Two producers, each with half the users, deliver events shuffled within 60 s of event
    time and keep within 30 s of each other: every input is at most 90 s behind the largest
    event time seen on its partition, inside the 120 s lateness, so the outputs and states
    are the replay's of the topic, although events reach the topic out of time order."""
    dep = deployment(kafka, request.node.name, settings=NO_WALL_CLOCK)
    events = historical_stream(dep.config, events=2_000, seed=23)
    rng = random.Random(23)
    delivery = sorted(
        ((e.at + rng.randrange(DISORDER_MS), n, e) for n, e in enumerate(events)),
        key=lambda t: (t[0], t[1]),
    )
    order = [e for _, _, e in delivery]
    # Each user's events reach the topic in delivery order (one producer per user): the
    # replay of that order is the reference.
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    expected = expected_outputs(dep.config, order + marks, until=marks[0].at - DEFAULT_LATENESS_MS)
    assert order != events, "the delivery is out of time order"
    windows: list[int] = sorted({d // WINDOW_MS for d, _, _ in delivery})
    halves: list[dict[int, list[Event]]] = [{}, {}]
    for d, _, e in delivery:
        half = halves[int(e.user.rsplit("-", 1)[-1]) % 2]
        half.setdefault(d // WINDOW_MS, []).append(e)
    assert all(halves), "both producers have users"
    worst = max_lateness_needed(delivery)
    assert DISORDER_MS / 2 < worst < DEFAULT_LATENESS_MS, worst

    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    topic = dep.topics.events.name
    producers = [AIOKafkaProducer(bootstrap_servers=kafka, acks="all", linger_ms=2) for _ in "ab"]
    for producer in producers:
        await producer.start()

    async def send(producer: AIOKafkaProducer, batch: list[Event]) -> None:
        futures = [
            await producer.send(topic, value, key=key) for key, value in map(encode_event, batch)
        ]
        await asyncio.gather(*futures)  # on the broker before the next window starts

    try:
        for window in windows:
            await asyncio.gather(
                *(send(p, h.get(window, [])) for p, h in zip(producers, halves, strict=True))
            )
    finally:
        for producer in producers:
            await producer.stop()
    await produce_paced(kafka, topic, [timed(e) for e in marks])

    await assert_equals_replay(dep, expected)
    assert worker.stop() == 0
    counts = last_summary(worker.log_text())
    assert counts["applied"] == len(events) + len(marks), counts
    assert counts["closed_early"] == 0 and counts["behind_watermark"] == 0, counts
    assert counts["late"] > 0, counts  # a user's own events out of order too
    assert counts["closed_by_timer"] > expected.closed_at_end, counts


def max_lateness_needed(delivery: Sequence[tuple[int, int, Event]]) -> int:
    """The most any event is behind the largest event time delivered before it on its
    partition, in the worst interleaving the window barrier allows (a whole window of the
    other producer first)."""
    worst = 0
    newest: dict[int, int] = {}
    ends: dict[int, dict[int, int]] = {}  # partition -> window -> largest event time in it
    for d, _, e in delivery:
        p = partition_of(e.user.encode())
        window = ends.setdefault(p, {})
        window[d // WINDOW_MS] = max(window.get(d // WINDOW_MS, e.at), e.at)
    for d, _, e in delivery:
        p = partition_of(e.user.encode())
        seen = max(newest.get(p, e.at), ends[p][d // WINDOW_MS])
        worst = max(worst, seen - e.at)
        newest[p] = max(newest.get(p, e.at), e.at)
    return worst


# --- (d) disorder beyond the lateness ------------------------------------------------------

SMALL_LATENESS_MS = 1_000


async def test_input_later_than_the_lateness_diverges_exactly_where_counted(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory
) -> None:
    """One user's events delivered hours (of event time) after other users' later events,
    with a 1 s lateness: each is behind the watermark, and the timer has closed the episode
    it belongs to. Exactly those before that close's time (`closed_early`) are where the
    worker differs from the replay; the count is computed here independently, and every
    other user equals the replay."""
    dep = deployment(
        kafka,
        request.node.name,
        settings={**NO_WALL_CLOCK, "ORACULAR_LATENESS_MS": str(SMALL_LATENESS_MS)},
    )
    config = dep.config
    timeout = config.episode_timeout_ms
    assert timeout == 30 * MINUTE_MS
    events = historical_stream(config, events=1_000, seed=24)
    late_user = user_on(3, "late")
    start = events[0].at
    # (minutes after the start, delivered late): two on time, then four hours late.
    plan = [(0, False), (5, False), (10, True), (12, True), (50, True), (55, True)]
    mine = [
        Event(late_user, start + m * MINUTE_MS, "pricing.viewed", id=f"late-{n}")
        for n, (m, _) in enumerate(plan)
    ]
    on_time = [e for e, (_, late) in zip(mine, plan, strict=True) if not late]
    late = [e for e, (_, late) in zip(mine, plan, strict=True) if late]
    stream = sorted(events + on_time, key=lambda e: e.at)
    assert stream[-1].at > late[-1].at + 2 * timeout, "the others' events run hours past"
    marks = sentinels(events[-1].at + 30 * DAY_MS)
    order = stream + late + marks
    expected = expected_outputs(config, order, until=marks[0].at - SMALL_LATENESS_MS)
    # The contract's count, independently. Each late input follows a timer close of its
    # user's episode (the test waits for it) at the episode's last input + timeout, and the
    # close moves the user's clock there (time never runs backwards in a state): the input is
    # applied at max(its time, that close), and is `closed_early` if its time is not after it.
    closes: list[tuple[int, int]] = []  # (the episode's start, the close) of each timer close
    started, applied = on_time[0].at, on_time[-1].at
    closed_early = 0
    for event in late:
        close = applied + timeout
        closes.append((started, close))
        closed_early += event.at <= close
        started = applied = max(event.at, close)
    closes.append((started, applied + timeout))
    assert closed_early == 4  # 50 min is 38 min after 12 min, but the clock is past it by then

    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    topic = dep.topics.events.name
    await produce_paced(kafka, topic, [timed(e) for e in stream])
    # Each episode closed by the timer before the next late input: the others' events make
    # it due, and the test waits for the close (its id names its start and number).
    for number, ((opened, _), event) in enumerate(zip(closes, [*late, None], strict=True), 1):
        await collect_outputs(dep, [episode_id(late_user, opened, number)])
        if event is not None:
            await produce_paced(kafka, topic, [timed(event)])
    await produce_paced(kafka, topic, [timed(e) for e in marks])

    records, states = await assert_equals_replay(dep, expected, covered=lambda u: u != late_user)
    assert diverging_users(records, states, expected) == {late_user}
    timer_closes = [
        (m["started_at"], m["closed_at"])
        for m in by_user(records)[late_user]
        if "closed_at" in m and m["reason"] == "timeout"
    ]
    assert sorted(set(timer_closes)) == closes, "the timer closed where the contract says"
    assert worker.stop() == 0
    log = worker.log_text()
    counts = last_summary(log)
    assert counts["closed_early"] == closed_early, counts
    assert closed_early_users(log) == [late_user] * closed_early
    assert counts["behind_watermark"] == len(late), counts
    assert counts["clock_ahead"] == 0, counts


# --- (e) live traffic, a silent user on an idle partition ----------------------------------

LIVE_TIMEOUT_MS = 3_000
LIVE_IDLE_MS = 1_000
LIVE_LATENESS_MS = 500
LIVE_TICK_S = 0.5
LIVE_SLACK_S = 1.5
"""On top of timeout + max(lateness, idle) + one tick: the Kafka hops no tick hides (the
last event's produce -> fetch, the tick's produce -> fetch, the episode's produce -> our
fetch, the batch window). Each takes milliseconds idle, a few hundred on 2 busy cores."""
LIVE_GAP_S = 0.05  # between two produced events: each user every ~0.7 s, far below the timeout
LIVE_USERS = 12


def short_config(path: Path, timeout: str) -> Path:
    """Write an engine config with one intent and `episodeTimeout` = `timeout` to `path`."""
    path.write_text(
        json.dumps(
            {
                "episodeTimeout": timeout,
                "intents": {
                    "upgrade": {"signals": {"pricing.viewed": 3}, "outcome": "upgrade.completed"}
                },
            }
        )
    )
    return path


async def test_a_silent_user_on_an_idle_partition_closes_on_time(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Live traffic (ts = now): one user goes silent, and with it its whole partition, while
    the others keep going. Its episode closes at last event + timeout, published no earlier
    than that + lateness and within timeout + max(lateness, idle) + one tick (+ slack) of the
    event; everything else equals the replay once the traffic stops."""
    dep = deployment(
        kafka,
        request.node.name,
        config_path=short_config(tmp_path / "live.json", f"{LIVE_TIMEOUT_MS}ms"),
        settings={
            "ORACULAR_LATENESS_MS": str(LIVE_LATENESS_MS),
            "ORACULAR_IDLE_MS": str(LIVE_IDLE_MS),
            "ORACULAR_TICK_INTERVAL_S": str(LIVE_TICK_S),
        },
    )
    silent = user_on(0, "silent")
    others = [user_on(1 + n % (PARTITIONS - 1), f"live{n}") for n in range(LIVE_USERS)]
    await dep.create_topics()
    worker = worker_for(faust_worker, dep)
    worker.start()
    topic = dep.topics.events.name
    sent: list[Event] = []
    producer = AIOKafkaProducer(bootstrap_servers=kafka, acks="all", linger_ms=0)
    await producer.start()

    async def send(user: str) -> Event:
        n = len(sent)
        name = "pricing.viewed" if n % 3 == 0 else "page.viewed"
        event = Event(user, int(time.time() * 1000), name, id=f"e{n}")
        sent.append(event)
        key, value = encode_event(event)
        await producer.send_and_wait(topic, value, key=key)  # in order, one at a time
        await asyncio.sleep(LIVE_GAP_S)  # pacing is the scenario, not a wait
        return event

    stop = asyncio.Event()

    async def keep_going() -> None:
        n = 0
        while not stop.is_set():
            await send(others[n % len(others)])
            n += 1

    try:
        for n in range(3 * (LIVE_USERS + 1)):
            await send(silent if n % (LIVE_USERS + 1) == 0 else others[n % (LIVE_USERS + 1) - 1])
        last = await send(silent)  # the silent partition's last input
        async with TopicReader(kafka, [dep.topics.episodes.name]) as episodes:
            going = asyncio.create_task(keep_going())
            try:
                records = await episodes.wait_for(
                    lambda got: any(r.key == silent.encode() for r in got),
                    timeout_s=CLOSE_TIMEOUT_S,
                    what="the silent user's close",
                )
                arrived_ms = time.time() * 1000
            finally:
                stop.set()
                await going
    finally:
        await producer.stop()
    [record] = [r for r in records if r.key == silent.encode()]
    message = decode_output(record.value)
    print(
        f"closed {arrived_ms - last.at:.0f} ms after the last event, published at "
        f"+{record.timestamp - last.at} ms"
    )
    assert message["closed_at"] == last.at + LIVE_TIMEOUT_MS and message["reason"] == "timeout"
    assert record.timestamp > last.at + LIVE_TIMEOUT_MS + LIVE_LATENESS_MS, "closed too early"
    bound_s = (LIVE_TIMEOUT_MS + max(LIVE_LATENESS_MS, LIVE_IDLE_MS)) / 1000 + LIVE_TICK_S
    assert arrived_ms - last.at <= (bound_s + LIVE_SLACK_S) * 1000, (
        f"closed {arrived_ms - last.at:.0f} ms after the last event; the bound is "
        f"{bound_s:.1f} s + {LIVE_SLACK_S} s slack"
    )

    # With the traffic stopped, every partition goes idle and closes its episodes.
    expected = expected_outputs(dep.config, sent, until=END_OF_TIME)
    assert len(expected.episodes) > LIVE_USERS // 2
    await assert_equals_replay(dep, expected)
    assert worker.stop() == 0
    counts = last_summary(worker.log_text())
    # (behind_watermark may count an input whose Kafka hop outlasted the lateness after an
    # idle spell on a loaded box; with every gap far below the timeout that closes nothing.)
    assert counts["closed_early"] == 0, counts


# --- (f) a backfill over newer data first, then older -------------------------------------


async def test_backfill_of_newer_then_older_data_equals_the_replay(
    kafka: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`oracular backfill` over a topic holding the newer half of a history first and then
    the older half: it closes nothing until a partition reached its end offset, then at
    max(newest, now) − lateness, so it equals `oracular replay --until` that of the topic's
    order. All data is months old, so that is every deadline, as --until the end of time."""
    dep = deployment(kafka, request.node.name)
    events = historical_stream(dep.config, events=1_500, seed=26)
    half = len(events) // 2
    order = events[half:] + events[:half]
    timeout = dep.config.episode_timeout_ms
    assert timeout is not None
    final_watermark = int(time.time() * 1000) - DEFAULT_LATENESS_MS  # the backfill's, or later
    assert max(e.at for e in events) + timeout < final_watermark
    expected = expected_outputs(dep.config, order, until=END_OF_TIME)
    assert expected.messages == expected_outputs(dep.config, order, until=final_watermark).messages
    await dep.create_topics()
    await produce_paced(kafka, dep.topics.events.name, [timed(e) for e in order])

    app_id = dep.app_id + "-bf"
    done = await run_backfill(dep, app_id, tmp_path / "state")
    assert done.returncode == 0, done.stderr[-3000:]
    handled = f"applied={len(events)}, redelivered=0, duplicate_id=0, dead_lettered=0"
    assert f"complete: {handled}" in done.stderr
    assert "closed_early=0" in done.stderr and "behind_watermark=0" in done.stderr

    # The backfill has exited: everything it published is on the broker.
    outputs = [dep.topics.predictions.name + ".bf", dep.topics.episodes.name + ".bf"]
    records = [r for topic in outputs for r in await read_all(kafka, topic)]
    problems = output_problems(records, expected)
    assert not problems, f"{len(problems)} differences from the replay, e.g.:\n" + "\n".join(
        problems[:10]
    )
    changelog = await read_all(kafka, f"{app_id}-oracular-state-changelog")
    states = changelog_states(changelog, dep.config)
    assert states == expected.states, sorted(
        u for u in set(states) | set(expected.states) if states.get(u) != expected.states.get(u)
    )[:10]
    assert not await read_all(kafka, dep.topics.dlq.name + ".bf")


# --- (g) a changed episodeTimeout applies to open episodes ----------------------------------


async def test_a_changed_timeout_applies_to_episodes_open_across_the_restart(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Episodes opened under `episodeTimeout: 1h`; the worker stops, the config is rewritten
    to 5s and the worker restarts (same app id and datadir): the idle partitions' clocks run
    on, and each episode closes at its last event + 5 s, as the replay under the new config
    closes it."""
    config_path = short_config(tmp_path / "timeout.json", "1h")
    dep = deployment(
        kafka,
        request.node.name,
        config_path=config_path,
        settings={"ORACULAR_IDLE_MS": "1000", "ORACULAR_LATENESS_MS": "500"},
    )
    old = dep.config
    start = int(time.time() * 1000) - 90 * DAY_MS
    users = [user_on(n % PARTITIONS, f"open{n}") for n in range(12)]
    events = [
        Event(user, start + (k * len(users) + n) * 250, name, id=f"{user}-{k}")
        for k, name in enumerate(["page.viewed", "pricing.viewed", "page.viewed", "pricing.viewed"])
        for n, user in enumerate(users)
    ]
    before = expected_outputs(old, events, until=END_OF_TIME)

    await dep.create_topics()
    worker = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    worker.start()
    await produce_paced(kafka, dep.topics.events.name, [timed(e) for e in events])
    await collect_outputs(dep, before.predictions)
    await wait_committed(dep)
    assert worker.stop() == 0
    # Nothing closed under the hour's timeout: all are open across the restart.
    assert not await read_all(kafka, dep.topics.episodes.name)

    short_config(config_path, "5s")
    dep.config = new = load_config(config_path)
    assert new.episode_timeout_ms == 5_000
    expected = expected_outputs(new, events, until=END_OF_TIME)
    assert expected.predictions == before.predictions, "every gap is below both timeouts"
    worker.start()
    records, _ = await assert_equals_replay(dep, expected)
    assert worker.stop() == 0
    last = {e.user: e.at for e in events}
    closes = [m for r in records if "closed_at" in (m := decode_output(r.value))]
    assert {m["user"] for m in closes} == set(users)
    assert all(m["closed_at"] == last[m["user"]] + 5_000 for m in closes), closes
