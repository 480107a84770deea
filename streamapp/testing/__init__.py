"""The in-memory broker for users' unit tests: the same agents, outcomes, policies and
table semantics, no service (``streamapp.memory`` is its former name, kept for one
release)."""

from .broker import MemoryBroker, StuckRecord, StuckRecordsError

__all__ = ["MemoryBroker", "StuckRecord", "StuckRecordsError"]
