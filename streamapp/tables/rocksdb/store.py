"""RocksStore: the Store on one RocksDB directory (rocksdict, one column family per
space, raw mode, never pickle), its cache of committed values, and how a partition's
store is opened and discarded."""

from __future__ import annotations

import gc
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import (
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreFormatError,
    StoreLockedError,
)
from ...settings.settings import DEFAULT_MEMORY_LIMIT_MB, Settings
from ..base import Changes, OnDamage, Reader, Store
from .cache import RocksMemory, rocks_memory
from .status_codes import status_of, store_error

log = logging.getLogger("streamapp.tables")

CACHE_KEYS = 10_000
"""Committed values a :class:`RocksStore` keeps in memory per space (see its docstring;
setting ``table_cache_keys``)."""


if TYPE_CHECKING:
    import asyncio

_THREAD = threading.local()
"""Set in a blocking handler's thread (:func:`reads_from_thread`): the event loop it
serves. Reads there do not fill the caches, damage is told to the loop."""


def reads_from_thread(loop: asyncio.AbstractEventLoop) -> None:
    """Mark the calling thread as one that reads stores for ``loop`` (a blocking handler's,
    :mod:`streamapp.engine.blocking`). A store's cache has one writer, the loop: a read
    from another thread filling it could put back a value the loop had just replaced
    (another agent's table, committed meanwhile), so such reads go to RocksDB; a
    corruption found there is told to the store's watcher on the loop."""
    _THREAD.loop = loop


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
    its table value). The event loop's thread alone fills and writes the cache (rocksdict
    holds the GIL anyway), so it needs no lock; a blocking handler's thread reads it, and
    RocksDB on a miss, without filling it (:func:`reads_from_thread`).

    RocksDB's own memory (block cache, memtables) is ``memory``, shared by every store
    of the process (default: that of the default ``memory_limit_mb``).

    RocksDB's errors become typed errors here (:mod:`streamapp.tables.rocksdb.status_codes`).
    At open, RocksDB checks every SST file's size against the manifest and reads its footer and
    index (``paranoid_checks``, every file open): a truncated file or a damaged index is
    :class:`~streamapp.errors.StoreCorruptError` then. Bit rot inside a data block shows
    only when that block is read (a full checksum scan at every open was measured at
    0.38 s per million keys, 12.5 MB of SST files, against 9 ms for the open itself): the
    read raises the same error, the store remembers it
    (every later call raises it too) and tells its watcher (:meth:`watch`).
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
        self.damage: StoreCorruptError | None = None
        """The corruption this store found (None: none found)."""
        self._on_damage: OnDamage | None = None
        self._open()

    def _open(self) -> None:
        from rocksdict import Rdict

        path, names, open_timeout_s = self.path, self._names, self._open_timeout_s
        path.mkdir(parents=True, exist_ok=True)
        opts = self.memory.options()
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_paranoid_checks(True)  # RocksDB's default, said: check what it opens
        opts.set_max_open_files(-1)  # every SST opened (size, footer, index) at open
        families = {name: self.memory.options() for name in names}
        self._made = _made(path, names)
        deadline = time.monotonic() + open_timeout_s
        delay = 0.05
        while True:
            try:
                self._db: Any = Rdict(str(path), opts, column_families=families)
                break
            except Exception as exc:  # rocksdict raises plain Exception
                status = status_of(exc)
                code, detail = status or ("", "")
                if code == "Invalid argument" and detail.startswith("Column families not opened"):
                    raise StoreFormatError(
                        f"table store {path} holds spaces this app does not declare ({exc}): "
                        "a table was removed or renamed, or an older streamapp wrote it "
                        "(per-table stream versions). Remove the directory; the partition "
                        "is then rebuilt from its changelog or source.",
                        path=str(path),
                        status=str(exc),
                    ) from exc
                error = store_error(exc, str(path), "opening it")
                if error is None:
                    raise
                if not isinstance(error, StoreLockedError):
                    raise error from exc
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"table store {path} is still locked by another process after "
                        f"{open_timeout_s:.0f}s (setting store_open_timeout_s); stop the "
                        "other worker using this data dir, or give each worker its own "
                        "--data-dir",
                        path=str(path),
                        status=error.status,
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.damage = None  # opened (again, after a wipe): nothing found yet
        self._cfs = {name: self._db.get_column_family(name) for name in names}
        self._handles = {name: self._db.get_column_family_handle(name) for name in names}
        for name, cache in self._cache.items():
            cache.open(self._cfs[name], self)

    def get(self, space: str, key: bytes) -> bytes | None:
        return self._cache[space][key]

    def reader(self, space: str) -> Reader:
        return self._cache[space].__getitem__

    def scan(self, space: str, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """A page read with a short-lived iterator: no iterator outlives the call, so a
        caller paging through a table never keeps the store (and its LOCK) alive."""
        if self.damage is not None:
            raise self.stuck()
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
            it.status()  # an iterator that stopped on a damaged block says so here
            return out
        except Exception as exc:
            raise self.failed(exc, f"scanning {space!r}") from exc
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

    def write(self, changes: Changes, *, keep: bool = True) -> None:
        if self.damage is not None:
            raise self.stuck()
        batch = self._batch(changes)
        try:
            self._db.write(batch, self._wopts)
        except BaseException as exc:
            for space in changes:  # whether the write landed is unknown: read it again
                self._cache[space].clear()
            if isinstance(exc, Exception):
                raise self.failed(exc, "writing a batch") from exc
            raise
        for space, kv in changes.items():
            if keep:
                self._cache[space].wrote(kv)
            elif kv:  # a restore's or a standby's bulk write: drop what may be stale
                self._cache[space].clear()
        if self._made:
            self._made = [name for name in self._made if name not in changes]

    def _batch(self, changes: Changes) -> Any:
        """The WriteBatch of ``changes`` (its own frame: no column-family handle stays
        in a traceback of a failed write, which would keep the DB open)."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for space, kv in changes.items():
            handle = self._handles[space]
            for key, value in kv.items():
                if value is None:
                    batch.delete(key, handle)
                else:
                    batch.put(key, value, handle)
        return batch

    def stuck(self) -> StoreCorruptError:
        """A new copy of the corruption found (raised anew each time: one instance raised
        again and again would collect every caller's frames in its traceback)."""
        assert self.damage is not None
        damage = self.damage
        return StoreCorruptError(str(damage), path=damage.path, status=damage.status)

    def watch(self, on_damage: OnDamage) -> None:
        self._on_damage = on_damage
        if self.damage is not None:
            on_damage(self.damage)

    def failed(self, exc: Exception, doing: str) -> Exception:
        """The error to raise for ``exc`` (rocksdict's, while ``doing``): a typed one for
        a RocksDB status. A corruption is remembered (every later call raises it, the
        cache is dropped) and told to the watcher once."""
        if isinstance(exc, StoreError):
            return exc
        error = store_error(exc, str(self.path), doing)
        if error is None:
            return exc
        if isinstance(error, StoreCorruptError) and self.damage is None:
            self.damage = StoreCorruptError(str(error), path=error.path, status=error.status)
            for cache in self._cache.values():
                cache.damaged()
            if self._on_damage is not None:
                loop = getattr(_THREAD, "loop", None)
                if loop is None:
                    self._on_damage(self.damage)
                else:  # a blocking handler's thread: the watcher runs on the loop
                    loop.call_soon_threadsafe(self._on_damage, self.damage)
        return error

    def close(self) -> None:
        """Close the DB. Spaces this open made and nothing wrote are dropped first: an
        open that is refused (a table added to state made without it) leaves the
        directory as it was, so undoing the change opens it again."""
        # Column-family objects keep the DB (and its LOCK) alive: drop them first.
        for cache in self._cache.values():
            cache.close()
        self._cfs.clear()
        self._handles.clear()
        if self._db is not None:
            for name in self._made:
                try:
                    self._db.drop_column_family(name)
                except Exception as exc:  # rocksdict raises plain Exception
                    log.warning(
                        "table store %s: dropping unused space %s failed: %s", self.path, name, exc
                    )
            self._made = []
            self._db.close()
            self._db = None


def _made(path: Path, names: list[str]) -> list[str]:
    """The spaces among ``names`` that opening ``path`` will make (none when its column
    families cannot be listed: then nothing is dropped at close)."""
    from rocksdict import Rdict

    if not (path / "CURRENT").exists():
        return list(names)
    try:
        existing = set(Rdict.list_cf(str(path)))
    except Exception:  # rocksdict raises plain Exception; the open says what is wrong
        return []
    return [name for name in names if name not in existing]


class _Cache(dict[bytes, bytes | None]):
    """One space's committed values, absent keys included; a miss reads RocksDB (in
    ``__missing__``, so a hit is one dict lookup in C). At most ``bound`` keys: when
    full, the older half (by first insertion) goes, amortised O(1) per key."""

    __slots__ = ("_bound", "_damaged", "_family", "_store")

    def __init__(self, bound: int) -> None:
        super().__init__()
        self._bound = bound
        self._family: Any = None
        self._store: RocksStore | None = None
        self._damaged = False

    def open(self, family: Any, store: RocksStore) -> None:
        self.clear()
        self._family, self._store, self._damaged = family, store, False

    def close(self) -> None:
        self.clear()
        self._family = None

    def damaged(self) -> None:
        """The store is corrupt: nothing more is answered, cached values neither."""
        self.clear()
        self._damaged = True

    def __missing__(self, key: bytes) -> bytes | None:
        if self._damaged:
            assert self._store is not None
            raise self._store.stuck()
        if self._family is None:
            path = None if self._store is None else self._store.path
            raise StoreClosedError(f"table store {path} is closed (partition revoked)")
        try:
            value: bytes | None = self._family.get(key)
        except Exception as exc:
            assert self._store is not None
            raise self._store.failed(exc, "reading a key") from exc
        if not self._bound or getattr(_THREAD, "loop", None) is not None:
            return value  # no cache, or a blocking handler's thread: the loop fills it
        if len(self) >= self._bound:
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


def discard(path: str) -> None:
    """Remove a damaged store's directory (it must be closed), so that it opens empty.
    RocksDB's destroy takes the store's LOCK first: a store another process holds is
    not removed (StoreLockedError)."""
    from rocksdict import Options, Rdict

    gc.collect()  # an error's traceback cycle may still hold the closed store's handles
    try:
        Rdict.destroy(path, Options(raw_mode=True))
    except Exception as exc:
        error = store_error(exc, path, "removing it")
        if isinstance(error, StoreLockedError):
            raise error from exc
        log.debug("destroying %s failed (%r): removing the directory", path, exc)
    shutil.rmtree(path, ignore_errors=True)
