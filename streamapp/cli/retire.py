"""``streamapp retire``: retire a table version for good (:mod:`streamapp.retire`)."""

from __future__ import annotations

import asyncio

import click

from ..errors import StreamappError
from .main import app_option, load_app, main
from .tables import worker_url


@main.command()
@app_option
@click.argument("table")
@click.option("--version", "version", type=int, required=True, help="The version to retire.")
@click.option(
    "--url",
    help="A running worker's views, asked which versions the workers declare; default: "
    "with STREAMAPP_BROKER=none the running worker's (recorded in the event store), else "
    "http://127.0.0.1:$STREAMAPP_WEB_PORT (the app's web_host and web_port).",
)
@click.option("--yes", is_flag=True, help="Retire it; without: print what would go, exit 0.")
def retire(app_ref: str, table: str, version: int, url: str | None, yes: bool) -> None:
    """Retire TABLE's version: delete its changelog topic, and make every worker drop
    its local stores (a running one at once, a stopped one at its next start).

    Refused, changing nothing, for the active version, a version a running worker or
    this code still declares (remove its agent and restart the workers first), an
    unknown one, or when no worker answers at --url. Without --yes it prints what it
    would delete and changes nothing.
    """
    from ..retire import retire as run_retire

    app = load_app(app_ref)
    try:
        settings = app.settings()
        done = asyncio.run(
            run_retire(
                app,
                app_ref,
                settings,
                (table, version),
                url=url or worker_url(app, settings),
                yes=yes,
                say=click.echo,
            )
        )
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if not done:
        click.echo("dry run: nothing changed; run again with --yes to retire it", err=True)
