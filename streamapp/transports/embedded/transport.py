"""The event store alone as a transport (``STREAMAPP_BROKER=none``): one worker owns
every partition and follows the store, under the store's worker lock. No broker: no
topics, no group, no derived events, no retry chain, no re-keying."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import ReplayError
from ..base import Capabilities, NoChangelogTransport, TopologyRow, Transport
from .source import StoreSource

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


class EmbeddedTransport(NoChangelogTransport):
    """The :class:`~streamapp.transports.base.Transport` of the event store alone."""

    name = "none"
    title = "the event store"
    capabilities = Capabilities(
        retry_chain=False,
        sends=False,
        group_by_refused="the event store alone has no topic to re-key through; run it on kafka",
        changelog=False,
        topics=False,
        group=False,
        embedded=True,
        keeps_consumed=False,
    )
    changelog_note = "no changelog (STREAMAPP_BROKER=none)"

    def describe(self, settings: Settings) -> str:
        return "the event store only (STREAMAPP_BROKER=none: no broker, no group)"

    def make_sink(self, app: App, settings: Settings, metrics: SinkMetrics) -> Sink | None:
        return None

    async def check_topology(self, app: App, settings: Settings, app_ref: str) -> None:
        return None  # no broker, nothing to check

    async def create_topology(self, app: App, settings: Settings) -> list[TopologyRow]:
        return []

    def open_source(
        self,
        ctx: WorkerContext,
        sink: Sink | None,
        feed: StoreFeed | None,
        store: EventStoreBackend | None,
    ) -> LiveSource:
        assert store is not None
        assert feed is not None
        return StoreSource(
            ctx.app, ctx.settings, feed, store.worker_lock(ctx.app.id), metrics=ctx.metrics
        )

    def make_relay(
        self, ctx: WorkerContext, sink: Sink | None, relayed: list[TopicPlan]
    ) -> Relay | None:
        return None

    def forward_sink(
        self, app: App, settings: Settings
    ) -> tuple[Callable[[], Sink], Encoder] | None:
        return None

    async def running_workers(self, app: App, settings: Settings) -> list[str]:
        return []  # the reset holds the store's worker lock instead

    def held_reader(
        self, settings: Settings, topic: str, start: Offsets, until: Offsets, *, dry_run: bool
    ) -> HeldReader:
        raise ReplayError(
            "setting broker (STREAMAPP_BROKER) = 'none' has no parking or dead-letter "
            "topics to send back from: a parked record is a row of the event store "
            "(`streamapp store parked` prints them); send rows back to the agents that "
            "parked them with `streamapp store parked replay` (docs/failures.md, "
            "'Re-running what was parked')"
        )


TRANSPORT: Transport = EmbeddedTransport()
