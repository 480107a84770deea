"""The Store: one table partition's durable bytes, in named key spaces, written atomically.

The interface is :mod:`streamapp.tables.base`; its drivers are
:mod:`streamapp.tables.rocksdb.store` (:class:`RocksStore`: rocksdict, one column family
per space, raw mode, never pickle) and :mod:`streamapp.tables.memory_store`
(:class:`MemoryStore`, for users' unit tests). This module names them all in one place,
as it did when it held them: imports from here keep working.
"""

from __future__ import annotations

from .base import Changes, OnDamage, Reader, Store
from .memory_store import MemoryStore
from .rocksdb.store import CACHE_KEYS, RocksStore, discard, reads_from_thread, rocks_opener

__all__ = [
    "CACHE_KEYS",
    "Changes",
    "MemoryStore",
    "OnDamage",
    "Reader",
    "RocksStore",
    "Store",
    "discard",
    "reads_from_thread",
    "rocks_opener",
]
