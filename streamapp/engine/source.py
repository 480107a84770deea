"""The shape every transport's source has, as the worker drives it."""

from __future__ import annotations

from typing import Protocol

from .assignment import Assignment


class LiveSource(Protocol):
    """Feeds the app's agents: Kafka, RabbitMQ, or the event store alone."""

    assignment: Assignment
    """The partitions this worker owns now (views and status read it)."""

    async def start(self) -> None:
        """Connect, check that what the app needs exists, begin delivering."""

    async def stop(self) -> None:
        """Finish batches in hand, commit, close stores, disconnect."""

    async def wait(self) -> None:
        """Until the source ends; raises when it failed for good."""
