"""Batches off Faust's stream: `take_batches`, the buffer's length, and `RawSchema`.
Helpers that read Faust's stream internals for speed; no method of Faust is replaced here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from faust.serializers.schemas import Schema


async def take_batches(
    stream: Any, max_: int, within: float, pending: Callable[[], bool] = lambda: False
) -> AsyncIterator[list[Any]]:
    """Lists of up to `max_` events from an agent's `stream`, for the agent to ack by hand
    (`ack_all`): what `stream.noack_take(max_, within)` yields, read from the stream's buffer
    a batch at a time. An empty list when the buffer is empty and `pending()` says the agent
    holds events it has not acked yet: before waiting for more, the agent finishes those
    (Faust's rebalance empties the buffer, then waits until every delivered event is acked).

    `noack_take` runs every event through Faust's stream iterator in a task of its own (a
    loop turn, a buffer `get`, three coroutines and a processor per event): taking the
    buffer a batch at a time cut the worker's CPU per event by a large share (an A/B in
    BENCHMARKS.md). This keeps that iterator's bookkeeping for each
    event, as 0.15.3 has it (`faust/_cython/streams.pyx`, which Faust runs when its extension
    is built, and `Stream._py_aiter`): an event delivered before a rebalance (another
    consumer generation, or flow suspended) is skipped, and every other message is tracked as
    unacked (`Consumer.track_message`) before the agent gets it. A skipped event is not
    acked, as the compiled iterator does (the pure-Python one acks it, which could let a
    commit pass a record the new generation has not applied yet). The window differs: it
    runs from the start of the last batch, so batches start at most once a window but a batch
    that took longer than the window is followed at once (measured from the batch's end, the
    window added its whole length to every batch's cycle at live rates: a higher p50 and p99,
    BENCHMARKS.md), and an event arriving after it has
    passed is taken at once rather than at the next tick of the window, so a quiet worker
    answers sooner.
    """
    app = stream.app
    queue = stream.channel.queue  # the agent's buffer, filled by Faust's conductor
    unacked = app.consumer.unacked
    acking_topics = app.topics.acking_topics
    on_message_in = app.sensors.on_message_in
    flow_active = app.flow_control.is_active
    loop = asyncio.get_running_loop()
    window_ends = loop.time()
    while not stream.should_stop:
        if queue.empty() and pending():
            yield []
            await asyncio.sleep(0)  # never a loop that starves the event loop
            continue
        try:
            first = await queue.get()  # raises what the channel was thrown (`queue._errors`)
        except StopAsyncIteration:  # the stream's end (shutdown): as Faust's iterator ends
            return
        wait = window_ends - loop.time()
        if wait > 0 and queue.qsize() + 1 < max_:
            await asyncio.sleep(wait)
        taken = [first]
        try:
            while len(taken) < max_ and not queue.empty():
                taken.append(queue.get_nowait())
        except StopAsyncIteration:  # ended with events taken: they stay unacked (re-read)
            return
        # Neither changes while the loop runs (it never awaits): read once per batch.
        generation, active = app.consumer_generation_id, flow_active()
        events = []
        for event in taken:
            message = event.message
            if not active or message.generation_id != generation:
                continue  # read again from the committed offset by the new generation
            if message.topic in acking_topics and not message.tracked:
                message.tracked = True
                unacked.add(message)
                on_message_in(message.tp, message.offset, message)
            events.append(event)
        # The window runs from the batch's start: one that took longer is followed at once.
        window_ends = loop.time() + within
        if events:
            yield events


def buffered(stream: Any) -> int:
    """Events waiting in an agent's `stream` buffer (delivered, not taken yet)."""
    size: int = stream.channel.queue.qsize()
    return size


class RawSchema(Schema):
    """Keys and values as the bytes Kafka holds (`bytes` types, Faust's `raw` codec), decoded
    without Faust's serializer registry.

    Faust's compiled decode runs every record's key and value through the registry (a codec
    lookup, the `raw` codec, a type check) and looks the event class up in the app's settings:
    a visible share of the worker's time (py-spy, BENCHMARKS.md) to hand over the same bytes. For
    this schema that is the identity, so `compile` makes the event at once, as Faust's decode would
    (aiokafka gives bytes or None; the raw codec and `bytes` type return them unchanged). Encoding
    (sending ticks) is Faust's own. A test holds the events to those of Faust's decode.
    """

    def __init__(self) -> None:
        super().__init__(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )

    def compile(self, app: Any, *, default_propagate: bool = False, **_: Any) -> Any:
        event_class = app.conf.Event  # what app.create_event makes, read once

        async def decode(message: Any, *, propagate: bool = default_propagate) -> Any:
            return event_class(app, message.key, message.value, message.headers, message)

        return decode
