"""`oracular tail`'s stop on SIGINT or SIGTERM (`streams.cli.kafka.StopOnce`): once, quietly,
its run's `finally` blocks run, and never a traceback, also when both signals arrive together
(as `make run` sends them on Ctrl-C)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from streams.cli.kafka import StopOnce


@pytest.fixture
def handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_the_first_signal_stops_and_the_rest_are_ignored() -> None:
    stop = StopOnce()
    stop(signal.SIGINT, None)  # outside a run: recorded, never raised
    assert stop.stopped
    stop(signal.SIGTERM, None)
    stop(signal.SIGINT, None)
    assert stop.stopped


def test_a_signal_cancels_the_run_whose_finally_blocks_then_run_and_nothing_else_is_hit(
    handlers: None,
) -> None:
    """The run's main task is cancelled: its `finally` runs (the tail prints what it holds
    there and stops its consumer, awaiting), the run returns None, and the busy task beside
    it (as aiokafka's fetch task is), running when the signal comes, gets no exception; later
    signals are ignored."""
    stop = StopOnce()
    stop.install()
    seen: list[tuple[str, bool]] = []

    async def busy() -> None:
        for turn in range(1_000_000):
            if turn == 10:  # the signal's handler runs in this task's step, as in aiokafka's
                os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0)

    async def tail() -> str:
        beside = asyncio.ensure_future(busy())
        try:
            await asyncio.sleep(60)
            return "not stopped"
        finally:
            await asyncio.sleep(0.01)  # an await in the finally still runs
            seen.append(("finally", beside.done()))  # done: an exception landed in it
            beside.cancel()

    assert stop.run(tail()) is None
    assert seen == [("finally", False)]
    os.kill(os.getpid(), signal.SIGINT)  # after the run: the summary must still print
    for _ in range(1000):  # handlers run between bytecodes: give it a few
        pass
    assert stop.stopped


def test_a_run_that_ends_by_itself_returns_its_value() -> None:
    async def done() -> int:
        return 7

    assert StopOnce().run(done()) == 7


def test_a_signal_before_the_run_ends_it_at_once() -> None:
    stop = StopOnce()
    stop(signal.SIGTERM, None)
    started: list[bool] = []

    async def tail() -> None:
        started.append(True)

    assert stop.run(tail()) is None
    assert started == []


def test_sigint_and_sigterm_arriving_together_stop_once_without_an_error(handlers: None) -> None:
    """Both signals are pending before Python runs a handler (blocked, then released at
    once): the second must find a handler still there, not SIG_IGN (CPython raises `OSError:
    Signal 15 ignored due to race condition` then)."""
    stop = StopOnce()
    stop.install()
    both = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, both)
    try:
        # Sent to this thread, not the process: a process-directed signal goes to any thread
        # that does not block it (earlier tests leave threads behind), and its handler then
        # runs here at once instead of staying pending until the unblock below.
        me = threading.get_ident()
        signal.pthread_kill(me, signal.SIGINT)
        signal.pthread_kill(me, signal.SIGTERM)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
        for _ in range(1000):  # the handlers run between bytecodes; give them a few
            pass
    assert stop.stopped
