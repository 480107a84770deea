"""Attempts of the delivery a partition is stuck at: the bound and back-off of Redeliver.

A partition handles its deliveries in order, so at most one of them is failing at a time:
the one at the position where the last batch stopped. The task counts its failed
attempts here (per delivery position, in memory: a partition that moves or restarts
counts again, and so does a RabbitMQ delivery renumbered by a reconnect), forgets them
once the delivery settles, and asks for the pause before the next attempt: the first
pause, doubled per failure up to the cap.
"""

from __future__ import annotations

from ..records import Delivery
from .backoff import doubled


class Attempts:
    """Failed attempts of one partition's failing delivery (see the module docstring)."""

    def __init__(self, first_pause_s: float, max_pause_s: float) -> None:
        self.first_pause_s, self.max_pause_s = first_pause_s, max_pause_s
        self.position: int | None = None
        """Where the failing delivery stands (None: nothing is failing)."""
        self.failed = 0
        """Its failed attempts so far."""
        self.last_error = ""
        """Why its last attempt failed."""

    def before(self, delivery: Delivery) -> int:
        """Failed attempts of ``delivery`` before this one (0: its first attempt)."""
        return self.failed if delivery.position == self.position else 0

    def failed_at(self, position: int, error: str) -> int:
        """Count a failed attempt of the delivery at ``position``; returns its count."""
        if position != self.position:
            self.position, self.failed = position, 0
        self.failed += 1
        self.last_error = error
        return self.failed

    def settled(self, below: int) -> None:
        """Deliveries before ``below`` are settled: the count of one of them is done."""
        if self.position is not None and self.position < below:
            self.position, self.failed, self.last_error = None, 0, ""

    def pause_s(self) -> float:
        """The pause before the next attempt of the failing delivery."""
        return doubled(self.first_pause_s, self.max_pause_s, self.failed)
