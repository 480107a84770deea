"""``streamapp tables``: each table version's state on a running worker, the app's
tables (``list``), or a key's value or a whole table (``get``, ``scan``)."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import quote

import click
import orjson

from ..errors import StreamappError
from ..transport import transports
from .main import load_app, main

DEFAULT_URL = "http://127.0.0.1:6066"
url_option = click.option(
    "--url",
    help="A worker's views (any worker); default: the app's web_host:web_port "
    f"(STREAMAPP_WEB_HOST, STREAMAPP_WEB_PORT), else {DEFAULT_URL}.",
)
tables_app_option = click.option(
    "-A",
    "--app",
    "app_ref",
    help="MODULE[:ATTRIBUTE] of the App: lists its tables, and its "
    "settings give the views' address.",
)


@main.group("tables", invoke_without_command=True)
@tables_app_option
@url_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per version.")
@click.pass_context
def tables_group(ctx: click.Context, app_ref: str | None, url: str | None, as_json: bool) -> None:
    """Ask a running worker for each table version's state (token: STREAMAPP_WEB_TOKEN):
    one line per version, ``TABLE vN STATE LIVE/TOTAL`` (live partitions of all).
    ``tables list`` lists the app's tables without a worker."""
    if ctx.invoked_subcommand is None:
        _print_versions(_views_url(ctx, url, app_ref), as_json)


@tables_group.command("list")
@tables_app_option
@click.pass_context
def tables_list(ctx: click.Context, app_ref: str | None) -> None:
    """Print the app's tables: name, version, partitions, agent, changelog topic."""
    _list_tables(_tables_app_ref(ctx, app_ref))


def _print_versions(url: str, as_json: bool) -> None:
    """The versions of ``GET /tables`` on the worker at ``url``, one line each."""
    body = orjson.loads(_ask(url, "/tables", {}))
    for table in body["tables"]:
        for v in table.get("versions", []):
            if as_json:
                click.echo(orjson.dumps({"table": table["name"], **v}).decode())
                continue
            line = f"{table['name']} v{v['version']} {v['state']} {v['live']}/{v['total']}"
            progress = v.get("progress")
            if progress and progress.get("store_position") is not None:
                head = progress.get("head")
                of = f" of {head}" if head is not None else ""
                line += f" (replay at store position {progress['store_position']}{of})"
            click.echo(line)


def _tables_app_ref(ctx: click.Context, app_ref: str | None) -> str | None:
    """``-A`` after ``get``/``scan``/``list``, after ``tables``, or before it."""
    for scope in (ctx, ctx.parent, ctx.find_root()):
        if app_ref or scope is None:
            break
        app_ref = scope.params.get("app_ref")
    return app_ref


def _list_tables(app_ref: str | None) -> None:
    if not app_ref:
        raise click.ClickException(
            "streamapp tables: give the app with -A MODULE[:ATTRIBUTE], e.g. "
            "streamapp tables -A agents.orders:app"
        )
    app = load_app(app_ref)
    try:
        broker = app.settings().broker
        changelogs = transports[broker].capabilities.changelog
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc
    if not app.tables:
        click.echo(f"app {app.id!r} has no tables", err=True)
    for name, (agent, table) in app.tables.items():
        version = getattr(table, "version", None)
        changelog = app.changelog_topic(agent) if changelogs else None
        row = [
            name,
            *([] if version in (None, 1) else [f"version {version}"]),
            f"{agent.topic.partitions} partitions",
            f"agent {agent.name}",
            f"changelog {changelog}"
            if changelog
            else f"no changelog (broker {broker}: rebuilt from the event store)",
        ]
        click.echo("\t".join(row))


def _views_url(ctx: click.Context, url: str | None, app_ref: str | None) -> str:
    """``--url``, else the views of the app's settings (``-A``), else of
    STREAMAPP_WEB_HOST / STREAMAPP_WEB_PORT, else the default port on loopback."""
    if url:
        return url
    app_ref = _tables_app_ref(ctx, app_ref)
    if app_ref:
        try:
            settings = load_app(app_ref).settings()
        except StreamappError as exc:
            raise click.ClickException(str(exc)) from exc
        host, port = settings.web_host, str(settings.web_port)
    else:
        host = os.environ.get("STREAMAPP_WEB_HOST") or "127.0.0.1"
        port = os.environ.get("STREAMAPP_WEB_PORT") or DEFAULT_URL.rsplit(":", 1)[1]
    if port == "0":
        raise click.ClickException(
            "web_port (STREAMAPP_WEB_PORT) is 0, any free port: give the worker's views "
            "with --url http://HOST:PORT (its start line names them)"
        )
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


@tables_group.command("get")
@click.argument("table")
@click.argument("key")
@url_option
@tables_app_option
@click.option("--min-version", type=int, help="Wait for the key's stream version (up to 5 s).")
@click.option("--meta", is_flag=True, help="With partition, phase, version and checkpoint.")
@click.pass_context
def tables_get(
    ctx: click.Context,
    table: str,
    key: str,
    url: str | None,
    app_ref: str | None,
    min_version: int | None,
    meta: bool,
) -> None:
    """Print KEY's committed value in TABLE as JSON."""
    url = _views_url(ctx, url, app_ref)
    params = {"meta": "1"} if meta else {}
    if min_version is not None:
        params["min_version"] = str(min_version)
    path = f"/tables/{quote(table, safe='')}/{quote(key, safe='')}"
    click.echo(_ask(url, path, params).decode())


@tables_group.command("scan")
@click.argument("table")
@url_option
@tables_app_option
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", type=int, default=100, show_default=True, help="Items per request.")
@click.pass_context
def tables_scan(
    ctx: click.Context, table: str, url: str | None, app_ref: str | None, prefix: str, limit: int
) -> None:
    """Print every item of TABLE (merged across the workers), one JSON line each, page by page."""
    url = _views_url(ctx, url, app_ref)
    cursor = ""
    while True:
        params = {"prefix": prefix, "limit": str(limit), "cursor": cursor}
        page = orjson.loads(_ask(url, f"/tables/{quote(table, safe='')}", params))
        for item in page["items"]:
            click.echo(orjson.dumps(item).decode())
        if not page.get("cursor"):
            return
        cursor = page["cursor"]


def _ask(url: str, path: str, params: dict[str, str]) -> bytes:
    """GET a worker's view; a non-200 answer is printed (JSON) and exits 1."""
    import aiohttp

    token = os.environ.get("STREAMAPP_WEB_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def get() -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url.rstrip("/") + path, params=params, headers=headers) as r,
        ):
            return r.status, await r.read()

    try:
        status, body = asyncio.run(get())
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise click.ClickException(f"cannot reach a worker at {url}: {exc}") from exc
    if status != 200:
        click.echo(body.decode(errors="replace"), err=True)
        raise click.ClickException(f"worker at {url} answered {status}")
    return body
