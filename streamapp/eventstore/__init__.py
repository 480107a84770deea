"""The event store: CloudEvents appended per stream with optimistic concurrency, read in
one global order. SQLite (one file) is the embedded default; PostgreSQL the shared one.

``store = await open_store(settings.event_store)``; see :mod:`.base` for the interface,
:mod:`.model` for its values.
"""

from __future__ import annotations

from ..errors import ConcurrencyError, DuplicateEventError, InvalidEventError
from ..settings.store_url import StoreUrl, parse_url
from .base import EventStore, EventStoreBackend, ForwarderState
from .model import (
    Append,
    AppendResult,
    BatchResult,
    OnDuplicate,
    ParkedRecord,
    Resent,
    StoredEvent,
    StoredRow,
)


async def open_store(url: str) -> EventStoreBackend:
    """Open the store of an ``event_store`` URL, creating its schema if missing.

    Raises ConfigError naming the setting for a bad URL, an unreachable database, or a
    PostgreSQL URL without psycopg installed (``pip install 'streamapp[postgres]'``).
    """
    if parse_url(url).kind == "postgresql":
        from .postgres.store import PostgresEventStore

        return await PostgresEventStore.open(url)
    from .sqlite.store import SqliteEventStore

    return await SqliteEventStore.open(url)


__all__ = [
    "Append",
    "AppendResult",
    "BatchResult",
    "ConcurrencyError",
    "DuplicateEventError",
    "EventStore",
    "EventStoreBackend",
    "ForwarderState",
    "InvalidEventError",
    "OnDuplicate",
    "ParkedRecord",
    "Resent",
    "StoreUrl",
    "StoredEvent",
    "StoredRow",
    "open_store",
    "parse_url",
]
