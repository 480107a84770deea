"""In-memory broker for users' unit tests."""

from ..testing.broker import MemoryBroker, StuckRecord, StuckRecordsError

__all__ = ["MemoryBroker", "StuckRecord", "StuckRecordsError"]
