"""``streamapp verify``: a live table checked, key by key, against its rebuild from the
event store through the app's current handler (:mod:`streamapp.verify.compare`), while
the workers run.

The live side is read through a worker's views (any worker: a key is forwarded to its
owner), one committed read per key with ``?meta=1`` (value and stream version
together); the rebuild folds the key's stream from the store up to that stream version,
in this process. Exits 1 when a key differs or is missing on one side.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import click
import orjson

from ..app import App
from ..errors import StreamappError
from ..tables.table import Table
from ..topics import TopicSpec
from ..transports.base import transports
from .main import app_option, load_app, main
from .tables import url_option, worker_url

if TYPE_CHECKING:
    from ..eventstore.base import EventStore
    from ..verify.compare import Verification

PAGE = 10_000
"""Stream ids read from the store per request while listing partitions' streams."""
RETRIES = 20
"""Answers of 503 (a rebalance, a partition restoring) a key is asked again after."""
RETRY_S = 0.5


@main.command("verify")
@app_option
@click.argument("table")
@click.option("--version", "version", type=int, help="The table version (default: its highest).")
@click.option("--partitions", help="Only the streams of these partitions, e.g. 0,3.")
@click.option("--sample", type=int, help="K streams picked at random from the store.")
@url_option
@click.option("--json", "as_json", is_flag=True, help="The summary and differences as JSON.")
@click.option(
    "--report",
    is_flag=True,
    help="Tell the worker asked (its /metrics: streamapp_verify_last_differences).",
)
def verify_command(
    app_ref: str,
    table: str,
    version: int | None,
    partitions: str | None,
    sample: int | None,
    url: str | None,
    as_json: bool,
    report: bool,
) -> None:
    """Rebuild TABLE's streams from the event store and compare them with the live table."""
    if partitions and sample:
        raise click.ClickException("give --partitions or --sample, not both")
    if sample is not None and sample < 1:
        raise click.ClickException(f"--sample {sample}: give 1 or more streams")
    app = load_app(app_ref)
    chosen = _table(app, table, version)
    settings = app.settings()
    views = url or worker_url(app, settings)
    embedded = transports[settings.broker].capabilities.embedded
    wanted = _partitions(partitions, app, chosen)
    try:
        result = asyncio.run(
            _run(app, settings.event_store, chosen, views, sample, wanted, embedded)
        )
        if report:
            asyncio.run(_report(views, result))
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(orjson.dumps(result.as_dict() | {"summary": result.summary()}).decode())
    else:
        click.echo(result.summary())
        for d in result.examples:
            click.echo(
                f"  {d.kind} {d.key!r} at stream version {d.stream_version} (store position "
                f"{d.position}): live {orjson.dumps(d.live).decode()}, rebuilt "
                f"{orjson.dumps(d.rebuilt).decode()}"
            )
    if not result.ok:
        raise SystemExit(1)


async def _report(views: str, result: Verification) -> None:
    """POST the counts to the worker's ``/verify/report`` (its metric)."""
    import aiohttp

    token = os.environ.get("STREAMAPP_WEB_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = result.as_dict()
    del body["differences"]
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
            http.post(views.rstrip("/") + "/verify/report", json=body, headers=headers) as r,
        ):
            if r.status != 200:
                raise StreamappError(
                    f"--report: the worker at {views} answered {r.status}: "
                    f"{(await r.read()).decode(errors='replace')}"
                )
    except aiohttp.ClientError as exc:
        raise StreamappError(f"--report: cannot reach a worker at {views}: {exc}") from exc


def _table(app: App, name: str, version: int | None) -> Table[Any]:
    versions = {t.version: t for _, t in app.tables.values() if t.name == name}
    if not versions:
        names = sorted({t.name for _, t in app.tables.values()})
        raise click.ClickException(f"app {app.id!r} has no table {name!r} (tables: {names})")
    chosen = max(versions) if version is None else version
    if chosen not in versions:
        raise click.ClickException(
            f"table {name!r} has no version {chosen} in the app's code (versions: "
            f"{sorted(versions)})"
        )
    return versions[chosen]


def _partitions(raw: str | None, app: App, table: Table[Any]) -> set[int] | None:
    if not raw:
        return None
    count = app.tables[table.label][0].topic.partitions
    try:
        wanted = {int(p) for p in raw.split(",") if p.strip()}
    except ValueError:
        raise click.ClickException(f"--partitions {raw!r}: give numbers, e.g. 0,3") from None
    if not wanted or not all(0 <= p < count for p in wanted):
        raise click.ClickException(f"--partitions {raw!r}: the table has partitions 0-{count - 1}")
    return wanted


async def _run(
    app: App,
    url: str,
    table: Table[Any],
    views: str,
    sample: int | None,
    partitions: set[int] | None,
    embedded: bool,
) -> Verification:
    import aiohttp

    from ..eventstore import open_store  # the command line starts without them
    from ..verify.compare import verify

    store = await open_store(url)
    try:
        keys = await _keys(store, app, table, sample, partitions)
        token = os.environ.get("STREAMAPP_WEB_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:

            async def live(key: str) -> tuple[Any, int]:
                path = f"/tables/{quote(table.name, safe='')}/{quote(key, safe='')}"
                params = {"meta": "1", "version": str(table.version)}
                for _ in range(RETRIES):
                    try:
                        async with http.get(views.rstrip("/") + path, params=params) as r:
                            body = await r.read()
                            if r.status == 200:
                                meta = orjson.loads(body)
                                return meta["value"], int(meta["stream_version"])
                            if r.status == 404 and "X-Streamapp-Version" in r.headers:
                                return None, int(r.headers["X-Streamapp-Version"])
                            if r.status != 503:
                                raise StreamappError(
                                    f"worker at {views} answered {r.status} for key {key!r} "
                                    f"of table {table.label!r}: {body.decode(errors='replace')}"
                                )
                    except aiohttp.ClientError as exc:
                        raise StreamappError(
                            f"cannot reach a worker at {views}: {exc}; give its views with --url"
                        ) from exc
                    await asyncio.sleep(RETRY_S)
                raise StreamappError(
                    f"key {key!r} of table {table.label!r}: the workers answered 503 "
                    f"{RETRIES} times (a rebalance, a partition restoring): run verify again"
                )

            return await verify(app, store, table, keys, live, embedded=embedded)
    finally:
        await store.close()


async def _keys(
    store: EventStore, app: App, table: Table[Any], sample: int | None, partitions: set[int] | None
) -> list[str]:
    """The streams to check: a random sample, those of some partitions, or all."""
    if sample is not None:
        return await store.sample_streams(sample)
    topic = app.tables[table.label][0].topic
    keys: list[str] = []
    after = ""
    while page := await store.stream_ids(after, PAGE):
        keys += [
            k for k in page if partitions is None or topic.partition_of(k.encode()) in partitions
        ]
        after = page[-1]
    random.shuffle(keys)  # spread the requests over the owners
    return keys


def _partition(topic: TopicSpec, key: str) -> int:
    return topic.partition_of(key.encode())
