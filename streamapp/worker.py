"""A worker process: runs the app's agents on the configured source, and its views.

Lifecycle: serve views, open the event store when an agent has a history (or when the
store is the only source), connect the broker (with start-up retries), join the group;
on SIGTERM or SIGINT finish batches in hand, flush tables, commit, leave the group and
exit within ``shutdown_timeout_s``. The worker knows transports only here, where it
builds them (``STREAMAPP_BROKER``); everything else sees a :class:`LiveSource`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .app import App, refuse_chain, relayed
from .catchup import StoreFeed
from .engine.source import LiveSource
from .errors import ConfigError, ShutdownTimeoutError
from .eventstore import open_store
from .eventstore.base import EventStoreBackend
from .repartition import refuse_broker
from .settings import Settings
from .sink import Sink
from .tables.memory import rocks_memory
from .web.metrics import WorkerMetrics

if TYPE_CHECKING:
    from .kafka.members import KafkaMembers
    from .kafka.relay import KafkaRelay
    from .rabbitmq.relay import RabbitRelay
from .web.views import make_app

log = logging.getLogger("streamapp.worker")

MAX_REQUEST_LINE = 65_536
"""aiohttp's own limit (plain-text 400 above it); keys over 1 KiB get a JSON 414 below it."""


class Worker:
    """Runs ``app`` in this process until stopped."""

    def __init__(self, app: App, settings: Settings, app_ref: str = "MODULE:app") -> None:
        self.app, self.settings, self.app_ref = app, settings, app_ref
        self.id = f"{socket.gethostname()}:{os.getpid()}"
        self.web_port: int | None = None
        self.store: EventStoreBackend | None = None
        self.feed: StoreFeed | None = None
        self.source: LiveSource | None = None
        self.sink: Sink | None = None
        self.members: KafkaMembers | None = None
        self.relay: KafkaRelay | RabbitRelay | None = None
        self._web: web.AppRunner | None = None
        self.metrics = WorkerMetrics()
        self.metrics.watch_memory(rocks_memory(settings.memory_limit_mb))
        self._stop = asyncio.Event()
        refuse_broker(app.agents.values(), settings.broker)
        refuse_chain(app, settings.broker)
        for agent in app.agents.values():
            if agent.sinks and settings.broker == "none":
                raise ConfigError(
                    f"agent {agent.name!r} sends derived events to "
                    f"{[t.name for t in agent.sinks]}, but setting broker "
                    "(STREAMAPP_BROKER) = 'none' has no broker to send them to: run the app "
                    "on kafka or rabbitmq"
                )
            url = agent.history.url if agent.history is not None else None
            if url is not None and url != settings.event_store:
                raise ConfigError(
                    f"agent {agent.name!r} declares history FromEventStore(url={url!r}), but "
                    f"a worker reads one event store, setting event_store "
                    f"(STREAMAPP_EVENT_STORE) = {settings.event_store!r}: set the setting to "
                    "that URL and drop url= from the agent"
                )

    @property
    def needs_store(self) -> bool:
        """The store is read: an agent has a history, or it is the only source."""
        agents = self.app.agents.values()
        return self.settings.broker == "none" or any(a.history for a in agents)

    async def _open_source(self) -> LiveSource:
        settings, app = self.settings, self.app
        if self.needs_store:
            self.store = await open_store(settings.event_store)
            self.feed = StoreFeed(self.store, poll_s=settings.poll_timeout_ms / 1000)
        if settings.broker == "rabbitmq":
            from .rabbitmq.sink import RabbitSink
            from .rabbitmq.source import RabbitSource
            from .rabbitmq.topology import plans

            partitions = {p.name: p.partitions for p in plans(app, settings.delayed_policy)}
            self.sink = RabbitSink(settings, partitions)
            return RabbitSource(
                app,
                settings,
                self.sink,
                self.app_ref,
                history=self.feed,
                member_id=self.id,
                views_url=lambda: self.views_url,
                metrics=self.metrics,
            )
        if settings.broker == "kafka":
            from .kafka.sink import KafkaSink
            from .kafka.source import KafkaSource

            self.sink = KafkaSink(settings.kafka_bootstrap, timeout_s=settings.publish_timeout_s)
            return KafkaSource(
                app, settings, self.sink, self.app_ref, history=self.feed, metrics=self.metrics
            )
        from .eventstore.source import StoreSource

        assert self.store is not None
        assert self.feed is not None
        return StoreSource(
            app, settings, self.feed, self.store.worker_lock(app.id), metrics=self.metrics
        )

    async def start(self) -> None:
        """Serve views (fails fast on a taken port), connect, check topics, join the group."""
        try:
            self.source = await self._open_source()
            await self._serve()
            sink = self.sink
            if self.settings.broker == "kafka" and sink is not None:
                from .kafka.retry import with_startup_retry

                await with_startup_retry(self.settings, "Kafka producer", sink.start)
            elif sink is not None:
                await sink.start()
            if self.feed is not None:
                self.feed.start()
            await self.source.start()
            relayed_topics = relayed(self.app.topic_plan(self.settings.delayed_policy))
            if self.settings.broker == "rabbitmq" and relayed_topics:
                from .rabbitmq.relay import RabbitRelay
                from .rabbitmq.sink import RabbitSink

                assert isinstance(sink, RabbitSink)
                self.relay = RabbitRelay(self.settings, sink, relayed_topics, self.app_ref)
                await self.relay.start()
            if self.settings.broker == "kafka":
                from .kafka.members import KafkaMembers
                from .kafka.sink import KafkaSink

                assert isinstance(sink, KafkaSink)
                self.members = KafkaMembers(
                    self.app, self.settings, self.source.assignment, self.id, sink
                )
                await self.members.start(self.views_url)
                if relayed_topics:
                    from .kafka.relay import KafkaRelay

                    topics = [p.name for p in relayed_topics]
                    self.relay = KafkaRelay(self.settings, sink, topics)
                    await self.relay.start()
        except BaseException:
            await self._shutdown()
            raise
        log.info(
            "worker %s of app %s started on %s; views on http://%s:%s%s",
            self.id,
            self.app.id,
            self.settings.broker,
            self.settings.web_host,
            self.web_port,
            " (bearer token required)" if self.settings.web_token else "",
        )

    async def _serve(self) -> None:
        feed = self.feed
        assert self.source is not None
        self._web = web.AppRunner(
            make_app(
                self.source.assignment,
                self.id,
                feed.status if feed else None,
                metrics=self.metrics,
                token=self.settings.web_token,
            ),
            access_log=None,  # never logs headers (the token)
            max_line_size=MAX_REQUEST_LINE,
        )
        await self._web.setup()
        host, port = self.settings.web_host, self.settings.web_port
        site = web.TCPSite(self._web, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(
                f"cannot serve table views on {host}:{port} ({exc.strerror}); choose another "
                "port with --web-port or STREAMAPP_WEB_PORT (0 picks a free one)"
            ) from exc
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.web_port = sockets[0].getsockname()[1] if sockets else port

    @property
    def views_url(self) -> str:
        """Where other workers reach these views (setting web_advertised_url)."""
        if self.settings.web_advertised_url:
            return self.settings.web_advertised_url.rstrip("/")
        host = self.settings.web_host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.web_port}"

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        log.info(
            "worker %s stopping: finishing batches, flushing tables, leaving the group", self.id
        )
        shutdown = asyncio.create_task(self._shutdown(), name="worker shutdown")
        try:
            await asyncio.wait({shutdown}, timeout=self.settings.shutdown_timeout_s)
        except asyncio.CancelledError:
            await _abandon(shutdown)
            raise
        if not shutdown.done():
            _log_stuck(asyncio.current_task())
            await _abandon(shutdown)
            raise ShutdownTimeoutError(
                f"worker {self.id} did not stop within {self.settings.shutdown_timeout_s:.0f}s "
                "(setting shutdown_timeout_s); batches in hand are redelivered to the next owner"
            )
        shutdown.result()
        log.info("worker %s stopped", self.id)

    async def _shutdown(self) -> None:
        try:
            if self.relay is not None:
                await self.relay.stop()
            if self.members is not None:
                await self.members.stop()
            if self.source is not None:
                await self.source.stop()
        finally:
            if self.feed is not None:
                await self.feed.stop()
            if self.sink is not None and self.source is not None:
                await self.sink.stop()
            if self.store is not None:
                await self.store.close()
            if self._web is not None:
                await self._web.cleanup()

    async def run(self) -> None:
        """Start, run until a signal (or a fatal source error), then stop."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        stopped = asyncio.create_task(self._stop.wait())
        assert self.source is not None
        watched = [asyncio.create_task(self.source.wait())]
        if self.feed is not None:
            watched.append(asyncio.create_task(self.feed.wait()))
        if self.relay is not None:
            watched.append(asyncio.create_task(self.relay.wait()))
        done, _ = await asyncio.wait({stopped, *watched}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        try:
            await self.stop()
        finally:
            for task in watched:
                if task in done and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]


async def _abandon(shutdown: asyncio.Task[None]) -> None:
    """Cancel a stop that ran out of time; wait a little for it to unwind, and log what
    it raised meanwhile (nothing is left unretrieved)."""
    shutdown.cancel()
    await asyncio.wait({shutdown}, timeout=5.0)
    if shutdown.done() and not shutdown.cancelled() and shutdown.exception() is not None:
        log.warning("the stop that ran out of time failed too: %r", shutdown.exception())


def _log_stuck(current: asyncio.Task[object] | None) -> None:
    """Log where every task still running waits: what a stop that timed out waited for."""
    for task in asyncio.all_tasks():
        if task is current or task.done():
            continue
        where: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None and len(where) < 20:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                where.append(type(awaited).__name__)
                break
            code = frame.f_code
            where.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        log.warning(
            "still running at the stop timeout: %r in %s", task.get_name(), " > ".join(where)
        )
