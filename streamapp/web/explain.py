"""``GET /tables/{table}/{key}?explain=1`` and ``?as_of=POSITION``: a key's value folded
again from the event store through the handler, in scratch (:mod:`streamapp.verify.fold`),
never read from the live state.

- ``?explain=1``: the value and the events that made it, in stream order: store position,
  event id, type, stream version, the data's schema version, whether upcasters ran, the
  agent's outcome and the value after each (``&limit=N``: the last N events; the fold
  still runs the whole stream).
- ``?as_of=POSITION``: the value the key had at store position POSITION (404 when it had
  none then); ``&explain=1`` adds the events up to it.

Any worker with the event store answers (the store is the same for all: nothing is
forwarded to the key's owner). Refused with 400 where the table's agent has no event
store (a plain topic without ``history=``), or where this worker opened none; with 422
when the stream fails now (the answer names the event and the error: what the live lane
does with it is its policy's, see ``?meta=1``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..app import App
from ..errors import ConfigError
from ..tables.table import Table
from ..verify.fold import StreamReader, fold
from .endpoint import flag, int_param
from .responses import VERSION_HEADER, error, json_response

AS_OF_HEADER = "Streamapp-As-Of"
"""The store position an ``?as_of=`` answer (and an explanation) is folded up to."""
FOLDED_HEADER = "Streamapp-Folded"
"""``store``: the answer was folded from the event store, not read from live state."""


@dataclass(frozen=True, slots=True)
class StoreFolds:
    """What a worker's views fold with: its app (the handlers) and its event store."""

    app: App
    store: Callable[[], StreamReader | None]
    """The worker's event store once open (None before, or when it reads none)."""
    embedded: bool = False
    """The store is every agent's source (``STREAMAPP_BROKER=none``)."""


def wants_fold(request: web.Request) -> bool:
    """True when the request asks for an explanation or a value at a store position."""
    return flag(request, "explain") or "as_of" in request.query


async def folded_answer(
    request: web.Request, folds: StoreFolds | None, table: Table[Any], key: str
) -> web.Response:
    """The answer to ``?explain=1`` / ``?as_of=`` for ``key`` of ``table``."""
    as_of = int_param(request, "as_of", 0) if "as_of" in request.query else None
    if as_of is not None and as_of < 1:
        return error(400, f"as_of={as_of}: give a store position (1 or more)")
    limit = int_param(request, "limit", 0) if "limit" in request.query else None
    if limit is not None and limit < 1:
        return error(400, f"limit={limit}: give 1 or more events")
    reader = folds.store() if folds is not None else None
    if reader is None:
        return error(
            400,
            f"?explain and ?as_of read the event store, and this worker has none open: "
            f"table {table.label!r} is answered from live state only (set event_store, "
            f"STREAMAPP_EVENT_STORE, and give its agent history=FromEventStore())",
        )
    try:
        assert folds is not None
        result = await fold(folds.app, reader, table, key, as_of=as_of, embedded=folds.embedded)
    except ConfigError as exc:
        return error(400, str(exc))
    headers = {VERSION_HEADER: str(table.version), FOLDED_HEADER: "store"}
    if as_of is not None:
        headers[AS_OF_HEADER] = str(as_of)
    stopped = result.stopped
    if stopped is not None:
        resp = error(
            422,
            f"key {key!r} of table {table.label!r}: event {stopped.id!r} (store position "
            f"{stopped.position}, type {stopped.type!r}) fails now: {stopped.error}",
        )
        resp.headers.update(headers)
        return resp
    if flag(request, "explain"):
        return json_response(result.explained(limit), 200, **headers)
    if result.value is None:
        where = f"at store position {as_of}" if as_of is not None else "in its stream"
        resp = error(404, f"key {key!r} had no value in table {table.label!r} {where}")
        resp.headers.update(headers)
        return resp
    return json_response(result.value, 200, **headers)
