"""`oracular produce` and `oracular tail`: put events on the input topic, watch the outputs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import io
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError

from engine import Event
from schemas.events import encode_event
from schemas.files import CsvColumns, FileFormat, plausible_times, read_lines, write_jsonl
from schemas.outputs import decode_output
from streams.runtime.progress import Progress
from streams.tools.admin import BrokerError, no_broker_message, quiet_aiokafka
from streams.tools.pretty import ORDER_WINDOW_S, Filter, Tally, event_time, format_message


def read_events(
    path: Path, fmt: FileFormat, columns: CsvColumns | None = None
) -> tuple[list[Event], int]:
    """The events of a file, for `produce`; each unusable line is reported on stderr.

    Returns:
        (events, skipped): skipped lines were reported with their line number.

    Raises:
        EventFileError: the file cannot be read at all (a CSV header without a mapped column).
    """
    with path.open("rb") as handle:
        lines = list(plausible_times(read_lines(handle, fmt, columns), int(time.time() * 1000)))
    events = [line.event for line in lines if line.event is not None]
    for line in lines:
        if line.event is None and not line.ignored:
            print(f"oracular produce: skipped {line.error}", file=sys.stderr)
    return events, len(lines) - len(events)


@dataclass
class Acked:
    """How many sends the broker acknowledged."""

    count: int = 0

    def done(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.count += 1


async def produce_events(
    bootstrap: str,
    topic: str,
    events: Sequence[Event],
    *,
    now_ms: int | None = None,
    client: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    acked: Acked | None = None,
) -> int:
    """Send `events` to `topic` as msgpack, keyed by user (murmur2); returns how many. `acked`
    counts those the broker acknowledged, as they are (what an interrupted run can say).

    With `now_ms`, times are shifted so the last event happens at `now_ms` (a demo then sees
    live timeouts); gaps between events are kept. The caller checked the broker and the topic
    (`streams.tools.admin.require_broker`).

    Raises:
        BrokerError: the broker went away.
    """
    shift = 0 if now_ms is None or not events else now_ms - max(e.at for e in events)
    async with _idempotent_producer(bootstrap, topic, client) as producer:
        for n, event in enumerate(events, start=1):
            shifted = dataclasses.replace(event, at=event.at + shift)
            # The record timestamp is the event time, so `backfill --since` finds it.
            future = await producer.send(
                topic,
                encode_event(shifted),
                key=event.user.encode(),
                timestamp_ms=event.at + shift,
            )
            if acked is not None:
                future.add_done_callback(acked.done)
            if progress is not None:
                progress.advance(n)
        await producer.flush()
    return len(events)


async def send_commands(
    bootstrap: str,
    topic: str,
    commands: Sequence[Mapping[str, Any]],
    client: Mapping[str, Any] | None = None,
) -> list[tuple[int, int]]:
    """Send command messages (msgpack) to `topic`, each keyed by its user (murmur2, the
    partition the worker and the lookup API expect); (partition, offset) of each, once the
    broker has them all.

    Raises:
        BrokerError: the broker went away.
    """
    async with _idempotent_producer(bootstrap, topic, client) as producer:
        futures = [
            await producer.send(
                topic,
                msgpack.packb(command),
                key=str(command["user"]).encode(),
                timestamp_ms=int(command["ts"]),
            )
            for command in commands
        ]
        return [((meta := await f).partition, meta.offset) for f in futures]


@contextlib.asynccontextmanager
async def _idempotent_producer(
    bootstrap: str, topic: str, client: Mapping[str, Any] | None
) -> AsyncIterator[AIOKafkaProducer]:
    """A started producer for `topic`, stopped at the end; the broker's errors as BrokerError.

    Idempotent: a batch retried after a lost acknowledgement (a leader that moved) is not
    written twice. A copy would be a new offset, applied as a second input.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        **(client or {}),
    )
    try:
        with quiet_aiokafka():
            await producer.start()
        yield producer
    except KafkaConnectionError as exc:
        raise BrokerError(no_broker_message(bootstrap)) from exc
    except KafkaError as exc:
        msg = f"sending to {topic} on {bootstrap} failed: {exc}"
        raise BrokerError(msg) from exc
    finally:
        await producer.stop()


QUIET_S = 5.0
"""With `--pretty`, a tally is printed once the outputs have been quiet this long."""


MAX_HELD = 100_000
"""More held outputs than this are printed at once, oldest event time first (bounded memory)."""


@dataclass(order=True)
class _Held:
    at: int
    seq: int
    arrived: float = dataclasses.field(compare=False)
    topic: str = dataclasses.field(compare=False)
    message: dict[str, Any] = dataclasses.field(compare=False)


class EventTimeOrder:
    """`oracular tail`: outputs of several partitions and topics, fetched partition by
    partition, merged by time: each is held for `window_s` of wall time and released in
    event-time order (streams.tools.pretty.event_time; arrival order among equal times); a window
    of 0 releases each at once, in arrival order."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._heap: list[_Held] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, topic: str, message: dict[str, Any], timestamp: int, arrived: float) -> None:
        self._seq += 1
        at = event_time(message, timestamp)
        heapq.heappush(self._heap, _Held(at, self._seq, arrived, topic, message))

    def ready(self, now: float, *, catching_up: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """What may be printed at wall time `now`: the earliest held while it has been held
        for the window (nothing while `catching_up`, unless more than MAX_HELD are held)."""
        out = []
        while self._heap:
            first = self._heap[0]
            over = len(self._heap) > MAX_HELD
            if not over and (catching_up or now - first.arrived < self.window_s):
                break
            heapq.heappop(self._heap)
            out.append((first.topic, first.message))
        return out

    def drain(self) -> list[tuple[str, dict[str, Any]]]:
        """Everything held, in event-time order."""
        out = []
        while self._heap:
            held = heapq.heappop(self._heap)
            out.append((held.topic, held.message))
        return out


async def tail_topics(
    bootstrap: str,
    topics: Sequence[str],
    *,
    from_beginning: bool,
    limit: int | None,
    idle_s: float | None,
    out: TextIO,
    client: Mapping[str, Any] | None = None,
    tally: Tally | None = None,
    keep: Filter | None = None,
    window_s: float = ORDER_WINDOW_S,
    stopping: Callable[[], bool] = lambda: False,
) -> int:
    """Print output messages as they arrive, until `limit`, `idle_s` or `stopping()`: one JSON
    line each, or,
    with `tally`, one readable line each (streams/tools/pretty.py), counted in `tally`, whose
    running summary goes to stderr whenever the outputs fall quiet for `QUIET_S`. Only the messages
    `keep` accepts are shown (and counted); they come out in event-time order within
    `window_s` (EventTimeOrder).

    The caller checked the broker and the topics (`streams.tools.admin.require_broker`).
    """
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        **(client or {}),
    )
    await consumer.start()
    order = EventTimeOrder(window_s)
    shown = 0
    last = time.monotonic()
    noted = True  # nothing shown since the last quiet note

    def show(released: list[tuple[str, dict[str, Any]]]) -> None:
        nonlocal shown, noted
        for topic, message in released:
            if limit is not None and shown >= limit:
                return
            noted = False
            if tally is None:
                out.write(_json_line(topic, message) + "\n")
            else:
                tally.add(message)
                out.write(format_message(message, topic) + "\n")
            shown += 1
        out.flush()

    try:
        # `stopping` as well as the signal's cancel: Python 3.11's wait_for (used inside
        # aiokafka) can swallow a cancel that lands as its inner call completes, and the tail
        # then ran on after the Ctrl-C of `make run` on a loaded machine.
        while (limit is None or shown < limit) and not stopping():
            batches = await consumer.getmany(timeout_ms=500)
            now = time.monotonic()
            for batch in batches.values():
                for record in batch:
                    last = now
                    message = _decode(record.value)
                    if keep is None or keep(message):
                        order.push(record.topic, message, record.timestamp, now)
            show(order.ready(now, catching_up=await _catching_up(consumer)))
            quiet = now - last
            if not order and idle_s is not None and quiet > idle_s:
                break
            if not order and tally is not None and not noted and quiet > QUIET_S:
                print(f"-- quiet for {QUIET_S:g} s; so far: {tally.summary()}", file=sys.stderr)
                noted = True
    finally:
        with contextlib.suppress(Exception):  # Ctrl-C: what was held still comes out
            show(order.drain())
        await consumer.stop()
    return shown


async def _catching_up(consumer: AIOKafkaConsumer) -> bool:
    """True while a partition's position is behind the end the consumer last saw."""
    for tp in consumer.assignment():
        end = consumer.highwater(tp)
        if end is not None and await consumer.position(tp) < end:
            return True
    return False


def _decode(value: bytes | None) -> dict[str, Any]:
    """The output message, or `{"undecodable": <its first 64 bytes>}` if it is not a map."""
    try:
        message: Any = decode_output(value or b"")
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        message = None
    if not isinstance(message, dict):
        message = {"undecodable": (value or b"")[:64].decode("latin-1")}
    return message


def _json_line(topic: str, message: Mapping[str, Any]) -> str:
    """The message with its topic, as `oracular replay` writes it: a dead letter's own `topic`
    (where the input came from) becomes `source_topic`."""
    buffer = io.StringIO()
    write_jsonl(buffer, dict(message), topic)
    return buffer.getvalue().rstrip("\n")


def run(coro: Any) -> Any:
    """asyncio.run, with Ctrl-C ending quietly.

    Raises:
        BrokerError: an aiokafka client could not reach the broker (rather than its traceback).
    """
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        return None
    except KafkaConnectionError as exc:
        msg = f"lost the broker: {exc}. Is it up? (`make broker-up` starts the local one)"
        raise BrokerError(msg) from exc
