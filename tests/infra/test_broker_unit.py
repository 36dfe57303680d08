"""infra.broker without a running broker: the failures a user meets must be clear and quick."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import broker
from infra.broker import BrokerError, main


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port on 127.0.0.1 held by "another program" (this test) for the test's duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def fetched_jars(cache_dir: Path) -> Path:
    """A jar cache that fetch_jars() takes as complete for the current pom."""
    lib = cache_dir / "lib"
    lib.mkdir(parents=True)
    (lib / ".fetched").write_text(broker._pom_digest() + "\n")
    return cache_dir


def test_missing_java_and_maven_are_named_in_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn; the jars are not fetched

    with pytest.raises(BrokerError) as failure:
        broker.start_broker(tmp_path / "kafka", cache_dir=tmp_path / "no-jars")

    message = str(failure.value)
    assert message.startswith("The local Kafka broker needs java, mvn on PATH.")
    assert "apt-get install openjdk-17-jre-headless" in message
    assert "apt-get install maven" in message


def test_maven_is_not_required_once_the_jars_are_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(BrokerError, match=r"^The local Kafka broker needs java on PATH\."):
        broker.start_broker(tmp_path / "kafka", cache_dir=fetched_jars(tmp_path / "cache"))


def test_the_cli_prints_the_message_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    assert main(["--dir", str(tmp_path / "kafka"), "up"]) == 1

    err = capsys.readouterr().err
    assert err.startswith("error: The local Kafka broker needs java")
    assert "Traceback" not in err


def test_too_old_java_is_reported_with_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_tool(tmp_path, "java", """echo 'openjdk version "11.0.22" 2024-01-16' >&2""")
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(BrokerError, match=r"needs Java 17 or newer; `java` on PATH is Java 11"):
        broker.start_broker(tmp_path / "kafka", cache_dir=fetched_jars(tmp_path / "cache"))


def test_missing_maven_is_reported_when_the_jars_must_be_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(BrokerError, match=r"needs mvn on PATH.*apt-get install maven"):
        broker.fetch_jars(tmp_path / "cache")


def test_a_port_taken_by_another_program_is_named_with_the_way_out(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    listening_port: int,
) -> None:
    # The check comes before any jar is fetched or java runs (java itself is tested above).
    monkeypatch.setattr(broker, "require_java_17", lambda: None)

    code = main(["--dir", str(tmp_path / "kafka"), "up", "--port", str(listening_port)])

    err = capsys.readouterr().err
    assert code == 1
    assert f"Port {listening_port} on 127.0.0.1 is already in use by another program" in err
    assert "`python -m infra.broker up --port 0`" in err


def test_port_zero_picks_two_distinct_free_ports() -> None:
    client, controller = broker.choose_ports(0)

    assert client != controller
    assert broker.port_is_free(client)
    assert broker.port_is_free(controller)


def test_a_pid_file_naming_another_process_is_never_signalled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A stale pid file whose pid now belongs to some other process (here: pytest itself).
    workdir = tmp_path / "kafka"
    workdir.mkdir()
    broker.pid_path(workdir).write_text(f"{os.getpid()}\n")
    broker.bootstrap_path(workdir).write_text("127.0.0.1:9092\n")

    assert broker.find_running(workdir) is None
    assert main(["--dir", str(workdir), "down"]) == 0  # and we are still alive to assert

    assert "no broker running" in capsys.readouterr().err
    assert not broker.pid_path(workdir).exists()
    assert not broker.bootstrap_path(workdir).exists()


def test_status_of_a_stopped_broker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dir", str(tmp_path), "status"]) == 1
    assert capsys.readouterr().out.startswith("not running")


def test_a_broker_that_dies_during_start_up_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "ERROR Address in use\n")

    with pytest.raises(BrokerError, match=r"exited during start-up") as failure:
        broker.wait_ready("127.0.0.1:1", lambda: False, log, timeout_s=5)

    message = str(failure.value)
    assert message.endswith("ERROR Address in use")
    assert "line 61\n" in message  # the last 40 lines ...
    assert "line 60\n" not in message  # ... and no more


def test_a_broker_that_never_answers_times_out_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO still starting\n")
    nobody = broker.free_port()

    with pytest.raises(BrokerError, match=r"did not answer a metadata request.*within 1 s"):
        broker.wait_ready(f"127.0.0.1:{nobody}", lambda: True, log, timeout_s=1)


def test_server_properties_are_single_node_and_local(tmp_path: Path) -> None:
    text = broker.server_properties(tmp_path, 19092, 19093)
    props = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )

    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["log.dirs"] == str(tmp_path / "data")


def test_overrides_are_written_over_the_single_node_settings(tmp_path: Path) -> None:
    """The benches' broker waits for more members as a production cluster does."""
    text = broker.server_properties(tmp_path, 19092, 19093, broker.PRODUCTION_GROUP_SETTINGS)
    lines = [line for line in text.splitlines() if line.startswith("group.initial")]

    assert lines == ["group.initial.rebalance.delay.ms=3000"]  # once: the override replaced it


def test_cluster_id_is_made_once_per_runtime_dir(tmp_path: Path) -> None:
    first = broker.cluster_id(tmp_path)

    assert broker.cluster_id(tmp_path) == first
    assert len(first) == 22  # Kafka's Uuid: base64url of 16 bytes, no padding


def test_a_tied_child_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # A parent starts `sleep 60` tied to itself, prints the child's pid and exits at once.
    parent = (
        "import subprocess, sys\n"
        "from infra.broker import tied_to_parent\n"
        "child = subprocess.Popen(tied_to_parent(['sleep', '60']))\n"
        "print(child.pid, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", parent],
        cwd=broker.REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    child = int(out.stdout)

    deadline = time.monotonic() + 10
    while broker.pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = broker.pid_alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the child outlived its parent"


def test_cluster_ids_never_start_with_a_dash(tmp_path: Path, monkeypatch) -> None:
    """An id starting with '-' would be taken for an option by the storage tool."""
    draws = iter([b"\xfb" + bytes(15), bytes(16)])  # base64 of 0xfb... starts with '-'
    monkeypatch.setattr(broker.os, "urandom", lambda n: next(draws))
    assert not broker.cluster_id(tmp_path).startswith("-")


def test_a_process_whose_main_thread_ended_is_alive_while_another_thread_runs() -> None:
    """A JVM's main thread ends before its shutdown hooks: the process then shows as a zombie
    while they still hold the ports (`make broker-down` said "stopped" a second early)."""
    code = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code])
    try:
        stat_path = Path(f"/proc/{process.pid}/stat")
        deadline = time.monotonic() + 30
        while stat_path.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the main thread never ended"
            time.sleep(0.05)
        assert broker.pid_alive(process.pid)  # its other thread still runs
    finally:
        process.kill()
        process.wait()
    assert not broker.pid_alive(process.pid)
