"""Makes the partition tasks of one source (Kafka Streams' ``ActiveTaskCreator``).

A source builds one :class:`TaskFactory` with what all its tasks share (settings,
codec, parking, the event-store feed, metrics, where reads of other partitions go, who
is told of a fatal stop) and asks it for a task per partition it takes, adding only
that partition's own parts (its port, stores, transaction). The agents of a topic are
checked once (:func:`~streamapp.engine.task_config.check_agents`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import tracing
from ..agents.agent import Agent
from ..agents.outputs import Encoder
from ..codecs import plain
from ..errors import TableUnavailableError
from ..tables.reads import Locator
from ..tables.store import Store
from ..tables.table import Table
from ..topics import TopicSpec
from ..tracing import Tracer
from .attempts import Attempts
from .delivery import Decoder, Parker
from .interfaces import PartitionPort, Publish, TaskMetrics, Transaction
from .lane import Lane
from .metrics import NO_METRICS
from .state import StoreOpener
from .task import PartitionTask
from .task_config import TaskConfig, check_agents
from .task_surface import HistoryFeed

ParkerFor = Callable[[Agent, str], Parker]
"""The Parker of an agent in the partition of this name."""
Fatal = Callable[[BaseException], None]
"""Told when a partition cannot go on in this worker (an agent refused, a store behind
its changelog, a store or an app that cannot open): the source fails, the worker stops
and leaves, and another worker takes the partition over from its last commit."""


def _unplugged(table: Table[Any], partition: int) -> Store:
    raise TableUnavailableError(f"table {table.label!r}: this transport serves no table reads")


@dataclass(frozen=True, slots=True)
class TaskFactory:
    """What every task of one source shares; :meth:`create` adds a partition's own."""

    config: TaskConfig
    decode: Decoder
    park: ParkerFor
    history: HistoryFeed | None = None
    metrics: TaskMetrics = NO_METRICS
    encode: Encoder | None = None
    publish: Publish | None = None
    """Where derived events go, confirmed, when the source has no transaction."""
    locate: Locator = _unplugged
    """Where a read of a table partition this task does not write is served."""
    on_fatal: Fatal | None = None
    decode_bytes: Decoder | None = None
    """The transport's decoder leaving JSON data as its bytes, for a topic whose every
    agent decodes data with its own models (``events=``): msgspec reads the bytes once,
    with no dict built between (None: the transport has none)."""
    tracer: Tracer | None = field(default_factory=tracing.active)
    """The process's tracer, asked once here (None: tracing off, nothing traced)."""
    _checked: set[tuple[str, bool]] = field(default_factory=set, compare=False, repr=False)

    def create(
        self,
        agents: Agent | Sequence[Agent],
        partition: int,
        port: PartitionPort,
        *,
        name: str,
        open_store: StoreOpener | None = None,
        transaction: Transaction | None = None,
    ) -> PartitionTask:
        """The task of ``partition`` running ``agents`` (those of one topic)."""
        agents = [agents] if isinstance(agents, Agent) else list(agents)
        checked = (",".join(a.name for a in agents), transaction is not None)
        if checked not in self._checked:
            sends = transaction is not None or self.publish is not None
            check_agents(name, agents, sends=sends, encodes=self.encode is not None)
            self._checked.add(checked)
        return PartitionTask(
            agents, partition, port, name=name, factory=self, open_store=open_store,
            transaction=transaction,
        )  # fmt: skip

    def decode_for(self, topic: TopicSpec, agents: Sequence[Agent]) -> Decoder:
        """How the deliveries of ``topic`` become events for ``agents``: a plain topic's
        own decoder (:mod:`streamapp.codecs.plain`), else the transport's CloudEvents
        decoder, which leaves JSON data unparsed when every agent is typed."""
        if topic.plain:
            return plain.decoder(topic)
        if self.decode_bytes is not None and all(a.events is not None for a in agents):
            return self.decode_bytes
        return self.decode

    def lanes(self, agents: Sequence[Agent], name: str, closing: asyncio.Event) -> list[Lane]:
        """A lane per agent of the task of partition ``name`` (``closing``: its close)."""
        config, lanes = self.config, []
        trace = self.tracer.task(name) if self.tracer is not None else None
        for agent in agents:
            pause_s = config.first_pause_s(agent.on_failure)
            attempts = Attempts(pause_s, config.redeliver_backoff_max_s)
            lane = Lane(agent, self.park(agent, name), attempts, self.encode)
            lane.tracks = config.replay_on_open and agent.history is not None
            lane.replays = agent.history is not None or config.store_is_source
            lane.trace = trace.lane(agent.name) if trace is not None else None
            lane.configure(
                closing,
                waits=config.policy_pauses,
                clock=config.clock,
                delayed=config.delayed_policy,
            )
            lanes.append(lane)
        return lanes
