"""Prometheus metrics of one worker, in a registry of its own (never the global one).

:class:`WorkerMetrics` is the :class:`~streamapp.engine.metrics.TaskMetrics` the worker
passes to its partition tasks (counters and histograms, updated as tasks work); at
scrape time it also reads the worker's :class:`~streamapp.engine.assignment.Assignment`
for what is cheap to know then: phases, lag, table sizes (estimates on RocksDB).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..engine.assignment import Assignment
from ..engine.phase import Phase
from ..outcomes import Outcome
from ..tables.memory import RocksMemory

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SIZES = (1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10_000)
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WorkerMetrics:
    """Counters and histograms of a worker's partition tasks, and scrape-time gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter(
            "streamapp_events",
            "Deliveries handled, by agent and outcome (live and replayed).",
            ["agent", "outcome"],
            registry=r,
        )
        self.failures = Counter(
            "streamapp_handler_failures",
            "Deliveries whose handler raised.",
            ["agent"],
            registry=r,
        )
        self.parks = Counter(
            "streamapp_parked", "Failed deliveries parked (confirmed).", ["agent"], registry=r
        )
        self.redeliveries = Counter(
            "streamapp_redeliveries",
            "Times a partition stopped at a failure to deliver it again.",
            ["agent"],
            registry=r,
        )
        self.consumed = Counter(
            "streamapp_consumed",
            "Deliveries run through an agent (a redelivery counts again).",
            ["agent"],
            registry=r,
        )
        self.failed_attempts_total = Counter(
            "streamapp_failed_attempts",
            "Attempts that failed (handler raised, or not decodable), inline retries included.",
            ["agent"],
            registry=r,
        )
        self.retried = Counter(
            "streamapp_retried",
            "Failed deliveries copied to the retry topic (Retry policy; committed).",
            ["agent"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "streamapp_dead_lettered",
            "Failed deliveries copied to the dead-letter topic (Retry policy; committed).",
            ["agent"],
            registry=r,
        )
        self.restored_records = Counter(
            "streamapp_restored_records",
            "Changelog records restored into table stores.",
            ["agent"],
            registry=r,
        )
        self.replayed_records = Counter(
            "streamapp_replayed_records",
            "Event-store events replayed into tables (catch-up).",
            ["agent"],
            registry=r,
        )
        self.unversioned_events = Counter(
            "streamapp_unversioned_events",
            "Events applied to tables without streamversion: no duplicate check, so a "
            "redelivery applies them again (at-least-once).",
            ["agent"],
            registry=r,
        )
        self.batch_size = Histogram(
            "streamapp_batch_size", "Deliveries per batch.", ["agent"], buckets=_SIZES, registry=r
        )
        self.batch_duration = Histogram(
            "streamapp_batch_duration_seconds",
            "Time to run a batch through the agent (commit excluded).",
            ["agent"],
            buckets=_SECONDS,
            registry=r,
        )
        self.commit_duration = Histogram(
            "streamapp_commit_duration_seconds",
            "Time to commit a batch: changelog, store, then settle at the source.",
            ["agent"],
            buckets=_SECONDS,
            registry=r,
        )

    def watch(self, assignment: Assignment) -> None:
        """Report ``assignment``'s partitions (phase, lag, table sizes) at each scrape."""
        self.registry.register(_AssignmentCollector(assignment))

    def watch_memory(self, memory: RocksMemory) -> None:
        """Report the worker's RocksDB memory (setting ``memory_limit_mb``) at each scrape."""
        self.registry.register(_MemoryCollector(memory))

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    # TaskMetrics ---------------------------------------------------------------------
    def batch(
        self, agent: str, size: int, duration_s: float, outcomes: Mapping[Outcome, int]
    ) -> None:
        for outcome, n in outcomes.items():
            self.events.labels(agent, outcome.value).inc(n)
        failed = outcomes.get(Outcome.FAILED)
        if failed:
            self.failures.labels(agent).inc(failed)
        self.consumed.labels(agent).inc(size)
        self.batch_size.labels(agent).observe(size)
        self.batch_duration.labels(agent).observe(duration_s)

    def commit(self, agent: str, duration_s: float) -> None:
        self.commit_duration.labels(agent).observe(duration_s)

    def parked(self, agent: str) -> None:
        self.parks.labels(agent).inc()

    def redelivery(self, agent: str) -> None:
        self.redeliveries.labels(agent).inc()

    def failed_attempts(self, agent: str, n: int) -> None:
        self.failed_attempts_total.labels(agent).inc(n)

    def chained(self, agent: str, kind: str, n: int) -> None:
        (self.retried if kind == "retried" else self.dead_lettered).labels(agent).inc(n)

    def restored(self, agent: str, records: int) -> None:
        self.restored_records.labels(agent).inc(records)

    def replayed(self, agent: str, records: int) -> None:
        self.replayed_records.labels(agent).inc(records)

    def unversioned(self, agent: str, records: int) -> None:
        self.unversioned_events.labels(agent).inc(records)


class _AssignmentCollector(Collector):
    """Gauges read from the assignment when scraped (nothing cached, nothing private)."""

    def __init__(self, assignment: Assignment) -> None:
        self.assignment = assignment

    def describe(self) -> list[Metric]:
        return []  # not known before a scrape: keeps auto_describe from collecting

    def collect(self) -> Iterator[Metric]:
        assignment = self.assignment
        ready = GaugeMetricFamily(
            "streamapp_ready", "1 when every assigned partition is live and no rebalance runs."
        )
        ready.add_metric([], 1.0 if assignment.ready else 0.0)
        yield ready
        phases = GaugeMetricFamily(
            "streamapp_partitions", "Assigned partitions by phase.", labels=["phase"]
        )
        counts = {phase.value: 0 for phase in Phase}
        lag = GaugeMetricFamily(
            "streamapp_partition_lag",
            "Deliveries of a live partition not committed yet (where the transport knows).",
            labels=["topic", "partition"],
        )
        sizes = GaugeMetricFamily(
            "streamapp_table_keys",
            "Keys in a table partition (an estimate on RocksDB).",
            labels=["table", "partition"],
        )
        for (topic, partition), task in sorted(assignment.tasks.items()):
            counts[task.phase.value] += 1
            task_lag = task.lag
            if task_lag is not None:
                lag.add_metric([topic, str(partition)], float(task_lag))
            for table, keys in task.table_sizes().items():
                sizes.add_metric([table, str(partition)], float(keys))
        for phase, n in counts.items():
            phases.add_metric([phase], float(n))
        yield phases
        yield lag
        yield sizes


class _MemoryCollector(Collector):
    """The shared block cache and memtables of every partition store, read when scraped."""

    def __init__(self, memory: RocksMemory) -> None:
        self.memory = memory

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "streamapp_rocksdb_memory_bytes",
            "RocksDB memory of all partition stores: limit (memory_limit_mb), cache (block "
            "cache, memtable reservations included), memtables.",
            labels=["part"],
        )
        for part, value in self.memory.usage().items():
            gauge.add_metric([part], float(value))
        yield gauge
