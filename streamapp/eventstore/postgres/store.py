"""The shared event store in PostgreSQL (psycopg 3, async).

Gap-free tailing. With a plain SERIAL position, transaction A can take position 10, B
take 11 and commit first: a reader that sees 11 moves on and never sees 10 when A commits.
Here every append transaction first takes one transaction-scoped advisory lock
(``pg_advisory_xact_lock``), then numbers its events ``max(position) + 1 ...``. The lock
is held until the transaction ends, and PostgreSQL releases a transaction's locks only
after its commit is visible to other sessions; so the next appender numbers after every
committed event, positions become visible in position order, and a reader that has seen
position n will see n + 1 next, whenever it commits. Rolled-back appends consume no
position, so positions are dense too. The price is that appends are serialised (each
holds the lock for a few round trips); batch them (:meth:`append_many`) for throughput.

The lock keys hash the schema name, so stores in different schemas of one database do not
contend. One store object holds one session (:class:`~.pgconn.Session`) and runs one
call at a time; open more store objects for parallel appends.

Restarts. Every call goes through the session, which reconnects after a lost connection
and runs the call again (for up to ``wait_s``). Reads and the checkpoint load are safe to
run again. An append whose connection died during its COMMIT may or may not have
committed: before trying again, :meth:`PostgresEventStore.write_many` looks for the
first row it sent (stream, version and payload) and, found, returns what that commit
did instead of appending a second time. Without that look, a retried append with
``expected_version=None`` would land twice, and one with a version would report a
conflict for an append that succeeded.

The forwarder and worker locks (session advisory locks on connections of their own)
are in :mod:`.pglocks`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from ...errors import ConfigError
from ...settings.store_url import SETTING
from ..append import EventKey, SqlEventStore, event_keys, plan_batch
from ..model import (
    PENDING,
    RELEASE_RUN,
    Append,
    BatchResult,
    OnDuplicate,
    ParkedRecord,
    Resent,
    StoredEvent,
    StoredRow,
    decode_headers,
    encode_headers,
)
from ..sql import (
    LIVE_OFFSET_SQL,
    SAMPLE_STREAMS_SQL,
    STORED_TWICE_SQL,
    STREAM_IDS_SQL,
    log_indexed,
)

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ConfigError(
        f"setting {SETTING} names a PostgreSQL store, but psycopg is not installed: "
        "install it with pip install 'streamapp[postgres]'"
    ) from exc

from .locks import (
    APPEND_KEY,
    LOCK,
    SCHEMA_KEY,
    PostgresForwarderState,
    PostgresWorkerLock,
)
from .session import Connection, Session, redacted  # after the check that psycopg is installed

log = logging.getLogger("streamapp.eventstore.postgres")

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS streamapp_events (
        position BIGINT PRIMARY KEY,
        stream_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        payload BYTEA NOT NULL,
        source TEXT,
        event_id TEXT,
        UNIQUE (stream_id, version))""",
    """CREATE TABLE IF NOT EXISTS streamapp_forwarder_checkpoints (
        name TEXT PRIMARY KEY,
        next_position BIGINT NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS streamapp_forwarder_marks (
        name TEXT NOT NULL,
        topic TEXT NOT NULL,
        kafka_partition INTEGER NOT NULL,
        kafka_offset BIGINT NOT NULL,
        position BIGINT NOT NULL,
        PRIMARY KEY (topic, kafka_partition, kafka_offset, name))""",
    """CREATE TABLE IF NOT EXISTS streamapp_parked (
        id BIGSERIAL PRIMARY KEY,
        destination TEXT NOT NULL,
        key BYTEA,
        value BYTEA,
        headers TEXT NOT NULL,
        parked_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """CREATE INDEX IF NOT EXISTS streamapp_parked_destination
        ON streamapp_parked (destination, id)""",
    """CREATE TABLE IF NOT EXISTS streamapp_resent (
        id BIGSERIAL PRIMARY KEY,
        app_id TEXT NOT NULL,
        run TEXT NOT NULL,
        parked_id BIGINT NOT NULL,
        sent_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (app_id, run, parked_id))""",
    """CREATE INDEX IF NOT EXISTS streamapp_resent_app ON streamapp_resent (app_id, id)""",
    # what an entry came to (NULL: not run yet; an older streamapp's entries have none)
    """ALTER TABLE streamapp_resent ADD COLUMN IF NOT EXISTS outcome TEXT""",
    """CREATE TABLE IF NOT EXISTS streamapp_ledger (
        app_id TEXT NOT NULL, key TEXT NOT NULL, value BYTEA, PRIMARY KEY (app_id, key))""",
    """CREATE TABLE IF NOT EXISTS streamapp_store (
        one INTEGER PRIMARY KEY CHECK (one = 1),
        id TEXT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """INSERT INTO streamapp_store (one, id) VALUES (1, gen_random_uuid()::text)
        ON CONFLICT (one) DO NOTHING""",
]
"""``streamapp_store`` holds the store's identity (one row, a random id made with the
schema, or at the first open by a streamapp that has it; ``gen_random_uuid`` needs
PostgreSQL 13 or later). ``source`` and ``event_id`` (the CloudEvent's, indexed by
:data:`EVENT_KEY_INDEX`) let appends skip events already stored; a store made before them
gets them at its first open (:func:`_add_event_keys`)."""
EVENT_KEY_INDEX = (
    "CREATE INDEX IF NOT EXISTS streamapp_events_source_id ON streamapp_events (source, event_id)"
)
# Advisory lock keys (int4, int4): the schema's hash and one of these.
_COLUMNS = "position, stream_id, version, payload"
_INSERTED = _COLUMNS + ", source, event_id"

Hook = Callable[[], Awaitable[None]]


class PostgresEventStore(SqlEventStore):
    """The event store in PostgreSQL. Open with :meth:`open` (or ``open_store``).

    ``before_commit`` (tests only) runs inside every append transaction, after the
    inserts, before the commit: a test stretches transactions with it to make them overlap.
    """

    system = "postgresql"

    def __init__(self, url: str, session: Session, before_commit: Hook | None = None) -> None:
        self.url = url
        self.reads = 0
        self.before_commit = before_commit
        self.session = session

    @classmethod
    async def open(
        cls, url: str, *, before_commit: Hook | None = None, wait_s: float | None = None
    ) -> PostgresEventStore:
        """Connect to ``url`` and create the schema if missing (safe to race).

        ``wait_s``: how long a call waits for a lost server to come back (default 60 s).
        """
        kwargs = {} if wait_s is None else {"wait_s": wait_s}
        session = await Session.open(url, "streamapp-eventstore", **kwargs)

        async def create(conn: Connection) -> None:
            async with conn.transaction():
                await conn.execute(f"SELECT pg_advisory_xact_lock({LOCK})", (SCHEMA_KEY,))
                for statement in SCHEMA:
                    await conn.execute(statement)
                await _add_event_keys(conn, redacted(url))
                await conn.execute(EVENT_KEY_INDEX)

        try:
            await session.run(create, "creating the schema")
        except BaseException:
            await session.close()
            raise
        return cls(url, session, before_commit)

    async def write_many(self, appends: Sequence[Append], on_duplicate: OnDuplicate) -> BatchResult:
        sent: list[_Sent] = []  # the attempt whose COMMIT was sent, outcome unknown
        keys = event_keys(appends)

        async def attempt(conn: Connection) -> BatchResult:
            if sent:
                landed = await _landed(conn, sent.pop())
                if landed is not None:
                    log.warning(
                        "PostgreSQL event store %s: an append's COMMIT was cut off but had "
                        "committed; not appended again",
                        redacted(self.url),
                    )
                    return landed
            async with conn.transaction(), conn.cursor() as cur:
                await cur.execute(f"SELECT pg_advisory_xact_lock({LOCK})", (APPEND_KEY,))
                await cur.execute(
                    "SELECT stream_id, max(version) FROM streamapp_events "
                    "WHERE stream_id = ANY(%s) GROUP BY stream_id",
                    (list({a.stream_id for a in appends}),),
                )
                versions: dict[str, int] = dict(await cur.fetchall())
                known = await _known(cur, keys)
                await cur.execute("SELECT coalesce(max(position), 0) FROM streamapp_events")
                row = await cur.fetchone()
                head = int(row[0]) if row else 0
                planned, result = plan_batch(appends, versions, known, head, on_duplicate)
                rows = [(head + i, *r) for i, r in enumerate(planned, start=1)]
                if rows:
                    async with cur.copy(f"COPY streamapp_events ({_INSERTED}) FROM STDIN") as copy:
                        for item in rows:
                            await copy.write_row(item)
                if self.before_commit is not None:
                    await self.before_commit()
                if rows:  # leaving the block sends COMMIT
                    sent.append(_Sent(rows[0][1], rows[0][2], rows[0][3], result))
            sent.clear()
            return result

        return await self.session.run(attempt, "an append")

    async def read_all(self, from_position: int, limit: int) -> list[StoredEvent]:
        self.reads += 1
        return await self._select(
            f"SELECT {_COLUMNS} FROM streamapp_events WHERE position >= %s "
            "ORDER BY position LIMIT %s",
            (from_position, limit),
        )

    async def read_rows(self, from_position: int, limit: int) -> list[StoredRow]:
        self.reads += 1
        rows: list[StoredRow] = await self._rows(
            f"SELECT {_COLUMNS} FROM streamapp_events "
            "WHERE position >= %s ORDER BY position LIMIT %s",
            (from_position, limit),
            "a read",
            binary=True,
        )
        return rows

    async def read_stream(self, stream_id: str) -> list[StoredEvent]:
        return await self._select(
            f"SELECT {_COLUMNS} FROM streamapp_events WHERE stream_id = %s ORDER BY version",
            (stream_id,),
        )

    async def stream_ids(self, after: str, limit: int) -> list[str]:
        sql = STREAM_IDS_SQL.replace("?", "%s")
        return [str(r[0]) for r in await self._rows(sql, (after, limit), "reading stream ids")]

    async def sample_streams(self, k: int) -> list[str]:
        sql = SAMPLE_STREAMS_SQL.replace("?", "%s")
        return [str(r[0]) for r in await self._rows(sql, (k,), "sampling stream ids")]

    async def head(self) -> int:
        sql = "SELECT coalesce(max(position), 0) FROM streamapp_events"
        rows = await self._rows(sql, (), "reading the head")
        return int(rows[0][0]) if rows else 0

    async def store_id(self) -> str:
        rows = await self._rows(
            "SELECT id FROM streamapp_store", (), "reading the store's identity"
        )
        assert rows  # made with the schema at open
        return str(rows[0][0])

    async def close(self) -> None:
        await self.session.close()

    async def live_offset(self, topic: str, partition: int, position: int) -> int | None:
        """The first offset of ``topic[partition]`` that may carry a position >= ``position``
        (see :data:`streamapp.eventstore.sql.LIVE_OFFSET_SQL`); None: no mark yet."""

        sql = LIVE_OFFSET_SQL.replace("?", "%s")
        rows = await self._rows(sql, (topic, partition, position), "reading the forwarder marks")
        return None if not rows or rows[0][0] is None else int(rows[0][0]) + 1

    def worker_lock(self, app_id: str) -> PostgresWorkerLock:
        """Held for an embedded worker's life; a second worker of the app is refused."""
        me = f"streamapp-worker {app_id} pid {os.getpid()} on {socket.gethostname()}"
        return PostgresWorkerLock(self.url, me[:63], app_id)

    async def park(
        self,
        destination: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        async def park(conn: Connection) -> None:  # autocommit: committed when it returns
            await conn.execute(
                "INSERT INTO streamapp_parked (destination, key, value, headers) "
                "VALUES (%s, %s, %s, %s)",
                (destination, key, value, encode_headers(headers)),
            )

        # Run again after a lost connection: a park is at-least-once (a copy, like a
        # publish whose confirm was lost), never dropped.
        await self.session.run(park, "a park")

    async def resend(
        self, app_id: str, run: str, parked_ids: Sequence[int], *, again: bool = False
    ) -> int:
        async def resend(conn: Connection) -> int:
            # The table lock orders the runs: a reader following the log by id never
            # skips an entry that a slower run commits later (ids are taken under it),
            # and a row another run sent meanwhile is seen (left out unless ``again``).
            async with conn.transaction(), conn.cursor() as cur:
                await cur.execute("LOCK TABLE streamapp_resent IN EXCLUSIVE MODE")
                await cur.execute(
                    "INSERT INTO streamapp_resent (app_id, run, parked_id) "
                    "SELECT %(app)s, %(run)s, i FROM unnest(%(ids)s::bigint[]) "
                    "WITH ORDINALITY AS t(i, n) WHERE %(again)s OR NOT EXISTS (SELECT 1 "
                    "FROM streamapp_resent r WHERE r.app_id = %(app)s AND r.parked_id = t.i) "
                    "ORDER BY n ON CONFLICT DO NOTHING",
                    {"app": app_id, "run": run, "ids": list(parked_ids), "again": again},
                )
                return max(cur.rowcount, 0)

        # Run again after a lost connection: the run's name makes it once.
        return await self.session.run(resend, "sending parked rows back")

    async def resent(self, app_id: str, after: int, limit: int) -> list[Resent]:
        rows = await self._rows(
            "SELECT r.id, p.id, p.destination, p.key, p.value, p.headers, p.parked_at, "
            "r.outcome FROM streamapp_resent r JOIN streamapp_parked p ON p.id = r.parked_id "
            "WHERE r.app_id = %s AND r.id > %s ORDER BY r.id LIMIT %s",
            (app_id, after, limit),
            "reading the resend log",
        )
        return [Resent(row[0], _parked_record(row[1:7]), row[7]) for row in rows]

    async def resent_through(self, app_id: str, destination: str) -> int:
        rows = await self._rows(
            "SELECT max(r.parked_id) FROM streamapp_resent r JOIN streamapp_parked p "
            "ON p.id = r.parked_id WHERE r.app_id = %s AND p.destination = %s "
            "AND r.run NOT LIKE %s",
            (app_id, destination, RELEASE_RUN + "%"),
            "reading the resend log",
        )
        return int(rows[0][0] or 0) if rows else 0

    async def record_resent(self, app_id: str, outcomes: Mapping[int, str]) -> None:
        async def record(conn: Connection) -> None:
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(
                    "UPDATE streamapp_resent SET outcome = %s "
                    "WHERE app_id = %s AND id = %s AND outcome IS NULL",
                    [(o, app_id, i) for i, o in outcomes.items()],
                )

        if outcomes:  # run again after a lost connection: an entry keeps its first outcome
            await self.session.run(record, "recording what parked rows sent back came to")

    async def resent_outcomes(self, app_id: str, destination: str) -> dict[int, str]:
        rows = await self._rows(
            "SELECT DISTINCT ON (r.parked_id) r.parked_id, r.outcome "
            "FROM streamapp_resent r JOIN streamapp_parked p ON p.id = r.parked_id "
            "WHERE r.app_id = %s AND p.destination = %s ORDER BY r.parked_id, r.id DESC",
            (app_id, destination),
            "reading the resend log",
        )
        return {int(i): o or PENDING for i, o in rows}

    async def ledger_records(self, app_id: str) -> list[tuple[str, bytes | None]]:
        rows = await self._rows(
            "SELECT key, value FROM streamapp_ledger WHERE app_id = %s ORDER BY key",
            (app_id,),
            "reading the ledger",
        )
        return [(str(k), None if v is None else bytes(v)) for k, v in rows]

    async def put_ledger_record(self, app_id: str, key: str, value: bytes) -> None:
        async def put(conn: Connection) -> None:  # autocommit: committed when it returns
            await conn.execute(
                "INSERT INTO streamapp_ledger (app_id, key, value) VALUES (%s, %s, %s) "
                "ON CONFLICT (app_id, key) DO UPDATE SET value = EXCLUDED.value",
                (app_id, key, value),
            )

        await self.session.run(put, "writing the ledger")

    async def parked(self, destination: str) -> list[ParkedRecord]:
        rows = await self._rows(
            "SELECT id, destination, key, value, headers, parked_at FROM streamapp_parked "
            "WHERE destination = %s ORDER BY id",
            (destination,),
            "reading parked records",
        )
        return [_parked_record(row) for row in rows]

    def forwarder_state(self, name: str) -> PostgresForwarderState:
        """The lock (a session advisory lock) and checkpoint of forwarder ``name``."""
        return PostgresForwarderState(self.session, self.url, name)

    async def _rows(
        self, query: str, params: tuple[Any, ...], what: str, *, binary: bool = False
    ) -> list[Any]:
        """Every row of one read-only ``query`` (run again after a lost connection)."""

        async def read(conn: Connection) -> list[Any]:
            cur = await conn.execute(query, params, binary=binary)
            return await cur.fetchall()

        return await self.session.run(read, what)

    async def _select(self, query: str, params: tuple[Any, ...]) -> list[StoredEvent]:
        rows = await self._rows(query, params, "a read", binary=True)
        return [StoredEvent(p, s, v, bytes(b)) for p, s, v, b in rows]


@dataclass(frozen=True, slots=True)
class _Sent:
    """An append transaction whose COMMIT was sent: its first row, and its result (planned
    under the append lock from the head and keys that transaction read: exact if it
    committed, skipped counts included; a blind retry would count its own rows as
    duplicates)."""

    stream_id: str
    version: int
    payload: bytes
    result: BatchResult


async def _known(cur: psycopg.AsyncCursor[Any], keys: list[EventKey]) -> dict[EventKey, int]:
    """The stored position of each of ``keys`` that the store holds (the first copy)."""
    if not keys:
        return {}
    await cur.execute(
        "SELECT e.source, e.event_id, min(e.position) FROM unnest(%s::text[], %s::text[]) "
        "AS k(source, event_id) JOIN streamapp_events AS e "
        "ON e.source = k.source AND e.event_id = k.event_id GROUP BY e.source, e.event_id",
        ([k[0] for k in keys], [k[1] for k in keys]),
    )
    return {(s, i): int(p) for s, i, p in await cur.fetchall()}


async def _add_event_keys(conn: Connection, url: str) -> None:
    """Give a store made before event keys its ``source`` and ``event_id`` columns, filled
    from the stored payloads (once, inside the schema's transaction), and say how many
    events were already stored twice."""
    cur = await conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'streamapp_events' AND column_name = 'event_id'"
    )
    if await cur.fetchone() is not None:
        return
    await conn.execute(
        "ALTER TABLE streamapp_events ADD COLUMN source TEXT, ADD COLUMN event_id TEXT"
    )
    await conn.execute(
        "UPDATE streamapp_events SET source = convert_from(payload, 'UTF8')::json ->> 'source', "
        "event_id = convert_from(payload, 'UTF8')::json ->> 'id'"
    )
    await conn.execute(EVENT_KEY_INDEX)
    cur = await conn.execute(STORED_TWICE_SQL)
    row = await cur.fetchone()
    log_indexed(url, int(row[0]) if row else 0)


async def _landed(conn: Connection, sent: _Sent) -> BatchResult | None:
    """The result of ``sent`` when its COMMIT landed, else None (then nothing of it did:
    a transaction commits whole)."""
    cur = await conn.execute(
        "SELECT position FROM streamapp_events WHERE stream_id = %s AND version = %s "
        "AND payload = %s",
        (sent.stream_id, sent.version, sent.payload),
    )
    row = await cur.fetchone()
    return None if row is None else sent.result


def _parked_record(row: Sequence[Any]) -> ParkedRecord:
    """A ``streamapp_parked`` row (id, destination, key, value, headers, parked_at)."""
    i, d, k, v, h, at = row
    return ParkedRecord(
        i,
        d,
        None if k is None else bytes(k),
        None if v is None else bytes(v),
        decode_headers(h),
        at.astimezone(UTC),
    )
