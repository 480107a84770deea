"""What the partition task reports as it works: a small metrics port.

The task calls these after each batch, commit, park, redelivery, restore and replay;
the worker passes in an implementation (Prometheus, :mod:`streamapp.web.metrics`), and
everything else gets :data:`NO_METRICS`. The engine knows no metrics library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..outcomes import Outcome


class TaskMetrics(Protocol):
    """Counts and timings of partition tasks, labelled by agent."""

    def batch(
        self, agent: str, size: int, duration_s: float, outcomes: Mapping[Outcome, int]
    ) -> None:
        """A batch of ``size`` deliveries ran through ``agent`` (live or replayed)."""

    def commit(self, agent: str, duration_s: float) -> None:
        """A batch became durable (changelog, store) and was settled at the source."""

    def parked(self, agent: str) -> None:
        """A failed delivery was parked (the park was confirmed)."""

    def redelivery(self, agent: str) -> None:
        """A partition stopped at a failure and rewinds to deliver it again."""

    def failed_attempts(self, agent: str, n: int) -> None:
        """Attempts that failed (handler raised, or not decodable), inline retries included."""

    def chained(self, agent: str, kind: str, n: int) -> None:
        """Copies of the retry chain committed: ``retried`` or ``dead_lettered``."""

    def restored(self, agent: str, records: int) -> None:
        """Changelog records restored into a partition's store."""

    def replayed(self, agent: str, records: int) -> None:
        """Event-store events replayed into a partition's tables (catch-up)."""

    def unversioned(self, agent: str, records: int) -> None:
        """Events applied without ``streamversion`` (no duplicate check: at-least-once)."""


class _NoMetrics:
    def batch(
        self, agent: str, size: int, duration_s: float, outcomes: Mapping[Outcome, int]
    ) -> None:
        pass

    def commit(self, agent: str, duration_s: float) -> None:
        pass

    def parked(self, agent: str) -> None:
        pass

    def redelivery(self, agent: str) -> None:
        pass

    def failed_attempts(self, agent: str, n: int) -> None:
        pass

    def chained(self, agent: str, kind: str, n: int) -> None:
        pass

    def restored(self, agent: str, records: int) -> None:
        pass

    def replayed(self, agent: str, records: int) -> None:
        pass

    def unversioned(self, agent: str, records: int) -> None:
        pass


NO_METRICS: TaskMetrics = _NoMetrics()
"""Metrics that go nowhere (the in-memory broker, tests)."""
