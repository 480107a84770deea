"""What a transport implements for the engine, in one place.

Kafka, RabbitMQ, the event store alone and the in-memory broker each give the partition
task (:mod:`streamapp.engine.task`) these, and the task holds everything else:

- :class:`PartitionPort`: one source partition (pause, resume, rewind, settle, where to
  begin), with :class:`Committed`, what a settle left at the source;
- :class:`Transaction`: batches made durable atomically, where the broker has them;
- :class:`Sink`: a confirmed publisher, the one way out (derived events, parked and
  retried copies, forwarded events); :data:`Publish` is its ``publish_many``;
- :class:`~streamapp.engine.assignment.LiveSource` (beside the
  :class:`~streamapp.engine.assignment.Assignment` it fills, which holds the tasks):
  what the worker starts, waits on and stops;
- :class:`Directory`: where another worker's views answer;
- :class:`TaskMetrics`, :class:`SinkMetrics`, :class:`RelayGauges`: what they report.

The records they carry, an incoming :class:`~streamapp.records.Delivery` and an outgoing
:class:`~streamapp.records.Message`, are in :mod:`streamapp.records`. A publish returns
only once the broker confirmed it, else raises :class:`streamapp.errors.PublishError`
(outcome unknown: publish again).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from ..agents.agent import Agent
from ..failures.outcomes import Outcome
from ..records import Message, Receipt
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
    """One partition task's batches made durable atomically (Kafka: its share of the
    worker's transaction of a poll cycle, which may hold other partitions' batches).

    A commit holds every agent's changelog records (its tables' changes and checkpoint),
    every derived event sent, and a source position: all visible to ``read_committed``
    readers, or none. The position is committed with the source's own check of the
    worker's ownership (Kafka: the group's generation), which fences a zombie.
    """

    async def open(self) -> None:
        """Make the partition's commits possible (Kafka: the worker's writer started,
        which ends its own previous life's open transaction)."""

    async def restore(self, agent: Agent, tables: PartitionTables) -> int:
        """Bring ``agent``'s ``tables`` up to its changelog; the records restored."""
        ...

    async def commit(
        self,
        changes: Sequence[tuple[Agent, BatchChanges]],
        outputs: Sequence[Message],
        settle: Committed | None,
    ) -> list[int]:
        """Commit atomically, ``settle`` with it; returns, per entry of ``changes``, the
        next changelog position of its agent. Raises FencedError when another worker
        took over, and whatever failed the transaction, which fails every partition of
        it (each rewinds)."""
        ...

    async def reset(self) -> None:
        """After a failed commit: make the next commit possible (a fresh writer)."""

    async def close(self) -> None: ...


class Sink(Protocol):
    """A confirmed publisher."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> None:
        """Publish one message and wait for the broker's confirmation."""
        ...

    async def publish_many(self, messages: Sequence[Message]) -> list[Receipt]:
        """Publish all, many in flight at once, in order per key; return once every one
        is confirmed (receipts in the order of ``messages``)."""
        ...


Publish = Callable[[Sequence[Message]], Awaitable[Sequence[Receipt]]]
"""A :class:`Sink`'s ``publish_many``: how a commit without a transaction sends its
derived events (returns once the broker confirmed every one)."""


class Directory(Protocol):
    def owner_url(self, topic: str, partition: int) -> str | None:
        """The base URL of the views of ``topic[partition]``'s owner, a current member of
        the group by the transport's own rule (Kafka: a claim of this worker's group
        generation; RabbitMQ: heartbeats on this worker's monotonic clock), never by
        comparing wall clocks. None while it is unknown: views answer 503 + Retry-After."""
        ...


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

    def hop(self, agent: str, kind: str, hop: int, n: int) -> None:
        """``n`` committed chain copies of ``kind`` carrying ``x-retry-hop`` = ``hop``."""

    def restored(self, agent: str, records: int) -> None:
        """Changelog records restored into a partition's store."""

    def replayed(self, agent: str, records: int) -> None:
        """Event-store events replayed into a partition's tables (catch-up)."""

    def unversioned(self, agent: str, records: int) -> None:
        """Events applied without ``streamversion`` (no duplicate check: at-least-once)."""


PUBLISH_OUTCOMES = ("failed", "returned", "nacked", "timed_out")
"""Why a sink's publish was not confirmed: ``returned`` (RabbitMQ: unroutable, no queue
bound), ``nacked`` (RabbitMQ: the broker refused it), ``timed_out`` (no confirm within
``publish_timeout_s``: outcome unknown), ``failed`` (anything else, e.g. a missing topic)."""


class SinkMetrics(Protocol):
    """What a sink reports: publishes the broker did not confirm, per destination."""

    def publish_failed(self, sink: str, destination: str, outcome: str, n: int = 1) -> None:
        """``n`` messages to ``destination`` (a Kafka topic, a RabbitMQ exchange) of sink
        kind ``sink`` (``kafka``, ``rabbitmq``) were not confirmed, for ``outcome`` (one of
        :data:`PUBLISH_OUTCOMES`)."""


class RelayGauges(Protocol):
    """What a relay shows at a scrape (read, never pushed)."""

    @property
    def held_copies(self) -> int:
        """Copies received and waiting for their ``x-deliver-at`` (not republished yet)."""
        ...

    def lag(self) -> dict[tuple[str, int], int]:
        """Copies in each retry or delay topic partition not republished yet, where the
        relay knows it (Kafka: end of the partition minus the next copy to relay)."""
        ...
