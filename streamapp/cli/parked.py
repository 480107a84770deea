"""``streamapp parked replay`` and ``streamapp dlq replay``: parked and dead-lettered
records sent back to their origin topic (:mod:`streamapp.failures.republish`), on the broker of
setting broker, through the app's sink (confirmed: Kafka ``acks=all``; RabbitMQ
publisher confirms, mandatory)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

import click
import orjson

from ..app import App
from ..engine.metrics import NO_SINK_METRICS
from ..errors import ReplayError, StreamappError
from ..failures.republish import HELD_SKIP, HELD_STREAM, Held, Offsets, ReplayReport, replay
from ..failures.republish import event_id as id_of
from ..failures.retry_chain import header
from ..records import Message
from ..settings.settings import Settings
from ..topics import TopicRole
from ..transports.base import transports
from .main import app_option, load_app, main
from .tables import group_status, worker_url

WHAT = {TopicRole.PARKING: "parking destination", TopicRole.DEAD_LETTER: "dead-letter topic"}
COMMAND = {TopicRole.PARKING: "parked", TopicRole.DEAD_LETTER: "dlq"}


def replay_options(role: TopicRole) -> click.Command:
    """The ``replay`` command of ``role``'s group (``parked`` or ``dlq``)."""
    what = WHAT[role]

    @click.command(
        "replay",
        help=f"Send the records of a {what} back to their origin topic.\n\n"
        "Each record goes back as it was first sent (key, value, CloudEvent and business "
        "headers), without the retry chain's x- headers and streamapp's park headers, "
        "and counts once the broker confirmed it; the first one not confirmed stops the "
        "run (exit 1), naming it and how many went before it. A run reads each partition "
        "from --from (default: the replay mark, where the last run stopped; else the "
        "start) up to --until (default: the end as of the run's start), each record once. "
        "Offsets are Kafka's: N for every partition, or PARTITION:OFFSET (repeatable); "
        "--until is exclusive. RabbitMQ has no offsets: a run takes every message the "
        "queues hold at its start and acks each one sent.",
    )
    @app_option
    @click.option("--topic", required=True, help=f"The {what} to read (a topic of the app).")
    @click.option(
        "--from", "start", multiple=True, metavar="[PARTITION:]OFFSET", help="First offset."
    )
    @click.option(
        "--until", multiple=True, metavar="[PARTITION:]OFFSET", help="Stop before this offset."
    )
    @click.option("--dry-run", is_flag=True, help="Print what would be sent; send nothing.")
    def command(
        app_ref: str, topic: str, start: Sequence[str], until: Sequence[str], dry_run: bool
    ) -> None:
        _run(app_ref, role, topic, start, until, dry_run)

    return command


@main.group()
def parked() -> None:
    """Records parked by on_failure=Park(...) (a Redeliver fallback included)."""


@main.group()
def dlq() -> None:
    """Records the retry chain dead-lettered (on_failure=Retry(...): {topic}-dlq)."""


parked.add_command(replay_options(TopicRole.PARKING))
dlq.add_command(replay_options(TopicRole.DEAD_LETTER))


@parked.command("release")
@app_option
@click.option("--topic", required=True, help="The parking destination to read (of the app).")
@click.option("--stream", "streams", multiple=True, help="A held stream to release (repeatable).")
@click.option("--all", "every", is_flag=True, help="Release every held stream parked there.")
@click.option("--dry-run", is_flag=True, help="Print what would be sent; send nothing.")
def parked_release(
    app_ref: str, topic: str, streams: Sequence[str], every: bool, dry_run: bool
) -> None:
    """Send the parked events of held streams back, in order, through the lane that
    held them (``Park(destination, hold="stream")``, once the handler is fixed): each
    stream is released when its last held event is applied, and held again from an
    event that fails again. Only records marked with a held stream go; the replay mark
    stays where it is (a later `parked replay` sends them again: the stream-version
    guard skips what was applied)."""
    if every == bool(streams):
        raise click.UsageError("give the held streams to release: --stream S (repeatable) or --all")
    wanted = None if every else frozenset(streams)
    _held_run(app_ref, topic, dry_run, lambda sid, _: wanted is None or sid in wanted)


@parked.command("list")
@app_option
@click.option("--held", is_flag=True, help="The held streams, each with its first error.")
@click.option("--url", help="A worker's views (default: the app's web_host:web_port).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per held stream.")
def parked_list(app_ref: str, held: bool, url: str | None, as_json: bool) -> None:
    """Ask the running workers (token: STREAMAPP_WEB_TOKEN) for the streams their agents
    hold (``Park(destination, hold="stream")``): agent, partition, the worker that holds
    it, stream, where the hold starts, the events held and the error of the event that
    holds it. The worker at --url names the others (the owners of the partitions it does
    not own); stderr says which answered."""
    if not held:
        raise click.UsageError(
            "give --held: the streams held by agents with Park(destination, hold='stream')"
        )
    app = load_app(app_ref)
    try:
        views = url or worker_url(app, app.settings())
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    workers = group_status(views)
    rows = [
        {"agent": agent, "partition": p["partition"], "worker": worker, **hold}
        for worker, _, status in workers
        for p in status["partitions"].values()
        for agent, lane in p["agents"].items()
        for hold in lane.get("held", [])
    ]
    for row in rows:
        if as_json:
            click.echo(orjson.dumps(row).decode())
            continue
        start = row["first"] if row["first"] is not None else f"@{row['position']}"
        click.echo(
            f"{row['stream']}\tagent {row['agent']} partition {row['partition']} worker "
            f"{row['worker']}\theld from {start}, {row['events']} events\t{row['error']}"
        )
    if not as_json:
        asked = ", ".join(f"{w} ({u})" for w, u, _ in workers)
        none = "no held streams" if not rows else f"{len(rows)} held streams"
        click.echo(f"{none} on the workers that answered: {asked}", err=True)


@parked.command("skip")
@app_option
@click.option("--topic", required=True, help="The parking destination to read (of the app).")
@click.option("--stream", required=True, help="The held stream.")
@click.option("--event", "event_id", required=True, help="The id of the held event to skip.")
@click.option("--yes", is_flag=True, help="Confirm: the table never applies that event.")
def parked_skip(app_ref: str, topic: str, stream: str, event_id: str, yes: bool) -> None:
    """Skip one held event of a stream for good, on purpose, and release the rest of the
    stream in order: the event goes back marked, the lane records the skip in its state
    (with the batch), logs it and counts its stream version as applied without running
    the handler. The only way an event is left out."""
    if not yes:
        raise click.UsageError(
            f"skipping event {event_id!r} of stream {stream!r} leaves it out of the table "
            "for good: give --yes to confirm"
        )
    found: list[str] = []

    def pick(sid: str | None, record: Held) -> bool:
        if sid == stream and id_of(record.headers, record.value) == event_id:
            found.append(record.where)
        return sid == stream

    _held_run(app_ref, topic, False, pick, skip=(stream, event_id))
    if not found:
        raise click.ClickException(
            f"no held event {event_id!r} of stream {stream!r} in {topic}: `streamapp parked "
            "list --held` shows the held streams; the stream's records were sent back as a "
            "release"
        )


def _run(
    app_ref: str,
    role: TopicRole,
    topic: str,
    start: Sequence[str],
    until: Sequence[str],
    dry_run: bool,
) -> None:
    app = load_app(app_ref)
    try:
        settings = app.settings()
        origins = _check_topic(app, settings, app_ref, role, topic)
        bounds = Offsets.parse("--from", start), Offsets.parse("--until", until)
        report = asyncio.run(_replay(app, settings, topic, bounds, origins, dry_run))
    except ReplayError as exc:
        if exc.sent:
            click.echo(f"sent {exc.sent} records back before stopping", err=True)
        raise click.ClickException(str(exc)) from exc
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    per_topic = ", ".join(f"{t}: {n}" for t, n in sorted(report.per_topic.items()))
    counts = f" ({per_topic})" if per_topic else ""
    if dry_run:
        click.echo(f"dry run: would send {report.sent} records back{counts}; nothing sent")
    else:
        click.echo(f"sent {report.sent} records back to their origin topic{counts}")


def _check_topic(
    app: App, settings: Settings, app_ref: str, role: TopicRole, topic: str
) -> frozenset[str]:
    """The app's source topics (where records go back); UsageError naming --topic when
    ``topic`` is not a ``role`` topic of the app."""
    plans = app.topic_plan(settings.delayed_policy)
    mine = [p.name for p in plans if p.role is role]
    found = next((p for p in plans if p.name == topic), None)
    if found is None or found.role is not role:
        if found is not None and found.role in COMMAND:
            hint = f"it is a {WHAT[found.role]}: use `streamapp {COMMAND[found.role]} replay`"
        elif mine:
            hint = f"the app's {WHAT[role]}s: {', '.join(mine)}"
        else:
            hint = f"app {app_ref} has no {WHAT[role]} (no agent's on_failure makes one)"
        raise click.BadParameter(
            f"{topic!r} is not a {WHAT[role]} of the app: {hint}", param_hint="--topic"
        )
    return frozenset(p.name for p in plans if p.role in (TopicRole.SOURCE, TopicRole.REPARTITION))


async def _replay(
    app: App,
    settings: Settings,
    topic: str,
    bounds: tuple[Offsets, Offsets],
    origins: frozenset[str],
    dry_run: bool,
) -> ReplayReport:
    transport = transports[settings.broker]
    reader = transport.held_reader(settings, topic, *bounds, dry_run=dry_run)
    sink = None if dry_run else transport.make_sink(app, settings, NO_SINK_METRICS)
    if sink is not None:
        await transport.connect_sink(settings, sink)
    try:
        await reader.start()
        try:

            async def publish(m: Message) -> None:
                assert sink is not None
                await sink.publish(m.topic, m.value, key=m.key, headers=m.headers)

            def said(record: Held, message: Message) -> None:
                if dry_run:
                    click.echo(f"would send {record.where} to {message.topic}")

            return await replay(reader.read(), origins, None if sink is None else publish, said)
        finally:
            await reader.stop()
    finally:
        if sink is not None:
            await sink.stop()


def _held_run(
    app_ref: str,
    topic: str,
    dry_run: bool,
    pick: Callable[[str | None, Held], bool],
    *,
    skip: tuple[str, str] | None = None,
) -> None:
    """Send back the records of ``topic`` marked with a held stream that ``pick`` takes
    (``skip``: the one event of that stream to mark skipped), the mark left alone."""
    app = load_app(app_ref)
    try:
        settings = app.settings()
        if transports[settings.broker].capabilities.embedded:
            command = "skip" if skip is not None else "release"
            raise click.UsageError(
                "setting broker (STREAMAPP_BROKER) is 'none': its parked records are rows of "
                f"the event store: use `streamapp store parked {command} -A {app_ref}` (same "
                "options, --destination for --topic)"
            )
        origins = _check_topic(app, settings, app_ref, TopicRole.PARKING, topic)
        report = asyncio.run(_held_replay(app, settings, topic, origins, dry_run, pick, skip))
    except ReplayError as exc:
        if exc.sent:
            click.echo(f"sent {exc.sent} records back before stopping", err=True)
        raise click.ClickException(str(exc)) from exc
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if dry_run:
        click.echo(f"dry run: would send {report.sent} held records back; nothing sent")
    else:
        click.echo(f"sent {report.sent} held records back to their origin topic")


async def _held_replay(
    app: App,
    settings: Settings,
    topic: str,
    origins: frozenset[str],
    dry_run: bool,
    pick: Callable[[str | None, Held], bool],
    skip: tuple[str, str] | None,
) -> ReplayReport:
    transport = transports[settings.broker]
    none = Offsets("--from"), Offsets("--until")
    reader = transport.held_reader(settings, topic, *none, dry_run=True)  # the mark stays
    sink = None if dry_run else transport.make_sink(app, settings, NO_SINK_METRICS)
    if sink is not None:
        await transport.connect_sink(settings, sink)

    async def held() -> AsyncIterator[Held]:
        async for record in reader.read():
            sid = header(record.headers, HELD_STREAM)
            stream = None if sid is None else sid.decode(errors="replace")
            if sid is None or not pick(stream, record):
                continue  # not a held stream's: left where it is
            if skip is not None and (stream, id_of(record.headers, record.value)) == skip:
                reason = f"skipped by streamapp parked skip, {record.where}"
                record = replace(record, headers=[*record.headers, (HELD_SKIP, reason.encode())])
            if dry_run:
                click.echo(f"would send {record.where} (stream {stream})")
            yield record

    try:
        await reader.start()
        try:

            async def publish(m: Message) -> None:
                assert sink is not None
                await sink.publish(m.topic, m.value, key=m.key, headers=m.headers)

            return await replay(held(), origins, None if sink is None else publish)
        finally:
            await reader.stop()
    finally:
        if sink is not None:
            await sink.stop()
