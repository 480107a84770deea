"""The agent contract over the event store alone (``STREAMAPP_BROKER=none``).

An in-process :class:`~streamapp.worker.Worker` owns every partition and follows the
store through its one feed; the harness appends through a store connection of its own,
as another process would. The store is the source, so its rules are the transport's:

- it takes CloudEvents only, each with a stream id: ``send_raw`` decodes a record as the
  Kafka codec would (binary or structured mode) and raises the DecodeError, or the
  InvalidEventError for a missing stream id, instead of appending;
- stream versions are dense and checked (optimistic concurrency): an event that carries
  a ``streamversion`` other than its stream's next one raises ConcurrencyError;
- positions are the store's global positions (``position_of``), one order for all
  partitions, and "settled" means a partition's committed store position (its
  checkpoint) is past the event.

Tables are read over the worker's HTTP views (committed state), parked copies from the
store's ``streamapp_parked`` table.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from streamapp import App, Event
from streamapp.codecs import kafka as codec
from streamapp.codecs import structured
from streamapp.engine.phase import Phase
from streamapp.engine.task import PartitionTask
from streamapp.errors import InvalidEventError
from streamapp.eventstore import EventStoreBackend, open_store, parse_url
from streamapp.topics import partition_for
from streamapp.worker import Worker
from tests.support.waits import until

from .harness import AgentHarness, Parked, counter, read_view

_INSERT = (
    "INSERT INTO streamapp_events (stream_id, version, payload) VALUES (%s, "
    "(SELECT coalesce(max(version), 0) + 1 FROM streamapp_events WHERE stream_id = %s), %s)"
)

FAST = {"poll_timeout_ms": 100, "rebalance_timeout_ms": 20_000, "shutdown_timeout_s": 20.0}
"""Short settings: a test waits on polls and pauses, never on defaults made for production."""


class StoreHarness(AgentHarness):
    """``url`` is the event store (a SQLite file, a PostgreSQL schema); ``data_dir`` the
    worker's table stores."""

    redeliver_pause_s = 0.5
    stateless_calls_exact = True  # one process, positions in memory: nothing re-handled

    def __init__(self, url: str, data_dir: Path) -> None:
        super().__init__()
        self.url, self.data_dir = url, data_dir
        self.worker: Worker | None = None
        self._store: EventStoreBackend | None = None
        self._http: aiohttp.ClientSession | None = None
        self._appended: list[tuple[int, str]] = []
        """``(position, stream id)`` of every event appended, in send order."""

    def new_app(self, **settings: Any) -> App:
        return App(
            "contract-store",
            broker="none",
            event_store=self.url,
            data_dir=self.data_dir,
            web_port=0,
            **{**FAST, **settings},
        )

    def name(self, base: str) -> str:
        return base  # one store per test: names need not be unique

    async def start(self, app: App) -> None:
        self.app = app
        self._store = await open_store(self.url)
        self._http = aiohttp.ClientSession()
        worker = Worker(app, app.settings())
        await worker.start()  # stops what it started when it fails
        self.worker = worker
        # A stateless partition starts at the head when it goes live (new events only,
        # like a new consumer group): wait for that, or the first sends could precede it.
        await until(
            self._tasks_live,
            what="every partition live",
            progress=lambda: repr(self._status()),
            stalled_s=30,
            poll_s=0.02,
            detail=self._status,
        )

    async def stop(self) -> None:
        worker, self.worker = self.worker, None
        try:
            if worker is not None:
                await worker.stop()
        finally:
            if self._store is not None:
                await self._store.close()
            if self._http is not None:
                await self._http.close()
            self._store = self._http = None

    @property
    def store(self) -> EventStoreBackend:
        assert self._store is not None, "start the app first"
        return self._store

    def _tasks(self) -> dict[tuple[str, int], PartitionTask]:
        assert self.worker is not None, "start the app first"
        assert self.worker.source is not None
        return dict(self.worker.source.assignment.tasks)

    def _tasks_live(self) -> bool:
        assert self.app is not None
        tasks = self._tasks()
        n = sum(t.partitions for t in self.app.sources.values())
        return len(tasks) == n and all(t.phase is Phase.LIVE for t in tasks.values())

    def _status(self) -> dict[str, object]:
        return {t.name: t.status() for _, t in sorted(self._tasks().items())}

    # feeding -------------------------------------------------------------------------
    async def send(self, event: Event, *, topic: str | None = None) -> None:
        """Append ``event`` to its stream; a carried ``streamversion`` is checked (the
        store is one stream for every topic: ``topic`` is not used)."""
        sid = event.stream_id
        if sid is None:
            raise InvalidEventError(
                f"event {event.id} has no stream id: set its streamid extension (or subject)"
            )
        result = await self.store.append(sid, [event])
        self._appended.append((result.position, sid))

    async def send_raw(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        topic: str | None = None,
    ) -> None:
        """Append a record as the CloudEvent it encodes; raises what refuses it. The store
        is one stream for every topic: every agent sees it (``topic`` is not used)."""
        await self.send(codec.decode(key, value, headers))

    async def write_around_store(self, stream_id: str, payload: bytes) -> None:
        """Insert a row with SQL, bypassing the store's checks (another tool, a damaged
        file): the stream's next version, the next position."""
        parsed = parse_url(self.url)
        if parsed.path is not None:
            path = parsed.path

            def insert() -> int:
                with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
                    cur = conn.execute(_INSERT.replace("%s", "?"), (stream_id, stream_id, payload))
                    return int(cur.lastrowid or 0)

            position = await asyncio.to_thread(insert)
        else:
            import psycopg

            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                cur = await conn.execute(
                    _INSERT.replace("(stream_id,", "(position, stream_id,").replace(
                        "VALUES (",
                        "VALUES ((SELECT coalesce(max(position), 0) + 1 FROM streamapp_events), ",
                    )
                    + " RETURNING position",
                    (stream_id, stream_id, payload),
                )
                row = await cur.fetchone()
                assert row is not None
                position = int(row[0])
        self._appended.append((position, stream_id))

    async def position_of(self, i: int) -> int:
        return self._appended[i][0]

    async def value_of(self, i: int) -> bytes | None:
        """The stored payload: the structured CloudEvent, ``streamid`` and
        ``streamversion`` set by the store."""
        position = self._appended[i][0]
        (row,) = await self.store.read_all(position, 1)
        assert row.position == position
        return row.payload

    def parked_event(self, parked: Parked) -> Event:
        """A parked copy is the stored row: structured JSON, no ``ce_`` headers."""
        return structured.from_json(parked.value or b"")

    async def settle(self, stalled_s: float = 30.0) -> bool:
        async def settled() -> bool:
            return await self.unsettled() == 0

        return await until(
            settled,
            what="every event settled",
            progress=self.progress,
            stalled_s=stalled_s,
            poll_s=0.02,
        )

    # observing -----------------------------------------------------------------------
    async def unsettled(self) -> int:
        """Appended events at or past their partition's committed store position, counted
        per source topic (every topic's agents follow the one store)."""
        assert self.app is not None
        tasks = self._tasks()
        done = {k: t.replay.history_position() for k, t in tasks.items() if t.phase is Phase.LIVE}
        behind = 0
        for topic, spec in self.app.sources.items():
            for position, sid in self._appended:
                p = partition_for(sid.encode(), spec.partitions)
                behind += position >= done.get((topic, p), 0)
        return behind

    async def table(self, name: str, key: str) -> Any:
        assert self._http is not None, "start the app first"
        assert self.worker is not None
        return await read_view(self._http, self.worker.web_port, name, key)

    async def parked(self, topic: str) -> list[Parked]:
        return [Parked(r.value, r.key, dict(r.headers)) for r in await self.store.parked(topic)]

    def metric(self, name: str, agent: str) -> float | None:
        assert self.worker is not None, "start the app first"
        return counter(self.worker.metrics.render().decode(), name, agent)
