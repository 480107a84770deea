"""The Store: one table partition's durable bytes, in named key spaces, written atomically.

The interface every store driver implements (as Faust's ``stores/base.py``):
serialisation lives above it (:mod:`streamapp.tables.table`), no backend detail in it.
The drivers: :class:`~streamapp.tables.rocksdb.store.RocksStore` (RocksDB, one column
family per space) and :class:`~streamapp.tables.memory_store.MemoryStore` (users' unit
tests, the in-memory broker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from ..errors import StoreCorruptError

Changes = Mapping[str, Mapping[bytes, bytes | None]]
"""space -> key -> value; ``None`` deletes the key."""
Reader = Callable[[bytes], bytes | None]
"""``get`` for one space (see :meth:`Store.reader`)."""
OnDamage = Callable[[StoreCorruptError], None]
"""Told once when a store finds itself corrupt (see :meth:`Store.watch`)."""


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

    def write(self, changes: Changes, *, keep: bool = True) -> None:
        """Apply ``changes`` atomically. ``keep``: the written values stay in the store's
        read cache, if it has one. A restore's and a standby's bulk writes of changelog
        records pass False: the cache of each space they change is dropped instead
        (copying each value into it cost a quarter of a restore's CPU, and few of them
        are read soon; a standby's stale reads then read RocksDB)."""
        ...

    def count(self, space: str) -> int | None:
        """Keys in ``space`` where cheap to know: exact or an estimate (None: unknown)."""
        ...

    def wipe(self) -> None:
        """Remove every key of every space (a store too stale to catch up)."""
        ...

    def watch(self, on_damage: OnDamage) -> None:
        """Call ``on_damage`` once, the first time any read or write finds the store
        corrupt (:class:`~streamapp.errors.StoreCorruptError`), whoever made it: from
        then on every call raises that error, so nothing is served from it."""
        ...

    def close(self) -> None: ...
