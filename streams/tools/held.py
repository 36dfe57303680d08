"""An offline run's users: the most recently used decoded in memory, the others on disk.

`oracular replay` keeps every user it has seen until the end (their final states are its
`--states`, and the end closes their due episodes). Held decoded, a user costs some kilobytes,
so a history of millions of users needed a machine's whole memory. `HeldUsers` keeps at most
`limit` users decoded (the most recently used: a user's events come in sessions, so nearly
every read is of a user read moments ago) and writes the others, encoded as the worker stores
them, to a RocksDB database in a temporary directory. Encoding a user and decoding it again
gives the same user (the stored format is lossless), so where a user is held changes no output.

The order users were first stored in (the order of `--states`) is kept too: in memory while
nothing is on disk, on disk from the first user written there.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompactionStyle,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
)

from schemas.stored import StoredUser, encode_stored
from streams.runtime.processor import StateCache, Table

USER_BYTES: Final = 8192
"""About what a user held decoded costs in memory (the realistic stream's users, measured:
BENCHMARKS.md), to turn `oracular replay --memory` into a number of users."""
DEFAULT_MEMORY_MIB: Final = 512
"""`oracular replay --memory`'s default."""
STATE: Final = b"s"
"""Key prefix of a user: STATE + user key -> its 8-byte sequence number + its stored value."""
ORDER: Final = b"o"
"""Key prefix of the order: ORDER + 8-byte sequence number -> user key. An entry whose user
holds another number is stale (the user expired and was stored again later)."""
SORTED: Final = b"t"
"""Key prefix of the keys `sorted_keys` sorts on disk."""
WRITE_BUFFER: Final = 16 << 20
"""RocksDB's memory for writes before they go to a file (its default is 64 MiB)."""
BLOCK_CACHE: Final = 16 << 20
"""RocksDB's cache of file blocks read: a user read back is seldom read again soon (it is
then held decoded), so little is gained beyond the index and filter blocks."""
BLOOM_BITS: Final = 10
"""Bloom filter bits per key: a new user's read (most reads of a first run over a history)
is answered without reading a data block."""
SORT_BATCH: Final = 10_000


def _number(n: int) -> bytes:
    return n.to_bytes(8, "big")


class Spill:
    """Users encoded in a RocksDB database in a temporary directory, removed by `close`."""

    def __init__(self, directory: str | None = None) -> None:
        """Create the database under `directory` (the system's temporary directory: None)."""
        self.path = Path(tempfile.mkdtemp(prefix="oracular-replay-", dir=directory))
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(WRITE_BUFFER)
        table = BlockBasedOptions()
        table.set_bloom_filter(BLOOM_BITS, False)
        table.set_block_cache(Cache(BLOCK_CACHE))
        table.set_cache_index_and_filter_blocks(True)  # bounded by the cache, not by the data
        options.set_block_based_table_factory(table)
        # Every user is written again and again: leveled compaction rewrote each value many
        # times over, most of a replay's CPU at 300,000 users (210 CPU-s against 89 with
        # universal compaction, BENCHMARKS.md). The files are temporary: no compression.
        options.set_compaction_style(DBCompactionStyle.universal())
        options.set_compression_type(DBCompressionType.none())
        self.db = Rdict(str(self.path), options)
        self.next = 0
        """The next user's sequence number."""

    def get(self, key: bytes) -> tuple[int, bytes] | None:
        """(sequence number, stored value) of user `key`, or None."""
        found = self.db.get(STATE + key)
        if found is None:
            return None
        found = bytes(found)
        return int.from_bytes(found[:8], "big"), found[8:]

    def write(self, puts: list[tuple[bytes, int, bytes]], deletes: list[bytes]) -> None:
        """Store users (key, sequence number, value) and forget others, in one write."""
        batch = WriteBatch(raw_mode=True)
        for key, seq, value in puts:
            batch.put(STATE + key, _number(seq) + value)
        for key in deletes:
            batch.delete(STATE + key)
        self.db.write(batch)

    def number(self, keys: list[bytes]) -> list[int]:
        """Append users to the order; their sequence numbers."""
        batch = WriteBatch(raw_mode=True)
        numbers = []
        for key in keys:
            batch.put(ORDER + _number(self.next), key)
            numbers.append(self.next)
            self.next += 1
        self.db.write(batch)
        return numbers

    def ordered(self) -> Iterator[tuple[int, bytes]]:
        """(sequence number, user key) in order, stale entries included."""
        for key, value in self._prefixed(ORDER):
            yield int.from_bytes(key[len(ORDER) :], "big"), value

    def sorted_keys(self, keys: Iterable[bytes]) -> Iterator[bytes]:
        """`keys` in order (sorted on disk, so any number of them)."""
        batch = WriteBatch(raw_mode=True)
        for n, key in enumerate(keys):
            batch.put(SORTED + key + _number(n), key)
            if n % SORT_BATCH == SORT_BATCH - 1:
                self.db.write(batch)
                batch = WriteBatch(raw_mode=True)
        self.db.write(batch)
        for stored, key in self._prefixed(SORTED):
            self.db.delete(stored)
            yield key

    def close(self) -> None:
        """Close the database and remove its directory."""
        self.db.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def _prefixed(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        options = ReadOptions()
        options.set_verify_checksums(True)
        it = self.db.iter(options)
        it.seek(prefix)
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(prefix):
                break
            yield key, bytes(it.value())
            it.next()
        it.status()  # raises the error an iteration stopped on: never a short read


def _number_on(spill: Spill, key: bytes) -> int | None:
    """The user's sequence number on disk (None: not there)."""
    found = spill.get(key)
    return None if found is None else found[0]


class SpillTable(Table):
    """The state table an offline run reads users from when they are not in memory."""

    def __init__(self) -> None:
        self.spill: Spill | None = None
        self.numbers: dict[bytes, int | None] = {}
        """The sequence number of each user read since `HeldUsers.keep` last ran (None: not
        on disk), so `keep` need not read the user again."""

    def get(self, key: bytes, partition: int) -> bytes | None:
        """The user's stored value on disk, or None."""
        found = None if self.spill is None else self.spill.get(key)
        self.numbers[key] = None if found is None else found[0]
        return None if found is None else found[1]

    def set(self, key: bytes, value: bytes | None, partition: int) -> None:
        """Not used: `HeldUsers` writes the disk."""
        raise NotImplementedError  # pragma: no cover


class HeldUsers(StateCache):
    """An offline run's users: at most `limit` decoded in memory, the rest on disk."""

    def __init__(self, limit: int = sys.maxsize, directory: str | None = None) -> None:
        """Hold nobody yet; write users beyond `limit` under `directory` (see `Spill`)."""
        super().__init__(limit)
        self.table = SpillTable()
        self.directory = directory
        self.first: dict[bytes, None] | None = {}
        """Users in the order first stored, while none is on disk (then: `Spill.ordered`)."""
        self.numbers: dict[bytes, int] = {}
        """Once users are on disk: the sequence number of each user in memory."""
        self.written = 0
        """Users written to disk so far (the same user counted each time)."""

    def get(self, key: bytes) -> StoredUser | None:
        """The user if held in memory (now the most recently used), or None."""
        user = self.users.get(key)
        if user is not None:
            self.users.move_to_end(key)
        return user

    def keep(self, changed: Iterable[tuple[bytes, StoredUser | None]]) -> None:
        """Hold the users a batch changed (None: the user expired and is forgotten)."""
        users, first, spill = self.users, self.first, self.table.spill
        read, self.table.numbers = self.table.numbers, {}
        new: list[bytes] = []
        gone: list[bytes] = []
        for key, user in changed:
            if user is None:
                users.pop(key, None)
                if first is not None:
                    first.pop(key, None)
                else:
                    self.numbers.pop(key, None)
                    gone.append(key)
                continue
            if key not in users:
                if first is not None:
                    first[key] = None
                else:
                    assert spill is not None
                    number = read[key] if key in read else _number_on(spill, key)
                    if number is None:
                        new.append(key)
                    else:
                        self.numbers[key] = number
            users[key] = user
            users.move_to_end(key)
        if spill is not None and (new or gone):
            self.numbers.update(zip(new, spill.number(new), strict=True))
            spill.write([], gone)
        if len(users) > self.limit:
            self._evict(len(users) - self.limit)

    def held(self) -> Iterator[tuple[bytes, StoredUser | bytes]]:
        """Every user held, in the order first stored: decoded if in memory, else its stored
        value."""
        if self.first is not None:
            for key in self.first:
                yield key, self.users[key]
            return
        spill = self.table.spill
        assert spill is not None
        for seq, key in spill.ordered():
            user = self.users.get(key)
            if user is not None:
                if self.numbers.get(key) == seq:
                    yield key, user
                continue
            found = spill.get(key)
            if found is not None and found[0] == seq:
                yield key, found[1]

    def count(self) -> int:
        """Users held, in memory and on disk."""
        if self.first is not None:
            return len(self.first)
        return sum(1 for _ in self.held())

    def close(self) -> None:
        """Remove the files on disk."""
        if self.table.spill is not None:
            self.table.spill.close()
            self.table.spill = None

    def _evict(self, count: int) -> None:
        """Write the `count` least recently used users to disk and drop them from memory."""
        spill = self.table.spill
        if spill is None:
            spill = self.table.spill = Spill(self.directory)
            assert self.first is not None
            order = list(self.first)
            self.numbers = dict(zip(order, spill.number(order), strict=True))
            self.first = None
        users, numbers = self.users, self.numbers
        puts = []
        for _ in range(count):
            key, user = users.popitem(last=False)
            puts.append((key, numbers.pop(key), encode_stored(user)))
        spill.write(puts, [])
        self.written += len(puts)
