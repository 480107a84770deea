"""Lanes: the agents of one topic inside one partition task.

Several agents may consume one topic. A worker has one consumer for it, and one
:class:`~streamapp.engine.task.PartitionTask` per partition runs every agent of the
topic over each delivery, in registration order; each agent is a :class:`Lane` there:

- **Own state, own outcome.** A lane has its own tables (store, checkpoint, changelog),
  its own sends, its own outcome per delivery and its own failure policy. ``Park``
  parks the delivery for that agent only (the copy names the agent); the other lanes'
  outcomes for it stand.
- **Own position.** A lane's position is the next delivery it needs. The source is
  settled only below the lowest one, so a delivery is settled once every agent settled
  it; a lane skips the deliveries below its own position (after a rewind or a restart),
  so a delivery one agent failed is never run again through the others.
- **Durable positions.** A lane with tables keeps its position in its checkpoint; the
  positions of lanes ahead of the settled one travel with it (Kafka: in the committed
  offset's metadata, in the same transaction), so a restart does not run a delivery
  twice through a lane that had settled it either.

A batch runs through a task's lanes in :mod:`~streamapp.engine.run`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ..agents.agent import Agent, Runner
from ..agents.outputs import Encoder, Outbox, Send
from ..failures.outcomes import Outcome, Retry
from ..tables.partition import PartitionTables
from ..tracing import LaneTrace
from .attempts import Attempts
from .blocking import HandlerThread
from .delivery import Parker
from .interfaces import TaskMetrics
from .phase import Phase, check_transition


class Lane:
    """One agent's share of a partition task: tables, sends, attempts and positions."""

    def __init__(
        self, agent: Agent, park: Parker, attempts: Attempts, encode: Encoder | None
    ) -> None:
        self.agent, self.park, self.attempts = agent, park, attempts
        self.tables: PartitionTables | None = None
        self.views: list[Any] = []
        """The handler's table parameters (own views and read views), in its order."""
        self.outbox: Outbox | None = None
        self.send: Send | None = None
        if agent.sinks and encode is not None:
            self.outbox = Outbox()
            self.send = Send(agent.name, agent.sinks, encode, self.outbox, agent.events)
        if isinstance(agent.on_failure, Retry) and self.outbox is None:
            self.outbox = Outbox()  # the chain's copies commit with the batch
        self.stop = asyncio.Event()
        """Set when the task closes: ends an inline retry's wait at once."""
        self.waits = True
        """Wait the inline retries' intervals (the memory broker retries at once)."""
        self.clock: Callable[[], float] = time.time
        """Seconds since the epoch: when a retry copy is due."""
        self.copies: dict[str, int] = {}
        self.hops: dict[tuple[str, int], int] = {}
        """Chain copies of the open batch by (kind, ``x-retry-hop``), counted at commit."""
        """Chain copies in the open batch, by kind (counted once committed)."""
        self.chain_totals: dict[str, int] = {}
        """Chain copies committed so far, by kind (``retried``, ``dead_lettered``)."""
        self.next: int | None = None
        """The next live position this lane needs, batch in hand included."""
        self.committed: int | None = None
        """The next live position this lane needs, as durable (where a failed commit
        puts ``next`` back)."""
        self.history_next = 1
        """The next event-store position known done here beyond the checkpoint's (chunks
        with nothing for the partition; a lane without tables)."""
        self.tracks = False
        """Live deliveries advance the checkpoint's store position (RabbitMQ)."""
        self.replays = agent.history is not None
        """Its tables are built from the event store: its agent declares a history, or
        the store is the only source (``STREAMAPP_BROKER=none``, set by the factory)."""
        self.outcomes: dict[Outcome, int] = {}
        self.replayed = 0
        """Stored events this lane settled in replays (its catch-ups and builds)."""
        self.building = False
        """Catching up from its history on its own while the task's other lanes are live
        (:mod:`streamapp.engine.lane_build`): live runs skip it, the source settles without it."""
        self._phase = Phase.RESTORING
        self.unversioned = 0
        """Events applied to its tables without ``streamversion`` (at least once)."""
        self.thread = HandlerThread(f"agent {agent.name!r}") if agent.blocking else None
        """Where a blocking agent's handler runs (``blocking=True``)."""
        self.run: Runner | None = self.thread.run if self.thread is not None else None
        self.trace: LaneTrace | None = None
        """Its spans, when tracing is on (set by the factory): one per delivery handled."""

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def phase(self) -> Phase:
        """The lane's own phase: its task's, but ``catching_up`` while it builds beside
        live lanes. Changed by the task alone (its :class:`~.phase.PhaseMachine`)."""
        return self._phase

    def move_to(self, phase: Phase, *, of: str) -> None:
        """Move the lane to ``phase`` as :data:`~.phase.TRANSITIONS` allows (else
        PhaseTransitionError naming task ``of``); its task's phase machine alone calls it."""
        check_transition(f"{of} of agent {self.name}", self._phase, phase)
        self._phase = phase

    def configure(
        self, stop: asyncio.Event, *, waits: bool, clock: Callable[[], float], delayed: str
    ) -> None:
        """What the task decides: its close event, waits, clock, the delayed policy."""
        self.stop, self.waits, self.clock = stop, waits, clock
        if self.send is not None:
            self.send.delayed_policy, self.send.clock = delayed, clock

    def history_position(self) -> int:
        """The next event-store position this lane needs (1: nothing replayed)."""
        tables = self.tables
        if tables is None:
            return self.history_next
        return max(tables.checkpoint.history or 1, self.history_next)

    def drop(self) -> None:
        """Forget the batch in hand (a failed commit): back to the durable position."""
        if self.tables is not None:
            self.tables.drop_batch()
        if self.outbox is not None:
            self.outbox.drop()
        self.copies = {}
        self.hops = {}
        self.next = self.committed

    def release(self) -> None:
        """The task closes its stores: a blocking handler's thread ends (after the call
        in hand, if a stop gave up on it); a later call starts another."""
        if self.thread is not None:
            self.thread.abandon()

    def copies_committed(self, metrics: TaskMetrics) -> None:
        """The open batch committed: count its chain copies."""
        for kind, n in self.copies.items():
            self.chain_totals[kind] = self.chain_totals.get(kind, 0) + n
            metrics.chained(self.name, kind, n)
        for (kind, hop), n in self.hops.items():
            metrics.hop(self.name, kind, hop, n)
        self.copies = {}
        self.hops = {}
