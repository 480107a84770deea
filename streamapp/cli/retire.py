"""``streamapp retire``: retire one version of a table, for good.

What a retire does, in this order:

1. refuse, changing nothing, when the version is unknown (naming the versions that
   exist), when a running worker's code or the app's code still declares it, or when it
   is the active version (``GET /tables`` of a running worker says both: its members
   directory knows every running worker's versions), or when no worker answers;
2. write the retirement to the app's ledger (:mod:`streamapp.versions.ledger`): every running
   worker hears of it at once and drops that version's local stores; a stopped worker
   does so at its next start;
3. delete the version's changelog topic (Kafka);
4. drop the stores of the version in this host's data directory that no process holds.

Retiring a retired version says so and finishes what a stopped retire left (2 is
durable before 3 and 4 start; run it again).
"""

from __future__ import annotations

import asyncio
import datetime
import difflib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson

from ..app import App
from ..errors import RetireRefusedError, StreamappError
from ..settings.settings import Settings
from ..transports.base import transports
from ..versions.ledger import (
    LedgerState,
    LocalStores,
    Retirement,
    StoresRecord,
    declared,
    drop_local,
    encode,
    label,
    local_stores,
    parse_label,
)
from ..versions.retired import TableVersion
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


Say = Callable[[str], None]
HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class RetirePlan:
    """What retiring ``table`` version ``version`` deletes."""

    app_id: str
    table: str
    version: int
    agent: str | None
    changelog: str | None
    changelog_exists: bool
    data_dir: Path
    local: tuple[LocalStores, ...]
    elsewhere: tuple[StoresRecord, ...] = ()
    """Data directories of workers (any host) that said they hold the version."""

    def lines(self) -> list[str]:
        name = label(self.table, self.version)
        writer = f" (written by agent {self.agent!r})" if self.agent else ""
        table = f"table {self.table!r} version {self.version}"
        out = [f"retire {table} of app {self.app_id!r}{writer}:"]
        if self.changelog and self.changelog_exists:
            out.append(f"  delete changelog topic {self.changelog}")
        elif self.changelog:
            out.append(f"  changelog topic {self.changelog} does not exist (deleted already)")
        for found in self.local:
            what = f"{found.directory} ({len(found.stores)} partition store(s))"
            if found.kept:
                out.append(f"  left here: {what}: {found.kept}")
            else:
                out.append(f"  remove here: {what}")
        if not self.local:
            out.append(f"  no local store of {name} in data directory {self.data_dir}")
        for record in self.elsewhere:
            dirs = ", ".join(record.tables[name])
            out.append(
                f"  on host {record.host}, data directory {record.data_dir}: {self.app_id}/"
                f"{{{dirs}}} (removed by its worker)"
            )
        out.append(
            f"  every worker removes its own local stores of {name} (directory "
            f"{{data_dir}}/{self.app_id}/{self.agent or '<agent>'}/) at once, a stopped "
            "one at its next start"
        )
        return out


async def read_tables(url: str, token: str | None, command: str = "retire") -> dict[str, Any]:
    """A running worker's ``GET /tables``; RetireRefusedError naming ``url``, the fix and
    the ``command`` refused (``retire``, ``switch``) when no worker answers there."""
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as http,
            http.get(url.rstrip("/") + "/tables", headers=headers) as response,
        ):
            status, body = response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise RetireRefusedError(
            f"{command} refused, nothing changed: no worker answers at {url} ({exc}). A "
            f"{command} asks a running worker which versions the workers declare: start one, "
            "or give the views of a running one with --url http://HOST:PORT (default: with "
            "STREAMAPP_BROKER=none the running worker's, else "
            "http://127.0.0.1:$STREAMAPP_WEB_PORT)"
        ) from exc
    if status != 200:
        raise RetireRefusedError(
            f"{command} refused, nothing changed: the worker at {url} answered GET /tables with "
            f"{status} ({body[:200].decode(errors='replace')}); with a bearer token set "
            "STREAMAPP_WEB_TOKEN"
        )
    try:
        tables: dict[str, Any] = orjson.loads(body)
        tables["tables"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise RetireRefusedError(
            f"retire refused, nothing changed: GET {url}/tables is not a streamapp worker's "
            "tables list; give a worker's views with --url"
        ) from exc
    return tables


def _served(tables: dict[str, Any], url: str) -> dict[TableVersion, dict[str, Any]]:
    """``GET /tables``'s versions by table version. A worker of a streamapp whose list
    has no ``versions`` names each table version it runs by its label: it declares it."""
    out = {}
    for table in tables.get("tables", ()):
        if "versions" not in table:
            out[parse_label(str(table["name"]))] = {"declared_by": [url]}
        for entry in table.get("versions", ()):
            out[(str(table["name"]), int(entry["version"]))] = entry
    return out


def check(
    app: App,
    app_ref: str,
    target: TableVersion,
    tables: dict[str, Any],
    state: LedgerState,
    url: str,
) -> None:
    """RetireRefusedError when ``target`` may not be retired (see the module)."""
    name, version = target
    served = _served(tables, url)
    code = {(r.table, r.version): r for r in declared(app, changelogs=False)}
    known = set(served) | set(code) | set(state.versions) | set(state.retired)
    refused = f"retire of table {name!r} version {version} refused, nothing changed:"
    versions = sorted(v for n, v in known if n == name)
    if not versions:
        names = sorted({n for n, _ in known})
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise RetireRefusedError(
            f"{refused} app {app.id!r} has no table {name!r}{hint} (its tables: "
            f"{', '.join(names) or 'none'})"
        )
    if version not in versions:
        raise RetireRefusedError(
            f"{refused} table {name!r} has no version {version} (its versions: "
            f"{', '.join(map(str, versions))})"
        )
    entry = served.get(target, {})
    if entry.get("state") == "active":
        raise RetireRefusedError(
            f"{refused} it is the active version, the one views answer from (GET {url}/tables). "
            "Retire a version once a higher one is active, or to roll back remove this "
            "version's agent from the code, restart the workers, then retire it"
        )
    by = [str(w) for w in entry.get("declared_by", ())]
    if by:
        raise RetireRefusedError(
            f"{refused} running worker(s) {', '.join(by)} still declare it (their code has "
            "an agent writing it). Remove that agent from the code, restart the workers, "
            "then retire it"
        )
    if target in code:
        raise RetireRefusedError(
            f"{refused} agent {code[target].agent!r} of {app_ref} still writes it: remove the "
            "agent from the code (a worker of this code would refuse to start once the "
            "version is retired), then retire it"
        )


def _elsewhere(
    state: LedgerState, target: TableVersion, data_dir: Path
) -> tuple[StoresRecord, ...]:
    """The data directories, but this host's ``data_dir``, that hold ``target``."""
    here = (socket.gethostname(), str(data_dir.resolve()))
    return tuple(
        r
        for r in state.stores.values()
        if label(*target) in r.tables and (r.host, r.data_dir) != here
    )


async def run_retire(
    app: App,
    app_ref: str,
    settings: Settings,
    target: TableVersion,
    *,
    url: str,
    yes: bool,
    say: Say,
) -> bool:
    """Refuse, plan, then with ``yes`` retire ``target`` (see the module) and say what was
    done. False: a dry run (nothing changed)."""
    transport = transports[settings.broker]
    ledger = await transport.open_ledger(app, settings)
    try:
        state = LedgerState.of(await ledger.records())
        done = state.retired.get(target)
        if done is None:
            check(app, app_ref, target, await read_tables(url, settings.web_token), state, url)
        record = state.versions.get(target)
        agent = record.agent if record else (done.agent if done else None)
        changelog = record.changelog if record else (done.changelog if done else None)
        exists = bool(changelog) and bool(
            await transport.existing_topics(settings, [changelog] if changelog else [])
        )
        data_dir = Path(settings.data_dir)
        plan = RetirePlan(
            app.id,
            *target,
            agent,
            changelog,
            exists,
            data_dir,
            tuple(local_stores(app, data_dir, [target])),
            _elsewhere(state, target, data_dir),
        )
        if done is not None:
            say(
                f"table {target[0]!r} version {target[1]} of app {app.id!r} is retired already "
                f"({done.at}): nothing to retire"
            )
            if not exists and not any(not f.kept for f in plan.local):
                return True
            say("what is left of it:")
        for line in plan.lines():
            say(line)
        if not yes:
            return False
        if done is None:
            at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            retirement = Retirement(*target, at, agent, changelog)
            await ledger.put(retirement.key, encode(retirement))
            say(f"retired {label(*target)}: every worker drops its local stores of it")
    finally:
        await ledger.close()
    if changelog and exists:
        await transport.delete_topics(settings, [changelog])
        say(f"deleted topic {changelog}")
    for path in drop_local(app, data_dir, [target]):
        say(f"removed {path}")
    return True
