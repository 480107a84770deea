"""What the event store takes and gives: stored events and rows, appends and their
results, parked records and resend entries (the values of :mod:`streamapp.eventstore.base`'s
interface)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

import orjson

from ..codecs.structured import from_stored
from ..errors import ConcurrencyError, InvalidEventError
from ..events import Event

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


StoredRow = tuple[int, str, int, bytes]
"""``(position, stream_id, version, payload)``: a stored event as the catch-up replay reads
it (the version from its column: the replay skips what its tables applied without
decoding the payload).

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
    """One append of a batch (:meth:`~.base.EventStoreBackend.append_many`)."""

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

RELEASE_RUN = "release-"
"""How the run of a held-stream release or skip (``streamapp store parked release``,
``skip``) names itself in the resend log: its entries do not move the replay mark
(:meth:`~streamapp.eventstore.base.EventStoreBackend.resent_through`), as a release on a
broker leaves the replay mark alone."""


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> str:
    """Headers as JSON text (values base64): bytes round-trip exactly, order kept."""
    return orjson.dumps([[n, base64.b64encode(v).decode()] for n, v in headers]).decode()


def decode_headers(raw: str | bytes) -> list[tuple[str, bytes]]:
    """The headers of :func:`encode_headers`."""
    return [(n, base64.b64decode(v)) for n, v in orjson.loads(raw)]
