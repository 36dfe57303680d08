"""The lookup API in a process of its own, answering from a replica of the worker's table.

A lookup served by a thread of the worker waits for the interpreter lock behind the worker's
batches (and behind every collection or long C call they make): at half load, several times
its idle latency (BENCHMARKS.md has the A/B). Here the API is a child process
(`streams.lookup.process`, started and supervised by the worker) that holds the lock alone:

- The worker passes it the listening socket and a channel (a Unix socket pair). Over the
  channel, in the worker's order, go every value written to the table's local copies (a
  batch's states, restored and standby changelog records, tombstones), a full copy of each
  partition's database when it opens, and every `STATUS_INTERVAL_S` a status: the routing,
  each partition's role, health, lag, counters and gauges (`Status`). Back come reveals to
  append to the input topic (the worker's producer sends them) and the child's readiness.
- The child keeps the raw values per partition (`Replica`) and decodes a user when it is
  read, keeping the decoded state until that user is written again (`ReplicaCache`). Its
  `ReplicaNode` is the same `Node` the in-worker API had, so every handler, limit, forward
  rule and error is `streams.lookup.api`'s own.
- Consistency: the replica of a partition holds exactly what the worker's RocksDB copy holds
  once the messages in the channel are applied; a lookup answers from one user's value, as
  of the last offset it reports. A partition is served only once its full copy has arrived
  (until then it is settling: 503, retry). A status older than `STALE_STATUS_S` (the worker
  frozen or stopped) makes every local partition settling, so a worker that lost its
  partitions while frozen never answers as their owner.
- Memory: the child holds each user's encoded value once (about the size of the RocksDB
  data, uncompressed) and the decoded states of users read since their last write.
- The worker restarts a child that died (its replica is rebuilt from the databases), and a
  child whose worker is gone (the channel closed) exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from engine import EngineConfig
from streams.faust import patches as faust_patches
from streams.lookup.metrics import Family, Histogram, Metrics
from streams.lookup.serving import RETRY_AFTER_S, ApiError, PartitionView, UserRead
from streams.runtime.failstop import FAIL_STOP
from streams.settings.cpus import pin_process
from streams.settings.hosts import Hosts
from streams.settings.peers import Peers

log = logging.getLogger("oracular.api")

STATUS_INTERVAL_S: Final = 0.1
"""How often the worker sends its status (routing, health, counters) to the API process."""
STALE_STATUS_S: Final = 3.0
"""A status older than this (a frozen or stopped worker) makes the local partitions settling."""
SYNC_CHUNK: Final = 2000
"""Values per message of a partition's full copy (the worker's loop runs between them)."""
SLICE_VALUES: Final = 64
"""Values the API process applies between two turns of its loop (`Replica.steps`): at most
about 0.1 ms of its CPU, where a full copy's message of `SYNC_CHUNK` values held the loop up
to 0.45 ms (BENCHMARKS.md)."""
MAX_BACKLOG_BYTES: Final = 256 << 20
"""Unsent channel bytes beyond which the API process is taken for stuck and restarted."""
MAX_DECODED: Final = 200_000
"""Decoded users kept at most by the API process (a few KiB each)."""
FREEZE_DECODED: Final = 32
"""Decoded users kept between two freezes of the collector's generations (`ReplicaCache.keep`)."""
APPEND_TIMEOUT_S: Final = 10.0
"""A reveal the worker has not appended by then is a 503."""
STARTUP_TIMEOUT_S: Final = 30.0
RESTART_DELAY_S: Final = 1.0

# Channel messages: msgpack arrays whose first item says what they are.
STATES: Final = 0  # [STATES, partition, [[key, value or None], ...]]
BEGIN: Final = 1  # [BEGIN, partition]: a full copy of the partition follows (start empty)
SYNCED: Final = 2  # [SYNCED, partition]: the full copy is complete
DROP: Final = 3  # [DROP, partition]: the partition's database closed here
STATUS: Final = 4  # [STATUS, status as a dict]
APPEND: Final = 5  # child -> worker: [APPEND, id, key, value, partition]
APPENDED: Final = 6  # worker -> child: [APPENDED, id, partition, offset, error or None]
READY: Final = 7  # child -> worker: [READY]
HELLO: Final = 8  # worker -> child, first: [HELLO, pickled ChildArgs]


def pack(message: list[Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpacker() -> msgpack.Unpacker:
    return msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 30)


@dataclass(frozen=True)
class ChildArgs:
    """What the API process needs, sent as its first message (pickled: both ends are ours)."""

    url: str
    app_id: str
    config: EngineConfig
    partitions: int
    events_topic: str
    token: str | None
    forward_timeout_s: float
    max_skew_ms: int
    peers: Peers
    limits: Any  # streams.lookup.front.Limits
    tls: tuple[str | None, str | None, str | None]
    """(certificate, key, CA file) paths: SSL contexts are rebuilt in the child."""
    log_level: int
    nice: int = 0
    """The API process's priority relative to the worker's (ORACULAR_API_NICE, else
    `streams.settings.DEFAULT_API_NICE`), set by the worker when it starts the process."""
    nice_set: bool = False
    """ORACULAR_API_NICE was set: a refusal is a warning (else an info line: a worker that may
    not raise priorities, as in most containers, is a normal deployment)."""
    realtime: int = 0
    """ORACULAR_API_REALTIME: the API process's SCHED_RR priority (0: the normal policy)."""
    cpus: frozenset[int] | None = None
    """ORACULAR_API_CPUS: the CPUs the API process runs on (None: the worker's)."""
    hosts: Hosts = field(default_factory=Hosts)
    """The names the API answers to (ORACULAR_API_HOSTS and the worker's own names)."""


# --- the API process's side -----------------------------------------------------------------


@dataclass
class Status:
    """The worker's state as of its last status message."""

    received: float = 0.0
    """time.monotonic() of the last one (0: none yet)."""
    views: dict[int, tuple[str | None, bool, str | None]] = field(default_factory=dict)
    """partition -> (local role, settling, owner URL)."""
    routing: dict[str, Any] = field(default_factory=dict)
    health: list[str] = field(default_factory=lambda: ["starting: no status from the worker"])
    lag: dict[int, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    inputs: dict[tuple[str, int], int] = field(default_factory=dict)
    episodes: dict[str, int] = field(default_factory=dict)
    gauges: list[Family] = field(default_factory=list)
    batches: dict[str, Any] = field(default_factory=dict)

    def stale(self, now: float) -> bool:
        return now - self.received > STALE_STATUS_S


class Replica:
    """Each partition's values as the worker's RocksDB copy holds them (raw bytes)."""

    def __init__(self) -> None:
        self.values: dict[int, dict[bytes, bytes]] = {}
        self.synced: set[int] = set()
        self.decoded: dict[bytes, UserRead] = {}
        """Users read (decoded) since their last write (`ReplicaCache`)."""

    def apply(self, message: list[Any]) -> None:
        """Apply one channel message at once."""
        for _ in self.steps(message):
            pass

    def steps(self, message: list[Any]) -> Iterator[None]:
        """Apply one channel message a step per iteration: a STATES message `SLICE_VALUES`
        values at a time, any other message in one step.

        The caller may run lookups between two steps (`apply_yielding`). Each value is written
        with its key's decoded state dropped in the same step, so such a lookup reads every key
        either as before the message or as after it, as a lookup between two messages does; the
        position an answer reports is the value's own (`StoredUser.last_offset`), read with it,
        so never one the replica does not hold. Nothing else changes a partition meanwhile: the
        messages are applied one after the other."""
        kind = message[0]
        if kind != STATES:
            self._apply_control(kind, message[1])
            yield
            return
        items = message[2]
        values = self.values.setdefault(message[1], {})  # an empty message opens it too
        for start in range(0, len(items), SLICE_VALUES):
            self._write(values, items[start : start + SLICE_VALUES])
            yield

    def _write(self, values: dict[bytes, bytes], items: list[Any]) -> None:
        decoded = self.decoded
        for key, value in items:
            decoded.pop(key, None)
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value

    def _apply_control(self, kind: int, partition: int) -> None:
        """BEGIN, DROP or SYNCED."""
        if kind in (BEGIN, DROP):
            self.synced.discard(partition)
            for key in self.values.pop(partition, {}):
                self.decoded.pop(key, None)
            if kind == BEGIN:
                self.values[partition] = {}
        elif kind == SYNCED:
            self.synced.add(partition)


async def apply_yielding(replica: Replica, message: list[Any]) -> None:
    """Apply `message` to `replica`, the API process's loop running between its steps
    (`Replica.steps`) and after it.

    A full copy's message holds `SYNC_CHUNK` values and a busy worker's batch hundreds: applied
    in one go, each held every lookup waiting on the loop for its whole length (BENCHMARKS.md).
    The turn after the last step lets lookups in between two messages the channel delivered in
    one read too. The caller awaits this before applying the next message, so the messages
    are still applied in the order sent."""
    for _ in replica.steps(message):
        await asyncio.sleep(0)


class ReplicaCache:
    """`streams.lookup.api.UserCache` over the replica: the users read by lookups since their
    last write (what predictions read of each, decoded; a write drops it: `Replica.apply`).

    A user read is some 20 objects the collector tracks (the whole decoded state, which the
    cache held before, some 40 to 80), alive until the user's next write, so a batch of 100
    cold users leaves thousands in the young generation, and every young
    collection walked them all (about 7 ms of CPU, every few cold batches: a batch that met
    one took twice its time; BENCHMARKS.md). So every `FREEZE_DECODED` users kept, the
    generations are frozen (`gc.freeze`: a constant-time move aside, as `GcPolicy` does every
    second): a young collection then walks only what was made since. Frozen objects are still
    freed by reference counting when the user is written (the states hold no reference
    cycles); cyclic garbage frozen with them waits for `GcPolicy`'s hourly full collection, as
    with its per-second freeze (a lookup's request and answer make none: tested)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.unfrozen = 0
        """Users kept since the last freeze."""

    def peek(self, key: bytes) -> UserRead | None:
        return self.replica.decoded.get(key)

    def keep(self, key: bytes, read: UserRead) -> None:
        decoded = self.replica.decoded
        if len(decoded) >= MAX_DECODED:
            decoded.clear()  # rare: more users read than kept; start again
        decoded[key] = read
        self.unfrozen += 1
        if self.unfrozen >= FREEZE_DECODED:
            gc.freeze()
            self.unfrozen = 0


class ReplicaNode:
    """`streams.lookup.api.Node` in the API process: the replica, and the worker's last status."""

    def __init__(
        self,
        args: ChildArgs,
        replica: Replica,
        append: Callable[[bytes, bytes, int], Awaitable[tuple[int, int]]],
    ) -> None:
        self.me = args.url
        self.partitions = args.partitions
        self.config = args.config
        self.events_topic = args.events_topic
        self.replica = replica
        self.status = Status()
        self._append = append

    def view(self, partition: int) -> PartitionView:
        status = self.status
        local, settling, owner = status.views.get(partition, (None, True, None))
        if local is not None and partition not in self.replica.synced:
            # Its copy is still on its way: an owner is settling, a standby cannot answer.
            local, settling = (local, True) if local == "active" else (None, settling)
        if status.stale(time.monotonic()):
            settling = True
        return PartitionView(local, settling, owner, self.me)  # type: ignore[arg-type]

    def get(self, partition: int, key: bytes) -> bytes | None:
        if partition not in self.replica.synced:
            msg = f"partition {partition} is not open on this worker (moved away); retry"
            raise ApiError(503, msg, retry_after=RETRY_AFTER_S, partition=partition)
        return self.replica.values.get(partition, {}).get(key)

    def routing(self) -> dict[str, Any]:
        return dict(self.status.routing)

    def health(self) -> list[str]:
        status = self.status
        if status.received and status.stale(time.monotonic()):
            return [f"the worker has sent no status for over {STALE_STATUS_S:g} s"]
        return list(status.health)

    def lag(self) -> dict[int, int]:
        return dict(self.status.lag)

    def counts(self) -> Mapping[str, int]:
        return self.status.counts

    def inputs_by_partition(self) -> Mapping[tuple[str, int], int]:
        return self.status.inputs

    def episodes_by_reason(self) -> Mapping[str, int]:
        return self.status.episodes

    def gauges(self) -> list[Family]:
        return list(self.status.gauges)

    async def append(self, key: bytes, value: bytes, partition: int) -> tuple[int, int]:
        return await self._append(key, value, partition)

    def take_status(self, body: dict[str, Any], metrics: Metrics) -> None:
        status = self.status
        status.received = time.monotonic()
        status.views = {int(p): (v[0], bool(v[1]), v[2]) for p, v in body["views"].items()}
        status.routing = body["routing"]
        status.health = list(body["health"])
        status.lag = {int(p): int(n) for p, n in body["lag"].items()}
        status.counts = dict(body["counts"])
        status.inputs = {(t, int(p)): int(n) for t, p, n in body["inputs"]}
        status.episodes = dict(body["episodes"])
        status.gauges = [family_from_wire(f) for f in body["gauges"]]
        counts, sums, messages = body["batches"]
        metrics.batch_seconds.counts = {labels_from_wire(k): list(v) for k, v in counts}
        metrics.batch_seconds.sums = {labels_from_wire(k): float(v) for k, v in sums}
        metrics.batch_messages = int(messages)


def chunks(db: Any, size: int) -> Iterator[list[tuple[bytes, bytes | None]]]:
    """All of the RocksDB database `db`'s values, `size` at a time in key order, each chunk
    read when it is asked for: a value written between two chunks is read as written, so
    the chunks and the writes sent meanwhile, applied in the order sent, give what `db`
    holds."""
    after: bytes | None = None
    while True:
        chunk: list[tuple[bytes, bytes | None]] = list(faust_patches.store_items(db, after, size))
        if chunk:
            yield chunk
        if len(chunk) < size:
            return
        after = chunk[-1][0]


def family_to_wire(family: Family) -> list[Any]:
    samples = [
        [suffix, [list(pair) for pair in labels], value] for suffix, labels, value in family.samples
    ]
    return [family.name, family.kind, family.help, samples]


def family_from_wire(wire: list[Any]) -> Family:
    name, kind, help_text, samples = wire
    family = Family(name, kind, help_text)
    for suffix, labels, value in samples:
        family.add(value, labels_from_wire(labels), suffix)
    return family


def labels_from_wire(labels: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in labels)


def histogram_to_wire(histogram: Histogram, messages: int) -> list[Any]:
    counts = [[[list(p) for p in labels], values] for labels, values in histogram.counts.items()]
    sums = [[[list(p) for p in labels], value] for labels, value in histogram.sums.items()]
    return [counts, sums, messages]


class Channel:
    """One end of the channel: messages written in order, messages read as they come."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer)

    def send(self, message: list[Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(pack(message))

    def backlog(self) -> int:
        transport = self.writer.transport
        return 0 if transport.is_closing() else transport.get_write_buffer_size()

    async def messages(self) -> Any:
        """Every message until the other end closes."""
        feed = unpacker()
        while True:
            try:
                chunk = await self.reader.read(1 << 20)
            except ConnectionError:  # the other end is gone
                return
            if not chunk:
                return
            feed.feed(chunk)
            for message in feed:
                yield message

    def close(self) -> None:
        self.writer.close()


# --- the worker's side ----------------------------------------------------------------------


class Feed:
    """The worker's end: starts and supervises the API process and keeps its replica current.

    `written(partition, items)` is called, on the worker's loop, for every write to a local
    copy of the table (`streams.runtime.state_table.WriteTap`)."""

    def __init__(
        self,
        args: ChildArgs,
        listen: socket.socket,
        node: Any,  # streams.lookup.api.FaustNode
        metrics: Metrics,
    ) -> None:
        self.args, self.listen, self.node, self.metrics = args, listen, node, metrics
        self.channel: Channel | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.copies: dict[int, int] = {}
        """partition -> id() of the database whose full copy was sent (or is being sent). Not
        the database itself: a reference kept here would outlive Faust's close of it, and a
        RocksDB handle freed at the interpreter's exit crashed the worker (SIGSEGV)."""
        self.ready = asyncio.Event()
        self.stopping = False
        self.restarts = 0
        self.task: asyncio.Task[None] | None = None
        self.appends: set[asyncio.Task[None]] = set()
        self.priority_refused = False
        self.realtime_refused = False

    def written(self, partition: int, items: list[tuple[bytes, bytes | None]]) -> None:
        channel = self.channel
        if channel is not None and partition in self.copies:
            channel.send([STATES, partition, items])

    async def start(self) -> None:
        await self._spawn()
        self.task = asyncio.create_task(self._run(), name="oracular-api-feed")
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT_S):
                await self.ready.wait()
        except TimeoutError:
            msg = f"the lookup API process did not start within {STARTUP_TIMEOUT_S:g} s"
            raise RuntimeError(msg) from None

    async def _spawn(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = (self.listen.fileno(), theirs.fileno())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streams.lookup.process", *map(str, fds)], pass_fds=fds
        )
        theirs.close()
        if self.args.cpus is not None:  # before it starts threads: they inherit its CPUs
            pin_process(self.process.pid, self.args.cpus)
        self._prioritise(self.process.pid)
        self.channel = await Channel.open(mine)
        self.copies = {}
        self.ready.clear()
        self.channel.send([HELLO, pickle.dumps(self.args)])

    def _prioritise(self, pid: int) -> None:
        """Give the API process its priority (ORACULAR_API_NICE, relative to this worker's).

        On two cores shared by the worker, the broker and producers, a lookup that is ready
        to run otherwise waits its turn behind the worker's batches (BENCHMARKS.md). Set from
        here, before the process starts threads (they inherit it), and again for a restarted
        process; refused (not root, no CAP_SYS_NICE): said once per worker, a warning when
        ORACULAR_API_NICE was set, an info line for the default."""
        if self.args.realtime and self._realtime(pid):
            return
        nice = self.args.nice
        if nice == 0:
            return
        target = max(-20, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
        try:
            os.setpriority(os.PRIO_PROCESS, pid, target)
        except OSError as exc:  # EPERM (ProcessLookupError: it already died; _run restarts it)
            if isinstance(exc, PermissionError) and not self.priority_refused:
                self.priority_refused = True
                log.log(
                    logging.WARNING if self.args.nice_set else logging.INFO,
                    "the lookup API process runs at the worker's priority: setting its nice "
                    "value to %d (%s) was refused (%s); it needs root, CAP_SYS_NICE or a "
                    "RLIMIT_NICE that allows it. Set ORACULAR_API_NICE=0 to silence this",
                    target,
                    f"ORACULAR_API_NICE={nice}" if self.args.nice_set else f"{nice}, the default",
                    exc.strerror,
                )

    def _realtime(self, pid: int) -> bool:
        """Put the API process under SCHED_RR at ORACULAR_API_REALTIME; False when refused
        (said once per worker, as a warning: the value was set)."""
        priority = self.args.realtime
        try:
            os.sched_setscheduler(pid, os.SCHED_RR, os.sched_param(priority))
        except PermissionError as exc:
            if not self.realtime_refused:
                self.realtime_refused = True
                log.warning(
                    "the lookup API process keeps the normal scheduling policy: "
                    "ORACULAR_API_REALTIME=%d (SCHED_RR) was refused (%s); it needs root, "
                    "CAP_SYS_NICE or a RLIMIT_RTPRIO of at least %d",
                    priority,
                    exc.strerror,
                    priority,
                )
            return False
        except ProcessLookupError:  # it already died; _run restarts it
            return True
        return True

    async def _run(self) -> None:
        """Read the child's messages; send the status and full copies; restart a dead child."""
        while not self.stopping:
            channel = self.channel
            assert channel is not None
            pump = asyncio.create_task(self._status_loop(channel))
            try:
                async for message in channel.messages():
                    if message[0] == READY:
                        self.ready.set()
                    elif message[0] == APPEND:
                        task = asyncio.create_task(self._append(channel, *message[1:]))
                        self.appends.add(task)
                        task.add_done_callback(self.appends.discard)
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
            channel.close()
            if self.stopping:
                return
            code = await self._reap()
            log.error(
                "the lookup API process stopped (exit %s); starting another in %g s",
                code,
                RESTART_DELAY_S,
            )
            await asyncio.sleep(RESTART_DELAY_S)
            self.restarts += 1
            await self._spawn()

    async def _reap(self) -> int | None:
        """Wait for the API process to exit (10 s at most, then kill it); its exit code."""
        process = self.process
        if process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return await asyncio.to_thread(process.wait, 10.0)
        process.kill()
        return await asyncio.to_thread(process.wait)

    async def _append(
        self, channel: Channel, request: int, key: bytes, value: bytes, partition: int
    ) -> None:
        try:
            at = await self.node.append(key, value, partition)
        except Exception as exc:
            channel.send([APPENDED, request, None, None, f"the reveal was not appended: {exc}"])
        else:
            channel.send([APPENDED, request, at[0], at[1], None])

    async def _status_loop(self, channel: Channel) -> None:
        while True:
            if channel.backlog() > MAX_BACKLOG_BYTES:
                log.error("the lookup API process is not reading its channel: restarting it")
                if self.process is not None:
                    self.process.kill()
                return
            await self._copy_new_partitions(channel)
            channel.send([STATUS, self.status()])
            await asyncio.sleep(STATUS_INTERVAL_S)

    async def _copy_new_partitions(self, channel: Channel) -> None:
        """A full copy of each database opened since the last look (a reopened one again);
        DROP for each one closed."""
        dbs = self.node.databases()
        for partition in [p for p in self.copies if id(dbs.get(p)) != self.copies[p]]:
            del self.copies[partition]
            channel.send([DROP, partition])
        for partition, db in dbs.items():
            if partition in self.copies:
                continue
            self.copies[partition] = id(db)
            channel.send([BEGIN, partition])
            try:
                for chunk in chunks(db, SYNC_CHUNK):
                    channel.send([STATES, partition, chunk])
                    await asyncio.sleep(0)  # the worker's batches run between chunks
                    if self.node.databases().get(partition) is not db:
                        raise LookupError(partition)  # closed or reopened meanwhile
            except faust_patches.StoreError as exc:  # corrupt: never "the end of the data"
                exc.partition = partition
                FAIL_STOP.stop("the lookup API's feed", exc)
            except Exception:
                log.debug("partition %s changed while copied to the API process", partition)
                self.copies.pop(partition, None)
                channel.send([DROP, partition])
                continue
            channel.send([SYNCED, partition])

    def status(self) -> dict[str, Any]:
        node = self.node
        views = node.views()
        batches = histogram_to_wire(self.metrics.batch_seconds, self.metrics.batch_messages)
        return {
            "views": {p: list(v) for p, v in views.items()},
            "routing": node.routing(),
            "health": node.health(),
            "lag": node.lag(),
            "counts": dict(node.counts()),
            "inputs": [[t, p, n] for (t, p), n in node.inputs_by_partition().items()],
            "episodes": dict(node.episodes_by_reason()),
            "gauges": [family_to_wire(f) for f in node.gauges()],
            "batches": batches,
        }

    async def stop(self) -> None:
        self.stopping = True
        self.copies.clear()
        if self.channel is not None:
            self.channel.close()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.process is not None and self.process.poll() is None:
            await self._reap()
