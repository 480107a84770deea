"""A worker process: one group member running the app's agents and its table views.

Lifecycle: connect (with start-up retries), join the group, serve views; on SIGTERM or
SIGINT finish batches in hand, flush tables, commit, leave the group and exit within
``shutdown_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

from aiohttp import web

from .app import App
from .errors import ConfigError
from .kafka.retry import with_startup_retry
from .kafka.sink import KafkaSink
from .kafka.source import KafkaSource
from .settings import Settings
from .web.views import make_app

log = logging.getLogger("streamapp.worker")


class Worker:
    """Runs ``app`` in this process until stopped."""

    def __init__(self, app: App, settings: Settings, app_ref: str = "MODULE:app") -> None:
        self.app, self.settings = app, settings
        self.id = f"{socket.gethostname()}:{os.getpid()}"
        if settings.broker != "kafka":
            raise ConfigError(
                f"setting broker (STREAMAPP_BROKER) = {settings.broker!r} is not available in "
                "this version; use kafka"
            )
        self.sink = KafkaSink(settings.kafka_bootstrap, timeout_s=settings.publish_timeout_s)
        self.source = KafkaSource(app, settings, self.sink, app_ref)
        self.web_port: int | None = None
        self._web: web.AppRunner | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        """Serve views (fails fast on a taken port), connect, check topics, join the group."""
        try:
            await self._serve()
            await with_startup_retry(self.settings, "Kafka producer", self.sink.start)
            await self.source.start()
        except BaseException:
            await self._shutdown()
            raise
        log.info(
            "worker %s of app %s started; views on http://%s:%s",
            self.id,
            self.app.id,
            self.settings.web_host,
            self.web_port,
        )

    async def _serve(self) -> None:
        self._web = web.AppRunner(make_app(self.source.assignment, self.id), access_log=None)
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

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        log.info(
            "worker %s stopping: finishing batches, flushing tables, leaving the group", self.id
        )
        try:
            await asyncio.wait_for(self._shutdown(), self.settings.shutdown_timeout_s)
        except TimeoutError:
            log.error(
                "worker %s did not stop within %.0fs (setting shutdown_timeout_s)",
                self.id,
                self.settings.shutdown_timeout_s,
            )
            raise
        log.info("worker %s stopped", self.id)

    async def _shutdown(self) -> None:
        await self.source.stop()
        await self.sink.stop()
        if self._web is not None:
            await self._web.cleanup()

    async def run(self) -> None:
        """Start, run until a signal (or a fatal source error), then stop."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        stopped = asyncio.create_task(self._stop.wait())
        polling = asyncio.create_task(self.source.wait())
        done, _ = await asyncio.wait({stopped, polling}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        try:
            await self.stop()
        finally:
            if polling in done and polling.exception() is not None:
                raise polling.exception()  # type: ignore[misc]
