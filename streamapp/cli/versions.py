"""``streamapp versions``: a table's versions compared before a switch (``diff``), and a
``switch="manual"`` version made the active one (``switch``).

- ``diff -A APP TABLE --from A --to B [--sample K] [--json]``: K streams (default 100)
  picked at random from the event store, each folded through both versions' handlers
  from the store (:mod:`streamapp.verify.fold`) up to one store position (the head when
  the command starts), compared key by key, with examples side by side. No worker is
  asked: both sides are the code's, at one position.
- ``switch -A APP TABLE --version N``: writes the switch to the app's ledger
  (:mod:`streamapp.versions.ledger`); every worker hears of it and makes the version
  active as soon as it is live on every partition (it is ``built`` before). Refused,
  changing nothing, when the version is not declared ``switch="manual"`` in the app's
  code, and (asked of a running worker's ``GET /tables``) when it is not ``built`` yet.
"""

from __future__ import annotations

import asyncio
import datetime
import os
from typing import Any

import click
import orjson

from ..app import App
from ..errors import StreamappError
from ..tables.table import Table
from ..transports.base import transports
from ..versions.ledger import Switch
from .main import app_option, load_app, main
from .retire import read_tables
from .tables import url_option, worker_url

DIFF_SAMPLE = 100
EXAMPLES = 5


@main.group("versions")
def versions_group() -> None:
    """Compare a table's versions (``diff``); switch to a manual one (``switch``)."""


def _version(app: App, name: str, version: int) -> Table[Any]:
    found = {t.version: t for _, t in app.tables.values() if t.name == name}
    if version not in found:
        raise click.ClickException(
            f"table {name!r} has no version {version} in app {app.id!r}'s code (versions: "
            f"{sorted(found) or 'none: no such table'})"
        )
    return found[version]


@versions_group.command("switch")
@app_option
@click.argument("table")
@click.option("--version", "version", type=int, required=True, help="The version to switch to.")
@url_option
def switch_command(app_ref: str, table: str, version: int, url: str | None) -> None:
    """Make TABLE's manual VERSION the one views answer from, once it is built."""
    app = load_app(app_ref)
    chosen = _version(app, table, version)
    if chosen.switch != "manual":
        raise click.ClickException(
            f"switch refused, nothing changed: {chosen.label} is declared switch='auto' (views "
            "move to it once it is built); only a Table(..., switch='manual') waits for this"
        )
    settings = app.settings()
    views = url or worker_url(app, settings)
    try:
        asyncio.run(_switch(app, chosen, views))
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"switched {table} to v{version}: every worker answers from it now (it was built); "
        "the switch is one-way"
    )


async def _switch(app: App, table: Table[Any], views: str) -> None:
    listed = await read_tables(views, os.environ.get("STREAMAPP_WEB_TOKEN"), "switch")
    states = {
        v["version"]: v["state"]
        for t in listed["tables"]
        if t["name"] == table.name
        for v in t.get("versions", [])
    }
    state = states.get(table.version)
    if state not in ("built", "active"):
        raise StreamappError(
            f"switch refused, nothing changed: {table.label} is {state or 'unknown to the workers'}"
            f" at {views}, not built: wait until `streamapp tables` shows it built (live on "
            "every partition)"
        )
    settings = app.settings()
    ledger = await transports[settings.broker].open_ledger(app, settings)
    try:
        at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        record = Switch(table.name, table.version, at)
        await ledger.put(record.key, record.encode())
    finally:
        await ledger.close()


@versions_group.command("diff")
@app_option
@click.argument("table")
@click.option("--from", "from_version", type=int, required=True, help="One version.")
@click.option("--to", "to_version", type=int, required=True, help="The other.")
@click.option("--sample", type=int, default=DIFF_SAMPLE, show_default=True, help="Streams.")
@click.option("--json", "as_json", is_flag=True, help="The counts and examples as JSON.")
def diff_command(
    app_ref: str, table: str, from_version: int, to_version: int, sample: int, as_json: bool
) -> None:
    """Fold K streams of the store through TABLE's two versions and compare them."""
    if sample < 1:
        raise click.ClickException(f"--sample {sample}: give 1 or more streams")
    app = load_app(app_ref)
    old, new = _version(app, table, from_version), _version(app, table, to_version)
    settings = app.settings()
    embedded = transports[settings.broker].capabilities.embedded
    try:
        result = asyncio.run(_diff(app, settings.event_store, old, new, sample, embedded))
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(orjson.dumps(result).decode())
        return
    click.echo(
        f"{table} v{from_version} -> v{to_version} at store position {result['store_position']:,}"
        f": {result['checked']:,} streams, {result['differ']:,} differ, "
        f"{result['checked'] - result['differ']:,} equal"
    )
    for ex in result["examples"]:
        click.echo(
            f"  {ex['key']!r}: v{from_version} {orjson.dumps(ex['from']).decode()}  |  "
            f"v{to_version} {orjson.dumps(ex['to']).decode()}"
        )


async def _diff(
    app: App, url: str, old: Table[Any], new: Table[Any], sample: int, embedded: bool
) -> dict[str, Any]:
    from ..eventstore import open_store
    from ..verify.compare import as_json
    from ..verify.fold import fold

    store = await open_store(url)
    try:
        head = await store.head()
        keys = await store.sample_streams(sample)
        differ, examples = 0, list[dict[str, Any]]()
        for key in keys:
            a = as_json((await fold(app, store, old, key, as_of=head, embedded=embedded)).value)
            b = as_json((await fold(app, store, new, key, as_of=head, embedded=embedded)).value)
            if a != b:
                differ += 1
                if len(examples) < EXAMPLES:
                    examples.append({"key": key, "from": a, "to": b})
        return {
            "table": old.name,
            "from": old.version,
            "to": new.version,
            "store_position": head,
            "checked": len(keys),
            "differ": differ,
            "examples": examples,
        }
    finally:
        await store.close()
