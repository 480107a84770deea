"""``streamapp store parked replay``, ``release`` and ``skip``: rows an embedded worker
parked (``STREAMAPP_BROKER=none``) sent back to the agents that parked them.

There is no topic to publish to: a run appends the rows to the store's resend log in one
transaction, and the running worker (or the next one to start) applies each through the
lane that parked it, once (:mod:`streamapp.engine.resend`)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import click

from ..app import App
from ..errors import StreamappError
from ..eventstore import ParkedRecord, open_store
from ..eventstore.base import RELEASE_RUN, EventStoreBackend
from ..failures.outcomes import parking
from ..failures.republish import (
    HELD_SKIP,
    HELD_STREAM,
    PARK_AGENT,
    PARK_SOURCE,
    event_id,
    parked_source,
)
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
        # without --from, rows a release sent back already are left out (not the mark's)
        done = {} if start is not None else await es.resent_outcomes(app.id, name)
        parked = await es.parked(name)
        rows += [
            r
            for r in parked
            if r.id >= first and (until is None or r.id < until) and r.id not in done
        ]
    rows.sort(key=lambda r: r.id)
    agents, run = _parking_agents(app), _Run()
    _take(app, agents, rows, run, "--from {} skips it")
    return run


def _take(app: App, agents: dict[str, str], rows: list[ParkedRecord], run: _Run, hint: str) -> None:
    """Put ``rows`` in ``run`` up to the first that cannot go back (its agent or topic
    is not the app's: ``run.bad`` names it, ``hint`` with the row id after it)."""
    for row in rows:
        agent = (row.header(PARK_AGENT) or b"").decode(errors="replace")
        source = parked_source(row.headers)
        if agents.get(agent) != row.destination or source is None or source[0] not in app.sources:
            run.bad = (
                f"parked row {row.id} of {row.destination} cannot go back: it names agent "
                f"{agent or '(none)'!r} and origin {source[0] if source else '(none)'!r}, and "
                f"the app has no such agent parking to {row.destination} on such a topic; "
                f"the rows before it go back" + (", and " + hint.format(row.id + 1) if hint else "")
            )
            return
        run.rows.append(row)
        run.per_agent[agent] += 1


@click.command("release")
@app_option
@click.option(
    "--destination",
    "destinations",
    multiple=True,
    help="Parking destination to read (repeatable; default: every one of the app).",
)
@click.option("--stream", "streams", multiple=True, help="A held stream to release (repeatable).")
@click.option("--all", "every", is_flag=True, help="Release every held stream parked there.")
@click.option("--dry-run", is_flag=True, help="Print what would be sent back; send nothing.")
def store_parked_release(
    app_ref: str,
    destinations: tuple[str, ...],
    streams: tuple[str, ...],
    every: bool,
    dry_run: bool,
) -> None:
    """Send the parked rows of held streams back, in order, to the lane that held them
    (``Park(destination, hold="stream")``, once the handler is fixed; the embedded
    mode's ``streamapp parked release``): each stream is released when its last held
    event is applied, and held again from an event that fails again. Only rows marked
    with a held stream go, each once (rows sent back before are left out), and the
    replay mark stays where it is (`store parked replay` still sends the other rows)."""
    if every == bool(streams):
        raise click.UsageError("give the held streams to release: --stream S (repeatable) or --all")
    wanted = None if every else frozenset(streams)
    _held_command(app_ref, destinations, dry_run, lambda sid: wanted is None or sid in wanted)


@click.command("skip")
@app_option
@click.option(
    "--destination",
    "destinations",
    multiple=True,
    help="Parking destination to read (repeatable; default: every one of the app).",
)
@click.option("--stream", required=True, help="The held stream.")
@click.option("--event", "event", required=True, help="The id of the held event to skip.")
@click.option("--yes", is_flag=True, help="Confirm: the table never applies that event.")
def store_parked_skip(
    app_ref: str, destinations: tuple[str, ...], stream: str, event: str, yes: bool
) -> None:
    """Skip one held event of a stream for good, on purpose, and release the rest of the
    stream in order (the embedded mode's ``streamapp parked skip``): a copy of its row
    marked ``streamapp-held-skip`` is parked and sent back in its place (the row itself
    after it, filtered by its stream version), with the stream's other rows; the lane records
    the skip in its state (with the batch), logs it and counts its stream version as
    applied without running the handler. The only way an event is left out."""
    if not yes:
        raise click.UsageError(
            f"skipping event {event!r} of stream {stream!r} leaves it out of the table "
            "for good: give --yes to confirm"
        )
    _held_command(app_ref, destinations, False, lambda sid: sid == stream, skip=(stream, event))


def _held_command(
    app_ref: str,
    destinations: tuple[str, ...],
    dry_run: bool,
    pick: Callable[[str], bool],
    *,
    skip: tuple[str, str] | None = None,
) -> None:
    app = load_app(app_ref)
    try:
        settings = app.settings()
        if not transports[settings.broker].capabilities.embedded:
            command = "skip" if skip is not None else "release"
            raise click.UsageError(
                f"setting broker (STREAMAPP_BROKER) is {settings.broker!r}: its parked "
                f"records are on the broker; use `streamapp parked {command} -A {app_ref} "
                "--topic DESTINATION`. `store parked` commands work on the rows of a "
                "embedded worker (STREAMAPP_BROKER=none)"
            )
        wanted = _destinations(app, app_ref, destinations)
        run = asyncio.run(_send_held(app, settings.event_store, wanted, dry_run, pick, skip))
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if skip is not None and run.skipped is None:
        raise click.ClickException(
            f"no held event {skip[1]!r} of stream {skip[0]!r} parked in "
            f"{', '.join(wanted)}: `streamapp parked list --held` shows the held streams"
        )
    for row in run.rows:
        origin = (row.header(PARK_SOURCE) or b"").decode(errors="replace")
        agent = (row.header(PARK_AGENT) or b"").decode(errors="replace")
        stream = (row.header(HELD_STREAM) or b"").decode(errors="replace")
        what = f"parked row {row.id} ({origin}, stream {stream}) to agent {agent}"
        if row.id == run.skipped:
            what += f": skip it, in place of parked row {run.skip_of}"
        click.echo(f"would send {what}" if dry_run else what)
    counts = ", ".join(f"{a}: {n}" for a, n in sorted(run.per_agent.items()))
    counts = f" ({counts})" if counts else ""
    if dry_run:
        click.echo(f"dry run: would send {run.rows_sent} held rows back{counts}; nothing sent")
    else:
        click.echo(
            f"sent {run.rows_sent} held rows back to their agents{counts}. The running worker "
            "(or the next one to start) runs them once their partitions are live"
        )
    if run.bad is not None:
        raise click.ClickException(run.bad)


@dataclass
class _HeldRun(_Run):
    """A release's or a skip's run: ``skipped`` is the id of the skip's marked copy,
    ``skip_of`` the row it stands in for."""

    skipped: int | None = None
    skip_of: int | None = None
    rows_sent: int = 0


async def _send_held(
    app: App,
    url: str,
    destinations: list[str],
    dry_run: bool,
    pick: Callable[[str], bool],
    skip: tuple[str, str] | None,
) -> _HeldRun:
    """Send back the rows of held streams ``pick`` takes that were never sent back, in
    park order (``skip``: the last row of that stream's event, as a marked copy parked
    for it, in its place), in one run named :data:`RELEASE_RUN`."""
    es = await open_store(url)
    try:
        chosen: list[tuple[int, ParkedRecord]] = []  # (place in park order, row)
        target: ParkedRecord | None = None
        done: dict[int, str] = {}
        for name in destinations:
            sent = await es.resent_outcomes(app.id, name)
            done.update(sent)
            for row in await es.parked(name):
                sid = row.header(HELD_STREAM)
                stream = None if sid is None else sid.decode(errors="replace")
                if stream is None or not pick(stream) or row.header(HELD_SKIP) is not None:
                    continue
                if skip is not None and event_id(row.headers, row.value) == skip[1]:
                    target = row  # the last copy of that event (parked again: a new row)
                elif row.id not in sent:
                    chosen.append((row.id, row))
        run = _HeldRun()
        if skip is not None:
            if target is None:
                return run
            copy = await _skip_copy(es, target, dry_run)
            run.skipped, run.skip_of = copy.id, target.id
            chosen.append((target.id, copy))
            if target.id not in done:  # after its copy: filtered, and not sent back again
                chosen.append((target.id, target))
        chosen.sort(key=lambda c: c[0])  # stable: a skip's copy before its row
        _take(app, _parking_agents(app), [row for _, row in chosen], run, "")
        run.rows_sent = len(run.rows)
        if not dry_run and run.rows:
            ids = [row.id for row in run.rows]
            run.rows_sent = await es.resend(app.id, f"{RELEASE_RUN}{uuid.uuid4().hex}", ids)
        return run
    finally:
        await es.close()


async def _skip_copy(es: EventStoreBackend, row: ParkedRecord, dry_run: bool) -> ParkedRecord:
    """A copy of ``row`` marked :data:`HELD_SKIP`, parked beside it (a dry run: not
    parked, its id 0), so that the skip is in the store before it is sent back."""
    reason = f"skipped by streamapp store parked skip, parked row {row.id} ({uuid.uuid4().hex})"
    headers = [*row.headers, (HELD_SKIP, reason.encode())]
    if dry_run:
        return replace(row, id=0, headers=headers)
    await es.park(row.destination, row.value, key=row.key, headers=headers)
    for parked in reversed(await es.parked(row.destination)):
        if parked.header(HELD_SKIP) == reason.encode():
            return parked
    raise StreamappError(f"the skip copy of parked row {row.id} was parked but is not found")
