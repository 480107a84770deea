"""The Store: one table partition's durable bytes, in named key spaces, written atomically.

Serialisation lives above this interface (see :mod:`streamapp.tables.table`). Two
implementations: :class:`RocksStore` (rocksdict, one column family per space, raw mode,
never pickle) and :class:`MemoryStore` for users' unit tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from ..errors import StoreClosedError, StoreFormatError, StoreLockedError
from ..settings import DEFAULT_MEMORY_LIMIT_MB, Settings
from .memory import RocksMemory, rocks_memory

Changes = Mapping[str, Mapping[bytes, bytes | None]]
"""space -> key -> value; ``None`` deletes the key."""

CACHE_KEYS = 10_000
"""Committed values a :class:`RocksStore` keeps in memory per space (see its docstring;
setting ``table_cache_keys``)."""


Reader = Callable[[bytes], bytes | None]
"""``get`` for one space (see :meth:`Store.reader`)."""


class Store(Protocol):
    """Durable key spaces of one partition. ``write`` is atomic across spaces."""

    def get(self, space: str, key: bytes) -> bytes | None: ...

    def reader(self, space: str) -> Reader:
        """``get`` of ``space`` as one callable to keep: the per-event reads call it
        without a method dispatch. Valid for the store's life, wipes included."""
        ...

    def scan(self, space: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` items in key order, from the first key above ``after``."""
        ...

    def write(self, changes: Changes) -> None: ...

    def count(self, space: str) -> int | None:
        """Keys in ``space`` where cheap to know: exact or an estimate (None: unknown)."""
        ...

    def wipe(self) -> None:
        """Remove every key of every space (a store too stale to catch up)."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """A real, non-durable Store for tests and the in-memory broker."""

    def __init__(self, spaces: Iterable[str]) -> None:
        self._spaces: dict[str, dict[bytes, bytes]] = {s: {} for s in spaces}

    def get(self, space: str, key: bytes) -> bytes | None:
        return self._spaces[space].get(key)

    def reader(self, space: str) -> Reader:
        return self._spaces[space].get

    def scan(self, space: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        items = sorted(self._spaces[space].items())
        if after is not None:
            items = [kv for kv in items if kv[0] > after]
        return items[:limit]

    def count(self, space: str) -> int | None:
        return len(self._spaces[space])

    def wipe(self) -> None:
        for kv in self._spaces.values():
            kv.clear()

    def write(self, changes: Changes) -> None:
        unknown = [space for space in changes if space not in self._spaces]
        if unknown:  # all or nothing, like a RocksDB WriteBatch
            raise KeyError(f"unknown store space(s) {unknown}")
        for space, kv in changes.items():
            target = self._spaces[space]
            for key, value in kv.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value

    def close(self) -> None:
        pass


class RocksStore:
    """A Store on one RocksDB directory (rocksdict), one column family per space.

    Writes are not fsynced: a process crash loses nothing (the WAL is in the OS page
    cache), and a machine crash can lose only batches that the changelog (acks=all,
    written first) still holds, so restore replays them. See DESIGN notes in
    :mod:`streamapp.tables.changelog`.

    Reads go through a write-through cache of committed values (absent keys too), at
    most ``cache_keys`` per space, oldest first out: a partition's store has one writer,
    this object, so the cache is the store's state. A replay touches each key once per
    chunk; without the cache every event paid two RocksDB reads (its stream version and
    its table value). Every call runs on the event loop's thread (rocksdict holds the
    GIL anyway), so the cache needs no lock.

    RocksDB's own memory (block cache, memtables) is ``memory``, shared by every store
    of the process (default: that of the default ``memory_limit_mb``).
    """

    def __init__(
        self,
        path: Path,
        spaces: Iterable[str],
        *,
        open_timeout_s: float = 30.0,
        cache_keys: int = CACHE_KEYS,
        memory: RocksMemory | None = None,
    ) -> None:
        from rocksdict import WriteOptions

        self.path = path
        self._names = list(dict.fromkeys(spaces))
        self._open_timeout_s = open_timeout_s
        self.memory = memory or rocks_memory(DEFAULT_MEMORY_LIMIT_MB)
        self._wopts = WriteOptions()
        self._cache = {name: _Cache(cache_keys) for name in self._names}
        self._open()

    def _open(self) -> None:
        from rocksdict import Rdict

        path, names, open_timeout_s = self.path, self._names, self._open_timeout_s
        path.mkdir(parents=True, exist_ok=True)
        opts = self.memory.options()
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        families = {name: self.memory.options() for name in names}
        deadline = time.monotonic() + open_timeout_s
        delay = 0.05
        while True:
            try:
                self._db: Any = Rdict(str(path), opts, column_families=families)
                break
            except Exception as exc:  # rocksdict raises plain Exception
                if "column families not opened" in str(exc).lower():
                    raise StoreFormatError(
                        f"table store {path} holds spaces this app does not declare ({exc}): "
                        "a table was removed or renamed, or an older streamapp wrote it "
                        "(per-table stream versions). Remove the directory; the partition "
                        "is then rebuilt from its changelog or source."
                    ) from exc
                if "lock" not in str(exc).lower():
                    raise
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"table store {path} is still locked by another process after "
                        f"{open_timeout_s:.0f}s (setting store_open_timeout_s); stop the "
                        "other worker using this data dir, or give each worker its own "
                        "--data-dir"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        self._cfs = {name: self._db.get_column_family(name) for name in names}
        self._handles = {name: self._db.get_column_family_handle(name) for name in names}
        for name, cache in self._cache.items():
            cache.open(self._cfs[name], self.path)

    def get(self, space: str, key: bytes) -> bytes | None:
        return self._cache[space][key]

    def reader(self, space: str) -> Reader:
        return self._cache[space].__getitem__

    def scan(self, space: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """A page read with a short-lived iterator: no iterator outlives the call, so a
        caller paging through a table never keeps the store (and its LOCK) alive."""
        if self._db is None:
            raise StoreClosedError(f"table store {self.path} is closed (partition revoked)")
        it: Any = self._cfs[space].iter()
        try:
            if after is None:
                it.seek_to_first()
            else:
                it.seek(after)
                if it.valid() and it.key() == after:
                    it.next()
            out: list[tuple[bytes, bytes]] = []
            while it.valid() and len(out) < limit:
                out.append((it.key(), it.value()))
                it.next()
            return out
        finally:
            del it

    def count(self, space: str) -> int | None:
        """RocksDB's estimate of the keys in ``space`` (memtables and SST properties)."""
        cf = self._cfs.get(space)
        if cf is None:
            return None
        value = cf.property_int_value("rocksdb.estimate-num-keys")
        return None if value is None else int(value)

    def wipe(self) -> None:
        """Close, delete the directory, open empty again with the same spaces."""
        from rocksdict import Options, Rdict

        self.close()
        Rdict.destroy(str(self.path), Options(raw_mode=True))
        self._open()

    def write(self, changes: Changes) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for space, kv in changes.items():
            handle = self._handles[space]
            for key, value in kv.items():
                if value is None:
                    batch.delete(key, handle)
                else:
                    batch.put(key, value, handle)
        try:
            self._db.write(batch, self._wopts)
        except BaseException:
            for space in changes:  # whether the write landed is unknown: read it again
                self._cache[space].clear()
            raise
        for space, kv in changes.items():
            self._cache[space].wrote(kv)

    def close(self) -> None:
        # Column-family objects keep the DB (and its LOCK) alive: drop them first.
        for cache in self._cache.values():
            cache.close()
        self._cfs.clear()
        self._handles.clear()
        if self._db is not None:
            self._db.close()
            self._db = None


class _Cache(dict[bytes, bytes | None]):
    """One space's committed values, absent keys included; a miss reads RocksDB (in
    ``__missing__``, so a hit is one dict lookup in C). At most ``bound`` keys: when
    full, the older half (by first insertion) goes, amortised O(1) per key."""

    __slots__ = ("_bound", "_family", "_path")

    def __init__(self, bound: int) -> None:
        super().__init__()
        self._bound = bound
        self._family: Any = None
        self._path: Path | None = None

    def open(self, family: Any, path: Path) -> None:
        self.clear()
        self._family, self._path = family, path

    def close(self) -> None:
        self.clear()
        self._family = None

    def __missing__(self, key: bytes) -> bytes | None:
        if self._family is None:
            raise StoreClosedError(f"table store {self._path} is closed (partition revoked)")
        value: bytes | None = self._family.get(key)
        if len(self) >= self._bound:
            if not self._bound:
                return value
            self._evict()
        self[key] = value
        return value

    def wrote(self, changes: Mapping[bytes, bytes | None]) -> None:
        """Take the values of a successful write, as exact-size copies: a value made by
        orjson keeps the ~4 KB buffer it was built in (glibc shrinks it in place; the
        tail stays unusable), so a cached value would hold 4 KB, not its length."""
        if self._bound:
            self.update({k: v if v is None else bytes(memoryview(v)) for k, v in changes.items()})
            if len(self) > self._bound:
                self._evict()

    def _evict(self) -> None:
        for key in list(islice(self, len(self) - self._bound // 2)):
            del self[key]


def rocks_opener(
    settings: Settings, app_id: str, agent: str, partition: int
) -> Callable[[list[str]], Store]:
    """Opens one agent partition's RocksStore under ``data_dir`` (blocking: in a thread)."""
    path = Path(settings.data_dir) / app_id / agent / str(partition)
    timeout = settings.store_open_timeout_s

    cache_keys = settings.table_cache_keys
    memory = rocks_memory(settings.memory_limit_mb)

    def open_store(spaces: list[str]) -> Store:
        return RocksStore(
            path, spaces, open_timeout_s=timeout, cache_keys=cache_keys, memory=memory
        )

    return open_store
