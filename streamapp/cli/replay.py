"""``streamapp parked replay`` and ``streamapp dlq replay``: parked and dead-lettered
records sent back to their origin topic (:mod:`streamapp.republish`), on the broker of
setting broker, through the app's sink (confirmed: Kafka ``acks=all``; RabbitMQ
publisher confirms, mandatory)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import click

from ..app import App
from ..engine.metrics import NO_SINK_METRICS
from ..errors import ReplayError, StreamappError
from ..records import Message
from ..republish import Held, Offsets, ReplayReport, replay
from ..settings import Settings
from ..topics import TopicRole
from ..transport import transports
from .main import app_option, load_app, main

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
