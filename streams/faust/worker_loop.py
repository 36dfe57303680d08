"""The consumer on the worker's loop: Faust's aiokafka consumer without its own thread.
`Consumer._new_consumer_thread` of Faust's aiokafka driver, patched (`ConsumerOnWorkerLoop`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer

from streams.faust.config import consumer_settings
from streams.faust.upstream import ORIGINALS


class _LoopTask:
    """Stands in for mode's `WorkerThread` (the thread a `ServiceThread` runs in): runs the
    service's `_serve` as a task of the loop that starts it. `ServiceThread.start` starts it and
    waits until the service has started, as it waits for a thread."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self.service._serve()
        except Exception:
            # As `ServiceThread._start_thread` does when its thread's loop ends with an error.
            # Not raised again: `_serve` has logged it and crashed the service (a thread's
            # error ends the thread; a task's would only be reported as never retrieved).
            self.service.set_shutdown()

    def stop(self) -> None:
        """Nothing to join: `ServiceThread.stop` has waited until the service shut down
        (its consumer stopped), which is all the thread's end waited for besides its loop."""

    def is_alive(self) -> bool:
        return self.task is not None and not self.task.done()


class ConsumerOnWorkerLoop(AIOKafkaConsumerThread):
    """Faust's aiokafka consumer, run on the worker's event loop instead of a thread of its own
    (`ORACULAR_CONSUMER_LOOP=worker`, the default; `_new_consumer_thread`).

    Faust runs the aiokafka consumer in a `ServiceThread`: its own thread and event loop, the
    worker's loop asking it for records through a method queue (`call_thread`). In one Python
    process the two threads share the GIL, and the worker's loop is busy applying batches
    (milliseconds of Python each): every step of the consumer's thread (a fetch answer read, a
    record batch parsed, the next fetch sent, records handed over) waited for the GIL, up to
    the interpreter's 5 ms switch interval each time. At half the worker's throughput an input
    record reached the agent several times later than a plain aiokafka consumer's would
    (p50 and p99 produce -> prediction threaded against here: BENCHMARKS.md). On the worker's loop
    the consumer's I/O runs between batches, with nothing to wait for.

    Everything else is Faust's: the method queue (`call_thread` now hands the call to a task of
    the same loop), the rebalance callbacks, the service's start and shutdown. Three things of
    `ServiceThread` assume a thread of its own and are replaced: the thread (`_LoopTask` runs
    the service's `_serve` as a task), the sweep at its end, which cancels every task left on
    the thread's loop (`_gather_remaining_tasks`): here those are the worker's own, and the
    thread's keepalive (`_keepalive2`), which on this loop logged "Thread keepalive is not
    responding" at ERROR after any step of 2 s (the worker's own lease notices stalls,
    streams/runtime/fencing.py).

    What the thread gave, and what stands in for it: aiokafka's heartbeats run on the worker's
    loop, so a batch that blocks the loop longer than `ORACULAR_SESSION_TIMEOUT_S` costs the
    worker its partitions (batches take milliseconds; a mass of timer closes is spread over
    batches; a worker stalled that long fences itself either way, streams/runtime/fencing.py).
    """

    async def _gather_remaining_tasks(self) -> None:
        """Upstream cancels every task of the thread's loop at its end: the worker's here."""

    async def _keepalive2(self) -> None:
        """Upstream checks that the thread's loop runs and pokes the parent's: one loop here."""


def _new_consumer_thread(self: Any) -> Any:
    """`faust.transport.drivers.aiokafka.Consumer._new_consumer_thread`: the consumer on the
    app's own loop when the app says so (`ConsumerSettings.on_worker_loop`, configured by
    `streams.runtime.app.create_runtime`), else Faust's consumer thread."""
    if not consumer_settings(self.app).on_worker_loop:
        return ORIGINALS[AIOKafkaConsumer, "_new_consumer_thread"](self)
    return ConsumerOnWorkerLoop(
        self, loop=self.loop, thread_loop=self.loop, Worker=_LoopTask, beacon=self.beacon
    )
