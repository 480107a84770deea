"""Append planning, once for every backend: the optimistic-concurrency rule (expected
and carried stream versions), duplicate (``source``, ``id``) keys, and the rows a batch
inserts; and :class:`SqlEventStore`, the base of the SQLite and PostgreSQL stores.

A backend reads, under its append lock, each stream's version, the stored positions of
the batch's event keys (:func:`event_keys`) and the head, then inserts what
:func:`plan_batch` gives.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Self

from .. import tracing
from ..codecs.structured import to_json
from ..errors import ConcurrencyError, DuplicateEventError, InvalidEventError
from ..events import Event
from .model import Append, AppendResult, BatchResult, OnDuplicate

Row = tuple[str, int, bytes, str, str]
"""``(stream_id, version, payload, source, event_id)`` of one event to insert."""
EventKey = tuple[str, str]
"""``(source, id)``: what identifies a CloudEvent; the store keeps one of each."""


class SqlEventStore(ABC):
    """What the SQL event stores share: a single append is a batch of one, an append is
    traced when tracing is on, and a store is its own async context (closed on exit). A
    backend gives :meth:`write_many` (one transaction, planned by :func:`plan_batch`),
    :meth:`close` and its ``system`` (the ``db.system.name`` of its spans)."""

    system: str
    """The database, as OpenTelemetry names it (``sqlite``, ``postgresql``)."""
    url: str
    """The store's ``event_store`` URL, as given (:func:`~.base.display_url` to show it)."""
    reads: int
    """How many times read_all or read_rows was called (restarts must not re-read the
    store)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def append(
        self,
        stream_id: str,
        events: Sequence[Event],
        expected_version: int | None = None,
        *,
        on_duplicate: OnDuplicate = "skip",
    ) -> AppendResult:
        """:meth:`~.base.EventStore.append`: a batch of one append."""
        appends = [Append(stream_id, events, expected_version)]
        return (await self.append_many(appends, on_duplicate=on_duplicate)).one()

    async def append_many(
        self, appends: Sequence[Append], *, on_duplicate: OnDuplicate = "skip"
    ) -> BatchResult:
        """:meth:`~.base.EventStoreBackend.append_many`; with tracing on, in a span
        ``append`` whose trace context each event without a valid one of its own carries
        (the extensions ``traceparent``, ``tracestate``: :mod:`streamapp.tracing`)."""
        trace = tracing.active()
        if trace is None:
            return await self.write_many(appends, on_duplicate)
        with trace.append(sum(len(a.events) for a in appends), self.system) as span:
            stamped = [
                Append(a.stream_id, [span.stamp(e) for e in a.events], a.expected_version)
                for a in appends
            ]
            result = await self.write_many(stamped, on_duplicate)
            appended = sum(len(a.events) for a in stamped[: len(result.results)])
            error = None if result.error is None else str(result.error)
            span.appended(appended - result.skipped, result.skipped, error)
            return result

    @abstractmethod
    async def write_many(self, appends: Sequence[Append], on_duplicate: OnDuplicate) -> BatchResult:
        """The backend's append of a batch, in one transaction planned by :func:`plan_batch`."""

    @abstractmethod
    async def close(self) -> None:
        """Close the store's connection (or session)."""


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
