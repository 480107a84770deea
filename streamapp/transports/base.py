"""The transports a worker runs on, one object per broker: ``transports[settings.broker]``.

Each transport module (``kafka``, ``rabbitmq``, the event store alone for
``STREAMAPP_BROKER=none``) exports one :class:`Transport`: its :class:`Capabilities`
and its factories (sink, source, topology check and create, relay, views directory,
forwarder sink, reset probe). The registry imports a transport's module only when it is
picked, so a Kafka worker never imports aio-pika. ``worker``, ``cli`` and ``reset`` ask
capabilities and call factories; no other module compares the broker's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..engine.interfaces import RelayGauges, SinkMetrics, TaskMetrics
from ..errors import ConfigError
from ..failures.outcomes import Retry
from ..versions.ledger import StoreLedger

if TYPE_CHECKING:
    from ..app import App
    from ..catchup.feed import StoreFeed
    from ..catchup.forwarder import Encoder
    from ..engine.assignment import LiveSource
    from ..engine.interfaces import Sink
    from ..eventstore.base import EventStoreBackend
    from ..failures.republish import HeldReader, Offsets
    from ..settings.settings import Settings
    from ..topics import TopicPlan
    from ..versions.ledger import LedgerBackend


@dataclass(frozen=True)
class Capabilities:
    """What a transport can run; an agent that needs more is refused at start."""

    retry_chain: bool
    """``on_failure=Retry(...)``: retry and dead-letter topics, and a relay."""
    sends: bool
    """Agents with ``sinks=[...]``: a broker to send derived events to."""
    group_by_refused: str | None
    """Why a re-keyed agent (``group_by=``) cannot run here; None: it can."""
    changelog: bool
    """Tables restore from a changelog topic (else from the event-store replay)."""
    topics: bool
    """It has topics for ``streamapp topics create`` to make."""
    group: bool
    """Workers form a group (a stop leaves it)."""
    embedded: bool
    """The event store is the only source (one worker owns every partition)."""
    keeps_consumed: bool
    """A consumed message can be read again (tables rebuild from the topic)."""


def refuse_unsupported(app: App, broker: str, capabilities: Capabilities) -> None:
    """ConfigError naming the first agent that needs what ``capabilities`` lack: a
    re-keyed agent, then the retry chain, then derived events. Run once per start."""
    for agent in app.agents.values():
        if agent.group_by is not None and capabilities.group_by_refused is not None:
            raise ConfigError(
                f"agent {agent.name!r} consumes {agent.group_by.source.name!r} re-keyed "
                f"(group_by=...), which setting broker (STREAMAPP_BROKER) = {broker!r} does "
                f"not support: {capabilities.group_by_refused}"
            )
    for agent in app.agents.values():
        if isinstance(agent.on_failure, Retry) and not capabilities.retry_chain:
            raise ConfigError(
                f"agent {agent.name!r} (topic {agent.topic.name!r}) uses "
                f"on_failure=Retry(...), but setting broker (STREAMAPP_BROKER) = {broker!r} "
                "has no retry chain (it runs on kafka, rabbitmq and the memory broker): use "
                "Park(destination) or Redeliver(max_attempts=..., fallback=Park(...)) there"
            )
    for agent in app.agents.values():
        if agent.sinks and not capabilities.sends:
            raise ConfigError(
                f"agent {agent.name!r} sends derived events to "
                f"{[t.name for t in agent.sinks]}, but setting broker "
                f"(STREAMAPP_BROKER) = {broker!r} has no broker to send them to: run the app "
                "on kafka or rabbitmq"
            )


def refuse_standbys(settings: Settings, capabilities: Capabilities) -> None:
    """ConfigError when setting ``standby_replicas`` asks for standbys of a transport
    whose tables have no changelog for them to follow."""
    if settings.standby_replicas and not capabilities.changelog:
        raise ConfigError(
            f"setting standby_replicas (STREAMAPP_STANDBY_REPLICAS) = "
            f"{settings.standby_replicas}, but setting broker (STREAMAPP_BROKER) = "
            f"{settings.broker!r} keeps no changelog for standbys to follow (a partition "
            "that moves replays the event store): set it to 0, or run the app on kafka"
        )


class TransportMetrics(TaskMetrics, SinkMetrics, Protocol):
    """What a worker's sources and sinks report to."""


@dataclass(frozen=True)
class WorkerContext:
    """What a worker gives its transport's factories."""

    app: App
    settings: Settings
    app_ref: str
    member_id: str
    metrics: TransportMetrics
    views_url: Callable[[], str]


class MembersDirectory(Protocol):
    """Where workers say which partitions they own (views forward through it)."""

    async def start(self, url: str) -> bool: ...

    async def stop(self) -> None: ...


class Relay(RelayGauges, Protocol):
    """Republishes due retry and delay copies."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait(self) -> None: ...


@dataclass(frozen=True)
class TopologyRow:
    """One line of ``streamapp topics create``: a name, what it is, whether it was made."""

    name: str
    what: str
    created: bool


class Transport(Protocol):
    """One broker, as the worker, the command line and the reset use it."""

    name: str
    """The value of setting broker (``STREAMAPP_BROKER``)."""
    title: str
    """How messages name it (``RabbitMQ``)."""
    capabilities: Capabilities
    changelog_note: str
    """What a reset plan says of an agent without a changelog here ('' : nothing)."""

    def describe(self, settings: Settings) -> str:
        """What a worker runs on, for its start line (no URL: it may hold a password)."""

    def make_sink(self, app: App, settings: Settings, metrics: SinkMetrics) -> Sink | None:
        """The sink, not yet connected (None: no broker)."""

    async def connect_sink(self, settings: Settings, sink: Sink) -> None:
        """Connect ``sink`` (with start-up retries): the first broker contact."""

    async def check_topology(self, app: App, settings: Settings, app_ref: str) -> None:
        """MissingTopicError naming what the app needs and the broker lacks."""

    async def create_topology(self, app: App, settings: Settings) -> list[TopologyRow]:
        """Make what is missing; one row for each thing the app needs."""

    def open_source(
        self,
        ctx: WorkerContext,
        sink: Sink | None,
        feed: StoreFeed | None,
        store: EventStoreBackend | None,
    ) -> LiveSource:
        """The worker's source (``feed``: the event-store replay, when it is read)."""

    def make_directory(
        self, ctx: WorkerContext, source: LiveSource, sink: Sink | None
    ) -> MembersDirectory | None:
        """The views directory, when it is not the source's own membership."""

    def make_relay(
        self, ctx: WorkerContext, sink: Sink | None, relayed: list[TopicPlan]
    ) -> Relay | None:
        """The relay of ``relayed`` retry and delay topics (None: none here)."""

    def forward_sink(
        self, app: App, settings: Settings
    ) -> tuple[Callable[[], Sink], Encoder] | None:
        """The forwarder's sink factory and wire encoder (None: no broker)."""

    async def running_workers(self, app: App, settings: Settings) -> list[str]:
        """The app's workers this broker sees running, one line each (reset refuses)."""

    async def recreate_changelogs(
        self, settings: Settings, topics: list[TopicPlan]
    ) -> dict[str, bool]:
        """Delete ``topics`` and make them again empty; whether each existed."""

    def refusal_hint(self, settings: Settings) -> str | None:
        """A line a refused reset adds (how long a killed worker stays visible)."""

    async def open_ledger(self, app: App, settings: Settings) -> LedgerBackend:
        """The app's ledger of table versions and retirements (:mod:`streamapp.versions.ledger`);
        ConfigError naming what is missing and the fix."""

    async def delete_topics(self, settings: Settings, names: list[str]) -> dict[str, bool]:
        """Delete changelog topics ``names`` (a retired version's); whether each existed."""

    async def existing_topics(self, settings: Settings, names: list[str]) -> set[str]:
        """The topics among ``names`` that exist (none without topics)."""

    def held_reader(
        self, settings: Settings, topic: str, start: Offsets, until: Offsets, *, dry_run: bool
    ) -> HeldReader:
        """A parking or dead-letter topic read back once (``streamapp parked replay``);
        ReplayError when this broker has no such topics."""


class NoChangelogTransport:
    """The base of the transports without topics of their own for tables (RabbitMQ, the
    event store alone): no changelog topics (tables restore through the event-store
    replay), the ledger of table versions in the event store, a sink that connects at
    its start, no views directory beside the source. A subclass gives the rest of
    :class:`Transport`."""

    title: str
    """How messages name it (``RabbitMQ``)."""

    async def connect_sink(self, settings: Settings, sink: Sink) -> None:
        await sink.start()  # the sink retries its own connection at start-up

    def make_directory(
        self, ctx: WorkerContext, source: LiveSource, sink: Sink | None
    ) -> MembersDirectory | None:
        return None  # the source's own membership (or one worker): nothing else to ask

    async def recreate_changelogs(
        self, settings: Settings, topics: list[TopicPlan]
    ) -> dict[str, bool]:
        raise AssertionError(f"{self.title} has no changelog topics")

    def refusal_hint(self, settings: Settings) -> str | None:
        return None

    async def open_ledger(self, app: App, settings: Settings) -> LedgerBackend:
        return await StoreLedger.open(settings.event_store, app.id)

    async def delete_topics(self, settings: Settings, names: list[str]) -> dict[str, bool]:
        return {}

    async def existing_topics(self, settings: Settings, names: list[str]) -> set[str]:
        return set()


MODULES = {
    "kafka": "streamapp.transports.kafka.transport",
    "rabbitmq": "streamapp.transports.rabbitmq.transport",
    "none": "streamapp.transports.embedded.transport",
}
"""Where each value of setting broker has its transport (imported when picked). The
memory broker (:mod:`streamapp.memory`) runs no worker: it has capabilities only."""


class _Registry(Mapping[str, "Transport"]):
    """``transports[name]``: the transport of that broker, its module imported now."""

    def __getitem__(self, name: str) -> Transport:
        module = MODULES.get(name)
        if module is None:
            raise ConfigError(
                f"setting broker (STREAMAPP_BROKER) = {name!r} is no transport: use one of "
                f"{', '.join(MODULES)}"
            )
        transport: Transport = importlib.import_module(module).TRANSPORT
        return transport

    def __iter__(self) -> Iterator[str]:
        return iter(MODULES)

    def __len__(self) -> int:
        return len(MODULES)


transports: Mapping[str, Transport] = _Registry()
