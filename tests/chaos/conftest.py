"""Fixtures of the chaos suite: the session's broker, and a dedicated one it may restart.

`kafka` is the integration suite's session broker (imported, so this directory sees it). The
full run restarts its broker mid-stream, so it starts its own (`chaos_broker`) on free ports,
with its controller on the next port: a restart reuses the same data dir and both ports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.broker import Broker, BrokerError, free_port, port_is_free, start_broker
from tests.integration.conftest import _unavailable, faust_worker, kafka

__all__ = ["RestartableBroker", "chaos_broker", "faust_worker", "kafka"]

PORT_ATTEMPTS = 50


def _port_pair() -> int:
    """A free port whose successor is free too (the broker's controller listens there)."""
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        if port < 65535 and port_is_free(port + 1):
            return port
    msg = "no two consecutive free ports found for the chaos broker"
    raise BrokerError(msg)


class RestartableBroker:
    """A broker of the test's own; `restart` stops it and starts it on the same dir and ports."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def restart(self) -> None:
        """SIGTERM (SIGKILL after 20 s), then start again on the same data dir and ports."""
        old = self.broker
        old.stop()
        self.broker = start_broker(old.workdir, port=old.port, stop_with_parent=True)


@pytest.fixture
def chaos_broker(tmp_path: Path) -> Iterator[RestartableBroker]:
    """A broker of this test's own, on a port pair it keeps across a restart."""
    try:
        broker = start_broker(tmp_path / "kafka", port=_port_pair(), stop_with_parent=True)
    except BrokerError as exc:
        _unavailable(str(exc))
    handle = RestartableBroker(broker)
    yield handle
    handle.broker.stop(wipe=True)
