"""The product's one door to Faust and aiokafka: importing it applies every patch.
What the runtime and the lookup API call of the wall is named here; nothing else reaches in.

The patches (streams/faust/registry.py lists them: the upstream method, its pinned source
hash, the upstream issue, the reason and the test that fails without it) are applied once,
when this module is imported (`streams.runtime.app` imports it, so `oracular worker` and
`faust -A streams.worker worker` both run patched), and only onto the faust-streaming and
aiokafka versions they were written for (`FAUST_VERSION`, `AIOKAFKA_VERSION`): another version
raises `FaustVersionError`, because the patched methods must be re-read against it first.
"""

from __future__ import annotations

from streams.faust.batches import RawSchema, buffered, take_batches
from streams.faust.internals import (
    LOST,
    MEMBER,
    REBALANCING,
    UNKNOWN,
    abandon,
    ack_all,
    committed_offset,
    delivered_through,
    end_offset,
    faust_log_argument,
    membership,
    open_databases,
    open_partitions,
    read_offset,
    set_persisted_offset,
    store_active_items,
    store_get,
    store_items,
    store_path,
    store_put_all,
    store_scan,
    wrap_changelog_apply,
)
from streams.faust.producer import kafka_producer, key_partitioner
from streams.faust.registry import PATCHES, applied, apply, unpatch
from streams.faust.stores import StoreError, set_aside, set_aside_count
from streams.faust.upstream import (
    AIOKAFKA_VERSION,
    FAUST_VERSION,
    ISOLATION_LEVEL,
    FaustVersionError,
    check_version,
)

__all__ = [
    "AIOKAFKA_VERSION",
    "FAUST_VERSION",
    "ISOLATION_LEVEL",
    "LOST",
    "MEMBER",
    "PATCHES",
    "REBALANCING",
    "UNKNOWN",
    "FaustVersionError",
    "RawSchema",
    "StoreError",
    "abandon",
    "ack_all",
    "applied",
    "apply",
    "buffered",
    "check_version",
    "committed_offset",
    "delivered_through",
    "end_offset",
    "faust_log_argument",
    "kafka_producer",
    "key_partitioner",
    "membership",
    "open_databases",
    "open_partitions",
    "read_offset",
    "set_aside",
    "set_aside_count",
    "set_persisted_offset",
    "store_active_items",
    "store_get",
    "store_items",
    "store_path",
    "store_put_all",
    "store_scan",
    "take_batches",
    "unpatch",
    "wrap_changelog_apply",
]

apply()
