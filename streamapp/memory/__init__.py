"""In-memory broker for users' unit tests."""

from .broker import MemoryBroker, StuckRecord, StuckRecordsError

__all__ = ["MemoryBroker", "StuckRecord", "StuckRecordsError"]
