"""The ``streamapp`` command: ``worker``, ``topics create`` and ``topics list``."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from typing import Any

import click

from . import logs
from .app import App, TopicPlan
from .errors import StreamappError


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
    """Create the app's source, changelog and parking topics that are missing."""
    from .kafka.topics import create_topics

    app = load_app(app_ref)
    try:
        settings = app.settings()
        created = asyncio.run(create_topics(app, settings))
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    for plan in app.topic_plan():
        state = "created" if plan.name in created else "exists"
        click.echo(f"{_plan_row(plan)}\t{state}")


@topics.command("list")
@app_option
def topics_list(app_ref: str) -> None:
    """Print the topics the app needs."""
    for plan in load_app(app_ref).topic_plan():
        click.echo(_plan_row(plan))


if __name__ == "__main__":
    main()
