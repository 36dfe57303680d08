"""The patch registry: every method replaced, with why, where upstream, and its test.
Upgrading faust-streaming means reading this list: each entry's source hash must still match.

Each entry names the upstream method, the sha256 of its source as the patch was written
against it (tests/streams/test_faust_patches.py fails when the installed source differs), the
upstream issue or pull request (if one is filed), the reason, and the test that shows what it
changes: it fails with the patches removed (ORACULAR_FAUST_UNPATCHED=1) unless the entry says
otherwise (`fails_unpatched`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiokafka.consumer.fetcher import Fetcher
from faust.stores.rocksdb import Store as RocksDBStore
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.transport.producer import ProducerBuffer

from streams.faust.delivery import _add_gap, _drain_messages, _new_offset
from streams.faust.fetch import (
    _fetch_records,
    _fetch_waiting_by_traffic,
    _read_committed,
    _waking_the_fetch,
)
from streams.faust.producer import _ebb_without_settings
from streams.faust.recovery import _changelog_queue, _on_recovery_completed
from streams.faust.stores import _setting_aside_corrupt
from streams.faust.upstream import ORIGINALS, check_version
from streams.faust.worker_loop import _new_consumer_thread


@dataclass(frozen=True)
class Patch:
    """One upstream method replaced, and what a reader upgrading Faust needs to know of it."""

    owner: type
    """The upstream class."""
    name: str
    """The method replaced."""
    replacement: Callable[..., Any] | property
    """The new method (or property, for an attribute upstream computes)."""
    source_sha256: str
    """sha256 of the upstream method's source (`inspect.getsource`) the patch was written
    against: a new value means upstream changed it, and the patch must be re-read."""
    upstream: str
    """The upstream issue or pull request, or why none is named."""
    reason: str
    """What upstream does wrong (or too slowly), in a sentence."""
    test: str
    """The test (tests/streams/test_faust_patches.py) that shows what the patch changes."""
    fails_unpatched: bool = True
    """True: `test` fails with the patches removed (ORACULAR_FAUST_UNPATCHED=1). False for a
    patch that only saves time (its test calls the replacement itself) and for one whose
    scenario upstream happens to pass (its test then holds upstream's behaviour)."""

    @property
    def method(self) -> str:
        """`Class.method`, as the tests name it."""
        return f"{self.owner.__name__}.{self.name}"


PATCHES: Final[tuple[Patch, ...]] = (
    Patch(
        Consumer,
        "_drain_messages",
        _drain_messages,
        "44a2500309e83c630493f6828af50166ec8d96a0b3e4fb2bab735f704ae93417",
        "none filed (the read-offset half of the loss around rebalances)",
        "the fetch loop stores the last offset delivered where seeks store the next to read, "
        "and writes it over a concurrent seek: records re-read after a rebalance are dropped",
        "test_a_record_fetched_before_a_seek_back_is_read_again_not_past",
    ),
    Patch(
        Consumer,
        "_add_gap",
        _add_gap,
        "4df2573ded7c1c2cde04dc6bde6d4480cb5875ef565256e56966b585ae39b1c1",
        "faust-streaming issue #606, PR #707 (not merged)",
        "a gap at the committed offset is left out, so the commit never passes it",
        "test_upstream_leaves_the_committed_offset_out_of_a_gap",
        fails_unpatched=False,
    ),
    Patch(
        Consumer,
        "_new_offset",
        _new_offset,
        "1d2c7ea89a7ad4f1a216c1d51936e569162cd66bd56f889e13fd29c910b58eb0",
        "faust-streaming issue #606, PR #707 (not merged)",
        "the offset to commit passes an unacked record at the head of a partition",
        "test_no_commit_past_an_unacked_record_at_the_committed_offset",
    ),
    Patch(
        Recovery,
        "on_recovery_completed",
        _on_recovery_completed,
        "6ef567acf072e46da3fccbccc6d662371f634f622c3d510972d5df81f70ae3ac",
        "none filed",
        "recovery resumes the input partitions before seeking them to the committed offsets: "
        "records delivered from the old position are then skipped",
        "test_recovery_delivers_every_input_record_from_the_committed_offset",
    ),
    Patch(
        TableManager,
        "changelog_queue",
        property(_changelog_queue),
        "9c7f4cac57ef170647f12c135f4419000d27be45c536bf07ec013d8d3d028e2e",
        "none filed",
        "flow control clears the changelog records on their way to a restore, after the "
        "consumer read past them: the restore skips them for good",
        "test_the_worker_applies_every_changelog_record_it_fetched",
    ),
    Patch(
        AIOKafkaConsumerThread,
        "_fetch_records",
        _fetch_records,
        "39a2c6c79fc1455a199629912b533458a720c64983bc957420a42feef6593baa",
        "none filed",
        "aiokafka is handed Faust's live set of active partitions, read as every partition "
        "while it is empty: input fetched while paused is dropped and never read again",
        "test_input_fetched_while_no_partition_is_active_is_delivered_after_resume",
    ),
    Patch(
        AIOKafkaConsumerThread,
        "_create_worker_consumer",
        _read_committed(AIOKafkaConsumerThread._create_worker_consumer),
        "c2701bfc3e6f6cad95c2be36d6a255a86e2c57d18d36cc1082b5fb5c482d99d7",
        "none (Faust reads committed records only in its exactly-once mode)",
        "the worker's consumer reads aborted transactional input, and waits Faust's fetch "
        "wait, not the worker's",
        "test_the_worker_consumer_reads_committed_records_only",
    ),
    Patch(
        Fetcher,
        "_proc_fetch_request",
        _fetch_waiting_by_traffic(Fetcher._proc_fetch_request),
        "59bf948fff47eed580671971252454daa614df479733f3bedfefe95bc4d8ad30",
        "none (aiokafka 0.14.0's fetcher; latency, not loss)",
        "a fetch of quiet partitions holds busy input back for the whole fetch wait",
        "test_a_fetch_waits_short_while_records_arrive_and_long_when_idle",
        fails_unpatched=False,
    ),
    Patch(
        ProducerBuffer,
        "wait_until_ebb",
        _ebb_without_settings(ProducerBuffer.wait_until_ebb),
        "758dd5744044071bbc79609fa8e5bfc339818f186bc19b723de2c4c877412e00",
        "none (cost, not loss)",
        "every delivered record reads a setting to learn that nothing waits in the buffer",
        "test_the_producer_buffer_is_flushed_only_over_its_limit",
        fails_unpatched=False,
    ),
    Patch(
        Consumer,
        "on_buffer_drop",
        _waking_the_fetch(Consumer.on_buffer_drop),
        "4b57e8a418d5ad9c58632b13b58b377ae185855520fd1280870cf7141ac0d1d0",
        "none filed",
        "a partition taken back after its buffer filled waits until another partition's "
        "records wake the consumer thread",
        "test_a_partition_taken_back_after_its_buffer_filled_is_read_at_once",
    ),
    Patch(
        Consumer,
        "resume_partitions",
        _waking_the_fetch(Consumer.resume_partitions),
        "afe6b7c02a41d63cd46d47a03f09b547c85289c108de21d682970057d1015c3b",
        "none filed",
        "a resumed partition waits until another partition's records wake the consumer thread",
        "test_a_partition_taken_back_after_its_buffer_filled_is_read_at_once",
    ),
    Patch(
        AIOKafkaConsumer,
        "_new_consumer_thread",
        _new_consumer_thread,
        "0870ec53dea75083995e3565c0f0a25a1c63ecceaeb238e92e2585e3623af5a9",
        "none (a design choice of Faust's: the consumer in its own thread)",
        "the consumer's thread waits for the GIL at every step while the worker applies "
        "batches; on the worker's loop it runs between them",
        "test_the_consumer_runs_on_the_apps_loop_without_a_thread",
    ),
    Patch(
        RocksDBStore,
        "_open_for_partition",
        _setting_aside_corrupt(RocksDBStore._open_for_partition),
        "1dc4e0113d67379dd61c0a396fa92636577d5fc6be60d4312253fa566080377b",
        "none filed (Quix Streams and Kafka Streams recreate a corrupt store)",
        "a partition's local copy that RocksDB finds corrupt stops the worker for good, though "
        "the changelog holds all of it: it is set aside and restored instead",
        "test_a_corrupt_local_copy_is_set_aside_and_opened_empty",
    ),
)
"""Every patch, applied in this order by `apply`."""


def apply(version: str | None = None) -> None:
    """Apply every patch once (idempotent); refuses any faust-streaming but FAUST_VERSION."""
    check_version(version)
    for patch in PATCHES:
        owner, name = patch.owner, patch.name
        if (owner, name) not in ORIGINALS:
            ORIGINALS[owner, name] = owner.__dict__[name]
        setattr(owner, name, patch.replacement)


def unpatch() -> None:
    """Put the upstream methods back (for the tests that show what the patches fix)."""
    for (owner, name), original in ORIGINALS.items():
        setattr(owner, name, original)


def applied() -> bool:
    """True when every patch is in place."""
    return all(p.owner.__dict__.get(p.name) is p.replacement for p in PATCHES)
