"""Real producers against a real worker: an at-least-once pipeline re-sends events with their
ids (right away, and minutes later after the worker restarted on a fresh disk), and one
device's clock jumps to 2036 once. The worker's outputs and states are the replay's of the
stream as it was meant: every event once, the wrong-clock one dead-lettered."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine import Event

from .conftest import WorkerFactory
from .test_real_gaps import wait_committed_past
from .test_time_contract import (
    DEFAULT_LATENESS_MS,
    FAST_TICK_S,
    MINUTE_MS,
    assert_equals_replay,
    historical_stream,
    produce_paced,
    timed,
    user_on,
    worker_for,
)
from .worker_support import (
    deployment,
    expected_outputs,
    last_summary,
    relocate,
    sentinels,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

YEAR_2036_MS = 2_082_758_400_000  # 2036-01-01T00:00:00Z
RETRIED_SHARE = 0.05


def with_retries(events: list[Event], seed: int) -> tuple[list[Event], int]:
    """`events` with 5% of them sent a second time with the same id: half right after the
    original, half about 300 events later (a relay restarted from an older position)."""
    rng = random.Random(seed)
    late_copies: dict[int, list[Event]] = {}
    out: list[Event] = []
    copies = 0
    for n, event in enumerate(events):
        out.append(event)
        out.extend(late_copies.pop(n, []))
        if rng.random() < RETRIED_SHARE:
            copies += 1
            if rng.random() < 0.5:
                out.append(event)
            else:
                late_copies.setdefault(min(n + 300, len(events) - 1), []).append(event)
    assert not late_copies
    return out, copies


async def test_retried_events_count_once_and_a_clock_in_2036_moves_nobody(
    kafka: str, request: pytest.FixtureRequest, faust_worker: WorkerFactory, tmp_path: Path
) -> None:
    dep = deployment(kafka, request.node.name)
    config = dep.config
    events = historical_stream(config, events=1_600, seed=31)
    # A user whose device clock jumps to 2036 for one event, amid normal events of theirs.
    wrong = user_on(2, "wrong-clock")
    start = events[len(events) // 4].at
    names = ("pricing.viewed", "limit.hit", "page.viewed")
    own = [
        Event(wrong, start + n * 4 * MINUTE_MS, name=names[n % 3], id=f"{wrong}-{n}")
        for n in range(10)
    ]
    future = Event(wrong, YEAR_2036_MS, name="pricing.viewed", id=f"{wrong}-2036")
    stream = sorted([*events, *own], key=lambda e: e.at)
    at = stream.index(own[0]) + 1
    sent_once = [*stream[:at], future, *stream[at:]]
    sent, copies = with_retries(sent_once, seed=32)
    marks = sentinels(events[-1].at + 30 * 24 * 60 * MINUTE_MS)
    until = marks[0].at - DEFAULT_LATENESS_MS
    expected = expected_outputs(config, [*stream, *marks], until=until)
    assert any(m["user"] == wrong for m in expected.episodes.values())

    # Records stamped in the stream's own time, as `oracular produce` stamps them; the
    # wrong-clock event by its device's real time (its neighbour's).
    records = [timed(e, stamp.at) for e, stamp in zip(sent, _stamps(sent, future), strict=True)]
    records += [timed(m, m.at) for m in marks]
    half = len(sent) // 2

    await dep.create_topics()
    first = worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S)
    first.start()
    written = await produce_paced(kafka, dep.topics.events.name, records[:half], rate=2_000)
    last: dict[int, int] = {}
    for meta in written:
        last[meta.partition] = max(last.get(meta.partition, -1), meta.offset)
    await wait_committed_past(dep, last)
    assert first.stop() == 0
    # The rest, with the later copies of the first half's events, on a worker that restores
    # every user (and the ids each remembers) from the changelog onto an empty disk.
    second = relocate(
        worker_for(faust_worker, dep, ORACULAR_TICK_INTERVAL_S=FAST_TICK_S), tmp_path / "second"
    )
    second.start()
    await produce_paced(kafka, dep.topics.events.name, records[half:], rate=2_000)
    await assert_equals_replay(dep, expected, dead_letters=["2036-01-01T00:00:00.000Z runs"])
    assert second.stop() == 0
    counts = [last_summary(w.log_text()) for w in (first, second)]
    assert sum(c["duplicate_id"] for c in counts) == copies > 40, counts
    assert sum(c["applied"] for c in counts) == len(stream) + len(marks), counts
    assert sum(c["clock_ahead"] for c in counts) == 1, counts
    assert all(c["redelivered"] == 0 and c["closed_early"] == 0 for c in counts), counts


def _stamps(sent: list[Event], future: Event) -> list[Event]:
    """The event whose time stamps each record: its own, or for the wrong-clock event the
    event sent before it (what the device's real clock said)."""
    out = []
    for n, event in enumerate(sent):
        out.append(sent[n - 1] if event is future else event)
    return out
