"""``streamapp store``: append to and read the app's event store (setting event_store)."""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from .. import tracing
from ..errors import StreamappError
from ..topics import TopicRole
from .main import _app_ref, app_option, load_app, main
from .store_parked import store_parked_release, store_parked_replay, store_parked_skip

if TYPE_CHECKING:
    from ..eventstore import EventStoreBackend, ParkedRecord

T = TypeVar("T")


@main.group()
def store() -> None:
    """Append to and read the app's event store (setting event_store)."""


@store.command("append")
@app_option
@click.argument("source", type=click.File("rb"), default="-")
@click.option(
    "--on-duplicate",
    type=click.Choice(["skip", "fail"]),
    default="skip",
    show_default=True,
    help="An event whose source and id are already in the store: skip it, or stop there "
    "(a bad line).",
)
def store_append(app_ref: str, source: Any, on_duplicate: str) -> None:
    """Append JSON lines from SOURCE (a file, or - for stdin) to the event store.

    Each line is a structured-mode CloudEvent with a stream id (the streamid extension,
    else subject). Without streamversion an event gets the next version of its stream;
    with it, it must be that next version (its expected version is streamversion - 1).

    An event whose source and id are already stored is skipped and counted (appending a
    file twice appends it once); with --on-duplicate=fail it is a bad line.

    Input stops at the first bad line (not JSON, not a CloudEvent, no stream id, version
    conflict): its line number and the reason are printed, nothing of it or after it is
    appended, every line before it stays appended, and the exit code is 1.

    With tracing on (the OTEL_* variables, docs/tracing.md) each chunk appended is a
    span, and an event without a trace context (traceparent) gets that span's.
    """
    from ..eventstore import open_store
    from ..eventstore.base import OnDuplicate
    from ..eventstore.lines import LinesReport, append_lines

    app = load_app(app_ref)
    tracing.start(app.id)

    async def run() -> tuple[LinesReport, int]:
        es = await open_store(app.settings().event_store)
        try:
            mode: OnDuplicate = "fail" if on_duplicate == "fail" else "skip"
            report = await append_lines(es, source, on_duplicate=mode)
            return report, await es.head()
        finally:
            await es.close()

    try:
        report, head = asyncio.run(run())
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    skipped = f", skipped {report.skipped} already stored" if report.skipped else ""
    click.echo(f"appended {report.appended} events{skipped}; head position {head}")
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


@store.group("parked", invoke_without_command=True)
@click.option("-A", "--app", "app_ref", help="MODULE[:ATTRIBUTE] of the App.")
@click.option(
    "--destination",
    "destinations",
    multiple=True,
    help="Parking destination to read (repeatable; default: every Park destination of the app).",
)
@click.pass_context
def store_parked(ctx: click.Context, app_ref: str | None, destinations: tuple[str, ...]) -> None:
    """Print the deliveries an embedded worker parked, as JSON lines in park order.

    Each line: id, destination, parked_at, reason, source (topic/partition/store
    position), outcome, key, value and headers. A bytes field is text when it is UTF-8,
    else it is given as ``<field>_base64``. ``store parked replay`` sends them back;
    outcome is what the row's last sending back came to: pending (the worker has not
    run it yet), applied, filtered (skipped by the agent's filter or by its table's
    stream version: the worker's log says when the table misses it), parked again
    (it failed again: a new row), or null when it was never sent back.
    """
    if ctx.invoked_subcommand is not None:
        if destinations:
            raise click.UsageError(
                f"give --destination after `{ctx.invoked_subcommand}`: "
                f"streamapp store parked {ctx.invoked_subcommand} --destination NAME"
            )
        return
    app_ref = _app_ref(ctx, ctx.command.params[0], app_ref)
    app = load_app(app_ref)
    wanted = list(destinations) or [p.name for p in app.topic_plan() if p.role is TopicRole.PARKING]
    if not wanted:
        raise click.UsageError(
            f"app {app_ref} has no agent with on_failure=Park(...): name one with --destination"
        )

    async def read(es: EventStoreBackend) -> list[tuple[ParkedRecord, str | None]]:
        rows = []
        for name in dict.fromkeys(wanted):
            outcomes = await es.resent_outcomes(app.id, name)
            rows += [(record, outcomes.get(record.id)) for record in await es.parked(name)]
        return sorted(rows, key=lambda row: row[0].id)

    for record, outcome in _with_store(app_ref, read):
        click.echo(orjson.dumps(_parked_json(record, outcome)))


store_parked.add_command(store_parked_replay)
store_parked.add_command(store_parked_release)
store_parked.add_command(store_parked_skip)


def _parked_json(record: ParkedRecord, outcome: str | None) -> dict[str, Any]:
    """One parked record as JSON: bytes as text when UTF-8, else base64."""
    body: dict[str, Any] = {
        "id": record.id,
        "destination": record.destination,
        "parked_at": record.parked_at.isoformat(),
        "reason": record.reason,
        "source": (record.header("streamapp-source") or b"").decode(errors="replace"),
        "outcome": outcome,
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


def _with_store(app_ref: str, use: Callable[[EventStoreBackend], Awaitable[T]]) -> T:
    from ..eventstore import open_store

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
