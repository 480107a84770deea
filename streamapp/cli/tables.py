"""``streamapp tables``: each table version's state on a running worker, the app's
tables (``list``), or a key's value or a whole table (``get``, ``scan``)."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import quote

import click
import orjson

from ..app import App
from ..errors import StreamappError
from ..settings.settings import Settings
from ..transports.base import transports
from ..versions.ledger import running_views
from .main import load_app, main

DEFAULT_URL = "http://127.0.0.1:6066"
url_option = click.option(
    "--url",
    help="A worker's views (any worker); default: with STREAMAPP_BROKER=none the running "
    "worker's (it records them in the event store), else the app's web_host:web_port "
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
    one line per version, ``TABLE vN STATE LIVE/TOTAL`` (live partitions of all). When
    no worker answers, the app's (``-A``) tables are listed without their states.
    ``tables list`` lists the app's tables without a worker."""
    if ctx.invoked_subcommand is not None:
        return
    views = _views_url(ctx, url, app_ref)
    app_ref = _tables_app_ref(ctx, app_ref)
    unreachable = _print_versions(views, as_json, offline=app_ref is not None)
    if unreachable is not None and app_ref is not None:
        _print_offline(app_ref, as_json)
        click.echo(
            f"{unreachable}: no worker answers for these versions' states; start one, "
            "or give its views with --url",
            err=True,
        )


def _print_offline(app_ref: str, as_json: bool) -> None:
    """The app's table versions as its code declares them, without a worker."""
    app = load_app(app_ref)
    for agent, table in app.tables.values():
        row = {
            "table": table.name,
            "version": table.version,
            "partitions": agent.topic.partitions,
            "agent": agent.name,
            "state": None,
        }
        if as_json:
            click.echo(orjson.dumps(row).decode())
        else:
            click.echo(
                f"{table.name} v{table.version} (state unknown) "
                f"{agent.topic.partitions} partitions, agent {agent.name}"
            )


@tables_group.command("list")
@tables_app_option
@click.pass_context
def tables_list(ctx: click.Context, app_ref: str | None) -> None:
    """Print the app's tables: name, version, partitions, agent, changelog topic."""
    _list_tables(_tables_app_ref(ctx, app_ref))


def _print_versions(url: str, as_json: bool, *, offline: bool = False) -> str | None:
    """The versions of ``GET /tables`` on the worker at ``url``, one line each. With
    ``offline``, a worker that does not answer is not an error: returns why (None: it
    answered)."""
    answer = _get(url, "/tables", {})
    if isinstance(answer, str):
        if offline:
            return answer
        raise click.ClickException(answer)
    body = orjson.loads(_answered(url, *answer))
    held = _held_per_agent(url, body) if not as_json else {}
    for table in body["tables"]:
        for v in table.get("versions", []):
            if as_json:
                click.echo(orjson.dumps({"table": table["name"], **v}).decode())
                continue
            line = f"{table['name']} v{v['version']} {v['state']} {v['live']}/{v['total']}"
            line += _held_line(str(table.get("agent")), held.get(str(table.get("agent"))))
            progress = v.get("progress")
            if progress and progress.get("store_position") is not None:
                head = progress.get("head")
                of = f" of {head}" if head is not None else ""
                line += f" (replay at store position {progress['store_position']}{of})"
            click.echo(line)
    return None


def _held_per_agent(url: str, tables: dict[str, Any]) -> dict[str, dict[str, tuple[int, int]]]:
    """Per agent, each worker's held streams and events (those holding any), gathered
    from every worker of the group (:func:`group_status`; ``tables`` is the first
    worker's ``GET /tables``)."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for worker, _, status in group_status(url, tables):
        for agent, counts in status.get("agents", {}).items():
            streams, events = counts.get("held_streams", 0), counts.get("held_events", 0)
            if streams:
                out.setdefault(agent, {})[worker] = (streams, events)
    return out


def _held_line(agent: str, per_worker: dict[str, tuple[int, int]] | None) -> str:
    """``, N held streams of agent A (M events; worker W: n, ...)`` (empty: none held):
    which workers answered with how many."""
    if not per_worker:
        return ""
    streams = sum(n for n, _ in per_worker.values())
    events = sum(m for _, m in per_worker.values())
    workers = ", ".join(f"{w}: {n}" for w, (n, _) in sorted(per_worker.items()))
    return f", {streams} held streams of agent {agent} ({events} events; worker {workers})"


def group_status(
    url: str, tables: dict[str, Any] | None = None
) -> list[tuple[str, str, dict[str, Any]]]:
    """``GET /status`` of every worker of the group, as (worker id, views URL, answer),
    the one at ``url`` first: the others are the owners of the partitions it does not
    own, as its ``GET /tables`` (``tables``: read already) names them from the members
    directory; each worker once (by id). A worker that does not answer is said on
    stderr, its counts missing; the one at ``url`` must answer (else exit 1)."""
    first = orjson.loads(_ask(url, "/status", {}))
    if tables is None:
        tables = orjson.loads(_ask(url, "/tables", {}))
    found = [(str(first.get("worker")), url, first)]
    seen = {found[0][0]}
    owners = {
        owner
        for table in tables.get("tables", [])
        for owner in (table.get("owners") or {}).values()
        if owner and owner.rstrip("/") != url.rstrip("/")
    }
    for owner in sorted(owners):
        answer = _get(owner, "/status", {})
        if isinstance(answer, str) or answer[0] != 200:
            why = answer if isinstance(answer, str) else f"it answered {answer[0]}"
            click.echo(
                f"worker at {owner} did not answer ({why}): its counts are missing", err=True
            )
            continue
        body = orjson.loads(answer[1])
        worker = str(body.get("worker"))
        if worker not in seen:
            seen.add(worker)
            found.append((worker, owner, body))
    return found


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
    """``--url`` (after ``get``/``scan`` or after ``tables``), else the views of the
    app's running worker (``-A``) or of its settings, else of STREAMAPP_WEB_HOST /
    STREAMAPP_WEB_PORT, else the default port on loopback."""
    for scope in (ctx, ctx.parent):
        if url or scope is None:
            break
        url = scope.params.get("url")
    if url:
        return str(url)
    app_ref = _tables_app_ref(ctx, app_ref)
    if app_ref:
        app = load_app(app_ref)
        return worker_url(app, _settings(app))
    host = os.environ.get("STREAMAPP_WEB_HOST") or "127.0.0.1"
    port = os.environ.get("STREAMAPP_WEB_PORT") or DEFAULT_URL.rsplit(":", 1)[1]
    return _loopback(host, port)


def _settings(app: App) -> Settings:
    try:
        return app.settings()
    except StreamappError as exc:
        raise click.ClickException(str(exc)) from exc


def worker_url(app: App, settings: Settings) -> str:
    """Where ``app``'s worker serves its views: with STREAMAPP_BROKER=none, the one the
    running worker recorded in the event store's ledger; else (or none recorded) the
    address of setting web_host / web_port."""
    if transports[settings.broker].capabilities.embedded and app.tables:
        try:
            running = asyncio.run(running_views(settings.event_store, app.id))
        except StreamappError as exc:
            raise click.ClickException(str(exc)) from exc
        if running is not None:
            return running
    return _loopback(settings.web_host, str(settings.web_port))


def _loopback(host: str, port: str) -> str:
    """The views at ``host:port``, a wildcard address as this host's loopback."""
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
    """GET a worker's view; no answer, or a non-200 one (printed, JSON), exits 1."""
    answer = _get(url, path, params)
    if isinstance(answer, str):
        raise click.ClickException(answer)
    return _answered(url, *answer)


def _answered(url: str, status: int, body: bytes) -> bytes:
    if status != 200:
        click.echo(body.decode(errors="replace"), err=True)
        raise click.ClickException(f"worker at {url} answered {status}")
    return body


def _get(url: str, path: str, params: dict[str, str]) -> tuple[int, bytes] | str:
    """GET a worker's view: its status and body, or why no worker answered."""
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
        return asyncio.run(get())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"cannot reach a worker at {url}: {exc}"
