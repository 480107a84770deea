"""Kafka as a transport (``STREAMAPP_BROKER=kafka``): every capability, a consumer group,
changelog topics, a members topic as the views directory."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...codecs import kafka as codec
from ..base import Capabilities, TopologyRow, Transport
from .admin import delete_topics, existing_topics, recreate_topics
from .connection import with_startup_retry
from .ledger import KafkaLedger
from .members import KafkaMembers
from .parked import KafkaHeldReader
from .probe import running_workers
from .relay import KafkaRelay
from .sink import KafkaSink
from .source import KafkaSource
from .topology import check_topics, create_topics

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
    from ...versions.ledger import LedgerBackend
    from ..base import MembersDirectory, Relay, WorkerContext


class KafkaTransport:
    """The :class:`~streamapp.transports.base.Transport` of Kafka."""

    name = "kafka"
    title = "Kafka"
    capabilities = Capabilities(
        retry_chain=True,
        sends=True,
        group_by_refused=None,
        changelog=True,
        topics=True,
        group=True,
        embedded=False,
        keeps_consumed=True,
    )
    changelog_note = ""

    def describe(self, settings: Settings) -> str:
        return f"kafka at {settings.kafka_bootstrap}"

    def make_sink(self, app: App, settings: Settings, metrics: SinkMetrics) -> Sink | None:
        return KafkaSink(
            settings.kafka_bootstrap,
            timeout_s=settings.publish_timeout_s,
            metrics=metrics,
            topics=app.topics,
        )

    async def connect_sink(self, settings: Settings, sink: Sink) -> None:
        await with_startup_retry(settings, "Kafka producer", sink.start)

    async def check_topology(self, app: App, settings: Settings, app_ref: str) -> None:
        await with_startup_retry(
            settings, "Kafka topic check", lambda: check_topics(app, settings, app_ref)
        )

    async def create_topology(self, app: App, settings: Settings) -> list[TopologyRow]:
        created = await create_topics(app, settings)
        return [
            TopologyRow(p.name, f"{p.partitions} partitions\t{p.role}", p.name in created)
            for p in app.topic_plan(settings.delayed_policy)
        ]

    def open_source(
        self,
        ctx: WorkerContext,
        sink: Sink | None,
        feed: StoreFeed | None,
        store: EventStoreBackend | None,
    ) -> LiveSource:
        assert isinstance(sink, KafkaSink)
        return KafkaSource(
            ctx.app, ctx.settings, sink, ctx.app_ref, history=feed, metrics=ctx.metrics
        )

    def make_directory(
        self, ctx: WorkerContext, source: LiveSource, sink: Sink | None
    ) -> MembersDirectory | None:
        assert isinstance(sink, KafkaSink)
        assert isinstance(source, KafkaSource)
        return KafkaMembers(
            ctx.app,
            ctx.settings,
            source.assignment,
            ctx.member_id,
            sink,
            generation=lambda: source.generation,
        )

    def make_relay(
        self, ctx: WorkerContext, sink: Sink | None, relayed: list[TopicPlan]
    ) -> Relay | None:
        assert isinstance(sink, KafkaSink)
        return KafkaRelay(ctx.settings, sink, [p.name for p in relayed]) if relayed else None

    def forward_sink(
        self, app: App, settings: Settings
    ) -> tuple[Callable[[], Sink], Encoder] | None:
        def make() -> Sink:
            return KafkaSink(
                settings.kafka_bootstrap, timeout_s=settings.publish_timeout_s, topics=app.topics
            )

        return make, codec.encode

    async def running_workers(self, app: App, settings: Settings) -> list[str]:
        return await running_workers(app, settings)

    async def recreate_changelogs(
        self, settings: Settings, topics: list[TopicPlan]
    ) -> dict[str, bool]:
        return await recreate_topics(settings, topics)

    def refusal_hint(self, settings: Settings) -> str | None:
        return (
            f"A worker killed with SIGKILL stays in the group until its session times out "
            f"(setting session_timeout_ms = {settings.session_timeout_ms} ms)."
        )

    async def open_ledger(self, app: App, settings: Settings) -> LedgerBackend:
        return await KafkaLedger.open(settings, app.members_topic)

    async def delete_topics(self, settings: Settings, names: list[str]) -> dict[str, bool]:
        return await delete_topics(settings, names)

    async def existing_topics(self, settings: Settings, names: list[str]) -> set[str]:
        return await existing_topics(settings, names) if names else set()

    def held_reader(
        self, settings: Settings, topic: str, start: Offsets, until: Offsets, *, dry_run: bool
    ) -> HeldReader:
        return KafkaHeldReader(settings, topic, start, until, mark=not dry_run)


TRANSPORT: Transport = KafkaTransport()
