"""Retired table versions: the durable record ``streamapp retire`` writes, how every
worker learns it, and the local stores a worker drops for it.

The record lives in the app's *ledger*, a small key/value log every worker reads at its
start and follows while it runs:

- Kafka: records of the compacted ``{app}-members`` topic under the key prefix
  :data:`PREFIX`. Every worker reads that topic from its start and follows it already
  (the views directory), ``streamapp topics create`` makes it, compaction keeps the last
  record of each key for good: no topic to add, nothing to migrate. Workers' own
  records are keyed by worker id, which never starts with the prefix.
- RabbitMQ and the event store alone (``STREAMAPP_BROKER=none``): the table
  ``streamapp_ledger`` of the event store's database, which an app with tables always
  has there (its tables rebuild from it), read by the worker now and every
  :data:`POLL_S` seconds.

Four kinds of record, under keys of their own so that none overwrites another:

- ``version/{label}``: a table version some worker's code declared, with the agent
  writing it and its changelog topic. Every worker writes its own at start. This is
  how a retire knows a version after its agent left the code.
- ``retired/{label}``: the retirement, written once by ``streamapp retire``.
- ``switched/{label}``: a ``switch="manual"`` version switched to, written once by
  ``streamapp versions switch``: from then on it may be the active version.
- ``stores/{host}:{data_dir}``: the table versions a worker's data directory holds (at
  its start, after a drop, every :data:`REPORT_S` seconds and as it stops), so that a
  retire's dry run names the stores on other hosts.
- ``views`` (the event store alone: its one worker): where the running worker serves its
  views, written at its start and cleared as it stops, so that ``streamapp tables`` and
  ``retire`` ask that worker (:func:`running_views`).

A worker that learns a retirement (at start, or while running) removes the local
stores holding that version: an agent directory of the data directory that no agent
of its code owns, whose every table is retired, and which no process holds open. A
store a lane uses is never dropped: its agent is in the code, so the worker declares
the version, and the retire was refused (a worker whose code declares a retired
version refuses to start). Views read :func:`streamapp.versions.retired.is_retired` (a leaf
module, below the engine).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ..errors import ConfigError
from ..eventstore import open_store
from ..settings.store_url import parse_url
from ..tables.layout import app_directory, lock_holders, partition_stores
from ..tables.layout import table_spaces as stored_tables
from .retired import TableVersion, learn
from .switched import learn_switches

if TYPE_CHECKING:
    from ..app import App
    from ..eventstore.base import EventStoreBackend
    from ..settings.settings import Settings

log = logging.getLogger("streamapp.retirement")

PREFIX = "streamapp.ledger/"
"""Where ledger records start (on the members topic: never a worker id)."""
POLL_S = 1.0
"""How often a worker reads a database ledger again (RabbitMQ, the event store alone)."""
REPORT_S = 30.0
"""How often a worker says what its data directory holds (also at start, after a drop
and as it stops): what a retire's dry run names of other hosts."""
REPORT_TIMEOUT_S = 5.0
"""How long a stopping worker tries to say it (a bound on the stop)."""


def label(name: str, version: int) -> str:
    """``name`` for version 1, ``name@vN`` above (``Table.label``)."""
    return name if version == 1 else f"{name}@v{version}"


def parse_label(text: str) -> TableVersion:
    """The ``(name, version)`` of a label (:func:`label`)."""
    name, sep, rest = text.rpartition("@v")
    if sep and name and rest.isdigit() and int(rest) > 1:
        return name, int(rest)
    return text, 1


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """A table version some worker's code declared: who writes it, where its changelog is."""

    table: str
    version: int
    agent: str
    changelog: str | None

    @property
    def key(self) -> str:
        return f"{PREFIX}version/{label(self.table, self.version)}"


@dataclass(frozen=True, slots=True)
class Retirement:
    """``streamapp retire``'s record of a retired table version."""

    table: str
    version: int
    at: str
    """When (ISO 8601, UTC), for people: no clock is compared."""
    agent: str | None = None
    changelog: str | None = None

    @property
    def key(self) -> str:
        return f"{PREFIX}retired/{label(self.table, self.version)}"


@dataclass(frozen=True, slots=True)
class Switch:
    """``streamapp versions switch``'s record: a manual table version may become active."""

    table: str
    version: int
    at: str
    """When (ISO 8601, UTC), for people: no clock is compared."""

    @property
    def key(self) -> str:
        return f"{PREFIX}switched/{label(self.table, self.version)}"

    def encode(self) -> bytes:
        return orjson.dumps({"table": self.table, "version": self.version, "at": self.at})


def encode(record: VersionRecord | Retirement) -> bytes:
    body: dict[str, Any] = {"table": record.table, "version": record.version}
    if isinstance(record, Retirement):
        body["at"] = record.at
    body |= {"agent": record.agent, "changelog": record.changelog}
    return orjson.dumps(body)


@dataclass(frozen=True, slots=True)
class StoresRecord:
    """The table versions whose local stores a worker's data directory holds, by agent
    directory (written at its start and after each drop): what a retire's dry run names
    of other hosts."""

    host: str
    data_dir: str
    tables: dict[str, list[str]]
    """Table label -> the agent directories holding it."""

    @classmethod
    def of(cls, body: dict[str, Any]) -> StoresRecord:
        tables = {str(t): [str(a) for a in agents] for t, agents in body["tables"].items()}
        return cls(str(body["host"]), str(body["data_dir"]), tables)

    @property
    def key(self) -> str:
        return f"{PREFIX}stores/{self.host}:{self.data_dir}"

    def encode(self) -> bytes:
        return orjson.dumps({"host": self.host, "data_dir": self.data_dir, "tables": self.tables})


def inventory(app_id: str, data_dir: Path) -> StoresRecord:
    """What ``data_dir`` holds of ``app_id`` now (each partition store's data spaces)."""
    tables: dict[str, list[str]] = {}
    root = app_directory(data_dir, app_id)
    for directory in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        held = {t for s in partition_stores(directory) for t in stored_tables(s)}
        for table in sorted(held):
            tables.setdefault(table, []).append(directory.name)
    return StoresRecord(socket.gethostname(), str(data_dir.resolve()), tables)


VIEWS_KEY = f"{PREFIX}views"
"""The ledger record naming the running worker's views (the event store alone)."""


def views_record(url: str | None, worker: str) -> bytes:
    """The ``views`` record: ``url`` served by ``worker`` (None: it stopped)."""
    return orjson.dumps({"url": url, "worker": worker})


def views_of(value: bytes | None) -> str | None:
    """The URL a ``views`` record names (None: no worker runs, or not a record of ours)."""
    try:
        url = orjson.loads(value).get("url") if value is not None else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return url if isinstance(url, str) else None


async def running_views(url: str, app_id: str) -> str | None:
    """Where the running worker of ``app_id`` on the event store ``url`` serves its views,
    as it recorded at its start (None: none recorded, or it stopped cleanly). A SQLite
    store that does not exist yet is not made: no worker ran on it."""
    where = parse_url(url)
    if where.kind == "sqlite" and (where.path is None or not where.path.exists()):
        return None
    store = await open_store(url)
    try:
        rows = await store.ledger_records(app_id)
    finally:
        await store.close()
    return next((views_of(v) for k, v in rows if k == VIEWS_KEY), None)


@dataclass
class LedgerState:
    """Every table version declared so far, every retirement and every switch, by table
    version."""

    versions: dict[TableVersion, VersionRecord] = field(default_factory=dict)
    retired: dict[TableVersion, Retirement] = field(default_factory=dict)
    switched: dict[TableVersion, Switch] = field(default_factory=dict)
    """The manual versions switched to (``streamapp versions switch``)."""
    stores: dict[str, StoresRecord] = field(default_factory=dict)
    """What each data directory held when its worker last looked, by host:directory."""
    views: str | None = None
    """Where the running worker serves its views (the ``views`` record; None: none runs)."""

    def apply(self, key: str, value: bytes | None) -> Retirement | None:
        """Take one record; the retirement it is when it is a new one."""
        if key == VIEWS_KEY:
            self.views = views_of(value)
            return None
        kind, _, name = key.removeprefix(PREFIX).partition("/")
        if not key.startswith(PREFIX) or not name or value is None:
            return None
        try:
            body = orjson.loads(value)
            if kind == "stores":
                self.stores[name] = StoresRecord.of(body)
                return None
            table, version = str(body["table"]), int(body["version"])
            agent, changelog = body.get("agent"), body.get("changelog")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("ledger record %s is not one this streamapp reads; ignored", key)
            return None
        agent = None if agent is None else str(agent)
        changelog = None if changelog is None else str(changelog)
        if kind == "version" and agent is not None:
            self.versions[(table, version)] = VersionRecord(table, version, agent, changelog)
        elif kind == "switched" and (table, version) not in self.switched:
            self.switched[(table, version)] = Switch(table, version, str(body.get("at", "")))
        elif kind == "retired":
            new = (table, version) not in self.retired
            retirement = Retirement(table, version, str(body.get("at", "")), agent, changelog)
            self.retired[(table, version)] = retirement
            return retirement if new else None
        return None

    @classmethod
    def of(cls, records: Iterable[tuple[str, bytes | None]]) -> LedgerState:
        state = cls()
        for key, value in records:
            state.apply(key, value)
        return state


class LedgerBackend(Protocol):
    """Where a transport keeps the ledger: keys and values, last write wins."""

    async def records(self) -> list[tuple[str, bytes | None]]:
        """Every record so far, in order."""

    async def put(self, key: str, value: bytes) -> None:
        """Write one record, durably (confirmed) when this returns."""

    def updates(self) -> AsyncIterator[list[tuple[str, bytes | None]]]:
        """Records written after :meth:`records` read, as they come (until cancelled)."""

    async def close(self) -> None: ...


class StoreLedger:
    """The ledger in the event store's database (``streamapp_ledger``), for transports
    without a durable log of their own (RabbitMQ, the event store alone)."""

    def __init__(self, store: EventStoreBackend, app_id: str, *, poll_s: float = POLL_S):
        self.store, self.app_id, self.poll_s = store, app_id, poll_s
        self._seen: dict[str, bytes | None] = {}

    @classmethod
    async def open(cls, url: str, app_id: str) -> StoreLedger:
        return cls(await open_store(url), app_id)

    async def records(self) -> list[tuple[str, bytes | None]]:
        rows = await self.store.ledger_records(self.app_id)
        self._seen = dict(rows)
        return list(rows)

    async def put(self, key: str, value: bytes) -> None:
        await self.store.put_ledger_record(self.app_id, key, value)

    async def updates(self) -> AsyncIterator[list[tuple[str, bytes | None]]]:
        while True:
            await asyncio.sleep(self.poll_s)
            rows = await self.store.ledger_records(self.app_id)
            new = [(k, v) for k, v in rows if self._seen.get(k) != v]
            self._seen.update(new)
            if new:
                yield list(new)

    async def close(self) -> None:
        await self.store.close()


# what a worker declares, refuses and drops ------------------------------------------
def declared(app: App, changelogs: bool) -> list[VersionRecord]:
    """The table versions ``app``'s code declares, with their agents and changelogs."""
    out = []
    for agent, table in app.tables.values():
        changelog = app.changelog_topic(agent) if changelogs else None
        out.append(VersionRecord(table.name, table.version, agent.name, changelog))
    return out


def refuse_declared(app: App, app_ref: str, retired: Mapping[TableVersion, Retirement]) -> None:
    """ConfigError when ``app``'s code declares a retired version (its changelog and
    stores are gone: a worker would rebuild and serve what was retired)."""
    for record in declared(app, changelogs=False):
        done = retired.get((record.table, record.version))
        if done is not None:
            raise ConfigError(
                f"table {record.table!r} version {record.version} of app {app.id!r} was "
                f"retired ({done.at or 'by streamapp retire'}), but agent {record.agent!r} "
                f"of {app_ref} still writes it: remove that agent from the code, or write "
                f"the next version of the table (Table({record.table!r}, version=N)) "
                "to build it again"
            )


@dataclass(frozen=True, slots=True)
class LocalStores:
    """An agent directory of a data directory holding retired table versions."""

    directory: Path
    tables: frozenset[TableVersion]
    stores: tuple[Path, ...]
    kept: str = ""
    """Why it stays ('': it goes)."""


def local_stores(app: App, data_dir: Path, retired: Iterable[TableVersion]) -> list[LocalStores]:
    """The agent directories under ``data_dir`` that hold a table version of ``retired``
    (each partition store's data spaces, read without opening it), and whether each
    can go: never one of an agent of the code, one holding a table not retired, or one
    a process holds open."""
    gone = set(retired)
    root = app_directory(Path(data_dir), app.id)
    if not gone or not root.is_dir():
        return []
    out = []
    for directory in sorted(p for p in root.iterdir() if p.is_dir()):
        stores = tuple(partition_stores(directory))
        held = frozenset(parse_label(t) for s in stores for t in stored_tables(s))
        if not held & gone:
            continue
        kept = ""
        if directory.name in app.agents:
            kept = f"agent {directory.name!r} of the code uses it"
        elif held - gone:
            others = ", ".join(label(*t) for t in sorted(held - gone))
            kept = f"it also holds table(s) not retired: {others}"
        elif holders := lock_holders(stores):
            kept = f"a process holds it open (pid {', '.join(map(str, set(holders.values())))})"
        out.append(LocalStores(directory, held & gone, stores, kept))
    return out


def drop_local(app: App, data_dir: Path, retired: Iterable[TableVersion]) -> list[Path]:
    """Remove the agent directories :func:`local_stores` says can go; the ones removed."""
    removed = []
    for found in local_stores(app, data_dir, retired):
        tables = ", ".join(label(*t) for t in sorted(found.tables))
        if found.kept:
            log.warning("retired %s: left %s (%s)", tables, found.directory, found.kept)
            continue
        shutil.rmtree(found.directory, ignore_errors=True)
        log.info("retired %s: removed its local stores %s", tables, found.directory)
        removed.append(found.directory)
    return removed


class RetirementWatch:
    """A worker's side of the ledger: at start, refuse a retired version in the code,
    drop retired versions' local stores and declare the code's versions; while running,
    drop the stores of each retirement as it is heard of. ``views``: ``(url, worker id)``
    of this worker's views, said at start and cleared at stop for the CLI to find (the
    event store alone: its one worker); None: not said."""

    def __init__(
        self,
        app: App,
        settings: Settings,
        app_ref: str,
        backend: LedgerBackend | None,
        changelogs: bool,
        views: tuple[str, str] | None = None,
    ) -> None:
        self.app, self.settings, self.app_ref = app, settings, app_ref
        self.backend, self.changelogs = backend, changelogs
        self.views = views
        self.state = LedgerState()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        backend = self.backend
        if backend is None:
            return
        self.state = LedgerState.of(await backend.records())
        learn_switches(self.app.id, self.state.switched)
        refuse_declared(self.app, self.app_ref, self.state.retired)
        self._retire(self.state.retired)
        for record in declared(self.app, self.changelogs):
            if self.state.versions.get((record.table, record.version)) != record:
                await backend.put(record.key, encode(record))
        await self._report(backend)
        if self.views is not None:
            await backend.put(VIEWS_KEY, views_record(*self.views))
        self._tasks = [
            asyncio.create_task(self._follow(backend), name="retirements"),
            asyncio.create_task(self._refresh(backend), name="local stores said"),
        ]

    async def _report(self, backend: LedgerBackend) -> None:
        """Say what this data directory holds now, when it changed."""
        held = await asyncio.to_thread(inventory, self.app.id, Path(self.settings.data_dir))
        if self.state.stores.get(held.key.removeprefix(f"{PREFIX}stores/")) != held:
            await backend.put(held.key, held.encode())

    def _retire(self, retired: Iterable[TableVersion]) -> None:
        retired = list(retired)
        learn(self.app.id, retired)
        mine = {(r.table, r.version): r.agent for r in declared(self.app, changelogs=False)}
        for version in retired:
            if version in mine:
                log.error(
                    "table %s was retired while agent %r of this worker writes it (the "
                    "retire raced this worker's start): its stores are kept; remove the "
                    "agent from the code",
                    label(*version),
                    mine[version],
                )
        drop_local(self.app, Path(self.settings.data_dir), retired)

    async def _follow(self, backend: LedgerBackend) -> None:
        while True:
            try:
                async for records in backend.updates():
                    new = [r for k, v in records if (r := self.state.apply(k, v)) is not None]
                    learn_switches(self.app.id, self.state.switched)
                    if new:
                        await asyncio.to_thread(self._retire, [(r.table, r.version) for r in new])
                        await self._report(backend)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broker or database error: read on, later
                log.warning("following the ledger failed (%r); again in %.0fs", exc, POLL_S)
                await asyncio.sleep(POLL_S)

    async def _refresh(self, backend: LedgerBackend) -> None:
        while True:
            await asyncio.sleep(REPORT_S)
            try:
                await self._report(backend)
            except Exception as exc:  # a broker or database error: said again later
                log.info("saying what %s holds failed (%r)", self.settings.data_dir, exc)

    async def stop(self) -> None:
        """Stop following; say what the data directory holds as the worker leaves it."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.backend is None:
            return
        try:
            if self._tasks:
                async with asyncio.timeout(REPORT_TIMEOUT_S):
                    if self.views is not None:  # no worker serves there any more
                        await self.backend.put(VIEWS_KEY, views_record(None, self.views[1]))
                    await self._report(self.backend)
        except Exception as exc:  # best effort: the next start says it again
            log.info("saying what %s holds failed (%r)", self.settings.data_dir, exc)
        finally:
            await self.backend.close()
