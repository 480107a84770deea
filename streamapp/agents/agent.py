"""Agents: a plain async function of one event plus the tables it declares.

:func:`handle` is the one place where a delivery becomes an outcome for one agent; the
partition task (:mod:`streamapp.engine.task`) runs every agent of its topic through it
(:mod:`streamapp.engine.lane`), for every transport, so an agent behaves the same over each.
"""

from __future__ import annotations

import asyncio
import collections.abc
import dis
import inspect
import itertools
import logging
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    ConfigError,
    DataError,
    DecodeError,
    Refuse,
    StoreError,
    TableUnavailableError,
)
from ..events import Event
from ..failures.outcomes import FailurePolicy, Outcome, Redeliver, check_policy, parking
from ..tables.partition import PartitionTables
from ..tables.table import Table
from ..topics import GroupBy, TopicSpec
from .history import History
from .outputs import Outbox, Send
from .typed import EventTypes

log = logging.getLogger("streamapp.agent")

Handler = Callable[..., Awaitable[None]] | Callable[..., None]
"""``async def handler(event, *table_views, send=...) -> None``; a plain ``def`` one for
``blocking=True``."""
Runner = Callable[[Handler, Event, Sequence[Any], Any], Awaitable[None]]
"""Runs a blocking agent's handler off the event loop (:mod:`streamapp.engine.blocking`)."""


_STREAMS = {
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.AsyncGenerator,
    collections.abc.Iterator,
    collections.abc.Iterable,
    collections.abc.Generator,
}
_STREAM_NAMES = ("AsyncIterator", "AsyncIterable", "AsyncGenerator", "Iterator", "Iterable")


def refuse_stream_handler(agent: str, handler: Any, tables: Sequence[Table[Any]] = ()) -> None:
    """ConfigError for a Faust-style handler, one that iterates a stream (``async for
    event in stream``, or ``yield``s): streamapp calls a handler once per event, so such a
    handler would fail on every event and hold its partition. The error shows the
    streamapp way."""
    function = handler
    if not inspect.isroutine(handler):  # an object: its class's ``__call__``
        function = getattr(type(handler), "__call__", None)  # noqa: B004
    if function is None:
        return
    name = str(getattr(handler, "__name__", None) or type(handler).__name__)
    why = ""
    if inspect.isasyncgenfunction(function):
        why = "is an async generator (it yields)"
    elif inspect.isgeneratorfunction(function):
        why = "is a generator (it yields)"
    else:
        stream = _first_parameter(handler)
        if stream is not None and _iterates(function, stream.name):
            why = f"iterates its first parameter (`for ... in {stream.name}`)"
        elif stream is not None and _is_stream_type(function, stream):
            why = f"takes a stream: its parameter {stream.name!r} is annotated {stream.annotation}"
    if not why:
        return
    views = "".join(f", {t.name}: TableView[...]" for t in tables)
    raise ConfigError(
        f"agent {agent!r}: handler {name} {why}, as a Faust agent would; a streamapp "
        "handler receives one event per call and returns nothing: streamapp calls it for "
        "every event, in order within a partition, and commits its table writes after the "
        "batch. Write it as\n"
        f"    async def {name}(event: Event{views}) -> None:\n"
        "        ...  # handle this one event (what the body of the `async for` did)"
    )


def _first_parameter(handler: Any) -> inspect.Parameter | None:
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return next((p for p in params if p.kind in positional), None)


def _iterates(function: Any, parameter: str) -> bool:
    """True when the code loops over ``parameter`` itself (``[async] for x in it``)."""
    try:
        code = list(dis.get_instructions(function))
    except TypeError:
        return False
    return any(
        a.opname == "LOAD_FAST" and a.argval == parameter and b.opname in ("GET_AITER", "GET_ITER")
        for a, b in itertools.pairwise(code)
    )


def _is_stream_type(function: Any, parameter: inspect.Parameter) -> bool:
    """True when ``parameter`` is annotated as an iterator or a stream."""
    try:
        hint = typing.get_type_hints(function).get(parameter.name, parameter.annotation)
    except Exception:  # an annotation that does not resolve: read its text
        hint = parameter.annotation
    if isinstance(hint, str):
        return hint.split("[", 1)[0].rsplit(".", 1)[-1] in (*_STREAM_NAMES, "Stream", "StreamT")
    origin = typing.get_origin(hint) or hint
    if origin in _STREAMS:
        return True
    return getattr(origin, "__name__", "") in ("Stream", "StreamT")


@dataclass(frozen=True)
class Agent:
    """One projection: the handler, its source topic, its tables, what it reads and
    sends, and its failure policy."""

    name: str
    handler: Handler
    topic: TopicSpec
    tables: tuple[Table[Any], ...] = ()
    """Its own tables, in the order the handler's parameters take them (see ``App.agent``)."""
    filter: Callable[[Event], bool] | None = None
    on_failure: FailurePolicy = field(default_factory=Redeliver)
    history: History | None = None
    """Replayed into the tables on assignment, before live deliveries (catch-up)."""
    sinks: tuple[TopicSpec, ...] = ()
    """Topics it sends derived events to (its handler's ``send`` parameter)."""
    reads: tuple[Table[Any], ...] = ()
    """Tables of other, co-partitioned agents it reads (committed state)."""
    bound: tuple[Table[Any], ...] = ()
    """``tables`` and ``reads`` in the order of the handler's parameters (empty: tables,
    then reads)."""
    group_by: GroupBy | None = None
    """Set when the agent consumes ``group_by.source`` re-keyed: ``topic`` is then the
    internal repartition topic its forwarder ``group_by.forwarder`` feeds."""
    blocking: bool = False
    """The handler runs in a thread of its partition, off the event loop (``blocking=True``:
    a plain ``def`` handler, or an ``async def`` one that blocks)."""
    events: EventTypes | None = None
    """The models of its event types (``events=``): the handler and the filter see each
    event's data as its model (:mod:`streamapp.agents.typed`)."""

    def __post_init__(self) -> None:
        check_policy(self.on_failure, self.name)
        held = parking(self.on_failure)
        if held is not None and held.holds and not self.tables:
            raise ConfigError(
                f"agent {self.name!r}: on_failure={held!r}: a held stream is part of the "
                "agent's table state, and this agent has no tables: give it a table, or "
                "use Park(destination) without hold"
            )

    @property
    def views(self) -> tuple[Table[Any], ...]:
        """Every table the handler takes, own or read, in parameter order."""
        return self.bound or (*self.tables, *self.reads)

    async def __call__(self, event: Event, *views: Any, **kwargs: Any) -> None:
        """Call the handler directly (handy in unit tests; pass ``send=`` when it sends)."""
        result = self.handler(event, *views, **kwargs)
        if inspect.isawaitable(result):
            await result


@dataclass(frozen=True, slots=True)
class Handled:
    outcome: Outcome
    reason: str = ""
    error: BaseException | None = None
    """What the handler raised (its traceback is logged the first time per partition)."""


DELIVERED = Handled(Outcome.DELIVERED)
UNVERSIONED = Handled(Outcome.DELIVERED, "no streamversion: applied at least once")
"""Applied to tables without ``streamversion``: no duplicate check was possible
(at-least-once; a redelivery of it applies it again)."""
DUPLICATE = Handled(Outcome.FILTERED, "already applied")
"""Skipped by the stream-version guard: its table applied this version of the stream, or
a later one."""
_FILTERED = Handled(Outcome.FILTERED, "filter")


async def handle(
    agent: Agent,
    item: Event | DecodeError,
    tables: PartitionTables | None,
    views: Sequence[Any] | None = None,
    outbox: Outbox | None = None,
    send: Send | None = None,
    run: Runner | None = None,
    *,
    checked: tuple[str, int] | None = None,
) -> Handled:
    """The outcome of one delivery for ``agent``: ``views`` are the handler's table
    parameters (None: the views of ``tables``), ``send`` its ``send`` parameter (it buffers
    into ``outbox``). Table writes and sends of a handler that
    raised are rolled back; a read of a table partition not served here makes the
    delivery UNAVAILABLE (tried again later, no failure). A storage error
    (:class:`~streamapp.errors.StoreError`, e.g. a corrupt block read by a table get) is
    raised out of here: it is never the handler's failure, nor the policy's to park.
    ``run`` calls a blocking agent's handler in its thread (None: awaited here).
    ``checked``: the event's stream id and version, which the caller read without
    decoding it (a stored event's columns) and checked against the guard already. Data is
    read where the handler (or filter) first reads it: data that cannot be read there
    (:class:`~streamapp.errors.DataError`) is NOT_DELIVERABLE."""
    if isinstance(item, DecodeError):
        return Handled(Outcome.NOT_DELIVERABLE, item.reason)
    event = item
    version: int | None
    sid: str | None
    if checked is not None:
        sid, version = checked
    else:
        sid = event.stream_id
        if sid is None:
            return Handled(
                Outcome.NOT_DELIVERABLE,
                f"event {event.id} has no stream id (neither a streamid extension nor a subject)",
            )
        version = event.stream_version
        if tables is not None and version is not None and tables.applied_version(sid) >= version:
            return DUPLICATE
    if views is None:
        views = tables.views if tables is not None else ()
    if agent.events is not None:
        typed = agent.events.view(event)
        if isinstance(typed, DataError):
            return Handled(Outcome.NOT_DELIVERABLE, typed.reason, typed)
        event = typed
    try:
        if agent.filter is not None and not agent.filter(event):
            return _FILTERED
        if run is not None:
            await run(agent.handler, event, views, send)
        elif send is None:
            await agent.handler(event, *views)  # type: ignore[misc]
        else:
            await agent.handler(event, *views, send=send)  # type: ignore[misc]
    except TableUnavailableError as exc:
        _rollback(tables, outbox)
        return Handled(Outcome.UNAVAILABLE, str(exc), exc)
    except StoreError:
        _rollback(tables, outbox)
        raise  # the store's failure, not the handler's: the partition task deals with it
    except Refuse as exc:
        _rollback(tables, outbox)
        return Handled(Outcome.REFUSED, f"{type(exc).__name__}: {exc}", exc)
    except DataError as exc:  # the data does not fit its model: read where first used
        _rollback(tables, outbox)
        return Handled(Outcome.NOT_DELIVERABLE, exc.reason, exc)
    except Exception as exc:
        return _failed(tables, outbox, exc)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # a real cancellation of the batch
        return _failed(tables, outbox, exc)  # a handler's own timeout leaking out
    if tables is not None:
        tables.commit_event(sid, version)
    if outbox is not None:
        outbox.commit_event()
    return UNVERSIONED if tables is not None and version is None else DELIVERED


def _rollback(tables: PartitionTables | None, outbox: Outbox | None) -> None:
    if tables is not None:
        tables.rollback_event()
    if outbox is not None:
        outbox.rollback_event()


def _failed(tables: PartitionTables | None, outbox: Outbox | None, exc: BaseException) -> Handled:
    _rollback(tables, outbox)
    return Handled(Outcome.FAILED, f"{type(exc).__name__}: {exc}", exc)
