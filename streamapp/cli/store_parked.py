"""``streamapp store parked replay``: rows an embedded worker parked
(``STREAMAPP_BROKER=none``) sent back to the agents that parked them.

There is no topic to publish to: a run appends the rows to the store's resend log in one
transaction, and the running worker (or the next one to start) applies each through the
lane that parked it, once (:mod:`streamapp.engine.resend`)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass, field

import click

from ..app import App
from ..errors import StreamappError
from ..eventstore import ParkedRecord, open_store
from ..eventstore.base import EventStoreBackend
from ..failures.outcomes import parking
from ..failures.republish import PARK_AGENT, PARK_SOURCE, parked_source
from ..transports.base import transports
from .main import app_option, load_app


@dataclass
class _Run:
    """What a run sends (or, dry, would send), and the first row that cannot go back."""

    rows: list[ParkedRecord] = field(default_factory=list)
    per_agent: Counter[str] = field(default_factory=Counter)
    bad: str | None = None
    sent: int = 0
    """Rows appended to the log (fewer than ``rows``: another run sent the rest)."""
    outcomes: dict[int, str] = field(default_factory=dict)
    """What each row's last sending back came to, read after the run (a dry run: before)."""


@click.command("replay")
@app_option
@click.option(
    "--destination",
    "destinations",
    multiple=True,
    help="Parking destination to send back from (repeatable; default: every one of the app).",
)
@click.option(
    "--from",
    "start",
    type=click.IntRange(min=1),
    help="First parked row id (default: after the last row of its destination sent back).",
)
@click.option(
    "--until", type=click.IntRange(min=1), help="Stop before this parked row id (exclusive)."
)
@click.option("--dry-run", is_flag=True, help="Print what would be sent back; send nothing.")
def store_parked_replay(
    app_ref: str,
    destinations: tuple[str, ...],
    start: int | None,
    until: int | None,
    dry_run: bool,
) -> None:
    """Send parked rows back to the agents that parked them, once the handler is fixed.

    Each row is the stored event its agent failed: the worker runs it through that agent
    again, under its failure policy (one that fails again is parked again), and applies
    it once (its table checkpoint records the rows applied). A run takes the rows parked
    when it starts, from --from (default: after the last row sent back) up to --until;
    a second run sends only what was parked since (--from sends rows again). A row whose
    agent or topic is not in the app stops the run (exit 1), naming it; the rows before
    it are sent. Table effects apply once; an event whose stream has moved past it is
    skipped by its stream version (rebuild the table then, e.g. as a new version: the
    worker logs a WARNING naming the row). Each row is printed with its outcome
    (pending until the worker ran it; `streamapp store parked` shows what it came to:
    applied, filtered, parked again).
    """
    app = load_app(app_ref)
    try:
        settings = app.settings()
        if not transports[settings.broker].capabilities.embedded:
            raise click.UsageError(
                f"setting broker (STREAMAPP_BROKER) is {settings.broker!r}: its parked "
                "records are on the broker; send them back with `streamapp parked replay "
                f"-A {app_ref} --topic DESTINATION`. `store parked replay` sends back the "
                "rows of an embedded worker (STREAMAPP_BROKER=none)"
            )
        wanted = _destinations(app, app_ref, destinations)
        run = asyncio.run(_send(app, settings.event_store, wanted, start, until, dry_run))
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    for row in run.rows:
        origin = (row.header(PARK_SOURCE) or b"").decode(errors="replace")
        agent = (row.header(PARK_AGENT) or b"").decode(errors="replace")
        outcome = run.outcomes.get(row.id)
        if dry_run:
            before = f" (sent back before: {outcome})" if outcome is not None else ""
            click.echo(f"would send parked row {row.id} ({origin}) back to agent {agent}{before}")
        else:
            click.echo(f"parked row {row.id} ({origin}) to agent {agent}: {outcome or 'pending'}")
    counts = ", ".join(f"{a}: {n}" for a, n in sorted(run.per_agent.items()))
    counts = f" ({counts})" if counts else ""
    if dry_run:
        click.echo(f"dry run: would send {_rows(len(run.rows))} back{counts}; nothing sent")
    else:
        others = len(run.rows) - run.sent
        elsewhere = f"; {_rows(others)} sent by another run meanwhile" if others else ""
        click.echo(
            f"sent {_rows(run.sent)} back to their agents{counts}{elsewhere}. The running "
            "worker (or the next one to start) runs them once their partitions are live "
            "(`streamapp store parked` shows what each came to: applied, filtered, parked again)"
        )
    if run.bad is not None:
        raise click.ClickException(run.bad)


def _rows(n: int) -> str:
    return f"{n} parked row{'' if n == 1 else 's'}"


def _destinations(app: App, app_ref: str, given: tuple[str, ...]) -> list[str]:
    """The parking destinations to read: ``given`` (each one of the app's), else all."""
    mine = list(dict.fromkeys(_parking_agents(app).values()))
    if not mine:
        raise click.UsageError(f"app {app_ref} has no agent with on_failure=Park(...)")
    for name in given:
        if name not in mine:
            raise click.BadParameter(
                f"{name!r} is not a parking destination of the app: it has {', '.join(mine)}",
                param_hint="--destination",
            )
    return list(dict.fromkeys(given)) or mine


def _parking_agents(app: App) -> dict[str, str]:
    """Each agent of ``app`` that parks, with its parking destination."""
    out = {}
    for agent in app.agents.values():
        policy = parking(agent.on_failure)
        if policy is not None:
            out[agent.name] = policy.destination
    return out


async def _send(
    app: App,
    url: str,
    destinations: list[str],
    start: int | None,
    until: int | None,
    dry_run: bool,
) -> _Run:
    es = await open_store(url)
    try:
        run = await _plan(app, es, destinations, start, until)
        if not dry_run and run.rows:
            ids = [row.id for row in run.rows]
            run.sent = await es.resend(app.id, uuid.uuid4().hex, ids, again=start is not None)
        for name in dict.fromkeys(row.destination for row in run.rows):
            run.outcomes.update(await es.resent_outcomes(app.id, name))
        return run
    finally:
        await es.close()


async def _plan(
    app: App,
    es: EventStoreBackend,
    destinations: list[str],
    start: int | None,
    until: int | None,
) -> _Run:
    """The rows to send, in park order, up to the first that cannot go back."""
    rows: list[ParkedRecord] = []
    for name in destinations:
        first = start if start is not None else await es.resent_through(app.id, name) + 1
        parked = await es.parked(name)
        rows += [r for r in parked if r.id >= first and (until is None or r.id < until)]
    rows.sort(key=lambda r: r.id)
    agents, run = _parking_agents(app), _Run()
    for row in rows:
        agent = (row.header(PARK_AGENT) or b"").decode(errors="replace")
        source = parked_source(row.headers)
        if agents.get(agent) != row.destination or source is None or source[0] not in app.sources:
            run.bad = (
                f"parked row {row.id} of {row.destination} cannot go back: it names agent "
                f"{agent or '(none)'!r} and origin {source[0] if source else '(none)'!r}, and "
                f"the app has no such agent parking to {row.destination} on such a topic; "
                f"the rows before it go back, and --from {row.id + 1} skips it"
            )
            break
        run.rows.append(row)
        run.per_agent[agent] += 1
    return run
