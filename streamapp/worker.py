"""A worker process: runs the app's agents on the configured source, and its views.

Lifecycle: serve views, open the event store when an agent has a history (or when the
store is the only source), connect the broker (with start-up retries), join the group;
on SIGTERM or SIGINT finish batches in hand, flush tables, commit, leave the group and
exit within ``shutdown_timeout_s``. The worker builds its parts with the transport of
setting broker (``transports[settings.broker]``) and asks its capabilities; everything
else sees a :class:`LiveSource`.

Python's cyclic garbage collector, tuned for a worker (setting ``gc_threshold``).

A worker keeps thousands of records alive across awaits (a batch in hand, the next one
fetched ahead), so with Python's default first-generation threshold (700 allocations)
they survive young collections, are promoted, and fill the oldest generation, whose
full collections then walk every object of the process: measured on the orders
projection, 0.9 s of 3.1 s of CPU over 200,000 events went to the collector. A first
generation of 50,000 lets a batch's objects die young (0.26 s). Reference counting frees
everything acyclic at once either way; the threshold only decides how often cycles are
looked for.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from . import tracing
from .app import App
from .catchup.feed import StoreFeed
from .engine.assignment import LiveSource
from .engine.interfaces import Sink
from .engine.served import LATCH_FILE, DurableLatch
from .engine.stall import watch_loop
from .engine.stalled import PartitionStalls
from .engine.summary import summarize_partitions
from .errors import BrokerUnavailableError, ConfigError, ShutdownTimeoutError, StateMismatchError
from .eventstore import open_store
from .eventstore.base import EventStoreBackend, display_url
from .settings.settings import Settings
from .tables.rocksdb.cache import rocks_memory
from .topics import relayed
from .transports.base import (
    MembersDirectory,
    Relay,
    WorkerContext,
    refuse_standbys,
    refuse_unsupported,
    transports,
)
from .versions.ledger import RetirementWatch
from .web.explain import StoreFolds
from .web.metrics import WorkerMetrics
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
        self.members: MembersDirectory | None = None
        self.relay: Relay | None = None
        self.retirements: RetirementWatch | None = None
        self._web: web.AppRunner | None = None
        self._listening: socket.socket | None = None
        self._summary: asyncio.Task[None] | None = None
        self.metrics = WorkerMetrics()
        self.metrics.watch_memory(rocks_memory(settings.memory_limit_mb))
        self._stop = asyncio.Event()
        self._unwatch: Callable[[], None] | None = None
        self._untune: Callable[[], None] | None = None
        self.transport = transports[settings.broker]
        refuse_unsupported(app, settings.broker, self.transport.capabilities)
        refuse_standbys(settings, self.transport.capabilities)
        for agent in app.agents.values():
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
        return self.transport.capabilities.embedded or any(a.history for a in agents)

    @property
    def _context(self) -> WorkerContext:
        return WorkerContext(
            self.app,
            self.settings,
            self.app_ref,
            self.id,
            self.metrics,
            views_url=lambda: self.views_url,
        )

    async def _open_store(self) -> None:
        """Open the store when it is read (only now, once the broker answered and the
        topics are there: a start that failed before made no store file), before the
        ledger of retired versions, which may live in it: a store that cannot open is
        the one error said."""
        settings = self.settings
        if self.needs_store:
            self.store = await open_store(settings.event_store)
            log.info(
                "event store %s: head position %d",
                display_url(settings.event_store),
                await self.store.head(),
            )
            self.feed = StoreFeed(self.store, poll_s=settings.poll_timeout_ms / 1000)

    def _open_source(self) -> LiveSource:
        """The source of setting broker."""
        return self.transport.open_source(self._context, self.sink, self.feed, self.store)

    async def _watch_retirements(self) -> RetirementWatch | None:
        """Follow the ledger of retired table versions (:mod:`streamapp.versions.ledger`):
        before any store opens, refuse a retired version in the code and drop retired
        versions' local stores; then drop them as retirements come."""
        if not self.app.tables:
            return None
        try:
            backend = await self.transport.open_ledger(self.app, self.settings)
        except ConfigError as exc:
            log.warning("%s: retired table versions are not followed", exc)
            return None
        changelogs = self.transport.capabilities.changelog
        # the one worker of the event store alone says where it serves, for the CLI
        views = (self.views_url, self.id) if self.transport.capabilities.embedded else None
        watch = RetirementWatch(
            self.app, self.settings, self.app_ref, backend, changelogs, views=views
        )
        try:
            await watch.start()
        except BaseException:
            await watch.stop()
            raise
        return watch

    async def start(self) -> None:
        """Bind the views' port (fails fast when taken), connect the broker, open the
        store, check topics, join the group. Nothing is created on disk before the port
        is bound and the broker answered. Tracing is decided first (``OTEL_*``: its
        parts ask once, when made)."""
        tracing.start(self.app.id)
        try:
            listening = self._bind()
            self._unwatch = watch_loop(self.settings.loop_stall_warn_ms, self.metrics)
            self._untune = tune_collector(self.settings.gc_threshold)
            self.sink = self.transport.make_sink(self.app, self.settings, self.metrics)
            try:
                if self.sink is not None:
                    await self.transport.connect_sink(self.settings, self.sink)
            except BrokerUnavailableError as exc:
                said = str(exc).rstrip(".")
                stop = "" if said.endswith("?") else "."
                raise BrokerUnavailableError(f"{said}{stop} {self._no_broker_hint()}") from exc
            if self.needs_store:
                # MissingTopicError before the store is opened, so it makes no store file
                # (the source checks again); start-up retries wait for ``topics create``.
                await self.transport.check_topology(self.app, self.settings, self.app_ref)
            await self._open_store()
            self.retirements = await self._watch_retirements()
            self.source = self._open_source()
            latch = self.settings.data_dir / f"{self.app.id}-{LATCH_FILE}"  # beside its stores
            self.source.assignment.served = DurableLatch(latch)
            assignment = self.source.assignment
            after_s = self.settings.stall_after_s
            assignment.stalls = PartitionStalls(lambda: assignment.tasks, after_s)
            await self._serve(listening)
            sink = self.sink
            if self.feed is not None:
                self.feed.start()
            await self.source.start()
            assignment.stalls.start()
            context, transport = self._context, self.transport
            self.members = transport.make_directory(context, self.source, sink)
            if self.members is not None:
                await self.members.start(self.views_url)
            relayed_topics = relayed(self.app.topic_plan(self.settings.delayed_policy))
            self.relay = transport.make_relay(context, sink, relayed_topics)
            if self.relay is not None:
                self.metrics.watch_relay(transport.name, self.relay)
                await self.relay.start()
        except BaseException:
            await self._shutdown()
            raise
        log.info(
            "worker %s of app %s started on %s; views on http://%s:%s%s",
            self.id,
            self.app.id,
            self._on_what(),
            self.settings.web_host,
            self.web_port,
            " (bearer token required)" if self.settings.web_token else "",
        )
        self._summary = asyncio.create_task(
            summarize_partitions(self.source.assignment, lambda line: log.info("%s", line)),
            name="partitions summary",
        )

    def _on_what(self) -> str:
        """What the worker runs on, for its start line (no URL: it may hold a password)."""
        return self.transport.describe(self.settings)

    def _no_broker_hint(self) -> str:
        return (
            f"Without a broker, STREAMAPP_BROKER=none runs the worker on the event store "
            f"alone (setting event_store = {self.settings.event_store!r}): one worker owns "
            "every partition and follows the store, no Kafka or RabbitMQ needed."
        )

    def _bind(self) -> socket.socket:
        """The listening socket of the views, bound before anything else starts."""
        host, port = self.settings.web_host, self.settings.web_port
        try:
            family = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0][0]
            self._listening = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve table views on {host}:{port} ({exc.strerror or exc}); choose "
                "another port with --web-port or STREAMAPP_WEB_PORT (0 picks a free one)"
            ) from exc
        self.web_port = self._listening.getsockname()[1]
        return self._listening

    async def _serve(self, listening: socket.socket) -> None:
        feed = self.feed
        assert self.source is not None
        self._web = web.AppRunner(
            make_app(
                self.source.assignment,
                self.id,
                feed.status if feed else None,
                metrics=self.metrics,
                token=self.settings.web_token,
                folds=StoreFolds(
                    self.app, lambda: self.store, self.transport.capabilities.embedded
                ),
                data_dir=self.settings.data_dir,
            ),
            access_log=None,  # never logs headers (the token)
            max_line_size=MAX_REQUEST_LINE,
        )
        await self._web.setup()
        await web.SockSite(self._web, listening).start()
        self._listening = None  # the server owns it now

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
        leaving = ", leaving the group" if self.transport.capabilities.group else ""
        log.info("worker %s stopping: finishing batches, flushing tables%s", self.id, leaving)
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
        if self._summary is not None:
            self._summary.cancel()
            await asyncio.gather(self._summary, return_exceptions=True)
        if self.source is not None and self.source.assignment.stalls is not None:
            await self.source.assignment.stalls.stop()
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
            if self.retirements is not None:
                await self.retirements.stop()
            if self.sink is not None:
                await self.sink.stop()
            if self.store is not None:
                await self.store.close()
            if self._web is not None:
                await self._web.cleanup()
            if self._listening is not None:
                self._listening.close()
                self._listening = None
            if self._unwatch is not None:
                self._unwatch()
                self._unwatch = None
            if self._untune is not None:
                self._untune()
                self._untune = None

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
                if task in done and (exc := task.exception()) is not None:
                    if isinstance(exc, StateMismatchError):
                        raise exc.for_app(self.app_ref)  # the fix names the app as run
                    raise exc


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


def tune_collector(threshold: int) -> Callable[[], None]:
    """Set the first generation's threshold to ``threshold`` (0: leave the interpreter's)
    and return what puts the previous one back (the worker's stop)."""
    before = gc.get_threshold()
    if threshold <= 0:
        return lambda: None
    gc.set_threshold(threshold, *before[1:])

    def undo() -> None:
        if gc.get_threshold()[0] == threshold:  # not changed by someone else meanwhile
            gc.set_threshold(*before)

    return undo
