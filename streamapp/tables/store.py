"""The Store: one table partition's durable bytes, in named key spaces, written atomically.

Serialisation lives above this interface (see :mod:`streamapp.tables.table`). Two
implementations: :class:`RocksStore` (rocksdict, one column family per space, raw mode,
never pickle) and :class:`MemoryStore` for users' unit tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..errors import StoreLockedError

Changes = Mapping[str, Mapping[bytes, bytes | None]]
"""space -> key -> value; ``None`` deletes the key."""


class Store(Protocol):
    """Durable key spaces of one partition. ``write`` is atomic across spaces."""

    def get(self, space: str, key: bytes) -> bytes | None: ...

    def items(self, space: str) -> Iterator[tuple[bytes, bytes]]: ...

    def write(self, changes: Changes) -> None: ...

    def close(self) -> None: ...


class MemoryStore:
    """A real, non-durable Store for tests and the in-memory broker."""

    def __init__(self, spaces: Iterable[str]) -> None:
        self._spaces: dict[str, dict[bytes, bytes]] = {s: {} for s in spaces}

    def get(self, space: str, key: bytes) -> bytes | None:
        return self._spaces[space].get(key)

    def items(self, space: str) -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted(self._spaces[space].items()))

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
    """

    def __init__(self, path: Path, spaces: Iterable[str], *, open_timeout_s: float = 30.0) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        names = list(dict.fromkeys(spaces))
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        families = {name: Options(raw_mode=True) for name in names}
        deadline = time.monotonic() + open_timeout_s
        delay = 0.05
        while True:
            try:
                self._db: Any = Rdict(str(path), opts, column_families=families)
                break
            except Exception as exc:  # rocksdict raises plain Exception
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
        self._wopts = WriteOptions()

    def get(self, space: str, key: bytes) -> bytes | None:
        value: bytes | None = self._cfs[space].get(key)
        return value

    def items(self, space: str) -> Iterator[tuple[bytes, bytes]]:
        cf: Any = self._cfs[space]
        yield from cf.items()

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
        self._db.write(batch, self._wopts)

    def close(self) -> None:
        # Column-family objects keep the DB (and its LOCK) alive: drop them first.
        self._cfs.clear()
        self._handles.clear()
        if self._db is not None:
            self._db.close()
            self._db = None
