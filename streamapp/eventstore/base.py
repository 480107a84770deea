"""The event store interface: CloudEvents appended per stream, read in one global order.

Every store keeps each event as its structured JSON (:func:`streamapp.structured.to_json`)
with the ``streamid`` and ``streamversion`` extensions set, so a stored payload is a
complete CloudEvent on its own. Appends check an expected stream version (optimistic
concurrency); :func:`plan_append` holds that rule once for every backend.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple, Protocol

import orjson

from ..errors import ConcurrencyError, ConfigError, InvalidEventError
from ..events import Event
from ..structured import from_stored, to_json

SETTING = "event_store (STREAMAPP_EVENT_STORE)"


class StoredEvent(NamedTuple):
    """One event as the store keeps it (a tuple: a store row becomes one without a copy
    per field, on the replay's hot path)."""

    position: int
    """Global order, 1-based (dense in SQLite; in PostgreSQL increasing in commit order)."""
    stream_id: str
    version: int
    """The ``streamversion``: 1-based within the stream."""
    payload: bytes
    """The CloudEvent in structured JSON, ``streamid`` and ``streamversion`` set."""

    def event(self) -> Event:
        """The decoded CloudEvent (the store wrote it: the fast path, checked fallback)."""
        return from_stored(self.payload)


StoredRow = tuple[int, str, bytes]
"""``(position, stream_id, payload)``: a stored event as the catch-up replay reads it.

A plain tuple, not a :class:`StoredEvent`: the garbage collector stops tracking a tuple
of atomic values at its first collection, never a NamedTuple, and the rows of a large
read live as long as their chunk: as objects they would make every full collection
longer and more frequent."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append ended: the last event's global position, the stream's new version."""

    position: int
    version: int


@dataclass(frozen=True, slots=True)
class Append:
    """One append of a batch (:meth:`BatchAppender.append_many`)."""

    stream_id: str
    events: Sequence[Event]
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The appends of a batch that were committed, and the error that stopped it, if any.

    ``results[i]`` belongs to the batch's i-th append; the append at ``len(results)``
    failed with ``error`` and nothing after it was tried.
    """

    results: list[AppendResult]
    error: ConcurrencyError | InvalidEventError | None = None

    def one(self) -> AppendResult:
        """The result of a batch of one append, or its error raised."""
        if self.error is not None:
            raise self.error
        return self.results[0]


@dataclass(frozen=True, slots=True)
class ParkedRecord:
    """A delivery parked in the store (``streamapp_parked``): the copy the broker would
    have received, with the park reason in its headers (``streamapp-park-reason``)."""

    id: int
    """Park order, increasing across destinations."""
    destination: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    parked_at: datetime
    """When the park was committed (UTC)."""

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (None when absent)."""
        found = [v for n, v in self.headers if n == name]
        return found[-1] if found else None

    @property
    def reason(self) -> str:
        """Why it was parked (empty when the header is missing)."""
        return (self.header("streamapp-park-reason") or b"").decode(errors="replace")


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> str:
    """Headers as JSON text (values base64): bytes round-trip exactly, order kept."""
    return orjson.dumps([[n, base64.b64encode(v).decode()] for n, v in headers]).decode()


def decode_headers(raw: str | bytes) -> list[tuple[str, bytes]]:
    """The headers of :func:`encode_headers`."""
    return [(n, base64.b64decode(v)) for n, v in orjson.loads(raw)]


class EventStore(Protocol):
    """What the engine reads and writers append through."""

    url: str

    async def append(
        self, stream_id: str, events: Sequence[Event], expected_version: int | None = None
    ) -> AppendResult:
        """Append ``events`` to a stream atomically.

        ``expected_version`` None: no check; 0: the stream must not exist yet; n: the
        stream must be at version n. Raises ConcurrencyError (nothing appended) otherwise.
        """
        ...

    async def read_all(self, from_position: int, limit: int) -> list[StoredEvent]:
        """Events at positions >= ``from_position``, ascending, at most ``limit``."""
        ...

    async def read_stream(self, stream_id: str) -> list[StoredEvent]:
        """Every event of one stream, by version."""
        ...

    async def head(self) -> int:
        """The last readable position (0 when the store is empty)."""
        ...

    async def close(self) -> None: ...


class ForwarderState(Protocol):
    """The forwarder's lock and checkpoint, kept in the store's own database."""

    def lock(self) -> AbstractAsyncContextManager[None]:
        """Held while this forwarder publishes; entering waits while another holds it."""
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

    async def read_rows(self, from_position: int, limit: int) -> list[StoredRow]:
        """What :meth:`read_all` returns, as :data:`StoredRow` tuples (the replay's read)."""
        ...

    async def append_many(self, appends: Sequence[Append]) -> BatchResult:
        """Appends in order in one transaction, stopping at the first one that fails."""
        ...

    def forwarder_state(self, name: str) -> ForwarderState: ...

    async def live_offset(self, topic: str, partition: int, position: int) -> int | None:
        """See :data:`LIVE_OFFSET_SQL`."""
        ...

    def worker_lock(self, app_id: str) -> AbstractAsyncContextManager[None]:
        """Held by a store-only worker for its life; raises ConfigError naming the holder
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
        store-only worker (no broker to park to). Returns once the row is committed."""
        ...

    async def parked(self, destination: str) -> list[ParkedRecord]:
        """Every record parked to ``destination``, in park order."""
        ...


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed ``event_store`` URL: a SQLite file (absolute path) or a PostgreSQL DSN."""

    kind: str
    """``sqlite`` or ``postgresql``."""
    path: Path | None = None
    dsn: str = ""


def parse_url(url: str) -> StoreUrl:
    """``sqlite:///relative.db`` (from the working directory), ``sqlite:////abs.db`` or
    ``postgresql://...``; anything else is a ConfigError naming the setting."""
    if url.startswith(("postgresql://", "postgres://")):
        return StoreUrl("postgresql", dsn=url)
    if url.startswith("sqlite:///"):
        raw = url.removeprefix("sqlite:///")
        if raw and "?" not in raw and not raw.endswith("/") and raw != ":memory:":
            return StoreUrl("sqlite", path=Path.cwd() / raw if raw[0] != "/" else Path(raw))
        why = "give a file path after sqlite:/// (no query string, no :memory:)"
    else:
        why = (
            "give sqlite:///relative/path.db, sqlite:////absolute/path.db or "
            "postgresql://user@host/db"
        )
    raise ConfigError(f"setting {SETTING} = {url!r}: {why}")


LIVE_OFFSET_SQL = (
    "SELECT min(kafka_offset) FROM ("
    "SELECT name, max(kafka_offset) AS kafka_offset FROM streamapp_forwarder_marks "
    "WHERE topic = ? AND kafka_partition = ? AND position < ? GROUP BY name) AS latest"
)
"""Where live delivery may start after a replay that applied every position below P.

A forwarder publishes in store order and records, after each confirmed chunk, a mark
per topic partition: the highest offset and the store position that record carried. A
forwarder restarted from its checkpoint publishes again from there, so every position
at or above P that it publishes comes after its own latest mark below P. Forwarders of
other names (one runs at a time) leave marks of their own: taking the lowest of each
name's latest mark below P, then offset + 1, misses nothing whichever name goes on, and
re-reads about one chunk of what the replay applied (the stream-version rule skips it).
No mark (a new topic, or a forwarder that has not run): the task starts at the
beginning of the topic, whatever ``auto_offset_reset`` says."""


def worker_locked(app_id: str, url: str, holder: str) -> ConfigError:
    return ConfigError(
        f"another worker of app {app_id!r} ({holder}) already runs on the event store "
        f"{url} with STREAMAPP_BROKER=none: in that mode one worker owns every partition. "
        "Stop it first, or scale out with STREAMAPP_BROKER=kafka."
    )


Row = tuple[str, int, bytes]
"""``(stream_id, version, payload)`` of one event to insert."""


def plan_append(
    stream_id: str,
    events: Sequence[Event],
    expected_version: int | None,
    actual: int,
) -> list[Row]:
    """The rows of one append to a stream at ``actual``.

    Raises ConcurrencyError when ``expected_version``, or a ``streamversion`` an event
    already carries, does not fit ``actual``; InvalidEventError when an event's
    ``streamid`` names another stream.
    """
    expected, carried_by = expected_version, ""
    for i, event in enumerate(events):
        carried = event.extensions.get("streamid")
        if carried is not None and carried != stream_id:
            raise InvalidEventError(
                f"event {event.id} has streamid {carried!r} but is appended to stream "
                f"{stream_id!r}; nothing appended"
            )
        version = event.stream_version
        if version is None:
            continue
        implied = version - 1 - i
        if expected is not None and implied != expected:
            raise ConcurrencyError(
                stream_id,
                expected,
                actual,
                f"event {event.id} carries streamversion {version}, but it would be "
                f"version {expected + 1 + i}",
            )
        if expected is None:
            carried_by = f"event {event.id} carries streamversion {version}"
        expected = implied
    if expected is not None and expected != actual:
        raise ConcurrencyError(stream_id, expected, actual, carried_by)
    rows: list[Row] = []
    for i, event in enumerate(events, start=actual + 1):
        ext = dict(event.extensions)
        ext["streamid"] = stream_id
        ext["streamversion"] = str(i)
        rows.append((stream_id, i, to_json(dataclasses.replace(event, extensions=ext))))
    return rows


def plan_batch(
    appends: Sequence[Append], versions: dict[str, int]
) -> tuple[list[tuple[list[Row], int]], ConcurrencyError | InvalidEventError | None]:
    """Each append's rows and new stream version, in order, up to the first that fails.

    ``versions`` holds each stream's actual version (absent: 0) and is advanced.
    """
    planned: list[tuple[list[Row], int]] = []
    for item in appends:
        actual = versions.get(item.stream_id, 0)
        try:
            rows = plan_append(item.stream_id, item.events, item.expected_version, actual)
        except (ConcurrencyError, InvalidEventError) as exc:
            return planned, exc
        versions[item.stream_id] = actual + len(rows)
        planned.append((rows, actual + len(rows)))
    return planned, None


def results_of(planned: list[tuple[list[Row], int]], head: int) -> list[AppendResult]:
    """The AppendResult of each planned append, inserted after position ``head``."""
    out = []
    for rows, version in planned:
        head += len(rows)
        out.append(AppendResult(head, version))
    return out
