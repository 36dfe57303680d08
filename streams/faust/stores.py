"""The local store's faults: RocksDB's errors read as `StoreError`, a corrupt copy set aside.

RocksDB (through rocksdict) raises a bare `Exception` whose text starts with its status: "IO
error: No space left on device", "Corruption: block checksum mismatch", ... Read that way, a
full disk looks like any bug, and the worker dead-lettered inputs whose user it could not read.
`StoreError` names the partition and whether the copy is corrupt, so the runtime can stop the
worker instead (streams/runtime/failstop.py): the input is never the problem.

A partition's local copy is only a cache of its changelog topic. One that RocksDB cannot open
because it is corrupt is moved aside (kept for inspection, the newest `KEEP_SET_ASIDE`) and
opened empty, so Faust's recovery restores it from the changelog in full
(`Store._open_for_partition`, patched: streams/faust/registry.py). Corruption found later, in
a read or a scan, sets the copy aside the same way and stops the worker; its restart restores.

Iterating a RocksDB database through rocksdict's `items()` stops at a corrupt block as if the
data ended there. `scan` uses the raw iterator and asks its status at the end: a scan that
ended early raises.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import rocksdict

log = logging.getLogger("oracular.worker")

SET_ASIDE_DIR: Final = "set-aside"
"""Where corrupt copies go, beside the table's databases."""
KEEP_SET_ASIDE: Final = 3
"""Corrupt copies kept for inspection (the oldest beyond these are deleted): each is a whole
partition's database, and a disk that corrupts files may do it again."""
_CORRUPT_PREFIXES: Final = ("Corruption:",)
_STORAGE_PREFIXES: Final = (
    "IO error:",
    "Corruption:",
    "Incomplete:",
    "Aborted:",
    "Busy:",
    "Timed out:",
    "Result incomplete:",
    "Operation expired:",
    "Try again:",
    "Space limit reached",
    "No space",
)
"""The texts RocksDB's statuses start with (`Status::ToString`) for a fault of the store
itself, not of the call: "Invalid argument" and "Not implemented" are bugs, not disk faults."""

set_aside_count: list[int] = [0]
"""Corrupt copies set aside by this process (the worker's /metrics)."""


class StoreError(Exception):
    """The local store failed: it could not be written or read (disk full, an I/O error) or it
    is corrupt. Never the input's fault."""

    def __init__(self, message: str, *, partition: int | None, corrupt: bool) -> None:
        super().__init__(message)
        self.partition = partition
        self.corrupt = corrupt


def as_store_error(exc: BaseException, partition: int | None) -> StoreError | None:
    """`exc` as a StoreError when it is RocksDB's report of a store fault (or an OSError of
    the disk), else None."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, OSError):
        return StoreError(str(exc), partition=partition, corrupt=False)
    if type(exc) is not Exception:  # rocksdict raises exactly Exception for a RocksDB status
        return None
    text = str(exc)
    if not text.startswith(_STORAGE_PREFIXES):
        return None
    return StoreError(text, partition=partition, corrupt=text.startswith(_CORRUPT_PREFIXES))


@contextlib.contextmanager
def faults_of(partition: int | None) -> Iterator[None]:
    """Raise RocksDB's store faults in the block as StoreError (for `partition`)."""
    try:
        yield
    except Exception as exc:
        error = as_store_error(exc, partition)
        if error is None:
            raise
        if error is exc:  # already one: name the partition when it did not
            if error.partition is None:
                error.partition = partition
            raise
        raise error from exc


def scan(db: Any, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of the RocksDB database `db` from `start` (the first key when
    None), in key order, checksums verified; raises StoreError (corrupt) when the iteration
    ends early on a bad block instead of at the end of the data."""
    options = rocksdict.ReadOptions()
    options.set_verify_checksums(True)
    it = db.iter(options)
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    while it.valid():
        yield it.key(), it.value()
        it.next()
    with faults_of(None):
        it.status()  # raises RocksDB's error when the iteration stopped on one


def set_aside(path: Path, why: str) -> Path | None:
    """Move the database directory `path` into SET_ASIDE_DIR beside it, stamped with the time;
    keep the newest KEEP_SET_ASIDE there. Returns where it went (None: there was nothing)."""
    if not path.exists():
        return None
    aside = path.parent / SET_ASIDE_DIR
    aside.mkdir(mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = aside / f"{path.name}.{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = aside / f"{path.name}.{stamp}.{n}"
    path.rename(target)
    (target / "SET-ASIDE-REASON.txt").write_text(why + "\n", encoding="utf-8")
    set_aside_count[0] += 1
    kept = sorted(aside.iterdir(), key=lambda p: p.stat().st_mtime)
    for old in kept[:-KEEP_SET_ASIDE]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _setting_aside_corrupt(open_for_partition: Callable[[Any, int], Any]) -> Callable[..., Any]:
    """`Store._open_for_partition`, setting a corrupt database aside and opening it anew
    (empty: the recovery restores it from the changelog) instead of raising. Any other error
    (a lock, a full disk) is raised as upstream raises it."""

    def _open_or_set_aside(self: Any, partition: int) -> Any:
        try:
            return open_for_partition(self, partition)
        except Exception as exc:
            error = as_store_error(exc, partition)
            if error is None or not error.corrupt:
                raise
            path = Path(self.partition_path(partition))
            target = set_aside(path, f"{error}")
            log.warning(
                "the local copy of partition %s is corrupt (%s): moved aside to %s; it is "
                "restored from the changelog",
                partition,
                str(error).splitlines()[0],
                target,
            )
            return open_for_partition(self, partition)

    return _open_or_set_aside
