"""RabbitMQ as a transport (``STREAMAPP_BROKER=rabbitmq``): partition queues, membership
through the broker, the retry chain and derived events; no changelog (tables restore
through the event-store replay), so no re-keyed agents."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...codecs import amqp as codec
from ..base import Capabilities, NoChangelogTransport, TopologyRow, Transport
from .connection import connect, with_startup_retry
from .parked import RabbitHeldReader
from .probe import running_workers
from .relay import RabbitRelay
from .sink import RabbitSink
from .source import RabbitSource
from .topology import check_topology, create_topology, plans

if TYPE_CHECKING:
    from ...app import App
    from ...catchup.feed import StoreFeed
    from ...catchup.forwarder import Encoder
    from ...engine.assignment import LiveSource
    from ...engine.interfaces import Sink, SinkMetrics
    from ...eventstore.base import EventStoreBackend
    from ...failures.republish import HeldReader, Offsets
    from ...settings.settings import Settings
    from ...topics import TopicPlan
    from ..base import Relay, WorkerContext

NO_GROUP_BY = (
    "a RabbitMQ partition with tables restores through the event-store replay, which is "
    "partitioned by stream id, not by the key function; run it on kafka (or test it with "
    "the memory broker)"
)


class RabbitTransport(NoChangelogTransport):
    """The :class:`~streamapp.transports.base.Transport` of RabbitMQ."""

    name = "rabbitmq"
    title = "RabbitMQ"
    capabilities = Capabilities(
        retry_chain=True,
        sends=True,
        group_by_refused=NO_GROUP_BY,
        changelog=False,
        topics=True,
        group=True,
        embedded=False,
        keeps_consumed=False,
    )
    changelog_note = "no changelog on RabbitMQ"

    def describe(self, settings: Settings) -> str:
        return "rabbitmq"

    def make_sink(self, app: App, settings: Settings, metrics: SinkMetrics) -> Sink | None:
        return RabbitSink(settings, _partitions(app, settings), metrics=metrics, topics=app.topics)

    async def check_topology(self, app: App, settings: Settings, app_ref: str) -> None:
        async def check() -> None:
            connection = await connect(settings, "RabbitMQ topology check", robust=False)
            try:
                await check_topology(connection, app, app_ref, settings.delayed_policy)
            finally:
                await connection.close()

        await with_startup_retry(settings, "RabbitMQ topology check", check)

    async def create_topology(self, app: App, settings: Settings) -> list[TopologyRow]:
        created = await create_topology(app, settings)
        rows = [
            TopologyRow(p.name, f"{p.partitions} partitions\t{p.role}", p.name in created)
            for p in plans(app, settings.delayed_policy)
        ]
        members = app.members_topic
        rows.append(TopologyRow(members, "fanout exchange\tgroup membership", members in created))
        return rows

    def open_source(
        self,
        ctx: WorkerContext,
        sink: Sink | None,
        feed: StoreFeed | None,
        store: EventStoreBackend | None,
    ) -> LiveSource:
        assert isinstance(sink, RabbitSink)
        return RabbitSource(
            ctx.app,
            ctx.settings,
            sink,
            ctx.app_ref,
            history=feed,
            member_id=ctx.member_id,
            views_url=ctx.views_url,
            metrics=ctx.metrics,
        )

    def make_relay(
        self, ctx: WorkerContext, sink: Sink | None, relayed: list[TopicPlan]
    ) -> Relay | None:
        assert isinstance(sink, RabbitSink)
        return RabbitRelay(ctx.settings, sink, relayed, ctx.app_ref) if relayed else None

    def forward_sink(
        self, app: App, settings: Settings
    ) -> tuple[Callable[[], Sink], Encoder] | None:
        partitions = _partitions(app, settings)
        return (lambda: RabbitSink(settings, partitions, topics=app.topics)), codec.encode

    async def running_workers(self, app: App, settings: Settings) -> list[str]:
        return await running_workers(app, settings)

    def held_reader(
        self, settings: Settings, topic: str, start: Offsets, until: Offsets, *, dry_run: bool
    ) -> HeldReader:
        return RabbitHeldReader(settings, topic, start, until)


def _partitions(app: App, settings: Settings) -> dict[str, int]:
    """The partition count of every exchange the app publishes to."""
    return {p.name: p.partitions for p in plans(app, settings.delayed_policy)}


TRANSPORT: Transport = RabbitTransport()
