"""``streamapp reset``: remove agents' local state and changelogs (:mod:`streamapp.reset`)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from ..errors import ResetRefusedError, StreamappError, UnknownAgentError
from .main import app_option, load_app, main


@main.command()
@app_option
@click.option("--agent", "agent_name", help="Reset this agent only (default: every agent).")
@click.option("--data-dir", type=click.Path(path_type=Path), help="The workers' data directory.")
@click.option("--yes", is_flag=True, help="Remove it; without: print what would go, exit 1.")
def reset(app_ref: str, agent_name: str | None, data_dir: Path | None, yes: bool) -> None:
    """Remove agents' local state and changelog topics: the next start rebuilds them.

    Run it with the workers' settings, every worker of the app stopped (it refuses,
    naming them, while one runs), on every host that keeps a data directory of the app.
    Without --yes it prints what it would remove and exits 1, touching nothing.
    """
    from ..reset import plan_reset
    from ..reset import reset as run_reset

    app = load_app(app_ref)
    try:
        settings = app.settings(**({} if data_dir is None else {"data_dir": data_dir}))
        plan = plan_reset(app, settings, agent_name)
    except UnknownAgentError as exc:
        raise click.BadParameter(str(exc), param_hint="--agent") from exc
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if not plan.agents:
        click.echo(f"app {app.id!r} has no agent with tables or local state: nothing to reset")
        return
    try:
        done = asyncio.run(run_reset(app, settings, plan, yes=yes, say=click.echo))
    except ResetRefusedError as exc:
        raise click.ClickException(str(exc)) from exc
    except StreamappError as exc:
        raise click.ClickException(
            f"reset stopped: {exc}\nWhat it printed as done is done; run it again to finish."
        ) from exc
    if not done:
        click.echo("dry run: nothing removed; run again with --yes to remove it", err=True)
        sys.exit(1)
    click.echo("reset done: start the workers to rebuild")
