"""The event store interface: CloudEvents appended per stream, read in one global order.

Every store keeps each event as its structured JSON (:func:`streamapp.codecs.structured.to_json`)
with the ``streamid`` and ``streamversion`` extensions set, so a stored payload is a
complete CloudEvent on its own. Appends check an expected stream version (optimistic
concurrency); :func:`plan_append` holds that rule once for every backend.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple, Protocol
from urllib.parse import urlsplit, urlunsplit

import orjson

from ..codecs.structured import from_stored, to_json
from ..errors import ConcurrencyError, ConfigError, DuplicateEventError, InvalidEventError
from ..events import Event

log = logging.getLogger("streamapp.eventstore")

OnDuplicate = Literal["skip", "fail"]
"""What an append does with an event whose (``source``, ``id``) the store already holds
(CloudEvents: that pair identifies an event): ``skip`` leaves it out and counts it in
:attr:`BatchResult.skipped`; ``fail`` stops with a DuplicateEventError."""
ON_DUPLICATE: tuple[OnDuplicate, ...] = ("skip", "fail")


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
    """Where an append ended: the last event's global position, the stream's new version,
    and how many of its events were skipped as duplicates (their ``source`` and ``id``
    already stored, or earlier in the same append)."""

    position: int
    version: int
    skipped: int = 0


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
    skipped: int = 0
    """Events left out because their (``source``, ``id``) was already stored, or earlier in
    the batch (``on_duplicate="skip"``). An append left with no event returns the stream's
    version and its last duplicate's position, without a version check."""

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


class Resent(NamedTuple):
    """An entry of the resend log: its number (increasing), the parked row sent back and
    what it came to (None: not run yet; see :data:`RESENT_OUTCOMES`)."""

    id: int
    parked: ParkedRecord
    outcome: str | None = None


PENDING, APPLIED, FILTERED, PARKED_AGAIN = "pending", "applied", "filtered", "parked again"
"""What a parked row sent back came to (``streamapp store parked`` shows it): ``pending``
(not run yet), ``applied`` (its agent ran it), ``filtered`` (its agent's filter or its
table's stream-version guard skipped it), ``parked again`` (it failed again)."""
RESENT_OUTCOMES = (PENDING, APPLIED, FILTERED, PARKED_AGAIN)


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
        """The highest parked row id of ``destination`` sent back for ``app_id`` (0:
        none): where a replay run without ``--from`` starts after."""
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
        """``app_id``'s ledger (``streamapp_ledger``: :mod:`streamapp.retirement`)."""
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


Row = tuple[str, int, bytes, str, str]
"""``(stream_id, version, payload, source, event_id)`` of one event to insert."""
EventKey = tuple[str, str]
"""``(source, id)``: what identifies a CloudEvent; the store keeps one of each."""

DUPLICATES_NOTE = (
    "these rows stay (the store never deletes); appends skip or refuse those ids from now on"
)
STORED_TWICE_SQL = (
    "SELECT count(*) FROM (SELECT 1 FROM streamapp_events GROUP BY source, event_id "
    "HAVING count(*) > 1) AS twice"
)
"""SQL counting the ``(source, id)`` keys stored more than once (both backends)."""


def log_indexed(url: str, twice: int) -> None:
    """Say that a store made before duplicate checks was indexed, and how many of its
    events were stored more than once already (they stay)."""
    log.info("event store %s: events indexed by (source, id) for duplicate checks", url)
    if twice:
        log.warning(
            "event store %s: %d events (source, id) were already stored more than once; %s",
            url,
            twice,
            DUPLICATES_NOTE,
        )


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
    expected, carried_by, fix = expected_version, "", ""
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
                _carried_fix(event.id, actual + 1 + i, expected_version, actual),
            )
        if expected is None:
            carried_by = f"event {event.id} carries streamversion {version}"
            fix = _carried_fix(event.id, actual + 1 + i, expected_version, actual)
        expected = implied
    if expected is not None and expected != actual:
        raise ConcurrencyError(stream_id, expected, actual, carried_by, fix)
    rows: list[Row] = []
    for i, event in enumerate(events, start=actual + 1):
        ext = dict(event.extensions)
        ext["streamid"] = stream_id
        ext["streamversion"] = str(i)
        payload = to_json(dataclasses.replace(event, extensions=ext))
        rows.append((stream_id, i, payload, event.source, event.id))
    return rows


def _carried_fix(event_id: str, version: int, expected_version: int | None, actual: int) -> str:
    """What to write when an event's own ``streamversion`` conflicts: the value it needs
    (the event's version, not the expected version, which is one less)."""
    fix = (
        f"give event {event_id} streamversion {version} (or leave streamversion out: it "
        "gets the stream's next version)"
    )
    if expected_version is not None and expected_version != actual:
        fix += f", and append with expected version {actual}"
    return fix


def event_keys(appends: Sequence[Append]) -> list[EventKey]:
    """The distinct (``source``, ``id``) of a batch's events, to look up in the store."""
    return list(dict.fromkeys((e.source, e.id) for a in appends for e in a.events))


def plan_batch(
    appends: Sequence[Append],
    versions: dict[str, int],
    known: dict[EventKey, int],
    head: int,
    on_duplicate: OnDuplicate,
) -> tuple[list[Row], BatchResult]:
    """The rows to insert after position ``head``, and the batch's result, in order up to
    the first append that fails.

    ``versions`` holds each stream's actual version (absent: 0); ``known`` the position of
    each event key of the batch already stored. Both are advanced.
    """
    rows: list[Row] = []
    results: list[AppendResult] = []
    skipped = 0
    for item in appends:
        actual = versions.get(item.stream_id, 0)
        fresh: list[Event] = []
        keys: set[EventKey] = set()
        last_duplicate = 0
        left_out = 0
        for event in item.events:
            key = (event.source, event.id)
            if key in known or key in keys:
                if on_duplicate == "fail":
                    error = DuplicateEventError(
                        event.source, event.id, item.stream_id, known.get(key)
                    )
                    return rows, BatchResult(results, error, skipped)
                skipped += 1
                left_out += 1
                last_duplicate = known.get(key, last_duplicate)
                continue
            keys.add(key)
            fresh.append(event)
        if not fresh:
            results.append(AppendResult(last_duplicate, actual, left_out))
            continue
        try:
            planned = plan_append(item.stream_id, fresh, item.expected_version, actual)
        except (ConcurrencyError, InvalidEventError) as exc:
            return rows, BatchResult(results, exc, skipped)
        for event in fresh:
            head += 1
            known[(event.source, event.id)] = head
        rows.extend(planned)
        versions[item.stream_id] = actual + len(planned)
        results.append(AppendResult(head, actual + len(planned), left_out))
    return rows, BatchResult(results, None, skipped)
