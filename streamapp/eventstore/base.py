"""The event store interface: CloudEvents appended per stream, read in one global order.

Every store keeps each event as its structured JSON (:func:`streamapp.codecs.structured.to_json`)
with the ``streamid`` and ``streamversion`` extensions set, so a stored payload is a
complete CloudEvent on its own. Appends check an expected stream version (optimistic
concurrency); :func:`~.append.plan_append` holds that rule once for every backend.

Here: the protocols, and the helpers every backend shares. Beside it: the values they
take and give (:mod:`.model`), append planning and the SQL stores' base class
(:mod:`.append`), the SQL both backends run (:mod:`.sql`). The names this module held
before are importable from here still.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError
from ..events import Event
from .append import EventKey, Row, event_keys, plan_append, plan_batch
from .model import (
    APPLIED,
    FILTERED,
    ON_DUPLICATE,
    PARKED_AGAIN,
    PENDING,
    RELEASE_RUN,
    RESENT_OUTCOMES,
    Append,
    AppendResult,
    BatchResult,
    OnDuplicate,
    ParkedRecord,
    Resent,
    StoredEvent,
    StoredRow,
    decode_headers,
    encode_headers,
)
from .sql import DUPLICATES_NOTE, LIVE_OFFSET_SQL, STORED_TWICE_SQL, log_indexed

__all__ = [
    "APPLIED",
    "DUPLICATES_NOTE",
    "FILTERED",
    "LIVE_OFFSET_SQL",
    "ON_DUPLICATE",
    "PARKED_AGAIN",
    "PENDING",
    "RELEASE_RUN",
    "RESENT_OUTCOMES",
    "STORED_TWICE_SQL",
    "Append",
    "AppendResult",
    "BatchResult",
    "EventKey",
    "EventStore",
    "EventStoreBackend",
    "ForwarderState",
    "OnDuplicate",
    "ParkedRecord",
    "Resent",
    "Row",
    "StoredEvent",
    "StoredRow",
    "decode_headers",
    "display_url",
    "encode_headers",
    "event_keys",
    "log_indexed",
    "plan_append",
    "plan_batch",
    "worker_locked",
]


class EventStore(Protocol):
    """What the engine reads and writers append through."""

    url: str

    async def append(
        self,
        stream_id: str,
        events: Sequence[Event],
        expected_version: int | None = None,
        *,
        on_duplicate: OnDuplicate = "skip",
    ) -> AppendResult:
        """Append ``events`` to a stream atomically.

        ``expected_version`` None: no check; 0: the stream must not exist yet; n: the
        stream must be at version n. Raises ConcurrencyError (nothing appended) otherwise.
        Events whose (``source``, ``id``) is already stored are skipped (the check then
        applies to the events left; the result's ``skipped`` counts them), or with
        ``on_duplicate="fail"`` raise DuplicateEventError (nothing appended).
        """
        ...

    async def read_all(self, from_position: int, limit: int) -> list[StoredEvent]:
        """Events at positions >= ``from_position``, ascending, at most ``limit``."""
        ...

    async def read_stream(self, stream_id: str) -> list[StoredEvent]:
        """Every event of one stream, by version."""
        ...

    async def stream_ids(self, after: str, limit: int) -> list[str]:
        """Stream ids above ``after``, ascending, at most ``limit`` (a page of every
        stream, read from the store's per-stream index)."""
        ...

    async def sample_streams(self, k: int) -> list[str]:
        """At most ``k`` stream ids picked at random (``streamapp verify --sample``)."""
        ...

    async def head(self) -> int:
        """The last readable position (0 when the store is empty)."""
        ...

    async def close(self) -> None: ...


class ForwarderState(Protocol):
    """The forwarder's lock and checkpoint, kept in the store's own database."""

    def lock(self) -> AbstractAsyncContextManager[None]:
        """Held while this forwarder publishes; entering waits while another holds it.

        A lock that lives on a database session (PostgreSQL) is lost with the session:
        the body is then cancelled at once and the context raises LockLostError."""
        ...

    async def load(self) -> int:
        """The next position to publish (1 when this forwarder never ran)."""
        ...

    async def save(self, next_position: int, offsets: Sequence[tuple[str, int, int, int]]) -> None:
        """Advance the checkpoint, recording ``(topic, partition, offset, position)`` rows:
        the highest broker offset of each topic partition and the store position it carried.
        """
        ...


class EventStoreBackend(EventStore, Protocol):
    """A store of this package: the interface plus batch appends and forwarder state."""

    reads: int
    """How many times read_all or read_rows was called (restarts must not re-read the
    store)."""

    async def store_id(self) -> str:
        """The store's identity: a random id made with its schema and kept in its
        database (``streamapp_store``), so a store deleted and made again at the same URL
        is another store. Checkpoints record it (:mod:`streamapp.engine.provenance`)."""
        ...

    async def read_rows(self, from_position: int, limit: int) -> list[StoredRow]:
        """What :meth:`read_all` returns, as :data:`StoredRow` tuples (the replay's read)."""
        ...

    async def append_many(
        self, appends: Sequence[Append], *, on_duplicate: OnDuplicate = "skip"
    ) -> BatchResult:
        """Appends in order in one transaction, stopping at the first one that fails (with
        ``on_duplicate="fail"``, the first holding an already stored event)."""
        ...

    def forwarder_state(self, name: str) -> ForwarderState: ...

    async def live_offset(self, topic: str, partition: int, position: int) -> int | None:
        """See :data:`~.sql.LIVE_OFFSET_SQL`."""
        ...

    def worker_lock(self, app_id: str) -> AbstractAsyncContextManager[None]:
        """Held by an embedded worker for its life; raises ConfigError naming the holder
        when another worker of ``app_id`` holds it."""
        ...

    async def park(
        self,
        destination: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Keep a parked delivery in ``streamapp_parked``: the parking destination of a
        embedded worker (no broker to park to). Returns once the row is committed."""
        ...

    async def parked(self, destination: str) -> list[ParkedRecord]:
        """Every record parked to ``destination``, in park order."""
        ...

    async def resend(
        self, app_id: str, run: str, parked_ids: Sequence[int], *, again: bool = False
    ) -> int:
        """Send parked rows back to the agents of ``app_id`` that parked them
        (``streamapp store parked replay``): append them to the resend log
        (``streamapp_resent``) in one transaction, in order, numbered above every entry
        already there. Rows the log holds already are left out unless ``again`` (so two
        runs at once send a row once); ``run`` names the run: the same run appended
        again (a commit whose reply was lost) adds nothing. Returns the count appended."""
        ...

    async def resent(self, app_id: str, after: int, limit: int) -> list[Resent]:
        """Entries of ``app_id``'s resend log numbered above ``after``, in order, each
        with its parked row (at most ``limit``)."""
        ...

    async def resent_through(self, app_id: str, destination: str) -> int:
        """The highest parked row id of ``destination`` sent back for ``app_id`` by a
        replay run (0: none; a release's runs, :data:`RELEASE_RUN`, are not counted):
        where a replay run without ``--from`` starts after."""
        ...

    async def record_resent(self, app_id: str, outcomes: Mapping[int, str]) -> None:
        """Record what entries of ``app_id``'s resend log came to (entry number to one of
        :data:`RESENT_OUTCOMES`), committed when this returns. An entry keeps the first
        outcome recorded: a table rebuilt later runs it again and skips it."""
        ...

    async def resent_outcomes(self, app_id: str, destination: str) -> dict[int, str]:
        """Each parked row of ``destination`` sent back for ``app_id``: what its last
        entry in the resend log came to (``pending`` until the worker ran it)."""
        ...

    async def ledger_records(self, app_id: str) -> list[tuple[str, bytes | None]]:
        """``app_id``'s ledger (``streamapp_ledger``: :mod:`streamapp.versions.ledger`)."""
        ...

    async def put_ledger_record(self, app_id: str, key: str, value: bytes) -> None:
        """Write (or replace) one ledger record; committed when this returns."""
        ...


def display_url(url: str) -> str:
    """``url`` as messages show it: a PostgreSQL password is left out."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}{port}"))


def worker_locked(app_id: str, url: str, holder: str) -> ConfigError:
    return ConfigError(
        f"another worker of app {app_id!r} ({holder}) already runs on the event store "
        f"{url} with STREAMAPP_BROKER=none: in that mode one worker owns every partition. "
        "Stop it first, or scale out with STREAMAPP_BROKER=kafka."
    )
