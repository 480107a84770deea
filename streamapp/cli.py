"""The ``streamapp`` command: ``worker``, ``topics``, ``store``, ``forward``, ``tables``
and ``agents``. ``-A MODULE[:ATTRIBUTE]`` goes before or after the command."""

from __future__ import annotations

import asyncio
import base64
import importlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import click
import orjson

from . import logs
from .app import App, TopicPlan, TopicRole
from .errors import ConfigError, StreamappError
from .version import streamapp_version

if TYPE_CHECKING:
    from .eventstore import EventStoreBackend, ParkedRecord
    from .forwarder import Encoder
    from .settings import Settings
    from .sink import Sink

T = TypeVar("T")


def load_app(ref: str) -> App:
    """Import ``MODULE[:ATTRIBUTE]`` from the working tree and return the App it names
    (a bare module: its ``app``). Errors are one line naming what is missing."""
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    if not module_name:
        raise click.ClickException(f"-A {ref!r}: give MODULE[:ATTRIBUTE], e.g. agents.orders:app")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.ClickException(f"-A {ref}: cannot import {module_name!r}: {exc}") from exc
    except StreamappError as exc:  # e.g. an agent refused at registration
        raise click.ClickException(f"-A {ref}: {exc}") from exc
    if not hasattr(module, attr):
        raise click.ClickException(
            f"-A {ref}: module {module_name!r} has no attribute {attr!r} "
            "(give MODULE:ATTRIBUTE naming the App)"
        )
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise click.ClickException(
            f"-A {ref}: {module_name}:{attr} is not a streamapp App (it is a {type(app).__name__})"
        )
    return app


def _app_ref(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """``-A`` given after the command, else before it (``streamapp -A MOD worker``)."""
    ref = value or ctx.find_root().params.get("app_ref")
    if not ref:
        raise click.ClickException(
            f"{ctx.command_path}: give the app with -A MODULE[:ATTRIBUTE], e.g. -A agents.orders"
        )
    return str(ref)


app_option = click.option(
    "-A", "--app", "app_ref", callback=_app_ref, help="MODULE[:ATTRIBUTE] of the App."
)

LEVELS = ("debug", "info", "warning", "error", "critical")


def _level(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value.lower() not in LEVELS:
        raise click.ClickException(f"unknown log level {value!r}: use one of {', '.join(LEVELS)}")
    return value.lower()


loglevel_option = click.option(
    "-l", "--loglevel", default="info", show_default=True, callback=_level, help="Log level."
)


def _plan_row(plan: TopicPlan) -> str:
    return f"{plan.name}\t{plan.partitions} partitions\t{plan.role}"


@click.group()
@click.option(
    "-A", "--app", "app_ref", help="MODULE[:ATTRIBUTE] of the App, for every command below."
)
@click.version_option(streamapp_version(), "--version", prog_name="streamapp")
def main(app_ref: str | None) -> None:
    """streamapp: event-sourced projections over Kafka with exactly-once table state."""


@main.command()
@app_option
@click.option("--data-dir", type=click.Path(path_type=Path), help="Where table stores live.")
@click.option("--web-port", type=int, help="Port of the table views (0: any free port).")
@click.option("--web-host", help="Address of the table views.")
@loglevel_option
def worker(
    app_ref: str, data_dir: Path | None, web_port: int | None, web_host: str | None, loglevel: str
) -> None:
    """Run one worker of the app (one member of its consumer group)."""
    from .worker import Worker

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
        logs.configure(loglevel, settings.log_format)

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
            wanted = plans(app, settings.delayed_policy)
        elif settings.broker == "kafka":
            from .kafka.topics import create_topics

            created = asyncio.run(create_topics(app, settings))
            wanted = app.topic_plan(settings.delayed_policy)
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
    if settings.broker == "rabbitmq":
        members = app.members_topic
        state = "created" if members in created else "exists"
        click.echo(f"{members}\tfanout exchange\tgroup membership\t{state}")


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
    wanted = list(destinations) or [p.name for p in app.topic_plan() if p.role is TopicRole.PARKING]
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
@loglevel_option
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

    app = load_app(app_ref)
    try:
        settings = app.settings()
        logs.configure(loglevel, settings.log_format)
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

        partitions = {p.name: p.partitions for p in plans(app, settings.delayed_policy)}
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


DEFAULT_URL = "http://127.0.0.1:6066"
url_option = click.option(
    "--url", default=DEFAULT_URL, show_default=True, help="A worker's views (any worker)."
)


@main.group("tables")
def tables_group() -> None:
    """Ask a running worker for table state (token: STREAMAPP_WEB_TOKEN)."""


@tables_group.command("get")
@click.argument("table")
@click.argument("key")
@url_option
@click.option("--min-version", type=int, help="Wait for the key's stream version (up to 5 s).")
@click.option("--meta", is_flag=True, help="With partition, phase, version and checkpoint.")
def tables_get(table: str, key: str, url: str, min_version: int | None, meta: bool) -> None:
    """Print KEY's committed value in TABLE as JSON."""
    params = {"meta": "1"} if meta else {}
    if min_version is not None:
        params["min_version"] = str(min_version)
    path = f"/tables/{quote(table, safe='')}/{quote(key, safe='')}"
    click.echo(_ask(url, path, params).decode())


@tables_group.command("scan")
@click.argument("table")
@url_option
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", type=int, default=100, show_default=True, help="Items per request.")
def tables_scan(table: str, url: str, prefix: str, limit: int) -> None:
    """Print every item of TABLE (merged across the workers), one JSON line each, page by page."""
    cursor = ""
    while True:
        params = {"prefix": prefix, "limit": str(limit), "cursor": cursor}
        page = orjson.loads(_ask(url, f"/tables/{quote(table, safe='')}", params))
        for item in page["items"]:
            click.echo(orjson.dumps(item).decode())
        if not page.get("cursor"):
            return
        cursor = page["cursor"]


def _ask(url: str, path: str, params: dict[str, str]) -> bytes:
    """GET a worker's view; a non-200 answer is printed (JSON) and exits 1."""
    import aiohttp

    token = os.environ.get("STREAMAPP_WEB_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def get() -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url.rstrip("/") + path, params=params, headers=headers) as r,
        ):
            return r.status, await r.read()

    try:
        status, body = asyncio.run(get())
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise click.ClickException(f"cannot reach a worker at {url}: {exc}") from exc
    if status != 200:
        click.echo(body.decode(errors="replace"), err=True)
        raise click.ClickException(f"worker at {url} answered {status}")
    return body


@main.command()
@app_option
def agents(app_ref: str) -> None:
    """List the app's agents: topic, tables, reads, sinks, failure policy and history."""
    app = load_app(app_ref)
    for agent in app.agents.values():
        history = agent.history
        out = {
            "agent": agent.name,
            "topic": agent.topic.name,
            "partitions": agent.topic.partitions,
            "tables": [t.name for t in agent.tables],
            "reads": [t.name for t in agent.reads],
            "sinks": [t.name for t in agent.sinks],
            "changelog": app.changelog_topic(agent),
            "on_failure": repr(agent.on_failure),
            "history": None if history is None else repr(history),
            "filter": None if agent.filter is None else getattr(agent.filter, "__name__", "yes"),
        }
        if agent.group_by is not None:
            out["group_by"] = {
                "source": agent.group_by.source.name,
                "forwarder": agent.group_by.forwarder,
                "key": getattr(agent.group_by.key, "__name__", "yes"),
            }
        click.echo(orjson.dumps(out).decode())


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
