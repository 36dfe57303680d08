"""`oracular tail`'s stop on SIGINT or SIGTERM (`streams.cli.kafka.StopOnce`): once, and never
a traceback when both arrive together (as `make run` sends them on Ctrl-C)."""

from __future__ import annotations

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
    with pytest.raises(KeyboardInterrupt):
        stop(signal.SIGINT, None)
    assert stop(signal.SIGTERM, None) is None
    assert stop(signal.SIGINT, None) is None


def test_sigint_and_sigterm_arriving_together_stop_once_without_an_error(handlers: None) -> None:
    """Both signals are pending before Python runs a handler (blocked, then released at
    once): the first raises KeyboardInterrupt, and the second must find a handler still there,
    not SIG_IGN (CPython raises `OSError: Signal 15 ignored due to race condition` then)."""
    stop = StopOnce()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
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
        with pytest.raises(KeyboardInterrupt):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
            for _ in range(1000):  # the handlers run between bytecodes; give them a few
                pass
    for _ in range(1000):  # the second one's turn: nothing may be raised
        pass
    assert stop.stopped
