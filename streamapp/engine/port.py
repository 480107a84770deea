"""What a transport gives the partition task: a small port per partition, a transaction.

Kafka, RabbitMQ, the event store and the in-memory broker each implement these; the
task (:mod:`streamapp.engine.task`) holds everything else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from ..agent import Agent
from ..sink import Message
from ..tables.partition import BatchChanges, PartitionTables

NO_LANES: Mapping[str, int] = {}


class Committed(NamedTuple):
    """The source's committed position, and the positions of agents that were ahead of it
    at that commit (by agent name; see :mod:`streamapp.engine.lane`)."""

    position: int
    ahead: Mapping[str, int]


class PartitionPort(Protocol):
    """One source partition, as the task drives it."""

    absolute: bool
    """True when positions are the partition's own (Kafka offsets): an agent without a
    position may start elsewhere than the others (the reset policy). False when they
    only count deliveries from :meth:`begin` on (RabbitMQ): every agent starts there."""

    def pause(self) -> None:
        """Stop fetching this partition (the task works, restores or waits)."""

    def resume(self) -> None:
        """Fetch again, from the last rewind position or where fetching stopped."""

    def rewind(self, position: int) -> None:
        """The next delivery of this partition is the one at ``position``."""

    async def settle(self, position: int, ahead: Mapping[str, int] = NO_LANES) -> None:
        """Every delivery before ``position`` is done (commit the offset; ack). ``ahead``:
        agents of the partition that are further (a transport that can, keeps them with
        the position: Kafka, in the offset's metadata)."""

    async def committed(self) -> Committed | None:
        """The last :meth:`settle` that is durable at the source, with its ``ahead``
        (None: the transport keeps no position, or none was committed)."""
        ...

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        """Start live delivery at ``position``; None: the transport decides (a stateless
        agent: the group's committed position; a new table: the reset policy, or the
        beginning with ``earliest``). Returns the position where delivery starts."""
        ...

    def end(self) -> int | None:
        """The position after the partition's last delivery as last seen, when known
        without a request (None: unknown). Gives lag in status and metrics."""
        ...

    async def through(self, position: int) -> int:
        """Where to settle once every delivery handed out is done and the last one is
        just before ``position``: past what the transport skipped after it (Kafka:
        transaction markers, aborted batches), so a caught-up partition of a
        transactional topic shows no lag. Other transports: ``position``."""
        ...


class Transaction(Protocol):
    """One partition task's batches made durable atomically (Kafka: a transaction).

    A commit holds every agent's changelog records (its tables' changes and checkpoint),
    every derived event sent, and the source position: all visible to ``read_committed``
    readers, or none. A stable id per source partition fences a previous owner.
    """

    async def open(self) -> None:
        """Fence any previous owner of the partition (its open transaction is aborted)."""

    async def restore(self, agent: Agent, tables: PartitionTables) -> int:
        """Bring ``agent``'s ``tables`` up to its changelog; the records restored."""
        ...

    async def commit(
        self,
        changes: Sequence[tuple[Agent, BatchChanges]],
        outputs: Sequence[Message],
        settle: Committed | None,
    ) -> list[int]:
        """Commit atomically; returns, per entry of ``changes``, the next changelog
        position of its agent. Raises FencedError when another worker took over."""
        ...

    async def reset(self) -> None:
        """After a failed commit: make the next commit possible (a fresh writer)."""

    async def close(self) -> None: ...
