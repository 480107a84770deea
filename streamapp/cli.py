"""The ``streamapp`` command: ``worker``, ``topics``, ``store`` and ``forward``."""

from __future__ import annotations

import asyncio
import base64
import importlib
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from . import logs
from .app import App, TopicPlan
from .errors import ConfigError, StreamappError

if TYPE_CHECKING:
    from .eventstore import EventStoreBackend, ParkedRecord
    from .forwarder import Encoder
    from .settings import Settings
    from .sink import Sink

T = TypeVar("T")


def load_app(ref: str) -> App:
    """Import ``module:attribute`` from the working tree and return the App it names."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(
            f"{ref!r}: give MODULE:ATTRIBUTE, e.g. agents.orders:app", param_hint="-A"
        )
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}", param_hint="-A") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{ref!r} is not a streamapp App", param_hint="-A")
    return app


app_option = click.option(
    "-A", "--app", "app_ref", required=True, help="MODULE:ATTRIBUTE of the App."
)


def _plan_row(plan: TopicPlan) -> str:
    return f"{plan.name}\t{plan.partitions} partitions\t{plan.role}"


@click.group()
def main() -> None:
    """streamapp: event-sourced projections over Kafka with exactly-once table state."""


@main.command()
@app_option
@click.option("--data-dir", type=click.Path(path_type=Path), help="Where table stores live.")
@click.option("--web-port", type=int, help="Port of the table views (0: any free port).")
@click.option("--web-host", help="Address of the table views.")
@click.option("--loglevel", default="info", show_default=True)
def worker(
    app_ref: str, data_dir: Path | None, web_port: int | None, web_host: str | None, loglevel: str
) -> None:
    """Run one worker of the app (one member of its consumer group)."""
    from .worker import Worker

    logs.configure(loglevel)
    app = load_app(app_ref)
    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if web_port is not None:
        overrides["web_port"] = web_port
    if web_host is not None:
        overrides["web_host"] = web_host
    try:
        settings = app.settings(**overrides)

        async def run() -> None:
            await Worker(app, settings, app_ref).run()

        asyncio.run(run())
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc


@main.group()
def topics() -> None:
    """Create or list the topics an app needs."""


@topics.command("create")
@app_option
def topics_create(app_ref: str) -> None:
    """Create the app's source, changelog and parking topics that are missing.

    On the broker of setting broker (STREAMAPP_BROKER): Kafka topics; on RabbitMQ, per
    topic a direct exchange and one queue per partition (no changelogs there).
    """
    app = load_app(app_ref)
    try:
        settings = app.settings()
        if settings.broker == "rabbitmq":
            from .rabbitmq.topology import create_topology, plans

            created = asyncio.run(create_topology(app, settings))
            wanted = plans(app)
        elif settings.broker == "kafka":
            from .kafka.topics import create_topics

            created = asyncio.run(create_topics(app, settings))
            wanted = app.topic_plan()
        else:
            raise click.ClickException(
                f"setting broker (STREAMAPP_BROKER) = {settings.broker!r} has no topics; "
                "set it to kafka or rabbitmq"
            )
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    for plan in wanted:
        state = "created" if plan.name in created else "exists"
        click.echo(f"{_plan_row(plan)}\t{state}")


@topics.command("list")
@app_option
def topics_list(app_ref: str) -> None:
    """Print the topics the app needs."""
    for plan in load_app(app_ref).topic_plan():
        click.echo(_plan_row(plan))


@main.group()
def store() -> None:
    """Append to and read the app's event store (setting event_store)."""


@store.command("append")
@app_option
@click.argument("source", type=click.File("rb"), default="-")
def store_append(app_ref: str, source: Any) -> None:
    """Append JSON lines from SOURCE (a file, or - for stdin) to the event store.

    Each line is a structured-mode CloudEvent with a stream id (the streamid extension,
    else subject). Without streamversion an event gets the next version of its stream;
    with it, it must be that next version (its expected version is streamversion - 1).

    Input stops at the first bad line (not JSON, not a CloudEvent, no stream id, version
    conflict): its line number and the reason are printed, nothing of it or after it is
    appended, every line before it stays appended, and the exit code is 1.
    """
    from .eventstore import open_store
    from .eventstore.lines import LinesReport, append_lines

    app = load_app(app_ref)

    async def run() -> tuple[LinesReport, int]:
        es = await open_store(app.settings().event_store)
        try:
            return await append_lines(es, source), await es.head()
        finally:
            await es.close()

    try:
        report, head = asyncio.run(run())
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"appended {report.appended} events; head position {head}")
    if report.bad_line is not None:
        name = getattr(source, "name", "-")
        click.echo(
            f"error: line {report.bad_line}: {report.reason}\n"
            f"Lines before line {report.bad_line} are appended; nothing from it on. Fix it, "
            f"then append the rest: tail -n +{report.bad_line} {name} | "
            f"streamapp store append -A {app_ref} -",
            err=True,
        )
        sys.exit(1)


@store.command("head")
@app_option
def store_head(app_ref: str) -> None:
    """Print the last position of the event store (0 when empty)."""
    click.echo(str(_with_store(app_ref, lambda es: es.head())))


@store.command("read")
@app_option
@click.option("--from", "from_position", type=int, default=1, show_default=True)
@click.option("--limit", type=int, default=100, show_default=True)
def store_read(app_ref: str, from_position: int, limit: int) -> None:
    """Print events from position --from on as JSON lines: {"position": N, "event": {...}}."""
    rows = _with_store(app_ref, lambda es: es.read_all(from_position, limit))
    for row in rows:
        click.echo(b'{"position":%d,"event":%s}' % (row.position, row.payload))


@store.command("parked")
@app_option
@click.option(
    "--destination",
    "destinations",
    multiple=True,
    help="Parking destination to read (repeatable; default: every Park destination of the app).",
)
def store_parked(app_ref: str, destinations: tuple[str, ...]) -> None:
    """Print the deliveries a store-only worker parked, as JSON lines in park order.

    Each line: id, destination, parked_at, reason, source (topic/partition/store
    position), key, value and headers. A bytes field is text when it is UTF-8, else it
    is given as ``<field>_base64``.
    """
    app = load_app(app_ref)
    wanted = list(destinations) or [p.name for p in app.topic_plan() if p.role == "parking"]
    if not wanted:
        raise click.UsageError(
            f"app {app_ref} has no agent with on_failure=Park(...): name one with --destination"
        )

    async def read(es: EventStoreBackend) -> list[ParkedRecord]:
        records = [record for name in dict.fromkeys(wanted) for record in await es.parked(name)]
        return sorted(records, key=lambda r: r.id)

    for record in _with_store(app_ref, read):
        click.echo(orjson.dumps(_parked_json(record)))


def _parked_json(record: ParkedRecord) -> dict[str, Any]:
    """One parked record as JSON: bytes as text when UTF-8, else base64."""
    body: dict[str, Any] = {
        "id": record.id,
        "destination": record.destination,
        "parked_at": record.parked_at.isoformat(),
        "reason": record.reason,
        "source": (record.header("streamapp-source") or b"").decode(errors="replace"),
    }
    body.update(_bytes_field("key", record.key))
    body.update(_bytes_field("value", record.value))
    body["headers"] = [{"name": n, **_bytes_field("value", v)} for n, v in record.headers]
    return body


def _bytes_field(name: str, raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {name: None}
    try:
        return {name: raw.decode()}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(raw).decode()}


@main.command()
@app_option
@click.option("--name", help="Forwarder name: its checkpoint (default: the app id).")
@click.option("--chunk", type=int, default=1000, show_default=True, help="Events per publish.")
@click.option("--poll-interval", type=float, help="Seconds between head polls when idle.")
@click.option("--loglevel", default="info", show_default=True)
def forward(
    app_ref: str, name: str | None, chunk: int, poll_interval: float | None, loglevel: str
) -> None:
    """Publish the event store's events, in order, to the app's topics (outbox relay).

    Every agent with history=FromEventStore() on this store gets every event, keyed by
    stream id, on the broker of setting broker (STREAMAPP_BROKER). The checkpoint
    advances only after the broker confirmed: at-least-once. One
    forwarder of a store runs at a time; another waits and takes over when it dies.
    """
    from .eventstore import open_store
    from .forwarder import Forwarder, forwarded_topics

    logs.configure(loglevel)
    app = load_app(app_ref)
    try:
        settings = app.settings()
        topics = forwarded_topics(app, settings)
        make_sink, encode = _sink_of(app, settings)

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
                try:
                    await forwarder.run()
                except asyncio.CancelledError:
                    click.echo(f"forwarder stopped after {forwarder.forwarded} events", err=True)
            finally:
                await es.close()

        asyncio.run(run())
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc


def _sink_of(app: App, settings: Settings) -> tuple[Callable[[], Sink], Encoder]:
    """The sink factory and wire encoder of setting broker (STREAMAPP_BROKER)."""
    if settings.broker == "rabbitmq":
        from .rabbitmq import codec as amqp_codec
        from .rabbitmq.sink import RabbitSink
        from .rabbitmq.topology import plans

        partitions = {p.name: p.partitions for p in plans(app)}
        return (lambda: RabbitSink(settings, partitions)), amqp_codec.encode
    if settings.broker == "kafka":
        from .kafka import codec
        from .kafka.sink import KafkaSink

        return (
            lambda: KafkaSink(settings.kafka_bootstrap, timeout_s=settings.publish_timeout_s)
        ), codec.encode
    raise ConfigError(
        f"setting broker (STREAMAPP_BROKER) = {settings.broker!r}: the forwarder publishes "
        "to a broker; set it to kafka or rabbitmq"
    )


def _with_store(app_ref: str, use: Callable[[EventStoreBackend], Awaitable[T]]) -> T:
    from .eventstore import open_store

    app = load_app(app_ref)

    async def run() -> T:
        es = await open_store(app.settings().event_store)
        try:
            return await use(es)
        finally:
            await es.close()

    try:
        return asyncio.run(run())
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":
    main()
