"""In-memory broker for users' unit tests."""

from .broker import MemoryBroker

__all__ = ["MemoryBroker"]
