"""Fixtures for tests against a real Kafka broker.

The session gets one broker: the one at BROKER_URL if that is set, otherwise a fresh one that
infra.broker starts on free ports in a temp dir (stopped and wiped at the end). Tests isolate
themselves with unique topic names and app ids.

If no broker can be had, the tests fail when CI=true or REQUIRE_BROKER=1 (CI must never turn a
broken broker into green skips), and are skipped otherwise, saying how to get one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import pytest

from infra.broker import BrokerError, probe, start_broker

from .support import FaustWorker, unique_name


def _broker_required() -> bool:
    truthy = {"1", "true", "yes"}
    return (
        os.environ.get("CI", "").lower() in truthy
        or os.environ.get("REQUIRE_BROKER", "").lower() in truthy
    )


def _unavailable(reason: str) -> NoReturn:
    if _broker_required():
        pytest.fail(f"Kafka broker unavailable (CI/REQUIRE_BROKER set): {reason}", pytrace=False)
    pytest.skip(
        f"Kafka broker unavailable: {reason}\n"
        "Install java 17+ and maven so the tests can start their own broker, or run "
        "`make broker-up` and set BROKER_URL=127.0.0.1:9092."
    )


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address ("host:port") of a broker that answers metadata requests."""
    url = os.environ.get("BROKER_URL")
    if url:
        bootstrap = url.split("://", 1)[-1]
        if not probe(bootstrap, timeout_s=10.0):
            _unavailable(f"BROKER_URL={url} does not answer a metadata request")
        yield bootstrap
        return
    try:
        broker = start_broker(tmp_path_factory.mktemp("kafka"), port=None, stop_with_parent=True)
    except BrokerError as exc:
        _unavailable(str(exc))
    print(f"Kafka broker for this session: {broker.bootstrap}, log {broker.log_path}")
    yield broker.bootstrap
    broker.stop(wipe=True)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Unique names for this test: name("in") -> "test_x-in-3f2a9c01d4"."""
    return lambda suffix: unique_name(f"{request.node.name}-{suffix}")


WorkerFactory = Callable[..., FaustWorker]


@pytest.fixture
def faust_worker(kafka: str, tmp_path: Path) -> Iterator[WorkerFactory]:
    """Make Faust workers (not yet started); whatever still runs at teardown is killed.

    ``faust_worker("streams.worker", app_id="x", env={...})`` gives a worker wired to the
    session broker with its own datadir and log under tmp_path. `argv` replaces the default
    ``python -m faust -A <app> worker ...`` command (e.g. the product's ``oracular worker``).
    """
    workers: list[FaustWorker] = []

    def make(
        app: str,
        *,
        app_id: str,
        env: Mapping[str, str] | None = None,
        argv: Sequence[str] | None = None,
    ) -> FaustWorker:
        worker = FaustWorker(
            app,
            # A free port for the lookup API unless the test says otherwise: 6067 is the
            # user's own worker's, which would then move and be confused with a test's.
            env={
                "ORACULAR_BROKER": kafka,
                "ORACULAR_APP_ID": app_id,
                "ORACULAR_API_PORT": "0",
                **(env or {}),
            },
            datadir=tmp_path / app_id / "data",
            log_path=tmp_path / app_id / "worker.log",
            argv=argv,
        )
        print(f"worker {app_id}: log {worker.log_path}")  # shown if the test fails
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        if worker.running:
            worker.kill()
