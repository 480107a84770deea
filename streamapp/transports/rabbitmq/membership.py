"""What a RabbitMQ source asks of its membership: which partitions it owns, and when.

Two answer it: :class:`~streamapp.transports.rabbitmq.members.RabbitMembership` (the workers of an
app share the partitions through the broker) and
:class:`~streamapp.transports.rabbitmq.pinned.StaticMembership` (setting ``amqp_partitions``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

Partitions = list[tuple[str, int]]
"""(source topic, partition) pairs."""


class Membership(Protocol):
    """Tells a source which partitions it owns, now and on every change."""

    async def start(
        self,
        assigned: Callable[[Partitions], None],
        revoked: Callable[[Partitions], Awaitable[None]],
    ) -> None:
        """Join; call ``assigned`` with this worker's partitions (and ``revoked`` before
        any of them moves to another worker)."""

    async def stop(self) -> None:
        """Leave: every held partition is revoked first."""

    @property
    def settled(self) -> bool:
        """True when this worker holds exactly what the assignment gives it."""
        ...
