"""PostgreSQL sessions that survive a server restart (psycopg 3, async).

A psycopg connection never reconnects: after a restart every call on it fails for good.
:class:`Session` holds one connection, drops it on a connection error and runs the
operation again on a fresh one, waiting for the server up to ``wait_s``. It retries the
operation, not the connection: an operation must be safe to run again, or find out
itself what its failed attempt did (see ``write_many`` in :mod:`.postgres`). An outage
is logged once when it starts and once when it ends, whatever the number of calls in it.

Session advisory locks die with their session; they live on connections of their own
(:func:`connect`, :func:`lost`), never on a :class:`Session`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from ...errors import ConfigError, EventStoreUnavailableError
from ...settings.store_url import SETTING

log = logging.getLogger("streamapp.eventstore")

T = TypeVar("T")
Connection = psycopg.AsyncConnection[Any]

WAIT_S = 60.0
"""How long a call waits for the server to come back before it raises."""
FIRST_RETRY_S, MAX_RETRY_S = 0.1, 1.0


def lost(exc: BaseException, conn: Connection | None) -> bool:
    """True when ``exc`` means the session is gone (the server restarted, the network
    broke): connection errors (SQLSTATE class 08), shutdowns (57P01-57P03) and errors
    raised on a closed or broken connection. Other errors are the operation's own."""
    if not isinstance(exc, psycopg.Error):
        return False
    if conn is None or conn.closed or conn.broken:
        return True
    state = exc.sqlstate
    return isinstance(exc, psycopg.OperationalError) and (
        state is None or state.startswith(("08", "57P"))
    )


async def connect(url: str, application_name: str) -> Connection:
    """A new autocommit connection; psycopg's errors go out as they are (see :func:`lost`)."""
    return await psycopg.AsyncConnection.connect(
        url, autocommit=True, application_name=application_name, connect_timeout=10
    )


async def close_quietly(conn: Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.close()


_closing: set[asyncio.Task[None]] = set()


def _close_later(conn: Connection | None) -> None:
    """Close ``conn`` in the background (from a cancelled call, which must not wait)."""
    if conn is not None:
        task = asyncio.ensure_future(close_quietly(conn))
        _closing.add(task)
        task.add_done_callback(_closing.discard)


def redacted(url: str) -> str:
    """``url`` without its password (for logs and errors)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return url.split("@")[-1]
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class Outage:
    """Logs the start and the end of an outage once each, however many calls meet it."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None

    def down(self, exc: BaseException, doing: str) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("%s: connection lost during %s (%r); reconnecting", self.what, doing, exc)

    def up(self) -> None:
        if self.since is not None:
            log.warning("%s: reconnected after %.1fs", self.what, time.monotonic() - self.since)
            self.since = None


class Session:
    """One connection to ``url``, replaced after a connection error; one call at a time."""

    def __init__(
        self, url: str, application_name: str, conn: Connection, *, wait_s: float = WAIT_S
    ) -> None:
        self.url, self.application_name, self.wait_s = url, application_name, wait_s
        self.reconnects = 0
        """Fresh connections made after a lost one (tests and status read it)."""
        self._conn: Connection | None = conn
        self._lock = asyncio.Lock()
        self._outage = Outage(f"PostgreSQL event store {redacted(url)}")

    @classmethod
    async def open(cls, url: str, application_name: str, *, wait_s: float = WAIT_S) -> Session:
        """Connect once: a server that does not answer at start is a ConfigError naming
        the setting (a wrong URL is far likelier than a restart in that very second)."""
        try:
            conn = await connect(url, application_name)
        except psycopg.Error as exc:
            raise ConfigError(
                f"setting {SETTING}: cannot connect to the PostgreSQL store: {exc}".strip()
            ) from exc
        return cls(url, application_name, conn, wait_s=wait_s)

    async def run(self, op: Callable[[Connection], Awaitable[T]], doing: str) -> T:
        """``op(connection)``, run again on a fresh connection while the session is lost,
        for up to ``wait_s``; then EventStoreUnavailableError naming the server."""
        async with self._lock:
            deadline: float | None = None
            delay = FIRST_RETRY_S
            while True:
                conn = self._conn
                try:
                    if conn is None:
                        conn = self._conn = await connect(self.url, self.application_name)
                        self.reconnects += 1
                    result = await op(conn)
                except asyncio.CancelledError:
                    # a query cut off midway leaves the session in an unknown state
                    self._conn = None
                    _close_later(conn)
                    raise
                except Exception as exc:
                    if not lost(exc, conn):
                        raise
                    self._conn = None
                    await close_quietly(conn)
                    self._outage.down(exc, doing)
                    now = time.monotonic()
                    deadline = deadline or now + self.wait_s
                    if now >= deadline:
                        raise EventStoreUnavailableError(
                            f"the PostgreSQL event store {redacted(self.url)} (setting "
                            f"{SETTING}) did not answer for {self.wait_s:.0f}s during {doing}: "
                            f"{exc}. Check the server; the call can be tried again."
                        ) from exc
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_S)
                    continue
                self._outage.up()
                return result

    async def close(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            await close_quietly(conn)
