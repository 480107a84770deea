"""What a transport gives the partition task: a small port per partition, a changelog.

Kafka, RabbitMQ, the event store and the in-memory broker each implement these; the
task (:mod:`streamapp.engine.task`) holds everything else.
"""

from __future__ import annotations

from typing import Protocol

from ..tables.partition import BatchChanges, PartitionTables


class PartitionPort(Protocol):
    """One source partition, as the task drives it."""

    def pause(self) -> None:
        """Stop fetching this partition (the task works, restores or waits)."""

    def resume(self) -> None:
        """Fetch again, from the last rewind position or where fetching stopped."""

    def rewind(self, position: int) -> None:
        """The next delivery of this partition is the one at ``position``."""

    async def settle(self, position: int) -> None:
        """Every delivery before ``position`` is done (commit the offset; ack)."""

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        """Start live delivery at ``position``; None: the transport decides (a stateless
        agent: the group's committed position; a new table: the reset policy, or the
        beginning with ``earliest``). Returns the position where delivery starts."""
        ...

    def end(self) -> int | None:
        """The position after the partition's last delivery as last seen, when known
        without a request (None: unknown). Gives lag in status and metrics."""
        ...


class Changelog(Protocol):
    """Replicates one partition's batches so that another worker can take it over."""

    async def open(self, tables: PartitionTables) -> int:
        """Fence any previous writer, then bring ``tables`` up to the changelog; returns
        the number of records restored."""
        ...

    async def write(self, batch: BatchChanges) -> int:
        """Make ``batch`` durable and atomic; returns the next changelog position.
        Raises FencedError when another worker took the partition over."""
        ...

    async def reset(self) -> None:
        """After a failed write: make the next write possible (a fresh writer)."""

    async def close(self) -> None: ...
