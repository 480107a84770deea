"""The memory broker as a transport: its capabilities, checked as a worker's are. It
runs no worker (users drive it from their unit tests, :class:`~.broker.MemoryBroker`),
so it is not a value of setting broker and has no factories."""

from __future__ import annotations

from ..transports.base import Capabilities

NAME = "memory"
CAPABILITIES = Capabilities(
    retry_chain=True,
    sends=True,
    group_by_refused=None,
    changelog=False,
    topics=False,
    group=False,
    embedded=False,
    keeps_consumed=True,
)
"""Everything an agent asks for: the retry chain, derived events and re-keying run on
in-memory topics (tables live in memory, so there is nothing to restore)."""
