"""Prometheus metrics of one worker, in a registry of its own (never the global one).

:class:`WorkerMetrics` is the :class:`~streamapp.engine.metrics.TaskMetrics` the worker
passes to its partition tasks (counters and histograms, updated as tasks work); at
scrape time it also reads the worker's :class:`~streamapp.engine.assignment.Assignment`
for what is cheap to know then: phases, lag, table sizes (estimates on RocksDB).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..engine.assignment import Assignment
from ..engine.hold import held_counts
from ..engine.interfaces import RelayGauges
from ..engine.phase import Phase
from ..engine.stall import Stall
from ..failures.outcomes import Outcome
from ..tables.rocksdb.cache import RocksMemory

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SIZES = (1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10_000)
_STALL_SECONDS = (0.25, 0.5, 1, 2, 5, 10, 30, 60)
_HOPS = (1, 2, 3, 4, 5, 7, 10, 15, 20)
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
        self.verify_differences = Gauge(
            "streamapp_verify_last_differences",
            "Keys that differed or were missing on one side in the last `streamapp verify "
            "--report` of each table version (told to this worker).",
            ["table", "version"],
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

        self.loop_stalls = Counter(
            "streamapp_loop_stalls",
            "Times the event loop did not run for longer than loop_stall_warn_ms (a "
            "handler or other code blocked it), by the agent whose handler ran ('' none).",
            ["agent"],
            registry=r,
        )
        self.loop_stall_seconds = Histogram(
            "streamapp_loop_stall_seconds",
            "How long each such stall kept the event loop from running.",
            buckets=_STALL_SECONDS,
            registry=r,
        )
        self.last_stall: Stall | None = None
        """The last stall that ended (``/status``: ``last_loop_stall``)."""

        self.publish_failures = Counter(
            "streamapp_publish_failures",
            "Messages a sink published that the broker did not confirm, by sink kind "
            "(kafka, rabbitmq), destination (topic or exchange) and outcome (failed, "
            "returned, nacked, timed_out).",
            ["sink", "destination", "outcome"],
            registry=r,
        )
        self.sink_failures: dict[str, dict[str, dict[str, int]]] = {}
        """The same counts for ``/status``: sink kind -> destination -> outcome -> n."""
        self.retry_hops = Histogram(
            "streamapp_retry_hop",
            "x-retry-hop of the retry chain's committed copies, by agent and kind "
            "(retried: the hop the copy starts; dead_lettered: the hops it made).",
            ["agent", "kind"],
            buckets=_HOPS,
            registry=r,
        )
        self.hop_counts: dict[str, dict[str, dict[int, int]]] = {}
        """The same for ``/status``: agent -> kind -> hop -> copies."""
        self.relays: list[tuple[str, RelayGauges]] = []

    def watch(self, assignment: Assignment, ready: Callable[[], bool] | None = None) -> None:
        """Report ``assignment``'s partitions (phase, lag, table sizes) at each scrape;
        ``ready``: what ``/readyz`` answers (``streamapp_ready``), by default the
        assignment's own readiness (no stall or disk check)."""
        self.registry.register(_AssignmentCollector(assignment, ready))

    def watch_memory(self, memory: RocksMemory) -> None:
        """Report the worker's RocksDB memory (setting ``memory_limit_mb``) at each scrape."""
        self.registry.register(_MemoryCollector(memory))

    def watch_relay(self, kind: str, relay: RelayGauges) -> None:
        """Report ``relay``'s held copies and retry-topic lag at each scrape and in
        ``/status`` (``kind``: ``kafka`` or ``rabbitmq``)."""
        if not self.relays:
            self.registry.register(_RelayCollector(self.relays))
        self.relays.append((kind, relay))

    def relay_status(self) -> list[dict[str, object]]:
        """``/status`` ``relays``: each relay's held copies and lag per partition."""
        return [
            {
                "kind": kind,
                "held_copies": relay.held_copies,
                "lag": {f"{t}/{p}": n for (t, p), n in sorted(relay.lag().items())},
            }
            for kind, relay in self.relays
        ]

    def sink_status(self) -> dict[str, object]:
        """``/status`` ``sinks``: publishes not confirmed, per sink kind and destination."""
        return {
            kind: {dest: dict(counts) for dest, counts in sorted(by_dest.items())}
            for kind, by_dest in sorted(self.sink_failures.items())
        }

    def hop_status(self) -> dict[str, object]:
        """``/status`` ``retry_hops``: committed chain copies per agent, kind and hop."""
        return {
            agent: {kind: {str(h): n for h, n in sorted(hops.items())} for kind, hops in k.items()}
            for agent, k in sorted(self.hop_counts.items())
        }

    def operations(self) -> dict[str, object]:
        """The ``sinks``, ``relays`` and ``retry_hops`` sections of ``/status``."""
        return {
            "sinks": self.sink_status(),
            "relays": self.relay_status(),
            "retry_hops": self.hop_status(),
        }

    # SinkMetrics ---------------------------------------------------------------------
    def publish_failed(self, sink: str, destination: str, outcome: str, n: int = 1) -> None:
        if n <= 0:
            return
        self.publish_failures.labels(sink, destination, outcome).inc(n)
        counts = self.sink_failures.setdefault(sink, {}).setdefault(destination, {})
        counts[outcome] = counts.get(outcome, 0) + n

    def verified(self, table: str, version: int, differences: int) -> None:
        """``streamapp verify --report`` told this worker what it found."""
        self.verify_differences.labels(table, str(version)).set(differences)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def stalled(self, stall: Stall) -> None:
        """A stall of the event loop ended (:class:`~streamapp.engine.stall.StallWatch`)."""
        self.loop_stalls.labels(stall.agent or "").inc()
        self.loop_stall_seconds.observe(stall.seconds)
        self.last_stall = stall

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

    def hop(self, agent: str, kind: str, hop: int, n: int) -> None:
        histogram = self.retry_hops.labels(agent, kind)
        for _ in range(n):
            histogram.observe(hop)
        hops = self.hop_counts.setdefault(agent, {}).setdefault(kind, {})
        hops[hop] = hops.get(hop, 0) + n

    def restored(self, agent: str, records: int) -> None:
        self.restored_records.labels(agent).inc(records)

    def replayed(self, agent: str, records: int) -> None:
        self.replayed_records.labels(agent).inc(records)

    def unversioned(self, agent: str, records: int) -> None:
        self.unversioned_events.labels(agent).inc(records)


class _AssignmentCollector(Collector):
    """Gauges read from the assignment when scraped (nothing cached, nothing private)."""

    def __init__(self, assignment: Assignment, ready: Callable[[], bool] | None) -> None:
        self.assignment = assignment
        self.ready = ready

    def describe(self) -> list[Metric]:
        return []  # not known before a scrape: keeps auto_describe from collecting

    def collect(self) -> Iterator[Metric]:
        assignment = self.assignment
        ready = GaugeMetricFamily(
            "streamapp_ready",
            "1 when /readyz answers 200 (the worker's readiness, its reasons there).",
        )
        is_ready = self.ready() if self.ready is not None else assignment.ready
        ready.add_metric([], 1.0 if is_ready else 0.0)
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
        seconds = GaugeMetricFamily(
            "streamapp_lag_seconds",
            "Age of the oldest event of a live partition an agent has not applied, from its "
            "record timestamp (0 when caught up; docs/operations.md).",
            labels=["agent", "partition"],
        )
        held: dict[str, tuple[int, int]] = {}
        for (topic, partition), task in sorted(assignment.tasks.items()):
            for agent, age in assignment.lag_seconds((topic, partition), task).items():
                if agent:
                    seconds.add_metric([agent, str(partition)], age)
            for agent, (streams, events) in held_counts(task.lanes).items():
                s, e = held.get(agent, (0, 0))
                held[agent] = (s + streams, e + events)
            counts[task.phase.value] += 1
            task_lag = task.lag
            if task_lag is not None:
                lag.add_metric([topic, str(partition)], float(task_lag))
            for table, keys in task.state.table_sizes().items():
                sizes.add_metric([table, str(partition)], float(keys))
        for phase, n in counts.items():
            phases.add_metric([phase], float(n))
        yield phases
        stalled = GaugeMetricFamily(
            "streamapp_stalled_partitions",
            "Live partitions with events to apply that applied none for stall_after_s (a "
            "Redeliver backoff excluded), or on RabbitMQ get none (the broker gives the "
            "queue to another consumer).",
        )
        stalled.add_metric([], float(assignment.stalled_count()))
        yield stalled
        yield lag
        yield seconds
        yield sizes
        yield from _held_gauges(held)


def _held_gauges(held: dict[str, tuple[int, int]]) -> Iterator[Metric]:
    """``streamapp_held_streams`` and ``streamapp_held_events`` per agent that holds."""
    streams = GaugeMetricFamily(
        "streamapp_held_streams",
        'Streams held by an agent of Park(destination, hold="stream") here, waiting for a '
        "release (streamapp parked replay).",
        labels=["agent"],
    )
    events = GaugeMetricFamily(
        "streamapp_held_events",
        "Events parked in held streams here (the failed ones included).",
        labels=["agent"],
    )
    for agent, (n, m) in sorted(held.items()):
        streams.add_metric([agent], float(n))
        events.add_metric([agent], float(m))
    yield streams
    yield events


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


class _RelayCollector(Collector):
    """The relays' held copies and retry-topic lag, read when scraped."""

    def __init__(self, relays: list[tuple[str, RelayGauges]]) -> None:
        self.relays = relays

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            "streamapp_relay_held_copies",
            "Retry and delay copies a relay holds, waiting for their x-deliver-at.",
            labels=["relay"],
        )
        lag = GaugeMetricFamily(
            "streamapp_relay_lag",
            "Copies in a retry or delay topic partition not republished yet (Kafka).",
            labels=["topic", "partition"],
        )
        for kind, relay in self.relays:
            held.add_metric([kind], float(relay.held_copies))
            for (topic, partition), n in sorted(relay.lag().items()):
                lag.add_metric([topic, str(partition)], float(n))
        yield held
        yield lag
