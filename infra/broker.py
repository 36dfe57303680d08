"""A local single-node Apache Kafka broker (KRaft) from Maven Central jars: no docker.

Used three ways:

- CLI: ``python -m infra.broker up|down|status|topics|logs|fetch`` (what ``make broker-up``,
  ``make broker-down`` and ``make topics`` run). ``up`` prints the bootstrap address and writes
  it to ``<runtime dir>/bootstrap.txt``.
- Test fixtures: ``start_broker(workdir, port=None)`` returns a :class:`Broker` (``.bootstrap``,
  ``.stop()``); ``streams.tools.admin.ensure_topics(bootstrap, specs)`` creates topics idempotently.
- ``fetch_jars()`` alone, to warm the jar cache (``make kafka``).

How it works: Maven copies ``kafka_2.13`` and a log4j2 binding (``infra/pom.xml``) into a cache
dir; ``kafka.tools.StorageTool format`` prepares the KRaft storage; ``kafka.Kafka`` runs as a
combined broker+controller on 127.0.0.1 in its own session, its output in a log file; readiness
is a real client request (aiokafka admin ``list_topics``), never a sleep.

Every failure a user can cause or fix (no java, port taken, broker died) raises
:class:`BrokerError` with a message that says what to do; the CLI prints it without a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

# Shared with the tests' and the benchmarks' worker processes.
from infra.processes import LOG_TAIL_LINES, cmdline, rss_bytes, tail, tied_to_parent
from streams.settings import product_topics

# Topic creation, the readiness probe and BrokerError live in streams.tools.admin: the installed
# worker needs them too, and infra/ is not installed.
from streams.tools.admin import (
    BrokerError,
    ensure_topics,
    probe_async,
)

INFRA_DIR = Path(__file__).resolve().parent
REPO_ROOT = INFRA_DIR.parent
POM = INFRA_DIR / "pom.xml"
LOG4J_CONFIG = INFRA_DIR / "log4j2.properties"

# Both overridable from the environment, so CI or a user can move them (e.g. to a bigger disk).
DEFAULT_CACHE_DIR = Path(os.environ.get("ORACULAR_KAFKA_CACHE", REPO_ROOT / ".cache" / "kafka"))
DEFAULT_RUNTIME_DIR = Path(os.environ.get("ORACULAR_KAFKA_DIR", REPO_ROOT / "var" / "kafka"))
DEFAULT_PORT = 9092  # the controller listens on port + 1
HOST = "127.0.0.1"

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
PROBE_TIMEOUT_S = 3.0
MVN_TIMEOUT_S = 600.0
FORMAT_TIMEOUT_S = 60.0
MIN_JAVA = 17  # Kafka 4.x brokers need Java 17

JVM_OPTS = [
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]

# Single-node settings: replication factors of 1, few internal-topic partitions (the first
# group join and transaction stay fast), no rebalance delay, no auto-created topics (they would
# get 1 partition and break co-partitioning), small thread pools and cleaner buffer for a
# 512 MiB heap on 2 cores.
SINGLE_NODE_SETTINGS = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
}


def say(message: str) -> None:
    """Progress for a person watching `make` or a CI log (stderr keeps stdout for data)."""
    print(f"[broker] {message}", file=sys.stderr, flush=True)


# --- tools and jars ---------------------------------------------------------------------------


def require_tools(*tools: str) -> None:
    """Fail with one message naming every missing tool and how to install it."""
    hints = {
        "java": "a Java 17+ runtime (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)",
        "mvn": "Apache Maven 3.6+ (Debian/Ubuntu: apt-get install maven)",
    }
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        needs = "; ".join(f"`{tool}`: install {hints.get(tool, tool)}" for tool in missing)
        msg = f"The local Kafka broker needs {', '.join(missing)} on PATH. {needs}."
        raise BrokerError(msg)


def java_major_version() -> int:
    """The major version of `java` on PATH (17 for "17.0.15")."""
    out = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False, timeout=30
    )
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        msg = f"Could not read the Java version from `java -version`: {out.stderr.strip()!r}"
        raise BrokerError(msg)
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" means Java 8


def require_java_17() -> None:
    """Fail unless `java` on PATH is new enough for the Kafka 4 broker."""
    major = java_major_version()
    if major < MIN_JAVA:
        msg = (
            f"Kafka 4.x needs Java {MIN_JAVA} or newer; `java` on PATH is Java {major}. "
            "Install openjdk-17-jre-headless (or newer) and put it first on PATH."
        )
        raise BrokerError(msg)


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def jars_fetched(cache_dir: Path) -> bool:
    """True if ``cache_dir/lib`` holds the jars of the current infra/pom.xml.

    A stamp file holds the digest of the pom, so changing the Kafka version in the pom
    fetches again (into an emptied dir: two versions on one classpath would clash).
    """
    stamp = cache_dir / "lib" / ".fetched"
    return stamp.is_file() and stamp.read_text().strip() == _pom_digest()


def fetch_jars(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Copy the broker's jars into ``cache_dir/lib`` with Maven, unless already there."""
    lib = cache_dir / "lib"
    if jars_fetched(cache_dir):
        return lib
    require_tools("mvn")
    say(f"fetching Kafka jars with Maven into {lib} (first run only, about 40 MB) ...")
    shutil.rmtree(lib, ignore_errors=True)
    started = time.monotonic()
    cmd = [
        "mvn",
        "-q",
        "-B",
        "-Dstyle.color=never",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-Dkafka.lib.dir={lib}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=MVN_TIMEOUT_S)
    if result.returncode != 0 or not any(lib.glob("kafka_2.13-*.jar")):
        output = "\n".join((result.stdout + result.stderr).splitlines()[-LOG_TAIL_LINES:])
        msg = (
            f"Maven could not fetch the Kafka jars (exit {result.returncode}).\n{output}\n"
            "Check that Maven Central is reachable (proxy settings in ~/.m2/settings.xml)."
        )
        raise BrokerError(msg)
    (lib / ".fetched").write_text(_pom_digest() + "\n")
    say(f"fetched {len(list(lib.glob('*.jar')))} jars in {time.monotonic() - started:.1f} s")
    return lib


def _classpath(lib: Path) -> str:
    return str(lib / "*")  # java expands the wildcard itself


# --- ports ------------------------------------------------------------------------------------


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on host:port (SO_REUSEADDR ignores TIME_WAIT leftovers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def choose_ports(port: int | None) -> tuple[int, int]:
    """(client port, controller port): the given port and port + 1, or two free ports."""
    if port is None or port == 0:
        client = free_port()
        controller = free_port()
        while controller == client:
            controller = free_port()
        return client, controller
    for candidate in (port, port + 1):
        if not port_is_free(candidate):
            msg = (
                f"Port {candidate} on {HOST} is already in use by another program (not a broker "
                f"this tool started there). Stop that program, or pick other ports: "
                f"`python -m infra.broker up --port 0` chooses free ones (`make broker-up "
                f"KAFKA_PORT=0`) and writes the address to bootstrap.txt in the runtime dir."
            )
            raise BrokerError(msg)
    return port, port + 1


# --- process helpers --------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie.

    A JVM's main thread ends before its shutdown hooks do: the process then shows as a zombie
    while its other threads still run (and hold the ports and the data directory), so every
    thread counts.
    """
    try:
        tasks = [p.name for p in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        tasks = [str(pid)]
    for task in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
        try:
            state = stat.rsplit(")", 1)[1].split()[0]
        except IndexError:
            continue
        if state != "Z":
            return True
    return False


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def terminate(
    pid: int, process: subprocess.Popen[bytes] | None = None, timeout: float = STOP_TIMEOUT_S
) -> None:
    """SIGTERM, wait up to `timeout` for a clean shutdown, then SIGKILL.

    `process` is given when we are the parent: it must be waited on, or it stays a zombie.
    """

    def wait(seconds: float) -> bool:
        if process is not None:
            try:
                process.wait(seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + seconds
        while pid_alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    _signal(pid, signal.SIGTERM)
    if not wait(timeout):
        say(f"broker pid {pid} did not stop within {timeout:.0f} s; sending SIGKILL")
        _signal(pid, signal.SIGKILL)
        wait(10.0)


# --- readiness --------------------------------------------------------------------------------


def probe(bootstrap: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True if a broker at `bootstrap` answers a metadata request within `timeout_s`."""
    return asyncio.run(probe_async(bootstrap, timeout_s))


def wait_ready(
    bootstrap: str, is_alive: Callable[[], bool], log_path: Path, timeout_s: float
) -> None:
    """Probe until the broker answers.

    Fails fast if the process dies, and after `timeout_s` otherwise, with the log's tail.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive():
            msg = f"The Kafka broker exited during start-up. Last lines of {log_path}:\n"
            raise BrokerError(msg + tail(log_path))
        if probe(bootstrap):
            return
        time.sleep(0.25)
    msg = (
        f"The Kafka broker did not answer a metadata request on {bootstrap} within "
        f"{timeout_s:.0f} s. Last lines of {log_path}:\n"
    )
    raise BrokerError(msg + tail(log_path))


# --- the broker -------------------------------------------------------------------------------


@dataclass
class Broker:
    """A running broker started (or found running) by this module."""

    pid: int
    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return log_path(self.workdir)

    def rss_bytes(self) -> int | None:
        return rss_bytes(self.pid)

    def stop(self, *, wipe: bool = False, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the broker (SIGTERM, then SIGKILL); `wipe` also deletes its data."""
        terminate(self.pid, self.process, timeout)
        forget(self.workdir, wipe=wipe)


def forget(workdir: Path, *, wipe: bool) -> None:
    """Remove a stopped broker's pid and address files; `wipe` also deletes its data."""
    for path in (pid_path(workdir), bootstrap_path(workdir)):
        path.unlink(missing_ok=True)
    if wipe:
        shutil.rmtree(workdir / "data", ignore_errors=True)


def pid_path(workdir: Path) -> Path:
    return workdir / "broker.pid"


def bootstrap_path(workdir: Path) -> Path:
    return workdir / "bootstrap.txt"


def log_path(workdir: Path) -> Path:
    return workdir / "logs" / "server.log"


PRODUCTION_GROUP_SETTINGS: Final = {"group.initial.rebalance.delay.ms": "3000"}
"""Kafka's own default for a new consumer group's first rebalance, as a production cluster has
it: the coordinator waits 3 s for more members before it assigns. The test broker waits 0 (a
test's worker starts at once), so of N processes started together the first got every
partition, drained alone until its next heartbeat, then gave half away in a second rebalance;
the benches measure N processes as they start on a real cluster."""


def server_properties(
    workdir: Path, port: int, controller_port: int, overrides: Mapping[str, str] | None = None
) -> str:
    """The broker's server.properties: single node, `SINGLE_NODE_SETTINGS`, then `overrides`."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(workdir / "data"),
        **SINGLE_NODE_SETTINGS,
        **(overrides or {}),
    }
    header = (
        "# Written by infra/broker.py on every `up`; edit SINGLE_NODE_SETTINGS there "
        "(a cluster node: CLUSTER_SETTINGS in infra/cluster.py).\n"
    )
    return header + "".join(f"{key}={value}\n" for key, value in settings.items())


def cluster_id(workdir: Path) -> str:
    """The cluster id for this runtime dir: made once, kept so the data dir stays valid.

    Same format as Kafka's Uuid: URL-safe base64 of 16 random bytes without `=` padding, and,
    as Kafka's own `Uuid.randomUuid` does, never starting with '-' (one id in 64 would, and a
    command line would take it for an option).
    """
    path = workdir / "cluster.id"
    if path.is_file():
        return path.read_text().strip()
    new_id = "-"
    while new_id.startswith("-"):
        new_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
    path.write_text(new_id + "\n")
    return new_id


def find_running(workdir: Path) -> Broker | None:
    """The broker recorded in workdir's pid file, if that process is still our kafka.Kafka.

    Checks the command line so a recycled pid never gets a signal meant for the broker.
    """
    try:
        pid = int(pid_path(workdir).read_text().strip())
        port = int(bootstrap_path(workdir).read_text().strip().rsplit(":", 1)[1])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    command = cmdline(pid)
    if not pid_alive(pid) or "kafka.Kafka" not in command or str(workdir) not in command:
        return None
    return Broker(pid=pid, port=port, workdir=workdir)


def _format_storage(lib: Path, properties: Path, workdir: Path) -> None:
    cmd = [
        "java",
        f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
        "-cp",
        _classpath(lib),
        "kafka.tools.StorageTool",
        "format",
        f"--cluster-id={cluster_id(workdir)}",  # one argument: an id may start with '-'
        "-c",
        str(properties),
        "--ignore-formatted",
    ]
    format_log = workdir / "logs" / "format.log"
    with format_log.open("wb") as out:
        result = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=FORMAT_TIMEOUT_S
        )
    if result.returncode != 0:
        msg = f"Formatting Kafka storage failed. Last lines of {format_log}:\n{tail(format_log)}"
        raise BrokerError(msg)


def _launch(lib: Path, properties: Path, workdir: Path, *, tie: bool) -> subprocess.Popen[bytes]:
    cmd = [
        "java",
        *JVM_OPTS,
        f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
        "-cp",
        _classpath(lib),
        "kafka.Kafka",
        str(properties),
    ]
    with log_path(workdir).open("ab") as out:
        # Own session: a Ctrl-C in the terminal that ran `up` does not reach the broker, and the
        # broker outlives the CLI process that started it.
        return subprocess.Popen(
            tied_to_parent(cmd) if tie else cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            start_new_session=True,
        )


def spawn(lib: Path, workdir: Path, port: int, *, tie: bool) -> Broker:
    """Launch kafka.Kafka on `workdir`'s server.properties (storage formatted); do not wait.

    Writes the pid and address files at once: with them a later `up` or `down` finds this
    broker even if the caller is interrupted before it is ready. infra/cluster.py launches its
    nodes with this too.
    """
    process = _launch(lib, workdir / "server.properties", workdir, tie=tie)
    broker = Broker(pid=process.pid, port=port, workdir=workdir, process=process)
    pid_path(workdir).write_text(f"{process.pid}\n")
    bootstrap_path(workdir).write_text(broker.bootstrap + "\n")
    say(f"started kafka.Kafka (pid {process.pid}); log: {broker.log_path}")
    return broker


def start_broker(
    workdir: Path = DEFAULT_RUNTIME_DIR,
    port: int | None = None,
    *,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    ready_timeout: float = READY_TIMEOUT_S,
    stop_with_parent: bool = False,
    overrides: Mapping[str, str] | None = None,
) -> Broker:
    """Start a broker whose config, data and log live in `workdir`, and wait until it answers.

    `port=None` (or 0) picks free ports; otherwise the broker listens on `port` and its
    controller on `port + 1`. A healthy broker left in `workdir` by an earlier run is reused
    (if it is on the requested port); an unhealthy one is stopped first. `stop_with_parent`
    makes the broker exit with the calling process (test sessions); the CLI's broker outlives it.
    `overrides` are broker settings written over `SINGLE_NODE_SETTINGS` (the benches use
    `PRODUCTION_GROUP_SETTINGS`).
    """
    # Every missing tool in one message: mvn only matters while the jars are not fetched.
    require_tools("java", *([] if jars_fetched(cache_dir) else ["mvn"]))
    require_java_17()
    workdir = workdir.resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)

    leftover = find_running(workdir)
    if leftover is not None:
        if (port in (None, 0, leftover.port)) and probe(leftover.bootstrap):
            say(f"reusing the broker already running (pid {leftover.pid}) on {leftover.bootstrap}")
            return leftover
        say(f"stopping the earlier broker (pid {leftover.pid}) found in {workdir}")
        leftover.stop()

    client_port, controller_port = choose_ports(port)
    lib = fetch_jars(cache_dir)
    properties = workdir / "server.properties"
    properties.write_text(server_properties(workdir, client_port, controller_port, overrides))

    started = time.monotonic()
    _format_storage(lib, properties, workdir)
    formatted = time.monotonic()
    broker = spawn(lib, workdir, client_port, tie=stop_with_parent)
    process = broker.process
    assert process is not None
    try:
        wait_ready(broker.bootstrap, lambda: process.poll() is None, broker.log_path, ready_timeout)
    except BaseException:  # including Ctrl-C: leave no half-started broker behind
        broker.stop(timeout=5.0)
        raise
    ready = time.monotonic()
    say(
        f"ready on {broker.bootstrap} in {ready - started:.1f} s (format "
        f"{formatted - started:.1f} s, start until a metadata answer {ready - formatted:.1f} s)"
    )
    return broker


# --- CLI --------------------------------------------------------------------------------------


def read_bootstrap(workdir: Path) -> str:
    try:
        return bootstrap_path(workdir).read_text().strip()
    except FileNotFoundError:
        msg = f"No broker address in {bootstrap_path(workdir)}: run `make broker-up` first."
        raise BrokerError(msg) from None


def _cmd_up(args: argparse.Namespace) -> int:
    broker = start_broker(args.dir, args.port, ready_timeout=args.timeout)
    rss = broker.rss_bytes() or 0
    say(f"log: {broker.log_path}; resident memory {rss / 2**20:.0f} MiB")
    say(f"bootstrap address (also in {bootstrap_path(broker.workdir)}):")
    print(broker.bootstrap)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    broker = find_running(args.dir.resolve())
    if broker is None:
        say(f"no broker running from {args.dir}")
        forget(args.dir, wipe=args.wipe)  # stale pid/bootstrap files of a dead broker
    else:
        say(f"stopping broker pid {broker.pid} on {broker.bootstrap}")
        broker.stop(wipe=args.wipe)
        say("stopped" + (" and wiped its data" if args.wipe else ""))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    broker = find_running(args.dir.resolve())
    if broker is None:
        print(f"not running (runtime dir {args.dir})")
        return 1
    healthy = probe(broker.bootstrap)
    rss = broker.rss_bytes() or 0
    state = "running" if healthy else "running but NOT answering"
    print(f"{state}: pid {broker.pid}, {broker.bootstrap}, RSS {rss / 2**20:.0f} MiB")
    print(f"log: {broker.log_path}")
    return 0 if healthy else 1


def _cmd_topics(args: argparse.Namespace) -> int:
    bootstrap = args.bootstrap or read_bootstrap(args.dir)
    for result in ensure_topics(bootstrap, product_topics()):
        verb = "created" if result.created else "exists"
        print(f"{verb:8} {result.name} ({result.actual} partitions)")
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    print(tail(log_path(args.dir), args.lines))
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    print(fetch_jars())
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.broker", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_RUNTIME_DIR,
        help="runtime dir: config, data, log, pid (default %(default)s; env ORACULAR_KAFKA_DIR)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the broker (or reuse a healthy one) and wait until ready")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 = any free port")
    up.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="readiness, seconds")
    up.set_defaults(run=_cmd_up)
    down = sub.add_parser("down", help="stop the broker (SIGTERM, then SIGKILL after 20 s)")
    down.add_argument("--wipe", action="store_true", help="also delete topics and offsets")
    down.set_defaults(run=_cmd_down)
    sub.add_parser("status", help="is it running and answering?").set_defaults(run=_cmd_status)
    topics = sub.add_parser("topics", help="create the product topics (idempotent)")
    topics.add_argument("--bootstrap", help="host:port (default: the address `up` wrote)")
    topics.set_defaults(run=_cmd_topics)
    logs = sub.add_parser("logs", help="print the end of the broker log")
    logs.add_argument("-n", "--lines", type=int, default=LOG_TAIL_LINES)
    logs.set_defaults(run=_cmd_logs)
    sub.add_parser("fetch", help="fetch the Kafka jars with Maven").set_defaults(run=_cmd_fetch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_parser(), argv)


def run_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Run the subcommand `parser` parses; a BrokerError is one line on stderr and exit 1."""
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
