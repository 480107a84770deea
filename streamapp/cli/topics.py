"""``streamapp topics create`` and ``topics list``: the topics (RabbitMQ: exchanges and
partition queues) an app needs, on the transport of setting broker."""

from __future__ import annotations

import asyncio

import click

from ..errors import StreamappError
from ..topics import TopicPlan
from ..transports.base import refuse_unsupported, transports
from .main import app_option, load_app, main


def _plan_row(plan: TopicPlan) -> str:
    return f"{plan.name}\t{plan.partitions} partitions\t{plan.role}"


@main.group()
def topics() -> None:
    """Create or list the topics an app needs."""


@topics.command("create")
@app_option
def topics_create(app_ref: str) -> None:
    """Create the app's source, changelog and parking topics that are missing.

    On the broker of setting broker (STREAMAPP_BROKER): Kafka topics; on RabbitMQ, per
    topic a direct exchange and one queue per partition (no changelogs there). With
    STREAMAPP_BROKER=none there is nothing to create (exit 0): the event store is the
    only source, and tables rebuild from it.
    """
    app = load_app(app_ref)
    try:
        settings = app.settings()
        transport = transports[settings.broker]
        if not transport.capabilities.topics:
            click.echo(
                f"nothing to create: setting broker (STREAMAPP_BROKER) = {settings.broker!r} "
                "runs on the event store alone, the only source (no topics; tables "
                "rebuild from the store)"
            )
            return
        refuse_unsupported(app, settings.broker, transport.capabilities)  # before connecting
        rows = asyncio.run(transport.create_topology(app, settings))
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    for row in rows:
        click.echo(f"{row.name}\t{row.what}\t{'created' if row.created else 'exists'}")


@topics.command("list")
@app_option
def topics_list(app_ref: str) -> None:
    """Print the topics the app needs."""
    for plan in load_app(app_ref).topic_plan():
        click.echo(_plan_row(plan))
