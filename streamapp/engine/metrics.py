"""Metrics that go nowhere: the null implementations of the engine's metrics ports.

The protocols (:class:`~streamapp.engine.interfaces.TaskMetrics`,
:class:`~streamapp.engine.interfaces.SinkMetrics`) are in
:mod:`streamapp.engine.interfaces`; the worker passes in an implementation (Prometheus,
:mod:`streamapp.web.metrics`), and everything else gets these. The engine knows no
metrics library.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..failures.outcomes import Outcome
from .interfaces import SinkMetrics, TaskMetrics


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

    def hop(self, agent: str, kind: str, hop: int, n: int) -> None:
        pass

    def restored(self, agent: str, records: int) -> None:
        pass

    def replayed(self, agent: str, records: int) -> None:
        pass

    def unversioned(self, agent: str, records: int) -> None:
        pass


NO_METRICS: TaskMetrics = _NoMetrics()
"""Metrics that go nowhere (the in-memory broker, tests)."""


class _NoSinkMetrics:
    def publish_failed(self, sink: str, destination: str, outcome: str, n: int = 1) -> None:
        pass


NO_SINK_METRICS: SinkMetrics = _NoSinkMetrics()
"""Sink metrics that go nowhere (command-line tools, tests)."""
