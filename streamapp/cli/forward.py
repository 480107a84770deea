"""``streamapp forward``: the outbox relay from the event store to the broker."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from .. import logs, tracing
from ..app import App
from ..errors import ConfigError, StreamappError
from ..settings.event_loop import run as run_loop
from ..transports.base import transports
from .main import app_option, load_app, loglevel_option, main

if TYPE_CHECKING:
    from aiohttp import web

    from ..catchup.forwarder import Encoder, Forwarder
    from ..engine.interfaces import Sink
    from ..settings.settings import Settings


@main.command()
@app_option
@click.option("--name", help="Forwarder name: its checkpoint (default: the app id).")
@click.option("--chunk", type=int, default=1000, show_default=True, help="Events per publish.")
@click.option("--poll-interval", type=float, help="Seconds between head polls when idle.")
@click.option(
    "--web-port",
    type=int,
    help="Port of /healthz, /metrics and /status (default: setting forwarder_web_port, "
    "STREAMAPP_FORWARDER_WEB_PORT, 6067; 0 picks a free one, -1 serves nothing).",
)
@loglevel_option
def forward(
    app_ref: str,
    name: str | None,
    chunk: int,
    poll_interval: float | None,
    web_port: int | None,
    loglevel: str,
) -> None:
    """Publish the event store's events, in order, to the app's topics (outbox relay).

    Every agent with history=FromEventStore() on this store gets every event, keyed by
    stream id, on the broker of setting broker (STREAMAPP_BROKER). The checkpoint
    advances only after the broker confirmed: at-least-once. One
    forwarder of a store runs at a time; another waits and takes over when it dies.
    Its lag, rate, failures and lock are on /metrics and /status (--web-port).
    """
    from ..catchup.forwarder import Forwarder, forwarded_topics
    from ..eventstore import open_store

    app = load_app(app_ref)
    try:
        settings = app.settings()
        if web_port is not None:
            settings = settings.with_(forwarder_web_port=web_port)
        logs.configure(loglevel, settings.log_format)
        tracing.start(app.id)
        topics = forwarded_topics(app, settings)
        make_sink, encode = forward_sink(app, settings)

        async def run() -> None:
            es = await open_store(settings.event_store)
            try:
                forwarder = Forwarder(
                    es,
                    make_sink,
                    topics,
                    name=name or app.id,
                    encode=encode,
                    chunk=chunk,
                    poll_interval_s=poll_interval or settings.poll_timeout_ms / 1000,
                )
                task = asyncio.current_task()
                assert task is not None
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, task.cancel)
                runner = await _serve_forwarder(forwarder, settings)
                try:
                    await forwarder.run()
                except asyncio.CancelledError:
                    click.echo(f"forwarder stopped after {forwarder.forwarded} events", err=True)
                finally:
                    if runner is not None:
                        await runner.cleanup()
            finally:
                await es.close()

        run_loop(run(), settings.event_loop)
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc


async def _serve_forwarder(forwarder: Forwarder, settings: Settings) -> web.AppRunner | None:
    """Serve the forwarder's /healthz, /metrics and /status (None: setting says -1)."""
    import logging

    from aiohttp import web

    from ..web.forwarder import make_app

    port = settings.forwarder_web_port
    if port < 0:
        return None
    runner = web.AppRunner(make_app(forwarder, settings.web_token), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.web_host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"the forwarder cannot serve its metrics on {settings.web_host}:{port} "
            f"({exc.strerror or exc}); choose another port with --web-port or "
            "STREAMAPP_FORWARDER_WEB_PORT (0 picks a free one, -1 serves nothing)"
        ) from exc
    bound = runner.addresses[0][1] if runner.addresses else port
    logging.getLogger("streamapp.forwarder").info(
        "forwarder %s serves /healthz, /metrics and /status on http://%s:%d",
        forwarder.name,
        settings.web_host,
        bound,
    )
    return runner


def forward_sink(app: App, settings: Settings) -> tuple[Callable[[], Sink], Encoder]:
    """The sink factory and wire encoder of setting broker (STREAMAPP_BROKER)."""
    made = transports[settings.broker].forward_sink(app, settings)
    if made is None:
        raise ConfigError(
            f"setting broker (STREAMAPP_BROKER) = {settings.broker!r}: the forwarder "
            "publishes to a broker; set it to kafka or rabbitmq"
        )
    return made
