"""Agents: a plain async function of one event plus the tables it declares.

:func:`handle` is the one place where a delivery becomes an outcome for one agent; the
partition task (:mod:`streamapp.engine.task`) runs every agent of its topic through it
(:mod:`streamapp.engine.lane`), for every transport, so an agent behaves the same over each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import DecodeError, Refuse, TableUnavailableError
from .events import Event
from .history import History
from .outcomes import FailurePolicy, Outcome, Redeliver, check_policy
from .outputs import Outbox, Send
from .repartition import GroupBy
from .tables.partition import PartitionTables
from .tables.table import Table

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[None]]
"""``async def handler(event, *table_views, send=...) -> None``."""


@dataclass(frozen=True)
class TopicSpec:
    """A declared topic: its name and partition count (tables are partitioned alike)."""

    name: str
    partitions: int = 8

    def __post_init__(self) -> None:
        if not self.name or self.partitions < 1:
            raise ValueError(f"topic {self.name!r}: a name and at least one partition are needed")


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

    def __post_init__(self) -> None:
        check_policy(self.on_failure, self.name)

    @property
    def views(self) -> tuple[Table[Any], ...]:
        """Every table the handler takes, own or read, in parameter order."""
        return self.bound or (*self.tables, *self.reads)

    async def __call__(self, event: Event, *views: Any, **kwargs: Any) -> None:
        """Call the handler directly (handy in unit tests; pass ``send=`` when it sends)."""
        await self.handler(event, *views, **kwargs)


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
_DUPLICATE = Handled(Outcome.FILTERED, "already applied")
_FILTERED = Handled(Outcome.FILTERED, "filter")


async def handle(
    agent: Agent,
    item: Event | DecodeError,
    tables: PartitionTables | None,
    views: Sequence[Any] | None = None,
    outbox: Outbox | None = None,
    send: Send | None = None,
) -> Handled:
    """The outcome of one delivery for ``agent``: ``views`` are the handler's table
    parameters (None: the views of ``tables``), ``send`` its ``send`` parameter (it buffers
    into ``outbox``). Table writes and sends of a handler that
    raised are rolled back; a read of a table partition not served here makes the
    delivery UNAVAILABLE (tried again later, no failure)."""
    if isinstance(item, DecodeError):
        return Handled(Outcome.NOT_DELIVERABLE, item.reason)
    event = item
    sid = event.stream_id
    if sid is None:
        return Handled(
            Outcome.NOT_DELIVERABLE,
            f"event {event.id} has no stream id (neither a streamid extension nor a subject)",
        )
    version = event.stream_version
    if tables is not None and version is not None and tables.applied_version(sid) >= version:
        return _DUPLICATE
    if views is None:
        views = tables.views if tables is not None else ()
    try:
        if agent.filter is not None and not agent.filter(event):
            return _FILTERED
        if send is None:
            await agent.handler(event, *views)
        else:
            await agent.handler(event, *views, send=send)
    except TableUnavailableError as exc:
        _rollback(tables, outbox)
        return Handled(Outcome.UNAVAILABLE, str(exc), exc)
    except Refuse as exc:
        _rollback(tables, outbox)
        return Handled(Outcome.REFUSED, f"{type(exc).__name__}: {exc}", exc)
    except Exception as exc:
        return _failed(tables, outbox, exc)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # a real cancellation of the batch
        return _failed(tables, outbox, exc)  # a handler's own timeout leaking out
    if tables is not None:
        if version is not None:
            tables.record_version(sid, version)
        tables.commit_event()
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
