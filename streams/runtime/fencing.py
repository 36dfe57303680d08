"""Self-fencing: a worker that was frozen must not write as a zombie.

A worker frozen past its session timeout (a GC or VM pause, SIGSTOP, a laptop lid) is evicted
from its group, and its partitions go to another worker. Until its next heartbeat it does not
know, and a batch it had in hand would write outputs and states *after* the new owner wrote
newer ones. Kafka cannot fence it without transactions, so the worker fences itself:

- `Lease` notices that the event loop stood still for more than half the session timeout;
- after such a stall, `Fence.may_write` writes nothing until the group coordinator confirms,
  by a heartbeat sent after the stall, that the worker is still a member of the current
  generation; told otherwise, the batch is dropped unwritten and unacknowledged, and so is
  every batch read before the worker's next assignment (`Fence.dropping`);
- a freeze *while* changelog records are on their way cannot be undone, so `Fence.confirm`
  notices it (a stall the coordinator answers with an eviction) and `Fence.leave_repairs`
  sends each partition a tick naming those users (its owner writes their newest state again,
  last) and exits with `EXIT_FENCED`.

Restores skip changelog records older than the state they hold (`streams/runtime/state_table.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Final, NoReturn

from schemas.ticks import encode_tick
from streams.faust import patches as faust_patches
from streams.settings.exits import EXIT_RESTART

log = logging.getLogger("oracular.worker")

EXIT_FENCED: Final = EXIT_RESTART
"""Exit code of a worker that stopped itself after a freeze (sysexits EX_TEMPFAIL: restart)."""
REPAIR_KEYS_PER_TICK: Final = 200
"""Users named per repair tick: a user id is at most 512 characters (2 KiB of UTF-8), so a
tick stays below half the producer's 1 MB record limit."""

Writes = list[tuple[bytes, bytes | None, int]]
"""A batch's state writes: (key, value, partition)."""


class FrozenWhileWriting(Exception):
    """The worker was frozen while sending a batch's changelog records."""

    def __init__(self, stalled_s: float) -> None:
        """How long the loop stood still."""
        super().__init__(f"frozen for {stalled_s:.1f} s")
        self.stalled_s = stalled_s


class Lease:
    """Notices when the worker's event loop stopped running for long.

    `keep` renews it four times a second; a renewal older than `limit_s` means the loop was
    stalled that long: the process was frozen, or a single step ran that long.
    """

    def __init__(self, limit_s: float) -> None:
        """Doubt membership after a stall longer than `limit_s`."""
        self.limit_s = limit_s
        self.renewed = time.monotonic()
        self.stalls = 0
        """Stalls seen so far (each counted once, by whichever check noticed it first)."""
        self.last_stall_s = 0.0
        """How long the last stall lasted (as far as seen when it was noticed)."""
        self.counted = False
        self.stalled_since_rebalance = False
        """A stall was seen since the last rebalance: this worker may have been a zombie, so
        its local copies of the partitions it loses are not trusted."""

    def renew(self) -> None:
        """The loop is running now."""
        self.renewed = time.monotonic()
        self.counted = False

    def stalled_s(self) -> float | None:
        """How long the loop was stalled, when that is longer than the limit; else None."""
        stalled = time.monotonic() - self.renewed
        if stalled > self.limit_s:
            if not self.counted:
                self.stalls += 1
                self.counted = True
            self.last_stall_s = stalled
            self.stalled_since_rebalance = True
            return stalled
        return None

    async def keep(self) -> None:
        """Renew until cancelled (noting any stall it finds)."""
        while True:
            self.stalled_s()
            self.renew()
            await asyncio.sleep(0.25)


class Fence:
    """The checks a batch passes before it writes (see the module's docstring)."""

    def __init__(
        self,
        app: Any,
        *,
        session_timeout_s: float,
        ticks_topic: str,
        on_fenced: Callable[[], None] = lambda: None,
    ) -> None:
        """Fence the worker of Faust `app` (its group's session timeout, the ticks topic that
        repairs go to); `on_fenced()` is called for each batch dropped unwritten."""
        self.app, self.on_fenced = app, on_fenced
        self.session_timeout_s, self.ticks_topic = session_timeout_s, ticks_topic
        self.lease = Lease(session_timeout_s / 2)
        self.stalls_seen = 0
        """The lease's stall count when membership was last known (writes need it current)."""
        self.fenced_in: int | None = None
        """The generation a batch was dropped in; until a newer one, nothing is written."""

    def dropping(self, generation: int, events: list[Any]) -> bool:
        """True (and `events` abandoned) when a batch was dropped in `generation`: this batch
        was read before the rebalance the worker was told about, its partitions may be
        someone else's by now, and the worker holds no assignment to write for yet."""
        if self.fenced_in is None:
            return False
        if generation == self.fenced_in:
            faust_patches.abandon(self.app.consumer, events)
            return True
        self.fenced_in = None  # assigned anew (and sought to the committed offsets)
        return False

    def drop(self, generation: int, events: list[Any]) -> list[Any]:
        """Drop a batch unwritten and unacknowledged (the partitions' owners re-read it), and
        every batch after it until this worker is assigned partitions in a newer generation;
        returns the events to acknowledge: none."""
        faust_patches.abandon(self.app.consumer, events)
        self.fenced_in = generation
        return []

    async def may_write(self, generation: int) -> bool:
        """False when this worker was paused long enough to have lost its partitions.

        Without a stall since membership was last known, True at once. After one, it asks
        the group coordinator (a heartbeat with its generation and member id) until it gets
        an answer: a member of `generation` (the one the batch was read in) may write; an
        evicted member, a rebalance under way or a newer generation may not, and the batch is
        counted in `fenced_batches`. While the coordinator does not answer it keeps asking:
        writing on a guess is what a zombie does. A stall during the question asks again.
        """
        lease, app = self.lease, self.app
        if lease.stalled_s() is None and lease.stalls == self.stalls_seen:
            return True
        # (The lease task may have noticed the stall first and renewed the lease since: the
        # count still shows it, which is why the count is compared, not only the lease.)
        log.warning(
            "the worker was paused for %.1f s (over half the session timeout): confirming it "
            "still belongs to its group before writing",
            lease.last_stall_s,
        )
        waited_since = time.monotonic()
        while True:
            lease.renew()  # a stall from here on is one during the question
            stalls = lease.stalls
            answer = faust_patches.UNKNOWN
            if not app.rebalancing and app.consumer_generation_id == generation:
                answer = await faust_patches.membership(app.consumer)
            if app.rebalancing or app.consumer_generation_id != generation:
                answer = faust_patches.LOST
            if lease.stalled_s() is not None or lease.stalls != stalls:
                continue  # frozen again while asking: the answer may predate an eviction
            if answer == faust_patches.MEMBER:
                self.stalls_seen = stalls
                return True
            if answer in (faust_patches.LOST, faust_patches.REBALANCING):
                self.on_fenced()
                log.warning(
                    "it did not (%s): the batch in hand is dropped unwritten; its inputs are "
                    "re-read by the partitions' owners",
                    answer,
                )
                return False
            if time.monotonic() - waited_since > self.session_timeout_s:
                log.warning("the group coordinator has not answered yet; still asking")
                waited_since = time.monotonic()
            await asyncio.sleep(0.1)

    async def confirm(self, generation: int) -> None:
        """Raise `FrozenWhileWriting` unless this worker is still a member of `generation`,
        checked before each changelog record batch is queued and once they are all
        acknowledged: records of a worker that was evicted while they were on their way may
        land after a new owner's.

        Without a stall since membership was last confirmed this returns at once. After one
        the coordinator is asked, as `may_write` does: a stall is a freeze or a step that ran
        that long (a backfill closing a hundred thousand episodes in one batch takes
        seconds), and only an eviction makes it a zombie's. Still a member of the same
        generation, no other worker can have written the partitions meanwhile.
        """
        if not await self.may_write(generation):
            raise FrozenWhileWriting(self.lease.last_stall_s)

    async def leave_repairs(self, writes: Writes, stalled_s: float) -> NoReturn:
        """After a freeze while writing the changelog: make sure the users' newest states end
        up last in the changelog, then exit.

        Records queued before the freeze go out when the process resumes, possibly after the
        partitions' new owner wrote newer states of the same users; compaction would keep the
        older ones. So once they are out, a tick naming those users is sent to each of their
        partitions: the tick comes after them, and its partition's owner (whoever that is
        now) writes each named user's current state again, last. Then the worker exits
        (`EXIT_FENCED`): nothing of the batch is acknowledged, so its inputs are redelivered
        to whoever owns the partitions (a supervisor restarts this worker).
        """
        log.critical(
            "the worker was frozen for %.1f s while writing its changelog: asking the "
            "partitions' owners to write those %s user(s) again, then exiting (its partitions "
            "may have new owners)",
            stalled_s,
            len(writes),
        )
        try:
            await asyncio.wait_for(self.send_repairs(writes), self.session_timeout_s)
        except Exception as exc:  # exiting regardless; say what was missed
            log.critical("the repair ticks were not all sent (%s: %s)", type(exc).__name__, exc)
        logging.shutdown()
        os._exit(EXIT_FENCED)

    async def send_repairs(self, writes: Writes) -> None:
        """Flush what is queued, then send the repair ticks naming the users of `writes`."""
        producer = self.app.producer
        await producer.flush()  # whatever was queued goes out before the ticks
        by_partition: dict[int, list[bytes]] = {}
        for key, _value, partition in writes:
            by_partition.setdefault(partition, []).append(key)
        ticks = self.ticks_topic
        sent = []
        now = int(time.time() * 1000)
        for partition, keys in by_partition.items():
            for start in range(0, len(keys), REPAIR_KEYS_PER_TICK):
                value = encode_tick(now, keys[start : start + REPAIR_KEYS_PER_TICK])
                sent.append(await producer.send(ticks, None, value, partition, None, None))
        await producer.flush()
        await asyncio.gather(*sent)

    def distrusts_revoked(self) -> bool:
        """True once per rebalance after a stall: this worker may have been a zombie whose
        late writes advanced its local copies' persisted offsets past another owner's
        writes, so the partitions it loses are restored in full when they come back."""
        if not self.lease.stalled_since_rebalance:
            return False
        self.lease.stalled_since_rebalance = False
        return True
