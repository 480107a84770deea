"""``streamapp worker``: run one worker of the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .. import logs
from ..errors import StreamappError
from ..settings.event_loop import run as run_loop
from .main import app_option, load_app, loglevel_option, main


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
    from ..worker import Worker

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

        run_loop(run(), settings.event_loop)
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
