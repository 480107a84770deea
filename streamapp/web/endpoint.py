"""The base of the table endpoints (``GET /tables``, a key, a scan): one view class an
endpoint, as Faust's ``web.View``, made once per worker app.

:class:`TableEndpoint` holds what every table endpoint reads the same way: the tables
this worker's code declares (by name and version), which local table routes a version's
keys, the version a request is answered from (pinned by ``?version=N`` or the group's
active one), whether this worker's ownership is confirmed (the owner's lease), and the
query parameters. A helper ends a request early with :func:`answer_early`: its
``dispatch`` answers that, named with its table version.
"""

from __future__ import annotations

from typing import Any, NoReturn

from aiohttp import web

from ..engine.assignment import UNCONFIRMED, Assignment
from ..tables.table import Table
from .owner import FORWARDED
from .responses import error, unavailable, versioned
from .versions import VersionRoutes

MAX_KEY_BYTES = 1024
"""Longer keys (and prefixes) are refused with 414."""
STALE_HEADER = "X-Streamapp-Stale"
"""On a ``?stale_ok=1`` answer past the owner's lease: the seconds not confirmed."""


class TableEndpoint:
    """One table endpoint of a worker: :meth:`get` answers a request, :meth:`dispatch`
    (the handler aiohttp calls) answers what a helper ended early."""

    assignment: Assignment
    """The worker's partitions, tasks and group: what every answer is read from."""
    routes: VersionRoutes
    """The group's version states as lookups need them, one object for every endpoint
    of the app (``GET /tables`` computes them afresh and makes lookups compute again)."""
    tables: dict[tuple[str, int], Table[Any]]
    """Every (name, version) this worker's code declares, with its table."""
    names: list[str]
    """The names of the tables declared here, sorted."""
    lowest: dict[str, Table[Any]]
    """Each table name's lowest version declared here."""

    def __init__(self, assignment: Assignment, routes: VersionRoutes) -> None:
        self.assignment, self.routes = assignment, routes
        self.tables = {(t.name, t.version): t for _, t in assignment.app.tables.values()}
        self.names = sorted({name for name, _ in self.tables})
        self.lowest = {
            name: min((t for (n, _), t in self.tables.items() if n == name), key=_version_of)
            for name in self.names
        }

    async def dispatch(self, request: web.Request) -> web.Response:
        """The endpoint's answer to ``request``, or the early one a helper gave."""
        try:
            return await self.get(request)
        except _Answer as answer:
            return versioned(answer.response, answer.version)

    async def get(self, request: web.Request) -> web.Response:
        """The answer to ``request`` (a subclass's): :func:`answer_early` ends it early."""
        raise NotImplementedError

    def local(self, name: str, version: int) -> Table[Any] | None:
        """The table ``name`` of ``version`` when this worker's code declares it."""
        return self.tables.get((name, version))

    def route(self, name: str, version: int) -> Table[Any]:
        """The local table whose topic routes keys of ``name`` version ``version``: that
        version's, else the lowest declared here (versions of a table share a topic)."""
        return self.tables.get((name, version)) or self.lowest[name]

    def name(self, request: web.Request) -> str:
        """The table the request names (404 when none of that name is declared here)."""
        name = request.match_info["table"]
        if name not in self.lowest:
            answer_early(error(404, f"no table named {name!r}", tables=list(self.names)))
        return name

    def version(self, request: web.Request, name: str) -> int:
        """The version to answer ``name`` from: pinned by ``?version=N``, else the active
        one (404 for a version that does not exist, 503 while unknown)."""
        current = self.routes.current()
        known = current.known
        existing = current.existing.get(name, ())
        if request.query.get("version"):
            version = int_param(request, "version", 0)
            if version in existing:
                return version
            if FORWARDED in request.headers and not known:  # the asker knows it: not here yet
                answer_early(
                    unavailable(
                        f"version {version} of table {name!r} is not known here yet",
                        table_version=version,
                    ),
                    version,
                )
            answer_early(
                error(
                    404,
                    f"table {name!r} has no version {version}; its versions: "
                    f"{', '.join(map(str, existing)) or 'none'}",
                    versions=list(existing),
                )
            )
        latched = self.assignment.served.get(name)
        if latched is None:
            if not known:
                lowest = min(existing, default=None)
                answer_early(
                    unavailable(
                        f"the members directory is not read yet: which version of table "
                        f"{name!r} the group answers from is not known",
                    ),
                    lowest,
                )
            answer_early(error(404, f"table {name!r} has no version left (every one is retired)"))
        return latched

    def confirmed(self, partition: int, version: int | None, stale_ok: bool) -> float | None:
        """For how long this worker's ownership has not been confirmed (None: the owner's
        lease holds); 503 when it has not and ``stale_ok`` is not given."""
        gap = self.assignment.unconfirmed()
        if gap is not None and not stale_ok:
            why = f"ownership of partition {partition} not confirmed for {gap:.1f} s"
            answer_early(unavailable(why, partition=partition, phase=UNCONFIRMED), version)
        return gap


def answer_early(response: web.Response, version: int | None = None) -> NoReturn:
    """End the request with ``response`` (an error, or an owner's answer passed on),
    named with the table ``version`` it comes from or would."""
    raise _Answer(response, version)


def check_length(what: str, value: str) -> None:
    """414 for a key or prefix longer than :data:`MAX_KEY_BYTES`."""
    if len(value.encode()) > MAX_KEY_BYTES:
        answer_early(
            error(414, f"{what} is longer than {MAX_KEY_BYTES} bytes", max_bytes=MAX_KEY_BYTES)
        )


def flag(request: web.Request, name: str) -> bool:
    """Whether ``?name=`` is given as something other than empty, 0 or false."""
    return request.query.get(name, "") not in ("", "0", "false")


def int_param(request: web.Request, name: str, default: int) -> int:
    """``?name=`` as a whole number not below 0 (``default`` when absent; else 400)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        answer_early(error(400, f"{name} must be an integer, got {raw!r}"))
    if value < 0:
        answer_early(error(400, f"{name} must not be negative"))
    return value


class _Answer(Exception):
    """An early answer out of a helper, and the table version it names."""

    def __init__(self, response: web.Response, version: int | None = None) -> None:
        super().__init__(response.status)
        self.response, self.version = response, version


def _version_of(table: Table[Any]) -> int:
    return table.version
